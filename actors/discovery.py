"""How the ``reverie`` commands find the running runtime.

``reverie run`` writes ``runtime.json`` (owner-only) into the data directory:
the Ray address, the namespace, its own pid and how Ray authenticates. The
client commands read it, point Ray at the token file when the node was started
with one, and join the cluster. Nothing here starts a node (``actors.node``
does).

A node on loopback needs Ray's loopback mode, in the process that starts it
and in every process that joins it (:func:`loopback_environment`,
:func:`join_environment`): the client commands join through :func:`connect`,
``reverie run`` (``actors.node``) sets it up for its own node or the cluster it
joins.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from runtime.config import Settings

log = logging.getLogger(__name__)

RUNTIME_FILE = "runtime.json"
TOKEN_FILE = "ray-auth-token"

# Read by ``ray._private.ray_constants`` when Ray is imported: with Ray's
# cluster mode off, ``ray.init`` keeps a loopback node IP instead of swapping in
# the routable one (``services.get_node_ip_address``); child processes inherit it.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class NoRuntime(RuntimeError):
    """No runtime is answering for this data directory."""


def runtime_path(settings: Settings) -> Path:
    return settings.store.resolved_dir / RUNTIME_FILE


def token_path(settings: Settings) -> Path:
    return settings.store.resolved_dir / TOKEN_FILE


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22); None
    if there is no such process. With the pid, it names one process: a pid is reused,
    the pair is not (until a reboot, after which the recorded one is gone anyway)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[19])


def _runtime_alive(info: dict[str, Any]) -> bool:
    """Whether the process that wrote ``info`` still runs: the same pid, started at
    the same moment, and not this process (a runtime restarted with the pid it had,
    as PID 1 in a container, or after an unclean stop, finds its own old file)."""
    pid = int(info.get("pid", -1))
    if pid <= 0 or pid == os.getpid():
        return False
    started = process_start(pid)
    if started is None:
        return False
    recorded = info.get("pid_start")
    return recorded is None or int(recorded) == started


def read_runtime(settings: Settings) -> dict[str, Any]:
    """What the running runtime wrote about itself; :class:`NoRuntime` if none."""
    path = runtime_path(settings)
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise NoRuntime(f"no runtime is running for {settings.store.resolved_dir}"
                        " (start one with `reverie run`)") from None
    except (ValueError, OSError):
        raise NoRuntime(f"{path} is unreadable; is a runtime running?") from None
    if not isinstance(info, dict) or not _runtime_alive(info):
        raise NoRuntime(f"the runtime that wrote {path} (pid {info.get('pid')}) is gone")
    return info


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as an owner-only file (temp file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_runtime(settings: Settings, info: dict[str, Any]) -> None:
    write_private(runtime_path(settings), json.dumps(info))


def remove_runtime(settings: Settings) -> None:
    """Remove ``runtime.json`` if this process wrote it."""
    path = runtime_path(settings)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def use_token(settings: Settings) -> Path:
    """Ray's token auth, with a private token file in the data directory."""
    path = token_path(settings)
    if not path.exists():
        write_private(path, secrets.token_urlsafe(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return path


def prepare_client_auth(settings: Settings) -> None:
    """Point Ray at the running runtime's token file, if it started its node with one
    (and at the household's certificates, for a cluster's head: ``"auth": "cluster"``).

    Must run before Ray is first imported: Ray reads its auth settings then."""
    try:
        info = json.loads(runtime_path(settings).read_text())
    except (OSError, ValueError):
        return
    if isinstance(info, dict) and info.get("auth") == "token-file":
        use_token(settings)
    elif isinstance(info, dict) and info.get("auth") == "cluster":
        # a household's cluster: the token and this node's certificate (TLS)
        from actors.cluster.pki import cluster_files
        from actors.cluster.security import cluster_environment

        cluster_environment(cluster_files(settings))


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP, ``[IPv6]``, ``localhost``, or ``host:port``) is loopback."""
    if host.count(":") == 1:  # host:port (IPv4 or a name)
        host = host.rsplit(":", 1)[0]
    elif host.startswith("[") and "]" in host:  # [IPv6]:port
        host = host[1:host.index("]")]
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def loopback_environment() -> None:
    """Keep a Ray node started by this process (and its children) on loopback.

    Call before ``ray.init`` on our own node, best before Ray is imported; not
    before joining a cluster on routable addresses (:func:`join_environment`).

    Ray reads its settings when it is imported. If a caller imported it first (a
    test session; a module that wanted Ray's exception classes), the imported
    copy is brought up to date: the constant read from the variable above, and
    Ray's config from ``RAY_*`` (as Ray itself does when it turns on token auth,
    ``authentication_token_setup._enable_token_auth``), so a token-auth mode set
    just before is seen too."""
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        vars(constants)["ENABLE_RAY_CLUSTER"] = False
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")


def join_environment(address: str) -> None:
    """Before joining the cluster at ``address`` (``--address``; the client commands).

    Ray rewrites a loopback address to this machine's routable one before it
    connects (``services.canonicalize_bootstrap_address``), and a node on
    loopback does not listen there: the client would wait forever. So joining a
    loopback address needs :func:`loopback_environment` too."""
    if is_loopback(address):
        loopback_environment()


def _answers(address: str, timeout_s: float = 3.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def connect(settings: Settings) -> Any:
    """Join the running runtime's Ray cluster; return the ray module."""
    info = read_runtime(settings)
    address = str(info["address"])
    if not _answers(address):  # ray.init would retry a dead GCS for ever
        raise NoRuntime(f"the runtime at {address} is not answering (its process "
                        f"{info.get('pid')} runs, but its Ray node does not)")
    loaded = sys.modules.get("ray")
    if loaded is not None and loaded.is_initialized():
        # a process already on a Ray cluster (a program calling the commands'
        # code in-process): the same cluster is joined already; another cannot be
        mine = loaded.get_runtime_context().gcs_address
        if mine == address:
            return loaded
        raise NoRuntime(f"this process is already on the Ray cluster at {mine}, "
                        f"not the runtime's at {address}")
    join_environment(address)  # a loopback address needs Ray's loopback mode
    import ray

    try:
        ray.init(address=info["address"], namespace=info["namespace"],
                 logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    except Exception as exc:
        raise NoRuntime(f"the runtime at {info.get('address')} is not answering: "
                        f"{type(exc).__name__}") from None
    return ray
