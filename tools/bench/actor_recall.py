#!/usr/bin/env python3
"""Turn-zero recall latency through the actors against the same code in process.

Usage:
    tools/bench/actor_recall.py [--sizes 10000,100000] [--cache DIR] [--json OUT.json]

For each store size N:

1. Build the store once, in process: N synthetic household turns (fixed seed,
   see ``_common.household_turns``) written with ``Memory.add_turns`` in
   batches of ``--batch`` (256), which commits the rows, embeds them and adds
   them to the hnswlib index; then ``Memory.close()`` saves the index. With
   ``--long-answers`` the assistant's turns (about 15 %) are paragraphs of
   household sentences, each over 1,100 characters (longer than MiniLM reads):
   a store of long turns, where ``recall.long_store`` applies. With
   ``--cache DIR`` the built store is kept in DIR and later runs copy it
   instead of building again.
2. Start a private local Ray node (no dashboard, bounded object store) and the
   actor runtime on that data directory (``actors.supervisor.start``); the
   Recall actor loads the saved index. Open ``Memory`` on the same directory in
   the driver as well.
3. Warm up (``--warmup`` queries, not counted), then time four operations over
   ``--queries`` distinct questions (never equal to a stored text), ``--rounds``
   times. The queries go in blocks of ``--block`` (50): each operation runs over
   the whole block before the next one starts, the order of the operations
   rotating from block to block (so that slow drift of the machine hits all
   four alike, while one operation's leftovers -- onnxruntime's worker threads
   spin for a while after a call -- rarely land on another's timing):
     actor       ``ray.get(recall.recall.remote(Recall(query=q)))`` from the driver
                 (driver -> Recall actor, which embeds the query itself -> driver)
     in-process  ``Memory.recall(q)``: the same Recaller code, local embedder
     embed       ``embedder.embed([q])`` in process: the query-embedding share
     embed/actor ``ray.get(recall.embed.remote(Embed(texts=[q])))`` from the driver
                 (the Recall actor holds the model)
   Both recall paths use the same fixed ``now`` so that their answers can be
   compared (``same_refs``: the share of queries answered identically).
   ``actor (inside)`` is the ``elapsed_ms`` the Recall actor measured itself.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common as c

from actors import supervisor
from actors.common import RECALL, actor
from actors.messages import Embed, Recall, Recalled
from runtime.config import Settings
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.store.vector_index import KINDS

SEED = 7
QUERY_SEED = 11
CORPUS_START = 1_760_000_000.0
SPAN_DAYS = 365.0
NOW = CORPUS_START + (SPAN_DAYS + 1) * 86400.0  # "now" for both recall paths
META = "bench-store.json"


# -- building (or reusing) a store ----------------------------------------

# --long-answers: an assistant's turn grows to at least this many characters
LONG_ANSWER_CHARS = 1100


def store_key(n: int, seed: int, long_answers: bool = False) -> str:
    return f"store-n{n}-seed{seed}-corpus{c.CORPUS_VERSION}" + ("-long" if long_answers else "")


def corpus(n: int, seed: int, long_answers: bool = False) -> Iterator[TurnIn]:
    """The synthetic household's turns; with ``long_answers`` each assistant turn
    is followed, in the same turn, by household sentences drawn (with their own
    seed) until it is :data:`LONG_ANSWER_CHARS` long."""
    pool = ([t.content for t in c.household_turns(500, seed=seed + 1)]
            if long_answers else [])
    rng = random.Random(seed + 2)
    for turn in c.household_turns(n, seed=seed, start=CORPUS_START, span_days=SPAN_DAYS):
        if long_answers and turn.role == "assistant":
            text = turn.content
            while len(text) < LONG_ANSWER_CHARS:
                text += " " + rng.choice(pool)
            turn = turn.model_copy(update={"content": text})
        yield turn


def read_meta(data_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((data_dir / META).read_text())
    except (OSError, ValueError):
        return None


def build_store(data_dir: Path, n: int, seed: int, batch: int,
                long_answers: bool = False) -> dict[str, Any]:
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    settings = c.make_settings(data_dir)
    c.log(f"building a store of {n:,} memories in {data_dir} (batches of {batch})")
    started = time.perf_counter()
    memory = Memory(settings)
    memory.embedder.embed(["warm up"])  # model load is not part of the build rate
    load_s = time.perf_counter() - started
    t0 = time.perf_counter()
    last_print = t0
    pending = []
    done = 0
    for turn in corpus(n, seed, long_answers):
        pending.append(turn)
        if len(pending) == batch:
            memory.add_turns(pending)
            done += len(pending)
            pending = []
            now = time.perf_counter()
            if now - last_print >= 15 or done == n:
                rate = done / (now - t0)
                eta = (n - done) / rate if rate else 0.0
                c.log(f"  {done:>7,}/{n:,}  {rate:6.1f} turns/s  ETA {eta / 60:5.1f} min")
                last_print = now
    if pending:
        memory.add_turns(pending)
        done += len(pending)
    build_s = time.perf_counter() - t0
    counts = memory.counts()
    memory.close()
    if counts["vectors"] != n:
        raise RuntimeError(f"built {counts} but expected {n} vectors")
    meta = {"n": n, "seed": seed, "corpus_version": c.CORPUS_VERSION,
            "long_answers": long_answers,
            "model": memory.embedder.name, "counts": counts, "batch": batch,
            "build_s": round(build_s, 1), "model_load_s": round(load_s, 2),
            "turns_per_s": round(n / build_s, 1),
            "db_mib": round(settings.store.path.stat().st_size / c.MiB, 1),
            "index_mib": round(sum(p.stat().st_size for p in (data_dir / "index").iterdir())
                               / c.MiB, 1)}
    (data_dir / META).write_text(json.dumps(meta, indent=2))
    c.log(f"  built in {build_s:.0f} s ({meta['turns_per_s']} turns/s), "
          f"db {meta['db_mib']} MiB, index {meta['index_mib']} MiB")
    return meta


def prepare_store(n: int, seed: int, batch: int, work: Path,
                  cache: Path | None, long_answers: bool = False) -> tuple[Path, dict[str, Any]]:
    """A data directory holding the store of ``n`` memories, ours to change."""
    target = work / f"data-{n}"
    if cache is None:
        return target, build_store(target, n, seed, batch, long_answers)
    cached = cache / store_key(n, seed, long_answers)
    meta = read_meta(cached)
    if meta is None or meta.get("n") != n or meta.get("counts", {}).get("vectors") != n:
        meta = build_store(cached, n, seed, batch, long_answers)
        meta["cached"] = False
    else:
        c.log(f"reusing cached store {cached}")
        meta["cached"] = True
    started = time.perf_counter()
    shutil.copytree(cached, target)
    meta["copy_s"] = round(time.perf_counter() - started, 2)
    return target, meta


# -- measuring --------------------------------------------------------------

def measure(settings: Settings, queries: list[str], warmup: list[str],
            rounds: int, chunk_size: int, history: int = 0) -> dict[str, Any]:
    import ray

    ns = settings.runtime.namespace
    started = time.perf_counter()
    sup = supervisor.start(settings)
    actors_s = time.perf_counter() - started
    c.log(f"  actors ready in {actors_s:.1f} s")
    try:
        recall_h = actor(RECALL, ns)
        embed_h = recall_h  # the Recall actor holds the model
        counts = ray.get(recall_h.sync.remote(), timeout=600).counts
        started = time.perf_counter()
        memory = Memory(settings)
        memory.embedder.embed(["warm up"])
        open_s = time.perf_counter() - started
        try:
            load_before = c.loadavg()
            asked = asked_with_history(memory, history)
            res = _run(memory, recall_h, embed_h, queries, warmup, rounds, chunk_size, asked)
            return res | {"actors_ready_s": round(actors_s, 2), "memory_open_s": round(open_s, 2),
                          "index_counts": counts, "loadavg_before": load_before,
                          "loadavg_after": c.loadavg()}
        finally:
            memory.close()
    finally:
        c.stop_runtime(sup)


def asked_with_history(memory: Memory, history: int) -> tuple[float, list[str]]:
    """When and with what excluded every query is asked: :data:`NOW` and
    nothing, or (``history`` > 0) as turn-zero recall asks in a conversation
    going on: a minute after the store's newest turn, its channel's last
    ``history`` turns excluded (the prompt's history)."""
    if history <= 0:
        return NOW, []
    newest = memory.store.row("SELECT channel, created_at FROM transcript ORDER BY id DESC LIMIT 1")
    if newest is None:
        return NOW, []
    rows = memory.store.rows("SELECT id FROM transcript WHERE channel = ? ORDER BY id DESC LIMIT ?",
                             (newest["channel"], history))
    return float(newest["created_at"]) + 60.0, [f"turn:{r['id']}" for r in rows]


def _run(memory: Memory, recall_h: Any, embed_h: Any, queries: list[str],
         warmup: list[str], rounds: int, chunk_size: int,
         asked: tuple[float, list[str]] = (NOW, [])) -> dict[str, Any]:
    import ray

    now, exclude = asked

    times: dict[str, list[float]] = {k: [] for k in
                                     ("actor", "actor_inside", "inproc", "embed", "embed_actor")}
    same = 0
    items: list[int] = []

    def op_actor(q: str, keep: bool) -> list[str]:
        t = time.perf_counter()
        reply: Recalled = ray.get(recall_h.recall.remote(Recall(query=q, now=now, exclude=exclude)),
                                  timeout=60)
        if keep:
            times["actor"].append((time.perf_counter() - t) * 1000)
            times["actor_inside"].append(reply.elapsed_ms)
        return reply.refs

    def op_inproc(q: str, keep: bool) -> list[str]:
        t = time.perf_counter()
        result = memory.recall(q, now=now, exclude=exclude)
        if keep:
            times["inproc"].append((time.perf_counter() - t) * 1000)
        return result.refs

    def op_embed(q: str, keep: bool) -> None:
        t = time.perf_counter()
        memory.embedder.embed([q])
        if keep:
            times["embed"].append((time.perf_counter() - t) * 1000)

    def op_embed_actor(q: str, keep: bool) -> None:
        t = time.perf_counter()
        ray.get(embed_h.embed.remote(Embed(texts=[q])), timeout=60)
        if keep:
            times["embed_actor"].append((time.perf_counter() - t) * 1000)

    ops = {"actor": op_actor, "inproc": op_inproc, "embed": op_embed,
           "embed_actor": op_embed_actor}
    order = list(ops)

    def block(chunk: list[str], k: int, keep: bool) -> tuple[list[Any], list[Any]]:
        """Each operation over the whole chunk in turn, the order rotated by ``k``."""
        refs: dict[str, list[Any]] = {}
        for name in order[k % 4:] + order[:k % 4]:
            refs[name] = [ops[name](q, keep) for q in chunk]
        return refs["actor"], refs["inproc"]

    c.log(f"  warm-up: {len(warmup)} queries")
    block(warmup, 0, keep=False)
    c.log(f"  measuring: {len(queries)} queries x {rounds} rounds, blocks of {chunk_size}")
    k = 0
    for _ in range(rounds):
        for start in range(0, len(queries), chunk_size):
            a, b = block(queries[start:start + chunk_size], k, keep=True)
            k += 1
            same += sum(x == y for x, y in zip(a, b))
            items.extend(len(y) for y in b)
    n = len(queries) * rounds
    return {name: c.lat_summary(ms) for name, ms in times.items()} | {
        "same_refs": round(same / n, 4), "items_mean": round(statistics.fmean(items), 2),
        "items_zero": round(sum(1 for x in items if x == 0) / n, 4)}


# -- main -------------------------------------------------------------------

LABELS = [("inproc", "in-process Memory.recall"), ("actor", "actor Recall (driver ray.get)"),
          ("actor_inside", "actor Recall (inside actor)"), ("embed", "query embed (in-process)"),
          ("embed_actor", "query embed (Recall actor)")]


def report(results: list[dict[str, Any]]) -> None:
    rows = []
    for res in results:
        n = res["n"]
        base = res["inproc"]
        for key, label in LABELS:
            s = res[key]
            ratio50 = s["p50_ms"] / base["p50_ms"] if base["p50_ms"] else 0.0
            ratio99 = s["p99_ms"] / base["p99_ms"] if base["p99_ms"] else 0.0
            rows.append([n, label, s["p50_ms"], s["p90_ms"], s["p99_ms"], s["mean_ms"],
                         round(ratio50, 2), round(ratio99, 2)])
    print()
    print(c.table(["memories", "operation", "p50 ms", "p90 ms", "p99 ms", "mean ms",
                   "x p50", "x p99"], rows))
    print("(x = ratio to in-process Memory.recall at the same size)")
    print()
    print(c.table(["memories", "same refs", "items/query", "no items", "actors ready s",
                   "build turns/s"],
                  [[r["n"], r["same_refs"], r["items_mean"], r["items_zero"],
                    r["actors_ready_s"], r["store"].get("turns_per_s", 0.0)]
                   for r in results]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000",
                    help="store sizes, comma-separated (default 10000,100000)")
    ap.add_argument("--queries", type=int, default=300, help="distinct measured queries")
    ap.add_argument("--warmup", type=int, default=30, help="warm-up queries (not counted)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the queries")
    ap.add_argument("--block", type=int, default=50,
                    help="queries per block: each operation runs over a block in turn")
    ap.add_argument("--batch", type=int, default=256, help="Memory.add_turns batch when building")
    ap.add_argument("--seed", type=int, default=SEED, help="corpus seed")
    ap.add_argument("--cache", type=Path, default=None,
                    help="keep built stores here and reuse them on later runs")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    ap.add_argument("--long-answers", action="store_true",
                    help="the assistant's turns are paragraphs (over 1,100 characters):"
                         " a store of long turns")
    ap.add_argument("--history", type=int, default=0,
                    help="ask as in a conversation going on: a minute after the newest turn,"
                         " its channel's last N turns excluded (default 0: at NOW, nothing)")
    ap.add_argument("--recall", type=json.loads, default={},
                    help='JSON [recall] settings for the measured runtime, e.g.'
                         ' \'{"passages": true, "diversity_similarity": 0.25}\'')
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    wall = time.perf_counter()

    work = Path(tempfile.mkdtemp(prefix="rvb-recall-"))
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    try:
        stores: dict[int, tuple[Path, dict[str, Any]]] = {}
        for n in sizes:
            stores[n] = prepare_store(n, args.seed, args.batch, work, args.cache,
                                      args.long_answers)
        texts: set[str] = set()
        for turn in corpus(max(sizes), args.seed, args.long_answers):
            texts.add(turn.content)
        all_q = c.household_queries(args.queries + args.warmup, seed=QUERY_SEED, avoid=texts)
        warmup, queries = all_q[:args.warmup], all_q[args.warmup:]
        # the Ray node lives across sizes; each size gets its own namespace and actors
        ray_settings = c.make_settings(work / "unused")
        with c.local_ray(ray_settings, dashboard=False) as ray_info:
            c.log(f"ray up in {ray_info['init_s']:.1f} s ({ray_info['session_dir']})")
            for n in sizes:
                data_dir, meta = stores[n]
                c.log(f"size {n:,}: starting the actors on {data_dir}")
                settings = c.make_settings(data_dir, recall=args.recall)
                res = measure(settings, queries, warmup, args.rounds, args.block, args.history)
                res |= {"n": n, "store": meta}
                results.append(res)
                c.log(f"  in-process p50 {res['inproc']['p50_ms']:.1f} ms, "
                      f"actor p50 {res['actor']['p50_ms']:.1f} ms")
                shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report(results)
    wall_s = time.perf_counter() - wall
    summary = "; ".join(
        f"{r['n']:,}: actor p50/p99 {r['actor']['p50_ms']:.1f}/{r['actor']['p99_ms']:.1f} ms"
        f" vs in-process {r['inproc']['p50_ms']:.1f}/{r['inproc']['p99_ms']:.1f} ms"
        f" (x{r['actor']['p50_ms'] / r['inproc']['p50_ms']:.2f} p50),"
        f" embed p50 {r['embed']['p50_ms']:.1f} ms" for r in results)
    print(f"\nSUMMARY actor_recall: {summary}; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "actor_recall", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "params": {"sizes": sizes, "queries": args.queries, "warmup": args.warmup,
                   "long_answers": args.long_answers, "recall": args.recall,
                   "rounds": args.rounds, "block": args.block, "seed": args.seed,
                   "query_seed": QUERY_SEED, "kinds": list(KINDS), "history": args.history,
                   "now": NOW if args.history <= 0 else "a minute after the newest turn"},
        "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
