"""Home Assistant discovery payloads (device/ha_discovery.py) and the shipped
Mosquitto config (configs/mosquitto.conf), run on the real broker."""

from __future__ import annotations

import json
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import typing
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
import paho.mqtt.client as mqtt
import pytest

from device import ha_discovery as ha
from runtime.config import MqttSettings
from runtime.mind import idle

MOSQUITTO = "/usr/sbin/mosquitto"
SHIPPED_CONF = Path(__file__).resolve().parent.parent / "configs" / "mosquitto.conf"
JOBS = ["consolidate", "facts", "night-owl"]
T0 = 1_700_000_000.0

SETTINGS = MqttSettings(client_id="hub.kitchen:1", topic_prefix="reverie/test",
                        discovery_prefix="ha")


def full_snapshot() -> dict[str, Any]:
    return {
        "idle": True,
        "idle_reason": "everyone-away",
        "idle_since": T0,
        "presence": {
            "alice": {"state": "home", "place": "kitchen", "since": T0 - 60},
            "bob": {"state": "home", "place": None, "since": T0 - 120.5},
            "carol": {"state": "away", "place": "work", "since": T0 - 3600},
        },
        "counts": {"turns": 120, "episodes": 14, "facts": 33, "people": 3},
        "jobs": {
            "consolidate": {"last_outcome": "ok", "last_run_at": T0 - 10},
            "facts": {"last_outcome": "failed", "last_run_at": T0 - 20},
            "night-owl": {"last_outcome": None, "last_run_at": None},
        },
        "llm_notice": "memory: language model failing (2 consecutive failures: "
                      "openai timeout); answering from memory only",
        "location_fixes": 42,
    }


def configs(settings: MqttSettings = SETTINGS) -> list[tuple[str, dict[str, Any]]]:
    return [(topic, json.loads(payload))
            for topic, payload in ha.discovery_messages(settings, JOBS, "1.2.3")]


