"""The MQTT bridge against a real Mosquitto: real payloads in, real SQLite behind.

The sink here writes through the same store functions the actors call
(``runtime.memories.location.store_fixes``, ``runtime.mind.registry.record_presence``); the path
through the actors and ``reverie run`` is in ``test_edge_runtime.py``.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.common import open_store
from device import ha_discovery
from device.mqtt_bridge import Bridge
from device.records import LocationRecord, PresenceRecord
from device.topics import TopicMap
from runtime.config import CONFIG_DIR, MqttSettings, Settings
from runtime.memories import location
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.mind import registry as jobs
from runtime.mind.idle import idle_state
from runtime.store.database import Store
from tests.mosquitto import (
    Broker,
    Client,
    dynsec_conf,
    free_port,
    persistence_dir,
    start_mosquitto,
    wait_listening,
)
from tests.waiting import wait_for

NOW = 1_790_000_000.0  # the fixes' times are near the real clock: the bridge checks them


class StoreSink:
    """Writes what the bridge hands over into a real store (one thread at a time)."""

    def __init__(self, db: Store, settings: Settings) -> None:
        self.db = db
        self.profiles = MemoryProfiles.load(settings.memory.profiles_file)
        self.lock = threading.Lock()
        self.fail = False
        self.batches = 0

    def store(self, fixes: Sequence[LocationRecord],
              presence: Sequence[PresenceRecord]) -> None:
        if self.fail:
            raise ConnectionError("store down")
        with self.lock:
            location.store_fixes(self.db, fixes, self.profiles)
            for rec in presence:
                jobs.record_presence(self.db, rec.person, rec.state, rec.at, rec.place,
                                     rec.source)
                if rec.activity:
                    jobs.record_activity(self.db, rec.at)
            self.batches += 1

    def snapshot(self) -> Mapping[str, Any]:
        return {"idle": True, "idle_reason": "quiet", "idle_since": None, "presence": {},
                "counts": {"turns": 0, "episodes": 0, "facts": 0},
                "jobs": {"consolidate": {"last_outcome": None, "last_run_at": None}},
                "llm_notice": None, "location_fixes": 0}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker").start()
    yield b
    b.remove()


@pytest.fixture
def env(tmp_path: Path, broker: Broker, make_settings: Any) -> Iterator[dict[str, Any]]:
    # the packaged mapping, plus sensors only some of which are known
    topics = tmp_path / "topics.toml"
    topics.write_text('[[topics]]\npattern = "sensors/#"\nadapter = "zigbee2mqtt"\n'
                      'names = { hall = "household" }\n\n'
                      + (CONFIG_DIR / "topics.toml").read_text())
    settings: Settings = make_settings(mqtt={"host": "127.0.0.1", "port": broker.port,
                                             "topics_file": str(topics),
                                             "client_id": f"reverie-{broker.port}",
                                             "reconnect_min_s": 0.5, "reconnect_max_s": 2})
    store = open_store(settings)
    # the sink's own connection: the bridge's writer thread is not the test's thread
    sink = StoreSink(open_store(settings), settings)
    bridge = Bridge(settings.mqtt, TopicMap.from_settings(settings.mqtt), sink,
                    jobs=["consolidate"], version="test", state_every_s=3600)
    bridge.start()
    # subscribed, not only connected: a sensor's message sent before the broker
    # granted the subscriptions goes nowhere
    assert wait_for(lambda: bridge.stats()["subscribed"], 30)
    sensor = Client(broker.port)
    try:
        yield {"settings": settings, "store": store, "sink": sink, "bridge": bridge,
               "sensor": sensor, "broker": broker}
    finally:
        sensor.close()
        bridge.stop()


def owntracks(lat: float, lon: float, tst: float, **extra: Any) -> str:
    return json.dumps({"_type": "location", "lat": lat, "lon": lon, "tst": int(tst),
                       "acc": 12, "tid": "al", **extra})


def fixes(store: Store) -> list[dict[str, Any]]:
    return store.rows("SELECT * FROM location_fixes ORDER BY at, id")


def test_owntracks_fixes_land_in_the_store_and_backfill_turns(env: dict[str, Any]) -> None:
    import time

    store, sensor, bridge = env["store"], env["sensor"], env["bridge"]
    now = time.time()
    turns = TranscriptService(store, env["sink"].profiles)
    spoken = turns.append(TurnIn(channel="chat", source="user", speaker="alice",
                                 content="I am at the bakery", created_at=now - 60))
    other = turns.append(TurnIn(channel="chat", source="user", speaker="bob",
                                content="and I am at home", created_at=now - 60))
    muted = turns.append(TurnIn(channel="chat", source="delegate:x", speaker="alice",
                                content="delegated", created_at=now - 60))
    sensor.publish("owntracks/alice/phone", owntracks(38.7223, -9.1393, now - 30))
    sensor.publish("owntracks/alice/phone", owntracks(38.7230, -9.1400, now - 10))
    assert wait_for(lambda: len(fixes(store)) == 2, 20)
    rows = fixes(store)
    assert [(r["person"], r["lat"], r["lon"], r["source"], r["device"]) for r in rows] == [
        ("alice", 38.7223, -9.1393, "owntracks", "phone"),
        ("alice", 38.7230, -9.1400, "owntracks", "phone")]
    assert rows[0]["at"] == int(now - 30) and rows[0]["accuracy_m"] == 12
    turn = store.row("SELECT lat, lon FROM transcript WHERE id = ?", (spoken,))
    assert turn == {"lat": 38.7223, "lon": -9.1393}  # the first fix in the window
    # another speaker's turn, and a source whose profile does not allow it, stay empty
    assert store.scalar("SELECT lat FROM transcript WHERE id = ?", (other,)) is None
    assert store.scalar("SELECT lat FROM transcript WHERE id = ?", (muted,)) is None
    # a turn spoken after a fix takes the live location
    later = turns.append(TurnIn(channel="chat", source="user", speaker="Alice",
                                content="now where am I", created_at=now))
    assert store.row("SELECT lat, lon FROM transcript WHERE id = ?", (later,)) == {
        "lat": 38.7230, "lon": -9.1400}
    assert bridge.stats()["accepted"] == 2 and bridge.stats()["rejected"] == {}


def test_presence_from_sensors_moves_the_idle_gate(env: dict[str, Any]) -> None:
    import time

    store, sensor = env["store"], env["sensor"]
    now = time.time()
    sensor.publish("espresense/companion/alice", json.dumps({"room": "kitchen"}))
    sensor.publish("homeassistant/person/bob/state", "not_home")
    assert wait_for(lambda: len(jobs.load_presence(store)) == 2, 20)
    report = jobs.presence_report(store)
    assert report["alice"]["state"] == "home" and report["alice"]["place"] == "kitchen"
    assert report["bob"]["state"] == "away"
    # a phone being home is presence, not activity: the household may go idle
    idle_after = 1800.0
    gate = idle_state(jobs.load_activity(store), jobs.load_presence(store), now + idle_after + 5,
                      idle_after)
    assert gate.idle
    # both away: idle at once
    sensor.publish("espresense/companion/alice", json.dumps({"room": "not_home"}))
    assert wait_for(lambda: jobs.presence_report(store)["alice"]["state"] == "away", 20)
    gate = idle_state(jobs.load_activity(store), jobs.load_presence(store), time.time(),
                      idle_after)
    assert gate.idle and gate.reason == "everyone-away"
    # motion at home is activity: the gate closes
    sensor.publish("zigbee2mqtt/hall_motion", json.dumps({"occupancy": True, "battery": 90}))
    assert wait_for(lambda: jobs.load_activity(store) is not None, 20)
    gate = idle_state(jobs.load_activity(store), jobs.load_presence(store), time.time(),
                      idle_after)
    assert not gate.idle and gate.reason == "active"
    assert jobs.presence_report(store)["household"]["place"] == "hall_motion"


def test_bad_payloads_are_counted_and_the_bridge_lives_on(env: dict[str, Any]) -> None:
    import time

    store, sensor, bridge = env["store"], env["sensor"], env["bridge"]
    sensor.publish("owntracks/alice/phone", owntracks(1.0, 2.0, time.time() - 5))
    assert wait_for(lambda: len(fixes(store)) == 1, 20)
    before = fixes(store)
    bad = [
        ("owntracks/alice/phone", b"{not json"),
        ("owntracks/alice/phone", json.dumps({"_type": "location", "lat": "x", "lon": 1,
                                              "tst": 1}).encode()),
        ("owntracks/alice/phone", b'{"_type": "location", "lat": NaN, "lon": 1, "tst": 1}'),
        ("owntracks/alice/phone", owntracks(91.0, 0.0, time.time()).encode()),
        ("owntracks/alice/phone", owntracks(1.0, 2.0, time.time() + 86400).encode()),
        ("owntracks/alice/phone", json.dumps({"_type": "location", "lon": 1, "tst": 1}).encode()),
        ("zigbee2mqtt/hall", b"x" * (env["settings"].mqtt.max_payload_bytes + 1)),
        ("sensors/garage", json.dumps({"occupancy": True}).encode()),
    ]
    for topic, payload in bad:
        sensor.publish(topic, payload)
    expected = {"malformed-json": 1, "wrong-type": 1, "bad-coordinates": 2,
                "bad-timestamp": 1, "missing-field": 1, "too-large": 1, "unknown-topic": 1}
    assert wait_for(lambda: bridge.stats()["rejected"] == expected, 20), sorted(
        bridge.stats()["rejected"].items())
    assert fixes(store) == before  # nothing stored, nothing touched
    sensor.publish("owntracks/alice/phone", owntracks(3.0, 4.0, time.time() - 1))
    assert wait_for(lambda: len(fixes(store)) == 2, 20)
    assert bridge.connected


def test_discovery_is_retained_and_sent_again_when_home_assistant_comes_online(
        env: dict[str, Any]) -> None:
    settings: MqttSettings = env["settings"].mqtt
    broker: Broker = env["broker"]
    config_topics = {t for t, _ in ha_discovery.discovery_messages(settings, ["consolidate"],
                                                                   "test")}
    probe = Client(broker.port)  # wait until the bridge has published them
    probe.subscribe(f"{settings.discovery_prefix}/#")
    assert wait_for(lambda: {m.topic for m in probe.messages(settings.discovery_prefix)}
                    >= config_topics, 20)
    probe.close()
    # a client connecting later gets every config, retained, and the availability
    late = Client(broker.port)
    try:
        late.subscribe(f"{settings.discovery_prefix}/#")
        late.subscribe(ha_discovery.availability_topic(settings))
        late.subscribe(ha_discovery.state_topic(settings))
        assert wait_for(lambda: {m.topic for m in late.messages(settings.discovery_prefix)}
                        >= config_topics, 20)
        assert all(m.retain for m in late.messages(settings.discovery_prefix))
        assert wait_for(lambda: bool(late.messages(ha_discovery.state_topic(settings))), 20)
        assert wait_for(lambda: bool(late.messages(ha_discovery.availability_topic(settings))),
                        20)
        avail = late.messages(ha_discovery.availability_topic(settings))
        assert avail[-1].payload == b"online" and avail[-1].retain
        state = late.messages(ha_discovery.state_topic(settings))
        assert state[-1].retain and json.loads(state[-1].payload)["idle"] is True
        # Home Assistant restarts: it says online, and everything comes again, not
        # retained now (sent live to a subscriber that is already there). Waited for
        # by topic: a count is met early by a topic that comes twice (the state topic is
        # under the same prefix, and is sent again too).
        seen = len(late.messages(settings.discovery_prefix))

        def resent() -> set[str]:
            return {m.topic for m in late.messages(settings.discovery_prefix)[seen:]
                    if not m.retain}

        env["sensor"].publish(f"{settings.discovery_prefix}/status", "online")
        assert wait_for(lambda: resent() >= config_topics, 20), sorted(
            config_topics - resent())
    finally:
        late.close()


def test_last_will_says_offline_when_the_bridge_vanishes(env: dict[str, Any]) -> None:
    settings: MqttSettings = env["settings"].mqtt
    watcher = Client(env["broker"].port)
    try:
        watcher.subscribe(ha_discovery.availability_topic(settings))
        assert wait_for(lambda: any(m.payload == b"online" for m in watcher.messages()), 20)
        bridge: Bridge = env["bridge"]
        bridge.client._sock.close()  # type: ignore[union-attr]  # the connection dies uncleanly
        assert wait_for(lambda: any(m.payload == b"offline" for m in watcher.messages()), 60)
        # and it comes back by itself
        assert wait_for(lambda: watcher.messages()[-1].payload == b"online", 60)
    finally:
        watcher.close()


def test_a_broker_restart_loses_no_qos1_message_sent_while_reconnecting(
        env: dict[str, Any]) -> None:
    import time

    store, broker, bridge = env["store"], env["broker"], env["bridge"]
    env["sensor"].close()
    base = time.time() - 500
    broker.stop()  # SIGTERM: the broker saves the bridge's persistent session
    assert wait_for(lambda: not bridge.connected, 20)
    # Back with the same persistence, but listening only on a port the bridge does
    # not know: however slowly the messages go in, the bridge is still reconnecting
    # (a timing race before: under load it could be back before the last one).
    own = broker.conf.read_text()
    side = free_port()
    broker.conf.write_text(own.replace(f"listener {broker.port} ", f"listener {side} "))
    broker.proc = start_mosquitto(broker.conf)
    wait_listening(broker.proc, side)
    sensor = Client(side)
    try:
        for i in range(200):
            sensor.publish("owntracks/alice/phone", owntracks(10.0 + i / 1000, 20.0, base + i))
    finally:
        sensor.close()
    assert not bridge.connected and bridge.stats()["connects"] == 1
    assert fixes(store) == []
    broker.stop()  # saved again, the 200 queued for the bridge's session
    broker.conf.write_text(own)
    broker.start()
    assert wait_for(lambda: len(fixes(store)) == 200, 60), len(fixes(store))
    assert bridge.stats()["connects"] >= 2
    assert sorted(r["at"] for r in fixes(store)) == [int(base) + i for i in range(200)]


def test_a_failing_store_acknowledges_nothing_and_loses_nothing(env: dict[str, Any]) -> None:
    import time

    store, sink, sensor, bridge = env["store"], env["sink"], env["sensor"], env["bridge"]
    sink.fail = True
    base = time.time() - 100
    for i in range(5):
        sensor.publish("owntracks/alice/phone", owntracks(1.0, 2.0 + i, base + i))
    assert wait_for(lambda: (bridge.stats()["error"] or "").startswith("store failed"), 20)
    assert fixes(store) == []
    sink.fail = False
    assert wait_for(lambda: len(fixes(store)) == 5, 30)
    assert bridge.stats()["error"] is None


payloads = st.one_of(
    st.binary(max_size=300),
    st.dictionaries(st.sampled_from(["_type", "lat", "lon", "tst", "acc", "room", "occupancy",
                                     "latitude", "longitude", "gps_accuracy", "event"]),
                    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                              st.text(max_size=20), st.sampled_from(["location", "transition"])),
                    max_size=6).map(lambda d: json.dumps(d).encode()),
)
topics = st.sampled_from(["owntracks/a/p", "owntracks/a/p/event", "zigbee2mqtt/hall",
                          "espresense/companion/a", "homeassistant/person/a/state",
                          "homeassistant/binary_sensor/door/state",
                          "homeassistant/device_tracker/a/attributes", "sensors/garage",
                          "sensors/hall"])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(topics, payloads), min_size=1, max_size=3))
def test_fuzz_the_live_bridge(env: dict[str, Any], batch: list[tuple[str, bytes]]) -> None:
    """Generated payloads through the real broker: each is accepted or counted as
    rejected, and the bridge keeps connected."""
    bridge: Bridge = env["bridge"]
    before = bridge.stats()
    seen_before = before["accepted"] + sum(before["rejected"].values())
    for topic, payload in batch:
        env["sensor"].publish(topic, payload, qos=1)

    def counted() -> bool:
        s = bridge.stats()
        return s["accepted"] + sum(s["rejected"].values()) == seen_before + len(batch)

    assert wait_for(counted, 20), (bridge.stats(), before)
    assert bridge.connected


def test_patterns_the_broker_refuses_are_named_and_the_rest_still_flow(
        tmp_path: Path, make_settings: Any, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker (dynamic security) that lets the bridge's user subscribe only to
    OwnTracks: its SUBACK refuses every other pattern, the bridge says which, and
    OwnTracks fixes still arrive."""
    import logging
    import time

    plugin_dir = persistence_dir()  # the broker drops to its own user before reading it
    conf = dynsec_conf(plugin_dir, "hub", "hub-secret", [
        ("subscribePattern", "owntracks/#", True),
        ("publishClientReceive", "owntracks/#", True),
        ("publishClientSend", "#", True)])
    broker = Broker(tmp_path / "broker", extra_conf=conf).start()
    monkeypatch.setenv("HUB_MQTT_PASSWORD", "hub-secret")
    settings: Settings = make_settings(mqtt={"host": "127.0.0.1", "port": broker.port,
                                             "client_id": f"reverie-{broker.port}",
                                             "username": "hub",
                                             "password_env": "HUB_MQTT_PASSWORD"})
    topics = TopicMap.from_settings(settings.mqtt)
    patterns = [*topics.subscriptions(), f"{settings.mqtt.discovery_prefix}/status"]
    refused = [p for p in patterns if not p.startswith("owntracks/")]
    assert refused and len(refused) < len(patterns)
    sink = StoreSink(open_store(settings), settings)
    bridge = Bridge(settings.mqtt, topics, sink, state_every_s=3600)
    caplog.set_level(logging.WARNING, logger="device.mqtt_bridge")
    bridge.start()
    sensor: Client | None = None
    try:
        assert wait_for(lambda: bridge.stats()["subscribed"], 30), bridge.stats()
        assert bridge.stats()["error"] == (f"subscription refused by the broker for"
                                           f" {len(refused)} of {len(patterns)} topic patterns")
        warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(warned) == 1 and all(p in warned[0] for p in refused)
        assert not any(p in warned[0] for p in patterns if p not in refused)
        sensor = Client(broker.port, login=("hub", "hub-secret"))
        sensor.publish("owntracks/alice/phone", owntracks(1.0, 2.0, time.time() - 10))
        assert wait_for(lambda: bridge.stats()["stored"] == 1, 20), bridge.stats()
    finally:
        if sensor is not None:
            sensor.close()
        bridge.stop()
        broker.remove()
        shutil.rmtree(plugin_dir, ignore_errors=True)
