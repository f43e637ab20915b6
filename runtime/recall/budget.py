"""The budget: which of recall's candidates go into the prompt, and as what
text (issue 25's parts among them).

Candidates are taken best first by their final score (relevance, recency or
decay weight, salience; an episode's and a fact's times their layer's
weight), down to ``recall.relative_floor`` of the best, until
``recall.max_items`` or ``recall.max_tokens``. With ``recall.diversity`` an
item from a conversation already in scores that share of the best less; with
``recall.diversity_similarity`` (MMR) one like an item already in, by cosine.
With ``recall.continuation_slots`` the conversation's continuation hits are
placed after (:meth:`Budget._continue`). A long turn is shown as its best
passage or its excerpt (``recall.excerpt_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import tzinfo
from typing import Any

import numpy as np

from runtime.config import RecallSettings
from runtime.memories import privacy
from runtime.recall import passages as passage_text
from runtime.recall.candidates import ID_CHUNK, Candidate, Key
from runtime.recall.excerpt import excerpt
from runtime.recall.rendering import render
from runtime.recall.results import RecallItem
from runtime.store.database import Store
from runtime.store.vector_index import KINDS, PASSAGE


def approx_tokens(text: str) -> int:
    """A token estimate for budgeting: about four characters per token."""
    return max(1, math.ceil(len(text) / 4))


class Budget:
    """One recall's budget, with the settings that recall runs with."""

    def __init__(self, settings: RecallSettings, store: Store, dim: int, zone: tzinfo) -> None:
        self.settings = settings
        self.store = store
        self.dim = dim
        self.zone = zone

    def final(self, cand: Candidate) -> float:
        """A candidate's score; an episode's and a fact's are multiplied by their
        layer's weight (``recall.weight_episodes``, ``recall.weight_facts``)."""
        s = self.settings
        score = (s.weight_relevance * cand.relevance + s.weight_recency * cand.weight
                 + s.weight_salience * cand.salience / 10.0 + cand.bonus)
        if cand.kind == "episode":
            return score * s.weight_episodes
        if cand.kind == "fact":
            return score * s.weight_facts
        return score

    def fill(self, cands: list[Candidate], max_items: int, max_tokens: int,
             query: str = "", follow: Sequence[Candidate] = ()) -> list[RecallItem]:
        """The best candidates within ``max_items`` and ``max_tokens``, each as
        the prompt shows it. ``follow``: the conversation's continuation hits,
        best first (:mod:`runtime.recall.continuation`), placed by
        :meth:`_continue`."""
        scored = sorted(((self.final(c), c) for c in cands),
                        key=lambda sc: (-sc[0], KINDS.index(sc[1].kind), sc[1].item_id))
        best = scored[0][0] if scored else 0.0
        scored = [sc for sc in scored if sc[0] >= self.settings.relative_floor * best]
        penalty = self.settings.diversity * best
        alike = self.settings.diversity_similarity * best
        items: list[RecallItem] = []
        taken: list[Candidate] = []  # items' candidates
        used = 0
        seared = 0
        n = len(scored)
        scores = np.array([sc for sc, _ in scored], dtype=np.float64)
        alive = np.ones(n, dtype=bool)
        covered = np.zeros(n, dtype=bool)  # from a conversation already chosen
        same = _Conversations([c for _, c in scored], self.settings.diversity_gap_s) \
            if penalty > 0 else None
        # MMR: each candidate's vector, and its highest cosine to a chosen item
        vecs = self._vectors([c for _, c in scored]) if alike > 0 else None
        nearest = np.zeros(n, dtype=np.float64)
        while len(items) < max_items and alive.any():
            value = scores
            if (penalty > 0 or alike > 0) and len(items) >= self.settings.diversity_after:
                # the best once those of a chosen conversation, and those like
                # what is chosen, are marked down
                value = scores - penalty * covered - alike * nearest
            pick = int(np.argmax(np.where(alive, value, -np.inf)))  # ties: the first
            alive[pick] = False
            score, cand = scored[pick]
            if vecs is not None:
                nearest = np.maximum(nearest, (vecs @ vecs[pick]).astype(np.float64))
            if cand.row.get("memory_level") == "seared":  # at most a couple at once
                if seared >= self.settings.max_seared:
                    continue
                seared += 1
            item = self._item(score, cand, query)
            if used + item.tokens > max_tokens:
                break
            used += item.tokens
            if same is not None:
                covered |= same.of(pick)
            items.append(item)
            taken.append(cand)
        for _ in range(self.settings.continuation_slots if follow else 0):
            self._continue(items, taken, [(self.final(c), c) for c in follow],
                           max_items, max_tokens, query)
        return items

    def _continue(self, items: list[RecallItem], taken: list[Candidate],
                  follow: list[tuple[float, Candidate]], max_items: int, max_tokens: int,
                  query: str) -> None:
        """The best continuation hit from a conversation ``items`` does not hold
        yet goes right after the best item (first when there is none); the last
        items give way to it when the budget is full."""
        if max_items < 1:
            return
        for score, cand in follow:
            if any(c is cand or self.near(cand, c) for c in taken):
                continue
            item = self._item(score, cand, query)
            if item.tokens > max_tokens:
                continue
            at = min(1, len(items))
            items.insert(at, item)
            taken.insert(at, cand)
            while len(items) > max_items or sum(i.tokens for i in items) > max_tokens:
                items.pop()
                taken.pop()
            return

    def _item(self, score: float, cand: Candidate, query: str) -> RecallItem:
        text = self._text(cand, query)
        return RecallItem(
            ref=f"{cand.kind}:{cand.item_id}", kind=cand.kind, item_id=cand.item_id,
            text=text, score=round(score, 6), relevance=round(cand.relevance, 6),
            channel=cand.row.get("channel"),
            created_at=float(cand.row.get("created_at") or cand.row.get("recorded_at") or 0),
            turns=cand.turns, tokens=approx_tokens(text), sensitive=bool(cand.row.get("sensitive")),
            person=privacy.row_person(cand.kind, cand.row))

    def _vectors(self, cands: list[Candidate]) -> np.ndarray:
        """The candidates' vectors, one row each (a long turn's: its best
        passage's; zeros for one without a vector), for MMR."""
        dim = self.dim
        out = np.zeros((len(cands), dim), dtype=np.float32)
        where: dict[Key, int] = {}  # (kind or PASSAGE, id) -> row
        for i, cand in enumerate(cands):
            where[(PASSAGE, cand.passage_id) if cand.passage is not None
                  else (cand.kind, cand.item_id)] = i
        by_kind: dict[str, list[int]] = {}
        for kind, item_id in where:
            by_kind.setdefault(kind, []).append(item_id)
        for kind, ids in by_kind.items():
            for start in range(0, len(ids), ID_CHUNK):
                chunk = ids[start:start + ID_CHUNK]
                marks = ",".join("?" * len(chunk))
                found = self.store.conn.execute(
                    f"SELECT id, vec FROM passages WHERE vec IS NOT NULL AND id IN ({marks})",
                    chunk) if kind == PASSAGE else self.store.conn.execute(
                    f"SELECT item_id, vec FROM vectors WHERE kind = ? AND item_id IN ({marks})",
                    [kind, *chunk])
                for item_id, blob in found:
                    out[where[(kind, item_id)]] = np.frombuffer(blob, dtype=np.float32)
        return out

    def _text(self, cand: Candidate, query: str) -> str:
        """A memory's text for the prompt; a long turn's its best passage
        (``recall.passages``) or an excerpt (``recall.excerpt_tokens``,
        :mod:`runtime.recall.excerpt`)."""
        n = self.settings.excerpt_tokens
        if cand.kind == "turn" and cand.passage is not None:  # a long turn's best passage
            content = str(cand.row["content"])
            start, stop = cand.passage
            body = content[start:stop]
            if n > 0 and approx_tokens(body) > n:
                body = excerpt(body, query, n)
            row = {**cand.row, "content": passage_text.shown(content, start, stop, body)}
            return render(cand.kind, row, self.zone)
        if cand.kind == "turn" and n > 0 and approx_tokens(str(cand.row["content"])) > n:
            row = {**cand.row, "content": excerpt(str(cand.row["content"]), query, n)}
            return render(cand.kind, row, self.zone)
        return render(cand.kind, cand.row, self.zone)

    def near(self, cand: Candidate, chosen: Candidate) -> bool:
        """Whether ``cand`` is from the same conversation as ``chosen``: both
        turns on one channel within ``recall.diversity_gap_s``, or citing one
        of the same turns."""
        if cand.kind == "turn" and chosen.kind == "turn":
            return (cand.row.get("channel") == chosen.row.get("channel")
                    and abs(float(cand.row.get("created_at") or 0)
                            - float(chosen.row.get("created_at") or 0))
                    <= self.settings.diversity_gap_s)
        return bool(set(cand.turns).intersection(chosen.turns))


