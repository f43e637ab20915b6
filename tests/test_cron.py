"""The Cron actor on real Ray and real SQLite, time jumped by messages (``Tick(now)``,
``Activity(at)``...), never by sleeping: the idle gate, job actors that live only
while they run, failures and deaths recorded, reminders fired once, state kept
across a restart."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import ray

from actors import supervisor
from actors.common import CRON, EPISODES, GRAPH, RECALL, TRANSCRIPT, TURNS, BadRequest
from actors.handles import CronClient, TranscriptClient, TurnsClient
from actors.job_actor import JOB_NICENESS
from actors.messages import (
    Activity,
    AppendTurns,
    JobsStatus,
    JobStateRow,
    Presence,
    QueueFile,
    Remind,
    RunJob,
    SaveJobState,
    SaveLLMQueue,
    Tick,
    UserTurn,
)
from runtime.config import CONFIG_DIR, JOB_NAMES, Settings, load_settings
from runtime.llm.queue import QUEUE_DIR
from runtime.memories.transcript import TurnIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.job_state import get_state, set_state

NS = "test-cron"
DAY = 86400.0
WINDOW = 1800.0
EXTRA = {"ok": "tests.jobs_for_tests:ok", "boom": "tests.jobs_for_tests:boom",
         "die": "tests.jobs_for_tests:die", "compact": "tests.jobs_for_tests:compact",
         "hang": "tests.jobs_for_tests:hang"}
ON_DEMAND = {"write": "tests.jobs_for_tests:write"}  # checked by its own test
# A run is killed at 3 budgets: 18 s, time enough for the "die" job's actor to
# start (and die) on a loaded machine; at 12 s, a run of the suite beside a
# busy process once saw the timeout first.
BUDGET = 6.0
# Test time lies after the real clock, so the turn path's real-time activity
# never holds the gate of a simulated tick; each test gets days of its own.
_BASES = itertools.count()


def base() -> float:
    return 2_000_000_000.0 + next(_BASES) * 10 * DAY


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("cron-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "household": {"timezone": "Europe/Lisbon"},
        # checked by messages only (a day between background checks), the jobs
        # of tests/jobs_for_tests.py only (the real ones are tested on their own)
        "jobs": {"check_every_s": DAY, "idle_after_s": WINDOW,
                 "extra": {**EXTRA, **ON_DEMAND},
                 "budget_s": BUDGET,
                 "disabled": list(JOB_NAMES)},
    })
    sup = supervisor.start(settings)
    yield settings
    sup.stop()


cron = CronClient(NS, timeout_s=300)
transcript = TranscriptClient(NS)


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def until(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Wait for a condition (not a timing threshold): its first truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def job_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NS and a["name"].startswith("job-")]


def test_no_job_while_active_then_every_job_after_the_idle_window(runtime: Settings) -> None:
    t = base()
    cron.activity(Activity(at=t))
    quiet = cron.tick(Tick(now=t + WINDOW - 1, wait=True))
    assert quiet.started == [] and quiet.runs == []
    status = cron.status(JobsStatus(now=t + 60))
    assert status.idle.idle is False and status.idle.eligible_at == t + WINDOW

    ticked = cron.tick(Tick(now=t + WINDOW, wait=True))
    assert ticked.started == ["ok", "boom", "die", "compact", "hang", "write"]
    runs = {r.name: r for r in ticked.runs}
    # a job that raises, and one whose actor dies, are recorded; the others still run
    assert runs["ok"].outcome == "ok" and runs["ok"].items >= 1
    assert runs["boom"].outcome == "failed"
    assert runs["boom"].error == "RuntimeError: boom: this job always fails"
    assert runs["die"].outcome == "failed" and runs["die"].error is not None
    assert "ActorDied" in runs["die"].error
    assert runs["compact"].outcome == "ok", runs["compact"].error

    store = read_store(runtime)
    try:
        rows = store.rows("SELECT * FROM job_runs WHERE started_at = ? ORDER BY id",
                          (t + WINDOW,))
        assert [(r["job"], r["outcome"]) for r in rows] == [
            ("ok", "ok"), ("boom", "failed"), ("die", "failed"), ("compact", "ok"),
            ("hang", "ok"), ("write", "ok")]
        assert all(r["ended_at"] is not None for r in rows)
        # the run's clock was the tick's instant
        assert get_state(store, "ok", "clock") == t + WINDOW
        # the job wrote through the Transcript actor (RemoteWriter.compact)
        assert store.scalar("SELECT count(*) FROM compactions WHERE summary = ?",
                            ("the household talked about bees",)) >= 1
    finally:
        store.close()

    # the job actors lived only while they ran
    assert until(lambda: job_actors() == [])

    # a job runs again only a check interval after its last run
    soon = cron.tick(Tick(now=t + WINDOW + 60, wait=True))
    assert soon.started == []
    lines = {j.name: j for j in cron.status(JobsStatus(now=t + WINDOW + 60)).jobs}
    assert lines["ok"].last_outcome == "ok" and lines["ok"].last_run_at == t + WINDOW
    assert lines["ok"].next_eligible_at == t + WINDOW + DAY
    assert lines["boom"].last_outcome == "failed"


def test_a_run_past_its_hard_limit_is_killed_and_recorded(runtime: Settings) -> None:
    t = base()
    store = read_store(runtime)
    try:
        set_state(store, "hang", "armed", True)
        assert cron.run(RunJob(name="hang", now=t)).outcome is None
        running = until(lambda: store.scalar(
            "SELECT id FROM job_runs WHERE job = 'hang' AND started_at = ?"
            " AND outcome IS NULL", (t,)))
        assert running
        # one run of a job at a time: asked again, the run in progress answers
        ran = cron.run(RunJob(name="hang", wait=True, now=t + 1))
        assert ran.run_id == running
        assert store.scalar("SELECT count(*) FROM job_runs WHERE started_at = ?", (t + 1,)) == 0
    finally:
        set_state(store, "hang", "armed", False)
        store.close()
    assert ran.outcome == "failed" and ran.error is not None
    assert ran.error.startswith(f"TimeoutError: the run took more than {3 * BUDGET:g} s")
    assert until(lambda: job_actors() == [])


def test_everyone_away_counts_as_idle(runtime: Settings) -> None:
    t = base()
    cron.activity(Activity(at=t))
    cron.presence(Presence(person="ana", state="away", at=t + 10))
    cron.presence(Presence(person="ben", state="home", at=t + 5))
    assert cron.tick(Tick(now=t + 20, wait=True)).started == []
    cron.presence(Presence(person="ben", state="away", at=t + 30))
    status = cron.status(JobsStatus(now=t + 40))
    assert status.idle.idle and status.idle.reason == "everyone-away"
    assert status.idle.presence == {"ana": "away", "ben": "away"}
    ticked = cron.tick(Tick(now=t + 40, wait=True))
    assert "ok" in ticked.started
    cron.presence(Presence(person="ben", state="home", at=t + 50))  # back home: not idle
    assert cron.status(JobsStatus(now=t + 60)).idle.idle is False


def test_a_job_writes_through_the_owner_actors(runtime: Settings) -> None:
    t = base()
    turn = transcript.append(AppendTurns(turns=[TurnIn(
        channel="chat", source="user", content="Ana keeps bees in Porto.", created_at=t)])).ids[0]
    ran = cron.run(RunJob(name="write", wait=True, now=t + 1))
    assert ran.outcome == "ok", ran.error
    store = read_store(runtime)
    try:
        episode, first, made, again, same, existing, moved, changed = get_state(
            store, "write", "result")
        assert (made, same, changed) == ("insert", "reinforce", "supersede")
        assert again == first == existing and moved != first
        assert store.scalar("SELECT transcript_id FROM episode_citations WHERE episode_id = ?",
                            (episode,)) == turn
        writers = {r["writer"] for r in store.rows(
            "SELECT writer FROM write_log WHERE table_name IN ('episodes', 'facts')"
            " AND row_id IN (?, ?, ?)", (episode, first, moved))}
        assert writers == {"test-job"}
        old = store.row("SELECT valid_to, superseded_by FROM facts WHERE id = ?", (first,))
        assert old is not None and old["superseded_by"] == moved
    finally:
        store.close()


def test_run_job_now_past_the_gate(runtime: Settings) -> None:
    t = base()
    cron.activity(Activity(at=t))  # the user is active: the gate is shut
    ran = cron.run(RunJob(name="ok", wait=True, now=t + 1))
    assert ran.outcome == "ok" and ran.run_id is not None and ran.detail.startswith("run ")
    failed = cron.run(RunJob(name="boom", wait=True, now=t + 2))
    assert failed.outcome == "failed" and failed.error is not None
    started = cron.run(RunJob(name="ok", now=t + 3))
    assert started.outcome is None
    store = read_store(runtime)
    try:  # it runs in the background, and is recorded
        assert until(lambda: store.scalar("SELECT outcome FROM job_runs WHERE job = 'ok'"
                                          " AND started_at = ?", (t + 3,)) == "ok")
    finally:
        store.close()
    with pytest.raises(BadRequest, match="unknown job 'nope'"):
        cron.run(RunJob(name="nope"))
    for name in ("consolidate", "patterns"):  # disabled here
        with pytest.raises(BadRequest, match=f"unknown job '{name}'"):
            cron.run(RunJob(name=name))


def test_jobs_run_below_the_turn_path(runtime: Settings) -> None:
    """The owner actors run at the hub's priority (niceness 0, not Ray's 15:
    actors.node.HUB_SYSTEM_CONFIG), so a voice turn is not starved beside a busy
    process; a job's process lowers itself to JOB_NICENESS."""
    for name in (TURNS, RECALL, TRANSCRIPT, EPISODES, GRAPH, CRON):
        handle = ray.get_actor(name, namespace=NS)
        assert ray.get(handle.__ray_call__.remote(lambda self: os.nice(0)), timeout=60) == 0, name
    ran = cron.run(RunJob(name="ok", wait=True, now=base()))
    assert ran.outcome == "ok", ran.error
    store = read_store(runtime)
    try:
        assert get_state(store, "ok", "niceness") == JOB_NICENESS > 0
    finally:
        store.close()


