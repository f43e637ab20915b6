"""The edge adapters and the topic map: real device payloads to records, every
rejection reason, the topics file, and fuzzing that nothing but ``Rejected``
ever escapes and nothing out of range ever comes out."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from device.adapters import (
    HOME_REGIONS,
    HOUSEHOLD,
    PARSERS,
    owntracks,
    person_resolver,
)
from device.records import REASONS, LocationRecord, PresenceRecord, Record, Rejected
from device.topics import TopicMap, load_topics, valid_filter
from runtime.config import ADAPTERS, CONFIG_DIR, ConfigError, MqttSettings, MqttTopic

# OwnTracks samples keep their own fix time; "now" is a minute later.
TST = 1_700_000_000
NOW = TST + 60.0

DEFAULT = MqttSettings()
TOPICS = TopicMap.from_settings(DEFAULT)


def parse(topic: str, payload: bytes | str | dict[str, Any], now: float = NOW,
          tm: TopicMap = TOPICS) -> list[Record]:
    if isinstance(payload, dict):
        payload = json.dumps(payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return tm.parse(topic, payload, now)


def rejected(topic: str, payload: bytes | str | dict[str, Any], now: float = NOW,
             tm: TopicMap = TOPICS) -> str:
    with pytest.raises(Rejected) as info:
        parse(topic, payload, now, tm)
    assert info.value.reason in REASONS
    return info.value.reason


def topic_map(tmp_path: Path, toml: str, **mqtt: Any) -> TopicMap:
    path = tmp_path / "topics.toml"
    path.write_text(toml)
    return TopicMap.from_settings(MqttSettings(topics_file=path, **mqtt))


# --- real payloads ---------------------------------------------------------------

# The OwnTracks booklet's location message (docs/tech/json.md), as an Android
# phone publishes it to owntracks/<user>/<device>.
OT_LOCATION = {"_type": "location", "acc": 13, "alt": 27, "batt": 92, "bs": 1, "conn": "w",
               "created_at": TST + 5, "lat": 48.856826, "lon": 2.292713, "tid": "p1",
               "tst": TST, "vac": 4, "vel": 0, "t": "u", "inregions": ["Eiffel"]}
# The booklet's transition (owntracks/<user>/<device>/event).
OT_TRANSITION = {"_type": "transition", "wtst": 1_452_937_617, "lat": 52.3737,
                 "lon": 4.87695, "tst": TST, "acc": 65, "tid": "j0", "event": "leave",
                 "desc": "work", "t": "c"}


def test_owntracks_location() -> None:
    assert parse("owntracks/jane/phone", OT_LOCATION) == [LocationRecord(
        person="jane", lat=48.856826, lon=2.292713, at=TST, source="owntracks",
        accuracy_m=13.0, device="phone", place="Eiffel")]
    minimal = {"_type": "location", "lat": -33.8688, "lon": 151.2093, "tst": TST}
    assert parse("owntracks/jane/phone", minimal) == [LocationRecord(
        person="jane", lat=-33.8688, lon=151.2093, at=TST, source="owntracks",
        device="phone")]


def test_owntracks_transition_elsewhere_is_a_located_event() -> None:
    assert parse("owntracks/jane/phone/event", OT_TRANSITION) == [LocationRecord(
        person="jane", lat=52.3737, lon=4.87695, at=TST, source="owntracks",
        accuracy_m=65.0, device="phone", place="work", event="leave")]


@pytest.mark.parametrize(("event", "state"), [("enter", "home"), ("leave", "away")])
def test_owntracks_home_transition_is_presence_too(event: str, state: str) -> None:
    msg = {**OT_TRANSITION, "event": event, "desc": "Home"}
    location, presence = parse("owntracks/jane/phone/event", msg)
    assert isinstance(location, LocationRecord) and location.event == event
    assert presence == PresenceRecord(person="jane", state=state, at=TST,  # type: ignore[arg-type]
                                      source="owntracks", place="Home")


def test_owntracks_home_regions_keyword() -> None:
    assert "home" in HOME_REGIONS
    entry = MqttTopic(pattern="owntracks/+/+/event", adapter="owntracks")
    msg = json.dumps({**OT_TRANSITION, "event": "enter", "desc": "Casa"}).encode()
    resolve = person_resolver(entry, {})
    plain = owntracks(entry, "owntracks/ana/phone/event", msg, NOW, resolve)
    assert [type(r) for r in plain] == [LocationRecord]
    custom = owntracks(entry, "owntracks/ana/phone/event", msg, NOW, resolve,
                       home_regions=("casa",))
    assert custom[1] == PresenceRecord(person="ana", state="home", at=TST,
                                       source="owntracks", place="Casa")


def test_owntracks_transition_without_position() -> None:
    """The booklet marks lat/lon optional on transitions (a beacon region)."""
    beacon = {"_type": "transition", "tst": TST, "event": "enter", "desc": "home",
              "t": "b", "acc": 0}
    assert parse("owntracks/jane/phone/event", beacon) == [PresenceRecord(
        person="jane", state="home", at=TST, source="owntracks", place="home")]
    assert parse("owntracks/jane/phone/event", {**beacon, "desc": "office"}) == []


@pytest.mark.parametrize("kind", ["lwt", "card", "status", "waypoint", "waypoints", "cmd",
                                  "steps", "encrypted"])
def test_owntracks_other_types_record_nothing(kind: str) -> None:
    msg = {"_type": kind, "tst": TST}
    if kind == "card":
        msg |= {"name": "Jane", "face": "iVBORw0KGgo="}
    if kind == "encrypted":
        msg |= {"data": "Ym9ndXM="}
    assert parse("owntracks/jane/phone", msg) == []


# Home Assistant's MQTT device tracker docs: the JSON attributes topic.
HA_ATTRIBUTES = {"latitude": 32.87336, "longitude": -117.22743, "gps_accuracy": 1.2}


def test_ha_tracker() -> None:
    topic = "homeassistant/device_tracker/a4567d663eaf/attributes"
    assert parse(topic, HA_ATTRIBUTES) == [LocationRecord(
        person="a4567d663eaf", lat=32.87336, lon=-117.22743, at=NOW, source="ha_tracker",
        accuracy_m=1.2, device="a4567d663eaf")]
    iso = {**HA_ATTRIBUTES, "last_updated": "2023-11-14T22:13:20+00:00"}
    assert parse(topic, iso)[0].at == TST
    epoch = {**HA_ATTRIBUTES, "timestamp": TST + 0.5}
    assert parse(topic, epoch)[0].at == TST + 0.5
    zulu = {"latitude": 0, "longitude": 0, "last_updated": "2023-11-14T23:13:20+01:00"}
    assert parse(topic, zulu)[0].at == TST


def test_ha_tracker_id_is_the_level_before_attributes_else_the_last(tmp_path: Path) -> None:
    tm = topic_map(tmp_path, '[[topics]]\npattern = "trackers/#"\nadapter = "ha_tracker"\n')
    assert parse("trackers/van/attributes", HA_ATTRIBUTES, tm=tm)[0].person == "van"
    assert parse("trackers/x/bike", HA_ATTRIBUTES, tm=tm)[0].person == "bike"


@pytest.mark.parametrize(("payload", "expected"), [
    (b"home", [PresenceRecord(person="alice", state="home", at=NOW, source="ha_person")]),
    (b"not_home", [PresenceRecord(person="alice", state="away", at=NOW, source="ha_person")]),
    (b"Work", [PresenceRecord(person="alice", state="away", at=NOW, source="ha_person",
                              place="Work")]),
    (b'"home"\n', [PresenceRecord(person="alice", state="home", at=NOW, source="ha_person")]),
    (b"unknown", []),
    (b"unavailable", []),
])
def test_ha_person_statestream(payload: bytes, expected: list[Record]) -> None:
    assert parse("homeassistant/person/alice/state", payload) == expected


def test_ha_binary_sensor_statestream() -> None:
    topic = "homeassistant/binary_sensor/hallway_motion/state"
    assert parse(topic, b"on") == [PresenceRecord(
        person=HOUSEHOLD, state="home", at=NOW, source="ha_binary_sensor",
        place="hallway_motion", activity=True)]
    assert parse(topic, b"ON ") == parse(topic, b"on")
    assert parse(topic, b"off") == []
    assert parse(topic, b"unavailable") == []


# Zigbee2MQTT: an Aqara RTCGQ11LM motion sensor's state, and a Tuya mmWave
# presence sensor's (occupancy / presence are the exposed binary properties).
Z2M_MOTION = {"battery": 100, "voltage": 3025, "illuminance": 33, "illuminance_lux": 33,
              "linkquality": 123, "occupancy": True, "device_temperature": 26,
              "power_outage_count": 5}
Z2M_MMWAVE = {"presence": True, "target_distance": 1.42, "illuminance_lux": 120,
              "linkquality": 156, "fading_time": 30, "motion_state": "small"}


def test_zigbee2mqtt_occupancy_and_presence() -> None:
    expected = PresenceRecord(person=HOUSEHOLD, state="home", at=NOW, source="zigbee2mqtt",
                              place="hall_motion", activity=True)
    assert parse("zigbee2mqtt/hall_motion", Z2M_MOTION) == [expected]
    assert parse("zigbee2mqtt/hall_motion", Z2M_MMWAVE) == [expected]
    assert parse("zigbee2mqtt/hall_motion", {**Z2M_MOTION, "occupancy": False}) == []
    assert parse("zigbee2mqtt/kitchen_plug", {"state": "ON", "power": 12.5}) == []
    assert parse("zigbee2mqtt/bridge", {"state": "online"}) == []


def test_zigbee2mqtt_last_seen_is_the_time() -> None:
    iso = {**Z2M_MOTION, "last_seen": "2023-11-14T22:13:20.000Z"}
    local = {**Z2M_MOTION, "last_seen": "2023-11-14T23:13:20+01:00"}
    epoch_ms = {**Z2M_MOTION, "last_seen": TST * 1000}
    for msg in (iso, local, epoch_ms):
        assert parse("zigbee2mqtt/hall_motion", msg)[0].at == TST


def test_zigbee2mqtt_room_and_person_from_the_entry(tmp_path: Path) -> None:
    tm = topic_map(tmp_path, """
