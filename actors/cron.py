"""The Cron actor: the subconscious' runner.

Long-lived (the only one the subconscious adds), started last by the
Supervisor. It keeps the idle gate's inputs (last user activity, each
person's presence; durable, so a restart forgets neither), checks every
``jobs.check_every_s``, and:

- fires due reminders, idle or not (``runtime.mind.reminders``): a ``say``
  reminder is appended to the transcript through the Transcript actor with a
  request id derived from the reminder's id and occurrence, then marked fired;
  a scheduled prompt (``ask``) is sent to the Turns actor as a turn of source
  ``scheduled`` with such a request id, in the background (a pool of
  ``PROMPT_WORKERS`` threads: a slow model never holds up a tick), and marked
  fired only once the answer is stored. A prompt whose answer is found stored
  already (a crash before the mark) is marked without asking again, and the
  Turns actor answers a re-sent turn with its stored reply, so a prompt is
  answered once. A repeating reminder is then due at its next occurrence
  (missed ones fire once). A firing that fails is recorded on the reminder and
  tried again at the next check (the background loop waits ``RETRY_S``
  before it tries an overdue one again);
- starts the jobs the idle gate lets through (``runtime.mind.idle``,
  ``runtime.mind.registry.due_jobs``). Each run gets its own job actor
  (``actors.job_actor``) that exists only while the run does; runs go one at a
  time, in a queue served by one thread, and a job is never queued twice.
  On a cluster the job's actor goes to a helper node when one offers the
  job resource, else to the hub (``actors.cluster.placement``).
  Whatever a run raises, and a job actor's death, is recorded as a failed run
  (``job_runs``); the next run and the next tick go on.

Messages (``actors/messages.py``): ``Activity``, ``Presence``, ``Tick``,
``JobsStatus``, ``RunJob``, ``Remind``, ``ListReminders``, ``CancelReminder``;
from a job run on a snapshot off the hub (``actors.job_snapshot``), ``HubJobState``
(the hub's newest write-log id, every ``job_state`` row, the language model's
retry queue), ``SaveJobState`` (its bookkeeping, written here: Cron owns
``job_runs`` and the jobs' state) and ``SaveLLMQueue`` (that queue as the run
left it).
Every time in them is optional: given,
it is the instant the message means (tests and simulations jump time by
sending ``Tick(now=...)`` instead of sleeping; a run started by such a tick
sees its job's clock fixed at that instant); absent, the actor's clock (the
system's, or one injected into the constructor) is read.

The actor is threaded (the Supervisor sets ``max_concurrency``): a status
request is answered while a job runs. One lock guards its SQLite connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from actors import metrics
from actors.cluster.placement import job_options
from actors.common import BadRequest, accept, open_store, setup_logging, unwrap
from actors.handles import TranscriptClient, TurnsClient
from actors.households import serving
from actors.job_actor import JobActor
from actors.job_snapshot import read_queue, replace_queue
from actors.messages import (
    Ack,
    Activity,
    AppendTurns,
    CancelReminder,
    HubJobState,
    IdleInfo,
    JobLine,
    JobRun,
    JobsReport,
    JobsStatus,
    JobStateRow,
    JobStateRows,
    ListReminders,
    PersonPresence,
    Presence,
    PresenceReport,
    PresenceRequest,
    Remind,
    Reminded,
    ReminderLine,
    ReminderList,
    RunJob,
    SaveJobState,
    SaveLLMQueue,
    Tick,
    Ticked,
    UserTurn,
)
from runtime.config import HUB_HOUSEHOLD, Settings
from runtime.llm.queue import QUEUE_DIR
from runtime.memories.transcript import TurnIn
from runtime.mind import registry as jobs
from runtime.mind import reminders
from runtime.mind.contract import JobResult
from runtime.mind.idle import IdleState, idle_state
from runtime.store import job_state
from runtime.time.clock import Clock, SystemClock, household_zone

log = logging.getLogger(__name__)

WRITER = "cron"
# A job is asked to stop at its budget after the batch it is in; past this
# multiple of the budget its actor is killed and the run recorded as failed.
HARD_LIMIT = 3.0
# How long a run's actor may take to come up (a worker process started, the job's
# modules imported) before the run is failed, when that is longer than the hard
# limit: the limit is the job's own, and a busy hub or a helper that went away
# must not spend it.
START_GRACE_S = 120.0
MAX_WAKE_S = 3600.0
# Scheduled prompts answered at once (each waits for the language model).
PROMPT_WORKERS = 2
# How long a scheduled prompt may take to be answered before it is tried again
# (the re-send waits behind the first in the Turns actor and finds its answer).
PROMPT_TIMEOUT_S = 600.0
# The background loop's pause before it tries an overdue reminder again.
RETRY_S = 30.0


@dataclass
class _Pending:
    """A run queued or running; ``done`` is set when it has been recorded."""

    name: str
    now: float | None  # the instant of the tick that queued it (None: the clock)
    done: threading.Event = field(default_factory=threading.Event)
    run: jobs.Run | None = None


class HouseholdCron:
    """The Cron actor's work for one household (``actors/households.py``)."""

    def __init__(self, settings: Settings, clock: Clock | None = None,
                 background: bool = True) -> None:
        setup_logging(settings, "cron")
        self.settings = settings
        self.namespace = settings.runtime.namespace
        self.clock: Clock = clock or SystemClock()
        self.zone = household_zone(settings.household.timezone)
        self.every = settings.jobs.check_every_s
        self.jobs = jobs.registry(settings)
        self.store = open_store(settings, self.clock)
        self._lock = threading.RLock()  # the store connection and the queue
        self._queued = threading.Condition(self._lock)
        self._fire_lock = threading.Lock()  # one reminder firing at a time
        self._queue: deque[_Pending] = deque()
        self._pending: dict[str, _Pending] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._asking: set[int] = set()  # scheduled prompts being answered
        self._retry_at = 0.0  # (monotonic) when the loop tries an overdue reminder again
        self._prompts = ThreadPoolExecutor(max_workers=PROMPT_WORKERS,
                                           thread_name_prefix="cron-prompts")
        household = settings.household.id
        self.transcript = TranscriptClient(self.namespace, household=household)
        self.turns = TurnsClient(self.namespace, PROMPT_TIMEOUT_S, household=household)
        with self._lock:
            closed = jobs.close_interrupted(self.store, self.clock.now())
        if closed:
            log.warning("%d job runs were interrupted by a restart: recorded failed", closed)
        self._threads = [threading.Thread(target=self._serve, name="cron-jobs", daemon=True)]
        # the hub's household ticks itself; the others are ticked by the actor's
        # sweep, one household at a time (actors/households.py)
        if background and household == HUB_HOUSEHOLD:
            self._threads.append(
                threading.Thread(target=self._loop, name="cron-ticks", daemon=True))
        for thread in self._threads:
            thread.start()

    # -- the idle gate's inputs ------------------------------------------------

    def _now(self, at: float | None) -> float:
        return self.clock.now() if at is None else at

    def activity(self, msg: Activity) -> Ack:
        msg = accept(Activity, msg)
        with self._lock:
            jobs.record_activity(self.store, self._now(msg.at))
        return Ack()

    def presence(self, msg: Presence) -> Ack:
        msg = accept(Presence, msg)
        at = self._now(msg.at)
        with self._lock:
            jobs.record_presence(self.store, msg.person, msg.state, at, msg.place, msg.source)
            if msg.activity:
                jobs.record_activity(self.store, at)
        return Ack(detail=f"{msg.person} {msg.state}")

    def presence_report(self, msg: PresenceRequest | None = None) -> PresenceReport:
        """Who is where, and since when (``presence`` of ``reverie status``)."""
        with self._lock:
            people = jobs.presence_report(self.store)
        return PresenceReport(people={p: PersonPresence(**v) for p, v in people.items()})

    def _gate(self, now: float) -> IdleState:
        with self._lock:
            return idle_state(jobs.load_activity(self.store), jobs.load_presence(self.store),
                              now, self.settings.jobs.idle_after_s)

    # -- ticks ---------------------------------------------------------------------

    def tick(self, msg: Tick | None = None) -> Ticked:
        """Fire due reminders; queue the jobs the idle gate lets through."""
        msg = accept(Tick, msg if msg is not None else Tick())
        now = self._now(msg.now)
        fired, asking = self._fire_reminders(now)
        with self._lock:
            gate = self._gate(now)
            idle_names = [n for n in self.jobs if n not in self._pending]
            due = jobs.due_jobs(self.store, idle_names, gate, now, self.every)
            queued = [self._enqueue(name, msg.now) for name in due]
        if due:
            log.info("idle since %s (%s): starting %s", gate.idle_since, gate.reason,
                     ", ".join(due))
        runs = [self._wait(p, None) for p in queued] if msg.wait else []
        if msg.wait:
            fired += [rid for rid, answer in asking.items() if answer.result()]
        return Ticked(reminders=fired, started=due, runs=runs, prompts=list(asking))

    def _loop(self) -> None:
        """The background check: every ``check_every_s`` (the first one after a
        full interval, never at start), and whenever a reminder falls due."""
        last_check = time.monotonic()
        while not self._stopping:
            with self._lock:
                upcoming = reminders.next_due(self.store)
            wait = last_check + self.every - time.monotonic()
            if upcoming is not None:
                until_due = upcoming - self.clock.now()
                if until_due <= 0:  # overdue: failed, or a prompt being answered
                    until_due = self._retry_at - time.monotonic()
                wait = min(wait, until_due)
            if self._wake.wait(max(0.0, min(wait, MAX_WAKE_S))):
                self._wake.clear()  # a new reminder, or stop: look again
                continue
            try:
                if time.monotonic() >= last_check + self.every:
                    last_check = time.monotonic()
                    self.tick(Tick())
                else:
                    self._fire_reminders(self.clock.now())  # prompts: answered in the pool
            except Exception:  # a tick never ends the loop
                log.exception("tick failed")

    # -- reminders -------------------------------------------------------------------

    def next_reminder(self, msg: object = None) -> float | None:
        """When the next pending reminder is due (epoch seconds), if any."""
        with self._lock:
            return reminders.next_due(self.store)

    def fire_due(self, msg: object = None) -> list[int]:
        """Fire the reminders due now; the ids said. For a household that does
        not tick itself: the actor's sweep thread calls it when one falls due
        (:meth:`actors.households.HouseholdRouter.fire_due_reminders`)."""
        return self._fire_reminders(self.clock.now())[0]

    def remind(self, msg: Remind) -> Reminded:
        msg = accept(Remind, msg)
        if msg.channel not in self.settings.channels:
            known = ", ".join(sorted(self.settings.channels))
            raise BadRequest(f"unknown channel {msg.channel!r}; configured channels: {known}")
        now = self._now(msg.now)
        try:
            repeat = None if msg.every is None else reminders.parse_repeat(msg.every)
            due_at = reminders.parse_when(msg.when, now, self.zone)
            with self._lock:
                made = reminders.add(self.store, msg.text, msg.channel, due_at,
                                     kind=msg.kind, repeat=repeat, zone=self.zone)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self._wake.set()
        return Reminded(id=made.id, due_at=made.due_at, channel=made.channel,
                        due_local=self._local(made.due_at), kind=made.kind,
                        repeat=made.repeat)

    def list_reminders(self, msg: ListReminders | None = None) -> ReminderList:
        """The reminders still to fire, soonest first."""
        accept(ListReminders, msg if msg is not None else ListReminders())
        with self._lock:
            pending = reminders.pending(self.store)
        return ReminderList(reminders=[ReminderLine(
            id=r.id, text=r.text, channel=r.channel, kind=r.kind, repeat=r.repeat,
            due_at=r.due_at, due_local=self._local(r.due_at), fired=r.occurrence,
            last_outcome=r.outcome, error=r.error) for r in pending])

    def cancel_reminder(self, msg: CancelReminder) -> Ack:
        """Cancel a pending reminder (again: Ack; none such, or fired: BadRequest).
        A prompt being answered as it is cancelled is answered, but not repeated."""
        msg = accept(CancelReminder, msg)
        try:
            with self._lock:
                changed = reminders.cancel(self.store, msg.id, self.clock.now())
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self._wake.set()
        return Ack(detail=f"reminder {msg.id} {'cancelled' if changed else 'was cancelled'}")

    def _local(self, at: float) -> str:
        return datetime.fromtimestamp(at, tz=self.zone).isoformat(timespec="minutes")

    def _fire_reminders(self, now: float) -> tuple[list[int], dict[int, Future[bool]]]:
        """Fire every reminder due at ``now`` once. A ``say`` one is appended
        (idempotent by its request id), then marked fired: its id is in the first
        list. A prompt is handed to the prompt pool: its answer (True once
        answered and marked) is in the second. A failure leaves the reminder for
        the next check."""
        said: list[int] = []
        asking: dict[int, Future[bool]] = {}
        with self._fire_lock:
            with self._lock:
                found = reminders.due(self.store, now)
                due = [r for r in found if r.id not in self._asking]
                self._asking.update(r.id for r in due if r.kind == "ask")
            for reminder in due:
                if reminder.kind == "ask":
                    asking[reminder.id] = self._prompts.submit(self._ask, reminder, now)
                elif self._say(reminder, now):
                    said.append(reminder.id)
            unfired = len(found) - len(said)  # failed, or a prompt being answered
        self._retry_at = time.monotonic() + RETRY_S if unfired else 0.0
        return said, asking

    def _say(self, reminder: reminders.Reminder, now: float) -> bool:
        turn = TurnIn(channel=reminder.channel, source=reminders.SOURCE,
                      role="assistant", content=reminders.content(reminder),
                      created_at=now, request_id=reminder.request_id)
        try:
            turn_id = self.transcript.append(AppendTurns(turns=[turn], writer=WRITER)).ids[0]
        except Exception as exc:
            self._failed(reminder, exc)
            return False
        with self._lock:
            reminders.mark_fired(self.store, reminder.id, turn_id, now, "said", self.zone,
                                 reminder.occurrence)
        return True

    def _ask(self, reminder: reminders.Reminder, now: float) -> bool:
        """Have the assistant answer a scheduled prompt (in the prompt pool), then
        mark it fired: True once done. Its answer found stored already (a crash
        before the mark), it is marked without asking again."""
        try:
            return self._answer(reminder, now)
        finally:
            with self._lock:
                self._asking.discard(reminder.id)
            self._wake.set()  # the loop looks at what is due again

    def _answer(self, reminder: reminders.Reminder, now: float) -> bool:
        try:
            with self._lock:
                reply_id = reminders.answered(self.store, reminder)
            outcome: reminders.Outcome = "answered"
            if reply_id is None:
                reply = self.turns.process(UserTurn(
                    channel=reminder.channel, source=reminders.SOURCE, text=reminder.text,
                    request_id=reminder.request_id))
                reply_id = reply.reply_id
                outcome = "unanswered" if reply.provider == "none" else "answered"
        except BadRequest as exc:  # refused for good (its channel gone): not again
            log.warning("scheduled prompt %d refused: %s", reminder.id, jobs.error_text(exc))
            reply_id, outcome = None, "refused"
        except Exception as exc:
            self._failed(reminder, exc)
            return False
        try:
            with self._lock:
                reminders.mark_fired(self.store, reminder.id, reply_id, now, outcome,
                                     self.zone, reminder.occurrence)
        except Exception:
            log.exception("scheduled prompt %d answered but not marked", reminder.id)
            return False
        log.info("scheduled prompt %d: %s", reminder.id, outcome)
        return True

    def _failed(self, reminder: reminders.Reminder, exc: BaseException) -> None:
        """A firing failed: recorded on the reminder, tried again at the next check."""
        error = jobs.error_text(exc)
        log.warning("reminder %d not fired yet: %s", reminder.id, error)
        try:
            with self._lock:
                reminders.record_error(self.store, reminder.id, error)
        except Exception:
            log.exception("reminder %d: the failure could not be recorded", reminder.id)

    # -- runs ------------------------------------------------------------------------

    def run(self, msg: RunJob) -> JobRun:
        """Fire one job now, past the idle gate. ``wait``: answer once it ended."""
        msg = accept(RunJob, msg)
        if msg.name not in self.jobs:
            later = " (it comes with a later version)" if msg.name in jobs.LATER else ""
            raise BadRequest(f"unknown job {msg.name!r}{later}; jobs: {', '.join(self.jobs)}")
        with self._lock:
            pending = self._enqueue(msg.name, msg.now)
        if msg.wait:
            return self._wait(pending, None)
        return JobRun(name=msg.name)

    def _enqueue(self, name: str, now: float | None) -> _Pending:
        """Queue a run of ``name``, or answer the run already queued or running."""
        with self._lock:
            pending = self._pending.get(name)
            if pending is None:
                pending = self._pending[name] = _Pending(name, now)
                self._queue.append(pending)
                self._queued.notify_all()
            return pending

    def _wait(self, pending: _Pending, timeout: float | None) -> JobRun:
        pending.done.wait(timeout)
        run = pending.run
        if run is None:
            return JobRun(name=pending.name)
        return JobRun(name=run.job, run_id=run.id, outcome=run.outcome,  # type: ignore[arg-type]
                      items=run.items, error=run.error, detail=run.detail or "")

    def _serve(self) -> None:
        """The one thread that runs jobs, one at a time, in queue order."""
        while True:
            with self._queued:
                while not self._queue and not self._stopping:
                    self._queued.wait()
                if self._stopping:
                    return
                pending = self._queue.popleft()
            try:
                self._run(pending)
            except Exception:  # recording failed (the store): never end the thread
                log.exception("job %s could not be recorded", pending.name)
            finally:
                with self._lock:
                    self._pending.pop(pending.name, None)
                pending.done.set()

    def _run(self, pending: _Pending) -> None:
        started = self._now(pending.now)
        with self._lock:
            run_id = jobs.start_run(self.store, pending.name, started)
        try:
            result = self._execute(pending.name, self.jobs[pending.name], run_id, pending.now)
            if not isinstance(result, JobResult):
                raise TypeError(f"job {pending.name} returned {type(result).__name__}, "
                                "not a JobResult")
        except Exception as exc:
            log.warning("job %s failed: %s", pending.name, jobs.error_text(exc))
            with self._lock:
                pending.run = jobs.end_run(self.store, run_id, self._now(pending.now), error=exc)
            metrics.job_run(pending.name, "failed")
            return
        with self._lock:
            pending.run = jobs.end_run(self.store, run_id, self._now(pending.now), result=result)
        log.info("job %s done: %d items %s", pending.name, result.items, pending.run.detail or "")
        metrics.job_run(pending.name, "ok")

    # -- a job run on a snapshot (off the hub) ------------------------------------------

    def hub_job_state(self, msg: HubJobState | None = None) -> JobStateRows:
        """The hub's newest write-log id (the snapshot must hold it) and its job state."""
        accept(HubJobState, msg if msg is not None else HubJobState())
        with self._lock:
            newest = self.store.scalar("SELECT coalesce(max(id), 0) FROM write_log")
            rows = job_state.all_rows(self.store)
        return JobStateRows(write_log_id=int(newest), rows=[
            JobStateRow(job=job, key=key, value=value) for (job, key), value in rows.items()],
            llm_queue=read_queue(self.settings.store.resolved_dir / QUEUE_DIR))

    def save_job_state(self, msg: SaveJobState) -> Ack:
        """Write one ``job_state`` row for a job run off the hub."""
        msg = accept(SaveJobState, msg)
        try:
            with self._lock:
                job_state.write(self.store, msg.job, msg.key, msg.value, msg.at)
        except ValueError as exc:  # not JSON
            raise BadRequest(f"job state {msg.job}/{msg.key}: {exc}") from None
        return Ack()

    def save_llm_queue(self, msg: SaveLLMQueue) -> Ack:
        """The language model's retry queue as a run off the hub left it. Only
        one run at a time touches it (runs go one at a time)."""
        msg = accept(SaveLLMQueue, msg)
        replace_queue(self.settings.store.resolved_dir / QUEUE_DIR, msg.files)
        return Ack(detail=f"{len(msg.files)} files")

    def _execute(self, name: str, target: str, run_id: int, now: float | None) -> JobResult:
        """Run the job in an actor of its own, then kill that actor."""
        cls: Any = ray.remote(JobActor)
        handle = cls.options(name=f"job-{name}-{run_id}", namespace=self.namespace, num_cpus=0,
                             max_restarts=0, max_task_retries=0,
                             **job_options(self.settings)).remote(self.settings)
        limit = self.settings.jobs.budget_s * HARD_LIMIT
        start = max(limit, START_GRACE_S)
        try:
            try:  # the limit counts from a live actor, not from asking for one
                ray.get(handle.ping.remote(), timeout=start)
            except GetTimeoutError:
                raise TimeoutError(f"the run's actor did not start within {start:.0f} s; "
                                   "it was killed") from None
            hub = ray.get_runtime_context().get_node_id()
            return ray.get(handle.run.remote(name, target, now, hub), timeout=limit)
        except RayTaskError as exc:  # raised by the job: recorded as itself
            raise unwrap(exc) from None
        except GetTimeoutError:
            raise TimeoutError(f"the run took more than {limit:.0f} s; its actor was "
                               "killed") from None
        finally:
            ray.kill(handle, no_restart=True)

    # -- status ----------------------------------------------------------------------

    def status(self, msg: JobsStatus | None = None) -> JobsReport:
        msg = accept(JobsStatus, msg if msg is not None else JobsStatus())
        now = self._now(msg.now)
        names = list(self.jobs)
        with self._lock:
            gate = self._gate(now)
            runs = jobs.last_runs(self.store)
            lines = jobs.status(self.store, names, gate, self.every, runs)
            last = jobs.load_activity(self.store)
            presence = jobs.load_presence(self.store)
        idle = IdleInfo(**gate.as_dict(), last_activity=last,  # type: ignore[arg-type]
                        presence={p: v.state for p, v in presence.items()}, now=now)
        return JobsReport(jobs=[JobLine(**line) for line in lines], idle=idle,
                          details=jobs.last_details(runs, names))

    def stop(self) -> None:
        """End the background threads (a run in progress ends with its actor)."""
        self._stopping = True
        self._wake.set()
        self._prompts.shutdown(wait=False, cancel_futures=True)
        with self._queued:
            self._queued.notify_all()

    def busy(self) -> bool:
        """A run queued or running, or a scheduled prompt being answered: the
        actor does not close this household now."""
        with self._lock:
            return bool(self._pending or self._asking)

    def close(self) -> None:
        """Closed by the actor (least recently used; never while busy)."""
        self.stop()
        with self._lock:
            self.store.close()

    def ping(self) -> str:
        return "ok"


# The actor: every household's idle gate, reminders and job runs; the hub's
# household ticks itself, the others are ticked in turn by the actor's sweep
# (every jobs.check_every_s, one household's runs at a time: actors/households.py).
CronActor = serving(HouseholdCron, "CronActor", sweep=True)
