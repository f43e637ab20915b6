"""``reverie run`` on the embedded default listens on loopback only.

The runtime is started the way a user starts it (``python -m actors.cli run``,
a subprocess with its own Ray node), its whole process tree is walked, and each
process's sockets are matched to the listening entries of ``/proc/net/tcp``
and ``tcp6``. Any listener outside 127.0.0.0/8 and ::1 fails the test, listed
by process, address and port.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from actors.node import (
    AGENT_PORTS,
    HUB_DASHBOARD_ENV,
    HUB_SYSTEM_CONFIG,
    REPORTER_INTERVAL_MS,
    private_ray_dir,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

REVERIE = [sys.executable, "-m", "actors.cli"]
START_TIMEOUT_S = 240
SCANS = 4  # listeners are collected over a few scans, for late-starting workers
SCAN_EVERY_S = 1.0
CLIENT_TIMEOUT_S = 60
TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    process: str
    address: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.process} (pid {self.pid}) on {host}:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:  # the process is gone, or not ours to read
        return ""


def _parents() -> dict[int, int]:
    """Every process's parent pid, from ``/proc/<pid>/stat``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _session_dirs(pids: set[int]) -> set[str]:
    """Ray's session directories named on the command lines of ``pids``."""
    found = set()
    for pid in pids:
        for arg in _read(f"/proc/{pid}/cmdline").split("\0"):
            for flag in ("--session-dir=", "--session_dir="):
                if arg.startswith(flag):
                    found.add(arg[len(flag):])
    return found


def process_tree(root: int) -> set[int]:
    """``root``, its descendants, and any process that names the same Ray session
    on its command line (in case one detached from the tree)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    sessions = _session_dirs(tree)
    if sessions:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in tree:
                cmdline = _read(f"/proc/{entry}/cmdline")
                if any(session in cmdline for session in sessions):
                    tree.add(int(entry))
    return tree


def _address(hex_address: str) -> str:
    """An address of ``/proc/net/tcp[6]``: 32-bit words in host byte order."""
    words = [int(hex_address[i:i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = b"".join(struct.pack("=I", word) for word in words)
    return socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)


def listening_sockets(net_pid: int) -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP listener in ``net_pid``'s network namespace."""
    found = {}
    for table in ("tcp", "tcp6"):
        for line in _read(f"/proc/{net_pid}/net/{table}").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == TCP_LISTEN:
                hex_address, hex_port = fields[1].split(":")
                found[fields[9]] = (_address(hex_address), int(hex_port, 16))
    return found


def _process_name(pid: int) -> str:
    cmdline = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
    return cmdline[:100] or _read(f"/proc/{pid}/comm").strip()


def listeners_of(root: int) -> set[Listener]:
    """The TCP listeners held by ``root``'s process tree."""
    inodes = listening_sockets(root)
    found = set()
    for pid in process_tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                address, port = inodes[target[8:-1]]
                found.add(Listener(pid, _process_name(pid), address, port))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, a dual-stack socket bound to IPv4 loopback
    return ip.is_loopback


def test_address_decoding() -> None:
    assert _address(f"{struct.unpack('=I', socket.inet_aton('127.0.0.1'))[0]:08X}") == "127.0.0.1"
    assert _address("0" * 32) == "::"
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.10") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")
    assert not is_loopback("::ffff:192.0.2.2")


def test_rays_directory_is_made_private_and_a_foreign_one_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = tmp_path / f"reverie-{os.getuid()}"
    assert private_ray_dir() == base / "ray"
    assert base.stat().st_mode & 0o777 == 0o700
    base.chmod(0o777)  # left open by hand: closed again
    assert private_ray_dir() == base / "ray" and base.stat().st_mode & 0o777 == 0o700

    base.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    base.symlink_to(elsewhere)  # a link planted by someone: not followed
    with pytest.raises(RuntimeError, match="not a directory of this user's"):
        private_ray_dir()
    if os.geteuid() == 0:
        base.unlink()
        base.mkdir(mode=0o700)
        os.chown(base, 65534, 65534)  # another user's (nobody)
        with pytest.raises(RuntimeError, match="not a directory of this user's"):
            private_ray_dir()


