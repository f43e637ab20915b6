#!/usr/bin/env python3
"""Sustained ingest through the Transcript actor, until the Recall index has caught up.

Usage:
    tools/bench/ingest.py [--turns 5000] [--batch-sizes 1,16,64] [--inflight 1]
                          [--probe-ms 0] [--json OUT.json]

For each batch size B, on a fresh store and a fresh set of actors (one private
local Ray node, no dashboard, bounded object store, shared by the runs):

1. warm up: one AppendTurns of 16 turns, then wait until they are indexed;
2. t0; send ``--turns`` synthetic household turns as AppendTurns messages of B
   turns from the driver, ``--inflight`` messages outstanding at a time (1: each
   append waits for the previous reply, like one voice pipeline);
3. t_ack: the last append returned (every turn committed to SQLite);
4. call ``transcript.flush`` (waits -- at most 30 s, see actors/common.Notifier --
   for the pending "there is news" notification the Transcript actor sent to
   Recall; its duration is reported), then ``recall.sync`` in steps of
   ``SYNC_STEP`` items (as the writers' notifications index) until a step
   finds fewer: every turn is embedded and in the hnswlib index (checked
   against the index count); that is t_indexed.

acknowledged turns/s = turns / (t_ack - t0); indexed turns/s = turns /
(t_indexed - t0). Indexing runs concurrently with the appends (the Transcript
actor notifies Recall after each commit, coalescing while one sync is pending).

``--probe-ms MS`` also sends a turn-zero Recall every MS milliseconds from a
second driver thread during the run, to show what a user waits for while the
Recall actor is busy indexing (p50/p99/max).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import _common as c

from actors import supervisor
from actors.common import RECALL, TRANSCRIPT, actor
from actors.messages import AppendTurns, IndexSynced, Recall, SyncIndex
from actors.recall import SYNC_STEP
from runtime.config import Settings
from runtime.memories.transcript import TurnIn

WARMUP = 16


def catch_up(transcript_h: Any, recall_h: Any) -> tuple[IndexSynced, dict[str, Any]]:
    """Flush the Transcript actor's notification, then sync Recall until nothing is added.

    Each sync indexes at most ``SYNC_STEP`` items, as the writers' notifications
    do (``RecallActor.sync_some``), so a probe's recall waits behind one step,
    never behind the whole backlog. Returns the last reply and how the catching
    up went: seconds in ``flush``, then the sync calls made and the vectors the
    first of them still added."""
    import ray

    t = time.perf_counter()
    ray.get(transcript_h.flush.remote(), timeout=900)
    info: dict[str, Any] = {"flush_s": round(time.perf_counter() - t, 3), "sync_calls": 0,
                            "added_after_flush": 0}
    while True:
        synced: IndexSynced = ray.get(recall_h.sync.remote(SyncIndex(limit=SYNC_STEP)),
                                      timeout=900)
        info["added_after_flush"] += synced.added
        info["sync_calls"] += 1
        if synced.added < SYNC_STEP:
            return synced, info


class Prober(threading.Thread):
    """Turn-zero recall every ``interval`` seconds while the ingest runs."""

    def __init__(self, recall_h: Any, interval: float, queries: list[str]) -> None:
        super().__init__(daemon=True)
        self.recall_h = recall_h
        self.interval = interval
        self.queries = queries
        self.stop = threading.Event()
        self.ms: list[float] = []

    def run(self) -> None:
        import ray

        rng = random.Random(3)
        while not self.stop.is_set():
            t = time.perf_counter()
            ray.get(self.recall_h.recall.remote(Recall(query=rng.choice(self.queries))),
                    timeout=900)
            self.ms.append((time.perf_counter() - t) * 1000)
            self.stop.wait(max(0.0, self.interval - (time.perf_counter() - t)))


def run_one(settings: Settings, turns: list[TurnIn], batch: int, inflight: int,
            probe_ms: float, queries: list[str]) -> dict[str, Any]:
    import ray

    ns = settings.runtime.namespace
    started = time.perf_counter()
    sup = supervisor.start(settings)
    actors_s = time.perf_counter() - started
    try:
        transcript_h = actor(TRANSCRIPT, ns)
        recall_h = actor(RECALL, ns)
        warm = [TurnIn(channel="chat", source="user", content=f"warm-up turn {i}, hello there")
                for i in range(WARMUP)]
        ray.get(transcript_h.append.remote(AppendTurns(turns=warm)), timeout=120)
        catch_up(transcript_h, recall_h)

        batches = [turns[i:i + batch] for i in range(0, len(turns), batch)]
        prober = Prober(recall_h, probe_ms / 1000, queries) if probe_ms > 0 else None
        append_ms: list[float] = []
        load_before = c.loadavg()
        t0 = time.perf_counter()
        if prober:
            prober.start()
        window: deque[tuple[Any, float]] = deque()
        for chunk in batches:
            window.append((transcript_h.append.remote(AppendTurns(turns=chunk)),
                           time.perf_counter()))
            if len(window) >= inflight:
                ref, sent = window.popleft()
                ray.get(ref, timeout=300)
                append_ms.append((time.perf_counter() - sent) * 1000)
        while window:
            ref, sent = window.popleft()
            ray.get(ref, timeout=300)
            append_ms.append((time.perf_counter() - sent) * 1000)
        t_ack = time.perf_counter()
        synced, caught = catch_up(transcript_h, recall_h)
        t_idx = time.perf_counter()
        if prober:
            prober.stop.set()
            prober.join(timeout=900)
        load_after = c.loadavg()
        indexed = synced.counts.get("turn", 0)
        expected = WARMUP + len(turns)
        if indexed != expected:
            raise RuntimeError(f"index holds {indexed} turn vectors, expected {expected}")
        n = len(turns)
        out: dict[str, Any] = {
            "batch": batch, "turns": n, "appends": len(batches), "inflight": inflight,
            "ack_s": round(t_ack - t0, 3), "indexed_s": round(t_idx - t0, 3),
            "drain_s": round(t_idx - t_ack, 3),
            "acked_turns_per_s": round(n / (t_ack - t0), 1),
            "indexed_turns_per_s": round(n / (t_idx - t0), 1),
            "append": c.lat_summary(append_ms), "catch_up": caught,
            "index_turns": indexed, "actors_ready_s": round(actors_s, 2),
            "loadavg_before": load_before, "loadavg_after": load_after,
        }
        if prober:
            out["probe_recall"] = c.lat_summary(prober.ms)
        return out
    finally:
        c.stop_runtime(sup)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=5000, help="turns per batch size")
    ap.add_argument("--batch-sizes", default="1,16,64", help="turns per AppendTurns")
    ap.add_argument("--inflight", type=int, default=1, help="appends outstanding at once")
    ap.add_argument("--probe-ms", type=float, default=0.0,
                    help="also time a Recall every MS ms during the run (0: off)")
    ap.add_argument("--seed", type=int, default=7, help="corpus seed")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    wall = time.perf_counter()

    turns = list(c.household_turns(args.turns, seed=args.seed, start=time.time() - 86400,
                                   span_days=1.0))
    queries = c.household_queries(100, seed=11)
    work = Path(tempfile.mkdtemp(prefix="rvb-ingest-"))
    results: list[dict[str, Any]] = []
    try:
        with c.local_ray(c.make_settings(work / "unused"), dashboard=False) as info:
            c.log(f"ray up in {info['init_s']:.1f} s")
            for b in sizes:
                settings = c.make_settings(work / f"data-{b}")
                c.log(f"batch {b}: {args.turns:,} turns in {len(range(0, args.turns, b)):,}"
                      f" appends, {args.inflight} in flight")
                res = run_one(settings, turns, b, args.inflight, args.probe_ms, queries)
                results.append(res)
                c.log(f"  acknowledged {res['acked_turns_per_s']:.0f} turns/s, indexed "
                      f"{res['indexed_turns_per_s']:.0f} turns/s (drain {res['drain_s']:.1f} s)")
                shutil.rmtree(work / f"data-{b}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    headers = ["batch", "turns", "acked t/s", "indexed t/s", "ack s", "indexed s", "drain s",
               "append p50 ms", "append p99 ms", "flush s"]
    rows = [[r["batch"], r["turns"], r["acked_turns_per_s"], r["indexed_turns_per_s"],
             r["ack_s"], r["indexed_s"], r["drain_s"], r["append"]["p50_ms"],
             r["append"]["p99_ms"], r["catch_up"]["flush_s"]] for r in results]
    if args.probe_ms > 0:
        headers += ["recall p50 ms", "recall p99 ms", "recall max ms", "probes"]
        for row, r in zip(rows, results):
            p = r["probe_recall"]
            row += [p["p50_ms"], p["p99_ms"], p["max_ms"], p["n"]]
    print()
    print(c.table(headers, rows))
    wall_s = time.perf_counter() - wall
    summary = "; ".join(f"batch {r['batch']}: {r['acked_turns_per_s']:.0f} acked / "
                        f"{r['indexed_turns_per_s']:.0f} indexed turns/s" for r in results)
    print(f"\nSUMMARY ingest ({args.turns:,} turns each): {summary}; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "ingest", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "params": {"turns": args.turns, "batch_sizes": sizes, "inflight": args.inflight,
                   "probe_ms": args.probe_ms, "seed": args.seed, "warmup_turns": WARMUP},
        "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
