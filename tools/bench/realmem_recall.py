#!/usr/bin/env python3
"""Recall benchmark on RealMemBench persons (issue 25).

Usage:
    tools/bench/realmem_recall.py DIR_OR_FILES... [--persons Kenta_Tanaka,...]
                                  [--json OUT.json] [--cache DIR] [--query turn|alone]
                                  [--loo] [--grid-axes JSON] [--points JSON]
                                  [--locomo LOCOMO.json]

Each person's ``*_dialogues_256k.json`` is written, turn by turn in time order,
into a fresh store through the public runtime API (:class:`runtime.memory.Memory`;
one channel, ``chat``; user turns as ``user``, the assistant's as ``assistant``;
a session starts on its date at 09:00 in the household zone, or an hour after
the previous one, its turns 30 s apart; a turn is cut at 32,000 characters).
At each query (a user turn with ``is_query``) whose evidence is not empty,
recall is asked at the moment of the query, before the query itself is
written, with everything said before it in the store.

Evidence: the ``session_uuid`` s of the ``memory_used`` of the assistant turn
right after the query, minus the query's own session. Metrics (each cited turn
counts for its session):

    sess_any@10   some evidence session is among the sessions of the first 10 cited turns
    sess_all@10   every evidence session is
    n             queries scored
    p50_ms        retrieval latency per query (query embedding included)
    cited         reverie: mean number of turns recall cited
    by_category   the same per RealMem ``category_name``

``--query turn`` (the default) asks as the Turns actor's turn-zero recall does
(:func:`runtime.turn.recall_for_turn` through ``Memory.recall``): the message,
the channel's recent turns as the conversation it is part of
(``runtime.settings.history_turns`` of them; :mod:`runtime.recall.query`) and
those turns excluded (they are in the prompt already). ``--query alone`` asks
with the query text alone and excludes nothing (the issue's baseline table).

Beside reverie, on the same store and the same embeddings at the same moment,
three plain baselines run over the turns, with the query text alone: FTS5 bm25,
MiniLM cosine and their reciprocal-rank fusion (k = 60).

``--cache DIR`` keeps every text's embedding in ``DIR`` (one ``.npz`` per
model), so a second run embeds nothing it has seen.

``--loo``: reverie's knobs fitted leave-one-out over the grid
(:data:`GRID_AXES`, ``--grid-axes`` another, ``--points`` points beside the
axes', e.g. ``recall.long_store`` tables; the configured settings are
point 0): each store is built once, every grid point re-asks the questions
through a :class:`~runtime.recall.hybrid.Recaller` with the changed settings.
Over the persons alone, each fold chooses the point with the best mean of
``sess_any@10`` and ``sess_all@10`` on the other persons' pooled questions.
With ``--locomo FILE`` the LoCoMo dev conversations join the folds
(``tools/bench/locomo_recall.py`` runs them with the same grid): eight units,
each fold chooses on the other seven, pooling their questions (a RealMem
question counts the mean of its two figures, a LoCoMo question its
turn_any@10), and the JSON gets ``locomo_loo`` (LoCoMo's held-out figures) too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
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
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime.config import RecallSettings, load_settings  # noqa: E402
from runtime.llm.embedder import Embedder, make_embedder  # noqa: E402
from runtime.memories.transcript import MAX_TURN_CHARS, TurnIn  # noqa: E402
from runtime.memory import Memory  # noqa: E402
from runtime.recall.hybrid import Recaller  # noqa: E402
from runtime.recall.results import RecallResult  # noqa: E402
from runtime.store.fts import match_expression  # noqa: E402
from runtime.time.clock import ManualClock, household_zone  # noqa: E402

log = logging.getLogger("realmem_recall")

RETRIEVERS = ("reverie", "bm25", "dense", "rrf")
# with --query turn: reverie asked with the query text alone as well (the baseline)
ALONE = "reverie_alone"
CATEGORIES = ("Dynamic Incremental", "Implicit Preference", "Dynamic Updating",
              "Temporal-reasoning")
RRF_K = 60
DEPTH = 10
SECONDS_PER_TURN = 30.0
SESSION_GAP = 3600.0
CHANNEL = "chat"
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")

# --loo: alternative values per RecallSettings field (the configured value of
# each is put in front: grid point 0 is the configured settings)
GRID_AXES: dict[str, tuple[float | int, ...]] = {
    "context_query": (0.0, 0.5),
    "relative_floor": (0.3,),
}


class EmbedCache:
    """An embedder that remembers every text's vector, in memory and (``path``)
    on disk between runs."""

    def __init__(self, inner: Embedder, path: Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.path = path
        self._memo: dict[str, np.ndarray] = {}
        self._new = 0
        if path is not None and path.exists():
            with np.load(path) as data:
                self._memo = dict(zip(data["keys"].tolist(), data["vecs"]))
            log.info("embedding cache: %d vectors from %s", len(self._memo), path)

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._memo))
        if missing:
            by_key = dict(zip(keys, texts))
            vecs = np.asarray(self.inner.embed([by_key[k] for k in missing]), dtype=np.float32)
            self._memo.update(zip(missing, vecs))
            self._new += len(missing)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._memo[k] for k in keys])

    def save(self) -> None:
        if self.path is None or not self._new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self._memo)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=np.asarray(keys), vecs=np.stack([self._memo[k] for k in keys]))
        tmp.replace(self.path)
        self._new = 0


def cache_path(directory: Path | None, name: str, part: str) -> Path | None:
    """The cache file of one model for one person (or LoCoMo): runs over
    different persons may fill their caches side by side."""
    if directory is None:
        return None
    return directory / (re.sub(r"[^A-Za-z0-9.-]+", "_", f"{name}-{part}") + ".npz")


@dataclass
class Scores:
    any10: list[float] = field(default_factory=list)
    all10: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    cited: list[float] = field(default_factory=list)

    def add(self, sessions: list[str], evidence: set[str], elapsed_ms: float,
            cited: int = 0) -> None:
        top = set(sessions[:DEPTH])
        self.any10.append(float(bool(evidence & top)))
        self.all10.append(float(evidence <= top))
        self.latency_ms.append(elapsed_ms)
        self.cited.append(float(cited))

    def extend(self, other: Scores) -> None:
        for name in ("any10", "all10", "latency_ms", "cited"):
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> dict[str, float | int]:
        lat = np.asarray(self.latency_ms or [0.0])
        mean = statistics.fmean
        return {
            "sess_any@10": round(mean(self.any10 or [0.0]), 4),
            "sess_all@10": round(mean(self.all10 or [0.0]), 4),
            "n": len(self.any10),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "cited": round(mean(self.cited or [0.0]), 2),
        }


ByCat = dict[str, Scores]


def _new_by_cat() -> ByCat:
    return {c: Scores() for c in CATEGORIES}


def summary(by_cat: ByCat) -> dict[str, Any]:
    overall = Scores()
    for sc in by_cat.values():
        overall.extend(sc)
    return {**overall.summary(),
            "by_category": {c: by_cat[c].summary() for c in CATEGORIES}}


def pooled(parts: Sequence[ByCat]) -> ByCat:
    out = _new_by_cat()
    for part in parts:
        for c, sc in part.items():
            out[c].extend(sc)
    return out


class Baselines:
    """Plain retrievers over the turns in the store now (query text alone)."""

    def __init__(self, memory: Memory, embedder: Embedder) -> None:
        self.memory = memory
        self.embedder = embedder
        self.ids = np.zeros(0, dtype=np.int64)
        self.matrix = np.zeros((0, embedder.dim), dtype=np.float32)

    def refresh(self) -> None:
        rows = self.memory.store.rows(
            "SELECT item_id, vec FROM vectors WHERE kind = 'turn' AND item_id > ?"
            " ORDER BY item_id", (int(self.ids[-1]) if len(self.ids) else 0,))
        if rows:
            self.ids = np.concatenate([self.ids, [r["item_id"] for r in rows]])
            self.matrix = np.concatenate(
                [self.matrix, np.stack([np.frombuffer(r["vec"], dtype=np.float32)
                                        for r in rows])])

    def bm25(self, query: str) -> list[int]:
        expr = match_expression(query)
        if expr is None:
            return []
        return [r[0] for r in self.memory.store.conn.execute(
            "SELECT rowid FROM transcript_fts WHERE transcript_fts MATCH ?"
            " ORDER BY bm25(transcript_fts) LIMIT ?", (expr, DEPTH * 5))]

    def dense(self, query: str) -> list[int]:
        q = self.embedder.embed([query])[0]
        top = np.argsort(-(self.matrix @ q), kind="stable")[: DEPTH * 5]
        return [int(self.ids[i]) for i in top]

    def rrf(self, query: str) -> list[int]:
        fused: dict[int, float] = {}
        for ranking in (self.bm25(query), self.dense(query)):
            for rank, turn_id in enumerate(ranking):
                fused[turn_id] = fused.get(turn_id, 0.0) + 1.0 / (RRF_K + rank + 1)
        return sorted(fused, key=lambda t: (-fused[t], t))


@dataclass
class Query:
    category: str
    text: str
    evidence: set[str]
    now: float
    exclude: list[str]


def session_start(current_time: str, after: float) -> float:
    """A session's start: 09:00 of its date in the household zone, or an hour
    after ``after`` (the last turn before it) when that is later."""
    m = _DATE.match(current_time.strip())
    if m is None:
        return after + SESSION_GAP
    day = datetime.strptime(m.group(1), "%Y-%m-%d").replace(hour=9, tzinfo=household_zone())
    return max(day.timestamp(), after + SESSION_GAP)


def evidence_of(turns: list[dict[str, Any]], i: int, own: str) -> set[str]:
    nxt = turns[i + 1] if i + 1 < len(turns) else None
    if nxt is None or nxt.get("speaker") != "Assistant":
        return set()
    return {str(m["session_uuid"]) for m in nxt.get("memory_used") or []
            if m.get("session_uuid")} - {own}


def ask(recall: Callable[..., RecallResult], q: Query, mode: str) -> RecallResult:
    """Reverie's recall for a query: as turn-zero recall asks (``turn``), or the
    query text alone (``alone``)."""
    if mode == "alone":
        return recall(q.text, now=q.now)
    return recall(q.text, now=q.now, exclude=q.exclude)


def run_person(path: Path, embedder: Embedder, workdir: Path, mode: str,
               grid: Sequence[dict[str, Any]] = (),
               grid_scores: list[ByCat] | None = None) -> dict[str, ByCat]:
    data = json.loads(path.read_text())
    person = str(data["_metadata"]["person_name"])
    settings = load_settings(env={}, overrides={"store": {"data_dir": str(workdir / person)}})
    history_turns = settings.runtime.history_turns
    clock = ManualClock(0.0)
    memory = Memory(settings, clock=clock, embedder=embedder)
    from locomo_recall import passage_cut
    memory.indexer.cut = passage_cut(settings.recall, grid)
    baselines = Baselines(memory, embedder)
    plain: dict[str, Callable[[str], list[int]]] = {
        "bm25": baselines.bm25, "dense": baselines.dense, "rrf": baselines.rrf}
    scores = {name: _new_by_cat() for name in (*RETRIEVERS, ALONE)}
    # --loo: one recaller per grid point on the same store, asked at the same moments
    base = memory.settings.recall
    recallers = [Recaller(memory.store, memory.index, embedder, memory.kinds,
                          RecallSettings(**{**base.model_dump(), **point}), clock,
                          memory.recaller.zone) for point in grid]
    if grid_scores is not None:
        grid_scores.extend(_new_by_cat() for _ in grid)
    session_of: dict[int, str] = {}
    pending: list[tuple[TurnIn, str]] = []
    asked: list[Query] = []

    def flush() -> None:
        if pending:
            ids = memory.add_turns([t for t, _ in pending])
            session_of.update(zip(ids, (s for _, s in pending)))
            pending.clear()

    t0 = time.perf_counter()
    last = 0.0
    for session in data["dialogues"]:
        own = str(session["session_uuid"])
        start = session_start(str(session.get("current_time", "")), last)
        turns = session["dialogue_turns"]
        for i, turn in enumerate(turns):
            at = start + i * SECONDS_PER_TURN
            content = str(turn.get("content", ""))[:MAX_TURN_CHARS]
            if turn.get("is_query"):
                evidence = evidence_of(turns, i, own)
                if evidence:
                    flush()
                    clock.set(at)
                    recent = memory.transcript.recent(CHANNEL, history_turns)
                    q = Query(str(turn.get("category_name")), content, evidence, at,
                              [f"turn:{r['id']}" for r in recent])
                    asked.append(q)
                    _score(memory.recall, q, mode, session_of, scores["reverie"])
                    if mode != "alone":
                        _score(memory.recall, q, "alone", session_of, scores[ALONE])
                    for g, recaller in enumerate(recallers):
                        if grid_scores is not None:
                            _score(recaller.recall, q, mode, session_of, grid_scores[g])
                    baselines.refresh()
                    for name, fn in plain.items():
                        t1 = time.perf_counter()
                        ids = fn(q.text)
                        elapsed = (time.perf_counter() - t1) * 1000
                        scores[name][q.category].add(_sessions(ids, session_of), q.evidence,
                                                     elapsed)
            if content.strip():
                user = turn.get("speaker") != "Assistant"
                pending.append((TurnIn(
                    channel=CHANNEL, source="user" if user else "assistant",
                    role="user" if user else "assistant", content=content,
                    created_at=at), own))
            last = at
    flush()
    log.info("%s: %d turns, %d queries in %.1f s", person, len(session_of), len(asked),
             time.perf_counter() - t0)
    memory.close()
    return scores


def _sessions(ids: Sequence[int], session_of: dict[int, str]) -> list[str]:
    out: list[str] = []
    for turn_id in ids[:DEPTH]:
        if turn_id in session_of:
            out.append(session_of[turn_id])
    return out


def _score(recall: Callable[..., RecallResult], q: Query, mode: str,
           session_of: dict[int, str], into: ByCat) -> None:
    result = ask(recall, q, mode)
    cited = result.cited_turns()
    into[q.category].add(_sessions(cited, session_of), q.evidence, result.elapsed_ms,
                         len(cited))


def grid_points(base: RecallSettings,
                axes_in: dict[str, Sequence[Any]] | None = None,
                points: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Every combination of the axes (the configured value of each first; a
    value may be a table, e.g. ``long_store``'s), then ``points`` as given
    (the configured settings first when there are no axes)."""
    def distinct(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple({json.dumps(v, sort_keys=True): v for v in values}.values())

    axes = {name: distinct((getattr(base, name), *values))
            for name, values in (GRID_AXES if axes_in is None else axes_in).items()}
    grid = ([dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
            if axes_in or not points else [{}])
    seen = {json.dumps(p, sort_keys=True) for p in grid}
    for point in points:
        if json.dumps(point, sort_keys=True) not in seen:
            grid.append(dict(point))
            seen.add(json.dumps(point, sort_keys=True))
    return grid


def _realmem_values(by_cat: ByCat) -> list[float]:
    """A RealMem question's objective: the mean of its sess_any@10 and sess_all@10."""
    return [(a + b) / 2 for sc in by_cat.values() for a, b in zip(sc.any10, sc.all10)]


def _locomo_values(by_cat: dict[Any, Any]) -> list[float]:
    """A LoCoMo question's objective: its turn_any@10."""
    return [v for sc in by_cat.values() for v in sc.any10]


def leave_one_out(grid: Sequence[dict[str, Any]], realmem: dict[str, list[ByCat]],
                  locomo: dict[str, list[dict[Any, Any]]],
                  weigh: str = "questions") -> dict[str, Any]:
    """Each unit (a person; a LoCoMo conversation) held out in turn: the grid
    point with the best mean objective over the other units' pooled questions
    (ties: the lower index) is scored on it. The held-out questions are pooled
    per data set. ``weigh`` "datasets": the objective is the mean of each data
    set's pooled mean (LoCoMo's 759 questions weigh as much as RealMem's 388)."""
    values: dict[str, list[list[float]]] = {
        **{u: [_realmem_values(p) for p in pts] for u, pts in realmem.items()},
        **{u: [_locomo_values(p) for p in pts] for u, pts in locomo.items()}}
    chosen: list[dict[str, Any]] = []
    held_realmem: list[ByCat] = []
    held_locomo: list[dict[Any, Any]] = []
    for out in values:
        train = [u for u in values if u != out]

        def objective(g: int, units: Sequence[str] = train) -> float:
            if weigh == "datasets":
                means = [statistics.fmean(pool) for pool in (
                    [v for u in units if u in part for v in values[u][g]]
                    for part in (realmem, locomo)) if pool]
                return statistics.fmean(means) if means else 0.0
            pool = [v for u in units for v in values[u][g]]
            return statistics.fmean(pool) if pool else 0.0

        best = max(range(len(grid)), key=lambda g: (objective(g), -g))
        if out in realmem:
            held_realmem.append(realmem[out][best])
        else:
            held_locomo.append(locomo[out][best])
        chosen.append({"held_out": out, "grid_index": best, "knobs": grid[best],
                       "train_objective": round(objective(best), 4),
                       "held_out_objective": round(objective(best, [out]), 4)})
    everywhere = [statistics.fmean([v for u in values for v in values[u][g]] or [0.0])
                  for g in range(len(grid))]
    out_report: dict[str, Any] = {
        "units": list(values),
        "objective": "per question: RealMem mean of sess_any@10 and sess_all@10,"
                     " LoCoMo turn_any@10; pooled over the training units"
                     + (", each data set's mean weighing the same" if weigh == "datasets"
                        else ""),
        "grid": len(grid),
        "grid_axes": {name: sorted({p[name] for p in grid}) for name in grid[0]},
        "chosen": chosen,
        "reverie": summary(pooled(held_realmem)) if held_realmem else None,
        "configured": summary(pooled([pts[0] for pts in realmem.values()])),
        "in_sample_by_point": [
            {"grid_index": g, "knobs": grid[g], "objective": round(everywhere[g], 4),
             **{k: v for k, v in summary(pooled([pts[g] for pts in realmem.values()])).items()
                if k in ("sess_any@10", "sess_all@10", "cited")}}
            for g in range(len(grid))],
        "baselines": "no knobs: leave-one-out equals in-sample",
    }
    if held_locomo:
        from locomo_recall import _pooled as locomo_pooled
        from locomo_recall import _summary as locomo_summary
        out_report["locomo_reverie"] = locomo_summary(locomo_pooled(held_locomo))
        out_report["locomo_configured"] = locomo_summary(
            locomo_pooled([pts[0] for pts in locomo.values()]))
    return out_report


def run_locomo(path: Path, embedder: Embedder, workdir: Path,
               grid: Sequence[dict[str, Any]]) -> tuple[dict[str, list[dict[Any, Any]]],
                                                       dict[str, Any]]:
    """LoCoMo's dev conversations through tools/bench/locomo_recall.py with the
    same grid: per conversation the grid's scores, and every retriever's."""
    import locomo_recall

    per_conv: dict[str, list[dict[Any, Any]]] = {}
    totals = {name: {c: locomo_recall.Scores() for c in locomo_recall.CATEGORIES}
              for name in locomo_recall.RETRIEVERS}
    for conv in json.loads(path.read_text()):
        per_conv[conv["sample_id"]] = []
        for name, by_cat in locomo_recall.run_conversation(
                conv, embedder, workdir / "locomo", grid=grid,
                grid_scores=per_conv[conv["sample_id"]]).items():
            for c, sc in by_cat.items():
                totals[name][c].extend(sc)
    return per_conv, totals


def _raw(by_cat: dict[Any, Any]) -> dict[str, Any]:
    return {str(c): dataclasses.asdict(sc) for c, sc in by_cat.items()}


def combine(paths: Sequence[Path], totals: dict[str, ByCat],
            per_person: dict[str, dict[str, Any]], grid_by_person: dict[str, list[ByCat]],
            locomo_grid: dict[str, list[dict[Any, Any]]],
            locomo_totals: dict[str, dict[Any, Any]]) -> list[dict[str, Any]]:
    """Read --dump files into the run's figures (in place); return their grid.

    Dumps of one grid over different units join side by side. Dumps of other
    grids over the same units join as more points: the grid is every point any
    dump holds (the first dump's first: the configured settings), each point
    once, and every unit must have been run on every point. The baselines (no
    knobs) are taken from the first grid's dumps only."""
    import locomo_recall

    def realmem(raw: dict[str, Any]) -> ByCat:
        return {c: Scores(**raw[c]) for c in CATEGORIES}

    def locomo(raw: dict[str, Any]) -> dict[Any, Any]:
        return {int(c): locomo_recall.Scores(**v) for c, v in raw.items()}

    def key(point: dict[str, Any]) -> str:
        return json.dumps(point, sort_keys=True)

    first: str | None = None
    grid: dict[str, dict[str, Any]] = {}  # point key -> point, in order
    realmem_at: dict[str, dict[str, ByCat]] = {}  # unit -> point key -> figures
    locomo_at: dict[str, dict[str, dict[Any, Any]]] = {}
    for path in paths:
        dump = json.loads(path.read_text())
        points = [key(p) for p in dump["grid"]]
        first = first if first is not None else json.dumps(points)
        for k, point in zip(points, dump["grid"]):
            grid.setdefault(k, point)
        for u, pts in dump["realmem"].items():
            for k, r in zip(points, pts):
                realmem_at.setdefault(u, {}).setdefault(k, realmem(r))
        for u, pts in dump["locomo"].items():
            for k, r in zip(points, pts):
                locomo_at.setdefault(u, {}).setdefault(k, locomo(r))
        if json.dumps(points) != first:
            continue
        per_person.update(dump["persons"])
        for name, raw in dump["totals"].items():
            for c, sc in realmem(raw).items():
                totals[name][c].extend(sc)
        for name, raw in dump["locomo_totals"].items():
            got = locomo(raw)
            into = locomo_totals.setdefault(name, {c: locomo_recall.Scores() for c in got})
            for c, sc in got.items():
                into[c].extend(sc)
    for unit, at in [*realmem_at.items(), *locomo_at.items()]:
        lacking = [k for k in grid if k not in at]
        if lacking:
            raise SystemExit(f"{unit}: not run on {len(lacking)} of the {len(grid)} points"
                             f" (e.g. {lacking[0]})")
    grid_by_person.update({u: [at[k] for k in grid] for u, at in realmem_at.items()})
    locomo_grid.update({u: [at[k] for k in grid] for u, at in locomo_at.items()})
    return list(grid.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, nargs="+",
                        help="the realmem-dev directory or *_dialogues_256k.json files")
    parser.add_argument("--persons", help="comma-separated person names (default: all)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--workdir", type=Path, help="keep the stores here (default: temp)")
    parser.add_argument("--cache", type=Path, help="keep embeddings here between runs")
    parser.add_argument("--query", choices=("turn", "alone"), default="turn",
                        help="ask as turn-zero recall does, or with the query text alone")
    parser.add_argument("--loo", action="store_true",
                        help="also fit reverie's knobs over GRID_AXES leave-one-out")
    parser.add_argument("--grid-axes", type=json.loads,
                        help="with --loo: JSON {RecallSettings field: [alternative values]}")
    parser.add_argument("--points", type=json.loads, default=[],
                        help="with --loo: JSON [{RecallSettings field: value}, ...], grid"
                             " points beside the axes' (a point is the configured"
                             " settings changed as it says)")
    parser.add_argument("--locomo", type=Path,
                        help="with --loo: LoCoMo dev JSON; its conversations join the folds")
    parser.add_argument("--weigh", choices=("questions", "datasets"), default="questions",
                        help="with --loo and --locomo: pool every question (LoCoMo's weigh"
                             " 2:1), or weigh the two data sets' means the same")
    parser.add_argument("--dump", type=Path,
                        help="write every question's figures here (for --combine)")
    parser.add_argument("--combine", type=Path, nargs="+",
                        help="no run: report on these --dump files together (runs over"
                             " different persons side by side; runs of other grids over"
                             " the same units as more points)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    files: list[Path] = []
    for p in args.data:
        files.extend(sorted(p.glob("*_dialogues_256k.json")) if p.is_dir() else [p])
    if args.persons:
        wanted = {s.strip() for s in args.persons.split(",") if s.strip()}
        files = [f for f in files if f.name.removesuffix("_dialogues_256k.json") in wanted]
    settings = load_settings(env={})
    inner = make_embedder(settings.embedder)
    if args.grid_axes is not None:
        unknown = set(args.grid_axes) - set(RecallSettings.model_fields)
        if not isinstance(args.grid_axes, dict) or unknown:
            parser.error(f"--grid-axes: a JSON object of RecallSettings fields ({unknown})")
    for point in args.points:
        unknown = set(point) - set(RecallSettings.model_fields)
        if unknown:
            parser.error(f"--points: not RecallSettings fields: {unknown}")
    grid = grid_points(settings.recall, args.grid_axes, args.points) if args.loo else []
    grid_by_person: dict[str, list[ByCat]] = {}
    totals = {name: _new_by_cat() for name in (*RETRIEVERS, ALONE)}
    per_person: dict[str, dict[str, Any]] = {}
    locomo_grid: dict[str, list[dict[Any, Any]]] = {}
    locomo_totals: dict[str, dict[Any, Any]] = {}
    report: dict[str, Any] = {}
    started = time.perf_counter()
    if args.combine:
        grid = combine(args.combine, totals, per_person, grid_by_person, locomo_grid,
                       locomo_totals)
    else:
        with tempfile.TemporaryDirectory(prefix="realmem-") as tmp:
            workdir = args.workdir or Path(tmp)
            for f in files:
                person = f.name.removesuffix("_dialogues_256k.json")
                grid_by_person[person] = []
                embedder = EmbedCache(inner, cache_path(args.cache, inner.name, person))
                scores = run_person(f, embedder, workdir, args.query, grid,
                                    grid_by_person[person])
                embedder.save()
                per_person[person] = {name: summary(by_cat) for name, by_cat in scores.items()
                                      if name != ALONE or args.query != "alone"}
                for name, by_cat in scores.items():
                    for c, sc in by_cat.items():
                        totals[name][c].extend(sc)
            if args.loo and args.locomo:
                embedder = EmbedCache(inner, cache_path(args.cache, inner.name, "locomo"))
                locomo_grid, locomo_totals = run_locomo(args.locomo, embedder, workdir, grid)
                embedder.save()
    if args.dump:
        args.dump.write_text(json.dumps({
            "grid": grid, "query": args.query, "persons": per_person,
            "totals": {n: _raw(b) for n, b in totals.items()},
            "realmem": {u: [_raw(b) for b in pts] for u, pts in grid_by_person.items()},
            "locomo": {u: [_raw(b) for b in pts] for u, pts in locomo_grid.items()},
            "locomo_totals": {n: _raw(b) for n, b in locomo_totals.items()}}) + "\n")
    if locomo_totals:
        from locomo_recall import _summary as locomo_summary
        report["locomo"] = {n: locomo_summary(b) for n, b in locomo_totals.items()}
    log.info("bench took %.1f s", time.perf_counter() - started)
    report.update({name: summary(totals[name]) for name in RETRIEVERS})
    if args.query != "alone":
        report[ALONE] = summary(totals[ALONE])
    report["query"] = args.query
    report["persons"] = per_person
    if grid:
        report["loo"] = leave_one_out(grid, grid_by_person, locomo_grid, args.weigh)
    header = ["retriever", "sess_any@10", "sess_all@10", "n", "p50_ms", "cited"]
    print(" | ".join(header))
    for name in (*RETRIEVERS[1:], *([ALONE] if ALONE in report else []), RETRIEVERS[0]):
        print(" | ".join([name, *(str(report[name][h]) for h in header[1:])]))
        for c in CATEGORIES:
            cat = report[name]["by_category"][c]
            print(" | ".join([f"  {c}", *(str(cat[h]) for h in header[1:])]))
    for person, rows in per_person.items():
        print(person + ": " + ", ".join(
            f"{name} {rows[name]['sess_any@10']}/{rows[name]['sess_all@10']}"
            for name in RETRIEVERS))
    if grid:
        loo = report["loo"]
        print(f"leave-one-out over {len(loo['units'])} units, {loo['grid']} grid points")
        for fold in loo["chosen"]:
            print(f"  held out {fold['held_out']}: grid {fold['grid_index']} {fold['knobs']}"
                  f" train {fold['train_objective']} held-out {fold['held_out_objective']}")
        for point in loo["in_sample_by_point"]:
            print(f"  point {point['grid_index']} {point['knobs']}: objective"
                  f" {point['objective']}, RealMem {point['sess_any@10']}/"
                  f"{point['sess_all@10']} cited {point['cited']}")
        for label in ("configured", "reverie"):
            row = loo[label]
            if row is None or not row["n"]:  # no RealMem person in the run
                continue
            print(" | ".join([f"reverie {'LOO' if label == 'reverie' else label}",
                              *(str(row[h]) for h in header[1:])]))
            for c in CATEGORIES:
                print(" | ".join([f"  {c}", *(str(row["by_category"][c][h])
                                             for h in header[1:])]))
        if "locomo_reverie" in loo:
            for label in ("locomo_configured", "locomo_reverie"):
                row = loo[label]
                print(f"{label}: turn_any@10 {row['turn_any@10']} turn_all@10"
                      f" {row['turn_all@10']} n {row['n']}")
            print("LoCoMo baselines: " + ", ".join(
                f"{name} {report['locomo'][name]['turn_any@10']}"
                for name in ("bm25", "dense", "rrf", "reverie")))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