@dataclass
class Started:
    proc: subprocess.Popen[str]
    env: dict[str, str]
    data_dir: Path
    output: list[str]
    ray_address: str


@pytest.fixture(scope="module")
def embedded_runtime(tmp_path_factory: pytest.TempPathFactory,
                     model_cache: Path) -> Iterator[Started]:
    """``reverie run`` on the embedded default, as a user starts it.

    Ray settings of the test session are not passed on (a user's shell has
    none), and ``RAY_ADDRESS`` names a cluster that does not exist: the runtime
    must start a node of its own all the same."""
    root = tmp_path_factory.mktemp("listeners")
    data_dir = root / "data"
    ray_address = f"127.0.0.1:{_free_port()}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update({
        "REVERIE_DATA_DIR": str(data_dir),
        "REVERIE_RUNTIME__NAMESPACE": f"listeners-{os.getpid()}",
        "REVERIE_RUNTIME__DASHBOARD_PORT": str(_free_port()),
        "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
        "REVERIE_PERSONA__GLOBAL_DIR": str(root / "persona"),
        "REVERIE_HTTP__PORT": "0",  # the HTTP API on a free port (its default host)
    })
    # umask 0: owner-only data must not depend on the user's umask
    proc = subprocess.Popen([*REVERIE, "run"], env={**env, "RAY_ADDRESS": ray_address},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: os.umask(0))
    lines: queue.Queue[str | None] = queue.Queue()
    started = Started(proc, env, data_dir, [], ray_address)

    def pump() -> None:
        for line in proc.stdout or []:
            started.output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"reverie run did not start in {START_TIMEOUT_S} s:\n"
                            + "".join(started.output))
            if line is None:
                pytest.fail(f"reverie run exited ({proc.wait()}):\n" + "".join(started.output))
            if "Ctrl-C to stop" in line:
                break
        yield started
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_embedded_runtime_listens_on_loopback_only(embedded_runtime: Started) -> None:
    proc = embedded_runtime.proc
    found: set[Listener] = set()
    for scan in range(SCANS):
        if scan:
            time.sleep(SCAN_EVERY_S)
        found |= listeners_of(proc.pid)
    assert proc.poll() is None, "".join(embedded_runtime.output)
    info = json.loads((embedded_runtime.data_dir / "runtime.json").read_text())
    gcs_port = int(info["address"].rsplit(":", 1)[1])
    http_port = int(info["http"].rsplit(":", 1)[1])
    # The walk found the runtime's own servers, so that no exposed listener means something.
    assert gcs_port in {listener.port for listener in found}, sorted(map(str, found))
    assert http_port in {listener.port for listener in found}, sorted(map(str, found))
    assert len({listener.pid for listener in found}) >= 4, sorted(map(str, found))

    exposed = sorted(str(listener) for listener in found if not is_loopback(listener.address))
    assert not exposed, "listeners outside loopback:\n  " + "\n  ".join(exposed)


def test_rays_files_are_out_of_other_users_reach(embedded_runtime: Started) -> None:
    """Ray makes its session directory 0777 and its logs 0644: the node of
    ``reverie run`` keeps them inside a 0700 directory of its user's."""
    sessions = _session_dirs(process_tree(embedded_runtime.proc.pid))
    assert sessions, "no Ray session directory on the runtime's command lines"
    for session in sessions:
        private = Path(session).parent.parent
        assert private.name == f"reverie-{os.getuid()}", session
        info = private.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (os.getuid(), 0o700), session


