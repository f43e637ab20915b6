"""Hybrid recall: vector neighbours beside FTS5 keywords, reranked.

Candidates come from the hnswlib indexes (per memory kind) and from FTS5 over
the transcript, episodes and facts (plus, with ``recall.keyword_feedback``, a
second FTS5 search for the words the best keyword hits share). Each
candidate's relevance blends its cosine similarity to the query with its
normalised keyword score; a turn also borrows part of its neighbours'
similarity and keyword score (conversation context). A candidate
must clear an absolute relevance gate, then the final score (relevance,
recency/decay weight, salience; for episodes, an open thread's bonus and the
mood's congruence bonus) must reach a fraction of the best one: weak
candidates are dropped, never used as padding, and an unrelated query gets
nothing. The result respects a budget of items and tokens. If the vector path
fails, recall degrades to a deterministic keyword-only top-N.

With ``recall.passages``, a long turn is also found and scored by its
passages (:mod:`runtime.recall.passages`): its similarity is its best
passage's when that is higher than its own vector's, its keyword score its
best passage's when higher, and it is injected as its best passage. With
``recall.diversity_similarity`` (MMR), while the budget is filled a candidate
scores less the more it resembles (cosine) an item already chosen. Each
recall first lets :mod:`runtime.recall.policy` choose its settings: in a
store of long turns, ``recall.long_store``'s values replace the configured.

The budget (:mod:`runtime.recall.budget`) takes the candidates in; each memory
is rendered as one line of text for the prompt (:mod:`runtime.recall.rendering`),
with its dates in the household's time zone.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any, cast

import apsw
import numpy as np

from runtime.config import RecallSettings
from runtime.llm.embedder import Embedder
from runtime.memories import privacy
from runtime.memories.decay import episode_weight, fact_weight, recency_weight
from runtime.memories.mood import MoodService, congruence_bonus
from runtime.memories.mood import current as current_mood
from runtime.memories.refs import turn_ids
from runtime.memories.threads import recall_bonus as thread_bonus
from runtime.recall import temporal as temporal_recall
from runtime.recall.budget import Budget
from runtime.recall.candidates import ID_CHUNK, Candidate, Key
from runtime.recall.continuation import continuation_hits
from runtime.recall.indexing import document
from runtime.recall.policy import StorePolicy
from runtime.recall.results import RecallResult
from runtime.store.database import Row, Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.fts import MAX_QUERY_CHARS, TermCounts, match_expression, query_terms
from runtime.store.vector_index import KINDS, PASSAGE, VectorIndex
from runtime.time.clock import Clock, household_zone

log = logging.getLogger(__name__)


# (kind, FTS table, content table, what makes a row recallable)
_FTS_SOURCES = (
    ("turn", "transcript_fts", "transcript", "transcript.memory = 1 AND transcript.disabled = 0"),
    ("episode", "episodes_fts", "episodes",
     "episodes.tombstoned_at IS NULL AND episodes.disabled = 0"),
    # a claim that lost a contradiction has an empty window: never in force, never recalled
    ("fact", "facts_fts", "facts",
     "facts.disabled = 0 AND (facts.valid_to IS NULL OR facts.valid_to > facts.valid_from)"),
)
_RECALLABLE = {kind: where for kind, _, _, where in _FTS_SOURCES}

# Share of a neighbouring turn's relevance a turn borrows.
NEIGHBOUR_SHARE = 0.5
# Keyword hits ranked per memory kind before muted/dead rows are dropped.
LEXICAL_OVERFETCH = 3
# Pseudo-relevance feedback (recall.keyword_feedback): the words shared by the
# best keyword hits among the turns (at most this many turns and this many
# words) are searched for, and at most this many turns are kept of what they find.
FEEDBACK_TURNS = 3
FEEDBACK_TERMS = 8
FEEDBACK_HITS = 15
# A word found in more than this share of the turns (and in more than
# FEEDBACK_MIN_TURNS of them) is not searched for in feedback: it says little
# (bm25 weighs it low), and ranking every turn it is in is what a big store's
# feedback search cost (a household's names and chat words: at 100k turns the
# keyword stage took 21.6 ms p50 with them, 13.3 without). A small store
# searches every word, as before.
FEEDBACK_MAX_SHARE = 0.01
FEEDBACK_MIN_TURNS = 50
# A query that knows the conversation (recall.context_query): each turn further
# back counts this much less than the one after it, in the query vector and
# the context's keywords; at most this many of its words are searched for.
CONTEXT_DECAY = 0.5
CONTEXT_TERMS = 12
# Raw turns age on the leaf time constant.
TURN_TAU_DAYS = 14.0
# Rows looked at on each side of a turn for its same-channel neighbours, per
# neighbour wanted (recall.context_turns).
NEIGHBOUR_REACH = 4
# Candidates with no stored vector yet embedded during a recall, at most (a bulk
# import's backlog, or a re-embedding, must not turn a recall into indexing).
EMBED_UNINDEXED = 16


@dataclass(frozen=True)
class _Said:
    """A recent turn of the conversation a query is part of (Recaller._conversation)."""

    text: str
    weight: float
    vec: np.ndarray | None


class Recaller:
    def __init__(
        self,
        store: Store,
        index: VectorIndex,
        embedder: Embedder,
        kinds: FactKinds,
        settings: RecallSettings,
        clock: Clock,
        zone: tzinfo | None = None,
    ) -> None:
        """``zone``: the household's time zone, in which memories' dates are shown
        (default: the system's zone)."""
        self.store = store
        self.index = index
        self.embedder = embedder
        self.kinds = kinds
        self.settings = settings  # as configured (tests may change it)
        self._on = settings  # this recall's: the configured, or chosen by the store's shape
        self.policy = StorePolicy(store)
        self.clock = clock
        self.zone = household_zone() if zone is None else zone
        # one thread for the keyword stage (its thread ends with this object)
        self._keywords = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recall-keywords")
        self._words: TermCounts | None = None  # the turns' word counts (feedback), once asked
        # most turns' neighbours were not right beside them last time (channels
        # interleave): read each turn's whole reach at once (_neighbours)
        self._wide = False

    # -- public -----------------------------------------------------------

    def recall(
        self,
        query: str,
        now: float | None = None,
        max_items: int | None = None,
        max_tokens: int | None = None,
        exclude: Iterable[str] = (),
        person: str | None = None,
        context: Iterable[str] | None = None,
    ) -> RecallResult:
        """Recall for ``query``. ``exclude``: refs left out before ranking (the
        turn being answered and the history already in the prompt). ``person``:
        scoped to that person's memories and the household's
        (:func:`runtime.memories.privacy.in_scope`). ``context``: refs of the
        conversation's recent turns, oldest first, which join the query with
        ``recall.context_query``'s weight (:meth:`_conversation`); default the
        turns among ``exclude`` (the turn path's exclude is the prompt's history:
        the conversation the query is part of)."""
        started = time.perf_counter()
        # the store's shape may choose other settings (recall.long_store)
        self._on = self.policy.choose(self.settings)
        now = self.clock.now() if now is None else now
        max_items = self._on.max_items if max_items is None else max_items
        max_tokens = self._on.max_tokens if max_tokens is None else max_tokens
        query = query[:MAX_QUERY_CHARS]
        result = RecallResult(query=query)
        exclude = list(exclude)
        if query.strip() and max_items > 0 and max_tokens > 0:
            convo = self._conversation(exclude if context is None else context, now)
            # the keyword stage runs beside the query embedding (SQLite and
            # onnxruntime both let go of the GIL), on this recall's connection
            # while this thread does not use it
            lexical = self._keywords.submit(self._lexical, query, convo)
            followed: list[Candidate] = []
            try:
                raw = self.embedder.embed([query])[0]
                qvec = self._blend(raw, convo)
                cands = self._hybrid(query, qvec, now, lexical.result(), set(exclude))
                if self._on.continuation_slots > 0:  # (the connection is this thread's again)
                    followed = self._continuation(raw, exclude, now, cands, qvec)
            except Exception as exc:  # the vector path failed: degrade, never raise
                log.warning("recall vector path failed, using keyword fallback: %s", exc)
                result.degraded, result.reason = True, f"{type(exc).__name__}: {exc}"
                cands = self._fallback(lexical.result(), now)  # the keywords, found once
                max_items = min(max_items, self._on.fallback_items)
            skip = set(exclude)

            def allowed(c: Candidate) -> bool:
                return (f"{c.kind}:{c.item_id}" not in skip
                        and privacy.recallable(c.kind, c.row)
                        and privacy.in_scope(person, privacy.row_person(c.kind, c.row)))

            budget = Budget(self._on, self.store, int(self.index.dim), self.zone)
            result.items = budget.fill([c for c in cands if allowed(c)], max_items, max_tokens,
                                       query, [c for c in followed if allowed(c)])
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        return result

    # -- the conversation ----------------------------------------------------

    def _conversation(self, refs: Iterable[str], now: float) -> list[_Said]:
        """The recent turns of the conversation (``refs``: turn refs, oldest
        first) that join the query: the last ``recall.context_query_turns`` of
        them said within ``recall.context_window_s`` before ``now``, latest
        first, each with its weight (``recall.context_query`` for the latest,
        each one before it :data:`CONTEXT_DECAY` times less) and its stored
        vector (None: not indexed yet). None when ``recall.context_query`` is 0."""
        s = self._on
        if s.context_query <= 0 or s.context_query_turns <= 0:
            return []
        ids = turn_ids(refs)
        ids = ids[-s.context_query_turns:]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.store.rows(
            f"SELECT id, content FROM transcript WHERE id IN ({marks})"
            " AND created_at >= ? AND disabled = 0", [*ids, now - s.context_window_s])
        vecs = dict(cast(list[tuple[int, bytes]], self.store.conn.execute(
            f"SELECT item_id, vec FROM vectors WHERE kind = 'turn' AND item_id IN ({marks})",
            ids).fetchall()))
        rows.sort(key=lambda r: -r["id"])
        return [_Said(str(row["content"]), s.context_query * CONTEXT_DECAY ** i,
                      np.frombuffer(vecs[row["id"]], dtype=np.float32)
                      if row["id"] in vecs else None)
                for i, row in enumerate(rows)]

    @staticmethod
    def _blend(qvec: np.ndarray, convo: list[_Said]) -> np.ndarray:
        """The query vector with the conversation's turn vectors blended in, each
        with its weight (the message keeps weight 1), normalised."""
        said = [(c.weight, c.vec) for c in convo if c.vec is not None]
        if not said:
            return qvec
        blended = np.asarray(qvec, dtype=np.float32).copy()
        for weight, vec in said:
            blended += weight * vec
        norm = float(np.linalg.norm(blended))
        return blended / norm if norm > 0 else qvec

    # -- candidate generation ---------------------------------------------

    def _dense(self, qvec: np.ndarray) -> tuple[dict[Key, float], float]:
        """The vector search's hits, and the similarity below which a turn it did
        not return must lie: its last turn hit's when it returned all it was asked
        for (the index is approximate: nearly always), else -inf (it returned
        every turn it holds)."""
        found: dict[Key, float] = {}
        labels_by_kind: dict[str, dict[int, float]] = {}
        turn_floor = -math.inf
        for kind in KINDS:
            labels, sims = self.index.search(kind, qvec, self._on.candidates)
            labels_by_kind[kind] = {int(lb): float(s) for lb, s in zip(labels, sims)}
            if kind == "turn" and len(sims) >= self._on.candidates:
                turn_floor = float(np.min(sims))
        for kind, sims_by_label in labels_by_kind.items():
            if not sims_by_label:
                continue
            marks = ",".join("?" for _ in sims_by_label)
            for label, item_id in self.store.conn.execute(
                f"SELECT id, item_id FROM vectors WHERE id IN ({marks})", list(sims_by_label)
            ):
                found[(kind, item_id)] = sims_by_label[label]
        return found, turn_floor

    def _lexical(self, query: str,
                 convo: list[_Said] | None = None) -> dict[Key, float]:
        expr = match_expression(query)
        found: dict[Key, float] = {}
        if convo:
            try:  # an extra: when it fails, the query's own keywords stand
                self._context_keywords(query, convo, found)
            except apsw.Error as exc:
                log.warning("conversation keywords skipped: %s", type(exc).__name__)
        if expr is None:
            return found
        k = self._on.candidates
        context_found, found = found, {}
        for kind, table, source, live in _FTS_SOURCES:
            # rank inside FTS5 first (over-fetching), then keep the recallable rows:
            # joining every match before ranking costs twice as much on big stores
            hits = list(self.store.conn.execute(
                f"SELECT f.rowid, f.score FROM (SELECT rowid, -bm25({table}) AS score"
                f" FROM {table} WHERE {table} MATCH ? ORDER BY bm25({table}) LIMIT ?) f"
                f" JOIN {source} ON {source}.id = f.rowid WHERE {live}"
                f" ORDER BY f.score DESC LIMIT ?", (expr, k * LEXICAL_OVERFETCH, k)))
            if not hits:
                continue
            best = max(score for _, score in hits) or 1.0
            for rowid, score in hits:
                found[(kind, int(rowid))] = max(0.0, float(score) / best)
        if self._on.passages:
            self._passage_keywords(expr, found)
        for key, score in context_found.items():
            found[key] = found.get(key, 0.0) + score
        if self._on.keyword_feedback > 0:
            try:  # an extra: when it fails, the keywords found stand
                self._feedback(query, found)
            except apsw.Error as exc:
                log.warning("keyword feedback skipped: %s", type(exc).__name__)
        return found

    def _passage_keywords(self, expr: str, found: dict[Key, float]) -> None:
        """The long turns' passages searched for the query's words: a passage
        scores its normalised bm25 (kept under its own key, ``(PASSAGE, id)``),
        and its turn the best of that and its own. ``found`` is filled in place."""
        k = self._on.candidates
        hits = list(self.store.conn.execute(
            "SELECT f.rowid, p.transcript_id, f.score FROM (SELECT rowid,"
            " -bm25(passages_fts) AS score FROM passages_fts WHERE passages_fts MATCH ?"
            " ORDER BY bm25(passages_fts) LIMIT ?) f JOIN passages p ON p.id = f.rowid"
            f" JOIN transcript ON transcript.id = p.transcript_id WHERE {_RECALLABLE['turn']}"
            " ORDER BY f.score DESC LIMIT ?", (expr, k * LEXICAL_OVERFETCH, k)))
        if not hits:
            return
        best = max(score for _, _, score in hits) or 1.0
        for passage, turn, score in hits:
            words = max(0.0, float(score) / best)
            found[(PASSAGE, int(passage))] = words
            found[("turn", int(turn))] = max(found.get(("turn", int(turn)), 0.0), words)

    def _passage_turns(self, qvec: np.ndarray) -> set[Key]:
        """The turns whose passages the passage index finds nearest the query."""
        labels, _ = self.index.search(PASSAGE, qvec, self._on.candidates)
        if len(labels) == 0:
            return set()
        ids = [int(lb) for lb in labels]
        return {("turn", int(r[0])) for r in self.store.conn.execute(
            f"SELECT DISTINCT transcript_id FROM passages WHERE id IN ({','.join('?' * len(ids))})",
            ids)}

    def _best_passages(self, cands: dict[Key, Candidate], qvec: np.ndarray,
                       words: dict[int, float]) -> dict[Key, tuple[float, tuple[int, int], int]]:
        """Each candidate turn's best passage (by similarity plus keyword score,
        as relevance weighs them): its similarity, its (start, stop) and its id."""
        ids = [key[1] for key in cands if key[0] == "turn"]
        out: dict[Key, tuple[float, tuple[int, int], int]] = {}
        for start in range(0, len(ids), ID_CHUNK):  # a turn's passages are in one chunk
            chunk = ids[start:start + ID_CHUNK]
            rows = cast(list[tuple[int, int, int, int, bytes]], self.store.conn.execute(
                "SELECT id, transcript_id, start, stop, vec FROM passages WHERE vec IS NOT NULL"
                f" AND transcript_id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
            if not rows:
                continue
            mat = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.float32)
            sims = mat.reshape(len(rows), -1) @ qvec
            value = sims + self._on.lexical_weight * np.fromiter(
                (words.get(r[0], 0.0) for r in rows), dtype=np.float32, count=len(rows))
            turns = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
            # each turn's best passage: by turn, best value first (earliest of equals)
            order = np.lexsort((np.arange(len(rows)), -value, turns))
            first = order[np.r_[True, turns[order][1:] != turns[order][:-1]]]
            for i in first.tolist():
                passage, turn, begin, stop, _ = rows[i]
                out[("turn", turn)] = (float(sims[i]), (begin, stop), passage)
        return out

    def _context_keywords(self, query: str, convo: list[_Said],
                          found: dict[Key, float]) -> None:
        """The conversation's words beyond the query's own (at most
        :data:`CONTEXT_TERMS`, by their turns' summed weights, leaving out
        words in more than :data:`FEEDBACK_MAX_SHARE` of the turns) are
        searched for among the turns; a turn found scores the context's
        weight (``recall.context_query``) times that search's normalised
        bm25. ``found`` is filled in place."""
        asked = set(query_terms(query))
        weights: dict[str, float] = {}
        for said in convo:  # latest first: ties keep its words first
            for term in query_terms(said.text):
                if term not in asked:
                    weights[term] = weights.get(term, 0.0) + said.weight
        if not weights:
            return
        if self._words is None:
            self._words = TermCounts(self.store.conn, "transcript_fts", "transcript")
        most = max(FEEDBACK_MIN_TURNS, FEEDBACK_MAX_SHARE * self._words.rows())
        docs = self._words.docs(weights)
        terms = sorted((t for t in weights if 0 < docs[t] <= most),
                       key=lambda t: -weights[t])[:CONTEXT_TERMS]
        expr = match_expression(" ".join(terms))
        if expr is None:
            return
        k = self._on.candidates
        hits = list(self.store.conn.execute(
            "SELECT f.rowid, f.score FROM (SELECT rowid, -bm25(transcript_fts) AS score"
            " FROM transcript_fts WHERE transcript_fts MATCH ? ORDER BY bm25(transcript_fts)"
            f" LIMIT ?) f JOIN transcript ON transcript.id = f.rowid WHERE {_RECALLABLE['turn']}"
            " ORDER BY f.score DESC LIMIT ?", (expr, k * LEXICAL_OVERFETCH, k)))
        if not hits:
            return
        best = max(score for _, score in hits) or 1.0
        share = self._on.context_query
        for rowid, score in hits:
            found[("turn", int(rowid))] = share * max(0.0, float(score) / best)

    def _feedback(self, query: str, found: dict[Key, float]) -> None:
        """Pseudo-relevance feedback: the words the best keyword hits among the
        turns share, beyond the query's own, are searched for too; a turn they
        find scores ``recall.keyword_feedback`` times that search's normalised
        bm25, unless its own score is higher. ``found`` is updated in place."""
        top = sorted((-score, item_id) for (kind, item_id), score in found.items()
                     if kind == "turn")[:FEEDBACK_TURNS]
        if not top:
            return
        ids = [item_id for _, item_id in top]
        content = dict(self.store.conn.execute(
            f"SELECT id, content FROM transcript WHERE id IN ({','.join('?' * len(ids))})", ids))
        asked = set(query_terms(query))
        counts: dict[str, int] = {}
        for item_id in ids:  # best hit first, so ties keep its words first
            for term in query_terms(str(content.get(item_id, ""))):
                if term not in asked:
                    counts[term] = counts.get(term, 0) + 1
        if self._words is None:
            self._words = TermCounts(self.store.conn, "transcript_fts", "transcript")
        most = max(FEEDBACK_MIN_TURNS, FEEDBACK_MAX_SHARE * self._words.rows())
        docs = self._words.docs(counts)
        terms = sorted((t for t in counts if docs[t] <= most),
                       key=lambda t: -counts[t])[:FEEDBACK_TERMS]
        expr = match_expression(" ".join(terms))
        if expr is None:
            return
        hits = list(self.store.conn.execute(
            "SELECT f.rowid, f.score FROM (SELECT rowid, -bm25(transcript_fts) AS score"
            " FROM transcript_fts WHERE transcript_fts MATCH ? ORDER BY bm25(transcript_fts)"
            f" LIMIT ?) f JOIN transcript ON transcript.id = f.rowid WHERE {_RECALLABLE['turn']}"
            " ORDER BY f.score DESC LIMIT ?",
            (expr, FEEDBACK_HITS * LEXICAL_OVERFETCH, FEEDBACK_HITS)))
        if not hits:
            return
        best = max(score for _, score in hits) or 1.0
        share = self._on.keyword_feedback
        for rowid, score in hits:
            key = ("turn", int(rowid))
            found[key] = max(found.get(key, 0.0), share * max(0.0, float(score) / best))

    def _load(self, keys: Iterable[Key], now: float) -> dict[Key, Candidate]:
        by_kind: dict[str, list[int]] = {}
        for kind, item_id in keys:
            by_kind.setdefault(kind, []).append(item_id)
        out: dict[Key, Candidate] = {}
        mood = current_mood(MoodService(self.store).latest(), now) if "episode" in by_kind \
            else None
        for kind, ids in by_kind.items():
            marks = ",".join("?" for _ in ids)
            if kind == "turn":
                for row in self.store.rows(
                        f"SELECT * FROM transcript WHERE id IN ({marks}) AND {_RECALLABLE['turn']}",
                        ids):
                    out[(kind, row["id"])] = Candidate(
                        kind, row["id"], row,
                        weight=recency_weight(row["created_at"], now, TURN_TAU_DAYS),
                        turns=(row["id"],))
            elif kind == "episode":
                rows = self.store.rows(
                    f"SELECT * FROM episodes WHERE id IN ({marks}) AND {_RECALLABLE['episode']}",
                    ids)
                cites = self._episode_citations([r["id"] for r in rows])
                for row in rows:
                    out[(kind, row["id"])] = Candidate(
                        kind, row["id"], row,
                        weight=episode_weight(row["level"], row["last_relevant_at"], now,
                                              memory_level=row["memory_level"]),
                        salience=row["salience"], turns=tuple(cites.get(row["id"], ())),
                        bonus=thread_bonus(row, self._on.weight_thread)
                        + congruence_bonus(mood, row["emotion"], self._on.weight_mood))
            else:
                for row in self.store.rows(
                        f"SELECT * FROM facts WHERE id IN ({marks}) AND {_RECALLABLE['fact']}",
                        ids):
                    if row["kind"] not in self.kinds:
                        continue
                    out[(kind, row["id"])] = Candidate(
                        kind, row["id"], row,
                        weight=fact_weight(self.kinds.policy(row["kind"]), row["confirmed_at"],
                                           now, row["valid_to"], row["memory_level"]),
                        salience=round(1 + 9 * row["confidence"]),
                        turns=_fact_turns(row["provenance"]))
        return out

    def _episode_citations(self, ids: list[int]) -> dict[int, list[int]]:
        if not ids:
            return {}
        marks = ",".join("?" for _ in ids)
        cites: dict[int, list[int]] = {}
        for episode_id, turn_id in self.store.conn.execute(
            f"SELECT episode_id, transcript_id FROM episode_citations"
            f" WHERE episode_id IN ({marks}) ORDER BY episode_id, transcript_id", ids
        ):
            cites.setdefault(episode_id, []).append(turn_id)
        return cites

    def _similarities(self, keys: Iterable[Key], qvec: np.ndarray) -> dict[Key, float]:
        """Cosine to the query of each stored vector among ``keys`` (vectors are
        L2-normalised): one read per kind and one matrix product, not a dot per row."""
        out: dict[Key, float] = {}
        by_kind: dict[str, list[int]] = {}
        for kind, item_id in keys:
            by_kind.setdefault(kind, []).append(item_id)
        for kind, ids in by_kind.items():
            for start in range(0, len(ids), ID_CHUNK):  # within SQLite's parameter limit
                chunk = ids[start:start + ID_CHUNK]
                rows = cast(list[tuple[int, bytes]], self.store.conn.execute(
                    f"SELECT item_id, vec FROM vectors WHERE kind = ?"
                    f" AND item_id IN ({','.join('?' * len(chunk))})", [kind, *chunk]).fetchall())
                if not rows:
                    continue
                mat = np.frombuffer(b"".join(blob for _, blob in rows), dtype=np.float32)
                sims = mat.reshape(len(rows), -1) @ qvec
                out.update(((kind, item_id), float(sim))
                           for (item_id, _), sim in zip(rows, sims))
        return out

    def _not_indexed_yet(self, keys: list[Key], cands: dict[Key, Candidate],
                         qvec: np.ndarray) -> dict[Key, float]:
        """Cosine to the query of candidates that have no stored vector yet (written a
        moment ago: the Recall actor indexes after the writer's notification, so a
        recall may come first), embedded now, at most :data:`EMBED_UNINDEXED` of
        them. Without it such a memory, found by its words, would score a cosine of
        0 and fall under the gate: recall would depend on the index catching up."""
        keys = keys[:EMBED_UNINDEXED]
        if not keys:
            return {}
        vecs = self.embedder.embed([document(kind, cands[(kind, item_id)].row)
                                    for kind, item_id in keys])
        return {key: float(vec @ qvec) for key, vec in zip(keys, vecs, strict=True)}

    def _neighbours(self, turn_rows: list[Row], span: int) -> dict[int, list[int]]:
        """Each turn's same-channel neighbours: up to ``span`` on each side, the
        nearest first, looked for among the ``NEIGHBOUR_REACH * span`` rows on
        each side. The rows right beside every turn are read first; only a turn
        that did not find ``span`` neighbours on a side there (another channel
        between, a row pruned, the store's edge) has its whole reach read; when
        most turns did not, the next recall reads every turn's reach at once."""
        reach = span * NEIGHBOUR_REACH
        first = reach if self._wide else span  # channels interleaved last time: read all
        channel_of = self._channels([row["id"] for row in turn_rows], first)
        found: dict[int, list[int]] = {}
        short: list[Row] = []
        apart = 0  # turns whose neighbours are not all right beside them
        for row in turn_rows:
            near = _same_channel(channel_of, row["id"], row["channel"], span, first)
            if near is None:
                short.append(row)
            else:
                found[row["id"]] = near
            if near is None or any(abs(i - row["id"]) > span for i in near):
                apart += 1
        self._wide = 2 * apart > len(turn_rows)
        if short:
            if first < reach:
                channel_of.update(self._channels([row["id"] for row in short], reach))
            for row in short:
                found[row["id"]] = _same_channel(channel_of, row["id"], row["channel"],
                                                 span, reach, whole=True) or []
        return found

    def _channels(self, turn_ids: list[int], half: int) -> dict[int, str]:
        """The channel of every row within ``half`` rowids of each of ``turn_ids``:
        merged rowid ranges (cheap), the channel compared in Python (asking SQLite
        for "channel = ? AND id BETWEEN" walks the channel index instead)."""
        ranges: list[list[int]] = []
        for turn_id in sorted(turn_ids):
            if ranges and turn_id - half <= ranges[-1][1] + 1:
                ranges[-1][1] = turn_id + half
            else:
                ranges.append([turn_id - half, turn_id + half])
        channel_of: dict[int, str] = {}
        for start in range(0, len(ranges), ID_CHUNK // 2):  # two parameters a range
            chunk = ranges[start:start + ID_CHUNK // 2]
            channel_of.update(self.store.conn.execute(
                "SELECT id, channel FROM transcript WHERE "
                + " OR ".join("id BETWEEN ? AND ?" for _ in chunk),
                [bound for pair in chunk for bound in pair]))
        return channel_of

    def _neighbour_cosines(self, cands: dict[Key, Candidate], qvec: np.ndarray,
                           lexical: dict[Key, float] | None = None,
                           known: dict[Key, float] | None = None,
                           floor: float = math.inf) -> None:
        """Let each turn borrow part of its best neighbour's similarity, and
        (``recall.neighbour_keywords``) part of its best neighbour's keyword score
        above its own: the words of a question often sit in the turn before its
        answer. ``lexical``: the keyword stage's scores, candidates or not;
        ``known``: similarities already computed (the vector search's hits);
        ``floor``: the similarity below which every turn not in ``known`` lies
        (``_dense``; inf: nothing known of the others)."""
        turn_rows = [c.row for c in cands.values() if c.kind == "turn"]
        if not turn_rows or NEIGHBOUR_SHARE <= 0 or self._on.context_turns <= 0:
            return
        neighbour_ids = self._neighbours(turn_rows, self._on.context_turns)
        # similarities known already: the vector search's hits, the candidates
        sims = {key[1]: sim for key, sim in (known or {}).items() if key[0] == "turn"}
        sims.update((row["id"], cands[("turn", row["id"])].cosine) for row in turn_rows)
        # A neighbour the vector search did not return lies below its last hit
        # (floor): it can lend only to a turn below that too, so only those
        # turns' other neighbours are read (most candidates lend to none).
        wanted = {("turn", i) for row in turn_rows
                  if cands[("turn", row["id"])].cosine < floor
                  for i in neighbour_ids[row["id"]] if i not in sims}
        sims.update((key[1], sim) for key, sim in self._similarities(wanted, qvec).items())
        for row in turn_rows:
            near = [sims[i] for i in neighbour_ids[row["id"]] if i in sims]
            if near:
                cand = cands[("turn", row["id"])]
                cand.relevance += NEIGHBOUR_SHARE * max(0.0, max(near) - cand.cosine)
        share = self._on.neighbour_keywords
        if share > 0 and lexical:
            for row in turn_rows:
                words = max((lexical.get(("turn", i), 0.0) for i in neighbour_ids[row["id"]]),
                            default=0.0)
                cand = cands[("turn", row["id"])]
                cand.relevance += share * max(0.0, words - cand.lexical)

    def _hybrid(self, query: str, qvec: np.ndarray, now: float,
                lexical: dict[Key, float], exclude: set[str]) -> list[Candidate]:
        lexical, words = _without_passages(lexical)
        dense, floor = self._dense(qvec)
        extra = self._passage_turns(qvec) if self._on.passages else set()
        when = (temporal_recall.read(query, now, self.zone)  # a time named or asked for
                if self._on.temporal else None)
        if when is not None:
            dense.update(temporal_recall.pull_in(self.store, when, qvec, dense.keys() | lexical))
        cands = self._load(set(dense) | set(lexical) | extra, now)
        missing = [k for k in cands if k not in dense]
        dense.update(self._similarities(missing, qvec))
        dense.update(self._not_indexed_yet([k for k in missing if k not in dense
                                            and f"{k[0]}:{k[1]}" not in exclude], cands, qvec))
        passages = self._best_passages(cands, qvec, words) if self._on.passages else {}
        gate = self._on.min_cosine
        named = set(query_terms(query))
        kept: dict[Key, Candidate] = {}
        for key, cand in cands.items():
            cand.cosine = dense.get(key, 0.0)
            if key in passages:
                sim, cand.passage, cand.passage_id = passages[key]
                cand.cosine = max(cand.cosine, sim)
            cand.lexical = lexical.get(key, 0.0)
            lexical_gate = cand.lexical > 0 and cand.cosine >= gate - 0.1
            if cand.cosine < gate and not lexical_gate:
                continue
            cand.relevance = cand.cosine + self._on.lexical_weight * cand.lexical
            speaker = cand.row.get("speaker") if cand.kind == "turn" else None
            if speaker and named.intersection(query_terms(speaker)):
                cand.relevance += self._on.speaker_bonus
            if when is not None:
                cand.relevance += (self._on.weight_temporal
                                   * temporal_recall.bonus(when, cand.kind, cand.row))
            kept[key] = cand
        self._neighbour_cosines(kept, qvec, lexical, dense, floor)
        self._order_cited_turns(kept, qvec)
        return list(kept.values())

    def _continuation(self, raw: np.ndarray, exclude: list[str], now: float,
                      cands: list[Candidate], qvec: np.ndarray) -> list[Candidate]:
        """The continuation hits (:mod:`runtime.recall.continuation`) as
        candidates, best first: a candidate already found is that one; one not
        found by the message is loaded with its cosine to it as its relevance
        (it stays out of the ranking: :meth:`Budget._continue` alone places it). A
        failure here costs the continuation only, never the recall."""
        try:
            follow = [("turn", t) for t in continuation_hits(
                self.store, self.index, raw, exclude, now, self._on.diversity_gap_s)]
        except Exception as exc:  # the recall goes on without it
            log.warning("recall continuation failed, recalled without it: %s",
                        type(exc).__name__)
            return []
        if not follow:
            return []
        found = {(c.kind, c.item_id): c for c in cands}
        loaded = self._load([k for k in follow if k not in found], now)
        for key, sim in self._similarities(loaded, qvec).items():
            loaded[key].cosine = loaded[key].relevance = sim
        return [found.get(k) or loaded[k] for k in follow if k in found or k in loaded]

    def _order_cited_turns(self, cands: dict[Key, Candidate], qvec: np.ndarray) -> None:
        """Order each episode's and fact's cited turns by their own similarity to
        the query, best first; turns with no vector (pruned, or never memory)
        keep their order after the others."""
        wanted = sorted({t for c in cands.values() if c.kind != "turn" and len(c.turns) > 1
                         for t in c.turns})
        if not wanted:
            return
        sims = {key[1]: sim for key, sim in
                self._similarities([("turn", t) for t in wanted], qvec).items()}
        for cand in cands.values():
            if cand.kind != "turn" and len(cand.turns) > 1:
                cand.turns = tuple(sorted(cand.turns, key=lambda t: -sims.get(t, -2.0)))

    def _fallback(self, lexical: dict[Key, float], now: float) -> list[Candidate]:
        lexical, _ = _without_passages(lexical)
        cands = self._load(lexical, now)
        for key, cand in cands.items():
            cand.lexical = lexical[key]
            cand.relevance = cand.lexical
        return list(cands.values())

    # -- ranking and budget -----------------------------------------------

def _without_passages(lexical: dict[Key, float]) -> tuple[dict[Key, float], dict[int, float]]:
    """The keyword stage's scores of memories, and of passages (by id) apart."""
    return ({key: v for key, v in lexical.items() if key[0] != PASSAGE},
            {key[1]: v for key, v in lexical.items() if key[0] == PASSAGE})


def _same_channel(channel_of: dict[int, str], me: int, channel: str, span: int,
                  reach: int, whole: bool = False) -> list[int] | None:
    """Up to ``span`` rows of ``channel`` on each side of row ``me`` within
    ``reach`` rows, the nearest first (before, then after). ``channel_of`` must
    hold every row within ``reach`` of ``me`` (rows it lacks are gone). Unless
    ``whole``, None when a side has fewer than ``span``: the caller reads farther."""
    sides: list[int] = []
    for step in (-1, 1):
        got = 0
        for i in range(me + step, me + step * (reach + 1), step):
            if channel_of.get(i) == channel:
                sides.append(i)
                got += 1
                if got == span:
                    break
        if got < span and not whole:
            return None
    return sides


def _fact_turns(provenance: str) -> tuple[int, ...]:
    try:
        refs: Any = json.loads(provenance or "[]")
    except ValueError:
        return ()
    out = []
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, str) and ref.startswith("turn:") and ref[5:].isdigit():
            out.append(int(ref[5:]))
    return tuple(out)
