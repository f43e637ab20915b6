"""The Supervisor: starts the actors in order, wires them by name, reports health.

Every actor is a named actor in the household's namespace (so the Ray
dashboard shows who is who), created with ``max_restarts`` so Ray restarts it
after a crash; a restarted actor re-runs its constructor and rebuilds its
state from SQLite. The Supervisor owns the actors: stopping it (or the driver
that created it) stops them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import ray

from actors.common import (
    CRON,
    EDGE,
    EMBEDDER,
    EPISODES,
    GRAPH,
    RECALL,
    SUPERVISOR,
    TRANSCRIPT,
    TURNS,
    actors_for,
    setup_logging,
)
from actors.cron import CronActor
from actors.edge import EdgeActor
from actors.embedder import EmbedderActor
from actors.handles import (
    ActorClient,
    CronClient,
    EdgeClient,
    EmbedderClient,
    EpisodesClient,
    GraphClient,
    RecallClient,
    TranscriptClient,
    TurnsClient,
)
from actors.memory_writers import EpisodesActor, GraphActor
from actors.messages import EdgeInfo, Status, StatusRequest
from actors.recall import RecallActor
from actors.transcript import TranscriptActor
from actors.turns import TurnsActor
from runtime.config import Settings
from runtime.llm_queue import read_notice

log = logging.getLogger(__name__)
T = TypeVar("T")

CLASSES: dict[str, type] = {
    EMBEDDER: EmbedderActor, TRANSCRIPT: TranscriptActor, RECALL: RecallActor,
    EPISODES: EpisodesActor, GRAPH: GraphActor, TURNS: TurnsActor, CRON: CronActor,
    EDGE: EdgeActor,
}
CLIENTS: dict[str, type[ActorClient]] = {
    EMBEDDER: EmbedderClient, TRANSCRIPT: TranscriptClient, RECALL: RecallClient,
    EPISODES: EpisodesClient, GRAPH: GraphClient, TURNS: TurnsClient, CRON: CronClient,
    EDGE: EdgeClient,
}
# Calls a restarted actor may safely see again: appends carry request ids,
# recall and embedding are reads.
RETRIES: dict[str, int] = {EMBEDDER: 3, TRANSCRIPT: 3, RECALL: 3, EPISODES: 0, GRAPH: 0,
                           TURNS: 0, CRON: 0, EDGE: 3}
# Turns in progress at once, across channels (the Turns actor is threaded; one
# channel's turns still run one at a time). Every other actor runs one call at
# a time: each is the single writer of its tables.
TURNS_MAX_CONCURRENCY = 16
# Cron answers status and presence while a job runs (one thread runs the jobs;
# a `jobs run --wait` holds one until its run ends).
CRON_MAX_CONCURRENCY = 8
MAX_CONCURRENCY: dict[str, int] = {TURNS: TURNS_MAX_CONCURRENCY, CRON: CRON_MAX_CONCURRENCY}
PING_TIMEOUT_S = 10.0


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, SUPERVISOR)
        self.settings = settings
        self.namespace = settings.runtime.namespace
        self.handles: dict[str, Any] = {}
        self.clients: dict[str, ActorClient] = {}
        self.names = actors_for(settings)
        for name in self.names:  # in dependency order: embedder first, then cron, the edge
            self.handles[name] = self._start(name)
            self.clients[name] = CLIENTS[name](self.namespace, handle=self.handles[name])
            self.clients[name].ping(timeout=300)
        self.transcript = TranscriptClient(self.namespace, handle=self.handles[TRANSCRIPT])
        self.recall = RecallClient(self.namespace, handle=self.handles[RECALL])
        self.cron = CronClient(self.namespace, handle=self.handles[CRON])
        self.edge = EdgeClient(self.namespace, handle=self.handles.get(EDGE))
        log.info("actors started: %s", ", ".join(self.names))

    def _start(self, name: str) -> Any:
        rt = self.settings.runtime
        cls: Any = ray.remote(CLASSES[name])
        return cls.options(
            name=name, namespace=self.namespace, num_cpus=0,
            max_restarts=rt.max_restarts, max_task_retries=RETRIES[name],
            max_pending_calls=rt.max_pending_calls, get_if_exists=True,
            max_concurrency=MAX_CONCURRENCY.get(name, 1),
        ).remote(self.settings)

    def status(self, msg: StatusRequest | None = None) -> Status:
        states: dict[str, str] = {}
        pings = {name: h.ping.remote() for name, h in self.handles.items()}  # all at once
        for name, ref in pings.items():
            try:
                states[name] = ray.get(ref, timeout=PING_TIMEOUT_S)
            except Exception as exc:
                states[name] = f"down: {type(exc).__name__}"
        counts: dict[str, int] = {}
        try:
            counts = self.transcript.counts(timeout=PING_TIMEOUT_S)
        except Exception as exc:
            log.warning("counts unavailable: %s", type(exc).__name__)
        return Status(namespace=self.namespace, actors=states, counts=counts,
                      notice=read_notice(self.settings.store.resolved_dir),
                      mqtt=self._mqtt(), location=self._ask(
                          lambda: self.transcript.location(timeout=PING_TIMEOUT_S)),
                      presence=self._ask(
                          lambda: self.cron.presence_report(timeout=PING_TIMEOUT_S).people))

    def _mqtt(self) -> EdgeInfo:
        if EDGE not in self.handles or not self.settings.mqtt.enabled:
            return EdgeInfo(configured=False, connected=False,
                            error="no broker configured (mqtt.host)")
        info = self._ask(lambda: self.edge.stats(timeout=PING_TIMEOUT_S))
        return info or EdgeInfo(configured=True, connected=False, error="bridge not answering")

    @staticmethod
    def _ask(call: Callable[[], T]) -> T | None:
        try:
            return call()
        except Exception as exc:
            log.warning("status part unavailable: %s", type(exc).__name__)
            return None

    def stop(self) -> None:
        """Save what is cached (the vector indexes), then stop every actor."""
        try:
            self.recall.save(timeout=60)
        except Exception as exc:
            log.warning("index save at stop failed (rebuilt from SQLite on start): %s",
                        type(exc).__name__)
        if EDGE in self.handles:  # the bridge stores what it holds and says offline
            try:
                ray.get(self.handles[EDGE].stop.remote(), timeout=30)
            except Exception as exc:
                log.warning("the edge did not stop cleanly: %s", type(exc).__name__)
        for name in reversed(self.names):
            if name in self.handles:
                ray.kill(self.handles[name], no_restart=True)
        self.handles.clear()
        self.clients.clear()

    def ping(self) -> str:
        return "ok"


def start(settings: Settings) -> Any:
    """Start the Supervisor (which starts everything else); return its handle."""
    cls: Any = ray.remote(Supervisor)
    handle = cls.options(
        name=SUPERVISOR, namespace=settings.runtime.namespace, num_cpus=0,
        max_restarts=0, get_if_exists=True,
    ).remote(settings)
    ray.get(handle.ping.remote(), timeout=600)
    return handle
