#!/usr/bin/env python3
"""MQTT ingest: inbound messages/s through the bridge into the store, and the
publish-to-stored-row delay, against Mosquitto's own round trip in the same run.

Usage:
    tools/bench/mqtt_ingest.py [--messages 20000] [--warmup 500] [--rate 500,2000]
                               [--paced-s 5] [--publishers 1] [--inflight 1000]
                               [--broker-inflight 20] [--tcp-nodelay] [--poll-ms 2]
                               [--no-stages]
                               [--dashboard] [--json OUT.json]

(``--rate`` takes a comma-separated list: default ``500,2000``, the second
being the goal rate.)

Setup. A real Mosquitto on a free loopback port (``persistence false``,
``max_queued_messages 100000`` like tests/mosquitto.py, ``max_inflight_messages``
from ``--broker-inflight``: 20 is Mosquitto's default; ``set_tcp_nodelay`` off,
its default, unless ``--tcp-nodelay``); a private local Ray node
and the full actor runtime on a fresh store, ``mqtt.host/port`` pointing at the
broker (the Edge actor runs the bridge; fixes reach the Transcript actor's
``record_fixes``). The bench waits until ``EdgeClient.stats().connected`` and a
probe fix shows up in the store.

1. **Mosquitto's own round trip.** One publisher client in this process and
   one subscriber client in a child process (its own GIL, as the bridge has),
   paho v2 API, QoS 1, in-flight window ``--inflight``, on a topic the bridge
   does not read; payloads of about a fix's size, each carrying its index. The
   publisher notes ``time.time()`` as it hands a message to paho, the
   subscriber as ``on_message`` runs. Saturated (``--messages``, published as
   fast as paho takes them) and paced (``--rate`` msg/s for ``--paced-s`` s).
2. **Through the bridge into the store, saturated.** ``--warmup`` messages
   first (not counted), then ``--messages`` OwnTracks ``location`` payloads on
   ``owntracks/bench/<device>`` (one device per publisher client), published
   asynchronously, QoS 1, by ``--publishers`` paho clients with the in-flight
   window raised to ``--inflight`` (messages beyond it wait in paho's queue).
   Every message has a unique ``tst`` (a global counter from two days ago, well
   inside the bridge's ``max_age_s``), so a row is matched to its message by
   (device, at). ``time.time()`` is noted per message as it is handed to paho.
3. **Through the bridge, paced**: each ``--rate`` in turn (msg/s) for
   ``--paced-s`` seconds, each message sent at its slot (the delay under
   saturation is mostly queueing; this one is the path). The goal (>= 2,000
   msg/s with p99 <= 50 ms) is judged on the saturated rate and on the paced
   runs' p99 to the row being readable.

How rows are seen. A thread here reads the SQLite file through its own
read-only connection (WAL lets it read while the actor writes) every
``--poll-ms`` ms: ``SELECT ... WHERE id > last``. Two delays per message:

* **publish -> stored_at**: ``stored_at`` is the Transcript actor's
  ``time.time()`` in ``runtime.memories.location.store_fixes`` -- taken once per call,
  *before* ``BEGIN IMMEDIATE`` and the inserts, so it misses the transaction
  and commit of that batch;
* **publish -> visible**: when the polling reader first saw the row (after the
  commit; late by at most the poll interval plus a read).

Sustained rate = N / (last stored_at - first publish) (and the same to the last
row seen). Offered rate = N / (last publish handed to paho - first); acked rate
= N / (last PUBACK - first publish). Each distinct ``stored_at`` is one
``record_fixes`` call, which gives the bridge's batch sizes.

4. **Stages** (unless ``--no-stages``): where a message's time goes, each part
   timed alone in this process: the topic map's parse; building the
   ``RecordFixes`` message (pydantic, the bridge's side); a pickle round trip
   of it (what Ray does); the Transcript actor's ``accept`` and conversion to
   ``LocationRecord``; ``location.store_fixes`` on a scratch store (with and
   without the back-fill query; its transcript is empty, as in the runs); and
   the whole ``TranscriptClient.record_fixes`` Ray call, per batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _common as c
import paho.mqtt.client as mqtt

from actors import supervisor
from actors.common import accept, load_profiles
from actors.edge import as_fix
from actors.handles import EdgeClient, TranscriptClient
from actors.messages import RecordFixes
from device.records import LocationRecord
from device.topics import TopicMap
from runtime.config import Settings
from runtime.memories import location
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.mosquitto import free_port, start_mosquitto, stop_process, wait_listening

USER = "bench"
RTT_TOPIC = "bench/rtt"
GOAL_RATE = 2000.0
GOAL_P99_MS = 50.0


# -- the broker ----------------------------------------------------------------

class Broker:
    """Mosquitto on a free loopback port, no persistence (nothing to keep), so no
    directory the ``mosquitto`` user must be able to enter (tests/mosquitto.py)."""

    def __init__(self, workdir: Path, inflight: int, nodelay: bool = False) -> None:
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_queued_messages 100000\n"
            f"max_inflight_messages {inflight}\n"
            f"set_tcp_nodelay {'true' if nodelay else 'false'}\n"
            "log_dest stderr\n"
            "log_type error\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Broker:
        self.proc = start_mosquitto(self.conf)
        wait_listening(self.proc, self.port)
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


# -- MQTT clients --------------------------------------------------------------

class Publisher:
    """A QoS 1 publisher with paho's in-flight window raised; counts PUBACKs."""

    def __init__(self, port: int, client_id: str, inflight: int) -> None:
        self.acked = 0
        self.last_ack = 0.0
        self._connected = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=True, protocol=mqtt.MQTTv311)
        self.client.max_inflight_messages_set(inflight)
        self.client.max_queued_messages_set(0)  # no limit: paho queues beyond the window
        self.client.on_connect = lambda *a: self._connected.set()
        self.client.on_publish = self._on_publish
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not self._connected.wait(10):
            raise RuntimeError(f"publisher {client_id} did not connect")

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any,
                    properties: Any) -> None:
        self.acked += 1
        self.last_ack = time.time()

    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise RuntimeError(f"publish failed: {mqtt.error_string(info.rc)}")

    def wait_acked(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.acked < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.acked >= n

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


#: The round trip's subscriber runs in its own process (as the bridge does), so that
#: it does not share this driver's GIL with the publisher. It prints "ready" once
#: subscribed, then, at the end, {index: time.time() on arrival} as JSON.
SUBSCRIBER = r"""
import json, sys, threading, time
import paho.mqtt.client as mqtt
port, topic, n, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
arrived = {}
done = threading.Event()
def on_message(client, userdata, msg):
    arrived[int(msg.payload.split(b" ", 1)[0])] = time.time()
    if len(arrived) >= n:
        done.set()
cl = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-rtt-sub",
                 clean_session=True, protocol=mqtt.MQTTv311)
cl.on_message = on_message
cl.on_subscribe = lambda *a: print("ready", flush=True)
cl.on_connect = lambda c, *a: c.subscribe(topic, qos=1)
cl.connect("127.0.0.1", port)
cl.loop_start()
done.wait(timeout)
cl.disconnect()
cl.loop_stop()
json.dump(arrived, sys.stdout)
"""


class Subscriber:
    """The subscriber process; ``arrivals()`` waits for its figures."""

    def __init__(self, port: int, topic: str, n: int, timeout: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUBSCRIBER, str(port), topic, str(n), str(timeout)],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the round-trip subscriber did not subscribe")

    def arrivals(self, timeout: float) -> dict[int, float]:
        out, _ = self.proc.communicate(timeout=timeout)
        return {int(k): float(v) for k, v in json.loads(out or "{}").items()}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


# -- the store, seen from outside -------------------------------------------------

class Poller(threading.Thread):
    """Reads new ``location_fixes`` rows every ``interval`` s through a read-only
    connection; notes (stored_at, time first seen) per (device, at)."""

    def __init__(self, db: Path, interval: float) -> None:
        super().__init__(name="store-poller", daemon=True)
        self.db = db
        self.interval = interval
        self.seen: dict[tuple[str, float], tuple[float, float]] = {}
        self.per_device: Counter[str] = Counter()
        self.polls = 0
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            self.error = f"open: {exc}"
            return
        last = 0
        try:
            while not self._halt.is_set():
                rows = conn.execute("SELECT id, device, at, stored_at FROM location_fixes"
                                    " WHERE id > ? ORDER BY id", (last,)).fetchall()
                now = time.time()
                self.polls += 1
                for rid, device, at, stored_at in rows:
                    self.seen[(device, float(at))] = (float(stored_at), now)
                    self.per_device[device] += 1
                    last = rid
                self._halt.wait(self.interval)
        except sqlite3.Error as exc:
            self.error = f"read: {exc}"
        finally:
            conn.close()

    def wait_for(self, devices: Sequence[str], n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(self.per_device[d] for d in devices) >= n:
                return True
            if self.error:
                raise RuntimeError(f"store poller failed: {self.error}")
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# -- payloads --------------------------------------------------------------------

class Stamps:
    """Unique OwnTracks times: a global counter from two days ago."""

    def __init__(self) -> None:
        self.base = int(time.time()) - 2 * 86400
        self.i = 0

    def next(self) -> int:
        self.i += 1
        return self.base + self.i


def owntracks(tst: int) -> bytes:
    return json.dumps({"_type": "location", "lat": 52.0 + (tst % 1000) * 1e-4,
                       "lon": 4.0 + (tst % 997) * 1e-4, "tst": tst,
                       "acc": 10}).encode()


def paced_slots(n: int, rate: float) -> Callable[[int], None]:
    """Sleep until message i's slot (t0 + i / rate); the clock starts at i = 0."""
    t0 = [0.0]

    def wait(i: int) -> None:
        if i == 0:
            t0[0] = time.perf_counter()
            return
        left = t0[0] + i / rate - time.perf_counter()
        if left > 0:  # sleep, no spinning: two cores are shared with everything else
            time.sleep(left)
    return wait


# -- 1. Mosquitto's own round trip ------------------------------------------------

def baseline(port: int, n: int, inflight: int, rate: float | None,
             timeout: float) -> dict[str, Any]:
    sub = Subscriber(port, RTT_TOPIC, n, timeout + (n / rate if rate else 0.0))
    pub = Publisher(port, "bench-rtt-pub", inflight)
    try:
        sent: list[float] = [0.0] * n
        wait = paced_slots(n, rate) if rate else None
        for i in range(n):
            if wait:
                wait(i)
            payload = f"{i} {'x' * 80}".encode()  # about an OwnTracks fix's size
            sent[i] = time.time()
            pub.publish(RTT_TOPIC, payload)
        handed = time.time()
        arrived = sub.arrivals(timeout + 30)
    finally:
        pub.close()
        sub.close()
    ms = [(arrived[i] - sent[i]) * 1000 for i in range(n) if i in arrived]
    last = max(arrived.values()) if arrived else sent[0]
    return {"path": "mosquitto round trip", "mode": f"paced {rate:g}/s" if rate else "saturated",
            "messages": n, "received": len(arrived),
            "offered_msg_s": round(n / max(handed - sent[0], 1e-9), 1),
            "sustained_msg_s": round(len(arrived) / max(last - sent[0], 1e-9), 1),
            "latency": c.lat_summary(ms)}


# -- CPU per process -----------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    """``root``'s descendants (by parent pid in /proc): this driver's own Ray node
    (raylet, workers), never another instance running on the machine."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return sorted(found)


def find_pids(broker: Broker) -> dict[str, int]:
    """The processes on a message's path: this driver (the publisher), Mosquitto,
    the Edge and Transcript actors (by Ray's process titles), the raylet."""
    pids = {"driver (publisher, poller)": os.getpid()}
    if broker.proc is not None:
        pids["mosquitto"] = broker.proc.pid
    wanted = {"ray::EdgeActor": "Edge actor (bridge)",
              "ray::TranscriptActor": "Transcript actor (store)"}
    for pid in _descendants(os.getpid()):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
        for prefix, name in wanted.items():
            if line.startswith(prefix) and name not in pids:
                pids[name] = pid
        if line.endswith("/raylet") and "raylet" not in pids:
            pids["raylet"] = pid
    return pids


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds so far, per process (all its threads)."""
    out = {}
    for name, pid in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[name] = (int(fields[11]) + int(fields[12])) / TICK
    return out


# -- 2/3. through the bridge ------------------------------------------------------

def bridge_run(label: str, pubs: list[Publisher], poller: Poller, stamps: Stamps, n: int,
               rate: float | None, timeout: float, edge: EdgeClient,
               pids: dict[str, int]) -> dict[str, Any]:
    devices = [f"{label}{k}" for k in range(len(pubs))]
    topics = [f"owntracks/{USER}/{d}" for d in devices]
    before = edge.stats()
    acked0 = [p.acked for p in pubs]
    sent: dict[tuple[str, float], float] = {}
    wait = paced_slots(n, rate) if rate else None
    k = len(pubs)
    payloads = []
    for i in range(n):
        tst = stamps.next()
        payloads.append((i % k, float(tst), owntracks(tst)))
    cpu0 = cpu_seconds(pids)
    first = time.time()
    for i, (j, at, body) in enumerate(payloads):
        if wait:
            wait(i)
        sent[(devices[j], at)] = time.time()
        pubs[j].publish(topics[j], body)
    handed = time.time()
    per_pub = Counter(j for j, _, _ in payloads)
    for j, p in enumerate(pubs):
        p.wait_acked(acked0[j] + per_pub[j], timeout)
    last_ack = max(p.last_ack for p in pubs)
    complete = poller.wait_for(devices, n, timeout)
    cpu1 = cpu_seconds(pids)
    elapsed = time.time() - first
    after = edge.stats()
    rows = {key: poller.seen[key] for key in sent if key in poller.seen}
    stored_ms = [(rows[key][0] - sent[key]) * 1000 for key in rows]
    visible_ms = [(rows[key][1] - sent[key]) * 1000 for key in rows]
    last_stored = max((v[0] for v in rows.values()), default=first)
    last_seen = max((v[1] for v in rows.values()), default=first)
    batches = Counter(v[0] for v in rows.values())  # one stored_at per record_fixes call
    sizes = sorted(batches.values())
    return {
        "path": "bridge -> store", "mode": f"paced {rate:g}/s" if rate else "saturated",
        "messages": n, "stored": len(rows), "complete": complete,
        "publishers": len(pubs),
        "offered_msg_s": round(n / max(handed - first, 1e-9), 1),
        "acked_msg_s": round(n / max(last_ack - first, 1e-9), 1),
        "sustained_msg_s": round(len(rows) / max(last_stored - first, 1e-9), 1),
        "sustained_visible_msg_s": round(len(rows) / max(last_seen - first, 1e-9), 1),
        "publish_s": round(handed - first, 3),
        "last_stored_after_s": round(last_stored - first, 3),
        "publish_to_stored_at": c.lat_summary(stored_ms),
        "publish_to_visible": c.lat_summary(visible_ms),
        "record_fixes_calls": len(sizes),
        "batch_size": {"mean": round(statistics.fmean(sizes), 1) if sizes else 0,
                       "p50": c.pct(sizes, 50), "max": max(sizes, default=0)},
        "cpu": {name: {"cpu_s": round(cpu1[name] - cpu0[name], 2),
                       "us_per_msg": round((cpu1[name] - cpu0[name]) / n * 1e6, 1),
                       "busy_pct": round((cpu1[name] - cpu0[name]) / elapsed * 100, 1)}
                for name in cpu1 if name in cpu0},
        "bridge_delta": {key: after.model_dump()[key] - before.model_dump()[key]
                         for key in ("accepted", "stored")}
                        | {"rejected": after.rejected, "error": after.error},
    }


def probe(pub: Publisher, poller: Poller, stamps: Stamps, timeout: float) -> float:
    """Publish one fix every 0.25 s until the store has one (the bridge's
    subscription is made after ``connected`` turns true)."""
    t = time.perf_counter()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pub.publish(f"owntracks/{USER}/probe", owntracks(stamps.next()))
        if poller.wait_for(["probe"], 1, 0.25):
            return time.perf_counter() - t
    raise RuntimeError("no probe fix reached the store: is the bridge subscribed?")


# -- 4. stages --------------------------------------------------------------------

def _median_ms(fn: Callable[[Any], Any], inputs: Sequence[Any]) -> float:
    """Median milliseconds of ``fn(x)`` over the prepared ``inputs``."""
    times = []
    for x in inputs:
        t = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 3)


def stages(settings: Settings, stamps: Stamps, work: Path) -> dict[str, Any]:
    """Each part of a message's path, timed alone (median per call)."""
    out: dict[str, Any] = {}
    topic_map = TopicMap.from_settings(settings.mqtt)
    now = time.time()
    payloads = [owntracks(stamps.next()) for _ in range(5000)]
    t = time.perf_counter()
    recs = [topic_map.parse(f"owntracks/{USER}/stage", p, now)[0] for p in payloads]
    out["parse_us_per_msg"] = round((time.perf_counter() - t) / len(payloads) * 1e6, 2)

    def fixes(n: int, device: str) -> list[LocationRecord]:
        return [LocationRecord(person=USER, lat=r.lat, lon=r.lon, at=float(stamps.next()),
                               source="owntracks", accuracy_m=10.0, device=device)
                for r in recs[:n]]

    sizes = (1, 20, 100, 500)
    repeat = 15
    out["message_build_ms"] = {
        str(n): _median_ms(lambda rs: RecordFixes(fixes=[as_fix(f) for f in rs]),
                           [recs[:n]] * repeat) for n in sizes}

    built = {n: RecordFixes(fixes=[as_fix(f) for f in recs[:n]]) for n in sizes}
    out["pickle_round_trip_ms"] = {  # what Ray does to the message, both ways
        str(n): _median_ms(lambda m: pickle.loads(pickle.dumps(m, protocol=5)),
                           [built[n]] * repeat) for n in sizes}
    out["actor_accept_ms"] = {  # TranscriptActor.record_fixes before store_fixes
        str(n): _median_ms(lambda m: [LocationRecord(**f.model_dump())
                                      for f in accept(RecordFixes, m).fixes],
                           [built[n]] * repeat) for n in sizes}

    scratch = Store(work / "stages.db", FactKinds.load(settings.memory.fact_kinds_file))
    profiles = load_profiles(settings)
    direct: dict[str, float] = {}
    no_backfill: dict[str, float] = {}
    real_backfill = location._backfill
    try:
        for n in sizes:
            direct[str(n)] = _median_ms(
                lambda fs: location.store_fixes(scratch, fs, profiles),
                [fixes(n, "direct") for _ in range(repeat)])
        location._backfill = lambda *a: 0  # type: ignore[assignment]  # this process only
        for n in sizes:
            no_backfill[str(n)] = _median_ms(
                lambda fs: location.store_fixes(scratch, fs, profiles),
                [fixes(n, "nobf") for _ in range(repeat)])
    finally:
        location._backfill = real_backfill  # type: ignore[assignment]
        scratch.close()
    out["store_fixes_ms"] = direct
    out["store_fixes_without_backfill_ms"] = no_backfill

    client = TranscriptClient(settings.runtime.namespace)
    ray_call: dict[str, float] = {}
    for n in sizes:
        ray_call[str(n)] = _median_ms(
            client.record_fixes,
            [RecordFixes(fixes=[as_fix(f) for f in fixes(n, "raycall")]) for _ in range(repeat)])
    out["record_fixes_call_ms"] = ray_call
    return out


# -- the run ----------------------------------------------------------------------

def wait_connected(edge: EdgeClient, timeout: float) -> float:
    t = time.perf_counter()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if edge.stats(timeout=5).connected:
                return time.perf_counter() - t
        except Exception:  # the actor may still be starting
            pass
        time.sleep(0.1)
    raise RuntimeError("the Edge actor did not connect to the broker")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    broker = Broker(work, args.broker_inflight, args.tcp_nodelay).start()
    c.log(f"mosquitto on 127.0.0.1:{broker.port} (max_inflight_messages "
          f"{args.broker_inflight}, set_tcp_nodelay {args.tcp_nodelay})")
    pubs: list[Publisher] = []
    poller: Poller | None = None
    try:
        settings = c.make_settings(work / "data", mqtt={
            "host": "127.0.0.1", "port": broker.port, "client_id": "reverie-bench"})
        ns = settings.runtime.namespace
        with c.local_ray(settings, dashboard=args.dashboard) as info:
            t = time.perf_counter()
            sup = supervisor.start(settings)
            ready_s = time.perf_counter() - t
            try:
                edge = EdgeClient(ns)
                connect_s = wait_connected(edge, 30)
                c.log(f"actors ready in {ready_s:.1f} s; bridge connected after "
                      f"{connect_s:.2f} s")
                results: dict[str, Any] = {"ray_init_s": round(info["init_s"], 2),
                                           "actors_ready_s": round(ready_s, 2),
                                           "dashboard_url": info["dashboard_url"],
                                           "mosquitto_paced": {}, "bridge_paced": {}}
                # the broker alone first, before the store poller's thread runs here
                c.log(f"mosquitto round trip: {args.messages:,} saturated, then "
                      f"{', '.join(f'{r:g}' for r in args.rates)} msg/s for "
                      f"{args.paced_s:g} s each")
                results["mosquitto_saturated"] = baseline(
                    broker.port, args.messages, args.inflight, None, args.timeout)
                for rate in args.rates:
                    results["mosquitto_paced"][f"{rate:g}"] = baseline(
                        broker.port, max(1, round(rate * args.paced_s)), args.inflight, rate,
                        args.timeout)

                poller = Poller(settings.store.path, args.poll_ms / 1000)
                poller.start()
                stamps = Stamps()
                pubs = [Publisher(broker.port, f"bench-pub-{k}", args.inflight)
                        for k in range(args.publishers)]
                probe_s = probe(pubs[0], poller, stamps, 30)
                pids = find_pids(broker)
                c.log(f"probe fix stored after {probe_s:.2f} s")

                if args.warmup:
                    c.log(f"bridge warm-up: {args.warmup:,} messages")
                    results["bridge_warmup"] = bridge_run(
                        "warm", pubs, poller, stamps, args.warmup, None, args.timeout, edge, pids)
                c.log(f"bridge saturated: {args.messages:,} messages")
                results["bridge_saturated"] = bridge_run(
                    "sat", pubs, poller, stamps, args.messages, None, args.timeout, edge, pids)
                for i, rate in enumerate(args.rates):
                    n = max(1, round(rate * args.paced_s))
                    c.log(f"bridge paced: {n:,} messages at {rate:g}/s")
                    results["bridge_paced"][f"{rate:g}"] = bridge_run(
                        f"paced{i}-", pubs, poller, stamps, n, rate, args.timeout, edge, pids)
                results["bridge_stats_at_end"] = edge.stats().model_dump()
                results["poller"] = {"polls": poller.polls, "interval_ms": args.poll_ms}
                if args.stages:
                    c.log("stages: parse, message build, store_fixes, record_fixes call")
                    results["stages"] = stages(settings, stamps, work)
                return results
            finally:
                for p in pubs:
                    p.close()
                if poller is not None:
                    poller.stop()
                c.stop_runtime(sup)
    finally:
        broker.stop()


def rates(text: str) -> list[float]:
    out = [float(x) for x in text.split(",") if x.strip()]
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError("a comma-separated list of positive rates")
    return out


def report(args: argparse.Namespace, res: dict[str, Any]) -> tuple[bool, bool, str]:
    """Print the tables; return (rate goal met, p99 goal met, the summary line)."""
    runs = [res["mosquitto_saturated"], *res["mosquitto_paced"].values(),
            res["bridge_saturated"], *res["bridge_paced"].values()]
    rows = []
    for r in runs:
        lat = r.get("publish_to_stored_at", r.get("latency"))
        vis = r.get("publish_to_visible", r.get("latency"))
        rows.append([r["path"], r["mode"], r["messages"], r.get("stored", r.get("received")),
                     r["offered_msg_s"], r["sustained_msg_s"], lat["p50_ms"], lat["p99_ms"],
                     vis["p50_ms"], vis["p99_ms"], vis["max_ms"]])
    print()
    print(c.table(["path", "mode", "sent", "arrived", "offered/s", "sustained/s",
                   "p50 ms", "p99 ms", "vis p50", "vis p99", "vis max"], rows))
    print("(bridge: p50/p99 = publish -> stored_at; vis = publish -> row seen by a reader"
          f" polling every {args.poll_ms:g} ms; mosquitto: publish -> on_message)")
    for r in [res["bridge_saturated"], *res["bridge_paced"].values()]:
        print(f"{r['mode']:>14}: {r['record_fixes_calls']:,} record_fixes calls, batch mean "
              f"{r['batch_size']['mean']} / max {r['batch_size']['max']}; acked by the broker "
              f"at {r['acked_msg_s']:,.0f} msg/s; bridge {r['bridge_delta']}")
    r = res["bridge_saturated"]
    print(f"\nCPU during the saturated run ({r['messages']:,} messages; busy % of one core):")
    print(c.table(["process", "CPU s", "us/msg", "busy %"],
                  [[k, v["cpu_s"], v["us_per_msg"], v["busy_pct"]] for k, v in r["cpu"].items()]))
    if "stages" in res:
        s = res["stages"]
        print(f"\nstages (median ms per call, by batch size): parse "
              f"{s['parse_us_per_msg']} us/msg")
        sizes = list(s["store_fixes_ms"])
        print(c.table(["stage", *[f"batch {n}" for n in sizes]], [
            ["RecordFixes build (bridge side)", *s["message_build_ms"].values()],
            ["pickle round trip (Ray's part)", *s["pickle_round_trip_ms"].values()],
            ["accept + LocationRecord (actor)", *s["actor_accept_ms"].values()],
            ["store_fixes (in process)", *s["store_fixes_ms"].values()],
            ["store_fixes without back-fill", *s["store_fixes_without_backfill_ms"].values()],
            ["record_fixes Ray call (driver)", *s["record_fixes_call_ms"].values()]]))

    sat = res["bridge_saturated"]
    ms = res["mosquitto_saturated"]
    ok_rate = sat["sustained_msg_s"] >= GOAL_RATE
    ok_p99 = all(p["publish_to_visible"]["p99_ms"] <= GOAL_P99_MS and p["complete"]
                 for p in res["bridge_paced"].values())
    paced = "; ".join(
        f"at {k}/s p50/p99 {p['publish_to_visible']['p50_ms']:.1f}/"
        f"{p['publish_to_visible']['p99_ms']:.1f} ms (mosquitto "
        f"{res['mosquitto_paced'][k]['latency']['p50_ms']:.2f}/"
        f"{res['mosquitto_paced'][k]['latency']['p99_ms']:.2f})"
        for k, p in res["bridge_paced"].items())
    summary = (
        f"bridge {sat['sustained_msg_s']:,.0f} msg/s sustained into the store (goal >= "
        f"{GOAL_RATE:,.0f}: {'met' if ok_rate else 'MISSED'}; mosquitto alone "
        f"{ms['sustained_msg_s']:,.0f}); publish -> row readable {paced} (goal p99 <= "
        f"{GOAL_P99_MS:g} ms: {'met' if ok_p99 else 'MISSED'}); saturated (queueing) p50/p99 "
        f"{sat['publish_to_visible']['p50_ms']:,.0f}/{sat['publish_to_visible']['p99_ms']:,.0f}"
        " ms")
    return ok_rate, ok_p99, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000, help="saturated run size")
    ap.add_argument("--warmup", type=int, default=500, help="bridge warm-up (not counted)")
    ap.add_argument("--rate", dest="rates", type=rates, default=[500.0, 2000.0],
                    help="paced runs, msg/s, comma-separated (default 500,2000)")
    ap.add_argument("--paced-s", type=float, default=5.0, help="each paced run, seconds")
    ap.add_argument("--publishers", type=int, default=1,
                    help="publisher clients (one OwnTracks device each)")
    ap.add_argument("--inflight", type=int, default=1000,
                    help="each publisher's paho in-flight window (QoS 1)")
    ap.add_argument("--broker-inflight", type=int, default=20,
                    help="mosquitto max_inflight_messages per client (20: its default;"
                         " 0: no limit)")
    ap.add_argument("--tcp-nodelay", action="store_true",
                    help="mosquitto set_tcp_nodelay true (its default is false: Nagle on)")
    ap.add_argument("--poll-ms", type=float, default=2.0,
                    help="how often the read-only connection looks for new rows")
    ap.add_argument("--timeout", type=float, default=90.0, help="per-phase wait, seconds")
    ap.add_argument("--no-stages", dest="stages", action="store_false",
                    help="skip timing the stages alone")
    ap.add_argument("--dashboard", action="store_true", help="start Ray's dashboard")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    wall = time.perf_counter()
    load_before = c.loadavg()

    work = Path(tempfile.mkdtemp(prefix="rvb-mqtt-"))
    try:
        res = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ok_rate, ok_p99, summary = report(args, res)
    wall_s = time.perf_counter() - wall
    print(f"\nSUMMARY mqtt_ingest ({args.messages:,} saturated, QoS 1): {summary}; "
          f"wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "mqtt_ingest", "machine": c.machine() | {"loadavg_at_start": load_before},
        "wall_s": round(wall_s, 1),
        "params": {k: v for k, v in vars(args).items() if k != "json_out"} | {
            "payload": "OwnTracks location, about 90 bytes", "qos": 1,
            "goals": {"sustained_msg_s": GOAL_RATE, "p99_ms": GOAL_P99_MS},
            "publishing": "asynchronous: paho publish() with the in-flight window raised"
                          " (--inflight), one device per publisher client",
            "delays": "publish_to_stored_at: stored_at (stamped before the transaction) -"
                      " time.time() at publish; publish_to_visible: first seen by a"
                      " read-only connection polling every poll_ms - time.time() at publish"},
        "results": res | {"goals_met": {"rate": ok_rate, "paced_p99": ok_p99}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
