#!/usr/bin/env python3
"""Many small households on one runtime: memory, processes, recall under load, jobs.

Usage:
    tools/bench/households.py [--households 1,10,100,1000] [--turns-each 20]
                              [--max-open 64] [--duration 30] [--workers 2]
                              [--jobs 5] [--json OUT.json]

For each count N, on a private local Ray node (no dashboard) and a fresh data
directory, with ``[households] enabled`` and ``max_open = --max-open``:

1. The runtime (``actors.supervisor.start``: Transcript, Recall with the model,
   Episodes, Graph, Turns, Cron; the HTTP server off) serves the hub's household
   ``home`` and N - 1 households registered under ``<data dir>/households``
   (``runtime.store.households.Households.add``: each its own store, made and
   migrated once). Each of the N households is told ``--turns-each`` synthetic
   turns (``_common.household_turns``, a seed per household) through the
   Transcript actor, and Recall indexes them.
2. After ``--settle`` seconds idle, the PSS of every process of the node
   (``footprint.sample``: /proc/<pid>/smaps_rollup over the driver's
   descendants and processes naming the session; the driver excluded):
   ``pss_mib``, ``processes``, ``pss_mib_per_household`` = ``pss_mib / N``, and
   ``pss_mib_marginal_per_household`` = what N households cost over the first
   count's run, per added household.
3. ``--duration`` seconds of steady load: ``--workers`` threads each send turns
   (``UserTurn`` through the Turns actor, offline model) to households chosen
   at random, back to back (``turns_per_s``: turns answered / duration), while
   one probe thread sends recalls to households chosen at random, back to back
   (``recall_p50_ms`` / ``recall_p99_ms``, measured in the driver around the
   whole actor call; with N above ``max_open`` most of them open the
   household's store and index first).
4. ``jobs_per_min``: the ``decay`` job run (``RunJob(wait=True)``) in
   ``--jobs`` households one after the other, each in a job actor of its own.

Figures go to stdout and, with ``--json``, to
``{"results": [{"households", "processes", "pss_mib", "pss_mib_per_household",
"recall_p50_ms", "recall_p99_ms", "turns_per_s", "jobs_per_min", ...}]}``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common as c
import footprint as fp

from actors import supervisor
from actors.handles import CronClient, RecallClient, TranscriptClient, TurnsClient
from actors.messages import AppendTurns, Recall, RunJob, UserTurn
from runtime.config import HUB_HOUSEHOLD
from runtime.store.households import Households


def household_ids(n: int) -> list[str]:
    return [HUB_HOUSEHOLD] + [f"h{i:05d}" for i in range(1, n)]


def populate(ns: str, ids: list[str], turns_each: int) -> float:
    started = time.perf_counter()
    for i, household in enumerate(ids):
        turns = list(c.household_turns(turns_each, seed=1000 + i))
        TranscriptClient(ns, 300, household=household).append(AppendTurns(turns=turns))
        RecallClient(ns, 300, household=household).sync()
    return time.perf_counter() - started


def load(ns: str, ids: list[str], duration: float, workers: int) -> dict[str, Any]:
    """Turns from ``workers`` threads and recalls from one probe, for ``duration`` s."""
    queries = c.household_queries(500)
    stop = threading.Event()
    turns_done = [0] * workers
    turn_errors = [0] * workers
    recall_ms: list[float] = []
    recall_errors = [0]

    def talk(k: int) -> None:
        rng = random.Random(100 + k)
        while not stop.is_set():
            household = rng.choice(ids)
            try:
                TurnsClient(ns, 120, household=household).process(
                    UserTurn(channel="chat", text=rng.choice(queries)))
                turns_done[k] += 1
            except Exception:
                turn_errors[k] += 1

    def probe() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            household = rng.choice(ids)
            began = time.perf_counter()
            try:
                RecallClient(ns, 120, household=household).recall(
                    Recall(query=rng.choice(queries)))
                recall_ms.append((time.perf_counter() - began) * 1000)
            except Exception:
                recall_errors[0] += 1

    threads = [threading.Thread(target=talk, args=(k,)) for k in range(workers)]
    threads.append(threading.Thread(target=probe))
    began = time.perf_counter()
    for t in threads:
        t.start()
    stop.wait(duration)
    stop.set()
    for t in threads:
        t.join(300)
    wall = time.perf_counter() - began
    return {"turns_per_s": round(sum(turns_done) / wall, 2), "turns": sum(turns_done),
            "turn_errors": sum(turn_errors), "recalls": len(recall_ms),
            "recall_errors": recall_errors[0],
            "recall_p50_ms": round(c.pct(recall_ms, 50), 1) if recall_ms else None,
            "recall_p99_ms": round(c.pct(recall_ms, 99), 1) if recall_ms else None,
            "load_wall_s": round(wall, 1)}


def jobs(ns: str, ids: list[str], count: int) -> dict[str, Any]:
    chosen = ids[:count]
    outcomes: list[str | None] = []
    began = time.perf_counter()
    for household in chosen:
        ran = CronClient(ns, 600, household=household).run(
            RunJob(name="decay", wait=True), timeout=600)
        outcomes.append(ran.outcome)
    wall = time.perf_counter() - began
    return {"jobs_per_min": round(len(chosen) / wall * 60, 1) if chosen else None,
            "jobs_run": len(chosen), "jobs_ok": outcomes.count("ok")}


def run_count(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = work / f"data-{n}"
    settings = c.make_settings(
        data, households={"enabled": True, "max_open": args.max_open},
        http={"enabled": False}, runtime={"dashboard": False},
        jobs={"check_every_s": 86400.0})
    ids = household_ids(n)
    registry = Households(settings)
    began = time.perf_counter()
    for household in ids[1:]:
        registry.add(household)
    add_s = time.perf_counter() - began
    ns = settings.runtime.namespace
    with c.local_ray(settings, dashboard=False) as info:
        sup = supervisor.start(settings)
        try:
            c.log(f"  {n} households: {add_s:.1f} s to register; telling each "
                  f"{args.turns_each} turns")
            fill_s = populate(ns, ids, args.turns_each)
            c.log(f"  told in {fill_s:.1f} s; settling {args.settle:.0f} s")
            time.sleep(args.settle)
            markers = [info["session_dir"] or "", info["temp_dir"]]
            procs = [p for p in fp.sample(markers, args.samples, args.interval)
                     if not p["role"].startswith("driver")]
            c.log(f"  {len(procs)} processes, {sum(p['pss_mib'] for p in procs):.0f} MiB PSS;"
                  f" load for {args.duration:.0f} s")
            loaded = load(ns, ids, args.duration, args.workers)
            ran = jobs(ns, ids, min(args.jobs, n))
        finally:
            c.stop_runtime(sup)
    pss = round(sum(p["pss_mib"] for p in procs), 1)
    return {"households": n, "processes": len(procs), "pss_mib": pss,
            "pss_mib_per_household": round(pss / n, 2), **loaded, **ran,
            "max_open": args.max_open, "turns_each": args.turns_each,
            "register_s": round(add_s, 1), "tell_s": round(fill_s, 1),
            "by_role": {p["role"]: p["pss_mib"] for p in procs[:12]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--households", default="1,10,100,1000")
    ap.add_argument("--turns-each", type=int, default=20)
    ap.add_argument("--max-open", type=int, default=64)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.households.split(",") if x.strip()]
    wall = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rvb-households-"))
    results: list[dict[str, Any]] = []
    try:
        for n in counts:
            c.log(f"{n} households")
            results.append(run_count(n, args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = results[0] if results else None
    for res in results:
        extra = res["households"] - first["households"] if first else 0
        res["pss_mib_marginal_per_household"] = (
            round((res["pss_mib"] - first["pss_mib"]) / extra, 2)
            if first and extra > 0 else None)
    print(c.table(["households", "processes", "PSS MiB", "MiB/household", "marginal",
                   "recall p50", "p99", "turns/s", "jobs/min"],
                  [[r["households"], r["processes"], r["pss_mib"], r["pss_mib_per_household"],
                    r["pss_mib_marginal_per_household"], r["recall_p50_ms"],
                    r["recall_p99_ms"], r["turns_per_s"], r["jobs_per_min"]]
                   for r in results]))
    wall_s = time.perf_counter() - wall
    print(f"\nSUMMARY households: {len(results)} runs; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "households", "machine": c.machine(), "loadavg": c.loadavg(),
        "wall_s": round(wall_s, 1), "params": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