def test_a_job_off_the_hub_keeps_its_state_through_cron(runtime: Settings) -> None:
    """A job run on a snapshot (actors/job_snapshot.py) asks Cron for the hub's
    newest write and job state, and writes its own state through Cron."""
    assert cron.save_job_state(SaveJobState(job="offhub", key="k", value='{"n": 1}', at=5.0))
    cron.save_job_state(SaveJobState(job="offhub", key="k", value='{"n": 2}', at=6.0))
    hub = cron.hub_job_state()
    assert JobStateRow(job="offhub", key="k", value='{"n": 2}') in hub.rows
    store = read_store(runtime)
    try:
        assert store.scalar("SELECT value FROM job_state WHERE job = 'offhub'") == '{"n": 2}'
        assert store.scalar("SELECT updated_at FROM job_state WHERE job = 'offhub'") == 6.0
        assert 0 <= hub.write_log_id <= store.scalar(
            "SELECT coalesce(max(id), 0) FROM write_log")
    finally:
        store.close()
    with pytest.raises(BadRequest, match="offhub/k"):
        cron.save_job_state(SaveJobState(job="offhub", key="k", value="{not json", at=7.0))
    # the language model's retry queue: to the run, and back as the run left it
    queue = runtime.store.resolved_dir / QUEUE_DIR
    cron.save_llm_queue(SaveLLMQueue(files=[QueueFile(name="000000000007.json", data="{}")]))
    assert [f.name for f in cron.hub_job_state().llm_queue] == ["000000000007.json"]
    cron.save_llm_queue(SaveLLMQueue(files=[]))
    assert cron.hub_job_state().llm_queue == [] and not any(queue.iterdir())


