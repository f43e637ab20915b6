"""Temporal recall: what a question says about time, and how recall uses it.

:func:`read` looks at a query for two things:

- a time it names ("What did Caroline do last week?", "... in May 2023?";
  :func:`runtime.time.expressions.find`, in the household's zone at recall's now);
- whether it asks for a time ("When did ...", "What year ...", "How long ago
  ...", "How long has ...").

Recall then (:mod:`runtime.recall.hybrid`, through :func:`pull_in` and :func:`bonus`):

- ranks memories dated in the named span first: their relevance gains
  :data:`SPAN_BONUS`. A memory told in the week after the span
  (:data:`TOLD_AFTER_S`) gains :data:`TOLD_AFTER_BONUS`: people recount last
  week's events this week ("I went camping last week"). Dates: a turn when it
  was said, an episode over its ``[started_at, ended_at]``, a fact from
  ``valid_from``.
- pulls in memories of the span that the vector and keyword stages missed: the
  :data:`PULL_IN` most similar to the query among at most :data:`PULL_SCAN`
  vectors of the span (and the week after), bounded whatever the span's size;
  they still face recall's similarity gate.
- for a question that asks for a time, a memory whose text anchors something
  in time ("yesterday", "last week", "in May", "2022", "three years") gains
  :data:`WHEN_BONUS`: the answer to "when" is in a memory that says when.

The weights were set on the LoCoMo dev split (docs/benchmarks.md, "Temporal
recall"): span bonuses of 0.3 and 0.5 gave the same figures, 0.15 fewer; the
"when" bonus moves about one question either way. Recall multiplies whatever
:func:`bonus` gives by ``recall.weight_temporal`` (2.0, chosen
leave-one-conversation-out: "LoCoMo quality (issue 13)"). Leaving the named time's
words out of the keyword query was tried and lost a few questions, so the
query goes to the keyword stage whole.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import tzinfo

import numpy as np

from runtime.store.database import Row, Store
from runtime.time.expressions import Span, find

log = logging.getLogger(__name__)

Key = tuple[str, int]

SPAN_BONUS = 0.3
TOLD_AFTER_BONUS = 0.15
TOLD_AFTER_S = 7 * 86400.0
WHEN_BONUS = 0.06
PULL_IN = 20
PULL_SCAN = 3000

_ASKS_WHEN = re.compile(
    r"^\s*(?:and |so |but )?(?:when\b|since when\b|until when\b|how long\b|what (?:time|date|day|"
    r"year|month|week|season)\b|which (?:time|date|day|year|month|week|season|weekend)\b"
    r"|in (?:what|which) (?:year|month|season|week)\b|on (?:what|which) (?:day|date)\b"
    r"|how many (?:days|weeks|months|years)\b)", re.IGNORECASE)

# words that anchor something in time alone, and the units that do after a
# count or a "last"/"this"/"next"
_TIME_WORDS = frozenset(
    "yesterday today tonight tomorrow ago recently since weekend weekends monday tuesday"
    " wednesday thursday friday saturday sunday january february march april june july"
    " august september october november december".split())
_UNITS = frozenset("day days week weeks month months year years summer winter spring fall"
                   " autumn morning afternoon evening night".split())
_QUALIFIERS = frozenset("last this next past previous coming other few couple a an one two"
                        " three four five six seven eight nine ten".split())
# "may" is a month only after these (else the verb), or before a day number
_BEFORE_MAY = frozenset("in of since last this next early late mid during until".split())
_WORD = re.compile(r"[a-z0-9]+")
_YEAR = re.compile(r"(?:1[89]|20)\d\d")


# kind -> (table, when it began, when it ended, what makes it recallable), the
# memory table aliased ``m``
_DATED = {
    "turn": ("transcript", "m.created_at", "m.created_at", "m.memory = 1 AND m.disabled = 0"),
    "episode": ("episodes", "coalesce(m.started_at, m.created_at)",
                "coalesce(m.ended_at, m.started_at, m.created_at)",
                "m.tombstoned_at IS NULL AND m.disabled = 0"),
    "fact": ("facts", "m.valid_from", "m.valid_from",
             "m.disabled = 0 AND (m.valid_to IS NULL OR m.valid_to > m.valid_from)"),
}


@dataclass(frozen=True)
class TimeHint:
    """What a query says about time: the span it names (or None) and whether
    it asks for a time."""

    span: Span | None
    asks_when: bool


def read(query: str, now: float, zone: tzinfo) -> TimeHint | None:
    """The query's time hint, or None when it neither names nor asks a time."""
    span = find(query, now, zone)
    asks = bool(_ASKS_WHEN.match(query))
    if span is None and not asks:
        return None
    return TimeHint(span=span, asks_when=asks)


