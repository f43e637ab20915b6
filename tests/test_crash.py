"""Crash safety: an acknowledged turn is durable before the caller hears "ok",
whichever actor or process dies.

Each test starts ``reverie run`` as a user does, on a Ray node of its own (no
``--address``; never the test session's ``ray_instance``) in a session of its
own, so that every process of that runtime (the ``reverie run`` driver, the GCS,
the raylet, the agents, every actor's worker) can be found in /proc and
SIGKILLed. A streamer subprocess joins the runtime the way the CLI does
(``runtime.json`` and the token file) and sends user turns through the real
turn path (``TurnsClient.process``) on three channels at once; it prints
``ACK <request id> <turn id> <reply id>`` only after a call returned. Every
acknowledged turn must then be in the transcript (the user turn under its id
and its reply), and the database must pass ``PRAGMA integrity_check``.

This module neither imports Ray nor uses the test session's Ray; a kill only
reaches processes of the sessions it started itself (checked against the test's
own session). What a process kill cannot show is a power cut: for that the
store runs ``synchronous=FULL`` by default (``store.synchronous``), so a commit
is on disk before it is acknowledged; with NORMAL it would be safe from any
process dying (the OS keeps the WAL) but not from the power going.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import apsw
import pytest

ROOT = Path(__file__).resolve().parent.parent
REVERIE = [sys.executable, "-m", "actors.cli"]
START_TIMEOUT_S = 300.0
ACK_TIMEOUT_S = 120.0
BEFORE_KILL = 30   # acknowledged turns before the kill
AFTER_KILL = 20    # acknowledged turns after a single actor was killed (it came back)
SESSION_DIR = re.compile(r"/[^\s=,'\"]*/session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+")

# The streamer: joins the running runtime like a client command (actors.cli)
# and streams user turns, one thread per channel, until its stdin closes.
STREAMER = r"""
import hashlib, os, sys, threading, time

from actors.discovery import prepare_client_auth
from runtime.config import load_settings

settings = load_settings()
prepare_client_auth(settings)  # before Ray is imported, as `reverie` does
from actors.cli.common import Remote
from actors.messages import UserTurn

tag = sys.argv[1]
remote = Remote(settings, timeout_s=30)
lock = threading.Lock()

def say(line, stream):
    with lock:
        print(line, file=stream, flush=True)

def stream(channel):
    n = 0
    while True:
        n += 1
        rid = f"{tag}-{channel}-{n}"
        code = hashlib.sha1(rid.encode()).hexdigest()[:12]
        turn = UserTurn(channel=channel, text=f"crash turn {rid} code {code}",
                        request_id=rid)
        try:
            reply = remote.turns.process(turn)
        except Exception as exc:  # not acknowledged: the caller never heard "ok"
            say(f"FAIL {rid} {type(exc).__name__}", sys.stderr)
            time.sleep(0.2)
            continue
        say(f"ACK {rid} {reply.turn_id} {reply.reply_id}", sys.stdout)

for channel in ("chat", "voice", "cli"):
    threading.Thread(target=stream, args=(channel,), daemon=True).start()
