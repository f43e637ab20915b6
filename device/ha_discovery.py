"""Home Assistant MQTT discovery for Reverie: topics, config payloads, the state.

Pure: builds topics and JSON payloads, publishes nothing. The bridge publishes

* ``<topic_prefix>/availability``: ``"online"`` retained on connect, ``"offline"``
  as its MQTT last will;
* ``<topic_prefix>/state``: one retained JSON document (:func:`state_payload`)
  that every entity reads its state and attributes from;
* ``<discovery_prefix>/<component>/<node_id>/<object_id>/config``: one retained
  config per entity (:func:`discovery_messages`); empty retained payloads on the
  same topics (:func:`removal_messages`) remove the device from Home Assistant.

All entities belong to one device, ``reverie_<node_id>``. The payloads use Home
Assistant's full option names, never the abbreviations. ``default_entity_id``
(Home Assistant 2025.10 and later) and the deprecated ``object_id`` (read by
older releases, ignored from 2026.4) are both sent.

Nothing here carries memory content: the state holds counts, states, the names
of people, places and jobs, times, and the LLM notice (a fixed status line).
:func:`state_payload` reads only the keys it knows, checks their types and
values, and drops everything else.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runtime.config import JOB_NAME, MqttSettings

log = logging.getLogger(__name__)

PAYLOAD_AVAILABLE = "online"
PAYLOAD_NOT_AVAILABLE = "offline"

#: The idle detector's reasons (``runtime.mind.idle.IdleState.reason``); others read "unknown".
IDLE_REASONS = ("nothing-recorded", "everyone-away", "quiet", "active")
#: A job's last outcome; None: never ran. Anything else reads "unknown".
JOB_OUTCOMES = ("ok", "failed")
#: The counts that have a sensor; always present in the state (None when unknown).
COUNT_KEYS = ("turns", "episodes", "facts")

# Other counts pass through only under a short identifier-like name.
_COUNT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_NODE_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME_CHARS = 64       # a person's name
_MAX_PLACE_CHARS = 100     # a place's name
_MAX_NOTICE_CHARS = 300    # the LLM notice


# --------------------------------------------------------------------------- topics


def _prefix(value: str) -> str:
    return value.rstrip("/") or value


def node_id(mqtt: MqttSettings) -> str:
    """The discovery topics' node id: the client id, sanitised to ``[a-zA-Z0-9_-]``."""
    return _NODE_UNSAFE.sub("_", mqtt.client_id)


def availability_topic(mqtt: MqttSettings) -> str:
    return f"{_prefix(mqtt.topic_prefix)}/availability"


def state_topic(mqtt: MqttSettings) -> str:
    return f"{_prefix(mqtt.topic_prefix)}/state"


def device_identifier(mqtt: MqttSettings) -> str:
    return f"reverie_{node_id(mqtt)}"


def _slug(text: str) -> str:
    """An entity id slug: lower case, ``[a-z0-9_]``, no double or edge underscores."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class _Entity:
    component: str            # "sensor" or "binary_sensor"
    object_id: str            # the topic segment, [a-zA-Z0-9_-]
    name: str
    value_template: str
    attributes_template: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _job_ref(job: str) -> str:
    """A Jinja expression for a job's entry; an empty mapping when it is absent."""
    return f"(value_json.jobs[{json.dumps(job)}] | default({{}}))"


def _entities(jobs: Sequence[str]) -> list[_Entity]:
    entities = [
        _Entity("binary_sensor", "idle", "Idle",
                "{{ 'ON' if value_json.idle else 'OFF' }}",
                "{{ {'idle_reason': value_json.idle_reason, "
                "'idle_since': value_json.idle_since} | tojson }}",
                {"payload_on": "ON", "payload_off": "OFF", "icon": "mdi:sleep"}),
        _Entity("sensor", "presence", "Presence",
                "{{ value_json.presence_summary }}",
                "{{ value_json.presence | tojson }}",
                {"icon": "mdi:home-account"}),
    ]
    for key in COUNT_KEYS:
        entities.append(_Entity("sensor", key, key.capitalize(),
                                f"{{{{ value_json.counts.{key} }}}}",
                                options={"state_class": "measurement", "icon": "mdi:counter"}))
    for job in jobs:
        ref = _job_ref(job)
        entities.append(_Entity(
            "sensor", f"job_{job}", f"Last {job} run",
            f"{{{{ {ref}.last_outcome | default('never', true) }}}}",
            f"{{{{ {{'last_run_at': {ref}.last_run_at | default(none)}} | tojson }}}}",
            {"entity_category": "diagnostic", "icon": "mdi:calendar-check"}))
        entities.append(_Entity(
            "sensor", f"job_{job}_at", f"Last {job} run time",
            f"{{{{ {ref}.last_run_at | default(none) }}}}",
            options={"device_class": "timestamp", "entity_category": "diagnostic"}))
    entities += [
        _Entity("binary_sensor", "llm_problem", "LLM problem",
                "{{ 'ON' if value_json.llm_notice else 'OFF' }}",
                "{{ {'notice': value_json.llm_notice} | tojson }}",
                {"device_class": "problem", "payload_on": "ON", "payload_off": "OFF",
                 "entity_category": "diagnostic"}),
        _Entity("sensor", "location_fixes", "Location fixes",
                "{{ value_json.location_fixes }}",
                options={"state_class": "total_increasing", "icon": "mdi:map-marker"}),
    ]
    return entities