[[topics]]
pattern = "zigbee2mqtt/study_presence"
adapter = "zigbee2mqtt"
room = "study"
person = "alice"

[[topics]]
pattern = "zigbee2mqtt/#"
adapter = "zigbee2mqtt"
""")
    assert parse("zigbee2mqtt/study_presence", Z2M_MMWAVE, tm=tm) == [PresenceRecord(
        person="alice", state="home", at=NOW, source="zigbee2mqtt", place="study",
        activity=True)]
    # Under "#", a friendly name with "/" is whole; a device's sub-topics say nothing.
    assert parse("zigbee2mqtt/living/motion", Z2M_MOTION, tm=tm)[0].place == "living/motion"
    assert parse("zigbee2mqtt/living/motion/availability", b"online", tm=tm) == []
    assert parse("zigbee2mqtt/bridge/state", {"state": "online"}, tm=tm) == []


def test_espresense_companion() -> None:
    """The companion publishes the room (or not_home) as plain text; a JSON object
    with a room is read too."""
    topic = "espresense/companion/phone:alice"
    assert parse(topic, b"kitchen") == [PresenceRecord(
        person="phone:alice", state="home", at=NOW, source="espresense", place="kitchen")]
    assert parse(topic, b"not_home") == [PresenceRecord(
        person="phone:alice", state="away", at=NOW, source="espresense")]
    as_json = {"room": "office", "confidence": 83, "distance": 2.31, "name": "Alice's phone"}
    assert parse(topic, as_json) == [PresenceRecord(
        person="phone:alice", state="home", at=NOW, source="espresense", place="office")]
    assert parse("espresense/companion/status", b"offline") == []
    assert parse("espresense/companion/telemetry", {"ip": "10.0.0.2", "moved": 3}) == []


# --- every rejection reason ------------------------------------------------------


REJECTIONS: list[tuple[str, bytes | dict[str, Any], str]] = [
    # malformed-json
    ("owntracks/jane/phone", b"{not json", "malformed-json"),
    ("owntracks/jane/phone", b"\xff\xfe\x00", "malformed-json"),
    ("homeassistant/device_tracker/x/attributes", b"", "malformed-json"),
    ("zigbee2mqtt/hall", b"[" * 5000, "malformed-json"),
    ("espresense/companion/p", b'{"room": ', "malformed-json"),
    # wrong-type
    ("owntracks/jane/phone", b"[1, 2]", "wrong-type"),
    ("zigbee2mqtt/hall", b'"occupancy"', "wrong-type"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lat": "48.85"}, "wrong-type"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lon": True}, "wrong-type"),
    ("owntracks/jane/phone", {**OT_LOCATION, "acc": [13]}, "wrong-type"),
    ("owntracks/jane/phone", {**OT_LOCATION, "inregions": "home"}, "wrong-type"),
    ("owntracks/jane/phone", {**OT_LOCATION, "_type": 7}, "wrong-type"),
    ("zigbee2mqtt/hall", {"occupancy": "true"}, "wrong-type"),
    ("zigbee2mqtt/hall", {"presence": 1}, "wrong-type"),
    ("espresense/companion/p", {"room": 3}, "wrong-type"),
    ("espresense/companion/p", {"room": "hall", "distance": "2m"}, "wrong-type"),
    ("homeassistant/person/alice/state", b'{"state": "home"}', "wrong-type"),
    # missing-field
    ("owntracks/jane/phone", {"_type": "location", "lon": 2.0, "tst": TST}, "missing-field"),
    ("owntracks/jane/phone", {"_type": "location", "lat": 2.0, "lon": 2.0}, "missing-field"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lat": None}, "missing-field"),
    ("owntracks/jane/phone/event", {**OT_TRANSITION, "lon": None}, "missing-field"),
    ("owntracks/jane/phone/event", {"_type": "transition", "tst": TST}, "missing-field"),
    ("homeassistant/device_tracker/x/attributes", {"in_zones": ["home"]}, "missing-field"),
    ("espresense/companion/p", {"confidence": 50}, "missing-field"),
    # bad-coordinates
    ("owntracks/jane/phone", b'{"_type":"location","lat":NaN,"lon":2,"tst":%d}' % TST,
     "bad-coordinates"),
    ("owntracks/jane/phone", b'{"_type":"location","lat":1,"lon":-Infinity,"tst":%d}' % TST,
     "bad-coordinates"),
    ("owntracks/jane/phone", b'{"_type":"location","lat":1e999,"lon":2,"tst":%d}' % TST,
     "bad-coordinates"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lat": 10**400}, "bad-coordinates"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lat": 90.0001}, "bad-coordinates"),
    ("owntracks/jane/phone", {**OT_LOCATION, "lon": -180.5}, "bad-coordinates"),
    ("owntracks/jane/phone", {**OT_LOCATION, "acc": -1}, "bad-coordinates"),
    ("homeassistant/device_tracker/x/attributes", b'{"latitude":1,"longitude":2,'
     b'"gps_accuracy":NaN}', "bad-coordinates"),
    # bad-timestamp
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": "1700000000"}, "bad-timestamp"),
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": True}, "bad-timestamp"),
    ("owntracks/jane/phone", b'{"_type":"location","lat":1,"lon":2,"tst":NaN}',
     "bad-timestamp"),
    ("owntracks/jane/phone", b'{"_type":"location","lat":1,"lon":2,"tst":Infinity}',
     "bad-timestamp"),
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": 10**400}, "bad-timestamp"),
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": 0}, "bad-timestamp"),
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": TST - 31 * 86400}, "bad-timestamp"),
    ("owntracks/jane/phone", {**OT_LOCATION, "tst": NOW + 601}, "bad-timestamp"),
    ("homeassistant/device_tracker/x/attributes",
     {**HA_ATTRIBUTES, "last_updated": "yesterday"}, "bad-timestamp"),
    ("homeassistant/device_tracker/x/attributes",
     {**HA_ATTRIBUTES, "last_updated": "2023-11-14T22:13:20"}, "bad-timestamp"),  # no offset
    ("homeassistant/device_tracker/x/attributes",
     {**HA_ATTRIBUTES, "timestamp": [TST]}, "bad-timestamp"),
    ("zigbee2mqtt/hall", {**Z2M_MOTION, "last_seen": TST}, "bad-timestamp"),  # s, not ms
    ("zigbee2mqtt/hall", {**Z2M_MOTION, "last_seen": "0001-01-01T00:00:00+14:00"},
     "bad-timestamp"),
    # too-large
    ("owntracks/jane/phone", b" " * (DEFAULT.max_payload_bytes + 1), "too-large"),
    # unknown-topic
    ("owntracks/jane", OT_LOCATION, "unknown-topic"),
    ("somewhere/else", b"on", "unknown-topic"),
    ("", b"", "unknown-topic"),
    ("$SYS/broker/uptime", b"12 seconds", "unknown-topic"),
    # bad-value
    ("owntracks/jane/phone", {"lat": 1, "lon": 2, "tst": TST}, "bad-value"),  # no _type
    ("owntracks/jane/phone", {**OT_LOCATION, "_type": "teleport"}, "bad-value"),
    ("owntracks/jane/phone/event", {**OT_TRANSITION, "event": "arrive"}, "bad-value"),
    ("owntracks/jane/phone/event", {**OT_TRANSITION, "desc": "  "}, "bad-value"),
    ("owntracks/ /phone", OT_LOCATION, "bad-value"),  # no user, no person
    ("owntracks/" + "j" * 81 + "/phone", OT_LOCATION, "bad-value"),
    ("homeassistant/person/alice/state", b"  ", "bad-value"),
    ("homeassistant/person/alice/state", b'""', "bad-value"),
    ("homeassistant/person/alice/state", b"\xc3\x28", "bad-value"),
    ("homeassistant/person/alice/state", b"Wo\x00rk", "bad-value"),
    ("homeassistant/binary_sensor/hall/state", b"maybe", "bad-value"),
    ("espresense/companion/p", b"", "bad-value"),
    ("espresense/companion/p", {"room": "hall", "confidence": 1e999}, "bad-value"),
]


@pytest.mark.parametrize(("topic", "payload", "reason"), REJECTIONS)
def test_rejections(topic: str, payload: bytes | dict[str, Any], reason: str) -> None:
    assert rejected(topic, payload) == reason


def test_every_reason_is_produced() -> None:
    """The table above covers every reason there is (a new reason needs a case)."""
    assert {reason for _, _, reason in REJECTIONS} == set(REASONS)


def test_window_edges_are_inclusive() -> None:
    oldest = {**OT_LOCATION, "tst": NOW - DEFAULT.max_age_s}
    newest = {**OT_LOCATION, "tst": NOW + DEFAULT.max_ahead_s}
    assert parse("owntracks/jane/phone", oldest)[0].at == NOW - DEFAULT.max_age_s
    assert parse("owntracks/jane/phone", newest)[0].at == NOW + DEFAULT.max_ahead_s


def test_size_check_comes_first() -> None:
    big = b"x" * (DEFAULT.max_payload_bytes + 1)
    assert rejected("not/mapped", big) == "too-large"
    exact = json.dumps(OT_LOCATION).encode().ljust(DEFAULT.max_payload_bytes)
    assert len(parse("owntracks/jane/phone", exact)) == 1


# --- the topic map -----------------------------------------------------------------


def test_default_topics_file_loads_and_covers_every_adapter() -> None:
    assert DEFAULT.topics_file == CONFIG_DIR / "topics.toml"
    assert {entry.adapter for entry in TOPICS.entries} == set(ADAPTERS) == set(PARSERS)
    assert TOPICS.subscriptions() == [
        "owntracks/+/+", "owntracks/+/+/event", "homeassistant/device_tracker/+/attributes",
        "homeassistant/person/+/state", "homeassistant/binary_sensor/+/state",
        "zigbee2mqtt/+", "espresense/companion/+"]
    assert all(valid_filter(p) for p in TOPICS.subscriptions())


def test_routing() -> None:
    def adapter(topic: str) -> str | None:
        entry = TOPICS.route(topic)
        return entry.adapter if entry else None

    assert adapter("owntracks/jane/phone") == "owntracks"
    assert adapter("owntracks/jane/phone/event") == "owntracks"
    assert adapter("owntracks/jane/phone/cmd") is None
    assert adapter("homeassistant/device_tracker/x/attributes") == "ha_tracker"
    assert adapter("homeassistant/device_tracker/x/state") is None
    assert adapter("homeassistant/person/alice/state") == "ha_person"
    assert adapter("homeassistant/binary_sensor/hall/state") == "ha_binary_sensor"
    assert adapter("zigbee2mqtt/hall") == "zigbee2mqtt"
    assert adapter("zigbee2mqtt/bridge/state") is None
    assert adapter("espresense/companion/p") == "espresense"
    assert adapter("espresense/companion/p/attributes") is None
    assert adapter("") is None


def test_first_matching_entry_wins_and_subscriptions_are_deduplicated(tmp_path: Path) -> None:
    tm = topic_map(tmp_path, """
