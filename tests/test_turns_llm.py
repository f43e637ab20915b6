"""The turn path with an OpenAI-compatible model configured (a local server speaking
the chat-completions API): its persona files, its fallback to the offline provider,
channels served concurrently (in order within a channel), and the household's time."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import ray
from fake_openai import FakeOpenAI, Mode
from ray.exceptions import ActorUnavailableError

from actors import supervisor
from actors.handles import TranscriptClient, TurnsClient
from actors.messages import ChangeMemory, RecentTurns, UserTurn
from actors.status import gather_status
from runtime.config import CONFIG_DIR, Settings, load_settings
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.waiting import wait_for

NS = "test-turns-llm"
NS_ROOMS = "test-turns-rooms"


def _start(namespace: str, server: FakeOpenAI, data: Path, model_cache: Path,
           timeout_s: float, **extra: Any) -> tuple[Settings, Any]:
    """Settings and the Supervisor's handle (keep it: the actors live as long as it)."""
    persona = data / "persona"
    persona.mkdir()
    (persona / "SOUL.md").write_text("You are Wren, a calm household assistant.")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": namespace}, "persona": {"global_dir": str(persona)},
        "llm": {"providers": [{"name": "local", "base_url": server.base_url,
                               "model": "tiny", "timeout_s": timeout_s}]},
        **extra,
    })
    return settings, supervisor.start(settings)


def _stop(sup: Any) -> None:
    sup.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_s=5.0) as fake:
        yield fake


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    # a short model timeout: the SLOW case below must fail over quickly
    settings, sup = _start(NS, server, tmp_path_factory.mktemp("llm-data"), model_cache,
                           timeout_s=1)
    yield settings
    _stop(sup)


def say(text: str, channel: str = "chat") -> Any:
    reply = TurnsClient(NS, timeout_s=120).process(UserTurn(channel=channel, text=text))
    TranscriptClient(NS).flush()
    return reply


def test_model_gets_persona_memories_and_history(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    told = say("We keep the hedge trimmer in the blue shed.", channel="voice")
    assert told.provider == "local" and told.text.startswith("echo:")
    reply = say("Where is the hedge trimmer kept?")
    assert reply.provider == "local"
    assert f"turn:{told.turn_id}" in reply.citations
    body = server.last.body
    assert body["model"] == "tiny"
    system = body["messages"][0]
    assert system["role"] == "system"
    assert "You are Wren" in system["content"]
    assert "blue shed" in system["content"] and f"[turn:{told.turn_id}]" in system["content"]
    assert body["messages"][-1] == {"role": "user", "content": "Where is the hedge trimmer kept?"}


def test_failing_model_falls_back_and_then_shows_a_notice(runtime: Settings,
                                                          server: FakeOpenAI) -> None:
    server.mode = Mode.HTTP_500
    first = say("What day is the recycling collected?")
    assert first.provider == "offline" and first.notice is None
    second = say("And the garden waste?")
    assert second.provider == "offline"
    assert second.notice is not None and "failing" in second.notice
    # durable: `reverie status` shows it, and a restarted Turns actor still has it
    assert gather_status(runtime).notice == second.notice
    ray.kill(ray.get_actor("turns", namespace=NS), no_restart=False)

    def back() -> bool:
        try:
            return TurnsClient(NS, timeout_s=30).ping() == "ok"
        except Exception:
            return False

    assert wait_for(back, 120), "the turns actor did not come back"
    for attempt in range(3):  # Ray may still call it unavailable for a moment
        try:
            after = say("Is the bin day moved for the holiday?")
            break
        except ActorUnavailableError:
            if attempt == 2:
                raise
    assert after.notice is not None
    server.mode = Mode.SLOW  # a timeout is a failure too, never a hang
    assert say("Anything else?").provider == "offline"
    server.mode = Mode.OK
    recovered = say("Thanks!")
    assert recovered.provider == "local" and recovered.notice is None


# -- rooms: channels served concurrently, each in order; household time ---------

def _household_zone_unlike_utc() -> str:
    """A zone whose date differs from UTC's right now (UTC+14 from 10:00 UTC,
    UTC-12 before noon), so a date shown in UTC cannot pass for it."""
    return "Pacific/Kiritimati" if datetime.now(UTC).hour >= 10 else "Etc/GMT+12"


@pytest.fixture(scope="module")
def rooms_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def rooms(ray_instance: str, rooms_server: FakeOpenAI,
          tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Settings]:
    # a long model timeout: requests are held by the test, not timed out
    settings, sup = _start(NS_ROOMS, rooms_server, tmp_path_factory.mktemp("rooms-data"),
                           model_cache, timeout_s=120,
                           household={"timezone": _household_zone_unlike_utc()})
    yield settings
    _stop(sup)


def test_a_slow_room_holds_up_no_other_and_keeps_its_own_order(
        rooms: Settings, rooms_server: FakeOpenAI) -> None:
    server = rooms_server
    turns = TurnsClient(NS_ROOMS, timeout_s=120)
    first_text = "How long does the slow cooker need for beans?"
    second_text = "And for chickpeas?"
    server.hold("slow cooker")
    first_ref = turns.submit("process", UserTurn(channel="chat", text=first_text))
    assert server.wait_held("slow cooker")  # its model call is in the server, unanswered

    # another room is answered meanwhile
    other = turns.process(UserTurn(channel="voice", text="Is the hallway light on?"))
    assert other.provider == "local" and other.text == "echo: Is the hallway light on?"
    assert ray.wait([first_ref], timeout=0)[0] == []  # the first room is still waiting

    # a second turn in the first room queues behind the first one
    second_ref = turns.submit("process", UserTurn(channel="chat", text=second_text))
    assert wait_for(lambda: turns.waiting().get("chat") == 1, timeout=60)
    server.release("slow cooker")
    first, second = ray.get([first_ref, second_ref], timeout=120)

    assert (first.text, second.text) == (f"echo: {first_text}", f"echo: {second_text}")
    recent = TranscriptClient(NS_ROOMS).recent(RecentTurns(channel="chat", limit=4)).turns
    assert [t.id for t in recent] == [first.turn_id, first.reply_id,
                                      second.turn_id, second.reply_id]
    # the second turn's model saw the first exchange in its history
    asked = [r.body for r in server.requests
             if r.body and r.body["messages"][-1]["content"] == second_text]
    assert len(asked) == 1
    assert {"role": "assistant", "content": first.text} in asked[0]["messages"]
    assert turns.waiting() == {}


def test_prompt_clock_and_memory_dates_are_household_time(
        rooms: Settings, rooms_server: FakeOpenAI) -> None:
    zone = ZoneInfo(rooms.household.timezone)
    turns = TurnsClient(NS_ROOMS, timeout_s=120)
    told = turns.process(UserTurn(channel="voice",
                                  text="The recycling bin goes out on Tuesday evenings."))
    TranscriptClient(NS_ROOMS).flush()
    reply = turns.process(UserTurn(channel="chat", text="When does the recycling bin go out?"))
    assert f"turn:{told.turn_id}" in reply.citations
    system = rooms_server.last.body["messages"][0]["content"]
    assert told.turn_id is not None and reply.reply_id is not None
    store = Store(rooms.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))
    try:
        told_row = store.get("transcript", told.turn_id)
        reply_row = store.get("transcript", reply.reply_id)
    finally:
        store.close()
    assert told_row is not None and reply_row is not None
    now = datetime.fromtimestamp(reply_row["created_at"], zone)
    offset = now.strftime("%z")
    clock_line = next(line for line in system.splitlines()
                      if line.startswith("Current date and time:"))
    assert f"UTC{offset[:3]}:{offset[3:]}" in clock_line
    assert now.strftime("%Y-%m-%d") in clock_line
    told_date = datetime.fromtimestamp(told_row["created_at"], zone).strftime("%Y-%m-%d")
    assert f"[turn:{told.turn_id}] [{told_date}]" in system  # the memory's date, local too
    assert json.loads(reply_row["citations"]) == reply.citations


