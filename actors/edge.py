"""The edge's actors: the MQTT bridge and the GPS reader (thin; the work is in ``device/``).

``EdgeActor`` runs :class:`device.mqtt_bridge.Bridge` when ``mqtt.host`` is
set. Fixes go to the Transcript actor (the only writer of the location
history, which back-fills user turns); presence goes to the Cron actor (the
idle gate's owner). Both calls are repeatable, so a restarted actor may send
a batch twice without harm. The Home Assistant state document is assembled
from the other actors' answers.

``GpsActor`` runs :class:`device.gps.GpsReader` when ``gps.enabled``: each new
fix goes to the Transcript actor and, when the bridge runs, out on
``<prefix>/gps/<person>``.

Messages (``actors/messages.py``): ``EdgeRequest``, ``PublishFix``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import ray

from actors.common import EDGE, accept, setup_logging
from actors.handles import CronClient, EdgeClient, NoActor, TranscriptClient
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
from runtime.jobs import registry
from runtime.llm_queue import read_notice

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
    def __init__(self, settings: Settings) -> None:
        from device.mqtt_bridge import Bridge
        from device.topics import TopicMap

        setup_logging(settings, EDGE)
        self.settings = settings
        topics = TopicMap.from_settings(settings.mqtt)
        self.bridge = Bridge(settings.mqtt, topics, _ActorSink(settings),
                             jobs=list(registry(settings)), version=_version())
        self.bridge.start()

    def stats(self, msg: EdgeRequest | None = None) -> EdgeInfo:
        return EdgeInfo(**self.bridge.stats())

    def publish_fix(self, msg: PublishFix) -> Ack:
        fix = accept(PublishFix, msg).fix
        topic = f"{self.settings.mqtt.topic_prefix}/gps/{fix.person}"
        self.bridge.publish(topic, fix.model_dump(exclude_none=True))
        return Ack()

    def stop(self) -> None:
        self.bridge.stop()

    def ping(self) -> str:
        return "ok" if self.bridge.connected else "ok (broker not connected)"


class GpsActor:
    def __init__(self, settings: Settings) -> None:
        from device.gps import GpsReader

        setup_logging(settings, "gps")
        self.settings = settings
        self.transcript = TranscriptClient(settings.runtime.namespace, CALL_TIMEOUT_S)
        self.reader = GpsReader(settings.gps)
        self.fixes = 0
        self._edge: EdgeClient | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.reader.run, args=(self._stop, self._emit),
                                        name="gps-reader", daemon=True)
        self._thread.start()

    def _emit(self, record: LocationRecord) -> None:
        fix = as_fix(record)
        self.transcript.record_fixes(RecordFixes(fixes=[fix]))
        self.fixes += 1
        if self.settings.mqtt.enabled:
            try:
                if self._edge is None:
                    self._edge = EdgeClient(self.settings.runtime.namespace)
                self._edge.publish_fix_async(PublishFix(fix=fix))
            except (NoActor, ray.exceptions.RayError) as exc:
                self._edge = None
                log.debug("fix not published: %s", type(exc).__name__)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.reader.close()

    def ping(self) -> str:
        return "ok" if self.reader.connected else "ok (gpsd not connected)"
