"""The Supervisor: starts the actors in order, wires them by name, reports health.

Every actor is a named actor in the household's namespace (so the Ray
dashboard shows who is who), created with ``max_restarts`` so Ray restarts it
after a crash; a restarted actor re-runs its constructor and rebuilds its
state from SQLite.

The Supervisor is a plain object in the process that starts the runtime (the
``reverie run`` driver), not an actor: it answers no calls (``reverie status``
asks the actors themselves, :func:`gather_status`), and a Ray worker of its
own cost ≈ 62 MiB PSS of the hub's 1.2 GiB for nothing the driver could not
do. The driver owns the actors: when it stops (or dies), they stop.

On a household's cluster (``reverie run --cluster``) every actor here, the
turn path, is pinned to the driver's node, the hub (``actors.cluster.placement``);
only job actors (started by Cron) go to helpers.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, TypeVar

import ray

from actors.cluster.placement import pin_here
from actors.common import (
    ACTORS,
    CRON,
    EDGE,
    EPISODES,
    GRAPH,
    HTTP,
    RECALL,
    TRANSCRIPT,
    TURNS,
    actors_for,
    open_store,
)
from actors.cron import CronActor
from actors.edge import EdgeActor
from actors.handles import (
    ActorClient,
    CronClient,
    EdgeClient,
    EpisodesClient,
    GraphClient,
    HttpClient,
    RecallClient,
    TranscriptClient,
    TurnsClient,
)
from actors.household_routing import actor_name, nodes, publish_all
from actors.http.server import HttpActor
from actors.memory_writers import EpisodesActor, GraphActor
from actors.messages import Status
from actors.recall import RecallActor
from actors.status import (
    REPLICA_REPORT_S,
    clear_replica_status,
    gather_status,
    write_replica_status,
)
from actors.transcript import TranscriptActor
from actors.turns import TurnsActor
from device.replicator import Replicator
from runtime.config import Settings
from runtime.store.household_routes import load_routes
from runtime.store.households import Households

log = logging.getLogger(__name__)
T = TypeVar("T")

CLASSES: dict[str, type] = {
    TRANSCRIPT: TranscriptActor, RECALL: RecallActor,
    EPISODES: EpisodesActor, GRAPH: GraphActor, TURNS: TurnsActor, CRON: CronActor,
    EDGE: EdgeActor, HTTP: HttpActor,
}
CLIENTS: dict[str, type[ActorClient]] = {
    TRANSCRIPT: TranscriptClient, RECALL: RecallClient,
    EPISODES: EpisodesClient, GRAPH: GraphClient, TURNS: TurnsClient, CRON: CronClient,
    EDGE: EdgeClient, HTTP: HttpClient,
}
# Calls a restarted actor may safely see again: appends carry request ids,
# recall and embedding are reads.
RETRIES: dict[str, int] = {TRANSCRIPT: 3, RECALL: 3, EPISODES: 0, GRAPH: 0,
                           TURNS: 0, CRON: 0, EDGE: 3, HTTP: 0}
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
    def __init__(self, settings: Settings, cluster: bool = False) -> None:
        self.settings = settings
        # On a cluster every actor here (the turn path) is pinned to this node, the hub.
        self.placement: dict[str, Any] = pin_here() if cluster else {}
        self.namespace = settings.runtime.namespace
        self.handles: dict[str, Any] = {}
        self.clients: dict[str, ActorClient] = {}
        self.names = actors_for(settings)
        # The store is created and migrated here, once, before the actors open it
        # side by side: each would otherwise take the write lock for every
        # pending migration step in turn, and on a busy machine one of them could
        # wait past the busy timeout and fail its creation ("database is
        # locked"), and with it the start. The actors then find nothing to do.
        open_store(settings).close()
        # Every actor is created at once, in dependency order (the names are
        # registered as they are created, so an actor may look up one created
        # after it), and their processes start side by side: waiting for each
        # before creating the next cost a worker start-up apiece (cold start).
        for name in self.names:
            self.handles[name] = self._start(name)
            self.clients[name] = CLIENTS[name](self.namespace, handle=self.handles[name])
        ray.get([self.handles[name].ping.remote() for name in self.names], timeout=300)
        self.transcript = TranscriptClient(self.namespace, handle=self.handles[TRANSCRIPT])
        self.recall = RecallClient(self.namespace, handle=self.handles[RECALL])
        self.cron = CronClient(self.namespace, handle=self.handles[CRON])
        self.edge = EdgeClient(self.namespace, handle=self.handles.get(EDGE))
        self.http = HttpClient(self.namespace, handle=self.handles.get(HTTP))
        log.info("actors started: %s", ", ".join(self.names))
        # Litestream, once the store exists (the transcript actor created it): a
        # child of this process, supervised by a thread (device/replicator.py);
        # its status goes to a file `reverie status` reads (replica_status.py).
        # households served by other nodes (``reverie household move``): the
        # routes into Ray's key-value store, and those nodes' owners started
        self.node_owners: dict[str, dict[str, Any]] = {}
        if settings.households.enabled:
            self._start_routes()
        self.replicator = Replicator(settings)
        self._reporting = threading.Event()
        self._reporter: threading.Thread | None = None
        if self.replicator.enabled:
            self.replicator.start()
            self._reporter = threading.Thread(target=self._report_replica,
                                              name="replica-status", daemon=True)
            self._reporter.start()

    def _start_routes(self) -> None:
        routes = load_routes(Households(self.settings).root)
        publish_all(self.namespace, routes)
        live = nodes()
        for node in sorted(set(routes.values())):
            if node not in live:
                log.error("node %s serves %d household(s) and is not in the cluster: they "
                          "are not served until it joins", node,
                          sum(1 for n in routes.values() if n == node))
                continue
            self.node_owners[node] = start_node_owners(self.settings, node, live[node])

    def _report_replica(self) -> None:
        while not self._reporting.wait(REPLICA_REPORT_S):
            try:
                write_replica_status(self.settings, self.replicator.status())
            except OSError as exc:
                log.warning("replica status not written: %s", type(exc).__name__)

    def _start(self, name: str) -> Any:
        rt = self.settings.runtime
        cls: Any = ray.remote(CLASSES[name])
        return cls.options(
            name=name, namespace=self.namespace, num_cpus=0,
            max_restarts=rt.max_restarts, max_task_retries=RETRIES[name],
            max_pending_calls=rt.max_pending_calls, get_if_exists=True,
            max_concurrency=MAX_CONCURRENCY.get(name, 1), **self.placement,
        ).remote(self.settings)

    def status(self) -> Status:
        return gather_status(self.settings)

    def stop(self) -> None:
        """Stop the HTTP server (no new requests), save what is cached (the vector
        indexes), stop every actor, then Litestream (it uploads what is left when
        it stops)."""
        if HTTP in self.handles:
            try:
                self.http.stop(timeout=30)
            except Exception as exc:
                log.warning("the HTTP server did not stop cleanly: %s", type(exc).__name__)
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
        households = self.settings.households.enabled
        for transcript in _transcripts(self.namespace) if households else []:
            try:  # the households' litestream
                ray.get(transcript.stop_replication.remote(), timeout=30)
            except Exception as exc:
                log.warning("households' replication did not stop cleanly: %s",
                            type(exc).__name__)
        for name in reversed(self.names):
            if name in self.handles:
                ray.kill(self.handles[name], no_restart=True)
        for handle in _node_owner_handles(self.namespace) if households else []:
            ray.kill(handle, no_restart=True)
        self.handles.clear()
        self.clients.clear()
        self._reporting.set()
        if self._reporter is not None:
            self._reporter.join(timeout=10)
        self.replicator.stop()
        clear_replica_status(self.settings)

    def ping(self) -> str:
        return "ok"

    def http_address(self) -> str | None:
        """The HTTP server's base URL, when it runs."""
        if HTTP not in self.handles:
            return None
        return self.http.address(timeout=PING_TIMEOUT_S) or None