def test_a_disabled_turn_is_never_put_in_a_prompt(rooms: Settings,
                                                  rooms_server: FakeOpenAI) -> None:
    turns = TurnsClient(NS_ROOMS, timeout_s=120)
    transcript = TranscriptClient(NS_ROOMS)
    secret = turns.process(UserTurn(channel="cli", text="The safe combination is 31-7-44."))
    transcript.flush()
    assert secret.turn_id is not None and secret.reply_id is not None
    for turn_id in (secret.turn_id, secret.reply_id):  # the reply echoes it
        transcript.change(ChangeMemory(ref=f"turn:{turn_id}", change="disable"))
    listed = {t.id: t.disabled for t in transcript.recent(RecentTurns(channel="cli")).turns}
    assert listed[secret.turn_id] and listed[secret.reply_id]
    turns.process(UserTurn(channel="cli", text="What did I tell you about the safe?"))
    asked = json.dumps(rooms_server.last.body["messages"])
    assert "31-7-44" not in asked  # neither in the history nor among the memories


def test_channel_queue_serves_one_channel_in_arrival_order() -> None:
    """The Turns actor's per-channel queue on its own: turns of one channel run one
    at a time in the order they arrived; another channel passes straight through."""
    from actors.turns import ChannelQueue

    queue = ChannelQueue()
    ran: list[str] = []
    release = threading.Event()

    def turn(channel: str, name: str, hold: threading.Event | None = None) -> None:
        with queue.turn(channel):
            ran.append(name)
            if hold is not None:
                hold.wait()

    first = threading.Thread(target=turn, args=("a", "a1", release), daemon=True)
    first.start()
    later: list[threading.Thread] = []
    try:
        assert wait_for(lambda: ran == ["a1"], timeout=60)
        for name in ("a2", "a3"):
            later.append(threading.Thread(target=turn, args=("a", name), daemon=True))
            later[-1].start()
            assert wait_for(partial(lambda n: queue.waiting() == {"a": n}, len(later)),
                             timeout=60)
        turn("b", "b1")  # another channel is not held up
        assert ran == ["a1", "b1"]
    finally:
        release.set()
    for t in (first, *later):
        t.join(timeout=60)
    assert ran == ["a1", "b1", "a2", "a3"]
    assert queue.waiting() == {}


def test_an_episode_used_in_an_answer_becomes_relevant_again(runtime: Settings,
                                                             server: FakeOpenAI) -> None:
    from actors.handles import EpisodesClient
    from actors.messages import AddEpisode
    from runtime.memories.episodes import EpisodeIn

    server.mode = Mode.OK
    written = EpisodesClient(NS).add(AddEpisode(episode=EpisodeIn(
        channel="chat", source="user",
        gist="Ben and Nora spent the afternoon repairing the greenhouse roof with new panels.")))
    db = Store(runtime.store.path, FactKinds.load(runtime.memory.fact_kinds_file))
    try:
        before = db.get("episodes", written.episode_id)
        assert before is not None
        reply = say("Did we ever fix the greenhouse roof?")
        assert f"episode:{written.episode_id}" in reply.citations

        def refreshed() -> bool:
            row = db.get("episodes", written.episode_id)
            return row is not None and row["last_relevant_at"] > before["last_relevant_at"]

        assert wait_for(refreshed, 60)
    finally:
        db.close()
