"""What recall ranks: a memory item found for a query (:class:`Candidate`),
keyed by its kind and id (:data:`Key`)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.store.database import Row

Key = tuple[str, int]

# Default salience of a raw transcript row (episodes carry their own, 1-10).
TURN_SALIENCE = 5
# Ids per "IN (...)" query, well within SQLite's limit on parameters.
ID_CHUNK = 5000


@dataclass
class Candidate:
    """A memory item found for a query, with what its score is made of."""

    kind: str
    item_id: int
    row: Row
    cosine: float = 0.0
    lexical: float = 0.0
    relevance: float = 0.0
    weight: float = 1.0
    salience: int = TURN_SALIENCE
    turns: tuple[int, ...] = ()
    bonus: float = 0.0  # an open thread, mood congruence (memories.threads, .mood)
    passage: tuple[int, int] | None = None  # a long turn's best passage (start, stop)
    passage_id: int = 0  # ... and its row