class _Conversations:
    """Which candidates are of one conversation (:meth:`Budget.near`, for
    the budget's diversity term), as a mask over them at once: turns on one
    channel within ``gap_s`` of each other, or items citing one of the same
    turns."""

    def __init__(self, cands: list[Candidate], gap_s: float) -> None:
        self.cands = cands
        self.gap_s = gap_s
        codes: dict[Any, int] = {}
        self.turn = np.array([c.kind == "turn" for c in cands], dtype=bool)
        self.channel = np.array([codes.setdefault(c.row.get("channel"), len(codes))
                                 for c in cands], dtype=np.int64)
        self.at = np.array([float(c.row.get("created_at") or 0) for c in cands],
                           dtype=np.float64)
        self.others = [i for i, c in enumerate(cands) if c.kind != "turn"]

    def of(self, i: int) -> np.ndarray:
        """The candidates of candidate ``i``'s conversation."""
        chosen = self.cands[i]
        mask = np.zeros(len(self.cands), dtype=bool)
        rest: Sequence[int] = range(len(self.cands))
        if chosen.kind == "turn":
            mask = (self.turn & (self.channel == self.channel[i])
                    & (np.abs(self.at - self.at[i]) <= self.gap_s))
            rest = self.others  # a turn and an episode or fact: a turn cited by both
        cited = set(chosen.turns)
        for j in rest:
            if not mask[j] and cited.intersection(self.cands[j].turns):
                mask[j] = True
        return mask