def _checked_jobs(jobs: Sequence[str]) -> list[str]:
    if isinstance(jobs, str):
        raise TypeError("jobs is a sequence of job names, not one string")
    seen: list[str] = []
    for job in jobs:
        if not isinstance(job, str) or not re.match(JOB_NAME, job):
            raise ValueError(f"{job!r} is not a job name")
        if job not in seen:
            seen.append(job)
    return seen


def _config_topic(mqtt: MqttSettings, entity: _Entity) -> str:
    return (f"{_prefix(mqtt.discovery_prefix)}/{entity.component}/{node_id(mqtt)}/"
            f"{entity.object_id}/config")


def discovery_messages(mqtt: MqttSettings, jobs: Sequence[str],
                       version: str) -> list[tuple[str, str]]:
    """(topic, JSON payload) per entity, all to be published retained.

    Built whatever ``mqtt.discovery`` says: the bridge decides whether to publish.
    ``jobs`` are job names (``runtime.config.JOB_NAME``); others raise ValueError.
    """
    node = node_id(mqtt)
    node_slug = _slug(node)
    base = "reverie" if node_slug in ("", "reverie") else f"reverie_{node_slug}"
    device = {"identifiers": [device_identifier(mqtt)], "name": "Reverie",
              "manufacturer": "Reverie", "model": "memory runtime", "sw_version": version}
    origin = {"name": "Reverie", "sw_version": version}
    state = state_topic(mqtt)
    messages: list[tuple[str, str]] = []
    for entity in _entities(_checked_jobs(jobs)):
        slug = f"{base}_{_slug(entity.object_id)}"
        config: dict[str, Any] = {
            "name": entity.name,
            "unique_id": f"reverie_{node}_{entity.object_id}",
            "default_entity_id": f"{entity.component}.{slug}",
            "object_id": slug,
            "device": device,
            "origin": origin,
            "availability_topic": availability_topic(mqtt),
            "payload_available": PAYLOAD_AVAILABLE,
            "payload_not_available": PAYLOAD_NOT_AVAILABLE,
            "state_topic": state,
            "value_template": entity.value_template,
        }
        if entity.attributes_template is not None:
            config["json_attributes_topic"] = state
            config["json_attributes_template"] = entity.attributes_template
        config.update(entity.options)
        messages.append((_config_topic(mqtt, entity), json.dumps(config, sort_keys=True)))
    return messages


def removal_messages(mqtt: MqttSettings, jobs: Sequence[str]) -> list[tuple[str, str]]:
    """Empty payloads, to be published retained, on every config topic: removes
    the device. Pass the jobs the configs were published with (a job dropped
    since keeps its entity until its topic is cleared)."""
    return [(_config_topic(mqtt, entity), "") for entity in _entities(_checked_jobs(jobs))]


# --------------------------------------------------------------------------- state


def _iso(value: object) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _text(value: object, limit: int) -> str | None:
    """A short single-line string, or None."""
    if not isinstance(value, str):
        return None
    line = " ".join(value.split())
    return line[:limit] if line else None


def _presence(value: object) -> dict[str, dict[str, Any]]:
    people: dict[str, dict[str, Any]] = {}
    if not isinstance(value, Mapping):
        return people
    for person, entry in value.items():
        name = _text(person, _MAX_NAME_CHARS)
        if name is None or not isinstance(entry, Mapping):
            continue
        state = entry.get("state")
        if state not in ("home", "away"):
            log.debug("presence of %r left out: state %r", name, state)
            continue
        people[name] = {"state": state, "place": _text(entry.get("place"), _MAX_PLACE_CHARS),
                        "since": _iso(entry.get("since"))}
    return people


def _counts(value: object) -> dict[str, int | None]:
    counts: dict[str, int | None] = dict.fromkeys(COUNT_KEYS)
    if not isinstance(value, Mapping):
        return counts
    for key, number in value.items():
        if isinstance(key, str) and _COUNT_NAME.match(key) and _count(number) is not None:
            counts[key] = _count(number)
    return counts


def _jobs(value: object) -> dict[str, dict[str, str | None]]:
    jobs: dict[str, dict[str, str | None]] = {}
    if not isinstance(value, Mapping):
        return jobs
    for name, entry in value.items():
        if not isinstance(name, str) or not re.match(JOB_NAME, name):
            continue
        entry = entry if isinstance(entry, Mapping) else {}
        outcome = entry.get("last_outcome")
        jobs[name] = {
            "last_outcome": outcome if outcome is None or outcome in JOB_OUTCOMES else "unknown",
            "last_run_at": _iso(entry.get("last_run_at")),
        }
    return jobs


def state_payload(snapshot: Mapping[str, Any]) -> str:
    """The retained state document (JSON) from the bridge's snapshot.

    Reads only the keys documented in the module; times become ISO 8601 UTC
    strings (None stays null). Unknown keys, wrong types and unexpected values
    are dropped or read as "unknown", never echoed."""
    presence = _presence(snapshot.get("presence"))
    home = sum(1 for entry in presence.values() if entry["state"] == "home")
    reason = snapshot.get("idle_reason")
    state = {
        "idle": snapshot.get("idle") is True,
        "idle_reason": reason if reason in IDLE_REASONS else "unknown",
        "idle_since": _iso(snapshot.get("idle_since")),
        "people_home": home,
        "presence_summary": f"{home} home",
        "presence": presence,
        "counts": _counts(snapshot.get("counts")),
        "jobs": _jobs(snapshot.get("jobs")),
        "llm_notice": _text(snapshot.get("llm_notice"), _MAX_NOTICE_CHARS),
        "location_fixes": _count(snapshot.get("location_fixes")),
    }
    return json.dumps(state, sort_keys=True)
