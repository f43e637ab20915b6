"""The ``sync`` job: every enabled connector of ``[[sync.connectors]]``, one
after the other, each item a fact of source ``sync:<connector>``.

For each connector the job checks its source profile (a source that does not
feed facts is skipped without a connection) and that the fact kinds it writes
exist, reads the password from the environment variable ``password_env``
names, and runs it (:mod:`runtime.mind.sync.connectors`) with its state from
``job_state`` (``sync`` / ``connector:<name>``; reset when the connector's kind,
URL or user changes). Facts go through ``ctx.writer``; an item whose fact is
current already with the same value writes nothing, so a re-run with nothing
changed adds no row and no write-log entry.

A connector that fails is recorded (its error type and a message written by
this package: never content, never credentials) and the others still run.
The result's detail has one part per connector: what it wrote, removed and
left unchanged, what it skipped by reason, what it truncated, or why it
failed; the same is kept in ``job_state`` (``sync`` / ``last``). When every
connector fails, the run fails with that detail as its error.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from runtime.config import ConnectorSettings
from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.sync.connectors import (
    ConfigProblem,
    ConnectorRun,
    MissingSecret,
    describe,
    make_connector,
    quiet_libraries,
)
from runtime.mind.sync.items import MAX_VALUE, Item, Tally, Window
from runtime.store.database import Row
from runtime.store.fact_kinds import FactKinds
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import household_zone

log = logging.getLogger(__name__)

JOB = "sync"
WRITER = "sync"
CONFIDENCE = 0.9  # every claim of a connector the same: a change always supersedes


class SyncFailed(RuntimeError):
    """Every connector failed (the message is the per-connector detail)."""


def source_of(name: str) -> str:
    return f"sync:{name}"


class StoreSink:
    """Writes a connector's items as facts through the job's writer, reading
    the store first so that a fact already current is not written again."""

    def __init__(self, ctx: JobContext, source: str) -> None:
        self.ctx = ctx
        self.source = source
        self.tally = Tally()

    def _current(self, subject: str, key: str) -> Row | None:
        return self.ctx.store.row(
            "SELECT id, kind, value, source FROM facts WHERE subject = ? AND key = ?"
            " AND valid_to IS NULL ORDER BY id DESC LIMIT 1", (subject, key))

    def _write(self, kind: str, subject: str, key: str, value: str) -> str:
        _, resolution = self.ctx.writer.add_fact(
            FactIn(kind=kind, subject=subject, key=key, value=value, confidence=CONFIDENCE,
                   source=self.source, provenance=[self.source]), WRITER)
        return resolution.action

    def put(self, item: Item) -> None:
        current = self._current(item.subject, item.key)
        if current is not None and current["value"] == item.value:
            self.tally.unchanged += 1
            return
        self.tally.written[self._write(item.kind, item.subject, item.key, item.value)] += 1

    def retire(self, subject: str, key: str, where: str) -> None:
        current = self._current(subject, key)
        if current is None or current["source"] != self.source:
            return
        mark = f"(removed from {where})."
        old = str(current["value"])
        if old.endswith(mark):
            return
        value = old.rstrip(" .")[:MAX_VALUE - len(mark) - 1] + " " + mark
        self._write(current["kind"], subject, key, value)
        self.tally.removed += 1


@dataclass
class Report:
    """What one connector did in this run."""

    name: str
    kind: str
    outcome: str  # "ok", "failed", "muted"
    tally: Tally = field(default_factory=Tally)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    more: bool = False

    def line(self) -> str:
        head = f"{self.name} ({self.kind})"
        if self.outcome == "muted":
            return f"{head}: muted by its source profile"
        body = self.tally.summary()
        if self.notes:
            body += ", " + ", ".join(self.notes)
        if self.outcome == "failed":
            return f"{head}: failed, {self.error}" + (f" (after {body})" if self.tally.items
                                                      else "")
        return f"{head}: {body}" + (", more to do" if self.more else "")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "outcome": self.outcome, "error": self.error,
                "notes": self.notes, **self.tally.as_dict()}


def _fingerprint(conf: ConnectorSettings) -> str:
    text = "\x1f".join((conf.kind, conf.url, conf.username or ""))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sync_connector(ctx: JobContext, conf: ConnectorSettings, window: Window,
                   profiles: MemoryProfiles, kinds: FactKinds) -> Report:
    """Run one connector; whatever it raises is recorded in its report."""
    source = source_of(conf.name)
    if not profiles.for_source(source).facts:
        log.info("sync %s: muted by its source profile", conf.name)
        return Report(conf.name, conf.kind, "muted")
    sink = StoreSink(ctx, source)
    report = Report(conf.name, conf.kind, "ok", sink.tally)
    key = f"connector:{conf.name}"
    state = get_state(ctx.store, JOB, key, {})
    if not isinstance(state, dict) or state.get("fingerprint") != _fingerprint(conf):
        state = {"fingerprint": _fingerprint(conf)}
    password: str | None = None
    try:
        connector = make_connector(conf.kind)
        missing = [k for k in connector.kinds if k not in kinds]
        if missing:
            raise ConfigProblem(f"fact kind {missing[0]} is not in the fact kinds file")
        if conf.password_env:
            password = os.environ.get(conf.password_env) or None
            if password is None:
                raise MissingSecret(f"the environment variable {conf.password_env} "
                                    "(password_env) is not set")
        run = ConnectorRun(settings=conf, password=password, state=state, window=window,
                           sink=sink, save=lambda: set_state(ctx.store, JOB, key, state),
                           out_of_time=ctx.out_of_time)
        report.notes = run.notes
        connector.sync(run)
        run.save()
        report.more = run.more
    except Exception as exc:
        report.outcome = "failed"
        report.error = describe(exc, [password])
        log.warning("sync %s failed: %s", conf.name, report.error)
        return report
    log.info("sync %s: %s", conf.name, sink.tally.summary())
    return report


def run(ctx: JobContext) -> JobResult:
    settings = ctx.settings.sync
    connectors = [c for c in settings.connectors if c.enabled]
    if not connectors:
        return JobResult(items=0, detail="no connectors configured")
    quiet_libraries()
    profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
    kinds = FactKinds.load(ctx.settings.memory.fact_kinds_file)
    window = Window.around(ctx.clock.now(), household_zone(ctx.settings.household.timezone),
                           settings.calendar_days_back, settings.calendar_days_ahead)
    reports: list[Report] = []
    more = False
    for conf in connectors:
        if reports and ctx.out_of_time():
            more = True
            break
        report = sync_connector(ctx, conf, window, profiles, kinds)
        reports.append(report)
        more = more or report.more
    detail = "; ".join(r.line() for r in reports)
    set_state(ctx.store, JOB, "last", {r.name: r.as_dict() for r in reports})
    if all(r.outcome == "failed" for r in reports):
        raise SyncFailed(detail)
    return JobResult(items=sum(r.tally.items for r in reports), detail=detail, more=more)
