"""A job's actor: it lives only while its job runs.

The Cron actor starts one per run (``num_cpus=0``, no restarts, named
``job-<name>-<run id>`` so the dashboard shows what runs), calls :meth:`run`
once and kills it when the result is back: no long-lived job actors (each
worker costs about 62 MiB PSS). The actor builds the job's
``runtime.job_context.JobContext``: its own Store connection (reads), a
:class:`actors.remote_writer.RemoteWriter` (writes go to the owner actors), the
configured language models, and the clock: the system's, or fixed at the
tick's ``now`` when the tick named one (tests and simulations jump time).
"""

from __future__ import annotations

import logging

from actors.common import open_store, setup_logging
from actors.remote_writer import RemoteWriter
from runtime.clock import Clock, ManualClock, SystemClock
from runtime.config import Settings
from runtime.job_context import JobContext, JobResult
from runtime.jobs import resolve
from runtime.llm import make_llm
from runtime.llm_queue import LLMHealth

log = logging.getLogger(__name__)


class JobActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "job")
        self.settings = settings

    def run(self, name: str, target: str, now: float | None = None) -> JobResult:
        """Import the job's function (a missing module fails this run only), run it
        once and answer its result; what it raises goes back to Cron."""
        fn = resolve(target)
        clock: Clock = SystemClock() if now is None else ManualClock(now)
        store = open_store(self.settings, clock)
        try:
            ctx = JobContext(store=store, writer=RemoteWriter(self.settings.runtime.namespace),
                             llm=make_llm(self.settings.llm, LLMHealth(
                                 self.settings.store.resolved_dir, clock)), clock=clock,
                             settings=self.settings, budget_s=self.settings.jobs.budget_s)
            log.info("job %s starts", name)
            return fn(ctx)
        finally:
            store.close()

    def ping(self) -> str:
        return "ok"
