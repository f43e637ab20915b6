"""The adapters: pure parsers from what home devices publish over MQTT to records.

One function per adapter name of the topic mapping (``runtime.config.ADAPTERS``),
all with the signature of :data:`Adapter`::

    adapter(entry, topic, payload, now, person_for) -> list[Record]

``entry`` is the topic-map entry that routed the message, ``now`` the hub's
clock (the time of payloads that carry none), ``person_for`` the entry's
person rule (:func:`person_resolver`). An empty list means "accepted, nothing
to record" (motion cleared, an OwnTracks ``lwt``). Anything unusable raises
:class:`~device.records.Rejected` and nothing else, whatever the bytes: the
formats are the devices' own (OwnTracks JSON, Home Assistant MQTT device
trackers and ``mqtt_statestream``, Zigbee2MQTT, the ESPresense companion).

Conventions: a JSON ``null`` is the same as an absent field; bools are not
numbers; numeric strings are not coordinates; every string that ends up in a
record is stripped, printable and bounded. The time window ("not too old, not
ahead") is the topic map's job (:mod:`device.topics`), not the adapters'.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any, Protocol

from device.records import (
    LocationRecord,
    PresenceRecord,
    Reason,
    Record,
    Rejected,
    check_coordinates,
)
from runtime.config import ADAPTERS, MqttTopic

log = logging.getLogger(__name__)

#: OwnTracks regions that mean "home" (compared case-insensitively); a
#: transition into or out of one is presence as well as a location fix.
HOME_REGIONS: tuple[str, ...] = ("home",)
#: Whose a fixed sensor's activity is when neither ``names`` nor ``person`` says.
HOUSEHOLD = "household"
#: OwnTracks ``_type`` values that carry no location: accepted, nothing recorded.
OWNTRACKS_IGNORED = frozenset({"lwt", "card", "status", "waypoint", "waypoints", "cmd",
                               "steps", "encrypted", "beacon", "configuration"})
#: Topics under ``espresense/companion/`` that are the companion's own, not a device.
ESPRESENSE_OWN = frozenset({"status", "telemetry"})
#: Home Assistant states that say nothing (the entity is not reporting).
HA_NO_STATE = frozenset({"unknown", "unavailable"})
#: Zigbee2MQTT sub-topics of a device that are not its state.
Z2M_NOT_STATE = frozenset({"availability", "set", "get"})

PERSON_MAX = 80
TEXT_MAX = 200  # places, rooms, zones, devices


class PersonFor(Protocol):
    """The person a message is about, from the id its topic carries.

    ``default`` replaces the adapter's id when nothing in the entry names the
    person (fixed sensors pass :data:`HOUSEHOLD`). Raises :class:`Rejected`:
    "unknown-topic" for an id the entry's ``names`` does not list, "bad-value"
    for an empty, over-long or unprintable person."""

    def __call__(self, topic_id: str, default: str | None = None) -> str: ...


Adapter = Callable[[MqttTopic, str, bytes, float, PersonFor], list[Record]]


def person_resolver(entry: MqttTopic, people: Mapping[str, str]) -> PersonFor:
    """The person rule of one topic-map entry.

    In order: the entry's ``names`` (when it has any, an id it does not list
    is refused; a name of "" falls through), the entry's ``person``, the
    ``default`` the adapter gives, else the id itself renamed through
    ``people`` (``mqtt.people``)."""

    def person_for(topic_id: str, default: str | None = None) -> str:
        if entry.names:
            if topic_id not in entry.names:
                raise Rejected("unknown-topic", "an id this entry's names do not list")
            named = entry.names[topic_id].strip()
            if named:
                return _person(named)
        if entry.person.strip():
            return _person(entry.person)
        if default is not None:
            return _person(default)
        return _person(people.get(topic_id, topic_id))

    return person_for


def _person(value: str) -> str:
    person = value.strip()
    if not 1 <= len(person) <= PERSON_MAX or not person.isprintable():
        raise Rejected("bad-value", f"a person must be 1-{PERSON_MAX} printable characters")
    return person


# --- payload helpers ----------------------------------------------------------


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8-sig"))
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, digit limit
        raise Rejected("malformed-json", "not UTF-8 JSON") from None


def _object(payload: bytes) -> dict[str, Any]:
    value = _json(payload)
    if not isinstance(value, dict):
        raise Rejected("wrong-type", "the payload is not a JSON object")
    return value


def _state(payload: bytes) -> str:
    """A plain-text state (``mqtt_statestream`` style): stripped of whitespace and
    of the quotes a JSON-encoded string carries."""
    try:
        text = payload.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Rejected("bad-value", "the state is not UTF-8 text") from None
    text = text.strip()
    if text[:1] in ("{", "["):
        raise Rejected("wrong-type", "a JSON object or list where a state was expected")
    return _text(text.strip("\"'"), "state")


def _text(value: str, field: str, limit: int = TEXT_MAX) -> str:
    text = value.strip()
    if not 1 <= len(text) <= limit or not text.isprintable():
        raise Rejected("bad-value", f"{field}: must be 1-{limit} printable characters")
    return text


def _str(obj: Mapping[str, Any], key: str) -> str | None:
    """An optional string field."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Rejected("wrong-type", f"{key} is not a string")
    return _text(value, key)


