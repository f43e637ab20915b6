"""The topic map: which MQTT topics the bridge reads, and with which adapter.

The mapping is a TOML file (``mqtt.topics_file``, by default the packaged
``configs/topics.toml``) of ``[[topics]]`` entries, each a
:class:`runtime.config.MqttTopic`. :class:`TopicMap` loads and checks it, gives
the subscriptions, routes a topic to the first entry whose pattern matches, and
turns one message into records: the size limit, the route, the entry's adapter
(:mod:`device.adapters`) with its person rule, then the time window. Every
refusal is a :class:`~device.records.Rejected` with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from paho.mqtt.client import topic_matches_sub
from pydantic import ValidationError

from device.adapters import PARSERS, person_resolver
from device.records import Record, Rejected
from runtime.config import ConfigError, MqttSettings, MqttTopic, read_toml

log = logging.getLogger(__name__)


def valid_filter(pattern: str) -> bool:
    """An MQTT topic filter: ``+`` only as a whole level, ``#`` only as the last."""
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return "\x00" not in pattern


def load_topics(path: Path) -> list[MqttTopic]:
    """The ``[[topics]]`` entries of a topics file; :class:`ConfigError` naming the
    file and the entry (counted from 1) for anything wrong."""
    data = read_toml(path)
    extra = sorted(set(data) - {"topics"})
    if extra:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(extra)}; "
                          "expected only [[topics]] entries")
    tables = data.get("topics")
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: topics: expected an array of [[topics]] tables")
    entries: list[MqttTopic] = []
    for number, table in enumerate(tables, start=1):
        where = f"{path}: [[topics]] entry {number}"
        try:
            entry = MqttTopic.model_validate(table)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"]) or "(the entry)"
                problems.append(f"{field}: {err['msg']}")
            raise ConfigError(f"{where}: {'; '.join(problems)}") from None
        if not valid_filter(entry.pattern):
            raise ConfigError(f"{where}: pattern: {entry.pattern!r} is not an MQTT topic "
                              "filter (+ must be a whole level, # the last level)")
        entries.append(entry)
    if not entries:
        log.warning("%s: no [[topics]] entries; the bridge reads nothing", path)
    return entries


class TopicMap:
    """The loaded mapping, with the bridge's limits (``mqtt`` settings)."""

    def __init__(self, entries: Sequence[MqttTopic], mqtt: MqttSettings) -> None:
        self._entries = tuple(entries)
        self._mqtt = mqtt

    @classmethod
    def from_settings(cls, mqtt: MqttSettings) -> TopicMap:
        """Load ``mqtt.topics_file``; :class:`ConfigError` when it is unusable."""
        path = mqtt.topics_file.expanduser()
        entries = load_topics(path)
        log.debug("topic map: %d entries from %s", len(entries), path)
        return cls(entries, mqtt)

    @property
    def entries(self) -> tuple[MqttTopic, ...]:
        return self._entries

    def subscriptions(self) -> list[str]:
        """The patterns to subscribe to, each once, in the file's order."""
        return list(dict.fromkeys(entry.pattern for entry in self._entries))

    def route(self, topic: str) -> MqttTopic | None:
        """The first entry whose pattern matches ``topic``, if any."""
        for entry in self._entries:
            if topic_matches_sub(entry.pattern, topic):
                return entry
        return None

    def parse(self, topic: str, payload: bytes, now: float) -> list[Record]:
        """The records one message carries (``[]``: accepted, nothing to record).

        Raises :class:`Rejected` for anything else: too large, no entry for the
        topic, what the adapter refuses, or a time outside
        ``[now - max_age_s, now + max_ahead_s]``."""
        if len(payload) > self._mqtt.max_payload_bytes:
            raise Rejected("too-large", f"{len(payload)} bytes, over "
                           f"{self._mqtt.max_payload_bytes}")
        entry = self.route(topic)
        if entry is None:
            raise Rejected("unknown-topic", "no [[topics]] entry matches")
        adapter = PARSERS[entry.adapter]
        records = adapter(entry, topic, payload, now, person_resolver(entry, self._mqtt.people))
        oldest, newest = now - self._mqtt.max_age_s, now + self._mqtt.max_ahead_s
        for record in records:
            if not oldest <= record.at <= newest:
                raise Rejected("bad-timestamp", "outside the accepted window "
                               f"({record.at - now:+.0f} s from now)")
        return records
