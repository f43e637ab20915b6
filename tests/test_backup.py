"""Verify and restore through the Litestream replica (runtime.store.backup), with the
real litestream binary and a ``file:///`` replica."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from device.replicator import Replicator, meta_dir
from runtime.config import Settings
from runtime.store.backup import BackupError, restore, verify
from runtime.store.database import Store
from tests.test_replicator import (
    caught_up,
    contents,
    integrity,
    open_store,
    replica_settings,
    write_turns,
)


@dataclass
class Replicated:
    settings: Settings
    store: Store
    rep: Replicator
    tmp_path: Path


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Replicated]:
    """A store replicated to a directory; Litestream and the store are closed at teardown."""
    settings = replica_settings(tmp_path, max_lag_s=30)
    store = open_store(settings)
    rep = Replicator(settings)
    rep.start()
    made = Replicated(settings, store, rep, tmp_path)
    try:
        yield made
    finally:
        rep.stop(timeout=5)
        made.store.close()


def leftovers(settings: Settings) -> list[Path]:
    return [p for p in settings.store.resolved_dir.iterdir()
            if p.name.startswith((".verify-", ".restore-"))]


def rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat()


# -- verify ----------------------------------------------------------------------


def test_verify_passes_on_a_fresh_replica(replicated: Replicated) -> None:
    r = replicated
    write_turns(r.store, "turn", 25)
    assert caught_up(r.rep, time.time())
    result = verify(r.settings)
    assert result.ok, result.problems
    assert result.problems == [] and result.lag_s == 0.0
    assert result.txid and result.restore_point_at and result.restore_point_at <= time.time()
    assert result.tables["transcript"] == {
        "live_rows": 25, "replica_rows": 25, "live_newest": [25], "replica_newest": [25],
        "missing": 0, "status": "ok"}
    assert {"write_log", "facts", "episode_citations"} <= set(result.tables)
    assert not any(name.startswith(("sqlite_", "_litestream_")) for name in result.tables)
    assert leftovers(r.settings) == []


def test_verify_tolerates_recent_rows_and_fails_on_a_stale_replica(
        replicated: Replicated) -> None:
    r = replicated
    write_turns(r.store, "synced", 10)
    assert caught_up(r.rep, time.time())
    r.rep.stop()  # replication stops; the store goes on
    write_turns(r.store, "unsynced", 7)
    written = time.time()

    fresh = verify(r.settings)
    assert fresh.ok, fresh.problems
    assert fresh.tables["transcript"]["status"] == "behind"
    assert fresh.tables["transcript"]["missing"] == 7
    assert fresh.lag_s is not None and fresh.lag_s < r.settings.replica.max_lag_s

    later = written + r.settings.replica.max_lag_s + 45
    stale = verify(r.settings, now=later)
    assert not stale.ok
    assert stale.lag_s is not None and stale.lag_s >= r.settings.replica.max_lag_s + 45
    message = next(p for p in stale.problems if p.startswith("transcript:"))
    assert "7 rows missing from the replica" in message and "stale" in message
    assert "s old" in message
    assert leftovers(r.settings) == []


@pytest.mark.parametrize("damage", ["truncate", "overwrite"])
def test_verify_fails_on_a_tampered_replica(replicated: Replicated, damage: str) -> None:
    r = replicated
    write_turns(r.store, "turn", 10)
    assert caught_up(r.rep, time.time())
    r.rep.stop()
    files = sorted((r.tmp_path / "replica").rglob("*.ltx"))
    assert files
    for ltx in files:
        data = bytearray(ltx.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        else:  # same size, different bytes in the middle
            for i in range(len(data) // 2, min(len(data), len(data) // 2 + 64)):
                data[i] ^= 0xFF
        ltx.write_bytes(bytes(data))
    result = verify(r.settings)
    assert not result.ok
    assert any("cannot be restored" in p or "cannot be read" in p for p in result.problems), \
        result.problems
    assert leftovers(r.settings) == []


def test_verify_fails_when_the_replica_does_not_match_the_store(
        replicated: Replicated) -> None:
    r = replicated
    turns = [r.store.insert("test", "transcript", {
        "channel": "kitchen", "source": "voice", "role": "user", "content": f"t{i}",
        "created_at": time.time()}) for i in range(6)]
    summaries = [r.store.insert("test", "compactions", {
        "channel": "kitchen", "summary": f"s{i}", "watermark": i,
        "created_at": time.time()}) for i in range(3)]
    assert caught_up(r.rep, time.time())
    r.rep.stop()
    # A delete through the write log, not replicated yet: explained by lag.
    r.store.delete("test", "transcript", turns[0])
    logged = verify(r.settings)
    assert logged.ok, logged.problems
    assert logged.tables["transcript"]["status"] == "changed"
    # A change that no write explains: the replica no longer matches this store.
    r.store.conn.execute("DELETE FROM compactions WHERE id = ?", (summaries[0],))
    result = verify(r.settings)
    assert not result.ok
    assert result.tables["compactions"]["status"] == "changed"
    assert [p for p in result.problems if "does not match" in p] == [
        "compactions: rows changed since the replica's restore point (live 2 rows, "
        "replica 3), and no later write explains it: the replica does not match this store"]


def test_verify_without_a_backup(tmp_path: Path) -> None:
    settings = replica_settings(tmp_path)
    open_store(settings).close()
    result = verify(settings)
    assert not result.ok and "holds no backup" in result.problems[0]
    with pytest.raises(BackupError, match="no replica configured"):
        verify(replica_settings(tmp_path, url=""))


# -- restore ---------------------------------------------------------------------


def test_restore_to_a_point_in_time(replicated: Replicated) -> None:
    r = replicated
    first = set(write_turns(r.store, "first", 10))
    assert caught_up(r.rep, time.time())
    time.sleep(0.5)
    between = time.time()
    time.sleep(0.5)
    second = set(write_turns(r.store, "second", 10))
    assert caught_up(r.rep, time.time())

    pit = restore(r.settings, timestamp=rfc3339(between), to=r.tmp_path / "pit.db",
                  runtime_running=True)
    assert contents(pit) == first and integrity(pit) == "ok"
    assert stat.S_IMODE(pit.stat().st_mode) == 0o600
    latest = restore(r.settings, to=r.tmp_path / "latest.db", runtime_running=True)
    assert contents(latest) == first | second
    with pytest.raises(BackupError, match="holds no backup from before"):
        restore(r.settings, timestamp="2001-01-01T00:00:00Z", to=r.tmp_path / "old.db",
                runtime_running=True)
    assert not (r.tmp_path / "old.db").exists()
    assert leftovers(r.settings) == []


def test_restore_refuses_to_overwrite(replicated: Replicated) -> None:
    r = replicated
    write_turns(r.store, "turn", 3)
    assert caught_up(r.rep, time.time())
    with pytest.raises(BackupError, match="runtime is running"):
        restore(r.settings, runtime_running=True)
    with pytest.raises(BackupError, match="runtime is running"):
        restore(r.settings, to=r.settings.store.path, runtime_running=True)
    existing = r.tmp_path / "mine.db"
    existing.write_bytes(b"precious")
    with pytest.raises(BackupError, match="exists"):
        restore(r.settings, to=existing, runtime_running=False)
    assert existing.read_bytes() == b"precious"
    with pytest.raises(BackupError, match="RFC 3339"):
        restore(r.settings, timestamp="yesterday", to=r.tmp_path / "x.db",
                runtime_running=False)
    with pytest.raises(BackupError, match="zone"):
        restore(r.settings, timestamp="2026-01-01T00:00:00", to=r.tmp_path / "x.db",
                runtime_running=False)
    assert not (r.tmp_path / "x.db").exists()


def test_restore_over_the_stopped_store_keeps_the_old_one(replicated: Replicated) -> None:
    r = replicated
    synced = set(write_turns(r.store, "synced", 8))
    assert caught_up(r.rep, time.time())
    r.rep.stop()
    unsynced = set(write_turns(r.store, "unsynced", 2))
    r.store.close()  # the runtime is stopped
    live = r.settings.store.path
    assert meta_dir(r.settings).exists()

    assert restore(r.settings, runtime_running=False) == live
    assert contents(live) == synced and integrity(live) == "ok"
    assert stat.S_IMODE(live.stat().st_mode) == 0o600
    kept = [p for p in live.parent.iterdir() if ".before-restore-" in p.name]
    assert len(kept) == 1
    assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600
    assert contents(kept[0]) == synced | unsynced
    assert not meta_dir(r.settings).exists()  # Litestream starts afresh on the new file
    # The runtime can open it again, and it is a Reverie store.
    r.store = open_store(r.settings)
    assert r.store.scalar("SELECT count(*) FROM transcript") == 8