def _required_str(obj: Mapping[str, Any], key: str) -> str:
    value = _str(obj, key)
    if value is None:
        raise Rejected("missing-field", key)
    return value


def _finite(value: Any, field: str, bad: Reason) -> float:
    """A JSON number as a finite float: "wrong-type" for anything else, ``bad``
    for NaN, infinities and integers too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Rejected("wrong-type", f"{field} is not a number")
    try:
        number = float(value)
    except OverflowError:
        raise Rejected(bad, f"{field} is out of range") from None
    if not math.isfinite(number):
        raise Rejected(bad, f"{field} is not finite")
    return number


def _position(obj: Mapping[str, Any], lat: str, lon: str, acc: str
              ) -> tuple[float, float, float | None]:
    """Required latitude and longitude, optional accuracy (metres)."""
    for key in (lat, lon):
        if obj.get(key) is None:
            raise Rejected("missing-field", key)
    latitude = _finite(obj[lat], lat, "bad-coordinates")
    longitude = _finite(obj[lon], lon, "bad-coordinates")
    raw_acc = obj.get(acc)
    accuracy = None if raw_acc is None else _finite(raw_acc, acc, "bad-coordinates")
    check_coordinates(latitude, longitude, accuracy)
    return latitude, longitude, accuracy


def _epoch(value: Any, field: str, per_second: float = 1.0) -> float:
    """Seconds since the epoch from a JSON number (``per_second`` = 1000 for ms)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Rejected("bad-timestamp", f"{field} is not a number")
    try:
        seconds = float(value) / per_second
    except OverflowError:
        raise Rejected("bad-timestamp", f"{field} is out of range") from None
    if not math.isfinite(seconds):
        raise Rejected("bad-timestamp", f"{field} is not finite")
    return seconds


