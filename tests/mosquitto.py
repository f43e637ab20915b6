"""A real Mosquitto broker on a free loopback port, and a second client to talk to it."""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """``mosquitto -c`` with persistence in ``workdir``; start, kill and start again
    (``extra_conf``: more configuration lines, e.g. :func:`dynsec_conf`'s)."""

    def __init__(self, workdir: Path, port: int | None = None, extra_conf: str = "") -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "mosquitto.conf"
        self.data = persistence_dir()
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.data}/\n"
            "max_queued_messages 100000\n"
            "log_dest stderr\n"
            "log_type error\n" + extra_conf)

    def start(self) -> Broker:
        self.proc = start_mosquitto(self.conf)
        wait_listening(self.proc, self.port)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: it saves its persistence file first)."""
        stop_process(self.proc, sig)
        self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


def start_mosquitto(conf: Path) -> subprocess.Popen[bytes]:
    """``mosquitto -c conf``, its output discarded (:func:`wait_listening` next)."""
    return subprocess.Popen([MOSQUITTO, "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    """Wait until the broker ``proc`` accepts connections on its loopback ``port``
    (within 20 s; RuntimeError if it exits first or does not; it is left running)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("mosquitto exited at start") from None
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not start")


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to ``proc`` if it still runs, give it 10 s to exit, then kill it."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def persistence_dir() -> Path:
    """A directory the broker can write its persistence file to. Started as root,
    mosquitto drops to the ``mosquitto`` user, which cannot enter pytest's
    root-only temporary directories (and a save that fails is silent until
    shutdown), so the directory is its own, under /tmp."""
    return to_broker_user(Path(tempfile.mkdtemp(prefix="reverie-mosquitto-", dir="/tmp")))


def to_broker_user(path: Path) -> Path:
    """Give ``path`` to the ``mosquitto`` user when we are root (and it exists)."""
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("mosquitto")
        except KeyError:
            return path
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


def dynsec_conf(directory: Path, username: str, password: str,
                acls: list[tuple[str, str, bool]]) -> str:
    """Configuration lines for Mosquitto's dynamic-security plugin with one client,
    ``username``, holding ``acls`` (``(acltype, topic, allow)``); everything not
    allowed is denied, subscriptions included (the SUBACK refuses them). The
    plugin's file goes in ``directory`` (one from :func:`persistence_dir`)."""
    plugin = glob.glob("/usr/lib/*/mosquitto_dynamic_security.so")
    if not plugin:
        raise RuntimeError("mosquitto_dynamic_security.so is not installed")
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    doc = {"defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False,
                                "subscribe": False, "unsubscribe": True},
           "clients": [{"username": username, "password": base64.b64encode(digest).decode(),
                        "salt": base64.b64encode(salt).decode(), "iterations": 101,
                        "roles": [{"rolename": "only"}]}],
           "roles": [{"rolename": "only",
                      "acls": [{"acltype": kind, "topic": topic, "allow": allow}
                               for kind, topic, allow in acls]}]}
    path = directory / "dynamic-security.json"
    path.write_text(json.dumps(doc))
    to_broker_user(path)
    return f"plugin {plugin[0]}\nplugin_opt_config_file {path}\n"


@contextmanager
def running_broker(workdir: Path) -> Iterator[Broker]:
    broker = Broker(workdir).start()
    try:
        yield broker
    finally:
        broker.remove()


class Client:
    """A second MQTT client: publishes what sensors would, records what it receives."""

    def __init__(self, port: int, client_id: str = "", clean: bool = True,
                 login: tuple[str, str] | None = None) -> None:
        self.received: list[mqtt.MQTTMessage] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=clean)
        if login is not None:
            self.client.username_pw_set(*login)
        self._granted: set[int] = set()  # subscription mids the broker granted
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: object,
                    msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append(msg)

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe, and wait for the broker's grant (SUBACK): a message published
        before it would not reach this client."""
        result, mid = self.client.subscribe(pattern, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        deadline = time.monotonic() + 30  # for a broken run only: a busy machine is slow
        while time.monotonic() < deadline:
            with self._lock:
                if mid in self._granted:
                    return
            time.sleep(0.01)
        raise AssertionError(f"the broker did not grant {pattern} within 30 s")

    def _on_subscribe(self, client: mqtt.Client, userdata: object, mid: int,
                      reason_codes: list[mqtt.ReasonCode], properties: object) -> None:
        with self._lock:
            if not any(code.is_failure for code in reason_codes):
                self._granted.add(mid)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1,
                retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(timeout=30)
        assert info.is_published()

    def messages(self, topic_prefix: str = "") -> list[mqtt.MQTTMessage]:
        with self._lock:
            return [m for m in self.received if m.topic.startswith(topic_prefix)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
