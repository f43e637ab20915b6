"""Starting the runtime: ``reverie run``.

On the embedded default this starts a local Ray node of its own (never a stray
cluster: ``address="local"``) with a bounded object store and the dashboard on
loopback behind Ray's token auth, then the Supervisor and its actors, and
stops cleanly on Ctrl-C or SIGTERM. With ``--address`` it joins an existing
Ray cluster instead. It writes ``runtime.json`` for the client commands
(``actors.discovery``).

Our own node listens on loopback only (``docs/security.md``). Ray keys every
bind address on the node IP: the GCS, the raylet, each worker's gRPC server,
the agents and the metrics servers bind to loopback when the node IP is
loopback, and to every interface otherwise. But ``ray.init`` rewrites a
loopback ``_node_ip_address`` to the machine's routable address
(``ray._private.services.resolve_ip_for_localhost``) unless Ray's
"cluster" mode is off, which is what ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
does (the default on macOS and Windows).
:func:`actors.discovery.loopback_environment` sets it; :func:`run` checks the
node IP it got and refuses to run exposed.

With ``--cluster`` the node is the head of the household's cluster instead
(docs/scaling.md): on ``[cluster] node_ip``, with Ray's token auth and mutual
TLS (``actors.cluster``), refused with exit 3 before Ray starts when the
household's certificates or token are missing or wrong.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from actors.discovery import (
    NoRuntime,
    is_loopback,
    join_environment,
    loopback_environment,
    process_start,
    read_runtime,
    remove_runtime,
    token_path,
    use_token,
    write_runtime,
)
from actors.node_registration import patient_registration, with_agent_listen_port
from runtime.config import Settings

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# The dashboard's modules a hub's admin uses: nodes and actors (NodeHead,
# StateHead), logs and profiling (ReportHead), events, metrics, usage stats.
# Not loaded: DataHead, TrainHead, ServeHead, JobHead (libraries Reverie does
# not run). TaskEventsHead is listed and Ray skips it unless its flag is on.
DASHBOARD_MODULES = ("UsageStatsHead", "NodeHead", "StateHead", "ReportHead", "EventHead",
                     "MetricsHead", "TaskEventsHead")
# Ray's periodic work a one-node hub can do less often (RayConfig names, set on
# our own node only): the raylet's disk, garbage and idle-worker checks and its
# resource reports every 100-250 ms, each worker's task-event report every
# second, the GCS's health checks of the one raylet. Measured with
# ``tools/bench/footprint.py --cpu-window 60``: raylet 0.72-0.77 -> 0.47-0.52 % of
# a core, gcs_server 0.38-0.43 -> 0.33 (docs/benchmarks.md, "Idle CPU"). What slows: the
# memory monitor (Ray's OOM killer) looks every second; the dashboard's task
# list lags up to 5 s; a full disk is noticed within 2 s.
#
# And the workers run at the hub's own priority (Ray's default niceness is 15):
# the turn path's actors (Turns, Recall, Transcript) answer a person waiting on
# a voice reply and must not get the scraps beside a busy process (turn-zero
# recall through the Recall actor, both cores busy: 544 ms p50 at 15, 27 ms at
# 0). The background jobs lower their own priority (actors.job_actor.JOB_NICENESS).
HUB_SYSTEM_CONFIG: dict[str, int] = {
    "worker_niceness": 0,
    "local_fs_monitor_interval_ms": 2000, "raylet_check_gc_period_milliseconds": 2000,
    "raylet_report_resources_period_milliseconds": 2000, "memory_monitor_refresh_ms": 1000,
    "kill_idle_workers_interval_ms": 2000, "task_events_report_interval_ms": 5000,
    "gcs_pull_resource_loads_period_milliseconds": 5000, "health_check_period_ms": 10000,
}
# The dashboard agent's reporter reads every worker's /proc files at this
# period (Ray's default 5 s); the dashboard's node graphs update as often.
REPORTER_INTERVAL_MS = "15000"
# The dashboard's own periodic chores, set through the environment its
# processes inherit (Ray reads each name once, at import; ours are set only
# when unset): the reporter above; the dashboard's record of its own processes'
# CPU and memory (Ray's default every 5 s: a psutil smaps read of each of its
# six processes, most of the dashboard process's idle CPU under py-spy); the
# agent's check that the raylet, its parent, still lives (every 0.4 s: it
# notices a dead raylet within about 6 s instead of 1.2 s); the event page's
# scan of the event files (every 2 s).
HUB_DASHBOARD_ENV: dict[str, str] = {
    "REPORTER_UPDATE_INTERVAL_MS": REPORTER_INTERVAL_MS,
    "METRICS_RECORD_INTERVAL_S": "30",
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "2",
    "SCAN_EVENT_DIR_INTERVAL_SECONDS": "10",
}
EXIT_EXPOSED = 3  # refusing to run: exposed, Ray's directory not private, or no replica
# The node's agent ports, chosen before Ray starts instead of by the agents or
# Ray's fixed default. Ray 2.60's raylet waits a fixed 15 s (not a RayConfig)
# for its dashboard agent to write its port files, and aborts the start when it
# has not ("Timed out waiting for file .../dashboard_agent_listen_port_<node>").
# With Ray's fixed HTTP port (52365) held by another node on the machine (another
# runtime, a household, the tests' runtimes), the agent spends 3 s retrying it
# before going on without; beside a CPU hog, the agent's start plus those 3 s
# passed the 15 s (hog runs E, F and G of 2026-12-03). Left at 0, the agent's
# other ports are also written late, after its imports. The raylet is told the
# HTTP one as well (:func:`with_agent_listen_port`): it then waits for none.
AGENT_PORTS = ("metrics_agent_port", "runtime_env_agent_port", "metrics_export_port",
               "dashboard_agent_listen_port")


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (the kernel's choice)."""
    import socket

    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in held:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