[[topics]]
pattern = "zigbee2mqtt/kitchen_motion"
adapter = "zigbee2mqtt"
room = "kitchen"

[[topics]]
pattern = "zigbee2mqtt/+"
adapter = "zigbee2mqtt"

[[topics]]
pattern = "zigbee2mqtt/+"
adapter = "zigbee2mqtt"
room = "never"
""")
    assert tm.subscriptions() == ["zigbee2mqtt/kitchen_motion", "zigbee2mqtt/+"]
    assert parse("zigbee2mqtt/kitchen_motion", Z2M_MOTION, tm=tm)[0].place == "kitchen"
    assert parse("zigbee2mqtt/hall", Z2M_MOTION, tm=tm)[0].place == "hall"


def test_names_map_ids_and_refuse_others(tmp_path: Path) -> None:
    tm = topic_map(tmp_path, """
[[topics]]
pattern = "owntracks/+/+"
adapter = "owntracks"
person = "fallback"
names = { "alice" = "", "bob_k" = "bob" }

[[topics]]
pattern = "zigbee2mqtt/+"
adapter = "zigbee2mqtt"
room = "bedroom"
names = { "bed_left" = "alice", "bed_right" = "" }
""", people={"alice": "renamed"})
    assert parse("owntracks/bob_k/phone", OT_LOCATION, tm=tm)[0].person == "bob"
    # "" keeps `person`, before the id and its renaming.
    assert parse("owntracks/alice/phone", OT_LOCATION, tm=tm)[0].person == "fallback"
    assert rejected("owntracks/mallory/phone", OT_LOCATION, tm=tm) == "unknown-topic"
    # The names gate holds even for messages that record nothing.
    assert rejected("owntracks/mallory/phone", {"_type": "lwt"}, tm=tm) == "unknown-topic"
    left = parse("zigbee2mqtt/bed_left", Z2M_MOTION, tm=tm)[0]
    assert (left.person, left.place) == ("alice", "bedroom")
    assert parse("zigbee2mqtt/bed_right", Z2M_MOTION, tm=tm)[0].person == HOUSEHOLD
    assert rejected("zigbee2mqtt/hall", Z2M_MOTION, tm=tm) == "unknown-topic"


def test_people_rename_the_adapters_ids(tmp_path: Path) -> None:
    tm = TopicMap.from_settings(MqttSettings(people={
        "jane": "Jane", "phone:alice": "alice", "hall": "not used for fixed sensors"}))
    assert parse("owntracks/jane/phone", OT_LOCATION, tm=tm)[0].person == "Jane"
    assert parse("owntracks/joe/phone", OT_LOCATION, tm=tm)[0].person == "joe"
    assert parse("espresense/companion/phone:alice", b"kitchen", tm=tm)[0].person == "alice"
    assert parse("zigbee2mqtt/hall", Z2M_MOTION, tm=tm)[0].person == HOUSEHOLD
    bad = TopicMap.from_settings(MqttSettings(people={"jane": "   "}))
    assert rejected("owntracks/jane/phone", OT_LOCATION, tm=bad) == "bad-value"
    long = TopicMap.from_settings(MqttSettings(people={"jane": "j" * 81}))
    assert rejected("owntracks/jane/phone", OT_LOCATION, tm=long) == "bad-value"
    padded = TopicMap.from_settings(MqttSettings(people={"jane": "  Jane  "}))
    assert parse("owntracks/jane/phone", OT_LOCATION, tm=padded)[0].person == "Jane"


def test_limits_come_from_the_settings(tmp_path: Path) -> None:
    tm = TopicMap.from_settings(MqttSettings(max_payload_bytes=256, max_age_s=3600,
                                             max_ahead_s=0))
    assert rejected("owntracks/jane/phone", b" " * 257, tm=tm) == "too-large"
    stale = {**OT_LOCATION, "tst": NOW - 3601}
    assert rejected("owntracks/jane/phone", stale, tm=tm) == "bad-timestamp"
    ahead = {**OT_LOCATION, "tst": NOW + 1}
    assert rejected("owntracks/jane/phone", ahead, tm=tm) == "bad-timestamp"


@pytest.mark.parametrize(("toml", "match"), [
    ('[[topics]\npattern = "a"', "not valid TOML"),
    ('[[topics]]\npattern = "a/+"\nadapter = "tasmota"\n', r"entry 1: adapter"),
    ('[[topics]]\npattern = "a/+"\nadapter = "owntracks"\n[[topics]]\nadapter = "espresense"\n',
     r"entry 2: pattern: Field required"),
    ('[[topics]]\npattern = ""\nadapter = "owntracks"\n', r"entry 1: pattern"),
    ('[[topics]]\npattern = "a/#/b"\nadapter = "owntracks"\n', r"entry 1: pattern: .* not an MQTT"),
    ('[[topics]]\npattern = "a/b+"\nadapter = "owntracks"\n', r"entry 1: pattern: .* not an MQTT"),
    ('[[topics]]\npattern = "a"\nadapter = "owntracks"\nroom = 3\n', r"entry 1: room"),
    ('[[topics]]\npattern = "a"\nadapter = "owntracks"\ncolour = "red"\n', r"entry 1: colour"),
    ('[[topics]]\npattern = "a"\nadapter = "owntracks"\nnames = { "x" = 1 }\n',
     r"entry 1: names\.x"),
    ('[[topic]]\npattern = "a"\nadapter = "owntracks"\n', "unknown key.*topic"),
    ('topics = "all"\n', "expected an array"),
    ("", "expected an array"),
    ("topics = [1]\n", "entry 1"),
])
def test_broken_topics_file_names_the_file_and_entry(tmp_path: Path, toml: str,
                                                     match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        topic_map(tmp_path, toml)
    assert str(tmp_path / "topics.toml") in str(info.value)


def test_missing_topics_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        TopicMap.from_settings(MqttSettings(topics_file=tmp_path / "none.toml"))


def test_empty_mapping_reads_nothing(tmp_path: Path) -> None:
    tm = topic_map(tmp_path, "topics = []\n")
    assert tm.subscriptions() == [] and load_topics(tmp_path / "topics.toml") == []
    assert rejected("owntracks/jane/phone", OT_LOCATION, tm=tm) == "unknown-topic"


def test_valid_filter() -> None:
    assert valid_filter("#") and valid_filter("a/+/b") and valid_filter("a//#")
    assert not valid_filter("a/#/b") and not valid_filter("a/b#") and not valid_filter("+a")


# --- fuzzing ----------------------------------------------------------------------

FUZZ_TOPICS = ["owntracks/jane/phone", "owntracks/jane/phone/event",
               "homeassistant/device_tracker/van/attributes", "homeassistant/person/alice/state",
               "homeassistant/binary_sensor/hall/state", "zigbee2mqtt/hall",
               "zigbee2mqtt/bridge", "espresense/companion/phone:alice"]
VALID: dict[str, dict[str, Any]] = {
    "owntracks/jane/phone": OT_LOCATION,
    "owntracks/jane/phone/event": {**OT_TRANSITION, "desc": "home"},
    "homeassistant/device_tracker/van/attributes": {**HA_ATTRIBUTES, "timestamp": TST},
    "zigbee2mqtt/hall": {**Z2M_MOTION, "last_seen": TST * 1000},
    "espresense/companion/phone:alice": {"room": "office", "confidence": 83, "distance": 2.3},
}
KEYS = sorted({key for msg in VALID.values() for key in msg}
              | {"_type", "event", "desc", "presence", "last_updated", "inregions"})

SCALARS = (st.none() | st.booleans()
           | st.integers(min_value=-(10**30), max_value=10**30)
           | st.sampled_from([10**400, -(10**400), TST, TST * 1000, 0, -1, 91, 181])
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=20)
           | st.sampled_from(["location", "transition", "lwt", "enter", "leave", "home",
                              "not_home", "on", "off", "2023-11-14T22:13:20Z",
                              "2023-11-14T22:13:20", "9999-12-31T23:59:59-23:59", "NaN"]))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid payload with fields replaced, removed or added."""
    topic = draw(st.sampled_from(sorted(VALID)))
    msg = dict(VALID[topic])
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.booleans()):
            msg[key] = draw(JSON_VALUES)
        else:
            msg.pop(key, None)
    return topic, dumps(msg)