def test_the_hub_node_runs_rays_chores_less_often(embedded_runtime: Started) -> None:
    """The node of ``reverie run`` got the hub's system config (the GCS's
    ``--config_list``, which the raylet and the workers take from the GCS), and
    the dashboard and its agent the slower periods of ``HUB_DASHBOARD_ENV``."""
    tree = process_tree(embedded_runtime.proc.pid)
    gcs = [_read(f"/proc/{pid}/cmdline").split("\0") for pid in tree
           if _read(f"/proc/{pid}/comm").strip() == "gcs_server"]
    assert gcs, "no gcs_server in the runtime's process tree"
    [encoded] = [arg.split("=", 1)[1] for arg in gcs[0] if arg.startswith("--config_list=")]
    config = json.loads(base64.b64decode(encoded))
    assert {key: config.get(key) for key in HUB_SYSTEM_CONFIG} == HUB_SYSTEM_CONFIG
    # The agent is started by the raylet with the raylet's environment; it renames
    # itself (setproctitle), which blanks its own /proc environ: read the raylet's.
    raylets = [pid for pid in tree if _read(f"/proc/{pid}/comm").strip() == "raylet"]
    heads = [pid for pid in tree if "dashboard/dashboard.py" in _read(f"/proc/{pid}/cmdline")]
    assert raylets and heads, "no raylet or no dashboard in the runtime's process tree"
    for pid in (raylets[0], heads[0]):  # each reads the names it knows at import
        environ = set(_read(f"/proc/{pid}/environ").split("\0"))
        assert f"REPORTER_UPDATE_INTERVAL_MS={REPORTER_INTERVAL_MS}" in environ
        assert {f"{k}={v}" for k, v in HUB_DASHBOARD_ENV.items()} <= environ


def test_the_agents_ports_are_chosen_before_ray_starts(embedded_runtime: Started) -> None:
    """The raylet is given its agents' ports (``AGENT_PORTS``, free loopback ports
    chosen at start) instead of Ray's 0, with which it waits a fixed 15 s for the
    dashboard agent to write its port and aborts the start when a loaded machine
    is slower (the HTTP one through ``with_agent_listen_port``); the agents then
    listen on them."""
    tree = process_tree(embedded_runtime.proc.pid)
    raylets = [_read(f"/proc/{pid}/cmdline").split("\0") for pid in tree
               if _read(f"/proc/{pid}/comm").strip() == "raylet"]
    assert raylets, "no raylet in the runtime's process tree"
    flags = {arg[2:].split("=", 1)[0].replace("-", "_"): arg.split("=", 1)[1]
             for arg in raylets[0] if arg.startswith("--") and "=" in arg}
    given = {name: int(flags[name]) for name in AGENT_PORTS if name in flags}
    # the dashboard agent is told its HTTP port on its command line, which the
    # raylet holds (--dashboard_agent_command="… --listen-port=N …"), and the
    # raylet is told the same port, so that it waits for no agent's file
    listen = re.search(r"--listen-port=(\d+)", flags.get("dashboard_agent_command", ""))
    assert listen, raylets[0]
    assert flags.get("dashboard_agent_listen_port") == listen.group(1), raylets[0]
    assert set(given) == set(AGENT_PORTS), raylets[0]
    assert given["dashboard_agent_listen_port"] != 52365  # not Ray's fixed default
    assert all(port > 0 for port in given.values()), given
    listening = wait_for(lambda: set(given.values()) <= {
        listener.port for listener in listeners_of(embedded_runtime.proc.pid)}, 60)
    assert listening, (given, sorted(map(str, listeners_of(embedded_runtime.proc.pid))))


def test_runtime_json_names_its_own_loopback_node(embedded_runtime: Started) -> None:
    info = json.loads((embedded_runtime.data_dir / "runtime.json").read_text())
    host = info["address"].rsplit(":", 1)[0].strip("[]")
    assert is_loopback(host), f"runtime.json records the GCS at {info['address']}"
    assert info["address"] != embedded_runtime.ray_address  # RAY_ADDRESS did not capture it
    assert info["pid"] == embedded_runtime.proc.pid


def test_client_commands_reach_the_loopback_runtime(embedded_runtime: Started) -> None:
    """A client joins the address in ``runtime.json``; Ray would rewrite a loopback
    one to the routable address (where nothing listens) and wait forever."""
    try:
        result = subprocess.run([*REVERIE, "status"], env=embedded_runtime.env,
                                capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"reverie status did not reach the runtime in {CLIENT_TIMEOUT_S} s:\n"
                    f"{err[-1500:]}")
    assert result.returncode == 0, result.stderr[-1500:]
    assert "transcript" in result.stdout
    wrote = subprocess.run([*REVERIE, "remember", "The boiler service is due in March."],
                           env=embedded_runtime.env, capture_output=True, text=True,
                           timeout=CLIENT_TIMEOUT_S)
    assert wrote.returncode == 0, wrote.stderr[-1500:]


