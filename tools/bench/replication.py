#!/usr/bin/env python3
"""Litestream replication: write throughput with and without it, replication lag, restore time.

Usage:
    tools/bench/replication.py [--turns 20000] [--batch 64] [--rounds 2] [--rate 50]
                               [--duration 30]
                               [--lag-batch 1] [--restore-turns 100000] [--no-vectors]
                               [--skip throughput,direct,lag,restore] [--json OUT.json]

Every replica is a ``file:///`` directory on the same disk (``replica.url``), with
the shipped ``replica.sync_interval_s`` (1 s) and Litestream's ``monitor-interval``
(1 s, set by ``device/replicator.py``). One private local Ray node (no dashboard)
serves the actor runs; each run has a fresh store, fresh actors and a fresh replica.

1. Write throughput, through the actors. ``--turns`` synthetic household turns
   appended as ``AppendTurns`` messages of ``--batch`` turns, one in flight (as
   ``ingest.py``), once with ``replica.url`` empty and once with a file replica
   (the Supervisor then starts the Replicator, i.e. ``litestream replicate``),
   ``--rounds`` times each, alternating which goes first; medians are reported.
   Before t0 a warm-up append and, with the replica, a wait until the
   replica holds Litestream's first upload and ``Replicator.status()`` has seen
   it (the initial snapshot stays out of the timed part). Acknowledged turns/s
   = turns / (last append returned - t0). Recall embeds the turns concurrently
   in both runs (it is part of the real path; its backlog is dropped at stop).
   With the replica, "caught up" is the time from the last acknowledgement
   until the replica holds the last turn (it carries a marker, found as in 2.),
   and after the stop the replica is restored and compared with the live store
   (integrity check, transcript count and newest id, vector count).

   Direct (``--skip direct`` to leave out): the same turns written in the driver
   through ``TranscriptService`` (one ``BEGIN IMMEDIATE`` transaction per batch,
   as the Transcript actor does), without and with a ``Replicator`` running on
   that store: SQLite and Litestream alone, without Ray, embedding or IPC.

   ``Replicator.sync_now`` is not used while the store is written: Litestream
   0.5.17's ``POST /sync`` with ``wait`` (what it sends), when it races the
   daemon's own sync loop, was seen to leave a replica missing committed pages
   (restored: "wrong # of entries in index", "database disk image is
   malformed"); the write phases wait for Litestream's own syncs instead.

2. Replication lag under a steady stream (with the replica, through the actors).
   Appends of ``--lag-batch`` turns are scheduled at ``--rate`` turns/s for
   ``--duration`` s. The first turn of each append carries a unique marker in
   its text (``rvbmark-NNNNNN``); the driver notes the wall-clock time the
   append returned (the commit happened just before). Method: a poller thread
   lists the replica's level-0 directory (``<replica>/ltx/0``, where Litestream
   v0.5 uploads one ``<minTXID>-<maxTXID>.ltx`` file per WAL read) every 50 ms,
   reads each new file, decodes its pages (LTX: 100-byte header, then per page
   a 6-byte header and a size-prefixed raw LZ4 block, decoded with the ``lz4``
   package) and searches the page images for markers. An LTX file holds only
   committed transactions and is applied whole, so the first uploaded file with
   a page holding a marker is the moment a restore would include that append.
   Lag = (listing time at which that file was first seen) - (append returned):
   at most one poll interval late (the file was confirmed absent at the
   previous listing), and short by the append's return trip. Split into
   *pickup* (the LTX header's timestamp, Litestream's clock when it built the
   file from the WAL, minus the acknowledgement: up to ``monitor-interval``)
   and *upload* (seen minus built: the wait for the next replica sync, up to
   ``sync-interval``, plus the copy).

   Meanwhile ``Replicator.status()`` is sampled every 0.25 s (its ``lag_s`` is
   what ``reverie status`` shows), and its documented promise is checked
   against the markers: at a sample with ``last_sync_at`` L, every append
   acknowledged before L - 1 s is in the replica. A violation is counted only
   when the marker's file was still absent at a listing made after the sample.
   After the stop the replica is restored and compared with the store (as in 1.).

3. Restore time of a ``--restore-turns`` store. Built in the driver (no Ray):
   the turns through ``TranscriptService`` in transactions of 5,000, plus one
   384-float vector per turn (random float32, the size MiniLM's are; what the
   Recall actor stores for every memory turn) unless ``--no-vectors``; the
   store is closed. Then a ``Replicator`` is started, ``sync_now`` waits for
   the initial snapshot ("replicate" time, from start; nothing writes the
   store meanwhile), and it is stopped.
   Timed: ``device.replicator.restore_into`` into a new file (Litestream's
   restore plus the ``PRAGMA integrity_check`` it runs); the integrity check is
   then timed alone on the result. The replica's files were just written, so
   they are in the page cache: a NAS or S3 replica adds transfer time.

The machine is a shared 2-core box: other work may run while this does (load
averages are recorded before and after each phase).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common as c
import numpy as np

from actors import supervisor
from actors.common import TRANSCRIPT, actor, load_profiles, open_store
from actors.messages import AppendTurns
from device.replicator import (
    MONITOR_INTERVAL_S,
    ReplicaError,
    Replicator,
    db_path,
    integrity_problems,
    restore_into,
)
from runtime.config import ReplicaSettings, Settings
from runtime.llm.embedder import MINILM_DIM, MINILM_NAME
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.store.database import Store

WARMUP = 16
POLL_S = 0.05            # replica directory listing interval
STATUS_EVERY_S = 0.25    # Replicator.status() sampling interval
BUILD_TX = 5000          # turns per transaction when building the restore store
MARK = "rvbmark-"
MARK_RE = re.compile(rb"rvbmark-(\d{6})")

# -- LTX (Litestream v0.5) reading -------------------------------------------

LTX_HEADER = 100
PAGE_FLAG_SIZE = 0x0001  # a 4-byte compressed size follows the page header


class Incomplete(Exception):
    """The LTX file is shorter than its structure says (still being written)."""


def lz4_block(src: bytes, size: int) -> bytes:
    """Decompress one raw LZ4 block (no frame) that expands to ``size`` bytes."""
    import lz4.block

    out: bytes = lz4.block.decompress(src, uncompressed_size=size)
    if len(out) != size:
        raise ValueError(f"LZ4 block gave {len(out)} bytes, expected {size}")
    return out


def read_ltx(data: bytes) -> tuple[dict[str, int], list[bytes]]:
    """An LTX file's header fields and its decoded page images."""
    if len(data) < LTX_HEADER:
        raise Incomplete
    if data[:4] != b"LTX1":
        raise ValueError("not an LTX file")
    flags, page_size, commit = struct.unpack(">III", data[4:16])
    min_txid, max_txid, ts_ms = struct.unpack(">QQq", data[16:40])
    header = {"flags": flags, "page_size": page_size, "commit": commit,
              "min_txid": min_txid, "max_txid": max_txid, "timestamp_ms": ts_ms}
    pages: list[bytes] = []
    pos = LTX_HEADER
    while True:
        if pos + 6 > len(data):
            raise Incomplete
        pgno, pflags = struct.unpack(">IH", data[pos:pos + 6])
        pos += 6
        if pgno == 0:
            return header, pages
        if not pflags & PAGE_FLAG_SIZE:
            raise ValueError("LTX page stored as an LZ4 frame (older format): not supported")
        if pos + 4 > len(data):
            raise Incomplete
        (size,) = struct.unpack(">I", data[pos:pos + 4])
        pos += 4
        if pos + size > len(data):
            raise Incomplete
        pages.append(lz4_block(data[pos:pos + size], page_size))
        pos += size