say("READY", sys.stderr)
sys.stdin.read()
os._exit(0)
"""


def turn_text(rid: str) -> str:
    """What the streamer says for request ``rid`` (kept in step with STREAMER)."""
    return f"crash turn {rid} code {hashlib.sha1(rid.encode()).hexdigest()[:12]}"


# -- processes ---------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[3])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def session_processes(sid: int, markers: set[str]) -> dict[int, str]:
    """pid -> command line of every live process of session ``sid``, and of any
    other process naming one of ``markers`` (the Ray session directories)."""
    me = os.getpid()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):  # gone, or dead and waiting to be reaped
            continue
        line = _cmdline(pid)
        if stat[1] == sid or any(m in line for m in markers):
            found[pid] = line
    return found


def kill_session(sid: int, markers: set[str]) -> dict[int, str]:
    """SIGKILL every process of the session, all at once, until none is left;
    return the ones found first."""
    assert sid != os.getsid(0), "never the test's own session"
    first = session_processes(sid, markers)
    deadline = time.monotonic() + 30
    procs = first
    while procs:
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert time.monotonic() < deadline, f"still alive: {procs}"
        time.sleep(0.05)
        procs = session_processes(sid, markers)
    return first


class Output:
    """The lines of a pipe, read by a thread as they come."""

    def __init__(self, pipe: IO[str] | None) -> None:
        self.lines: list[str] = []
        self.done = False
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe: IO[str] | None) -> None:
        for line in pipe or []:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.done = True
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[list[str]], bool], timeout: float) -> bool:
        """Wait until ``pred(lines)`` holds; False if the pipe closed or time ran out first."""
        with self._cond:
            self._cond.wait_for(lambda: pred(self.lines) or self.done, timeout)
            return pred(self.lines)

    def wait_closed(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


@dataclass
class Runtime:
    """``reverie run`` on a Ray node of its own, in a session of its own."""

    proc: subprocess.Popen[str]
    out: Output
    markers: set[str] = field(default_factory=set)

    @property
    def sid(self) -> int:
        return self.proc.pid  # start_new_session: the session leader

    def processes(self) -> dict[int, str]:
        return session_processes(self.sid, self.markers)

    def actor_pid(self, actor: str) -> int | None:
        """The pid of the worker whose title is ``ray::<actor>`` (or ``ray::<actor>.method``)."""
        for pid, line in self.processes().items():
            title = line.split(" ", 1)[0]
            if title == f"ray::{actor}" or title.startswith(f"ray::{actor}."):
                return pid
        return None

    def kill(self) -> dict[int, str]:
        killed = kill_session(self.sid, self.markers)
        self.proc.wait(30)
        return killed


def launch(env: dict[str, str], started: list[Runtime]) -> Runtime:
    """``reverie run`` (no ``--address``), in a session of its own."""
    proc = subprocess.Popen([*REVERIE, "run"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    rt = Runtime(proc, Output(proc.stdout))
    started.append(rt)
    return rt


def running(rt: Runtime) -> Runtime:
    """``rt`` once it says it is running (its Ray session noted)."""
    if not rt.out.wait_for(lambda lines: any("Ctrl-C to stop" in ln for ln in lines),
                           START_TIMEOUT_S):
        pytest.fail(f"reverie run did not start (exit {rt.proc.poll()}):\n{rt.out.text()}")
    for line in rt.processes().values():
        rt.markers.update(SESSION_DIR.findall(line))
    assert len(rt.markers) == 1, rt.markers  # the one Ray session this runtime started
    return rt


def start(env: dict[str, str], started: list[Runtime]) -> Runtime:
    """``reverie run`` (no ``--address``); returns once it says it is running."""
    return running(launch(env, started))


@dataclass(frozen=True)
class Ack:
    rid: str
    turn_id: int
    reply_id: int


class Streamer:
    """A client subprocess streaming user turns; ``acks`` are the turns it heard "ok" for."""

    def __init__(self, env: dict[str, str], tag: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STREAMER, tag], env=env, cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self.out = Output(self.proc.stdout)
        self.err = Output(self.proc.stderr)

    def acks(self) -> list[Ack]:
        found = []
        for line in self.out.text().splitlines():
            word, rid, turn_id, reply_id = line.split()
            assert word == "ACK", line
            found.append(Ack(rid, int(turn_id), int(reply_id)))
        return found

    def failures(self) -> list[str]:
        return [ln for ln in self.err.text().splitlines() if ln.startswith("FAIL ")]

    def wait_acks(self, n: int) -> None:
        if not self.out.wait_for(lambda lines: len(lines) >= n, ACK_TIMEOUT_S):
            pytest.fail(f"{len(self.out.lines)} of {n} turns acknowledged; streamer "
                        f"(exit {self.proc.poll()}):\n{self.err.text()[-3000:]}")

    def stop(self) -> list[Ack]:
        """Close its stdin (it exits), or kill it; every line it printed is read."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.finish()

    def kill(self) -> list[Ack]:
        kill_session(self.proc.pid, set())
        self.proc.wait(30)
        return self.finish()

    def finish(self) -> list[Ack]:
        assert self.out.wait_closed(30), "the streamer's stdout never closed"
        return self.acks()


