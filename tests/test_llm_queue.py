"""The durable queue of failed LLM segments and the durable failure notice,
on real files (and a real local HTTP fake of an OpenAI-compatible server)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401

from runtime.config import ProviderSettings, load_settings
from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    FallbackChain,
    LLMRequest,
    OfflineProvider,
    OpenAICompatibleProvider,
    make_llm,
)
from runtime.llm.queue import LLMHealth, PendingEntry, PendingQueue, read_notice
from runtime.time.clock import ManualClock

REQUEST = LLMRequest(messages=[ChatMessage(role="user", content="hello")])


def entry(key: str, **payload: object) -> PendingEntry:
    return PendingEntry(key=key, kind="distil", payload={"channel": "chat", **payload},
                        enqueued_at=1.0)


def keys(queue: PendingQueue) -> list[str]:
    return [p.entry.key for p in queue.entries()]


def test_queue_survives_a_reopen_oldest_first_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        queue = PendingQueue(tmp_path / "q")
        for k in ("a", "b", "c"):
            assert queue.push(entry(k, turn_ids=[1, 2])) == []
    finally:
        os.umask(old)
    reopened = PendingQueue(tmp_path / "q")
    assert keys(reopened) == ["a", "b", "c"]
    assert reopened.entries()[0].entry.payload == {"channel": "chat", "turn_ids": [1, 2]}
    files = [p for p in (tmp_path / "q").iterdir() if p.name.endswith(".json")]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert stat.S_IMODE((tmp_path / "q").stat().st_mode) == 0o700
    # An entry pushed after the reopen goes behind the old ones.
    reopened.push(entry("d"))
    assert keys(PendingQueue(tmp_path / "q")) == ["a", "b", "c", "d"]


def test_push_is_idempotent_by_key_update_keeps_the_place_remove(tmp_path: Path) -> None:
    queue = PendingQueue(tmp_path / "q")
    queue.push(entry("a"))
    queue.push(entry("b"))
    queue.push(entry("a", turn_ids=[9]))
    assert keys(queue) == ["a", "b"]
    first = queue.entries()[0]
    queue.update(first, first.entry.model_copy(update={"attempts": 2}))
    assert [(p.entry.key, p.entry.attempts) for p in queue.entries()] == [("a", 2), ("b", 0)]
    queue.remove(queue.entries()[0])
    assert keys(PendingQueue(tmp_path / "q")) == ["b"]


def test_a_corrupt_entry_is_dropped_and_counted_without_wedging_the_rest(
        tmp_path: Path) -> None:
    queue = PendingQueue(tmp_path / "q")
    for k in ("a", "b", "c", "d"):
        queue.push(entry(k))
    files = sorted(p for p in (tmp_path / "q").iterdir() if p.name.endswith(".json")
                   and p.name != "counters.json")
    files[1].write_bytes(b'{"key": "b", "kind": "dis')          # cut short
    files[2].write_text('{"key": "c", "kind": "distil"}')      # JSON, wrong shape
    reopened = PendingQueue(tmp_path / "q")
    assert keys(reopened) == ["a", "d"]
    assert reopened.counters == {"dropped_cap": 0, "dropped_corrupt": 2}
    assert not files[1].exists() and not files[2].exists()
    assert keys(reopened) == ["a", "d"]  # counted once, not on every read
    assert reopened.counters["dropped_corrupt"] == 2


def test_the_cap_drops_the_oldest_hands_them_back_and_counts(tmp_path: Path) -> None:
    queue = PendingQueue(tmp_path / "q", cap=3)
    dropped = []
    for k in ("a", "b", "c", "d", "e"):
        dropped += queue.push(entry(k))
    assert [e.key for e in dropped] == ["a", "b"]
    assert keys(queue) == ["c", "d", "e"]
    assert PendingQueue(tmp_path / "q", cap=3).counters["dropped_cap"] == 2


def test_a_write_cut_short_leaves_no_entry(tmp_path: Path) -> None:
    queue = PendingQueue(tmp_path / "q")
    queue.push(entry("a"))
    (tmp_path / "q" / ".000000000002.json.x.tmp").write_text('{"key": "b"')
    reopened = PendingQueue(tmp_path / "q")
    assert keys(reopened) == ["a"]
    assert not list((tmp_path / "q").glob(".*.tmp"))


# -- the durable notice -------------------------------------------------------------


def test_health_notice_after_two_failures_survives_a_restart_and_clears(
        tmp_path: Path) -> None:
    health = LLMHealth(tmp_path, ManualClock(5.0))
    assert health.record_failure(["fake http_status 500"], answered_offline=True) == 1
    assert health.notice() is None and read_notice(tmp_path) is None
    assert health.record_failure(["fake timeout"], answered_offline=True) == 2
    notice = LLMHealth(tmp_path).notice()  # another process, or after a restart
    assert notice is not None and "2 consecutive failures: fake timeout" in notice
    assert read_notice(tmp_path) == notice
    assert stat.S_IMODE((tmp_path / "llm_health.json").stat().st_mode) == 0o600
    assert LLMHealth(tmp_path).state().since == 5.0
    assert LLMHealth(tmp_path).record_success() is True
    assert health.notice() is None and read_notice(tmp_path) is None
    assert health.record_success() is False


def test_an_unreadable_health_file_counts_as_healthy(tmp_path: Path) -> None:
    (tmp_path / "llm_health.json").write_text("{not json")
    assert LLMHealth(tmp_path).notice() is None
    assert LLMHealth(tmp_path).record_failure(["x"], False) == 1


def chain(server: FakeOpenAI, data_dir: Path, offline: bool = True) -> FallbackChain:
    settings = load_settings(env={}, overrides={"llm": {
        "offline_fallback": offline,
        "providers": [{"name": "fake", "base_url": server.base_url, "model": "m",
                       "timeout_s": 5}]}})
    return make_llm(settings.llm, health=LLMHealth(data_dir))


def test_chain_notice_is_durable_across_restarts_and_clears_on_first_success(
        fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    fake_openai.mode = Mode.HTTP_500
    first = chain(fake_openai, tmp_path)
    first.complete(REQUEST)
    assert first.notice is None
    first.complete(REQUEST)
    assert first.notice is not None and "fake http_status 500" in first.notice
    assert "answering from memory only" in first.notice
    # A restart: a new chain (new process) shows the notice before any call.
    second = chain(fake_openai, tmp_path)
    assert second.notice == first.notice
    assert read_notice(tmp_path) == first.notice
    fake_openai.mode = Mode.OK
    assert second.complete(REQUEST).provider == "fake"
    assert second.notice is None and first.notice is None and read_notice(tmp_path) is None


def test_chain_without_offline_fallback_counts_its_failures(
        fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    fake_openai.mode = Mode.HTTP_500
    c = chain(fake_openai, tmp_path, offline=False)
    for _ in range(2):
        with pytest.raises(AllProvidersFailed):
            c.complete(REQUEST)
    assert c.notice is not None and "no answers available" in c.notice


def test_offline_only_chain_never_records_a_failure(tmp_path: Path) -> None:
    c = FallbackChain([OfflineProvider()], LLMHealth(tmp_path))
    for _ in range(3):
        c.complete(REQUEST)
    assert c.notice is None and not (tmp_path / "llm_health.json").exists()


def test_chain_without_health_keeps_its_notice_in_memory(fake_openai: FakeOpenAI) -> None:
    fake_openai.mode = Mode.HTTP_500
    provider = OpenAICompatibleProvider(
        ProviderSettings(name="fake", base_url=fake_openai.base_url, model="m"), 16, 0.2)
    c = FallbackChain([provider, OfflineProvider()])
    c.complete(REQUEST)
    c.complete(REQUEST)
    assert c.notice is not None and FallbackChain([provider]).notice is None
