"""The edge's actor: the MQTT bridge and the GPS reader (thin; the work is in ``device/``).

``EdgeActor`` runs :class:`device.mqtt_bridge.Bridge` when ``mqtt.host`` is
set. Fixes go to the Transcript actor (the only writer of the location
history, which back-fills user turns); presence goes to the Cron actor (the
idle gate's owner). Both calls are repeatable, so a restarted actor may send
a batch twice without harm. The Home Assistant state document is assembled
from the other actors' answers.

The same actor runs :class:`device.gps.GpsReader` when ``gps.enabled`` (a
thread, not an actor of its own: a Ray worker costs ≈ 62 MiB PSS here, and
the reader is a poll every few seconds): each new fix goes to the Transcript
actor and, when the bridge runs, out on ``<prefix>/gps/<person>``.

Messages (``actors/messages.py``): ``EdgeRequest``, ``PublishFix``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from actors import metrics
from actors.common import EDGE, BadRequest, accept, setup_logging
from actors.handles import CronClient, TranscriptClient
from actors.messages import (
    Ack,
    EdgeInfo,
    EdgeRequest,
    Fix,
    JobsStatus,
    Presence,
    PublishFix,
    RecordFixes,
)
from device.records import LocationRecord, PresenceRecord
from runtime.config import Settings
from runtime.llm.queue import read_notice
from runtime.mind.registry import registry

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0


def _version() -> str:
    try:
        return version("reverie")
    except PackageNotFoundError:
        return "dev"


def as_fix(record: LocationRecord) -> Fix:
    return Fix(**asdict(record))


class _ActorSink:
    """The bridge's sink: the Transcript and Cron actors."""

    def __init__(self, settings: Settings) -> None:
        ns = settings.runtime.namespace
        self.settings = settings
        self.transcript = TranscriptClient(ns, CALL_TIMEOUT_S)
        self.cron = CronClient(ns, CALL_TIMEOUT_S)

    def store(self, fixes: Sequence[LocationRecord], presence: Sequence[PresenceRecord]) -> None:
        for start in range(0, len(fixes), 1000):
            self.transcript.record_fixes(
                RecordFixes(fixes=[as_fix(f) for f in fixes[start:start + 1000]]))
        latest: dict[str, PresenceRecord] = {}
        active: set[str] = set()
        for rec in presence:  # one call per person and batch: the newest report
            if rec.activity:
                active.add(rec.person)
            if rec.person not in latest or rec.at >= latest[rec.person].at:
                latest[rec.person] = rec
        for person, rec in latest.items():
            self.cron.presence(Presence(person=person, state=rec.state, at=rec.at,
                                        place=rec.place, source=rec.source,
                                        activity=person in active))

    def snapshot(self) -> Mapping[str, Any]:
        report = self.cron.status(JobsStatus())
        people = self.cron.presence_report().people
        counts = self.transcript.counts()
        return {
            "idle": report.idle.idle, "idle_reason": report.idle.reason,
            "idle_since": report.idle.idle_since,
            "presence": {p: {"state": v.state, "place": v.place, "since": v.since}
                         for p, v in people.items()},
            "counts": {"turns": counts.get("transcript", 0), "episodes": counts.get("episodes", 0),
                       "facts": counts.get("facts", 0)},
            "jobs": {j.name: {"last_outcome": j.last_outcome, "last_run_at": j.last_run_at}
                     for j in report.jobs},
            "llm_notice": read_notice(self.settings.store.resolved_dir),
            "location_fixes": self.transcript.location().fixes,
        }


class EdgeActor:
    """The bridge (with ``mqtt.host``) and the GPS reader (with ``gps.enabled``), in one
    process: each is a thread; a Ray actor of its own would cost ≈ 62 MiB."""

    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, EDGE)
        self.settings = settings
        self.bridge: Any = None
        self.reader: Any = None
        self.transcript = TranscriptClient(settings.runtime.namespace, CALL_TIMEOUT_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if settings.mqtt.enabled:
            from device.mqtt_bridge import Bridge
            from device.topics import TopicMap

            self.bridge = Bridge(settings.mqtt, TopicMap.from_settings(settings.mqtt),
                                 _ActorSink(settings), jobs=list(registry(settings)),
                                 version=_version(), observe=metrics.mqtt_message)
            self.bridge.start()
        if settings.gps.enabled:
            from device.gps import GpsReader

            self.reader = GpsReader(settings.gps)
            self._thread = threading.Thread(target=self.reader.run,
                                            args=(self._stop, self._gps_fix),
                                            name="gps-reader", daemon=True)
            self._thread.start()

    def _gps_fix(self, record: LocationRecord) -> None:
        """A new fix from gpsd: into the location history, and out on MQTT."""
        fix = as_fix(record)
        self.transcript.record_fixes(RecordFixes(fixes=[fix]))
        if self.bridge is not None:
            self._publish(fix)

    def _publish(self, fix: Fix) -> None:
        topic = f"{self.settings.mqtt.topic_prefix}/gps/{fix.person}"
        self.bridge.publish(topic, fix.model_dump(exclude_none=True))

    def stats(self, msg: EdgeRequest | None = None) -> EdgeInfo:
        if self.bridge is None:
            return EdgeInfo(configured=False, connected=False,
                            error="no broker configured (mqtt.host)")
        return EdgeInfo(**self.bridge.stats())

    def publish_fix(self, msg: PublishFix) -> Ack:
        if self.bridge is None:
            raise BadRequest("no broker configured (mqtt.host)")
        self._publish(accept(PublishFix, msg).fix)
        return Ack()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.reader is not None:
            self.reader.close()
        if self.bridge is not None:
            self.bridge.stop()

    def ping(self) -> str:
        problems = []
        if self.bridge is not None and not self.bridge.connected:
            problems.append("broker not connected")
        if self.reader is not None and not self.reader.connected:
            problems.append("gpsd not connected")
        return f"ok ({', '.join(problems)})" if problems else "ok"
