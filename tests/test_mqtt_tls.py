"""The MQTT bridge's credentials against a real Mosquitto: a password, TLS, a client
certificate.

The certificates are made once per session with the ``openssl`` command line (a CA,
a server certificate for 127.0.0.1, a client certificate, and a second CA that
signed none of them); each test starts its own broker with its own
``mosquitto.conf`` on a free loopback port. Started as root, mosquitto drops to the
``mosquitto`` user, so everything it reads lives in a directory of its own under
/tmp (``tests.mosquitto.persistence_dir``), removed at the end.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from actors.common import open_store
from device.mqtt_bridge import Bridge
from device.topics import TopicMap
from runtime.config import Settings
from tests.mosquitto import MOSQUITTO, free_port, persistence_dir, stop_process
from tests.pki import Pki, hand_over
from tests.test_mqtt_bridge import StoreSink, fixes, owntracks
from tests.waiting import wait_for

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"

USER = "reverie"
PASSWORD = "Pw-right-7f2c9e41"      # distinctive: searched for in logs and stats
WRONG = "Pw-wrong-0b83d5aa"
PW_VAR = "RV_TEST_MQTT_PW"
FIX_TOPIC = "owntracks/alice/phone"

# -- brokers and clients --------------------------------------------------------


class SecureBroker:
    """mosquitto with one listener configured as the test says; its log kept."""

    def __init__(self, config: str) -> None:
        self.port = free_port()
        self.home = persistence_dir()
        self.log = self.home / "mosquitto.log"
        self.conf = self.home / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\n{config}\n"
                             "persistence false\nlog_dest stderr\nlog_type all\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def file(self, name: str, text: str = "") -> Path:
        path = self.home / name
        path.write_text(text)
        return hand_over(path, private=True)

    def start(self) -> SecureBroker:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)],
                                         stdout=log, stderr=subprocess.STDOUT)
        # listening once it says so (a probing connection would show in the log)
        assert wait_for(lambda: self.proc is not None and (
            self.proc.poll() is not None or " running\n" in self.text()), 20)
        assert self.proc.poll() is None, f"mosquitto exited:\n{self.text()}"
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def refusals(self) -> int:
        """Connections the broker has turned away so far: each ends in one of these
        lines (TLS refused before or after the handshake, or MQTT refused)."""
        return len(re.findall(r"Client connection from \S+ failed|Client <unknown> disconnected",
                              self.text()))

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        shutil.rmtree(self.home, ignore_errors=True)


def publish_fix(port: int, *, username: str | None = None, password: str | None = None,
                ca: Path | None = None, cert: Path | None = None,
                key: Path | None = None) -> float:
    """A phone's OwnTracks fix, from a second client; returns the fix's time."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"phone-{port}")
    if username:
        client.username_pw_set(username, password)
    if ca:
        client.tls_set(ca_certs=str(ca), certfile=str(cert) if cert else None,
                       keyfile=str(key) if key else None)
    connected: list[Any] = []
    client.on_connect = lambda c, u, f, reason, p: connected.append(reason)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert wait_for(lambda: bool(connected), 30)
        assert not connected[0].is_failure, f"the phone was refused: {connected[0]}"
        at = time.time() - 5
        info = client.publish(FIX_TOPIC, owntracks(38.7223, -9.1393, at), qos=1)
        info.wait_for_publish(timeout=30)
        assert info.is_published()
        return at
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.fixture
def bridges(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., Any]]:
    """Start a bridge on a port with these ``[mqtt]`` settings; all stopped after."""
    started: list[Bridge] = []

    def start(port: int, **mqtt_settings: Any) -> tuple[Bridge, Any]:
        settings = make_settings(mqtt={"host": "127.0.0.1", "port": port,
                                       "client_id": f"reverie-{port}",
                                       "reconnect_min_s": 0.5, "reconnect_max_s": 1,
                                       "discovery": False, **mqtt_settings})
        store = open_store(settings)
        bridge = Bridge(settings.mqtt, TopicMap.from_settings(settings.mqtt),
                        StoreSink(open_store(settings), settings), version="test",
                        state_every_s=3600)
        bridge.start()
        started.append(bridge)
        return bridge, store

    yield start
    for bridge in started:
        bridge.stop()


@pytest.fixture
def broker() -> Iterator[Callable[[str], SecureBroker]]:
    made: list[SecureBroker] = []

    def make(config: str) -> SecureBroker:
        b = SecureBroker(config)
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop()


def refused_twice(broker: SecureBroker, bridge: Bridge) -> bool:
    """The bridge has tried, been turned away, and tried again."""
    return wait_for(lambda: broker.refusals() >= 2, 20) and not bridge.connected


def stored(store: Any, at: float) -> bool:
    return wait_for(lambda: [r["at"] for r in fixes(store)] == [int(at)], 20)


# -- a password -----------------------------------------------------------------