def test_reminder_fires_once_when_due(runtime: Settings) -> None:
    t = base()
    made = cron.remind(Remind(text="take the bins out", when="in 2 hours", channel="chat",
                              now=t))
    assert made.due_at == t + 7200
    assert made.due_local == datetime.fromtimestamp(
        t + 7200, ZoneInfo("Europe/Lisbon")).isoformat(timespec="minutes")

    def tick(now: float) -> list[int]:
        cron.activity(Activity(at=now))  # the user is around: only reminders fire
        return cron.tick(Tick(now=now, wait=True)).reminders

    assert tick(t + 7199) == []
    assert tick(t + 7200) == [made.id]
    assert tick(t + 9000) == []
    store = read_store(runtime)
    try:
        rows = store.rows("SELECT * FROM transcript WHERE request_id = ?",
                          (f"reminder-{made.id}",))
        assert len(rows) == 1
        row = rows[0]
        assert (row["channel"], row["source"], row["role"]) == ("chat", "scheduled", "assistant")
        assert row["content"] == "Reminder: take the bins out"
        assert row["memory"] == 0  # muted by the profiles: never memory
        fired = store.row("SELECT * FROM reminders WHERE id = ?", (made.id,))
        assert fired is not None and fired["fired_at"] == t + 7200
        assert fired["turn_id"] == row["id"]
    finally:
        store.close()


def test_a_reminder_said_before_a_crash_is_not_said_twice(runtime: Settings) -> None:
    t = base()
    made = cron.remind(Remind(text="call grandma", when="in 1 hour", channel="voice", now=t))
    # as if Cron had appended it and died before marking it fired
    said = transcript.append(AppendTurns(turns=[TurnIn(
        channel="voice", source="scheduled", role="assistant", content="Reminder: call grandma",
        request_id=f"reminder-{made.id}")])).ids[0]
    cron.activity(Activity(at=t + 3600))
    assert cron.tick(Tick(now=t + 3600, wait=True)).reminders == [made.id]
    store = read_store(runtime)
    try:
        assert store.scalar("SELECT count(*) FROM transcript WHERE request_id = ?",
                            (f"reminder-{made.id}",)) == 1
        assert store.scalar("SELECT turn_id FROM reminders WHERE id = ?", (made.id,)) == said
    finally:
        store.close()


