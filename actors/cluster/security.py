"""Ray's protections for a node of a household's cluster (``reverie run --cluster``,
``reverie join``, and a client command joining such a cluster).

Both of Ray's own, on every node and every process that joins:

- **token auth** (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``): every gRPC
  call to the GCS, a raylet or a worker, and every request to Ray's HTTP
  servers (dashboard agent, runtime-env agent), must carry the household's
  token;
- **mutual TLS** (``RAY_USE_TLS=1``, ``RAY_TLS_SERVER_CERT``,
  ``RAY_TLS_SERVER_KEY``, ``RAY_TLS_CA_CERT``): Ray's gRPC servers speak TLS
  only and, with a CA set, ask every client for a certificate signed by it
  (``ray._common.tls_utils.add_port_to_grpc_server``: ``require_client_auth``).

Ray has two listeners neither covers, both Prometheus exporters that bind every
interface once the node's address is not loopback: the dashboard head's
(port 44227) and the dashboard agent's metrics export. The head runs without
the dashboard (``include_dashboard=False``: reach Ray's state through
``reverie status`` or ``ray`` commands with the token), but Ray starts the
dashboard's process all the same, without its web server and with its
Prometheus server: :func:`cluster_node` adds ``--minimal`` to its command,
which skips that. Every node's agent is started with
``--disable-metrics-collection``. So neither port opens (checked by connecting
in ``tests/test_cluster_listeners.py``, which caught the first one open when
port 44227 was free on this machine). What is lost: Ray's and Reverie's metrics in Prometheus
(``actors/metrics.py`` records become no-ops) on a cluster.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from actors.cluster.pki import ClusterFiles

AGENT_COMMAND = "--dashboard_agent_command="
NO_METRICS = "--disable-metrics-collection"
MINIMAL = "--minimal"


def tls_environment(files: ClusterFiles) -> dict[str, str]:
    return {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(files.token),
        "RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(files.node_cert),
        "RAY_TLS_SERVER_KEY": str(files.node_key), "RAY_TLS_CA_CERT": str(files.ca_cert),
    }


def cluster_environment(files: ClusterFiles) -> None:
    """Turn on token auth and TLS for this process and its children (before Ray
    starts or joins a node; best before Ray is imported), and Ray's cluster mode
    (a routable node address), undoing ``actors.discovery.loopback_environment``.

    If Ray was imported already, its cached settings are brought up to date the
    way Ray does it itself when it turns token auth on (``Config.initialize``)."""
    os.environ.update(tls_environment(files))
    os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        vars(constants)["ENABLE_RAY_CLUSTER"] = True
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")


def routable_ip() -> str:
    """This machine's address on the network its default route leads to (no packet
    is sent: a UDP socket's connect only picks the source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            return str(s.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _without_metrics(command: list[str]) -> list[str]:
    out = []
    for arg in command:
        if arg.startswith(AGENT_COMMAND) and NO_METRICS not in arg:
            arg = f"{arg} {NO_METRICS}"
        out.append(arg)
    return out


@contextmanager
def cluster_node() -> Iterator[None]:
    """While Ray starts a node in this process (``ray.init`` on the head,
    ``reverie join``'s worker node, a test's ``Cluster.add_node``): its
    dashboard agent and, on the head, the dashboard's process are told not to
    open their Prometheus ports. And it is given longer than Ray's 30 s to
    register, and its raylet is told its dashboard agent's HTTP port instead of
    waiting a fixed 15 s for the agent to write it
    (:mod:`actors.node_registration`): a helper node loaded by other work, or
    slow to import, no longer aborts its start."""
    from ray._private import ray_constants, services

    from actors.node_registration import patient_registration, with_agent_listen_port

    start_process = services.start_ray_process

    def start_ray_process(command: list[str], process_type: str,
                          *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = with_agent_listen_port(_without_metrics(command))
        elif process_type == ray_constants.PROCESS_TYPE_DASHBOARD and MINIMAL not in command:
            command = [*command, MINIMAL]  # no Prometheus server (DashboardHead._setup_metrics)
        return start_process(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process
    try:
        with patient_registration():
            yield
    finally:
        services.start_ray_process = start_process