# -- checks ------------------------------------------------------------------

def check_store(db: Path, acks: list[Ack]) -> dict[str, int]:
    """Every acknowledged turn and its reply are in the transcript, and the file is
    intact. Returns the streamed request ids found, acknowledged or not."""
    conn = apsw.Connection(f"file:{db}?mode=ro",
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = {rid: (row_id, role, content) for rid, row_id, role, content in conn.execute(
            "SELECT request_id, id, role, content FROM transcript"
            " WHERE request_id IS NOT NULL")}
    finally:
        conn.close()
    lost = []
    for ack in acks:
        user = rows.get(ack.rid)
        reply = rows.get(f"reply-{ack.rid}")
        if (user != (ack.turn_id, "user", turn_text(ack.rid))
                or reply is None or reply[:2] != (ack.reply_id, "assistant")):
            lost.append((ack, user, reply))
    assert not lost, f"{len(lost)} of {len(acks)} acknowledged turns lost: {lost[:5]}"
    return {rid: v[0] for rid, v in rows.items() if not rid.startswith("reply-")}


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REVERIE, *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def check_status(env: dict[str, str], at_least: int) -> None:
    status = reverie(env, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert set(report["actors"].values()) == {"ok"}, report["actors"]
    assert report["counts"]["transcript"] >= at_least, report["counts"]


# -- fixtures ----------------------------------------------------------------

def crash_env(tmp_path: Path, model_cache: Path) -> dict[str, str]:
    """A fresh data directory, an empty user configuration, a unique namespace."""
    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "reverie.toml"
    config.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("REVERIE_", "RAY_ADDRESS", "RAY_AUTH"))}
    return {**base, "REVERIE_DATA_DIR": str(data), "REVERIE_CONFIG": str(config),
            "REVERIE_RUNTIME__NAMESPACE": f"crash-{uuid.uuid4().hex[:8]}",
            "REVERIE_RUNTIME__DASHBOARD": "false",
            "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
            "REVERIE_PERSONA__GLOBAL_DIR": str(tmp_path / "persona"),
            "REVERIE_HTTP__PORT": "0",  # a free port: 8765 may be another runtime's
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def reverie_env(tmp_path: Path, model_cache: Path) -> Iterator[dict[str, str]]:
    yield crash_env(tmp_path, model_cache)
    shutil.rmtree(tmp_path, ignore_errors=True)


def stop_all(runtimes: list[Runtime], streamers: list[Streamer]) -> None:
    """Kill what a test started, pass or fail, and remove its Ray session
    directories (Ray re-points ``session_latest`` at its next start)."""
    for streamer in streamers:
        kill_session(streamer.proc.pid, set())
        streamer.proc.wait(30)
    for rt in runtimes:
        if rt.proc.poll() is None:
            rt.proc.send_signal(signal.SIGTERM)  # a clean stop when it can
            try:
                rt.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        rt.kill()
        assert not rt.processes()
        for session in rt.markers:
            shutil.rmtree(session, ignore_errors=True)


@dataclass
class Shared:
    """One runtime for the tests that leave it running (a stale runtime file
    at its start; one actor killed and brought back): each start of a whole
    runtime costs more CPU than the rest of such a test."""

    env: dict[str, str]
    runtimes: list[Runtime] = field(default_factory=list)
    streamers: list[Streamer] = field(default_factory=list)

    def runtime(self) -> Runtime:
        """The running runtime; started now if no test started it yet."""
        if not self.runtimes:
            start(self.env, self.runtimes)
        return self.runtimes[-1]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Shared]:
    tmp = tmp_path_factory.mktemp("crash-shared")
    found = Shared(crash_env(tmp, model_cache))
    yield found
    stop_all(found.runtimes, found.streamers)
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def cleanup() -> Iterator[tuple[list[Runtime], list[Streamer]]]:
    """Whatever a test started is killed at the end, pass or fail."""
    runtimes: list[Runtime] = []
    streamers: list[Streamer] = []
    yield runtimes, streamers
    stop_all(runtimes, streamers)


