"""A job's actor: it lives only while its job runs.

The Cron actor starts one per run (``num_cpus=0``, no restarts, named
``job-<name>-<run id>`` so the dashboard shows what runs), calls :meth:`run`
once and kills it when the result is back: no long-lived job actors (each
worker costs about 62 MiB PSS). The actor builds the job's
``runtime.mind.contract.JobContext``: its own Store connection (reads, and its
``job_state``), a
:class:`actors.remote_writer.RemoteWriter` (writes go to the owner actors), the
configured language models, the Recall actor's model (a
:class:`actors.embedder.RemoteEmbedder`: a job that embeds, research, loads no
ONNX session of its own; when the Recall actor cannot be reached the context
has none and such a job loads its own), and the clock: the system's, or fixed
at the tick's ``now`` when the tick named one (tests and simulations jump
time). When the run ends, the process's peak resident memory is logged (debug).

Off the hub (a helper node: another Ray node than the Cron actor's) the job
reads a read-only snapshot of the store restored from the household's replica
for the run, and its ``job_state`` goes to the Cron actor by message
(``actors.job_snapshot``); without a replica it opens the store at its path
when that is there (a shared filesystem) and refuses otherwise.

On the hub, the job's connection may write its own bookkeeping and nothing else
(:func:`guard`): every memory write, the janitor's deletes included, goes
through the owners, and a job that writes (or changes the schema) on its own
connection fails loudly (``apsw.AuthError``) instead of becoming a second
writer beside them. Not ``PRAGMA query_only``: most jobs keep their progress
in ``job_state`` (``runtime.store.job_state.set_state``: consolidate, facts,
patterns, synthesis, dmn, sync, geo, research), which only they write.
"""

from __future__ import annotations

import contextlib
import logging
import os

import apsw

from actors.common import open_store, setup_logging
from actors.embedder import RemoteEmbedder
from actors.handles import RecallClient
from actors.job_snapshot import no_store_reason, off_hub, snapshot
from actors.remote_writer import RemoteWriter
from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import make_llm
from runtime.llm.queue import LLMHealth
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.registry import resolve
from runtime.store.database import Store
from runtime.time.clock import Clock, ManualClock, SystemClock

log = logging.getLogger(__name__)

# A job is background work: its process runs at this niceness (the hub's
# workers run at 0, actors.node.HUB_SYSTEM_CONFIG), so that the turn path and
# the household's other programs come first when the CPU is short.
JOB_NICENESS = 10


def shared_embedder(settings: Settings) -> Embedder | None:
    """The Recall actor's model, or None when that actor cannot be reached."""
    try:
        return RemoteEmbedder(RecallClient(settings.runtime.namespace,
                                            household=settings.household.id),
                              batch=settings.embedder.batch_size)
    except Exception as exc:  # no Recall actor (a Cron alone, in tests), or gone
        log.warning("the Recall actor is not reachable (%s): a job that embeds "
                    "loads its own model", type(exc).__name__)
        return None


#: The tables a job's own connection may write: its bookkeeping (``runtime.store.job_state``).
JOB_TABLES = frozenset({"job_state"})
_WRITES = frozenset({apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE})
_SCHEMA = frozenset({
    apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_CREATE_TRIGGER,
    apsw.SQLITE_CREATE_VIEW, apsw.SQLITE_CREATE_VTABLE, apsw.SQLITE_DROP_TABLE,
    apsw.SQLITE_DROP_INDEX, apsw.SQLITE_DROP_TRIGGER, apsw.SQLITE_DROP_VIEW,
    apsw.SQLITE_DROP_VTABLE, apsw.SQLITE_ALTER_TABLE})


def _job_authorizer(op: int, first: str | None, second: str | None, db: str | None,
                    trigger: str | None) -> int:
    if db == "temp":  # a job's scratch tables are its own
        return apsw.SQLITE_OK
    if op in _WRITES and first not in JOB_TABLES:
        return apsw.SQLITE_DENY
    if op in _SCHEMA:
        return apsw.SQLITE_DENY
    return apsw.SQLITE_OK


def guard(store: Store) -> Store:
    """Let ``store``'s connection write ``job_state`` only (after its migrations
    ran): a write to any other table, or a schema change, is refused by SQLite
    when the statement is prepared (``apsw.AuthError: not authorized``)."""
    store.conn.authorizer = _job_authorizer
    return store


def peak_rss_kib() -> int | None:
    """This process's peak resident set (``VmHWM``), in KiB; None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class JobActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "job")
        self.settings = settings
        lower = JOB_NICENESS - os.nice(0)
        if lower > 0:  # never raised: a process may lower its priority only
            os.nice(lower)

    def run(self, name: str, target: str, now: float | None = None,
            hub_node: str | None = None) -> JobResult:
        """Import the job's function (a missing module fails this run only), run it
        once and answer its result; what it raises goes back to Cron.
        ``hub_node``: the Ray node id of the hub (the Cron actor's); on another
        node the job reads a snapshot (``actors.job_snapshot``)."""
        fn = resolve(target)
        clock: Clock = SystemClock() if now is None else ManualClock(now)
        with contextlib.ExitStack() as stack:
            settings, store = self._store(stack, clock, off_hub(hub_node))
            ctx = JobContext(store=store, writer=RemoteWriter(settings.runtime.namespace,
                                                                household=settings.household.id),
                             llm=make_llm(settings.llm, LLMHealth(
                                 settings.store.resolved_dir, clock)), clock=clock,
                             settings=settings, budget_s=settings.jobs.budget_s,
                             embedder=shared_embedder(settings))
            log.info("job %s starts", name)
            try:
                return fn(ctx)
            finally:
                log.debug("job %s: peak RSS %s KiB", name, peak_rss_kib())

    def _store(self, stack: contextlib.ExitStack, clock: Clock,
               remote: bool) -> tuple[Settings, Store]:
        """The run's settings and store: the household's store at its path (on
        the hub; off it, without a replica, when the path is there), or a
        snapshot restored from the replica (off the hub)."""
        if remote and self.settings.replica.enabled:
            return stack.enter_context(snapshot(self.settings, clock))
        if not self.settings.store.path.exists():  # a helper without the store, no replica
            raise FileNotFoundError(no_store_reason(self.settings))
        store = stack.enter_context(guard(open_store(self.settings, clock)))
        return self.settings, store

    def ping(self) -> str:
        return "ok"