@st.composite
def byte_mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid payload with bytes flipped, cut or inserted."""
    topic = draw(st.sampled_from(sorted(VALID)))
    data = bytearray(dumps(VALID[topic]))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip" and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[i:i + draw(st.integers(1, 8))]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
    return topic, bytes(data)


TEXT_STATES = st.sampled_from(["on", "off", "home", "not_home", "Work", '"home"', "unknown",
                               "", " ", "\x00", "\ud7ff", "x" * 300]) | st.text(max_size=40)


def check(topic: str, payload: bytes, now: float = NOW, tm: TopicMap = TOPICS) -> None:
    """The invariants: only ``Rejected`` (with a known reason) escapes; records are
    in range and inside the time window."""
    try:
        records = tm.parse(topic, payload, now)
    except Rejected as exc:
        assert exc.reason in REASONS
        return
    assert isinstance(records, list)
    mqtt = DEFAULT
    for record in records:
        assert isinstance(record, (LocationRecord, PresenceRecord))
        assert math.isfinite(record.at)
        assert now - mqtt.max_age_s <= record.at <= now + mqtt.max_ahead_s
        assert 1 <= len(record.person) <= 80 and record.person == record.person.strip()
        if isinstance(record, LocationRecord):
            assert math.isfinite(record.lat) and -90 <= record.lat <= 90
            assert math.isfinite(record.lon) and -180 <= record.lon <= 180
            assert record.accuracy_m is None or (math.isfinite(record.accuracy_m)
                                                 and record.accuracy_m >= 0)
        else:
            assert record.state in ("home", "away")
        for text in (record.person, record.place, getattr(record, "device", None)):
            assert text is None or (text.isprintable() and text.encode("utf-8"))


FUZZ = hsettings(max_examples=700, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(topic=st.sampled_from(FUZZ_TOPICS), payload=st.binary(max_size=300))
def test_fuzz_random_bytes(topic: str, payload: bytes) -> None:
    check(topic, payload)


@FUZZ
@given(topic=st.sampled_from(FUZZ_TOPICS), value=JSON_VALUES)
def test_fuzz_random_json(topic: str, value: Any) -> None:
    check(topic, dumps(value))


@FUZZ
@given(topic=st.sampled_from(FUZZ_TOPICS),
       value=st.dictionaries(st.sampled_from(KEYS), JSON_VALUES, max_size=8))
def test_fuzz_random_objects_with_the_formats_keys(topic: str, value: dict[str, Any]) -> None:
    check(topic, dumps(value))


@FUZZ
@given(case=mutated())
def test_fuzz_mutated_valid_payloads(case: tuple[str, bytes]) -> None:
    check(*case)


@FUZZ
@given(case=byte_mutated())
def test_fuzz_byte_mutated_valid_payloads(case: tuple[str, bytes]) -> None:
    check(*case)


@FUZZ
@given(topic=st.sampled_from(FUZZ_TOPICS), state=TEXT_STATES)
def test_fuzz_text_states(topic: str, state: str) -> None:
    check(topic, state.encode("utf-8", "surrogatepass"))


@hsettings(max_examples=400, deadline=None, database=None)
@given(topic=st.text(max_size=60) | st.lists(
           st.sampled_from(["owntracks", "zigbee2mqtt", "espresense", "companion",
                            "homeassistant", "person", "binary_sensor", "device_tracker",
                            "state", "attributes", "event", "bridge", "+", "#", "", "$SYS",
                            "status"]) | st.text(max_size=6), max_size=6).map("/".join),
       payload=st.sampled_from([dumps(v) for v in VALID.values()] + [b"on", b"kitchen"]),
       now=st.sampled_from([NOW, 0.0, -1e12, 1e15]))
def test_fuzz_any_topic(topic: str, payload: bytes, now: float) -> None:
    check(topic, payload, now)


def test_every_adapter_is_fuzzed() -> None:
    assert {TOPICS.route(t).adapter for t in FUZZ_TOPICS} == set(ADAPTERS)  # type: ignore[union-attr]