class ReplicaWatcher(threading.Thread):
    """Lists ``<replica>/ltx/0`` every ``POLL_S`` and notes, for each marker, the
    first uploaded LTX file holding it: (seen at, previous listing, built at, txid)."""

    def __init__(self, replica_dir: Path) -> None:
        super().__init__(daemon=True, name="replica-watcher")
        self.dir = replica_dir / "ltx" / "0"
        self.stop = threading.Event()
        self.done: set[str] = set()
        self.primed: set[str] = set()
        self.first: dict[int, dict[str, float | int]] = {}
        self.files = 0
        self.pages = 0
        self.decode_s = 0.0
        self.errors: list[str] = []
        self._prev_listing = time.time()
        self._lock = threading.Lock()

    def prime(self) -> None:
        """Files already uploaded (the snapshot, the warm-up) are not looked at."""
        with contextlib.suppress(FileNotFoundError):
            self.primed = {e.name for e in os.scandir(self.dir)}
        self.done.update(self.primed)
        self._prev_listing = time.time()

    def rescan_primed(self) -> None:
        """Read the files :meth:`prime` skipped (to learn whether one already held a marker)."""
        self.done -= self.primed
        self._prev_listing = 0.0
        self.poll(only=self.primed, listed_at=0.0)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(POLL_S)
        self.poll()

    def poll(self, only: set[str] | None = None, listed_at: float | None = None) -> None:
        listed_at = time.time() if listed_at is None else listed_at
        try:
            names = sorted(e.name for e in os.scandir(self.dir) if e.name.endswith(".ltx"))
        except FileNotFoundError:
            names = []
        if only is not None:
            names = [n for n in names if n in only]
        prev, self._prev_listing = self._prev_listing, listed_at
        for name in names:
            if name in self.done:
                continue
            t = time.perf_counter()
            try:
                header, pages = read_ltx((self.dir / name).read_bytes())
            except (Incomplete, FileNotFoundError):
                continue  # try again at the next listing
            except (ValueError, IndexError, struct.error) as e:
                self.done.add(name)
                self.errors.append(f"{name}: {e}")
                continue
            self.decode_s += time.perf_counter() - t
            self.done.add(name)
            self.files += 1
            self.pages += len(pages)
            with self._lock:
                for page in pages:
                    for m in MARK_RE.finditer(page):
                        k = int(m.group(1))
                        if k not in self.first:
                            self.first[k] = {"seen_at": listed_at, "absent_at": prev,
                                             "built_at": header["timestamp_ms"] / 1000.0,
                                             "txid": header["max_txid"]}

    def seen(self, k: int) -> dict[str, float | int] | None:
        with self._lock:
            return self.first.get(k)


