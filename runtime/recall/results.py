"""What a recall answers: the memories it chose (:class:`RecallItem`) and the
result (:class:`RecallResult`). Kept apart from the ranking
(:mod:`runtime.recall.hybrid`) so that what carries them (the actors'
messages, the ``reverie`` command) does not import the ranking's libraries."""

from __future__ import annotations

from dataclasses import dataclass, field

# Turns an episode or a fact contributes, best first, before the next items'
# (RecallResult.cited_turns); the rest follow after every item's first ones.
TURNS_PER_ITEM_FIRST = 3


@dataclass(frozen=True)
class RecallItem:
    ref: str
    kind: str
    item_id: int
    text: str
    score: float
    relevance: float
    channel: str | None
    created_at: float
    turns: tuple[int, ...]
    tokens: int
    sensitive: bool = False  # runtime.memories.privacy: who may be given it
    person: str | None = None  # whose memory it is (None: the household's)


@dataclass
class RecallResult:
    query: str
    items: list[RecallItem] = field(default_factory=list)
    degraded: bool = False
    reason: str | None = None
    elapsed_ms: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    @property
    def refs(self) -> list[str]:
        return [i.ref for i in self.items]

    def cited_turns(self, first_pass: int | None = None) -> list[int]:
        """Transcript rows cited by the items, without repeats.

        An item's turns come best first (an episode's or a fact's cited turns
        are ordered by their own relevance to the query). In a first pass each
        item, in rank order, gives at most ``first_pass`` turns (default
        :data:`TURNS_PER_ITEM_FIRST`); the rest follow in a second pass, so
        one broad episode citing dozens of turns cannot push every other
        memory's evidence out of the first ten."""
        cap = TURNS_PER_ITEM_FIRST if first_pass is None else first_pass
        seen: dict[int, None] = {}
        for item in self.items:
            for t in item.turns[:cap]:
                seen.setdefault(t, None)
        for item in self.items:
            for t in item.turns[cap:]:
                seen.setdefault(t, None)
        return list(seen)
