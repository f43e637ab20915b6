"""Jobs for the tests, named in settings as ``jobs.extra = {"ok": "tests.jobs_for_tests:ok"}``."""

from __future__ import annotations

import os
import time

from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.mind.contract import JobContext, JobResult
from runtime.store.job_state import get_state, set_state


def ok(ctx: JobContext) -> JobResult:
    """Counts its runs in job_state and notes the clock it was given."""
    runs = int(get_state(ctx.store, "ok", "runs", 0)) + 1
    set_state(ctx.store, "ok", "runs", runs)
    set_state(ctx.store, "ok", "clock", ctx.clock.now())
    set_state(ctx.store, "ok", "niceness", os.nice(0))  # its process's priority
    return JobResult(items=runs, detail=f"run {runs}")


def boom(ctx: JobContext) -> JobResult:
    raise RuntimeError("boom: this job always fails")


def die(ctx: JobContext) -> JobResult:
    """Takes its actor's process down (as an out-of-memory kill would)."""
    os._exit(1)


def compact(ctx: JobContext) -> JobResult:
    """Writes through ctx.writer: a compaction row through the Transcript actor."""
    cid = ctx.writer.compact("chat", "the household talked about bees", 0, "test-job")
    return JobResult(items=1, detail=f"compaction {cid}")


def not_a_result(ctx: JobContext) -> JobResult:
    return "done"  # type: ignore[return-value]


def hang(ctx: JobContext) -> JobResult:
    """Never ends once armed (``job_state`` hang/armed = true): its actor must be killed."""
    if get_state(ctx.store, "hang", "armed", False):
        while True:
            time.sleep(1)
    return JobResult(items=0)


def write(ctx: JobContext) -> JobResult:
    """Writes an episode citing the newest turn, then the same fact twice and a
    contradicting one (its subject named after the run's clock, so each run has
    its own), all through ctx.writer (the owner actors)."""
    newest = ctx.store.scalar("SELECT max(id) FROM transcript")
    if newest is None:
        return JobResult(items=0)
    episode = ctx.writer.add_episode(
        EpisodeIn(channel="chat", source="user", gist="Ana talked about her bees", cites=[newest]),
        "test-job")
    fact = FactIn(kind="place", subject=f"Ana {ctx.clock.now():.0f}", key="lives_in",
                  value="Porto",
                  provenance=[f"episode:{episode}"])
    first, made = ctx.writer.add_fact(fact, "test-job")
    again, same = ctx.writer.add_fact(fact, "test-job")
    moved, changed = ctx.writer.add_fact(fact.model_copy(update={"value": "Braga"}), "test-job")
    set_state(ctx.store, "write", "result", [episode, first, made.action, again, same.action,
                                             same.existing_id, moved, changed.action])
    return JobResult(items=4)
