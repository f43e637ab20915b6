"""``reverie status``: asked of the running actors themselves, by name.

Light on imports (no actor classes): the client commands use it after joining
the runtime's Ray; the Supervisor in ``reverie run`` uses it too.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import ray

from actors.common import EDGE, actors_for
from actors.handles import CronClient, EdgeClient, TranscriptClient
from actors.messages import EdgeInfo, Status
from runtime.config import Settings
from runtime.llm.queue import read_notice
from runtime.store.files import write_private

log = logging.getLogger(__name__)
T = TypeVar("T")
PING_TIMEOUT_S = 10.0
# The replicator (a thread of the ``reverie run`` process, not an actor) writes
# its status here this often; older than REPLICA_STALE_S means it stopped reporting.
REPLICA_REPORT_S = 2.0
REPLICA_STALE_S = 30.0
REPLICA_STATUS = "replica-status.json"


def _replica_file(settings: Settings) -> Path:
    return settings.store.resolved_dir / REPLICA_STATUS


def write_replica_status(settings: Settings, status: dict[str, Any]) -> None:
    write_private(_replica_file(settings), json.dumps({**status, "reported_at": time.time()}))


def clear_replica_status(settings: Settings) -> None:
    _replica_file(settings).unlink(missing_ok=True)


def read_replica_status(settings: Settings) -> dict[str, Any]:
    """``replica`` of ``reverie status --json``."""
    if not settings.replica.enabled:
        return {"enabled": False}
    try:
        status: dict[str, Any] = json.loads(_replica_file(settings).read_text())
    except (OSError, ValueError):
        return {"enabled": True, "running": False, "error": "the replicator has not reported"}
    age = time.time() - float(status.get("reported_at", 0))
    if age > REPLICA_STALE_S:
        status["running"] = False
        status["error"] = f"the replicator has not reported for {age:.0f} s"
    return status


def _ask(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except Exception as exc:
        log.warning("status part unavailable: %s", type(exc).__name__)
        return None


def gather_status(settings: Settings, timeout_s: float = PING_TIMEOUT_S) -> Status:
    """``reverie status``: every actor's ping, the counts, the notice, the edge.

    Asked of the actors themselves (by name, from any process joined to the
    runtime's Ray), all pings at once. The pings share one deadline,
    ``timeout_s``: an actor that has not answered by then is "down" (so a
    hung actor costs ``timeout_s`` once, not per actor); each question after
    them has ``timeout_s`` too."""
    ns = settings.runtime.namespace
    names = actors_for(settings)
    states: dict[str, str] = {}
    pings: dict[str, Any] = {}
    for name in names:
        try:
            pings[name] = ray.get_actor(name, namespace=ns).ping.remote()
        except ValueError:
            states[name] = "down: not running"
    deadline = time.monotonic() + timeout_s
    for name, ref in pings.items():
        try:
            states[name] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            states[name] = f"down: {type(exc).__name__}"
    states = {name: states[name] for name in names}
    household = settings.household.id
    transcript = TranscriptClient(ns, timeout_s, household=household)
    cron = CronClient(ns, timeout_s, household=household)
    if EDGE in names and settings.mqtt.enabled:
        mqtt = _ask(lambda: EdgeClient(ns, timeout_s).stats()) or EdgeInfo(
            configured=True, connected=False, error="bridge not answering")
    else:
        mqtt = EdgeInfo(configured=False, connected=False,
                        error="no broker configured (mqtt.host)")
    return Status(namespace=ns, actors=states,
                  counts=_ask(lambda: transcript.counts(timeout=timeout_s)) or {},
                  notice=read_notice(settings.store.resolved_dir), mqtt=mqtt,
                  location=_ask(lambda: transcript.location(timeout=timeout_s)),
                  presence=_ask(lambda: cron.presence_report(timeout=timeout_s).people),
                  replica=read_replica_status(settings))