# -- the tests ---------------------------------------------------------------

def test_whole_runtime_sigkilled_mid_stream_keeps_every_acknowledged_turn(
        reverie_env: dict[str, str],
        cleanup: tuple[list[Runtime], list[Streamer]]) -> None:
    runtimes, streamers = cleanup
    env = reverie_env
    db = Path(env["REVERIE_DATA_DIR"]) / "reverie.db"
    rt = start(env, runtimes)
    streamer = Streamer(env, "whole")
    streamers.append(streamer)
    streamer.wait_acks(BEFORE_KILL)

    killed = rt.kill()  # mid-stream: three turns in flight, one per channel
    acks = streamer.kill()  # whatever it printed had been acknowledged before the kill
    titles = {line.split(" ", 1)[0] for line in killed.values()}
    assert {"ray::TranscriptActor", "ray::TurnsActor"} <= {t.split(".")[0] for t in titles}
    assert any("raylet" in line for line in killed.values()), killed
    assert any("gcs_server" in line for line in killed.values()), killed
    assert rt.proc.returncode == -signal.SIGKILL
    assert len(acks) >= BEFORE_KILL
    # the runtime died without cleaning up: its runtime.json is stale
    assert (Path(env["REVERIE_DATA_DIR"]) / "runtime.json").exists()

    restarted = start(env, runtimes)  # a stale runtime.json must not stop it
    streamed = check_store(db, acks)
    print(f"\n{len(killed)} processes killed; {len(acks)} turns acknowledged, "
          f"{len(streamed) - len(acks)} more committed but never acknowledged; "
          f"{len(streamer.failures())} calls failed")
    check_status(env, at_least=2 * len(acks))
    last = acks[-1]
    found = reverie(env, "recall", turn_text(last.rid), "--json")
    assert found.returncode == 0, found.stderr
    assert f"turn:{last.turn_id}" in [i["ref"] for i in json.loads(found.stdout)["items"]]

    after = Streamer(env, "after")  # the restarted runtime takes turns again
    streamers.append(after)
    after.wait_acks(5)
    check_store(db, acks + after.stop())
    assert restarted.proc.poll() is None


RAY_REGISTER_S = 30.0  # what ray._private.node gives a new node to register
RAY_AGENT_PORT_S = 15.0  # what the raylet gives its dashboard agent to write its port
# Ray's own fault-injection setting (its tests use it): the GCS handles each
# RegisterNode call this long after it arrives, so the node registers later
# than Ray's 30 s, every time (a raylet stopped once seen raced its
# registration: when it had registered already, the driver failed instead on
# the stopped raylet).
LATE_REGISTRATION_S = RAY_REGISTER_S + 15
_LATE_US = int(LATE_REGISTRATION_S * 1e6)
LATE_REGISTRATION = f"NodeInfoGcsService.grpc_server.RegisterNode={_LATE_US}:{_LATE_US}"


def _first_process(rt: Runtime, deadline: float, found: Callable[[str], bool]) -> int:
    """The pid of the runtime's first process whose command line ``found`` accepts."""
    while True:
        assert rt.proc.poll() is None and time.monotonic() < deadline, rt.out.text()
        pid = next((pid for pid, line in rt.processes().items() if found(line)), None)
        if pid is not None:
            return pid
        time.sleep(0.05)


def _is_dashboard_agent(line: str) -> bool:
    """``python -u …/ray/dashboard/agent.py …``, or once it has set its title,
    ``ray::DashboardAgent`` (the raylet's own command line names the file too)."""
    words = line.split()
    return bool(words) and (words[0] == "ray::DashboardAgent"
                            or any(w.endswith("/ray/dashboard/agent.py") for w in words[1:3]))


