"""``reverie household move ID --to NODE``: a household to another node, through its replica.

Run by a driver connected to the runtime (the command line, on the hub).
No shared filesystem is assumed: what is done on a node is done there, by
that node's Transcript owner or by a task pinned to it.

1. The target's owners are started if they are not (``transcript@NODE``, ...).
2. The source's owners, callers first (Turns, Cron, Graph, Episodes, Recall,
   Transcript), each refuse the household from now on with
   :class:`actors.common.HouseholdMoving` (retryable: the clients send it again
   until the move ends), wait for what is under way in it (a turn, a job run)
   and close it. From here nothing writes its store.
3. Final sync, on the source node: its store registered with that node's
   Litestream and stopped, which waits for the upload
   (:meth:`device.household_replicator.HouseholdReplicator.final_sync`); the
   store's newest write-log id and turn count are read then, and the files of
   its language model's retry queue (``llm_queue``), which step 4 writes
   beside the restored store.
4. Restore, on the target node (a task pinned there): the replica restored
   into the target's root, checked (``PRAGMA integrity_check``) and compared
   with step 3: the copy must hold exactly that write-log id and that many
   turns, else it is restored again until ``replica.max_lag_s``, then the
   move is given up.
5. The routing flips: ``<hub root>/routes.json`` (the truth, atomically), then
   Ray's key-value store the clients read.
6. The source's copy is retired (marked ``moved.json``, its store removed:
   :meth:`runtime.store.households.Households.retire`), and the source's owners
   stop refusing as "moving": they refuse as "served elsewhere", and clients
   follow the new route.

A failure before step 5 gives the move up: the source serves again, the
target's partial copy is left to the next move there (which clears it: step
4's :meth:`~runtime.store.households.Households.receive`). So is the source's
copy when the mover dies between steps 5 and 6: the route names the target,
the source's owners refuse the household once their lease runs out, and a
later move back clears that copy before it restores. Every
acknowledged write was committed in the source store before step 2 ended, so
step 3 carries it and step 4 checks it arrived.
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from actors.common import CRON, EPISODES, GRAPH, RECALL, TRANSCRIPT, TURNS
from actors.household_routing import actor_name, node_settings, resolve_node, route
from actors.households import MOVE_DRAIN_S, MOVE_LEASE_S
from actors.messages import Request
from runtime.config import HUB_HOUSEHOLD, Settings
from runtime.store.household_routes import HUB_NODE
from runtime.store.households import Households, UnknownHousehold, check_id, store_marks


class _Lease:
    """Keeps the source's owners holding the household while the move goes on
    (:meth:`actors.households.Served.renew_move`, every third of
    :data:`MOVE_LEASE_S`, on a thread): should this process die, they serve it
    again once the lease runs out, where its route says."""

    def __init__(self, owners: dict[str, Any], begun: list[str], req: Request) -> None:
        self.owners, self.begun, self.req = owners, begun, req
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: list[str] = []

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew, name="move-lease", daemon=True)
            self._thread.start()

    def _renew_all(self, last: bool = False) -> None:
        import ray

        for name in list(self.begun):
            try:
                held = ray.get(self.owners[name].renew_move.remote(self.req, MOVE_LEASE_S),
                               timeout=MOVE_LEASE_S / 3)
            except Exception:
                if not last:  # a slow answer: the next round tries again
                    continue
                held = False  # the last round: an owner that did not answer is not held
            if not held and name not in self.lost:
                self.lost.append(name)

    def _renew(self) -> None:
        while not self._stop.wait(MOVE_LEASE_S / 3):
            self._renew_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def hold(self) -> None:
        """Before the routing flips: renewed once more, here, by every owner;
        RuntimeError (the move given up) when one had let the household go."""
        self.stop()
        self._renew_all(last=True)
        if self.lost:
            raise RuntimeError(f"the move lost its hold on the household in "
                               f"{', '.join(self.lost)} (its lease ran out or it did not "
                               f"answer); "
                               f"given up, the source serves it")


# Callers before the owners they call: a turn under way in Turns still reaches
# Transcript, which closes last.
MOVE_ORDER = (TURNS, CRON, GRAPH, EPISODES, RECALL, TRANSCRIPT)
RESTORE_POLL_S = 1.0


def restore_here(settings: Settings, node: str, household: str, marker: str,
                 expect: dict[str, int], llm_queue: list[dict[str, Any]]) -> dict[str, Any]:
    """On the target node: the household's replica restored into this node's
    root, holding exactly ``expect`` (again until ``replica.max_lag_s``), and
    its language model's retry queue written beside it."""
    import ray

    from actors.job_snapshot import replace_queue
    from actors.messages import QueueFile
    from device.replicator import ReplicaError, restore_into
    from runtime.llm.queue import QUEUE_DIR

    registry = Households(node_settings(settings, node))
    dest = registry.receive(household, marker)
    own = registry.settings_for_new(household)
    deadline = time.monotonic() + settings.replica.max_lag_s
    started = time.monotonic()
    while True:
        restore_into(own, dest)
        marks = store_marks(dest)
        if marks == expect:
            break
        dest.unlink()
        if time.monotonic() > deadline:
            raise ReplicaError(f"the replica of household {household!r} holds {marks}, "
                               f"not {expect}, after {settings.replica.max_lag_s:g} s")
        time.sleep(RESTORE_POLL_S)  # the replica is behind: its upload is on its way
    replace_queue(own.store.resolved_dir / QUEUE_DIR, [QueueFile(**f) for f in llm_queue])
    registry.arrived(household)
    return {"path": str(dest), "node_id": ray.get_runtime_context().get_node_id(),
            "restore_s": round(time.monotonic() - started, 3), **marks}