def _iso(value: str, field: str) -> float:
    """Seconds since the epoch from an ISO 8601 time with a UTC offset."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Rejected("bad-timestamp", f"{field} is not an ISO 8601 time") from None
    if parsed.utcoffset() is None:
        raise Rejected("bad-timestamp", f"{field} has no UTC offset")
    try:
        return parsed.timestamp()
    except (ValueError, OverflowError):
        raise Rejected("bad-timestamp", f"{field} is out of range") from None


def _when(value: Any, field: str, per_second: float = 1.0) -> float:
    """ISO 8601 text or an epoch number (in 1/``per_second`` seconds)."""
    if isinstance(value, str):
        return _iso(value, field)
    return _epoch(value, field, per_second)


def _levels(topic: str) -> list[str]:
    return topic.split("/")


def _object_id(topic: str, suffix: str) -> str:
    """The Home Assistant object id: the level before ``suffix`` when the topic
    ends with it (``.../<object_id>/state``), else the last level."""
    levels = _levels(topic)
    if len(levels) >= 2 and levels[-1] == suffix:
        return levels[-2]
    return levels[-1]


# --- the adapters ---------------------------------------------------------------


def owntracks(entry: MqttTopic, topic: str, payload: bytes, now: float,
              person_for: PersonFor, *, home_regions: Collection[str] = HOME_REGIONS
              ) -> list[Record]:
    """OwnTracks in MQTT mode: ``owntracks/<user>/<device>`` (``_type`` location)
    and ``owntracks/<user>/<device>/event`` (``_type`` transition). The person
    is the user. A transition into or out of a home region is presence too."""
    levels = _levels(topic)
    if len(levels) >= 4 and levels[-1] == "event":
        levels = levels[:-1]
    user = levels[-2] if len(levels) >= 2 else levels[-1]
    device = levels[-1] if len(levels) >= 2 else ""
    person = person_for(user)
    msg = _object(payload)
    kind = msg.get("_type")
    if kind is None:
        raise Rejected("bad-value", "no _type")
    if not isinstance(kind, str):
        raise Rejected("wrong-type", "_type is not a string")
    if kind in OWNTRACKS_IGNORED:
        return []
    device_name = _text(device, "device") if device.strip() else None
    if kind == "location":
        return [_owntracks_location(msg, person, device_name)]
    if kind == "transition":
        return _owntracks_transition(msg, person, device_name, home_regions)
    raise Rejected("bad-value", "an OwnTracks _type this adapter does not know")


def _owntracks_at(msg: Mapping[str, Any]) -> float:
    if msg.get("tst") is None:
        raise Rejected("missing-field", "tst")
    return _epoch(msg["tst"], "tst")


def _owntracks_location(msg: Mapping[str, Any], person: str, device: str | None
                        ) -> LocationRecord:
    lat, lon, acc = _position(msg, "lat", "lon", "acc")
    at = _owntracks_at(msg)
    regions = msg.get("inregions")
    place = None
    if regions is not None:
        if not isinstance(regions, list) or not all(isinstance(r, str) for r in regions):
            raise Rejected("wrong-type", "inregions is not a list of strings")
        names = [_text(r, "inregions") for r in regions if r.strip()]
        place = names[0] if names else None
    return LocationRecord(person=person, lat=lat, lon=lon, at=at, source="owntracks",
                          accuracy_m=acc, device=device, place=place)


def _owntracks_transition(msg: Mapping[str, Any], person: str, device: str | None,
                          home_regions: Collection[str]) -> list[Record]:
    event = _required_str(msg, "event")
    if event not in ("enter", "leave"):
        raise Rejected("bad-value", "event is neither enter nor leave")
    region = _str(msg, "desc")
    at = _owntracks_at(msg)
    records: list[Record] = []
    # The booklet marks lat/lon optional on transitions (a beacon has none).
    if msg.get("lat") is not None or msg.get("lon") is not None:
        lat, lon, acc = _position(msg, "lat", "lon", "acc")
        records.append(LocationRecord(person=person, lat=lat, lon=lon, at=at,
                                      source="owntracks", accuracy_m=acc, device=device,
                                      place=region, event=event))
    homes = {name.casefold() for name in home_regions}
    if region is not None and region.casefold() in homes:
        records.append(PresenceRecord(person=person, state="home" if event == "enter" else "away",
                                      at=at, source="owntracks", place=region))
    return records


def ha_tracker(entry: MqttTopic, topic: str, payload: bytes, now: float,
               person_for: PersonFor) -> list[Record]:
    """A Home Assistant MQTT device tracker's JSON attributes
    (``homeassistant/device_tracker/<object_id>/attributes``): ``latitude``,
    ``longitude``, optional ``gps_accuracy`` and ``last_updated``/``timestamp``
    (ISO 8601 or epoch seconds). The person is the object id."""
    object_id = _object_id(topic, "attributes")
    person = person_for(object_id)
    msg = _object(payload)
    lat, lon, acc = _position(msg, "latitude", "longitude", "gps_accuracy")
    at = now
    for key in ("last_updated", "timestamp"):
        if msg.get(key) is not None:
            at = _when(msg[key], key)
            break
    device = _text(object_id, "device") if object_id.strip() else None
    return [LocationRecord(person=person, lat=lat, lon=lon, at=at, source="ha_tracker",
                           accuracy_m=acc, device=device)]


def ha_person(entry: MqttTopic, topic: str, payload: bytes, now: float,
              person_for: PersonFor) -> list[Record]:
    """A Home Assistant person's state from ``mqtt_statestream``
    (``homeassistant/person/<object_id>/state``): ``home``, ``not_home`` or a
    zone name (away, in that zone). The person is the object id."""
    person = person_for(_object_id(topic, "state"))
    state = _state(payload)
    folded = state.casefold()
    if folded in HA_NO_STATE:
        return []
    if folded == "home":
        return [PresenceRecord(person=person, state="home", at=now, source="ha_person")]
    place = None if folded == "not_home" else state
    return [PresenceRecord(person=person, state="away", at=now, source="ha_person", place=place)]


def ha_binary_sensor(entry: MqttTopic, topic: str, payload: bytes, now: float,
                     person_for: PersonFor) -> list[Record]:
    """A Home Assistant binary sensor (motion, occupancy) from ``mqtt_statestream``
    (``homeassistant/binary_sensor/<object_id>/state``): ``on`` is activity in
    the entry's room (default: the object id), ``off`` nothing."""
    object_id = _object_id(topic, "state")
    person = person_for(object_id, HOUSEHOLD)
    state = _state(payload).casefold()
    if state == "off" or state in HA_NO_STATE:
        return []
    if state != "on":
        raise Rejected("bad-value", "a binary sensor state other than on/off")
    place = _text(entry.room or object_id, "room")
    return [PresenceRecord(person=person, state="home", at=now, source="ha_binary_sensor",
                           place=place, activity=True)]