@contextmanager
def hub_node(log_monitor: bool) -> Iterator[None]:
    """While ``ray.init`` starts our own node: no autoscaler monitor, and a log
    monitor only when worker logs go to the driver (``log_monitor``).

    A hub is one node that never scales, and ``reverie run`` prints worker logs
    only with ``--verbose``: those two Ray processes (``monitor.py``, about
    48 MiB PSS, and ``log_monitor.py``, about 45 MiB, measured with
    ``tools/bench/footprint.py``) would cost 8 % of the memory budget for
    nothing. ``ray.init`` has no argument for them, but its node parameters
    (``ray._private.parameter.RayParams``, the ones ``ray start --no-monitor``
    sets) do; this sets them on the parameters ``ray.init`` builds, and puts
    Ray's class back afterwards. What the dashboard loses: the autoscaler's
    cluster summary (a hub has nothing to autoscale); its logs and actors
    pages read the files through the dashboard agent, which stays.

    The dashboard loads only :data:`DASHBOARD_MODULES`: Ray's Data, Train,
    Serve and Jobs pages (a process each, ≈ 19.5 MiB PSS apiece, ≈ 78 MiB
    together) serve libraries a hub never runs. ``ray.init`` has no argument
    for that either; the dashboard's own ``--modules-to-load`` does, and this
    adds it to the command Ray starts the dashboard with.

    And Ray's periodic chores run less often (:data:`HUB_SYSTEM_CONFIG`, the
    dashboard's :data:`HUB_DASHBOARD_ENV`): idle CPU. And the node is given
    longer than Ray's 30 s to register (:mod:`actors.node_registration`)."""
    from ray._private import parameter, ray_constants, services

    ray_params = parameter.RayParams
    start_process = services.start_ray_process

    def start_ray_process(command: list[str], process_type: str,
                          *args: Any, **kwargs: Any) -> Any:
        if (process_type == ray_constants.PROCESS_TYPE_DASHBOARD
                and not any(a.startswith("--modules-to-load") for a in command)):
            command = [*command, "--modules-to-load=" + ",".join(DASHBOARD_MODULES)]
        elif process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = with_agent_listen_port(command)
        return start_process(command, process_type, *args, **kwargs)

    class HubParams(ray_params):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", log_monitor)
            kwargs["_system_config"] = {**HUB_SYSTEM_CONFIG,
                                        **(kwargs.get("_system_config") or {})}
            unset = [name for name in AGENT_PORTS if not kwargs.get(name)]
            kwargs.update(zip(unset, free_loopback_ports(len(unset)), strict=True))
            super().__init__(*args, **kwargs)

    unset = [name for name in HUB_DASHBOARD_ENV if name not in os.environ]
    for name in unset:  # the dashboard's processes inherit them
        os.environ[name] = HUB_DASHBOARD_ENV[name]
    parameter.RayParams = HubParams  # type: ignore[misc]
    services.start_ray_process = start_ray_process
    try:
        with patient_registration():
            yield
    finally:
        parameter.RayParams = ray_params  # type: ignore[misc]
        services.start_ray_process = start_process
        for name in unset:
            os.environ.pop(name, None)


def prepare_node_auth(settings: Settings, address: str | None) -> str:
    """Set up Ray's token auth before Ray is imported; return the auth mode recorded.

    Our own node uses a private token file in the data directory; a joined
    cluster keeps whatever auth it has."""
    if address:
        return "inherited"
    settings.store.resolved_dir.mkdir(parents=True, exist_ok=True)
    use_token(settings)
    return "token-file"