def password_broker(make: Callable[[str], SecureBroker]) -> SecureBroker:
    b = make("")
    passwd = b.file("passwd")
    done = subprocess.run([MOSQUITTO_PASSWD, "-b", "-c", str(passwd), USER, PASSWORD],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    hand_over(passwd, private=True)
    b.conf.write_text(b.conf.read_text()
                      + f"allow_anonymous false\npassword_file {passwd}\n")
    return b.start()


def test_password_from_the_named_variable_connects(
        broker: Callable[[str], SecureBroker], bridges: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    b = password_broker(broker)
    monkeypatch.setenv(PW_VAR, PASSWORD)
    bridge, store = bridges(b.port, username=USER, password_env=PW_VAR)
    assert wait_for(lambda: bridge.stats()["subscribed"], 20), bridge.stats()
    at = publish_fix(b.port, username=USER, password=PASSWORD)
    assert stored(store, at)
    # the bridge counts a fix after its row is written: the row can be seen first
    assert wait_for(lambda: bridge.stats()["stored"] == 1, 20), bridge.stats()
    assert bridge.stats()["error"] is None


def test_a_wrong_password_is_refused_and_never_shown(
        broker: Callable[[str], SecureBroker], bridges: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    b = password_broker(broker)
    monkeypatch.setenv(PW_VAR, WRONG)
    bridge, store = bridges(b.port, username=USER, password_env=PW_VAR)
    assert wait_for(lambda: bridge.stats()["error"] is not None, 20)
    assert refused_twice(b, bridge)
    stats = bridge.stats()
    assert not stats["connected"] and stats["connects"] == 0
    assert "refused" in stats["error"] and "not authorized" in stats["error"].lower()
    # the broker turned it away, each time
    assert b.text().count("disconnected, not authorised") >= 2
    # a phone with the right password still gets through; the bridge stores nothing
    publish_fix(b.port, username=USER, password=PASSWORD)
    assert fixes(store) == []
    shown = json.dumps(stats) + "\n".join(
        f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records  # the refusal was logged ...
    for secret in (WRONG, PASSWORD):
        assert secret not in shown  # ... without the password


def test_an_unset_password_variable_is_named_at_construction(
        bridges: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PW_VAR, raising=False)
    monkeypatch.setenv("RV_TEST_MQTT_PW_OTHER", PASSWORD)  # a neighbour, never read
    with pytest.raises(ValueError, match=PW_VAR) as raised:
        bridges(free_port(), username=USER, password_env=PW_VAR)
    assert PASSWORD not in str(raised.value)


# -- TLS ------------------------------------------------------------------------


def tls_listener(pki: Pki, extra: str = "allow_anonymous true\n") -> str:
    return (f"cafile {pki.ca}\ncertfile {pki.server_cert}\nkeyfile {pki.server_key}\n"
            + extra)


def test_tls_with_the_brokers_ca_connects(
        pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    b = broker(tls_listener(pki)).start()
    bridge, store = bridges(b.port, tls=True, ca_file=str(pki.ca))
    assert wait_for(lambda: bridge.stats()["subscribed"], 20), (bridge.stats(), b.text())
    at = publish_fix(b.port, ca=pki.ca)
    assert stored(store, at)
    assert bridge.stats()["error"] is None


def test_tls_with_another_ca_never_connects(
        pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    b = broker(tls_listener(pki)).start()
    bridge, store = bridges(b.port, tls=True, ca_file=str(pki.other_ca))
    assert refused_twice(b, bridge)
    assert bridge.stats()["connects"] == 0
    publish_fix(b.port, ca=pki.ca)  # the broker itself is fine
    assert fixes(store) == []


def test_plain_mqtt_to_a_tls_listener_never_connects(
        pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    b = broker(tls_listener(pki)).start()
    bridge, _store = bridges(b.port)
    assert refused_twice(b, bridge)
    assert bridge.stats()["connects"] == 0


@pytest.mark.parametrize("case", ["another CA", "no TLS", "no client certificate"])
def test_a_tls_refusal_is_recorded_as_the_error(
        case: str, pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    if case == "no client certificate":
        b = broker(cert_listener(pki)).start()
    else:
        b = broker(tls_listener(pki)).start()
    mqtt_settings = {"another CA": {"tls": True, "ca_file": str(pki.other_ca)},
                     "no TLS": {},
                     "no client certificate": {"tls": True, "ca_file": str(pki.ca)}}[case]
    bridge, _store = bridges(b.port, **mqtt_settings)
    assert refused_twice(b, bridge)
    error = bridge.stats()["error"]  # not None: a broken TLS set-up is not "no broker yet"
    assert isinstance(error, str) and error
    assert not bridge.stats()["connected"]


# -- a client certificate -------------------------------------------------------


def cert_listener(pki: Pki) -> str:
    return tls_listener(pki, "require_certificate true\nuse_identity_as_username true\n"
                             "allow_anonymous false\n")


def test_a_client_certificate_connects(
        pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    b = broker(cert_listener(pki)).start()
    bridge, store = bridges(b.port, tls=True, ca_file=str(pki.ca),
                            cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    assert wait_for(lambda: bridge.stats()["subscribed"], 20), (bridge.stats(), b.text())
    assert "u'reverie-bridge'" in b.text()  # the certificate's name is the user
    at = publish_fix(b.port, ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    assert stored(store, at)


@pytest.mark.parametrize("which", ["none", "another CA's"])
def test_without_a_good_client_certificate_never_connects(
        which: str, pki: Pki, broker: Callable[[str], SecureBroker],
        bridges: Callable[..., Any]) -> None:
    b = broker(cert_listener(pki)).start()
    cert = {} if which == "none" else {"cert_file": str(pki.other_client_cert),
                                       "key_file": str(pki.other_client_key)}
    bridge, store = bridges(b.port, tls=True, ca_file=str(pki.ca), **cert)
    assert refused_twice(b, bridge)
    assert bridge.stats()["connects"] == 0
    publish_fix(b.port, ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    assert fixes(store) == []
