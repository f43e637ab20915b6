"""``reverie join ADDRESS``: this machine becomes a helper node of a household's cluster.

It starts a Ray worker node (the raylet, its object store and agents; no
Reverie actor of its own) that joins the head at ``ADDRESS`` and offers
``[cluster] job_slots`` units of the custom resource ``[cluster] job_resource``:
the Cron actor sends job actors there (``actors.cluster.placement``); the turn
path never comes. Like the head it needs the household's CA certificate, its
own node certificate and the token, in its cluster directory (``reverie
cluster issue`` on the hub makes them); without them it refuses (exit 3, with
the reason) before any port opens. It runs in the foreground until Ctrl-C or
SIGTERM, then stops its node; the hub's jobs go back to the hub once Ray has
noticed (its health checks).

``--name NAME`` also makes it a node that can serve households (``reverie
household move ID --to NAME``): the Ray label ``reverie-node=NAME``, and the
households moved there are kept under this machine's ``[households] root``
(given to its Ray processes as ``REVERIE_HOUSEHOLDS_ROOT``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from actors.cluster.pki import ClusterSecurityError, check, cluster_files
from actors.cluster.security import cluster_environment, cluster_node, routable_ip
from actors.node import EXIT_EXPOSED, private_ray_dir
from runtime.config import Settings

log = logging.getLogger(__name__)


def helper_params(settings: Settings, address: str, node_ip: str,
                  name: str | None = None) -> Any:
    """Ray's parameters for a helper node joining ``address`` (``name``: a node
    that can serve households, ``actors/household_routing.py``)."""
    from ray._private.parameter import RayParams

    from actors.household_routing import LABEL, ROOT_ENV
    from runtime.store.household_routes import check_node
    from runtime.store.households import Households

    cl = settings.cluster
    named: dict[str, Any] = {}
    if name is not None:
        named = {"labels": {LABEL: check_node(name)},
                 "env_vars": {ROOT_ENV: str(Households(settings).root)}}
    return RayParams(gcs_address=address, node_ip_address=node_ip, **named,
                     num_cpus=settings.runtime.num_cpus,
                     resources={cl.job_resource: float(cl.job_slots)},
                     object_store_memory=settings.runtime.object_store_mb * 1024 * 1024,
                     temp_dir=str(private_ray_dir()),
                     include_log_monitor=False,  # type: ignore[arg-type]
                     no_monitor=True)


def join(settings: Settings, address: str, name: str | None = None) -> int:
    """Run a helper node for the cluster at ``address`` until Ctrl-C; the exit code."""
    node_ip = settings.cluster.node_ip or routable_ip()
    files = cluster_files(settings)
    try:
        check(files, node_ip)
    except ClusterSecurityError as exc:
        print(f"reverie: refusing to join: {exc}", file=sys.stderr)
        return EXIT_EXPOSED
    try:
        params_dir = private_ray_dir()
    except RuntimeError as exc:
        print(f"reverie: refusing to start Ray: {exc}", file=sys.stderr)
        return EXIT_EXPOSED
    cluster_environment(files)  # before Ray is imported
    from ray._private.node import Node

    print(f"reverie: joining {address} as a helper on {node_ip} "
          f"({settings.cluster.job_slots} of {settings.cluster.job_resource})…",
          file=sys.stderr, flush=True)
    with cluster_node():
        node = Node(helper_params(settings, address, node_ip, name), head=False,
                    shutdown_at_exit=True, spawn_reaper=True)
    log.debug("helper node %s in %s", node.node_id, params_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("reverie: helper running; Ctrl-C to stop", flush=True)
    while not stop.wait(1.0):
        if not node.remaining_processes_alive():
            print("reverie: the helper's Ray processes died", file=sys.stderr)
            node.kill_all_processes(check_alive=False, allow_graceful=True)
            return 1
    print("reverie: stopping the helper…", file=sys.stderr, flush=True)
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    print("reverie: stopped", file=sys.stderr)
    return 0