def private_ray_dir() -> Path:
    """Ray's temporary directory for our own node: ``<tmp>/reverie-<uid>/ray``.

    Ray makes its directories world-writable (``/tmp/ray`` and every session
    directory are 0777) and its logs world-readable; the actors' logs are
    there, and the files naming the node's ports. Inside a 0700 directory of
    our own no other local user reaches them. It stays under the system's
    temporary directory, not the data dir: the path of Ray's Unix sockets
    (``<session>/sockets/plasma_store``) must stay under 108 bytes.

    Raises RuntimeError if the directory exists and is not ours (or is a
    symbolic link): someone else could read or replace what Ray keeps there."""
    base = Path(tempfile.gettempdir()) / f"reverie-{os.getuid()}"
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeError(f"{base} exists and is not a directory of this user's")
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base / "ray"


def ray_init_args(settings: Settings, address: str | None, verbose: bool) -> dict[str, Any]:
    """The arguments of ``ray.init`` for ``reverie run`` (our own node's temporary
    directory is made here: :func:`private_ray_dir`)."""
    rt = settings.runtime
    args: dict[str, Any] = {"namespace": rt.namespace, "logging_level": logging.WARNING,
                            "log_to_driver": verbose}
    if address:
        args["address"] = address
        return args
    if rt.dashboard and not is_loopback(rt.dashboard_host):
        log.warning("runtime.dashboard_host=%s exposes the dashboard beyond this machine;"
                    " use an SSH tunnel instead (docs/security.md)", rt.dashboard_host)
    args.update(
        address="local",  # never join a cluster named by RAY_ADDRESS or an earlier session
        num_cpus=rt.num_cpus, object_store_memory=rt.object_store_mb * 1024 * 1024,
        include_dashboard=rt.dashboard, dashboard_host=rt.dashboard_host,
        dashboard_port=rt.dashboard_port, _node_ip_address=LOOPBACK,
        _temp_dir=str(private_ray_dir()))
    return args


def _start_head(settings: Settings, init_args: dict[str, Any], verbose: bool) -> Any:
    """``ray.init`` for a cluster's head: the hub's trimmed node (no autoscaler or
    log monitor, slower chores), the GCS on ``[cluster] port``, and the dashboard
    agent without its Prometheus export (``actors.cluster.security.cluster_node``)."""
    import ray
    from ray._private import parameter

    from actors.cluster.security import cluster_node

    port = settings.cluster.port

    with hub_node(log_monitor=verbose), cluster_node():
        hub_params = parameter.RayParams

        class HeadParams(hub_params):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("gcs_server_port", port)
                super().__init__(*args, **kwargs)

        parameter.RayParams = HeadParams  # type: ignore[misc]
        try:
            return ray.init(**init_args)
        finally:
            parameter.RayParams = hub_params  # type: ignore[misc]


def exposed(address_info: dict[str, Any]) -> list[str]:
    """The addresses of a node we started that are not loopback (none, if all is well)."""
    hosts = [str(address_info.get(key, "")) for key in ("node_ip_address", "gcs_address")]
    return [host for host in hosts if not is_loopback(host)]


def cluster_init_args(settings: Settings, node_ip: str, verbose: bool) -> dict[str, Any]:
    """The arguments of ``ray.init`` for the head of a household's cluster: on
    ``node_ip``, no dashboard head (its Prometheus port has no auth:
    ``actors.cluster.security``), Ray's directory private as on a hub."""
    rt = settings.runtime
    return {"namespace": rt.namespace, "logging_level": logging.WARNING,
            "log_to_driver": verbose, "address": "local", "num_cpus": rt.num_cpus,
            "object_store_memory": rt.object_store_mb * 1024 * 1024,
            "include_dashboard": False, "_node_ip_address": node_ip,
            "_temp_dir": str(private_ray_dir())}


def prepare_cluster(settings: Settings) -> tuple[str, str | None]:
    """Before Ray is imported, for ``reverie run --cluster``: check the household's
    certificates and token and turn on token auth and TLS. Returns the node's
    address and None, or the address and the reason to refuse."""
    from actors.cluster.pki import ClusterSecurityError, check, cluster_files
    from actors.cluster.security import cluster_environment, routable_ip

    node_ip = settings.cluster.node_ip or routable_ip()
    files = cluster_files(settings)
    try:
        check(files, node_ip)
    except ClusterSecurityError as exc:
        return node_ip, str(exc)
    cluster_environment(files)
    return node_ip, None


