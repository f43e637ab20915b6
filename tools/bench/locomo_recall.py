#!/usr/bin/env python3
"""Recall benchmark on LoCoMo conversations.

Usage:
    tools/bench/locomo_recall.py DATA.json [--conversations conv-26,conv-30] [--json OUT.json]
                                 [--subconscious] [--no-temporal] [--loo]
                                 [--grid-axes JSON] [--loo-metric turn_any@10|turn_all@10]
                                 [--turn-text plain|dated|bracketed|suffixed]

Each conversation is ingested into a fresh store through the public runtime
API (:class:`runtime.memory.Memory`, turn times from the session dates). Each
question of categories 1-4 is asked through the same recall call the turn path
uses; what recall returns is mapped to the transcript turns it cites, in rank
order. Beside it, on the same store and the same embeddings, three plain
baselines run: FTS5 bm25 alone, MiniLM cosine alone, and their reciprocal-rank
fusion (k = 60).

With ``--subconscious`` the background jobs run over each conversation before
the questions, as they would while the household is away: after each session
the clock jumps past the idle window and ``consolidate`` then ``facts`` run
(each until it reports no more work) with the offline provider, through the
same job functions the Cron actor fires. Recall then sees episodes and facts
beside the raw turns; an episode counts through the turns it cites.

With ``--no-temporal`` recall runs without temporal recall
(``recall.temporal = false``, :mod:`runtime.recall.temporal`), for the
before/after comparison on the same code.

With ``--loo`` reverie's knobs are also fitted leave-one-conversation-out
(issue 13). Each conversation is ingested once; then every point of
:data:`GRID_AXES` (a small product over :class:`RecallSettings` fields, the
configured settings always among them, as grid point 0; ``--grid-axes`` gives
another) re-runs only the questions, through a :class:`Recaller` built on
the same store with the changed settings (the question embeddings are cached across grid points, so
the grid's latencies leave the query embedding out). For each fold the point
with the best turn_any@10 (``--loo-metric turn_all@10``: turn_all@10) over the
pooled questions of the other conversations is chosen (ties: the lower grid
index, so the configured settings win a tie)
and measured on the held-out conversation; the held-out questions of the
folds are pooled (micro average). The JSON gets a ``loo`` object: ``reverie``
(the pooled held-out figures, ``by_category`` too), ``chosen`` (one dict per
fold: ``held_out``, ``grid_index``, ``knobs``, ``train_<metric>``,
``held_out_turn_any@10``), ``grid`` (the number of points), ``grid_axes``,
``in_sample_best`` (the best point on all five by the same metric, its knobs
and figures),
``configured`` (grid point 0 on all five), ``in_sample_by_point``
(turn_any@10, turn_all@10, with_episode and with_fact of every point on all
five), ``fold_mean_turn_any@10`` (the
unweighted mean over the folds), and ``metric``, ``pooling`` and
``baselines`` as words; ``loo_other_metrics`` has, for each other
``--loo-metric``, the same grid chosen on it (``reverie``, ``chosen``,
``in_sample_best``, ``fold_mean_turn_any@10``). The baselines have no knobs:
their leave-one-out figures equal their in-sample figures.

``--turn-text`` changes, in this process only, the text embedded for a turn
(:func:`runtime.recall.indexing.document`): ``plain`` is the runtime's own
``speaker: content``; ``dated`` prepends the turn's local date in the
household zone (``8 May 2023, Caroline: ...``); ``bracketed`` does the same as
``[8 May 2023] Caroline: ...``, ``suffixed`` as ``Caroline: ... (8 May 2023)``.
Dense and RRF baselines use the same vectors.

Metrics per retriever (k counts cited turns):
    turn_any@5, turn_any@10  any evidence turn among the first k cited turns
    turn_all@10              every evidence turn among the first 10
    sess_all@10              every evidence session among the sessions of the first 10
    n                        questions scored
    p50_ms, p99_ms           retrieval latency per question (query embedding included)
    with_episode, with_fact  reverie: questions with an episode / a fact among recall's
                             items (0 for the baselines and without --subconscious)
    by_category              the same per LoCoMo category (1 multi-hop, 2 temporal,
                             3 open-domain, 4 single-hop)
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime.config import RecallSettings, load_settings  # noqa: E402
from runtime.llm.embedder import Embedder, make_embedder  # noqa: E402
from runtime.llm.providers import make_llm  # noqa: E402
from runtime.memories.transcript import TurnIn  # noqa: E402
from runtime.memory import Memory  # noqa: E402
from runtime.mind.contract import JobContext  # noqa: E402
from runtime.recall import indexing, passages  # noqa: E402
from runtime.recall.hybrid import Recaller  # noqa: E402
from runtime.recall.passages import Cut  # noqa: E402
from runtime.store.database import Row  # noqa: E402
from runtime.store.fts import match_expression  # noqa: E402
from runtime.time.clock import DAY, ManualClock, household_zone  # noqa: E402

log = logging.getLogger("locomo_recall")

RETRIEVERS = ("reverie", "bm25", "dense", "rrf")
CATEGORIES = {1, 2, 3, 4}
RRF_K = 60
DEPTH = 10
SECONDS_PER_TURN = 30.0
SUBCONSCIOUS_JOBS = ("runtime.mind.consolidate", "runtime.mind.extract")  # each module's run()
MAX_JOB_ROUNDS = 50
_DIA = re.compile(r"^D(\d+):(\d+)$")

# --loo: alternative values per RecallSettings field; the configured value of
# each is added in front, so grid point 0 is the configured settings.
# (A first grid of 48 had relative_floor 0.3 and 0.6, context_turns 2 only and
# candidates 120 only; relative_floor 0.3 scored exactly as 0.45 everywhere.)
GRID_AXES: dict[str, tuple[float | int, ...]] = {
    "relative_floor": (0.6,),
    "min_cosine": (0.2,),
    "context_turns": (2, 3),
    "weight_recency": (0.0,),
    "candidates": (120, 200),
}
LOO_METRIC = "turn_any@10"
# --loo-metric: what a fold's grid point is chosen on (the Scores field behind it)
LOO_METRICS = {"turn_any@10": "any10", "turn_all@10": "all10"}
# --turn-text: the text embedded for a turn, from its date and runtime's own text
TURN_TEXTS: dict[str, str | None] = {
    "plain": None,
    "dated": "{date}, {text}",
    "bracketed": "[{date}] {text}",
    "suffixed": "{text} ({date})",
}


def parse_session_time(text: str) -> float:
    """'1:56 pm on 8 May, 2023' -> epoch seconds (UTC)."""
    dt = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    return dt.replace(tzinfo=UTC).timestamp()


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text", ""))
    caption = turn.get("blip_caption")
    if caption:
        text = f"{text} [shares a photo: {caption}]"
    return text


def session_of(dia_id: str) -> int:
    m = _DIA.match(dia_id)
    return int(m.group(1)) if m else -1


def local_day(ts: float, zone: tzinfo) -> str:
    """'8 May 2023': the day of ``ts`` in ``zone``."""
    dt = datetime.fromtimestamp(ts, tz=zone)
    return f"{dt.day} {dt:%B %Y}"


def use_turn_text(name: str, zone: tzinfo) -> None:
    """Make this process embed turns as ``TURN_TEXTS[name]`` (bench-only: patches
    :mod:`runtime.recall.indexing`; ``plain`` leaves it alone)."""
    template = TURN_TEXTS[name]
    if template is None:
        return
    sql = indexing._PENDING["turn"]
    if "t.created_at" not in sql:
        patched = sql.replace("t.content FROM", "t.content, t.created_at FROM")
        if patched == sql:
            raise RuntimeError("runtime.recall.indexing's turn query changed; update --turn-text")
        indexing._PENDING["turn"] = patched
    plain = indexing.document

    def document(kind: str, row: Row) -> str:
        text = plain(kind, row)
        if kind != "turn":
            return text
        return template.format(date=local_day(row["created_at"], zone), text=text)

    indexing.document = document


class QueryCache:
    """An embedder that remembers single-text calls (the questions), so grid
    points after the first do not embed the question again."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._memo: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) != 1:
            return np.asarray(self.inner.embed(texts))
        hit = self._memo.get(texts[0])
        if hit is None:
            hit = self._memo[texts[0]] = np.asarray(self.inner.embed(texts))
        return hit