def test_bad_reminders_are_refused(runtime: Settings) -> None:
    with pytest.raises(BadRequest, match="unknown channel"):
        cron.remind(Remind(text="x", when="in 1 hour", channel="nowhere"))
    with pytest.raises(BadRequest, match="in the past"):
        cron.remind(Remind(text="x", when="2001-01-01 10:00"))
    with pytest.raises(BadRequest, match="cannot read the time"):
        cron.remind(Remind(text="x", when="whenever"))


def test_a_user_turn_tells_cron(runtime: Settings) -> None:
    before = time.time()
    TurnsClient(NS).process(UserTurn(channel="chat", text="Is the garden gate locked?"))
    last = until(lambda: (cron.status().idle.last_activity or 0) >= before and
                 cron.status().idle.last_activity)
    assert last and last >= before


def test_state_survives_a_restart(runtime: Settings) -> None:
    t = base()
    cron.presence(Presence(person="cleo", state="away", at=t))
    ran = cron.run(RunJob(name="ok", wait=True, now=t))
    assert ran.outcome == "ok"
    first = _pid()
    ray.kill(ray.get_actor(CRON, namespace=NS), no_restart=False)  # Ray restarts it
    assert until(lambda: _pid() not in (None, first), timeout=120)  # a new process
    assert cron.status(JobsStatus(now=t + 1)).idle.presence["cleo"] == "away"
    # the runs recorded before the restart are still the jobs' last runs
    lines = {j.name: j for j in cron.status(JobsStatus(now=t + 1)).jobs}
    assert lines["ok"].last_run_at == t and lines["ok"].last_outcome == "ok"


def test_a_run_cut_by_a_cron_restart_is_recorded_failed(runtime: Settings) -> None:
    t = base()
    store = read_store(runtime)
    try:
        set_state(store, "hang", "armed", True)
        assert cron.run(RunJob(name="hang", now=t)).outcome is None  # started, not waited for
        running = until(lambda: store.scalar(
            "SELECT id FROM job_runs WHERE job = 'hang' AND started_at = ?"
            " AND outcome IS NULL", (t,)))
        assert running and until(lambda: job_actors() != [])
        ray.kill(ray.get_actor(CRON, namespace=NS), no_restart=False)  # Ray restarts it
        # (a ping may still reach the old instance: wait for the new one's doing)
        run = until(lambda: store.row("SELECT * FROM job_runs WHERE id = ?"
                                      " AND outcome IS NOT NULL", (running,)), timeout=120)
        assert run and run["outcome"] == "failed"
        assert run["error"].startswith("Interrupted")
        assert until(lambda: job_actors() == [])  # the job actor went with its owner
    finally:
        set_state(store, "hang", "armed", False)
        store.close()


def _pid() -> int | None:
    """The Cron actor's process id (None while it is restarting)."""
    try:
        handle = ray.get_actor(CRON, namespace=NS)
        return int(ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=5))
    except Exception:
        return None


def test_the_background_loop_ticks_and_wakes_for_reminders(
        ray_instance: str, tmp_path: Path, model_cache: Path) -> None:
    """The Cron class in this process, its own thread ticking every 0.3 s (no Tick
    message): jobs fire on their own, and a reminder due between checks is said."""
    from actors.cron import CronActor
    from actors.transcript import TranscriptActor

    ns = "test-cron-loop"
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path / "data")},
        "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": ns},
        "jobs": {"check_every_s": 0.3, "extra": {"ok": EXTRA["ok"]},
                 "disabled": list(JOB_NAMES)},
    })
    owner: Any = ray.remote(TranscriptActor)
    transcript_actor = owner.options(name="transcript", namespace=ns, num_cpus=0
                                     ).remote(settings)
    loop = CronActor(settings)
    store = read_store(settings)
    try:
        assert until(lambda: store.scalar(
            "SELECT count(*) FROM job_runs WHERE job = 'ok' AND outcome = 'ok'"))
        loop.every = 3600.0  # no more job checks: what follows is the reminder's wake-up
        made = loop.remind(Remind(text="tea is ready", when="in 1 minute", channel="chat",
                                  now=time.time() - 59.0))
        said = until(lambda: store.scalar("SELECT turn_id FROM reminders WHERE id = ?",
                                          (made.id,)))
        assert said
        assert store.scalar("SELECT source FROM transcript WHERE id = ?", (said,)) == "scheduled"
    finally:
        loop.stop()
        store.close()
        ray.kill(transcript_actor)