def test_a_node_slower_to_register_than_rays_30_s_still_starts(
        reverie_env: dict[str, str],
        cleanup: tuple[list[Runtime], list[Streamer]]) -> None:
    """A hub loaded by other work can take longer than Ray's fixed 30 s for its
    new raylet to register with the GCS (seen under a CPU hog): here the GCS
    answers the registration ``LATE_REGISTRATION_S`` (45 s) late. Ray alone
    gives up then (exit 3, "The current node timed out during startup").

    And its dashboard agent can take longer than the raylet's fixed 15 s to
    import and write its HTTP port (seen in a suite run: 0.9 s late, and the
    raylet aborted): here the agent is stopped as soon as it appears, for
    longer than that; the raylet, told the port (``with_agent_listen_port``),
    does not wait for it."""
    runtimes, _ = cleanup
    rt = launch({**reverie_env, "RAY_testing_asio_delay_us": LATE_REGISTRATION}, runtimes)
    began = time.monotonic()
    agent = _first_process(rt, began + START_TIMEOUT_S, _is_dashboard_agent)
    os.kill(agent, signal.SIGSTOP)
    try:
        assert not rt.out.wait_closed(RAY_AGENT_PORT_S + 10), rt.out.text()  # still starting
    finally:
        os.kill(agent, signal.SIGCONT)
    running(rt)
    assert time.monotonic() - began > LATE_REGISTRATION_S  # it did register late
    check_status(reverie_env, 0)


def test_stale_runtime_file_whose_pid_was_reused_does_not_block_a_start(
        shared: Shared) -> None:
    """After a power cut or a container restart the pid in runtime.json is often
    held by another process (in a container, by the new ``reverie run`` itself):
    the file is still stale, and the runtime must start. And a client finding a
    file whose process runs but whose Ray node is gone says so, without hanging.
    The runtime it starts stays for the single-actor kills below."""
    from actors.discovery import process_start

    if shared.runtimes:
        pytest.skip("the shared runtime is running already (run this test first)")
    reverie_env = shared.env
    data = Path(reverie_env["REVERIE_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    live = {"address": "127.0.0.1:9", "namespace": reverie_env["REVERIE_RUNTIME__NAMESPACE"],
            "pid": os.getpid(), "pid_start": process_start(os.getpid()),
            "auth": "token-file", "started_at": time.time() - 86400}
    (data / "runtime.json").write_text(json.dumps(live))
    asked = subprocess.run([*REVERIE, "status"], env=reverie_env, capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert asked.returncode == 1 and "not answering" in asked.stderr, asked.stderr
    # the same pid, but another process's start time: the writer is gone
    stale = {**live, "pid_start": 1}
    (data / "runtime.json").write_text(json.dumps(stale))
    start(reverie_env, shared.runtimes)


@pytest.mark.parametrize("actor", ["TranscriptActor", "TurnsActor"])
def test_one_actor_sigkilled_mid_stream_keeps_every_acknowledged_turn(
        actor: str, shared: Shared) -> None:
    env = shared.env
    rt = shared.runtime()
    streamer = Streamer(env, actor)
    shared.streamers.append(streamer)
    streamer.wait_acks(BEFORE_KILL)

    pid = rt.actor_pid(actor)
    assert pid is not None, rt.processes()
    os.kill(pid, signal.SIGKILL)
    at_kill = len(streamer.out.lines)
    streamer.wait_acks(at_kill + AFTER_KILL)  # Ray restarted it: turns are answered again
    acks = streamer.stop()

    again = rt.actor_pid(actor)
    assert again is not None and again != pid
    assert rt.proc.poll() is None
    streamed = check_store(Path(env["REVERIE_DATA_DIR"]) / "reverie.db", acks)
    print(f"\n{actor} (pid {pid}) killed after {at_kill} acknowledged turns; "
          f"{len(acks)} acknowledged in all, {len(streamed) - len(acks)} more committed "
          f"but never acknowledged; {len(streamer.failures())} calls failed")
    check_status(env, at_least=2 * len(acks))