def test_http_api_needs_its_token(embedded_runtime: Started) -> None:
    """``runtime.json`` names the HTTP API; chat completions answer 401 without the
    token of ``<data dir>/http-token`` and 200 with it."""
    info = json.loads((embedded_runtime.data_dir / "runtime.json").read_text())
    token = (embedded_runtime.data_dir / "http-token").read_text().strip()
    body = json.dumps({"model": "reverie",
                       "messages": [{"role": "user", "content": "Hello."}]}).encode()

    def post(headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(f"{info['http']}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json",
                                                  **headers})
        try:
            with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert post({})[0] == 401
    status, answer = post({"Authorization": f"Bearer {token}"})
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"]

    # Ollama's chat, and an MCP initialize at /mcp
    def call(path: str, payload: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{info['http']}{path}",
                                         data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {token}",
                                                  **headers})
        try:
            with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    status, raw = call("/api/chat", {"model": "reverie", "stream": False,
                                     "messages": [{"role": "user", "content": "Hi."}]}, {})
    assert status == 200 and json.loads(raw)["message"]["content"], raw[:300]
    status, raw = call("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "listener-test", "version": "1"}}},
        {"Accept": "application/json, text/event-stream"})
    assert status == 200, raw[:300]
    assert json.loads(raw)["result"]["serverInfo"]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(_read(f"/proc/{entry}/stat").rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_dashboard_answers_the_admin_with_only_the_modules_a_hub_uses(
        embedded_runtime: Started) -> None:
    """The dashboard lists the actors (with Ray's token, 401 without), and does not
    start Ray's Data, Train, Serve and Jobs modules (a process each)."""
    port = embedded_runtime.env["REVERIE_RUNTIME__DASHBOARD_PORT"]
    token = (embedded_runtime.data_dir / "ray-auth-token").read_text().strip()
    url = f"http://127.0.0.1:{port}/api/v0/actors?limit=100"

    def get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=CLIENT_TIMEOUT_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None

    assert get(url, {})[0] == 401
    status, body = get(url, {"Authorization": f"Bearer {token}"})
    assert status == 200
    # Ray's hourly usage report to usage-stats.ray.io is off: ray.init turns it
    # off on a release wheel (RAY_USAGE_STATS_ENABLED=0), which this watches
    status, usage = get(f"http://127.0.0.1:{port}/usage_stats_enabled",
                        {"Authorization": f"Bearer {token}"})
    assert status == 200 and usage["data"]["usageStatsEnabled"] is False, usage
    classes = {a.get("class_name") for a in body["data"]["result"]["result"]}
    assert {"TranscriptActor", "RecallActor", "TurnsActor", "HttpActor"} <= classes
    names = []
    for pid in _descendants(embedded_runtime.proc.pid):
        try:
            names.append(_read(f"/proc/{pid}/cmdline").replace("\0", " "))
        except OSError:
            continue
    modules = [n for n in names if "ray-dashboard-" in n]
    assert any("StateHead" in n for n in modules), names
    assert not [n for n in modules if any(m in n for m in ("DataHead", "TrainHead",
                                                           "ServeHead", "JobHead"))]


def test_sigterm_stops_it_cleanly(embedded_runtime: Started) -> None:
    proc = embedded_runtime.proc
    assert proc.poll() is None, "".join(embedded_runtime.output)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, "".join(embedded_runtime.output)
    assert not (embedded_runtime.data_dir / "runtime.json").exists()


def test_data_is_owner_only_whatever_the_umask(embedded_runtime: Started) -> None:
    """After a write and a clean stop (which saves the vector index), every
    directory of the data dir is 0700 and every file 0600, though the runtime
    ran with umask 0."""
    assert embedded_runtime.proc.poll() is not None, "runs after the stop test"
    root = embedded_runtime.data_dir
    paths = [root, *root.rglob("*")]
    names = {p.name for p in paths}
    assert {"reverie.db", "ray-auth-token", "http-token"} <= names, sorted(names)
    assert any(p.suffix == ".hnsw" for p in paths), sorted(names)  # the index was saved
    loose = sorted(f"{p.relative_to(root)} {oct(p.stat().st_mode & 0o777)}" for p in paths
                   if p.stat().st_mode & 0o777 != (0o700 if p.is_dir() else 0o600))
    assert not loose, "not owner-only:\n  " + "\n  ".join(loose)

