"""A job run off the hub: the snapshot it reads, and the bookkeeping it sends home.

In process, with the real litestream binary and a ``file://`` replica; the
Cron actor is stood in for by an object answering its two messages (the whole
path through Ray, on a helper node, is ``tests/test_cluster.py``).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors import job_snapshot
from actors.job_actor import JobActor
from actors.messages import Ack, JobStateRow, JobStateRows, SaveJobState, SaveLLMQueue
from device.replicator import ReplicaError, Replicator
from runtime.config import Settings
from runtime.llm.queue import QUEUE_DIR, PendingEntry, PendingQueue
from runtime.store.database import Store
from runtime.store.job_state import get_state, route, set_state
from runtime.time.clock import ManualClock
from tests.test_replicator import KINDS, open_store, replica_settings, write_turns


class Hub:
    """Answers what a job off the hub asks the Cron actor, from the live store."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.saved: list[SaveJobState] = []
        self.queues: list[SaveLLMQueue] = []

    def hub_job_state(self) -> JobStateRows:
        with open_store(self.settings) as store:
            newest = store.scalar("SELECT coalesce(max(id), 0) FROM write_log")
            rows = [JobStateRow(job=j, key=k, value=v) for j, k, v in
                    store.conn.execute("SELECT job, key, value FROM job_state")]
        return JobStateRows(write_log_id=int(newest), rows=rows, llm_queue=job_snapshot.read_queue(
            self.settings.store.resolved_dir / QUEUE_DIR))

    def save_job_state(self, msg: SaveJobState) -> Ack:
        self.saved.append(msg)
        return Ack()

    def save_llm_queue(self, msg: SaveLLMQueue) -> Ack:
        self.queues.append(msg)
        job_snapshot.replace_queue(self.settings.store.resolved_dir / QUEUE_DIR, msg.files)
        return Ack()


@pytest.fixture
def replicated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """A live store with turns and job state, replicating to a file replica;
    this node's temporary directory is ``tmp_path / "node-tmp"``."""
    settings = replica_settings(tmp_path)
    with open_store(settings) as store:
        write_turns(store, "hub-turn", 5)
        set_state(store, "facts", "cursor", {"after": 3})
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir(mode=0o700)
    monkeypatch.setattr(job_snapshot, "scratch_root", lambda: node_tmp)
    rep = Replicator(settings)
    rep.start()
    try:
        yield settings
    finally:
        rep.stop()


def test_a_run_reads_a_private_read_only_copy_that_is_gone_after(
        replicated: Settings, tmp_path: Path) -> None:
    node_tmp = tmp_path / "node-tmp"
    with open_store(replicated) as live:  # written after the replicator started
        write_turns(live, "late-turn", 1)
    hub = Hub(replicated)
    with job_snapshot.snapshot(replicated, ManualClock(50.0), hub) as (local, store):  # type: ignore[arg-type]
        copy = store.path
        assert copy.parent.parent == node_tmp and copy != replicated.store.path
        assert local.store.path == copy  # whatever the job keeps beside it goes there too
        assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
        contents = [r[0] for r in store.conn.execute("SELECT content FROM transcript")]
        assert "late-turn-0" in contents  # caught up with the hub's newest write
        with pytest.raises(apsw.ReadOnlyError):
            store.conn.execute("DELETE FROM transcript")
        # job state: the hub's, and each write sent to the hub
        assert get_state(store, "facts", "cursor") == {"after": 3}
        set_state(store, "facts", "cursor", {"after": 6})
        assert get_state(store, "facts", "cursor") == {"after": 6}
        assert [(m.job, m.key, json.loads(m.value), m.at) for m in hub.saved] == [
            ("facts", "cursor", {"after": 6}, 50.0)]
    assert not copy.exists() and os.listdir(node_tmp) == []
    with open_store(replicated) as live:  # the copy never wrote the live store
        assert get_state(live, "facts", "cursor") == {"after": 3}


def entry(key: str) -> PendingEntry:
    return PendingEntry(key=key, kind="distil", payload={"channel": "chat", "turns": [1]},
                        enqueued_at=1.0)


def test_the_retry_queue_goes_to_the_run_and_back_to_the_hub(replicated: Settings) -> None:
    """distil's failed segments, queued on a helper, are retried wherever the next run goes."""
    hub_queue = PendingQueue.in_data_dir(replicated.store.resolved_dir)
    hub_queue.push(entry("old"))
    hub = Hub(replicated)
    with job_snapshot.snapshot(replicated, ManualClock(1.0), hub) as (local, _):  # type: ignore[arg-type]
        queue = PendingQueue.in_data_dir(local.store.resolved_dir)  # as distil opens it
        assert [p.entry.key for p in queue.entries()] == ["old"]
    assert hub.queues == []  # unchanged: nothing sent
    with pytest.raises(RuntimeError, match="model down"):
        with job_snapshot.snapshot(replicated, ManualClock(1.0), hub) as (local, _):  # type: ignore[arg-type]
            queue = PendingQueue.in_data_dir(local.store.resolved_dir)
            queue.remove(queue.entries()[0])
            queue.push(entry("new"))
            raise RuntimeError("model down")  # a run that fails still hands its queue back
    assert [p.entry.key for p in hub_queue.entries()] == ["new"]


def test_a_replica_behind_the_hub_fails_the_run(replicated: Settings, tmp_path: Path) -> None:
    class Ahead(Hub):
        def hub_job_state(self) -> JobStateRows:
            return JobStateRows(write_log_id=10**9)

    short = replicated.model_copy(update={"replica": replicated.replica.model_copy(
        update={"max_lag_s": 1.0})})
    with pytest.raises(ReplicaError, match="behind the hub"):
        with job_snapshot.snapshot(short, ManualClock(1.0), Ahead(replicated)):  # type: ignore[arg-type]
            pass
    assert os.listdir(tmp_path / "node-tmp") == []


def test_without_a_replica_a_job_off_the_hub_refuses(tmp_path: Path) -> None:
    """No replica and no store on this node: refused with the reason, never a
    run on an empty store (Cron records what ``run`` raises as the failed run)."""
    settings = replica_settings(tmp_path, url="")
    actor = JobActor(settings)
    with ExitStack() as stack, pytest.raises(FileNotFoundError, match="no replica configured"):
        actor._store(stack, ManualClock(1.0), remote=True)
    assert not settings.store.path.exists()


def test_left_behind_copies_of_killed_runs_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / f"{job_snapshot.PREFIX}{int(dead.stdout)}-abc"
    mine = tmp_path / f"{job_snapshot.PREFIX}{os.getpid()}-abc"
    other = tmp_path / "reverie-snapshot-notapid"
    for d in (gone, mine, other):
        d.mkdir()
    assert job_snapshot.sweep(tmp_path) == 1
    assert not gone.exists() and mine.exists() and other.exists()


def test_routed_state_reads_the_hubs_rows_not_the_stores(tmp_path: Path) -> None:
    sent: list[Any] = []
    with Store(tmp_path / "s.db", KINDS) as store:
        set_state(store, "consolidate", "chat", {"upto": 1})  # a stale copy's row
        route(store, lambda *row: sent.append(row), {("consolidate", "chat"): '{"upto": 7}'})
        assert get_state(store, "consolidate", "chat") == {"upto": 7}
        set_state(store, "consolidate", "chat", {"upto": 8})
        assert sent[0][:3] == ("consolidate", "chat", '{"upto": 8}')
        raw = store.scalar("SELECT value FROM job_state")
        assert json.loads(raw) == {"upto": 1}  # the local table untouched