def start_node_owners(settings: Settings, node: str, node_id: str) -> dict[str, Any]:
    """The owners of ``node`` (``transcript@NODE``, ...), pinned to it; those
    running already are kept. Detached: whoever starts them (the runtime at
    start, ``reverie household move``), the runtime's stop ends them."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    rt = settings.runtime
    handles: dict[str, Any] = {}
    for name in ACTORS:
        cls: Any = ray.remote(CLASSES[name])
        handles[name] = cls.options(
            name=actor_name(name, node), namespace=settings.runtime.namespace, num_cpus=0,
            max_restarts=rt.max_restarts, max_task_retries=RETRIES[name],
            max_pending_calls=rt.max_pending_calls, get_if_exists=True, lifetime="detached",
            max_concurrency=MAX_CONCURRENCY.get(name, 1),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(settings, node=node)
    ray.get([h.ping.remote() for h in handles.values()], timeout=300)
    return handles


def _node_owner_handles(namespace: str) -> list[Any]:
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == namespace and "@" in entry["name"] \
                and entry["name"].split("@", 1)[0] in ACTORS:
            try:
                found.append(ray.get_actor(entry["name"], namespace=namespace))
            except ValueError:
                continue
    return found


def _transcripts(namespace: str) -> list[Any]:
    """Every Transcript owner (the hub's and the nodes'): each may run its
    node's households' Litestream."""
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if entry["namespace"] == namespace and (name == TRANSCRIPT
                                                or name.startswith(TRANSCRIPT + "@")):
            try:
                found.append(ray.get_actor(name, namespace=namespace))
            except ValueError:
                continue
    return found


def start(settings: Settings, cluster: bool = False) -> Supervisor:
    """Start every actor (from this process, which then owns them); return the Supervisor.
    ``cluster``: pin them to this node (``actors.cluster.placement``)."""
    return Supervisor(settings, cluster)