def is_iso_utc(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return False
    return parsed.utcoffset() == timedelta(0)


# --------------------------------------------------------------------------- discovery


def test_topics_follow_the_settings() -> None:
    assert ha.node_id(SETTINGS) == "hub_kitchen_1"
    assert ha.availability_topic(SETTINGS) == "reverie/test/availability"
    assert ha.state_topic(SETTINGS) == "reverie/test/state"
    assert ha.availability_topic(MqttSettings()) == "reverie/availability"
    topic_re = re.compile(r"^ha/(sensor|binary_sensor)/hub_kitchen_1/[a-zA-Z0-9_-]+/config$")
    for topic, _ in configs():
        assert topic_re.match(topic), topic


def test_every_config_is_one_device_with_the_configured_topics() -> None:
    messages = configs()
    unique_ids = [config["unique_id"] for _, config in messages]
    assert len(unique_ids) == len(set(unique_ids))
    assert len({topic for topic, _ in messages}) == len(messages)
    for topic, config in messages:
        component, object_id = topic.split("/")[1], topic.split("/")[3]
        assert config["device"] == {
            "identifiers": ["reverie_hub_kitchen_1"], "name": "Reverie",
            "manufacturer": "Reverie", "model": "memory runtime", "sw_version": "1.2.3"}
        assert config["origin"]["name"] == "Reverie"
        assert config["availability_topic"] == "reverie/test/availability"
        assert config["payload_available"] == "online"
        assert config["payload_not_available"] == "offline"
        assert config["state_topic"] == "reverie/test/state"
        assert config["unique_id"] == f"reverie_hub_kitchen_1_{object_id}"
        # default_entity_id: "<component>.<slug>", a valid Home Assistant entity id
        assert re.match(r"^(?!.+__)(?!_)[\da-z_]+(?<!_)\.(?!_)[\da-z_]+(?<!_)$",
                        config["default_entity_id"])
        assert config["default_entity_id"] == f"{component}.{config['object_id']}"
        assert "{{" in config["value_template"]
        if "json_attributes_template" in config:
            assert config["json_attributes_topic"] == "reverie/test/state"
        # full option names only: none of Home Assistant's abbreviations
        assert not {"uniq_id", "stat_t", "avty_t", "dev", "val_tpl", "o"} & config.keys()


def test_the_entities() -> None:
    by_object = {topic.split("/")[3]: (topic.split("/")[1], config)
                 for topic, config in configs()}
    assert set(by_object) == {
        "idle", "presence", "turns", "episodes", "facts", "llm_problem", "location_fixes",
        "job_consolidate", "job_consolidate_at", "job_facts", "job_facts_at",
        "job_night-owl", "job_night-owl_at"}
    assert by_object["idle"][0] == "binary_sensor"
    assert "device_class" not in by_object["idle"][1]
    assert by_object["llm_problem"][0] == "binary_sensor"
    assert by_object["llm_problem"][1]["device_class"] == "problem"
    for key in ("turns", "episodes", "facts"):
        assert by_object[key][1]["state_class"] == "measurement"
    assert by_object["location_fixes"][1]["state_class"] == "total_increasing"
    assert by_object["job_facts_at"][1]["device_class"] == "timestamp"
    assert by_object["job_night-owl"][1]["name"] == "Last night-owl run"
    assert (by_object["job_night-owl"][1]["default_entity_id"]
            == "sensor.reverie_hub_kitchen_1_job_night_owl")
    defaults = {topic.split("/")[3]: config["default_entity_id"]
                for topic, config in configs(MqttSettings())}
    assert defaults["turns"] == "sensor.reverie_turns"


def test_bad_job_names_are_refused() -> None:
    with pytest.raises(ValueError):
        ha.discovery_messages(SETTINGS, ["consolidate", "rm -rf /"], "1")
    with pytest.raises(TypeError):
        ha.discovery_messages(SETTINGS, "consolidate", "1")


def test_removal_mirrors_the_config_topics() -> None:
    removal = ha.removal_messages(SETTINGS, JOBS)
    assert [topic for topic, _ in removal] == [topic for topic, _ in configs()]
    assert all(payload == "" for _, payload in removal)


# --------------------------------------------------------------------------- state


def test_state_payload_is_json_with_iso_times() -> None:
    state = json.loads(ha.state_payload(full_snapshot()))
    assert state["idle"] is True and state["idle_reason"] == "everyone-away"
    assert is_iso_utc(state["idle_since"])
    assert datetime.fromisoformat(state["idle_since"]).timestamp() == T0
    assert state["presence_summary"] == "2 home" and state["people_home"] == 2
    for entry in state["presence"].values():
        assert is_iso_utc(entry["since"])
    assert state["presence"]["bob"]["place"] is None
    assert state["counts"] == {"turns": 120, "episodes": 14, "facts": 33, "people": 3}
    assert is_iso_utc(state["jobs"]["facts"]["last_run_at"])
    assert state["jobs"]["night-owl"] == {"last_outcome": None, "last_run_at": None}
    assert state["location_fixes"] == 42


def test_state_payload_of_an_empty_snapshot() -> None:
    state = json.loads(ha.state_payload({}))
    assert state["idle"] is False and state["idle_reason"] == "unknown"
    assert state["idle_since"] is None and state["presence_summary"] == "0 home"
    assert state["counts"] == {"turns": None, "episodes": None, "facts": None}
    assert state["jobs"] == {} and state["llm_notice"] is None


def test_idle_reasons_match_the_idle_detector() -> None:
    reason = typing.get_type_hints(idle.IdleState)["reason"]
    assert set(typing.get_args(reason)) == set(ha.IDLE_REASONS)


_PATH = re.compile(r"value_json((?:\.[a-z_]+)+)")
_JOB_FIELD = re.compile(r'value_json\.jobs\[("[^"]+")\] \| default\(\{\}\)\)\.([a-z_]+)')


def test_every_template_key_is_in_the_state() -> None:
    """Reads the keys the templates name (dotted paths, and a job's field) from a
    state built from a full snapshot: every one must exist there."""
    state = json.loads(ha.state_payload(full_snapshot()))
    checked = 0
    for _, config in configs():
        for template in (config["value_template"], config.get("json_attributes_template", "")):
            for match in _PATH.finditer(template):
                node: Any = state
                for key in match.group(1).strip(".").split("."):
                    assert isinstance(node, dict) and key in node, (key, template)
                    node = node[key]
                    checked += 1
            for match in _JOB_FIELD.finditer(template):
                job = json.loads(match.group(1))
                assert match.group(2) in state["jobs"][job], template
                checked += 1
    assert checked > 20


def render_templates(state: str) -> dict[str, str]:
    """Renders every template with Jinja2 (as Home Assistant does, with
    ``value_json``; undefined names are errors)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    value_json = json.loads(state)
    rendered: dict[str, str] = {}
    for topic, config in configs():
        object_id = topic.split("/")[3]
        rendered[object_id] = env.from_string(config["value_template"]).render(
            value_json=value_json)
        if "json_attributes_template" in config:
            rendered[object_id + "#attributes"] = env.from_string(
                config["json_attributes_template"]).render(value_json=value_json)
    return rendered


def test_templates_render_to_what_home_assistant_expects() -> None:
    out = render_templates(ha.state_payload(full_snapshot()))
    assert out["idle"] == "ON" and out["llm_problem"] == "ON"
    assert out["presence"] == "2 home"
    assert (out["turns"], out["episodes"], out["facts"]) == ("120", "14", "33")
    assert out["location_fixes"] == "42"
    assert out["job_consolidate"] == "ok" and out["job_facts"] == "failed"
    assert out["job_night-owl"] == "never"
    assert is_iso_utc(out["job_facts_at"])
    assert out["job_night-owl_at"] == "None"  # Home Assistant's "no value"
    attributes = {k.split("#")[0]: json.loads(v) for k, v in out.items() if "#" in k}
    assert attributes["idle"] == {"idle_reason": "everyone-away",
                                  "idle_since": "2023-11-14T22:13:20+00:00"}
    assert attributes["presence"]["alice"]["place"] == "kitchen"
    assert attributes["llm_problem"]["notice"].startswith("memory: language model failing")
    assert is_iso_utc(attributes["job_consolidate"]["last_run_at"])
    # A job the state does not know yet (no run since start) reads "never", no error.
    out = render_templates(ha.state_payload({}))
    assert out["job_consolidate"] == "never" and out["job_consolidate_at"] == "None"
    assert out["idle"] == "OFF" and out["llm_problem"] == "OFF" and out["turns"] == "None"


def test_memory_content_is_never_echoed() -> None:
    secret = "Alice told me her PIN is 4411 and she hides the key under the mat"
    snapshot = full_snapshot()
    snapshot["memory"] = secret
    snapshot["last_turn"] = {"text": secret}
    snapshot["idle_reason"] = secret
    snapshot["counts"][secret] = 7
    snapshot["counts"]["recent"] = secret
    snapshot["presence"]["alice"]["note"] = secret
    snapshot["presence"]["dave"] = {"state": secret, "place": "x", "since": T0}
    snapshot["jobs"]["facts"]["error"] = secret
    snapshot["jobs"]["facts"]["last_outcome"] = secret
    snapshot["jobs"][secret] = {"last_outcome": "ok", "last_run_at": T0}
    snapshot["location_fixes"] = secret
    snapshot["idle_since"] = secret
    payload = ha.state_payload(snapshot)
    assert "4411" not in payload and "PIN" not in payload and "mat" not in payload
    state = json.loads(payload)
    assert state["idle_reason"] == "unknown" and state["idle_since"] is None
    assert state["jobs"]["facts"]["last_outcome"] == "unknown"
    assert "dave" not in state["presence"] and state["location_fixes"] is None
    assert set(state) == {"idle", "idle_reason", "idle_since", "people_home",
                          "presence_summary", "presence", "counts", "jobs", "llm_notice",
                          "location_fixes"}


# --------------------------------------------------------------------------- broker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Broker:
    """The real Mosquitto with the shipped config; only the port and the
    persistence directory are changed."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.data = Path(tempfile.mkdtemp(prefix="reverie-mosquitto-", dir="/tmp"))
        if os.geteuid() == 0:  # started as root, mosquitto drops to its own user
            user = pwd.getpwnam("mosquitto")
            os.chown(self.data, user.pw_uid, user.pw_gid)
        text = SHIPPED_CONF.read_text()
        text, listeners = re.subn(r"(?m)^listener 1883 127\.0\.0\.1$",
                                  f"listener {self.port} 127.0.0.1", text)
        text, locations = re.subn(r"(?m)^persistence_location .*$",
                                  f"persistence_location {self.data}/", text)
        assert (listeners, locations) == (1, 1), "the shipped config changed shape"
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(text)
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30  # for a broken start only: a busy machine is slow
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("mosquitto did not listen:\n" + self.log.read_text())

    def stop(self) -> None:
        """SIGTERM: mosquitto writes its database on a clean shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    assert os.access(MOSQUITTO, os.X_OK), "mosquitto is not installed (make sysdeps)"
    broker = Broker(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


class Client:
    """A paho client (v2 callbacks) on its own network thread."""

    def __init__(self, port: int, client_id: str, clean_session: bool = True) -> None:
        self.port = port
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=clean_session)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.session_present = False
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.on_message = lambda client, userdata, msg: self.messages.put(msg)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any,
                    reason_code: Any, properties: Any) -> None:
        if not reason_code.is_failure:
            self.session_present = bool(flags.session_present)
            self.connected.set()

    def connect(self) -> Client:
        self.connected.clear()
        self.client.connect("127.0.0.1", self.port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(30), "no CONNACK"  # deadlines for a broken run only
        return self

    def subscribe(self, topic: str, qos: int = 1) -> None:
        self.subscribed.clear()
        self.client.subscribe(topic, qos=qos)
        assert self.subscribed.wait(30), "no SUBACK"

    def publish(self, topic: str, payload: str, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(30)
        assert info.is_published()

    def receive(self, timeout: float = 30) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_broker_listens_on_loopback_only(broker: Broker) -> None:
    port_hex = f"{broker.port:04X}"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(":" + port_hex):  # 0A: LISTEN
                listening.append((table, local))
    assert listening == [("/proc/net/tcp", "0100007F:" + port_hex)]


def test_retained_discovery_and_state_reach_a_later_client(broker: Broker) -> None:
    bridge = Client(broker.port, "reverie-test-bridge")
    bridge.client.will_set(ha.availability_topic(SETTINGS), ha.PAYLOAD_NOT_AVAILABLE,
                           qos=1, retain=True)
    bridge.connect()
    bridge.publish(ha.availability_topic(SETTINGS), ha.PAYLOAD_AVAILABLE, retain=True)
    state = ha.state_payload(full_snapshot())
    bridge.publish(ha.state_topic(SETTINGS), state, retain=True)
    topic, config = ha.discovery_messages(SETTINGS, JOBS, "1.2.3")[0]
    bridge.publish(topic, config, retain=True)
    bridge.close()

    hass = Client(broker.port, "reverie-test-hass").connect()
    try:
        hass.subscribe("reverie/test/#")
        hass.subscribe("ha/#")
        got = {msg.topic: (msg.payload.decode(), msg.retain)
               for msg in (hass.receive(), hass.receive(), hass.receive())}
        assert got == {ha.availability_topic(SETTINGS): ("online", True),
                       ha.state_topic(SETTINGS): (state, True), topic: (config, True)}
    finally:
        hass.close()


def test_queued_qos1_message_survives_a_broker_restart(broker: Broker) -> None:
    topic = "reverie/test/fix"
    subscriber = Client(broker.port, "reverie-test-persistent", clean_session=False).connect()
    subscriber.subscribe(topic, qos=1)
    subscriber.close()  # a persistent session: the broker keeps it and queues for it

    publisher = Client(broker.port, "reverie-test-publisher").connect()
    publisher.publish(topic, "queued while away", qos=1)
    publisher.close()

    # Mosquitto writes its database only on a clean shutdown or at the autosave
    # interval (5 minutes as shipped): stop it with SIGTERM, as systemd does.
    broker.stop()
    broker.start()

    subscriber = Client(broker.port, "reverie-test-persistent", clean_session=False)
    subscriber.connect()
    try:
        assert subscriber.session_present
        msg = subscriber.receive()
        assert (msg.topic, msg.payload, msg.qos) == (topic, b"queued while away", 1)
    finally:
        subscriber.close()