def run(settings: Settings, address: str | None = None, verbose: bool = False,
        cluster: bool = False) -> int:
    """Run the runtime in the foreground until Ctrl-C or SIGTERM; return the exit code.

    ``cluster``: our own node is the head of the household's cluster, on a
    routable address, with Ray's token auth and TLS between nodes; refused
    (exit 3, with the reason) without the household's certificates and token."""
    if cluster and address:
        print("reverie: --cluster starts the head node; --address joins another cluster:"
              " not both", file=sys.stderr)
        return 2
    try:
        read_runtime(settings)
        print(f"reverie: already running for {settings.store.resolved_dir}", file=sys.stderr)
        return 1
    except NoRuntime:
        pass
    if settings.replica.enabled and settings.replica.restore_on_boot:
        from device.replicator import ReplicaError, restore_if_missing

        try:  # before anything opens the store
            if restore_if_missing(settings):
                print("reverie: the store was missing; restored it from the replica",
                      file=sys.stderr)
        except ReplicaError as exc:
            print(f"reverie: cannot restore the store from the replica: {exc}", file=sys.stderr)
            return EXIT_EXPOSED
    node_ip = None
    if cluster:  # before Ray is imported
        node_ip, refused = prepare_cluster(settings)
        if refused:
            print(f"reverie: refusing to start a cluster: {refused}", file=sys.stderr)
            return EXIT_EXPOSED
        auth = "cluster"
    else:
        auth = prepare_node_auth(settings, address)  # before Ray is imported
    if address:  # after the auth settings: both refresh an already-imported Ray
        join_environment(address)
    elif not cluster:
        loopback_environment()
    import ray

    from actors import supervisor

    print("reverie: starting Ray…", file=sys.stderr, flush=True)
    try:
        init_args = (cluster_init_args(settings, node_ip, verbose) if node_ip
                     else ray_init_args(settings, address, verbose))
    except RuntimeError as exc:  # Ray's directory is not private
        print(f"reverie: refusing to start Ray: {exc}", file=sys.stderr)
        return EXIT_EXPOSED
    if node_ip:
        ctx: Any = _start_head(settings, init_args, verbose)
    else:
        with nullcontext() if address else hub_node(log_monitor=verbose):
            ctx = ray.init(**init_args)
    if not address and not cluster and (wrong := exposed(ctx.address_info)):
        ray.shutdown()
        print(f"reverie: Ray bound the node to {', '.join(wrong)}, not loopback; refusing to"
              " run exposed (docs/security.md)", file=sys.stderr)
        return EXIT_EXPOSED
    stop = threading.Event()  # installed after ray.init, which sets its own handlers
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print("reverie: starting actors…", file=sys.stderr, flush=True)
        sup = supervisor.start(settings, cluster=cluster)
        http = sup.http_address()
        # the Wyoming handle service runs in the HTTP actor (actors/http/wyoming.py)
        wyoming = (sup.http.call("wyoming_address", reply=str, retry=True, timeout=10.0)
                   or None) if settings.http.enabled and settings.wyoming.enabled else None
        write_runtime(settings, {
            "address": ctx.address_info["gcs_address"], "namespace": settings.runtime.namespace,
            "pid": os.getpid(), "pid_start": process_start(os.getpid()), "auth": auth,
            "started_at": time.time(),
            "dashboard": ctx.dashboard_url or None, "http": http, "wyoming": wyoming})
        print(f"reverie: running (namespace {settings.runtime.namespace}, "
              f"data {settings.store.resolved_dir})")
        if cluster:
            print(f"reverie: cluster head at {ctx.address_info['gcs_address']} (token auth and"
                  " TLS); add a helper with `reverie join "
                  f"{ctx.address_info['gcs_address']}` on it")
        if http:
            print(f"reverie: HTTP API {http} (bearer token in "
                  f"{settings.store.resolved_dir / 'http-token'})")
        elif settings.http.enabled:
            print("reverie: the HTTP API is off: it could not listen (see `reverie status`)",
                  file=sys.stderr)
        if wyoming:
            print(f"reverie: Wyoming handle service {wyoming}")
        elif settings.wyoming.enabled:
            print("reverie: the Wyoming service is off: " + (
                "it runs in the HTTP actor ([http] enabled = false)" if not settings.http.enabled
                else "it could not start (see `reverie status`)"), file=sys.stderr)
        if ctx.dashboard_url:
            print(f"reverie: dashboard http://{ctx.dashboard_url} (token in "
                  f"{token_path(settings)})")
        print("reverie: Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):  # a timeout keeps the main thread waking for signals
            pass
        print("reverie: stopping…", file=sys.stderr, flush=True)
        try:
            sup.stop()
        except Exception as exc:
            log.warning("clean stop failed: %s", type(exc).__name__)
    finally:
        remove_runtime(settings)
        ray.shutdown()
    print("reverie: stopped", file=sys.stderr)
    return 0