def move(settings: Settings, household: str, to: str) -> dict[str, Any]:
    """Move ``household`` to the node ``to`` (its name or its Ray node id); what
    was done, with the time each step took. ValueError when it cannot start."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from actors.supervisor import start_node_owners

    check_id(household)
    if household == HUB_HOUSEHOLD:
        raise ValueError(f"{HUB_HOUSEHOLD!r} is the hub's own household; it does not move")
    registry = Households(settings)
    if not registry.enabled:
        raise ValueError("households.enabled is false: this runtime serves one household")
    if not registry.served_somewhere(household):
        raise UnknownHousehold(f"no household {household!r} here")
    if not settings.replica.enabled:
        raise ValueError("no replica configured (replica.url): a household moves through "
                         "its replica")
    ns = settings.runtime.namespace
    hub_transcript = ray.get_actor(TRANSCRIPT, namespace=ns)
    hub = cast(dict[str, Any], ray.get(hub_transcript.where.remote(), timeout=60))
    target, target_id = resolve_node(to, hub["node_id"])
    source = route(ns, household)
    report: dict[str, Any] = {"household": household, "from": source, "to": target,
                              "moved": False}
    if source == target:
        return report
    steps: dict[str, float] = {}
    began = mark = time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[name] = round(now - mark, 3)
        mark = now

    if target != HUB_NODE:
        start_node_owners(settings, target, target_id)
    step("target_owners")
    owners = {name: ray.get_actor(actor_name(name, source), namespace=ns)
              for name in MOVE_ORDER}
    req = Request(household=household)
    begun: list[str] = []
    lease = _Lease(owners, begun, req)
    try:
        for name in MOVE_ORDER:
            ray.get(owners[name].begin_move.remote(req, MOVE_LEASE_S),
                    timeout=MOVE_DRAIN_S + 30)
            begun.append(name)
            lease.start()
        step("drain")
        synced = ray.get(owners[TRANSCRIPT].final_sync.remote(req), timeout=330)
        queue = synced.pop("llm_queue", [])
        synced["llm_queue_files"] = len(queue)
        step("final_sync")
        expect = {"write_log_id": synced["write_log_id"], "turns": synced["turns"]}
        task: Any = ray.remote(restore_here)
        restored = ray.get(task.options(
            num_cpus=0, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=target_id, soft=False),
        ).remote(settings, target, household, registry.marker(household), expect, queue),
            timeout=settings.replica.max_lag_s + 600)
        step("restore")
        lease.hold()  # the source refused the household all along, and still does
        ray.get(hub_transcript.set_route.remote(req, target), timeout=60)
        step("flip")
    except BaseException:
        lease.stop()
        for name in begun:  # given up: the source serves again
            ray.get(owners[name].end_move.remote(req), timeout=60)
        raise
    try:
        report["retired"] = ray.get(owners[TRANSCRIPT].retire.remote(req), timeout=60)
    finally:
        for name in begun:
            ray.get(owners[name].end_move.remote(req), timeout=60)
    step("retire")
    try:  # its reminders fire on time there from now on, not from its next sweep
        ray.get(ray.get_actor(actor_name(CRON, target), namespace=ns)
                .note_reminders.remote(req), timeout=60)
    except Exception as exc:  # the target's sweep reads them anyway
        report["reminders"] = f"not read yet: {type(exc).__name__}"
    report.update(moved=True, synced=synced, restored=restored, steps=steps,
                  seconds=round(time.monotonic() - began, 3))
    return report