def zigbee2mqtt(entry: MqttTopic, topic: str, payload: bytes, now: float,
                person_for: PersonFor) -> list[Record]:
    """A Zigbee2MQTT device's state (``zigbee2mqtt/<friendly_name>``): ``occupancy``
    or ``presence`` true is activity in the entry's room (default: the friendly
    name); false, or neither key, is nothing. ``last_seen`` (ISO 8601 or epoch
    milliseconds), when the device reports it, is the time."""
    name = _z2m_name(entry.pattern, topic)
    if name is None:
        return []
    person = person_for(name, HOUSEHOLD)
    msg = _object(payload)
    flags: list[bool] = []
    for key in ("occupancy", "presence"):
        value = msg.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise Rejected("wrong-type", f"{key} is not a boolean")
        flags.append(value)
    if not any(flags):
        return []
    seen = msg.get("last_seen")
    at = now if seen is None else _when(seen, "last_seen", per_second=1000.0)
    place = _text(entry.room or name, "room")
    return [PresenceRecord(person=person, state="home", at=at, source="zigbee2mqtt",
                           place=place, activity=True)]


def _z2m_name(pattern: str, topic: str) -> str | None:
    """The friendly name: the topic after the pattern's fixed leading levels (the
    base topic), so names with "/" work under ``zigbee2mqtt/#``; a pattern
    without wildcards names one device, its last level. None for the bridge's
    own topics and a device's non-state sub-topics."""
    fixed = 0
    for part in pattern.split("/"):
        if part in ("+", "#"):
            break
        fixed += 1
    levels = _levels(topic)
    rest = levels[fixed:] if fixed < len(levels) else levels[-1:]
    if rest[0] == "bridge" or (len(rest) > 1 and rest[-1] in Z2M_NOT_STATE):
        return None
    return "/".join(rest)


def espresense(entry: MqttTopic, topic: str, payload: bytes, now: float,
               person_for: PersonFor) -> list[Record]:
    """The ESPresense companion (``espresense/companion/<id>``): the room a tracked
    device is in, or ``not_home``. The companion publishes the room as plain
    text; a JSON object with ``room`` (and optional ``confidence``,
    ``distance``, ``name``) is read as well. The person is the device id.
    Presence, not activity: a phone in a room is not someone moving."""
    device_id = _levels(topic)[-1]
    if device_id in ESPRESENSE_OWN:
        return []
    person = person_for(device_id)
    if payload.lstrip()[:1] == b"{":
        msg = _object(payload)
        room = _required_str(msg, "room")
        for key in ("confidence", "distance"):
            if msg.get(key) is not None:
                _finite(msg[key], key, "bad-value")
        _str(msg, "name")
    else:
        room = _state(payload)
    if room.casefold() == "not_home":
        return [PresenceRecord(person=person, state="away", at=now, source="espresense")]
    return [PresenceRecord(person=person, state="home", at=now, source="espresense",
                           place=room)]


#: The adapter for each name of ``runtime.config.ADAPTERS``.
PARSERS: Mapping[str, Adapter] = {
    "owntracks": owntracks,
    "ha_tracker": ha_tracker,
    "ha_person": ha_person,
    "ha_binary_sensor": ha_binary_sensor,
    "zigbee2mqtt": zigbee2mqtt,
    "espresense": espresense,
}
if set(PARSERS) != set(ADAPTERS):  # pragma: no cover - a programming error
    raise ImportError(f"device.adapters: no parser for {set(ADAPTERS) - set(PARSERS)}")
