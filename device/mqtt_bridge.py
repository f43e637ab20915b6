"""The MQTT bridge: location and presence in, Home Assistant discovery out.

One paho-mqtt (v2 callback API) client, configured from ``[mqtt]``:

- **In.** It subscribes, at QoS 1, to every pattern of the topic map
  (``device.topics``) with a persistent session (``clean_session=False`` and
  a fixed client id), so the broker queues what arrives while the bridge is
  away. Messages flow once the broker grants the subscriptions (its SUBACK;
  ``subscribed`` in the stats); a pattern its ACL refuses is named in the log
  and counted in ``error``. Each message is parsed by its adapter into
  location and presence records, or refused and counted by reason
  (``device.records.REASONS``).
  Accepted records go to a queue; a writer thread hands them to the
  :class:`Sink` in batches, and only then acknowledges them to the broker
  (paho's ``manual_ack``): a message is acknowledged once it is stored, so a
  crash or a lost connection before that makes the broker send it again
  (the store ignores a fix it already has). A refused message is acknowledged
  at once: sending it again would not make it valid.
- **Out.** Availability through a last will (``<prefix>/availability``:
  ``online`` retained on connect, ``offline`` from the broker when the bridge
  vanishes, or from the bridge when it stops); Home Assistant discovery
  (retained; sent again whenever ``<discovery_prefix>/status`` goes
  ``online``) and one retained state document, refreshed every
  ``state_every_s``.

paho reconnects by itself with back-off (``reconnect_min_s`` doubling up to
``reconnect_max_s``). Nothing here logs a payload, a position or a password.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import paho.mqtt.client as mqtt

from device import ha_discovery
from device.records import LocationRecord, PresenceRecord, Record, Rejected
from device.topics import TopicMap
from runtime.config import MqttSettings

log = logging.getLogger(__name__)

BATCH = 500            # messages handed to the sink at once, at most
# Accepted messages waiting to be stored, at most; past this, paho's network
# thread waits, so the broker holds the rest (unacknowledged, not lost).
QUEUE_MAX = 10_000
RETRY_S = (0.2, 5.0)   # a failing sink is retried with back-off in this range
STATE_EVERY_S = 60.0


class Sink(Protocol):
    """Where records go (the actor wires it to the Transcript and Cron actors)."""

    def store(self, fixes: Sequence[LocationRecord], presence: Sequence[PresenceRecord]) -> None:
        """Store them durably, or raise: the batch is retried and not acknowledged."""

    def snapshot(self) -> Mapping[str, Any]:
        """What the Home Assistant sensors show (``ha_discovery.state_payload``)."""


@dataclass
class _Pending:
    records: list[Record]
    mid: int
    qos: int
    received_at: float


@dataclass
class BridgeStats:
    connected: bool = False
    subscribed: bool = False  # the broker granted the subscriptions (SUBACK) on this connection
    accepted: int = 0
    stored: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    connects: int = 0
    disconnects: int = 0
    last_message_at: float | None = None
    last_connect_at: float | None = None
    error: str | None = None


class Bridge:
    def __init__(self, settings: MqttSettings, topics: TopicMap, sink: Sink, *,
                 jobs: Sequence[str] = (), version: str = "",
                 now: Callable[[], float] = time.time,
                 state_every_s: float = STATE_EVERY_S,
                 observe: Callable[[bool, str], None] | None = None) -> None:
        self.settings = settings
        # told of every message: (accepted, refusal reason) — the runtime's metrics
        self.observe = observe or (lambda accepted, reason: None)
        self.topics = topics
        self.sink = sink
        self.jobs = list(jobs)
        self.version = version
        self.now = now
        self.state_every_s = state_every_s
        self.availability = ha_discovery.availability_topic(settings)
        self.ha_status = f"{settings.discovery_prefix}/status"
        self._stats = BridgeStats()
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Pending] = queue.Queue(QUEUE_MAX)
        self._stop = threading.Event()
        self._announce = threading.Event()  # discovery + state wanted now
        self._subscribing: tuple[int, list[str]] | None = None  # (mid, patterns) awaiting SUBACK
        self._writer: threading.Thread | None = None
        self._stater: threading.Thread | None = None
        self.client = self._client()

    # -- the connection -------------------------------------------------------

    def _client(self) -> mqtt.Client:
        s = self.settings
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=s.client_id,
                             clean_session=False, protocol=mqtt.MQTTv311, manual_ack=True)
        if s.password_env and not s.username:
            raise ValueError("mqtt.password_env is set but mqtt.username is not")
        if s.username:
            password = None
            if s.password_env:
                password = os.environ.get(s.password_env)
                if not password:
                    raise ValueError(f"mqtt.password_env: the variable {s.password_env} is"
                                     " not set or empty")
            client.username_pw_set(s.username, password)
        if s.tls:
            client.tls_set(ca_certs=str(s.ca_file) if s.ca_file else None,
                           certfile=str(s.cert_file) if s.cert_file else None,
                           keyfile=str(s.key_file) if s.key_file else None)
        client.will_set(self.availability, "offline", qos=1, retain=True)
        client.reconnect_delay_set(max(1, round(s.reconnect_min_s)),
                                   max(1, round(s.reconnect_max_s)))
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        return client

    def start(self) -> None:
        """Connect in the background (paho retries until the broker answers)."""
        self._writer = threading.Thread(target=self._write_loop, name="mqtt-writer",
                                        daemon=True)
        self._writer.start()
        self._stater = threading.Thread(target=self._state_loop, name="mqtt-state",
                                        daemon=True)
        self._stater.start()
        self.client.connect_async(self.settings.host, self.settings.port,
                                  keepalive=self.settings.keepalive_s)
        self.client.loop_start()
        log.info("MQTT bridge connecting to %s:%d", self.settings.host, self.settings.port)

    def stop(self, timeout: float = 10.0) -> None:
        """Store what is queued, say ``offline``, and disconnect."""
        self._stop.set()
        self._announce.set()  # wakes the state thread
        if self._writer is not None:
            self._writer.join(timeout)
        if self._stater is not None:
            self._stater.join(timeout)
        try:
            if self.connected:
                info = self.client.publish(self.availability, "offline", qos=1, retain=True)
                info.wait_for_publish(timeout=2)
        except (RuntimeError, ValueError) as exc:
            log.warning("could not say offline: %s", type(exc).__name__)
        self.client.disconnect()
        self.client.loop_stop()

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._stats.connected

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any,
                    reason: Any, properties: Any) -> None:
        if reason.is_failure:
            with self._lock:
                self._stats.error = f"connect refused: {reason}"
            log.warning("MQTT broker refused the connection: %s", reason)
            return
        with self._lock:
            self._stats.connected = True
            self._stats.connects += 1
            self._stats.last_connect_at = self.now()
            self._stats.error = None
        subs = [(pattern, 1) for pattern in self.topics.subscriptions()]
        if self.settings.discovery:
            subs.append((self.ha_status, 1))
        if subs:  # its SUBACK is read on this same thread, after this returns
            result, mid = client.subscribe(subs)
            if result == mqtt.MQTT_ERR_SUCCESS and mid is not None:
                with self._lock:
                    self._subscribing = (mid, [pattern for pattern, _ in subs])
        else:
            with self._lock:
                self._stats.subscribed = True  # nothing to subscribe to
        client.publish(self.availability, "online", qos=1, retain=True)
        self._announce.set()
        log.info("MQTT bridge connected (%d subscriptions, session present: %s)",
                 len(subs), getattr(flags, "session_present", None))

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        """The connection itself failed (refused, TLS handshake, no route): no CONNACK."""
        with self._lock:
            self._stats.error = "connection failed (network or TLS handshake)"
        log.warning("MQTT connection to %s:%d failed; retrying", self.settings.host,
                    self.settings.port)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any,
                       reason: Any, properties: Any) -> None:
        with self._lock:
            was_connected = self._stats.connected
            self._stats.connected = False
            self._stats.subscribed = False
            self._subscribing = None
            if was_connected:
                self._stats.disconnects += 1
            elif self._stats.error is None:  # dropped before a CONNACK: TLS, or refused
                self._stats.error = f"connection closed by the broker before it was set up" \
                                    f" ({reason})"
        if self._stop.is_set():
            return
        if was_connected:
            log.warning("MQTT bridge disconnected (%s); reconnecting", reason)
        else:
            log.warning("MQTT broker closed the connection before it was set up (%s)", reason)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int,
                      reason_codes: list[Any], properties: Any) -> None:
        """The SUBACK: messages are routed to the bridge from here on. A broker's ACL
        may refuse some patterns; those are named in the log and in ``error``."""
        with self._lock:
            if self._subscribing is None or self._subscribing[0] != mid:
                return
            patterns = self._subscribing[1]
            self._subscribing = None
            refused = [p for p, code in zip(patterns, reason_codes, strict=False)
                       if code.is_failure]
            self._stats.subscribed = len(refused) < len(patterns)
            if refused:
                self._stats.error = (f"subscription refused by the broker for {len(refused)}"
                                     f" of {len(patterns)} topic patterns")
        if refused:
            log.warning("MQTT broker refused the subscription to %s (its ACL?)",
                        ", ".join(refused))

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        now = self.now()
        try:
            topic = msg.topic
        except UnicodeDecodeError:  # paho decodes the topic; a broker should not pass these
            topic = ""
        if topic == self.ha_status and self.settings.discovery:
            if msg.payload.strip().lower() == b"online":
                self._announce.set()
            client.ack(msg.mid, msg.qos)
            return
        try:
            records = self.topics.parse(topic, bytes(msg.payload), now)
        except Rejected as exc:
            with self._lock:
                self._stats.rejected[exc.reason] += 1
            self.observe(False, exc.reason)
            log.debug("payload refused: %s", exc.reason)
            client.ack(msg.mid, msg.qos)
            return
        with self._lock:
            self._stats.accepted += 1
            self._stats.last_message_at = now
        self.observe(True, "")
        if not records:
            client.ack(msg.mid, msg.qos)
            return
        self._queue.put(_Pending(records, msg.mid, msg.qos, now))

    # -- the writer -----------------------------------------------------------

    def _take(self, first_wait: float) -> list[_Pending]:
        """The first waiting message (up to ``first_wait`` s), then whatever else is
        already waiting, without waiting more: a broker that keeps its in-flight
        window sends no more until these are acknowledged."""
        try:
            batch = [self._queue.get(timeout=first_wait) if first_wait > 0
                     else self._queue.get_nowait()]
        except queue.Empty:
            return []
        while len(batch) < BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write_loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            batch = self._take(0.0 if stopping else 0.25)
            if batch:
                self._store(batch)
            elif stopping:
                return

    def _state_loop(self) -> None:
        """Discovery and the state document, on a thread of their own: gathering
        the state takes calls to other actors, which must not hold up storing."""
        next_state = 0.0
        while not self._stop.is_set():
            wanted = self._announce.is_set()
            if (wanted or time.monotonic() >= next_state) and self.connected:
                self._announce.clear()  # one asked for while publishing is not lost
                self._publish_state(discovery=wanted)
                next_state = time.monotonic() + self.state_every_s
            elif wanted:  # not connected yet: on_connect announces again
                self._stop.wait(0.5)
                if self._stop.is_set():
                    return
            else:
                self._announce.wait(1.0)

    def _store(self, batch: list[_Pending]) -> None:
        fixes = [r for p in batch for r in p.records if isinstance(r, LocationRecord)]
        presence = [r for p in batch for r in p.records if isinstance(r, PresenceRecord)]
        delay = RETRY_S[0]
        while True:
            try:
                self.sink.store(fixes, presence)
                break
            except Exception as exc:
                with self._lock:
                    self._stats.error = f"store failed: {type(exc).__name__}"
                log.warning("storing %d records failed (%s); retrying in %.1f s",
                            len(fixes) + len(presence), type(exc).__name__, delay)
                if self._stop.wait(delay) and self._stop.is_set():
                    return  # not acknowledged: the broker sends them again
                delay = min(delay * 2, RETRY_S[1])
        with self._lock:
            self._stats.stored += len(fixes) + len(presence)
            if self._stats.error and self._stats.error.startswith("store failed"):
                self._stats.error = None
        for pending in batch:
            self.client.ack(pending.mid, pending.qos)

    def _publish_state(self, discovery: bool) -> None:
        try:
            if discovery and self.settings.discovery:
                for topic, payload in ha_discovery.discovery_messages(
                        self.settings, self.jobs, self.version):
                    self.client.publish(topic, payload, qos=1, retain=True)
            if self.settings.discovery:
                state = ha_discovery.state_payload(self.sink.snapshot())
                self.client.publish(ha_discovery.state_topic(self.settings), state,
                                    qos=1, retain=True)
        except Exception as exc:  # a state refresh never stops the bridge
            log.warning("Home Assistant state not published: %s", type(exc).__name__)

    # -- what others see ------------------------------------------------------

    def publish(self, topic: str, payload: Mapping[str, Any] | str, retain: bool = False) -> None:
        """Publish on one of Reverie's own topics (GPS fixes)."""
        body = payload if isinstance(payload, str) else json.dumps(payload)
        self.client.publish(topic, body, qos=0, retain=retain)

    def stats(self) -> dict[str, Any]:
        """``mqtt`` of ``reverie status --json``."""
        with self._lock:
            s = self._stats
            return {"configured": True, "connected": s.connected, "subscribed": s.subscribed,
                    "broker": f"{self.settings.host}:{self.settings.port}",
                    "accepted": s.accepted, "rejected": dict(s.rejected), "stored": s.stored,
                    "pending": self._queue.qsize(), "connects": s.connects,
                    "disconnects": s.disconnects, "last_message_at": s.last_message_at,
                    "last_connect_at": s.last_connect_at, "error": s.error}