# -- helpers -------------------------------------------------------------------


def replica_url(path: Path) -> str:
    return "file://" + str(path.resolve())


def settings_for(work: Path, name: str, replica: bool) -> Settings:
    sections: dict[str, dict[str, Any]] = {}
    if replica:
        sections["replica"] = {"url": replica_url(work / f"replica-{name}")}
    return c.make_settings(work / f"data-{name}", **sections)


def sync_replica(rep: Replicator, timeout_s: float = 60.0) -> tuple[float, dict[str, Any]]:
    """``rep.sync_now``, retried while the control socket is not up yet; (seconds, answer).

    Used only where nothing writes to the store (the restore phase): a
    ``POST /sync`` with ``wait`` racing Litestream's own sync loop while the
    store is written can leave a replica that misses committed pages (module
    doc), so the write phases never call it."""
    t = time.perf_counter()
    deadline = t + timeout_s
    while True:
        try:
            answer = rep.sync_now(timeout_s=max(1.0, deadline - time.perf_counter()))
            return time.perf_counter() - t, answer
        except (OSError, ReplicaError) as e:
            if time.perf_counter() > deadline:
                raise ReplicaError(f"sync_now did not succeed in {timeout_s:.0f} s: {e}") from e
            time.sleep(0.2)


def wait_first_sync(rep: Replicator, replica_dir: Path, timeout_s: float = 60.0) -> float:
    """Seconds until the replica holds a level-0 file and the Replicator has seen
    a successful sync (``status()["last_sync_at"]``; its monitor asks every 1 s)."""
    t = time.perf_counter()
    level0 = replica_dir / "ltx" / "0"
    while time.perf_counter() - t < timeout_s:
        if rep.status()["last_sync_at"] is not None and level0.is_dir() and any(
                n.endswith(".ltx") for n in os.listdir(level0)):
            return time.perf_counter() - t
        time.sleep(0.05)
    raise ReplicaError(f"no replica sync within {timeout_s:.0f} s")


def with_marker(turn: TurnIn, k: int) -> TurnIn:
    return turn.model_copy(update={"content": f"{turn.content} ({MARK}{k:06d})"})


def caught_up(replica_dir: Path, k: int, acked_at: float, timeout_s: float = 60.0) -> float | None:
    """Seconds from ``acked_at`` (wall clock) until marker ``k`` is in an uploaded
    LTX file; 0 if a file already there at the call held it; None: not in time."""
    watcher = ReplicaWatcher(replica_dir)
    watcher.prime()
    watcher.start()
    deadline = time.time() + timeout_s
    while time.time() < deadline and watcher.seen(k) is None:
        time.sleep(0.02)
    watcher.stop.set()
    watcher.join(timeout=30)
    found = watcher.seen(k)
    if found is None:
        watcher.rescan_primed()
        return 0.0 if watcher.seen(k) is not None else None
    return float(found["seen_at"]) - acked_at


