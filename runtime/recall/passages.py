"""Long turns cut into overlapping passages (issue 25, ``recall.passages``).

all-MiniLM-L6-v2 reads 256 word pieces; the rest of a longer turn is never
embedded, and FTS5's bm25 ranks a long turn low for a word it holds once. A
turn longer than ``recall.passage_tokens`` is therefore also indexed as
passages of at most that length (about four characters a token), each
starting ``recall.passage_overlap`` tokens or less before the previous one
ends, cut between sentences (lines; words, when a sentence is longer than a
passage). The passages live in the ``passages`` table (migration 0021) with
their FTS5 index and their vectors; recall scores them, cites their turn and
injects the best one (:class:`runtime.recall.hybrid.Recaller`).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config import RecallSettings
from runtime.recall.excerpt import CHARS_PER_TOKEN, ELLIPSIS, _pieces


@dataclass(frozen=True)
class Cut:
    """How turns are cut: passages of at most ``tokens``, overlapping by at most
    ``overlap`` (both in approximate tokens)."""

    tokens: int
    overlap: int

    @property
    def limit(self) -> int:
        return max(1, self.tokens) * CHARS_PER_TOKEN

    def long(self, text: str) -> bool:
        """Whether ``text`` is cut into passages at all."""
        return len(text) > self.limit


def configured(settings: RecallSettings) -> Cut | None:
    """How the settings cut turns (None: ``recall.passages`` is off, and so is
    it in a store of long turns: ``recall.long_store``, runtime.recall.policy)."""
    on = settings.passages or (settings.long_store_share > 0
                               and bool(settings.long_store.get("passages")))
    return Cut(settings.passage_tokens, settings.passage_overlap) if on else None


def split(text: str, cut: Cut) -> list[tuple[int, int]]:
    """The passages of ``text`` as (start, stop) character offsets, in order;
    none when it fits in one."""
    limit = cut.limit
    if len(text) <= limit:
        return []
    overlap = min(max(0, cut.overlap) * CHARS_PER_TOKEN, limit // 2)
    starts: list[int] = []
    at = 0
    for piece in _pieces(text, limit):
        starts.append(at)
        at += len(piece)
    bounds = [*starts, at]  # piece i is text[bounds[i]:bounds[i + 1]]
    out: list[tuple[int, int]] = []
    first = 0
    n = len(starts)
    while first < n:
        last = first + 1  # pieces first..last-1; one piece always fits (_pieces)
        while last < n and bounds[last + 1] - bounds[first] <= limit:
            last += 1
        out.append((bounds[first], bounds[last]))
        if last >= n:
            break
        # the next passage starts at the earliest piece that ends this one's
        # last `overlap` characters, and always after this one's start
        nxt = last
        while nxt - 1 > first and bounds[last] - bounds[nxt - 1] <= overlap:
            nxt -= 1
        first = nxt
    return out


def shown(text: str, start: int, stop: int, body: str | None = None) -> str:
    """A passage of ``text`` as injected: its text (``body``: what is shown of
    it, e.g. its excerpt), with ``…`` where the turn goes on."""
    body = (text[start:stop] if body is None else body).strip()
    lead = start > 0 and not body.startswith(ELLIPSIS)
    tail = stop < len(text.rstrip()) and not body.endswith(ELLIPSIS)
    return (ELLIPSIS + " " if lead else "") + body + (" " + ELLIPSIS if tail else "")
