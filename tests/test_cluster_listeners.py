"""The cluster variant of the listener test (``tests/test_listeners.py``):
``reverie run --cluster`` (the head) and ``reverie join`` (a helper), started as
a user starts them, on this machine's routable address. Every listener of their
process trees outside loopback must refuse a client without the household's
token or certificate, which is checked by connecting to it, not by reading flags:

- a plain HTTP request without the token: an HTTP server answers 401 or 403
  (Ray's health-check paths are public; none is asked here); a TLS server
  answers nothing;
- a gRPC call over plain TCP, and over TLS without a client certificate: both
  fail to connect (``UNAVAILABLE``); with the node's certificate the TLS
  handshake goes through (any other status), so the refusal is the certificate's;
- the GCS, with the certificate but without the token: ``UNAUTHENTICATED``;
  with both it answers (the control that the probe can succeed).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from test_listeners import (
    REVERIE,
    SCAN_EVERY_S,
    SCANS,
    Listener,
    _parents,
    _read,
    is_loopback,
    listeners_of,
    listening_sockets,
)

from actors.cluster.security import routable_ip

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

START_TIMEOUT_S = 240
PROBE_TIMEOUT_S = 10.0
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"  # an empty request is a valid one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    proc: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)


def _start(args: list[str], env: dict[str, str]) -> Process:
    proc = subprocess.Popen([*REVERIE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    started = Process(proc)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or []:
            started.output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            _stop(started)
            pytest.fail(f"reverie {args[0]} did not start in {START_TIMEOUT_S} s:\n"
                        + "".join(started.output))
        if line is None:
            pytest.fail(f"reverie {args[0]} exited ({proc.wait()}):\n" + "".join(started.output))
        if "Ctrl-C to stop" in line:
            return started


def _stop(started: Process) -> None:
    if started.proc.poll() is None:
        started.proc.send_signal(signal.SIGTERM)
        try:
            started.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            started.proc.kill()
            started.proc.wait()


@dataclass
class Cluster:
    ip: str
    gcs_port: int
    secrets: Path  # the hub's cluster directory
    head: Process
    helper: Process
    env: dict[str, str]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster-listeners")
    ip = routable_ip()
    if is_loopback(ip):
        pytest.skip("this machine has no routable address")
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update({
        "REVERIE_DATA_DIR": str(root / "hub"), "REVERIE_CLUSTER__NODE_IP": ip,
        "REVERIE_CLUSTER__PORT": str(port),
        "REVERIE_RUNTIME__NAMESPACE": f"cluster-listeners-{os.getpid()}",
        "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
        "REVERIE_PERSONA__GLOBAL_DIR": str(root / "persona"), "REVERIE_HTTP__PORT": "0",
        # the dashboard's Prometheus port, on a port surely free (44227 may be taken by
        # another runtime on this machine, which would hide a server trying to open it)
        "DASHBOARD_METRIC_PORT": str(_free_port()),
    })
    for args in (["cluster", "init"], ["cluster", "issue", ip, "--out",
                                       str(root / "helper" / "cluster")]):
        made = subprocess.run([*REVERIE, *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr
    head = _start(["run", "--cluster"], env)
    try:
        helper = _start(["join", f"{ip}:{port}"], {**env, "REVERIE_DATA_DIR": str(root / "helper")})
    except BaseException:
        _stop(head)
        raise
    try:
        yield Cluster(ip, port, root / "hub" / "cluster", head, helper, env)
    finally:
        _stop(helper)
        _stop(head)


def _exposed(cluster: Cluster) -> list[Listener]:
    found: set[Listener] = set()
    for scan in range(SCANS):
        if scan:
            time.sleep(SCAN_EVERY_S)
        for started in (cluster.head, cluster.helper):
            found |= listeners_of(started.proc.pid)
    return sorted((lis for lis in found if not is_loopback(lis.address)),
                  key=lambda lis: lis.port)


def _gone(lis: Listener) -> bool:
    """Whether the listener went away since the scan (Ray ends idle workers)."""
    if not Path(f"/proc/{lis.pid}").exists():
        return True
    return lis.port not in {port for _, port in listening_sockets(os.getpid()).values()}


def _http_status(ip: str, port: int) -> int | None:
    """The status of ``GET /`` without a token, or None if no HTTP answer came."""
    try:
        with socket.create_connection((ip, port), timeout=PROBE_TIMEOUT_S) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return None
    if not head.startswith(b"HTTP/1."):
        return None
    return int(head.split()[1])


def _grpc_code(target: str, credentials: grpc.ChannelCredentials | None,
               token: str | None = None) -> grpc.StatusCode:
    channel = (grpc.secure_channel(target, credentials) if credentials is not None
               else grpc.insecure_channel(target))
    metadata = [("authorization", f"Bearer {token}")] if token else None
    try:
        channel.unary_unary(GCS_METHOD)(b"", timeout=PROBE_TIMEOUT_S, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    finally:
        channel.close()


def test_every_exposed_listener_refuses_a_client_without_the_token_or_certificate(
        cluster: Cluster) -> None:
    exposed = _exposed(cluster)
    ports = {lis.port for lis in exposed}
    assert cluster.gcs_port in ports, [str(lis) for lis in exposed]  # the walk saw the head
    assert len({lis.pid for lis in exposed}) >= 6, [str(lis) for lis in exposed]
    ca = (cluster.secrets / "ca.crt").read_bytes()
    with_cert = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=(cluster.secrets / "node.key").read_bytes(),
        certificate_chain=(cluster.secrets / "node.crt").read_bytes())
    without_cert = grpc.ssl_channel_credentials(root_certificates=ca)
    token = (cluster.secrets / "token").read_text().strip()

    open_ones, http, grpc_servers = [], [], []
    for lis in exposed:
        if _gone(lis):
            continue
        status = _http_status(cluster.ip, lis.port)
        if status is not None:
            http.append(lis)
            if status not in (401, 403):
                open_ones.append(f"{lis}: HTTP {status} without the token")
            continue
        grpc_servers.append(lis)
        target = f"{cluster.ip}:{lis.port}"
        for what, credentials in (("plain TCP", None), ("TLS without a certificate",
                                                        without_cert)):
            code = _grpc_code(target, credentials, token)
            if code != grpc.StatusCode.UNAVAILABLE:
                open_ones.append(f"{lis}: gRPC over {what} got {code.name}")
        code = _grpc_code(target, with_cert, token)
        if code == grpc.StatusCode.UNAVAILABLE and not _gone(lis):  # the probe gets through
            open_ones.append(f"{lis}: not even the household's certificate gets through")
    assert not open_ones, "listeners that let a client in:\n  " + "\n  ".join(open_ones)
    assert http and len(grpc_servers) >= 5, ([str(lis) for lis in http],
                                             [str(lis) for lis in grpc_servers])

    gcs = f"{cluster.ip}:{cluster.gcs_port}"
    assert _grpc_code(gcs, with_cert) == grpc.StatusCode.UNAUTHENTICATED  # no token
    assert _grpc_code(gcs, with_cert, "not-the-household-token") == \
        grpc.StatusCode.UNAUTHENTICATED
    assert _grpc_code(gcs, with_cert, token) == grpc.StatusCode.OK


def test_no_prometheus_port_and_no_dashboard_head(cluster: Cluster) -> None:
    """Ray's two Prometheus exporters have no auth: neither runs on a cluster node
    (the dashboard head is not started; each raylet starts its agent without
    metrics collection). Were one there, the test above would see it answer."""
    processes = " ".join(lis.process for lis in _exposed(cluster))
    assert "dashboard/dashboard.py" not in processes
    for started in (cluster.head, cluster.helper):
        tree = {lis.pid for lis in listeners_of(started.proc.pid)}
        raylets = [_read(f"/proc/{pid}/cmdline").encode().split(b"\0") for pid in tree
                   if _read(f"/proc/{pid}/comm").strip() == "raylet"]
        assert raylets, "no raylet among the listeners"
        agent = [arg for arg in raylets[0] if arg.startswith(b"--dashboard_agent_command=")]
        assert agent and agent[0].endswith(b" --disable-metrics-collection"), agent


def _raylet_of(root: int) -> list[str]:
    """The command line of the raylet ``root`` started: its descendant (the head
    and a node joined on the same machine share the session's name, so
    ``process_tree`` finds both raylets from either)."""
    parents = _parents()
    for pid in parents:
        if _read(f"/proc/{pid}/comm").strip() != "raylet":
            continue
        up = pid
        while up > 1 and up != root:
            up = parents.get(up, 0)
        if up == root:
            return _read(f"/proc/{pid}/cmdline").split("\0")
    raise AssertionError(f"no raylet under process {root}")


def test_each_raylet_is_told_its_agents_http_port(cluster: Cluster) -> None:
    """Ray's raylet waits a fixed 15 s for its dashboard agent to write its HTTP
    port, and aborts the node's start when the agent is slower to import (a
    helper on a loaded machine): on the head and on a joined node, it is told the
    port the agent is given (``with_agent_listen_port``) and waits for none."""
    for started in (cluster.head, cluster.helper):
        raylet = _raylet_of(started.proc.pid)
        agent = next(arg for arg in raylet if arg.startswith("--dashboard_agent_command="))
        listen = re.search(r"--listen-port=(\d+)", agent)
        assert listen and int(listen.group(1)) > 0, agent
        assert f"--dashboard_agent_listen_port={listen.group(1)}" in raylet, raylet


def test_a_client_with_the_households_pki_is_served(cluster: Cluster) -> None:
    status = subprocess.run([*REVERIE, "status"], env=cluster.env, capture_output=True,
                            text=True, timeout=180)
    assert status.returncode == 0, status.stdout + status.stderr