def verify_replica(settings: Settings, work: Path) -> dict[str, Any]:
    """Restore the replica (Litestream stopped) and compare it with the live store:
    ``PRAGMA integrity_check`` (inside ``restore_into``), then the transcript's
    row count and newest id, and the vector count."""
    import apsw

    dest_dir = Path(tempfile.mkdtemp(prefix="verify-", dir=work))
    dest = dest_dir / "reverie.db"

    def facts(path: Path) -> tuple[int, int, int]:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            n, top = conn.execute("SELECT count(*), max(id) FROM transcript").fetchall()[0]
            (v,) = conn.execute("SELECT count(*) FROM vectors").fetchall()[0]
            return int(n), int(top or 0), int(v)
        finally:
            conn.close()

    t = time.perf_counter()
    try:
        restore_into(settings, dest)
        restored = facts(dest)
    except (ReplicaError, apsw.Error) as e:
        return {"ok": False, "problem": str(e)[:400],
                "restore_s": round(time.perf_counter() - t, 2)}
    finally:
        shutil.rmtree(dest_dir, ignore_errors=True)
    live = facts(db_path(settings))
    out: dict[str, Any] = {"ok": restored == live, "restore_s": round(time.perf_counter() - t, 2),
                           "live": live, "replica": restored}
    if restored != live:
        out["problem"] = f"replica (turns, newest id, vectors) {restored} != live {live}"
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def stop_supervisor(sup: Any) -> None:
    """Stop the actors and Litestream; Litestream even if stopping the actors failed."""
    try:
        c.stop_runtime(sup)
    finally:
        sup.replicator.stop()


def warm_up(transcript_h: Any) -> None:
    import ray

    warm = [TurnIn(channel="chat", source="user", content=f"warm-up turn {i}, hello there")
            for i in range(WARMUP)]
    ray.get(transcript_h.append.remote(AppendTurns(turns=warm)), timeout=120)


# -- 1. write throughput ---------------------------------------------------------


LAST = 999999  # the marker carried by the last turn of a throughput run


def db_mib(settings: Settings) -> float:
    base = str(db_path(settings))
    return round(sum(Path(base + x).stat().st_size for x in ("", "-wal")
                     if Path(base + x).exists()) / c.MiB, 1)


def throughput_actor(work: Path, turns: list[TurnIn], batch: int, replica: bool) -> dict[str, Any]:
    import ray

    name = f"tp-{'on' if replica else 'off'}"
    settings = settings_for(work, name, replica)
    replica_dir = work / f"replica-{name}"
    turns = [*turns[:-1], with_marker(turns[-1], LAST)]
    load_before = c.loadavg()
    started = time.perf_counter()
    sup = supervisor.start(settings)
    ready_s = round(time.perf_counter() - started, 2)
    out: dict[str, Any] = {"path": "actor", "replica": replica, "turns": len(turns),
                           "batch": batch, "actors_ready_s": ready_s}
    try:
        transcript_h = actor(TRANSCRIPT, settings.runtime.namespace)
        warm_up(transcript_h)
        if replica:
            out["initial_sync_s"] = round(wait_first_sync(sup.replicator, replica_dir), 3)
        append_ms: list[float] = []
        t0 = time.perf_counter()
        for i in range(0, len(turns), batch):
            t = time.perf_counter()
            ray.get(transcript_h.append.remote(AppendTurns(turns=turns[i:i + batch])),
                    timeout=300)
            append_ms.append((time.perf_counter() - t) * 1000)
        t_ack, acked_at = time.perf_counter(), time.time()
        out.update(ack_s=round(t_ack - t0, 3), turns_per_s=round(len(turns) / (t_ack - t0), 1),
                   append=c.lat_summary(append_ms))
        if replica:
            done = caught_up(replica_dir, LAST, acked_at)
            out["caught_up_s"] = None if done is None else round(done, 3)
            out["replicator_status"] = sup.replicator.status()
        out["db_mib"] = db_mib(settings)
    finally:
        stop_supervisor(sup)
    if replica:
        out["replica_mib"] = round(dir_bytes(replica_dir) / c.MiB, 1)
        out["verify"] = verify_replica(settings, work)
    out["loadavg_before"], out["loadavg_after"] = load_before, c.loadavg()
    shutil.rmtree(work / f"data-{name}", ignore_errors=True)
    shutil.rmtree(replica_dir, ignore_errors=True)
    return out


