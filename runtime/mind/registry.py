"""The background jobs: which exist, when each may run, and the record of runs.

A job is a plain function (``runtime.mind.contract.JobFn``) named by
``"module:function"`` in :data:`JOBS`, imported when it fires, so a job whose
module is missing or broken is a failed run, never an error at start. The
settings may add jobs (``jobs.extra``), run after the built-in ones.

Every run is a ``job_runs`` row (migration 0008): inserted when it starts,
completed with its outcome, the items it did and, for a failure, the
exception's type and a short message (never memory content); for a success,
the result's detail line (migration 0014: one line of at most
:data:`MAX_DETAIL` characters; by the ``JobResult`` contract, counts and
reasons, never memory content), which ``reverie jobs`` shows. ``job_runs`` is
the durable "last fired": a job is eligible again ``check_every_s`` after its
last run started (an hour when it found nothing to do and nothing has been
written since: :data:`QUIET_JOBS`, migration 0019), and, for idle-gated runs,
not before the idle gate opens (``runtime.mind.idle``). A run left without an
outcome by a crash is closed as failed when the runner starts again.

The household's activity and presence, the idle gate's inputs, are kept here
too (``household_activity``, ``presence``; migration 0009), written only by
the Cron actor.
"""

from __future__ import annotations

import importlib
import logging
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from runtime.config import JOB_NAMES, Settings
from runtime.mind.contract import JobFn, JobResult
from runtime.mind.idle import IdleState, Presence, PresenceState
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

#: The jobs that exist, in the order a tick runs them.
JOBS: dict[str, str] = {
    "consolidate": "runtime.mind.consolidate:run",
    "facts": "runtime.mind.extract:run",
    "decay": "runtime.mind.janitor:run",
    "patterns": "runtime.mind.patterns:run",
    "synthesis": "runtime.mind.synthesis:run",
    "dmn": "runtime.mind.dmn:run",
    "sync": "runtime.mind.sync.job:run",
    "geo": "runtime.mind.geo_job:run",
    "research": "runtime.mind.research:run",
}
#: Jobs whose only input is the store. When such a job's last run ended ok having
#: done nothing, and nothing has been written since it started (the write log's
#: newest id is the one it saw), it is checked again after
#: :data:`QUIET_RECHECK_S` instead of ``check_every_s``: every run starts a Ray
#: worker (≈ 0.8 CPU-s), and a household away all day would start six of them
#: every five minutes for nothing. Any write (a turn, a memory, another job's
#: output) makes them eligible again at once. ``sync``, ``geo`` and
#: ``research`` read the world outside and keep the usual check.
QUIET_JOBS = frozenset({"consolidate", "facts", "decay", "patterns", "synthesis", "dmn"})
QUIET_RECHECK_S = 3600.0
#: Known job names that come later ("The subconscious II"): not listed, not run.
LATER = tuple(name for name in JOB_NAMES if name not in JOBS)
MAX_ERROR = 300
MAX_DETAIL = 1000


class UnknownJob(ValueError):
    """No job of that name."""


def registry(settings: Settings) -> dict[str, str]:
    """Every job to run, name -> ``"module:function"``: the built-in ones, then
    ``jobs.extra``, less ``jobs.disabled``."""
    off = set(settings.jobs.disabled)
    return {name: target for name, target in {**JOBS, **settings.jobs.extra}.items()
            if name not in off}


def resolve(target: str) -> JobFn:
    """The function named ``"module:function"`` (imported now)."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"{target}: no such function")
    return cast(JobFn, fn)


def error_text(exc: BaseException) -> str:
    """A failure as it is recorded: the exception's type and the first line of
    its message, cut short."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text[:MAX_ERROR]


def detail_text(detail: str) -> str | None:
    """A result's detail as it is recorded: one line (control characters and
    runs of whitespace become one space), cut at :data:`MAX_DETAIL` characters
    with an ellipsis; None when empty."""
    line = " ".join("".join(" " if unicodedata.category(ch)[0] == "C" else ch
                            for ch in detail).split())
    if len(line) > MAX_DETAIL:
        line = line[:MAX_DETAIL - 1].rstrip() + "…"
    return line or None