def mentions_time(text: str) -> bool:
    """Whether ``text`` anchors something in time: a day or month word
    ("yesterday", "Saturday", "May"), "ago", a year, or a unit after a count or
    a "last"/"this"/"next" ("last week", "3 years", "this morning")."""
    words = _WORD.findall(text.lower())
    for before, word, after in zip(["", *words], words, [*words[1:], ""]):
        if word in _TIME_WORDS or (word in _UNITS and (before in _QUALIFIERS
                                                       or before.isdigit())):
            return True
        if word == "may" and (before in _BEFORE_MAY or after.isdigit()):
            return True
        if len(word) == 4 and _YEAR.fullmatch(word):
            return True
    return False


def dated(kind: str, row: Row) -> tuple[float, float]:
    """When a memory happened, as ``(first, last)`` epoch seconds."""
    if kind == "episode":
        first = row.get("started_at") or row["created_at"]
        return float(first), float(row.get("ended_at") or first)
    if kind == "fact":
        return float(row["valid_from"]), float(row["valid_from"])
    return float(row["created_at"]), float(row["created_at"])


def bonus(hint: TimeHint, kind: str, row: Row) -> float:
    """What ``hint`` adds to a memory's relevance (see the module docstring)."""
    add = 0.0
    if hint.span is not None:
        first, last = dated(kind, row)
        if first < hint.span.end and last >= hint.span.start:
            add += SPAN_BONUS
        elif hint.span.end <= first < hint.span.end + TOLD_AFTER_S:
            add += TOLD_AFTER_BONUS
    if hint.asks_when and mentions_time(_text(kind, row)):
        add += WHEN_BONUS
    return add


def _text(kind: str, row: Row) -> str:
    column = {"turn": "content", "episode": "gist", "fact": "value"}[kind]
    return str(row.get(column) or "")


def pull_in(store: Store, hint: TimeHint, qvec: np.ndarray,
            skip: Collection[Key]) -> dict[Key, float]:
    """The memories of the hint's span (and the week after) most similar to the
    query that are not in ``skip``, with their cosine: at most :data:`PULL_IN`,
    from at most :data:`PULL_SCAN` vectors."""
    if hint.span is None:
        return {}
    start, end = hint.span.start, hint.span.end + TOLD_AFTER_S
    keys: list[Key] = []
    blobs: list[bytes] = []
    for kind, (table, first, last, live) in _DATED.items():
        room = PULL_SCAN - len(keys)
        if room <= 0:
            break
        # the memory table first (CROSS JOIN keeps that order): the turns by
        # their time index, then each one's vector; SQLite would otherwise walk
        # every vector of the kind
        for item_id, blob in store.conn.execute(
            f"SELECT v.item_id, v.vec FROM {table} m CROSS JOIN vectors v"
            f" ON v.kind = ? AND v.item_id = m.id"
            f" WHERE {first} < ? AND {last} >= ? AND {live} LIMIT ?",
                (kind, end, start, room)):
            if (kind, int(item_id)) not in skip:
                keys.append((kind, int(item_id)))
                blobs.append(blob)
    if not keys:
        return {}
    matrix = np.stack([np.frombuffer(b, dtype=np.float32) for b in blobs])
    sims = matrix @ qvec
    top = np.argsort(-sims, kind="stable")[:PULL_IN]
    return {keys[i]: float(sims[i]) for i in top}