def throughput_direct(work: Path, turns: list[TurnIn], batch: int,
                      replica: bool) -> dict[str, Any]:
    name = f"direct-{'on' if replica else 'off'}"
    settings = settings_for(work, name, replica)
    replica_dir = work / f"replica-{name}"
    turns = [*turns[:-1], with_marker(turns[-1], LAST)]
    load_before = c.loadavg()
    store = open_store(settings)
    rep = Replicator(settings)
    out: dict[str, Any] = {"path": "direct", "replica": replica, "turns": len(turns),
                           "batch": batch}
    try:
        service = TranscriptService(store, load_profiles(settings))
        with store.write_transaction():
            for i in range(WARMUP):
                service.append(TurnIn(channel="chat", source="user",
                                      content=f"warm-up turn {i}, hello there"))
        if replica:
            rep.start()
            out["initial_sync_s"] = round(wait_first_sync(rep, replica_dir), 3)
        tx_ms: list[float] = []
        t0 = time.perf_counter()
        for i in range(0, len(turns), batch):
            t = time.perf_counter()
            with store.write_transaction():
                for turn in turns[i:i + batch]:
                    service.append(turn)
            tx_ms.append((time.perf_counter() - t) * 1000)
        t_ack, acked_at = time.perf_counter(), time.time()
        out.update(ack_s=round(t_ack - t0, 3), turns_per_s=round(len(turns) / (t_ack - t0), 1),
                   append=c.lat_summary(tx_ms))
        if replica:
            done = caught_up(replica_dir, LAST, acked_at)
            out["caught_up_s"] = None if done is None else round(done, 3)
        out["db_mib"] = db_mib(settings)
    finally:
        try:
            rep.stop()
        finally:
            store.close()
    if replica:
        out["replica_mib"] = round(dir_bytes(replica_dir) / c.MiB, 1)
        out["verify"] = verify_replica(settings, work)
    out["loadavg_before"], out["loadavg_after"] = load_before, c.loadavg()
    shutil.rmtree(work / f"data-{name}", ignore_errors=True)
    shutil.rmtree(replica_dir, ignore_errors=True)
    return out


# -- 2. replication lag ------------------------------------------------------------