# -- the record of runs ----------------------------------------------------


@dataclass(frozen=True)
class Run:
    id: int
    job: str
    started_at: float
    ended_at: float | None
    outcome: str | None  # "ok", "failed", None while running
    items: int
    error: str | None
    detail: str | None = None  # the result's line (ok runs)
    write_mark: int | None = None  # the write log's newest id when it started

    @classmethod
    def of(cls, row: Row) -> Run:
        return cls(id=row["id"], job=row["job"], started_at=row["started_at"],
                   ended_at=row["ended_at"], outcome=row["outcome"], items=row["items"],
                   error=row["error"], detail=row["detail"], write_mark=row["write_mark"])


def write_mark(store: Store) -> int:
    """The newest id of the write log (0 when empty): it moves with every write."""
    return int(store.scalar("SELECT coalesce(max(id), 0) FROM write_log") or 0)


def start_run(store: Store, job: str, now: float) -> int:
    with store.write_transaction():
        store.conn.execute("INSERT INTO job_runs (job, started_at, write_mark) VALUES (?, ?, ?)",
                           (job, now, write_mark(store)))
        return int(store.conn.last_insert_rowid())


def end_run(store: Store, run_id: int, now: float, result: JobResult | None = None,
            error: BaseException | str | None = None) -> Run:
    """Close a run: ok with ``result``, or failed with ``error``."""
    if (result is None) == (error is None):
        raise ValueError("a run ends with a result or an error")
    if result is not None:
        values: tuple[Any, ...] = (now, "ok", int(result.items), None,
                                   detail_text(str(result.detail)))
    else:
        text = error if isinstance(error, str) else error_text(cast(BaseException, error))
        values = (now, "failed", 0, text[:MAX_ERROR], None)
    with store.write_transaction():
        store.conn.execute(
            "UPDATE job_runs SET ended_at = ?, outcome = ?, items = ?, error = ?, detail = ?"
            " WHERE id = ?", (*values, run_id))
    row = store.row("SELECT * FROM job_runs WHERE id = ?", (run_id,))
    assert row is not None
    return Run.of(row)


def close_interrupted(store: Store, now: float) -> int:
    """Mark runs left open by a crash as failed; return how many."""
    with store.write_transaction():
        store.conn.execute(
            "UPDATE job_runs SET ended_at = ?, outcome = 'failed',"
            " error = 'Interrupted: the runner stopped during the run'"
            " WHERE outcome IS NULL", (now,))
        return int(store.conn.changes())


def last_runs(store: Store) -> dict[str, Run]:
    """Each job's latest run."""
    rows = store.rows(
        "SELECT r.* FROM job_runs r JOIN (SELECT job, max(id) AS id FROM job_runs"
        " GROUP BY job) latest ON latest.id = r.id")
    return {r["job"]: Run.of(r) for r in rows}


def get_run(store: Store, run_id: int) -> Run | None:
    row = store.row("SELECT * FROM job_runs WHERE id = ?", (run_id,))
    return None if row is None else Run.of(row)


def quiet(name: str, last: Run | None, mark: int) -> bool:
    """Whether ``name`` found nothing to do last time and nothing has been written
    since (:data:`QUIET_JOBS`)."""
    return (name in QUIET_JOBS and last is not None and last.outcome == "ok"
            and last.items == 0 and last.write_mark is not None and last.write_mark == mark)


def next_eligible_at(last: Run | None, gate: IdleState, check_every_s: float,
                     quiet: bool = False) -> float | None:
    """When a job may fire next: ``check_every_s`` after its last run started
    (:data:`QUIET_RECHECK_S` when ``quiet``), and not before the idle gate opens
    (None: now, nothing holds it back)."""
    wait = max(check_every_s, QUIET_RECHECK_S) if quiet else check_every_s
    times = [t for t in (None if last is None else last.started_at + wait,
                         gate.eligible_at) if t is not None]
    return max(times) if times else None


