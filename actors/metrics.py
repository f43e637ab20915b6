"""Reverie's own metrics on the Ray dashboard (``ray.util.metrics``).

Every actor records through the functions here; Ray's metrics agent exports
them next to Ray's own (Prometheus names get Ray's ``ray_`` prefix, e.g.
``ray_reverie_turns_total``), so the dashboard's Metrics view and any
Prometheus scraping the node show them:

| metric                          | kind      | tags                    |
|---------------------------------|-----------|-------------------------|
| ``reverie_turns``               | counter   | channel, streamed       |
| ``reverie_recall_latency_ms``   | histogram | —                       |
| ``reverie_job_runs``            | counter   | job, outcome (ok/failed)|
| ``reverie_queue_depth``         | gauge     | queue                   |
| ``reverie_mqtt_messages``       | counter   | result, reason          |
| ``reverie_http_requests``       | counter   | method, route, status   |

Tags hold configured names only (channels, jobs, routes, refusal reasons),
never memory content, so their number stays small. Recording never fails a
caller: without Ray (a unit test, a tool) or with the metrics agent gone, it
is a no-op.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

LATENCY_BOUNDARIES_MS: list[float] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]

_lock = threading.Lock()
_metrics: dict[str, Any] = {}
_broken = False


def _metric(name: str) -> Any:
    """The metric ``name``, made on first use (needs a connected Ray worker)."""
    global _broken
    with _lock:
        if _broken:
            return None
        found = _metrics.get(name)
        if found is not None:
            return found
        try:
            import ray
            from ray.util import metrics

            if not ray.is_initialized():
                return None
            made: Any
            if name == "reverie_turns":
                made = metrics.Counter(name, "User turns answered.",
                                       tag_keys=("channel", "streamed"))
            elif name == "reverie_recall_latency_ms":
                made = metrics.Histogram(name, "Recall latency (ms), in the Recall actor.",
                                         boundaries=LATENCY_BOUNDARIES_MS)
            elif name == "reverie_job_runs":
                made = metrics.Counter(name, "Background job runs by outcome.",
                                       tag_keys=("job", "outcome"))
            elif name == "reverie_queue_depth":
                made = metrics.Gauge(name, "Items waiting in a queue.", tag_keys=("queue",))
            elif name == "reverie_mqtt_messages":
                made = metrics.Counter(name, "MQTT messages accepted or refused.",
                                       tag_keys=("result", "reason"))
            elif name == "reverie_http_requests":
                made = metrics.Counter(name, "HTTP requests by route and status.",
                                       tag_keys=("method", "route", "status"))
            else:
                raise KeyError(name)
        except KeyError:
            raise
        except Exception as exc:  # no metrics in this process: stop trying
            log.warning("metrics are off in this process: %s", type(exc).__name__)
            _broken = True
            return None
        _metrics[name] = made
        return made


def _record(name: str, method: str, value: float, tags: dict[str, str] | None) -> None:
    metric = _metric(name)
    if metric is None:
        return
    try:
        getattr(metric, method)(value, tags=tags)
    except Exception as exc:
        log.debug("metric %s not recorded: %s", name, type(exc).__name__)


def turn(channel: str, streamed: bool) -> None:
    _record("reverie_turns", "inc", 1, {"channel": channel, "streamed": str(streamed).lower()})


def recall_latency(ms: float) -> None:
    _record("reverie_recall_latency_ms", "observe", ms, None)


def job_run(job: str, outcome: str) -> None:
    _record("reverie_job_runs", "inc", 1, {"job": job, "outcome": outcome})


def queue_depth(queue: str, depth: int) -> None:
    _record("reverie_queue_depth", "set", depth, {"queue": queue})


def mqtt_message(accepted: bool, reason: str = "") -> None:
    _record("reverie_mqtt_messages", "inc", 1,
            {"result": "accepted" if accepted else "rejected", "reason": reason})


def http_request(method: str, route: str, status: int) -> None:
    _record("reverie_http_requests", "inc", 1,
            {"method": method, "route": route, "status": str(status)})