def grid_points(base: RecallSettings,
                axes_in: dict[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """Every combination of ``axes_in`` (default :data:`GRID_AXES`), the configured
    settings first."""
    axes = {name: tuple(dict.fromkeys((getattr(base, name), *values)))
            for name, values in (GRID_AXES if axes_in is None else axes_in).items()}
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


@dataclass
class Scores:
    any5: list[float] = field(default_factory=list)
    any10: list[float] = field(default_factory=list)
    all10: list[float] = field(default_factory=list)
    sess10: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    # reverie only: 1 when an episode / a fact is among recall's items
    episode: list[float] = field(default_factory=list)
    fact: list[float] = field(default_factory=list)

    def add(self, ranked: list[str], evidence: set[str], elapsed_ms: float,
            kinds: set[str] | None = None) -> None:
        """``kinds``: the kinds among recall's items (reverie; None for a baseline)."""
        if kinds is not None:
            self.episode.append(float("episode" in kinds))
            self.fact.append(float("fact" in kinds))
        top5, top10 = set(ranked[:5]), set(ranked[:DEPTH])
        self.any5.append(float(bool(evidence & top5)))
        self.any10.append(float(bool(evidence & top10)))
        self.all10.append(float(evidence <= top10))
        sessions = {session_of(d) for d in ranked[:DEPTH]}
        self.sess10.append(float({session_of(d) for d in evidence} <= sessions))
        self.latency_ms.append(elapsed_ms)

    def extend(self, other: Scores) -> None:
        for name in ("any5", "any10", "all10", "sess10", "latency_ms", "episode", "fact"):
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> dict[str, float | int]:
        lat = np.asarray(self.latency_ms or [0.0])
        mean = statistics.fmean
        return {
            "turn_any@5": round(mean(self.any5 or [0.0]), 4),
            "turn_any@10": round(mean(self.any10 or [0.0]), 4),
            "turn_all@10": round(mean(self.all10 or [0.0]), 4),
            "sess_all@10": round(mean(self.sess10 or [0.0]), 4),
            "n": len(self.any10),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "with_episode": int(sum(self.episode)),
            "with_fact": int(sum(self.fact)),
        }


class Baselines:
    """Plain retrievers over one conversation's turns, on the runtime's own store."""

    def __init__(self, memory: Memory, embedder: Embedder) -> None:
        self.memory = memory
        self.embedder = embedder
        rows = memory.store.rows(
            "SELECT v.item_id, v.vec FROM vectors v WHERE v.kind = 'turn' ORDER BY v.item_id")
        self.ids = np.asarray([r["item_id"] for r in rows], dtype=np.int64)
        self.matrix = np.stack([np.frombuffer(r["vec"], dtype=np.float32) for r in rows])

    def bm25(self, question: str) -> list[int]:
        expr = match_expression(question)
        if expr is None:
            return []
        return [r[0] for r in self.memory.store.conn.execute(
            "SELECT rowid FROM transcript_fts WHERE transcript_fts MATCH ?"
            " ORDER BY bm25(transcript_fts) LIMIT ?", (expr, DEPTH * 5))]

    def dense(self, question: str) -> list[int]:
        q = self.embedder.embed([question])[0]
        sims = self.matrix @ q
        top = np.argsort(-sims, kind="stable")[: DEPTH * 5]
        return [int(self.ids[i]) for i in top]

    def rrf(self, question: str) -> list[int]:
        fused: dict[int, float] = {}
        for ranking in (self.bm25(question), self.dense(question)):
            for rank, turn_id in enumerate(ranking):
                fused[turn_id] = fused.get(turn_id, 0.0) + 1.0 / (RRF_K + rank + 1)
        return sorted(fused, key=lambda t: (-fused[t], t))


def ingest(
    memory: Memory, clock: ManualClock, conv: dict[str, Any],
    after_session: Callable[[float], None] | None = None,
) -> tuple[dict[int, str], float]:
    """Write every turn through the runtime API; return transcript id -> dia_id, last time."""
    c = conv["conversation"]
    sessions = sorted(
        (int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k)),
    )
    id_to_dia: dict[int, str] = {}
    last = 0.0
    for n in sessions:
        if after_session is not None and last:
            after_session(last)
        start = parse_session_time(c[f"session_{n}_date_time"])
        turns = c[f"session_{n}"]
        batch = [
            TurnIn(channel=conv["sample_id"], source="user", role="user",
                   speaker=t["speaker"], content=turn_text(t),
                   created_at=start + i * SECONDS_PER_TURN, external_id=t["dia_id"])
            for i, t in enumerate(turns) if turn_text(t).strip()
        ]
        clock.set(start)
        ids = memory.add_turns(batch)
        id_to_dia.update({i: t.external_id or "" for i, t in zip(ids, batch)})
        last = max(last, start + len(turns) * SECONDS_PER_TURN)
    return id_to_dia, last


def run_jobs(memory: Memory, clock: ManualClock, at: float) -> dict[str, int]:
    """The subconscious after a session: the clock jumps past the idle window and
    each job runs until it has nothing more to do; returns items per job."""
    import importlib

    settings = memory.settings
    clock.set(at + settings.jobs.idle_after_s + 1.0)
    done: dict[str, int] = {}
    for module in SUBCONSCIOUS_JOBS:
        run = importlib.import_module(module).run
        for _ in range(MAX_JOB_ROUNDS):
            ctx = JobContext(store=memory.store, writer=memory, llm=make_llm(settings.llm),
                             clock=clock, settings=settings)
            result = run(ctx)
            done[module] = done.get(module, 0) + result.items
            if not result.more:
                break
    memory.indexer.sync()
    return done


def passage_cut(base: RecallSettings, grid: Sequence[dict[str, Any]]) -> Cut | None:
    """How the bench's store cuts long turns into passages: as configured, when
    the configured settings or a grid point use passages (the store is built
    once for every point, so their length cannot be a grid axis)."""
    if {"passage_tokens", "passage_overlap"} & {k for point in grid for k in point}:
        raise SystemExit("passage_tokens / passage_overlap cannot be grid axes"
                         " (the store is cut once): set them in the config")
    if passages.configured(base) or any(
            passages.configured(base.model_copy(update=point)) for point in grid):
        return Cut(base.passage_tokens, base.passage_overlap)
    return None


def run_conversation(conv: dict[str, Any], embedder: Embedder, workdir: Path,
                     subconscious: bool = False,
                     temporal: bool = True,
                     grid: Sequence[dict[str, Any]] = (),
                     grid_scores: list[dict[int, Scores]] | None = None,
                     ) -> dict[str, dict[int, Scores]]:
    """Scores per retriever and per question category. With ``grid``, reverie is
    run again for each grid point (settings changed as given) on the same store,
    and ``grid_scores`` gets one ``{category: Scores}`` per point."""
    data_dir = workdir / conv["sample_id"]
    settings = load_settings(env={}, overrides={"store": {"data_dir": str(data_dir)},
                                                "recall": {"temporal": temporal}})
    clock = ManualClock(0.0)
    memory = Memory(settings, clock=clock, embedder=embedder)
    memory.indexer.cut = passage_cut(settings.recall, grid)
    t0 = time.perf_counter()
    job_items: dict[str, int] = {}

    def after_session(at: float) -> None:
        for name, n in run_jobs(memory, clock, at).items():
            job_items[name] = job_items.get(name, 0) + n

    id_to_dia, last = ingest(memory, clock, conv, after_session if subconscious else None)
    if subconscious:
        after_session(last)
        counts = memory.counts()
        log.info("%s: jobs did %s; %d episodes, %d facts", conv["sample_id"], job_items,
                 counts["episodes"], counts["facts"])
    log.info("%s: %d turns ingested in %.1f s", conv["sample_id"], len(id_to_dia),
             time.perf_counter() - t0)
    now = last + DAY
    clock.set(now)
    valid = set(id_to_dia.values())
    questions: list[tuple[int, str, set[str]]] = []
    for qa in conv["qa"]:
        category = qa.get("category")
        if category not in CATEGORIES:
            continue
        evidence = {e for e in qa.get("evidence", []) if e in valid}
        if evidence:
            questions.append((int(category), str(qa["question"]), evidence))
    baselines = Baselines(memory, embedder)
    plain: dict[str, Callable[[str], list[int]]] = {
        "bm25": baselines.bm25, "dense": baselines.dense, "rrf": baselines.rrf}
    scores = {name: {c: Scores() for c in CATEGORIES} for name in RETRIEVERS}
    for category, question, evidence in questions:
        result = memory.recall(question, now=now)
        ranked = [id_to_dia[t] for t in result.cited_turns() if t in id_to_dia]
        scores["reverie"][category].add(ranked, evidence, result.elapsed_ms,
                                        {item.kind for item in result.items})
        for name, fn in plain.items():
            t1 = time.perf_counter()
            ids = fn(question)
            elapsed = (time.perf_counter() - t1) * 1000
            scores[name][category].add([id_to_dia[i] for i in ids if i in id_to_dia], evidence,
                                       elapsed)
    if grid:
        t0 = time.perf_counter()
        cache = QueryCache(embedder)
        base = memory.settings.recall
        for point in grid:
            recaller = Recaller(memory.store, memory.index, cache, memory.kinds,
                                RecallSettings(**{**base.model_dump(), **point}), clock,
                                memory.recaller.zone)
            by_cat = {c: Scores() for c in CATEGORIES}
            for category, question, evidence in questions:
                result = recaller.recall(question, now=now)
                ranked = [id_to_dia[t] for t in result.cited_turns() if t in id_to_dia]
                by_cat[category].add(ranked, evidence, result.elapsed_ms,
                                     {item.kind for item in result.items})
            if grid_scores is not None:
                grid_scores.append(by_cat)
        log.info("%s: %d grid points in %.1f s", conv["sample_id"], len(grid),
                 time.perf_counter() - t0)
    memory.close()
    return scores


def _pooled(parts: Sequence[dict[int, Scores]]) -> dict[int, Scores]:
    out = {c: Scores() for c in CATEGORIES}
    for part in parts:
        for c, sc in part.items():
            out[c].extend(sc)
    return out


def _summary(by_cat: dict[int, Scores]) -> dict[str, Any]:
    overall = Scores()
    for sc in by_cat.values():
        overall.extend(sc)
    return {**overall.summary(),
            "by_category": {str(c): by_cat[c].summary() for c in sorted(CATEGORIES)}}


def _metric(by_cat: dict[int, Scores], metric: str = LOO_METRIC) -> float:
    values = [v for c in CATEGORIES for v in getattr(by_cat[c], LOO_METRICS[metric])]
    return statistics.fmean(values) if values else 0.0


def leave_one_out(grid: Sequence[dict[str, Any]],
                  per_conv: dict[str, list[dict[int, Scores]]],
                  metric: str = LOO_METRIC) -> dict[str, Any]:
    """Choose a grid point on all conversations but one (best pooled ``metric``,
    default turn_any@10, ties to the lower index), score it on that one; pool the
    held-out questions. The per-fold and in-sample figures stay turn_any@10."""
    convs = list(per_conv)
    held_out: list[dict[int, Scores]] = []
    chosen: list[dict[str, Any]] = []
    fold_values: list[float] = []
    for out in convs:
        train = [c for c in convs if c != out]
        values = [_metric(_pooled([per_conv[c][g] for c in train]), metric)
                  for g in range(len(grid))]
        best = max(range(len(grid)), key=lambda g: (values[g], -g))
        held_out.append(per_conv[out][best])
        fold_values.append(_metric(per_conv[out][best]))
        chosen.append({"held_out": out, "grid_index": best, "knobs": grid[best],
                       f"train_{metric}": round(values[best], 4),
                       "held_out_turn_any@10": round(fold_values[-1], 4)})
    everywhere = [_pooled([per_conv[c][g] for c in convs]) for g in range(len(grid))]
    best_all = max(range(len(grid)), key=lambda g: (_metric(everywhere[g], metric), -g))
    return {
        "metric": metric,
        "pooling": "questions of the held-out folds pooled (micro average)",
        "reverie": _summary(_pooled(held_out)),
        "chosen": chosen,
        "grid": len(grid),
        "fold_mean_turn_any@10": round(statistics.fmean(fold_values), 4) if fold_values else 0.0,
        "in_sample_best": {"grid_index": best_all, "knobs": grid[best_all],
                           **_summary(everywhere[best_all])},
        "configured": {"grid_index": 0, "knobs": grid[0], **_summary(everywhere[0])},
        "in_sample_by_point": [
            {"grid_index": g, "knobs": grid[g], "turn_any@10": round(_metric(everywhere[g]), 4),
             **{k: v for k, v in _summary(everywhere[g]).items()
                if k in ("turn_all@10", "with_episode", "with_fact")}}
            for g in range(len(grid))],
        "baselines": "no knobs: leave-one-out equals in-sample",
    }


def print_loo(loo: dict[str, Any], header: list[str]) -> None:
    print(f"leave-one-conversation-out over {loo['grid']} grid points, selected on "
          f"{loo['metric']}, {loo['pooling']}; baselines: {loo['baselines']}")
    for fold in loo["chosen"]:
        print(f"  held out {fold['held_out']}: grid {fold['grid_index']} {fold['knobs']} "
              f"train {fold['train_' + loo['metric']]} "
              f"held-out {fold['held_out_turn_any@10']}")
    print(" | ".join(header))
    for label, row in (("reverie configured", loo["configured"]),
                       ("reverie in-sample best", loo["in_sample_best"]),
                       ("reverie LOO", loo["reverie"])):
        print(" | ".join([label, *(str(row[h]) for h in header[1:])]))
        for c in sorted(CATEGORIES):
            cat = row["by_category"][str(c)]
            print(" | ".join([f"  cat {c}", *(str(cat[h]) for h in header[1:])]))
    print(f"in-sample best: grid {loo['in_sample_best']['grid_index']} "
          f"{loo['in_sample_best']['knobs']}; LOO fold mean turn_any@10 "
          f"{loo['fold_mean_turn_any@10']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="LoCoMo JSON (a list of conversations)")
    parser.add_argument("--conversations", help="comma-separated sample ids (default: all)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--workdir", type=Path, help="keep the stores here (default: temp)")
    parser.add_argument("--subconscious", action="store_true",
                        help="run consolidate and facts (offline provider) after each session")
    parser.add_argument("--no-temporal", action="store_true",
                        help="recall without temporal recall (recall.temporal = false)")
    parser.add_argument("--loo", action="store_true",
                        help="also fit reverie's knobs over GRID_AXES leave-one-conversation-out")
    parser.add_argument("--grid-axes", type=json.loads,
                        help="with --loo: JSON {RecallSettings field: [alternative values]}"
                             " instead of GRID_AXES")
    parser.add_argument("--loo-metric", choices=tuple(LOO_METRICS), default=LOO_METRIC,
                        help="with --loo: what each fold's grid point is chosen on")
    parser.add_argument("--turn-text", choices=tuple(TURN_TEXTS), default="plain",
                        help="text embedded for a turn (bench-only; default: the runtime's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    conversations = json.loads(args.data.read_text())
    if args.conversations:
        wanted = {c.strip() for c in args.conversations.split(",") if c.strip()}
        unknown = wanted - {c["sample_id"] for c in conversations}
        if unknown:
            parser.error(f"unknown conversations: {', '.join(sorted(unknown))}")
        conversations = [c for c in conversations if c["sample_id"] in wanted]

    settings = load_settings(env={})
    use_turn_text(args.turn_text, household_zone(settings.household.timezone))
    embedder = make_embedder(settings.embedder)
    totals = {name: {c: Scores() for c in CATEGORIES} for name in RETRIEVERS}
    if args.grid_axes is not None:
        if not isinstance(args.grid_axes, dict):
            parser.error("--grid-axes: expected a JSON object")
        unknown = set(args.grid_axes) - set(RecallSettings.model_fields)
        if unknown:
            parser.error(f"--grid-axes: not RecallSettings fields: {sorted(unknown)}")
    grid = grid_points(settings.recall, args.grid_axes) if args.loo else []
    per_conv: dict[str, list[dict[int, Scores]]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="locomo-") as tmp:
        workdir = args.workdir or Path(tmp)
        for conv in conversations:
            per_conv[conv["sample_id"]] = []
            for name, by_cat in run_conversation(conv, embedder, workdir, args.subconscious,
                                                 not args.no_temporal, grid,
                                                 per_conv[conv["sample_id"]]).items():
                for c, s in by_cat.items():
                    totals[name][c].extend(s)
    log.info("bench took %.1f s", time.perf_counter() - started)

    report: dict[str, Any] = {}
    for name in RETRIEVERS:
        overall = Scores()
        for s in totals[name].values():
            overall.extend(s)
        report[name] = {**overall.summary(), "by_category": {
            str(c): totals[name][c].summary() for c in sorted(CATEGORIES)}}
    report["subconscious"] = args.subconscious
    report["temporal"] = not args.no_temporal
    report["turn_text"] = args.turn_text
    if args.loo:
        report["loo"] = leave_one_out(grid, per_conv, args.loo_metric)
        # the same grid chosen on the other metrics: only the choice differs
        report["loo_other_metrics"] = {
            m: {k: v for k, v in leave_one_out(grid, per_conv, m).items()
                if k in ("reverie", "chosen", "in_sample_best", "fold_mean_turn_any@10")}
            for m in LOO_METRICS if m != args.loo_metric}
        report["loo"]["grid_axes"] = {name: sorted({p[name] for p in grid}) for name in grid[0]}
    header = ["retriever", "turn_any@5", "turn_any@10", "turn_all@10", "sess_all@10", "n",
              "p50_ms", "p99_ms"]
    print(" | ".join(header))
    for name in (*RETRIEVERS[1:], RETRIEVERS[0]):
        print(" | ".join([name, *(str(report[name][h]) for h in header[1:])]))
        for c in sorted(CATEGORIES):
            cat = report[name]["by_category"][str(c)]
            print(" | ".join([f"  cat {c}", *(str(cat[h]) for h in header[1:])]))
    if args.loo:
        print_loo(report["loo"], header)
        for m, other in report["loo_other_metrics"].items():
            print(f"chosen on {m} instead: "
                  + ", ".join(f"{f['held_out']} {f['knobs']}" for f in other["chosen"]))
            row = other["reverie"]
            print(" | ".join([f"reverie LOO ({m})", *(str(row[h]) for h in header[1:])]))
            for c in sorted(CATEGORIES):
                cat = row["by_category"][str(c)]
                print(" | ".join([f"  cat {c}", *(str(cat[h]) for h in header[1:])]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    r = report["reverie"]
    print(f"reverie: turn_any@10={r['turn_any@10']} turn_any@5={r['turn_any@5']} "
          f"turn_all@10={r['turn_all@10']} sess_all@10={r['sess_all@10']} n={r['n']} "
          f"p50={r['p50_ms']}ms p99={r['p99_ms']}ms with_episode={r['with_episode']}"
          f" with_fact={r['with_fact']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