def due_jobs(store: Store, names: list[str], gate: IdleState, now: float,
             check_every_s: float) -> list[str]:
    """The jobs of ``names`` that may fire at ``now`` (idle-gated)."""
    if not gate.idle:
        return []
    last = last_runs(store)
    mark = write_mark(store)
    out = []
    for name in names:
        run = last.get(name)
        at = next_eligible_at(run, gate, check_every_s, quiet(name, run, mark))
        if at is None or at <= now:
            out.append(name)
    return out


def status(store: Store, names: list[str], gate: IdleState, check_every_s: float,
           last: dict[str, Run] | None = None) -> list[dict[str, Any]]:
    """One line per job for ``reverie jobs`` (``last``: :func:`last_runs`, read
    now when not given)."""
    last = last_runs(store) if last is None else last
    mark = write_mark(store)
    out = []
    for name in names:
        run = last.get(name)
        out.append({
            "name": name,
            "last_outcome": None if run is None else run.outcome,
            "last_run_at": None if run is None else run.started_at,
            "next_eligible_at": next_eligible_at(run, gate, check_every_s,
                                                 quiet(name, run, mark)),
        })
    return out


def last_details(last: dict[str, Run], names: list[str]) -> dict[str, str]:
    """Each job's last run in words, for the text of ``reverie jobs``: an ok
    run's detail, a failed run's error (jobs without either are left out)."""
    out = {}
    for name in names:
        run = last.get(name)
        text = None if run is None else run.error if run.outcome == "failed" else run.detail
        if text:
            out[name] = text
    return out


def run_job(store: Store, name: str, target: str, now: float,
            execute: Callable[[str, str], JobResult],
            clock_now: Callable[[], float] | None = None) -> Run:
    """Run one job through ``execute(name, target)`` and record it. Whatever
    ``execute`` raises is logged and recorded as a failed run, never raised."""
    run_id = start_run(store, name, now)
    try:
        result = execute(name, target)
        if not isinstance(result, JobResult):
            raise TypeError(f"job {name} returned {type(result).__name__}, not a JobResult")
    except Exception as exc:
        log.warning("job %s failed: %s", name, error_text(exc))
        return end_run(store, run_id, clock_now() if clock_now else now, error=exc)
    log.info("job %s done: %d items%s", name, result.items,
             f" ({result.detail})" if result.detail else "")
    return end_run(store, run_id, clock_now() if clock_now else now, result=result)


# -- the idle gate's inputs --------------------------------------------------


def load_activity(store: Store) -> float | None:
    value = store.scalar("SELECT last_at FROM household_activity WHERE id = 1")
    return None if value is None else float(value)


def record_activity(store: Store, at: float) -> float:
    """Record user activity at ``at`` (never moving it back); return the last."""
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO household_activity (id, last_at) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET last_at = max(last_at, excluded.last_at)", (at,))
    last = load_activity(store)
    assert last is not None
    return last


def load_presence(store: Store) -> dict[str, Presence]:
    """Each person's presence for the idle gate: the state, since it last changed
    (a repeated report of the same state and place is not an event)."""
    return {r["person"]: Presence(r["state"], r["since"] if r["since"] is not None else r["at"])
            for r in store.rows("SELECT person, state, at, since FROM presence")}


def presence_report(store: Store) -> dict[str, dict[str, Any]]:
    """``presence`` of ``reverie status --json``: who is where, and since when."""
    return {r["person"]: {"state": r["state"], "place": r["place"], "source": r["source"],
                          "since": r["since"] if r["since"] is not None else r["at"],
                          "reported_at": r["at"]}
            for r in store.rows("SELECT person, state, place, source, at, since FROM presence"
                                " ORDER BY person")}


def record_presence(store: Store, person: str, state: PresenceState, at: float,
                    place: str | None = None, source: str | None = None) -> None:
    """Record a person's presence. An older report than the one kept is ignored;
    ``since`` moves only when the state or the place changes."""
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO presence (person, state, at, place, source, since)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (person) DO UPDATE SET"
            "  since = CASE WHEN presence.state IS excluded.state"
            "   AND presence.place IS excluded.place THEN presence.since ELSE excluded.at END,"
            "  state = excluded.state, at = excluded.at, place = excluded.place,"
            "  source = excluded.source"
            " WHERE excluded.at >= presence.at",
            (person, state, at, place, source, at))