def replication_lag(work: Path, turns: list[TurnIn], rate: float, duration: float,
                    batch: int, settle_s: float = 20.0) -> dict[str, Any]:
    import ray

    name = "lag"
    settings = settings_for(work, name, True)
    load_before = c.loadavg()
    sup = supervisor.start(settings)
    watcher = ReplicaWatcher(work / f"replica-{name}")
    samples: list[tuple[float, float | None, float | None]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(STATUS_EVERY_S):
            st = sup.replicator.status()
            samples.append((time.time(), st["last_sync_at"], st["lag_s"]))

    sampler = threading.Thread(target=sample, daemon=True, name="status-sampler")
    appends = max(1, round(rate * duration / batch))
    acks: list[float] = []
    sent: list[float] = []
    append_ms: list[float] = []
    behind_s = 0.0
    try:
        transcript_h = actor(TRANSCRIPT, settings.runtime.namespace)
        warm_up(transcript_h)
        wait_first_sync(sup.replicator, work / f"replica-{name}")
        watcher.prime()
        watcher.start()
        sampler.start()
        interval = batch / rate
        t0 = time.perf_counter() + 0.1
        for k in range(appends):
            due = t0 + k * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            else:
                behind_s = max(behind_s, now - due)
            first = (k * batch) % len(turns)
            chunk = turns[first:first + batch]
            chunk = [with_marker(chunk[0], k), *chunk[1:]]
            t_send, p = time.time(), time.perf_counter()
            ray.get(transcript_h.append.remote(AppendTurns(turns=chunk)), timeout=120)
            append_ms.append((time.perf_counter() - p) * 1000)
            sent.append(t_send)
            acks.append(time.time())
        stream_s = time.perf_counter() - t0
        deadline = time.time() + settle_s
        while time.time() < deadline and any(watcher.seen(k) is None for k in range(appends)):
            time.sleep(0.1)
        sampling.set()
        sampler.join(timeout=5)
        watcher.stop.set()
        watcher.join(timeout=30)
        final_status = sup.replicator.status()
    finally:
        sampling.set()
        watcher.stop.set()
        stop_supervisor(sup)
    verify = verify_replica(settings, work)
    load_after = c.loadavg()

    lag, pickup, upload = [], [], []
    missing = []
    for k in range(appends):
        f = watcher.seen(k)
        if f is None:
            missing.append(k)
            continue
        lag.append(float(f["seen_at"]) - acks[k])
        pickup.append(float(f["built_at"]) - acks[k])
        upload.append(float(f["seen_at"]) - float(f["built_at"]))

    # The Replicator's promise: at a sample (t, L), every append acknowledged
    # before L - monitor interval is in the replica.
    violations, checked = 0, 0
    worst: dict[str, float] | None = None
    for t, last, _ in samples:
        if last is None:
            continue
        for k in range(appends):
            if acks[k] >= last - MONITOR_INTERVAL_S:
                break
            checked += 1
            f = watcher.seen(k)
            absent_after = f is None or float(f["absent_at"]) > t
            if absent_after:
                violations += 1
                if worst is None:
                    worst = {"sample_at": t, "last_sync_at": last, "ack_at": acks[k],
                             "seen_at": float(f["seen_at"]) if f else -1.0}
    reported = [x for _, _, x in samples if x is not None]

    def s(values: list[float]) -> dict[str, float | int]:
        return {"n": len(values), "p50_s": round(c.pct(values, 50), 3),
                "p90_s": round(c.pct(values, 90), 3), "p99_s": round(c.pct(values, 99), 3),
                "max_s": round(max(values), 3) if values else 0.0,
                "min_s": round(min(values), 3) if values else 0.0}

    out = {
        "rate_turns_per_s": rate, "duration_s": duration, "batch": batch, "appends": appends,
        "stream_s": round(stream_s, 2), "max_behind_schedule_s": round(behind_s, 3),
        "append": c.lat_summary(append_ms),
        "lag": s(lag), "pickup": s(pickup), "upload": s(upload), "missing": len(missing),
        "replicator_lag_s": s(reported),
        "promise_checked": checked, "promise_violations": violations,
        "first_violation": worst,
        "ltx_files_read": watcher.files, "ltx_pages_decoded": watcher.pages,
        "decode_s": round(watcher.decode_s, 2), "ltx_errors": watcher.errors[:5],
        "final_status": final_status, "verify": verify,
        "records": [[round(sent[k], 3), round(acks[k], 3)] + (
            [round(float(f["absent_at"]), 3), round(float(f["seen_at"]), 3),
             round(float(f["built_at"]), 3), int(f["txid"])]
            if (f := watcher.seen(k)) else []) for k in range(appends)],
        "status_samples": [[round(t, 3), last, lag_s] for t, last, lag_s in samples],
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    shutil.rmtree(work / f"data-{name}", ignore_errors=True)
    shutil.rmtree(work / f"replica-{name}", ignore_errors=True)
    return out


# -- 3. restore ------------------------------------------------------------------


def fill(store: Store, settings: Settings, n: int, vectors: bool, seed: int) -> None:
    """``n`` household turns appended to ``store`` through the transcript service,
    ``BUILD_TX`` a transaction, each with a random unit vector when ``vectors``."""
    service = TranscriptService(store, load_profiles(settings))
    rng = np.random.default_rng(seed)
    gen = c.household_turns(n, seed=seed, start=time.time() - 365 * 86400)
    done = 0
    while done < n:
        chunk = [next(gen) for _ in range(min(BUILD_TX, n - done))]
        with store.write_transaction():
            ids = [service.append(turn) for turn in chunk]
            if vectors:
                vecs = rng.standard_normal((len(ids), MINILM_DIM), dtype=np.float32)
                vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                for turn_id, vec in zip(ids, vecs):
                    store.put_vector("turn", turn_id, MINILM_NAME, vec.tobytes())
        done += len(chunk)


def restore_time(work: Path, n: int, vectors: bool, seed: int) -> dict[str, Any]:
    name = "restore"
    settings = settings_for(work, name, True)
    load_before = c.loadavg()
    out: dict[str, Any] = {"turns": n, "vectors": n if vectors else 0}
    t = time.perf_counter()
    store = open_store(settings)
    try:
        fill(store, settings, n, vectors, seed)
        counts = store.counts()
        newest = store.row("SELECT * FROM transcript ORDER BY id DESC LIMIT 1")
    finally:
        store.close()
    out["build_s"] = round(time.perf_counter() - t, 2)
    live = db_path(settings)
    out["db_mib"] = round(live.stat().st_size / c.MiB, 1)
    c.log(f"  built {n:,} turns in {out['build_s']:.1f} s: {out['db_mib']:.0f} MiB")

    rep = Replicator(settings)
    t = time.perf_counter()
    try:
        rep.start()
        sync_s, answer = sync_replica(rep, timeout_s=600)
        out["replicate_s"] = round(time.perf_counter() - t, 2)
        out["sync_now_s"] = round(sync_s, 2)
        out["sync_answer"] = answer
    finally:
        rep.stop()
    out["replica_mib"] = round(dir_bytes(work / f"replica-{name}") / c.MiB, 1)

    dest = work / "restored" / "reverie.db"
    dest.parent.mkdir(mode=0o700)
    t = time.perf_counter()
    restore_into(settings, dest)
    out["restore_s"] = round(time.perf_counter() - t, 2)
    out["restored_mib"] = round(dest.stat().st_size / c.MiB, 1)
    t = time.perf_counter()
    problems = integrity_problems(dest)
    out["integrity_check_s"] = round(time.perf_counter() - t, 2)
    out["restore_without_check_s"] = round(out["restore_s"] - out["integrity_check_s"], 2)
    import apsw

    conn = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        got_turns = conn.execute("SELECT count(*) FROM transcript").fetchall()[0][0]
        got_vecs = conn.execute("SELECT count(*) FROM vectors").fetchall()[0][0]
        cur = conn.cursor()
        cur.execute("SELECT * FROM transcript ORDER BY id DESC LIMIT 1")
        names = [d[0] for d in cur.getdescription()]
        got_newest = dict(zip(names, next(cur)))
    finally:
        conn.close()
    out["restored_ok"] = (not problems and got_turns == counts["transcript"]
                          and got_vecs == counts["vectors"] and got_newest == newest)
    out["restored_counts"] = {"transcript": got_turns, "vectors": got_vecs}
    out["integrity_problems"] = problems
    out["loadavg_before"], out["loadavg_after"] = load_before, c.loadavg()
    for d in (f"data-{name}", f"replica-{name}", "restored"):
        shutil.rmtree(work / d, ignore_errors=True)
    return out


def order(rounds: int) -> list[tuple[int, bool]]:
    """(round, replica) pairs: off then on, then on then off, ... (drift cancels)."""
    return [(r + 1, on) for r in range(rounds)
            for on in ((False, True) if r % 2 == 0 else (True, False))]


# -- main ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=20000, help="turns per throughput run")
    ap.add_argument("--batch", type=int, default=64, help="turns per append (throughput)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="throughput runs per setting, alternating which goes first")
    ap.add_argument("--rate", type=float, default=50.0, help="turns/s of the steady stream")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of the steady stream")
    ap.add_argument("--lag-batch", type=int, default=1, help="turns per append (lag)")
    ap.add_argument("--restore-turns", type=int, default=100000, help="turns in the restored store")
    ap.add_argument("--no-vectors", action="store_true",
                    help="build the restored store without the turns' vectors")
    ap.add_argument("--skip", default="", help="phases to leave out: throughput,direct,lag,restore")
    ap.add_argument("--seed", type=int, default=7, help="corpus seed")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - {"throughput", "direct", "lag", "restore"}
    if unknown:
        ap.error(f"--skip: unknown phase(s) {', '.join(sorted(unknown))}")
    wall = time.perf_counter()

    turns = list(c.household_turns(args.turns, seed=args.seed, start=time.time() - 86400,
                                   span_days=1.0))
    work = Path(tempfile.mkdtemp(prefix="rvb-repl-", dir="/tmp"))
    tp: list[dict[str, Any]] = []
    lag: dict[str, Any] | None = None
    restore: dict[str, Any] | None = None
    try:
        if "direct" not in skip:
            for rnd, replica in order(args.rounds):
                c.log(f"direct: {args.turns:,} turns, batches of {args.batch}, "
                      f"replica {'on' if replica else 'off'} (round {rnd})")
                tp.append({"round": rnd, **throughput_direct(work, turns, args.batch, replica)})
                c.log(f"  {tp[-1]['turns_per_s']:,.0f} turns/s")
        if not {"throughput", "lag"} <= skip:
            with c.local_ray(c.make_settings(work / "unused"), dashboard=False) as info:
                c.log(f"ray up in {info['init_s']:.1f} s")
                if "throughput" not in skip:
                    for rnd, replica in order(args.rounds):
                        c.log(f"actor: {args.turns:,} turns, batches of {args.batch}, "
                              f"replica {'on' if replica else 'off'} (round {rnd})")
                        tp.append({"round": rnd,
                                   **throughput_actor(work, turns, args.batch, replica)})
                        c.log(f"  {tp[-1]['turns_per_s']:,.0f} turns/s")
                if "lag" not in skip:
                    c.log(f"lag: {args.rate:g} turns/s for {args.duration:g} s, "
                          f"{args.lag_batch} per append")
                    lag = replication_lag(work, turns, args.rate, args.duration, args.lag_batch)
                    c.log(f"  lag p50 {lag['lag']['p50_s']:.2f} s, p99 {lag['lag']['p99_s']:.2f}"
                          f" s ({lag['missing']} missing)")
        if "restore" not in skip:
            c.log(f"restore: building {args.restore_turns:,} turns"
                  f"{'' if args.no_vectors else ' with vectors'}")
            restore = restore_time(work, args.restore_turns, not args.no_vectors, args.seed)
            c.log(f"  restored {restore['restored_mib']:.0f} MiB in {restore['restore_s']:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary: list[str] = []
    if tp:
        print()
        medians = {(path, on): c.pct([r["turns_per_s"] for r in tp
                                      if r["path"] == path and r["replica"] == on], 50)
                   for path in ("actor", "direct") for on in (False, True)}
        rows = []
        for r in tp:
            base = medians[(r["path"], False)]
            ratio = r["turns_per_s"] / base if base else 1.0
            rows.append([r["path"], "on" if r["replica"] else "off", r["round"], r["turns"],
                         r["turns_per_s"], round(ratio, 3), r["append"]["p50_ms"],
                         r["append"]["p99_ms"], r.get("caught_up_s", "-"),
                         ("ok" if r["verify"]["ok"] else "BAD") if "verify" in r else "-"])
        print(c.table(["path", "litestream", "round", "turns", "turns/s", "vs off median",
                       "append p50 ms", "append p99 ms", "caught up s", "replica"], rows))
        for r in tp:
            if "verify" in r and not r["verify"]["ok"]:
                print(f"  {r['path']} replica: {r['verify']['problem']}")
        for path in ("actor", "direct"):
            off, on = medians[(path, False)], medians[(path, True)]
            if off and on:
                summary.append(f"{path} {off:,.0f} -> {on:,.0f} turns/s with Litestream "
                               f"({on / off:.2f}x, medians of {args.rounds})")
    if lag:
        print()
        rows = [[label, lag[key]["n"], lag[key]["p50_s"], lag[key]["p90_s"], lag[key]["p99_s"],
                 lag[key]["max_s"]]
                for label, key in (("commit -> in replica", "lag"),
                                   ("commit -> LTX built (pickup)", "pickup"),
                                   ("LTX built -> in replica (sync tick + upload)", "upload"),
                                   ("Replicator.status() lag_s", "replicator_lag_s"))]
        print(c.table(["lag (s)", "n", "p50", "p90", "p99", "max"], rows))
        print(f"appends {lag['appends']} at {lag['rate_turns_per_s']:g} turns/s, "
              f"{lag['missing']} never seen in the replica; status promise violated "
              f"{lag['promise_violations']} of {lag['promise_checked']} checks; replica "
              + ("verified" if lag["verify"]["ok"] else f"BAD: {lag['verify']['problem']}"))
        summary.append(f"lag p50 {lag['lag']['p50_s']:.2f} s / p99 {lag['lag']['p99_s']:.2f} s "
                       f"at {lag['rate_turns_per_s']:g} turns/s")
    if restore:
        print()
        print(c.table(["turns", "vectors", "db MiB", "build s", "replicate s", "replica MiB",
                       "restore s", "of which check s", "restored MiB", "ok"],
                      [[restore["turns"], restore["vectors"], restore["db_mib"],
                        restore["build_s"], restore["replicate_s"], restore["replica_mib"],
                        restore["restore_s"], restore["integrity_check_s"],
                        restore["restored_mib"], str(restore["restored_ok"])]]))
        summary.append(f"restore of {restore['turns']:,} turns ({restore['restored_mib']:.0f} "
                       f"MiB) {restore['restore_s']:.1f} s")
    wall_s = time.perf_counter() - wall
    print(f"\nSUMMARY replication: {'; '.join(summary)}; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "replication", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "params": {"turns": args.turns, "batch": args.batch, "rounds": args.rounds,
                   "rate": args.rate,
                   "duration_s": args.duration, "lag_batch": args.lag_batch,
                   "restore_turns": args.restore_turns, "vectors": not args.no_vectors,
                   "seed": args.seed, "skip": sorted(skip), "poll_s": POLL_S,
                   "status_every_s": STATUS_EVERY_S, "replica": "file:// (same disk)",
                   "sync_interval_s": ReplicaSettings().sync_interval_s,
                   "monitor_interval_s": MONITOR_INTERVAL_S},
        "throughput": tp, "lag": lag, "restore": restore})
    ok = ((restore is None or restore["restored_ok"])
          and (lag is None or (lag["missing"] == 0 and lag["verify"]["ok"]))
          and all(r["verify"]["ok"] for r in tp if "verify" in r))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
