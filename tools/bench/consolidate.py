#!/usr/bin/env python3
"""Roll-up (consolidation part 2) time and peak memory for 1k and 10k apex episodes.

Usage:
    tools/bench/consolidate.py [--sizes 1000,10000] [--json OUT.json]

For each size a store is built once: that many leaf episodes on one channel,
each with two cited turns and a synthetic 384-d unit vector with cluster
structure (groups of 40 around random centres, 5 % scattered noise); no text
is embedded. Then, for each case, a fresh process copies the store and runs
``runtime.mind.rollup.roll_up`` on it (leaf round, then the era round):

* ``cold``: an empty numba cache directory, so UMAP's and pynndescent's
  numba code is compiled in that process (what every job paid before the
  on-disk cache);
* ``warm``: the cache directory the cold run filled (what every job pays now).

The job's writer is :class:`runtime.memories.episodes.EpisodeService` on the copied
store, plus a stand-in for the indexer: each new parent gets the normalised
mean of its children's vectors as its vector, so that the era round has
vectors to cluster. Embedding the parents' gists is the Embedder's work in the
actor runtime and is not timed here.

Figures per case: ``import_s`` (importing the roll-up modules, UMAP, HDBSCAN),
``rollup_s`` (``roll_up(ctx)`` itself: reading, clustering, writing parents;
for ``cold`` it includes compiling), ``process_s`` (the child's whole life),
parents written per level, and memory: ``peak_pss_mib`` sampled every 50 ms by
this driver from the child's ``/proc/<pid>/smaps_rollup`` (a long numba call
holds the GIL, so the child could not sample itself), and ``maxrss_mib``
(``getrusage`` in the child: the kernel's exact peak of RSS, an upper bound of
PSS). A separate pair of cases times ``runtime.mind.clustering.warm_up`` in a fresh
process, cold and warm: the one-time compile itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

GROUP = 40
NOISE_SHARE = 0.05
CHANNEL = "voice"


# -- the store ----------------------------------------------------------------

def build_store(data_dir: Path, n: int) -> dict[str, Any]:
    """``n`` leaf episodes with cited turns and clustered synthetic vectors."""
    from runtime.memories.episodes import EpisodeIn, EpisodeService
    from runtime.memories.profiles import MemoryProfiles
    from runtime.mind import clustering
    from runtime.store.database import Store
    from runtime.store.fact_kinds import FactKinds
    from runtime.time.clock import ManualClock

    settings = c.make_settings(data_dir)
    clock = ManualClock(1_760_000_000.0)
    store = Store(settings.store.path, FactKinds.load(settings.memory.fact_kinds_file),
                  clock=clock)
    profiles = MemoryProfiles.load(settings.memory.profiles_file)
    episodes = EpisodeService(store, profiles)
    noise = int(n * NOISE_SHARE)
    groups = max(1, (n - noise) // GROUP)
    vectors, truth = clustering.synthetic(n - noise, groups, noise=noise, spread=0.3, seed=5)
    started = time.perf_counter()
    with store.write_transaction():
        for i in range(n):
            turns = [store.insert("bench", "transcript", {
                "channel": CHANNEL, "source": "user", "role": "user",
                "content": f"turn {i}.{j} on topic {truth[i]}", "created_at": clock.now(),
                "memory": 1}) for j in range(2)]
            episode_id = episodes.add(EpisodeIn(
                channel=CHANNEL, source="user", gist=f"Memory {i} on topic {truth[i]}.",
                salience=1 + i % 10, cites=turns), "bench")
            store.put_vector("episode", episode_id, "synthetic",
                             vectors[i].astype("float32").tobytes())
    took = time.perf_counter() - started
    store.close()
    return {"episodes": n, "groups": groups, "noise": noise, "build_s": round(took, 2)}


# -- the child: one roll-up in a fresh process -------------------------------------

def child(data_dir: Path, cache_dir: Path) -> dict[str, Any]:
    import resource

    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir)
    t0 = time.perf_counter()
    import numpy as np

    from runtime.llm.providers import FallbackChain, OfflineProvider
    from runtime.memories.episodes import EpisodeIn, EpisodeService
    from runtime.memories.profiles import MemoryProfiles
    from runtime.mind import clustering, rollup
    from runtime.mind.contract import JobContext
    from runtime.store.database import Store
    from runtime.store.fact_kinds import FactKinds
    from runtime.time.clock import ManualClock

    clustering.configure_cache(cache_dir)
    clustering.load()  # UMAP, HDBSCAN (and pynndescent's import-time compile)
    import_s = time.perf_counter() - t0

    settings = c.make_settings(data_dir)
    clock = ManualClock(1_760_000_000.0 + 86400)
    store = Store(settings.store.path, FactKinds.load(settings.memory.fact_kinds_file),
                  clock=clock)
    episodes = EpisodeService(store, MemoryProfiles.load(settings.memory.profiles_file))

    class Writer:
        """EpisodeService, plus the parent's vector as its children's mean."""

        def add_episode(self, episode: EpisodeIn, writer: str) -> int:
            vecs = rollup.apex_vectors(store, episode.children)
            parent = episodes.add(episode, writer)
            with store.write_transaction():
                for child_id in episode.children:
                    store.conn.execute(
                        "DELETE FROM vectors WHERE kind = 'episode' AND item_id = ?",
                        (child_id,))
                mean = clustering.normalise(np.mean(list(vecs.values()), axis=0)[None, :])[0]
                store.put_vector("episode", parent, "synthetic", mean.tobytes())
            return parent

        def add_fact(self, *args: Any) -> Any:
            raise NotImplementedError

        def compact(self, *args: Any) -> Any:
            raise NotImplementedError

    ctx = JobContext(store=store, writer=Writer(), llm=FallbackChain([OfflineProvider()]),
                     clock=clock, settings=settings, budget_s=3600)
    t1 = time.perf_counter()
    result = rollup.roll_up(ctx)
    rollup_s = time.perf_counter() - t1
    counts = {f"level_{r['level']}_apexes": r["n"] for r in store.rows(
        "SELECT level, count(*) AS n FROM episodes WHERE parent_id IS NULL"
        " AND tombstoned_at IS NULL GROUP BY level")}
    parents = {f"level_{r['level']}_parents": r["n"] for r in store.rows(
        "SELECT level, count(*) AS n FROM episodes WHERE level > 0 GROUP BY level")}
    store.close()
    return {"import_s": round(import_s, 2), "rollup_s": round(rollup_s, 2),
            "parents": result.items, "detail": result.detail, **parents, **counts,
            "cache_in_effect": clustering.cache_in_effect(),
            "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def child_warm_up(cache_dir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    from runtime.mind import clustering

    took = clustering.warm_up(cache_dir)
    return {"warm_up_s": round(took, 2), "process_to_ready_s": round(time.perf_counter() - t0, 2)}


# -- the driver ------------------------------------------------------------------

def _pss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def spawn(args: list[str]) -> dict[str, Any]:
    """Run this script as a child with ``args``; its JSON answer, wall time and peak PSS."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        pss = _pss_kib(proc.pid)
        if pss:
            peak = max(peak, pss)
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"child failed ({proc.returncode}): {err[-2000:]}")
    answer = json.loads(out.strip().splitlines()[-1])
    answer["process_s"] = round(time.perf_counter() - started, 2)
    answer["peak_pss_mib"] = round(peak / 1024, 1)
    return answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "warm_up":
        print(json.dumps(child_warm_up(Path(args.cache))))
        return
    if args.child:
        print(json.dumps(child(Path(args.child), Path(args.cache))))
        return

    work = Path(tempfile.mkdtemp(prefix="rvb-consolidate-"))
    results: dict[str, Any] = {"sizes": {}, "warm_up": {}}
    try:
        c.log("warm_up: cold cache")
        cache = work / "cache-warmup"
        results["warm_up"]["cold"] = spawn(["--child", "warm_up", "--cache", str(cache)])
        c.log("warm_up: warm cache")
        results["warm_up"]["warm"] = spawn(["--child", "warm_up", "--cache", str(cache)])
        for n in (int(s) for s in args.sizes.split(",")):
            base = work / f"store-{n}"
            c.log(f"{n}: building the store")
            built = build_store(base, n)
            cache = work / f"cache-{n}"
            cases: dict[str, Any] = {"store": built}
            for case in ("cold", "warm"):
                run_dir = work / f"run-{n}-{case}"
                shutil.copytree(base, run_dir)
                c.log(f"{n}: roll-up, {case} numba cache")
                cases[case] = spawn(["--child", str(run_dir), "--cache", str(cache)])
                shutil.rmtree(run_dir, ignore_errors=True)
            results["sizes"][str(n)] = cases
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    for n, cases in results["sizes"].items():
        for case in ("cold", "warm"):
            r = cases[case]
            rows.append([f"{int(n):,}", case, r["import_s"], r["rollup_s"], r["process_s"],
                         r.get("level_1_parents", 0), r.get("level_2_parents", 0),
                         r["peak_pss_mib"], r["maxrss_mib"]])
    print()
    print(c.table(["apexes", "numba cache", "import s", "roll-up s", "process s",
                   "L1 parents", "L2 parents", "peak PSS MiB", "maxrss MiB"], rows))
    w = results["warm_up"]
    print(f"\nwarm_up() in a fresh process: cold {w['cold']['warm_up_s']} s, "
          f"warm {w['warm']['warm_up_s']} s (process to ready: "
          f"{w['cold']['process_to_ready_s']} s / {w['warm']['process_to_ready_s']} s)")
    results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "platform": platform.platform(), "loadavg_at_end": c.loadavg(),
                          "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    results["goals"] = {"warm_10k_rollup_s_max": 30, "peak_pss_mib_max": 1024}
    c.write_json(args.json, results)


if __name__ == "__main__":
    main()
