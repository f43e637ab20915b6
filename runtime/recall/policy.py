"""Recall settings chosen by the shape of the store (issue 25, ``recall.long_store``).

LoCoMo's people chat in short turns, and its recall is tuned for that; an
assistant that answers in paragraphs (RealMemBench) wants other settings
(excerpts, a budget that covers more conversations). Which kind of store this
is, the runtime can tell honestly at query time from the store itself: the
share of its recent recallable turns longer than the embedder reads
(``recall.long_turn_tokens``, about four characters a token). When that share
is at least ``recall.long_store_share`` (0: never), recall uses the values in
``recall.long_store`` in place of the configured ones.

The share is counted over the last ``recall.long_store_window`` turns, again
only once :data:`REFRESH_TURNS` more have been written (a recall reads the
newest turn id, an index lookup), and never on fewer than :data:`MIN_TURNS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config import RecallSettings
from runtime.recall.excerpt import CHARS_PER_TOKEN
from runtime.store.database import Store

# The share is counted again once this many turns were written since.
REFRESH_TURNS = 25
# A store of fewer recallable turns than this is not judged (too few to tell).
MIN_TURNS = 20


@dataclass(frozen=True)
class Shape:
    """What the store's recent turns look like: how many were counted, and how
    many of them are long."""

    turns: int
    long: int

    @property
    def long_share(self) -> float:
        return self.long / self.turns if self.turns else 0.0


class StorePolicy:
    """Chooses a recall's settings from the store's shape (one per Recaller)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._shape: Shape | None = None
        self._key: tuple[int, int, int] | None = None  # (newest id, window, limit) counted
        self._long: tuple[RecallSettings, RecallSettings] | None = None  # (configured, long)

    def shape(self, window: int, tokens: int) -> Shape:
        """The last ``window`` recallable turns, and how many are longer than
        ``tokens`` (counted again after :data:`REFRESH_TURNS` more turns)."""
        newest = int(self.store.scalar("SELECT coalesce(max(id), 0) FROM transcript") or 0)
        limit = max(1, tokens) * CHARS_PER_TOKEN
        key = self._key
        if (self._shape is None or key is None or key[1:] != (window, limit)
                or newest - key[0] >= REFRESH_TURNS or newest < key[0]):
            row: tuple[int, int] = self.store.conn.execute(
                "SELECT count(*), coalesce(sum(length(content) > ?), 0) FROM (SELECT content"
                " FROM transcript WHERE memory = 1 AND disabled = 0 ORDER BY id DESC LIMIT ?)",
                (limit, window)).fetchone() or (0, 0)
            self._shape = Shape(int(row[0]), int(row[1]))
            self._key = (newest, window, limit)
        return self._shape

    def is_long(self, settings: RecallSettings) -> bool:
        """Whether the store is a store of long turns by ``settings``."""
        if settings.long_store_share <= 0 or not settings.long_store:
            return False
        shape = self.shape(settings.long_store_window, settings.long_turn_tokens)
        return shape.turns >= MIN_TURNS and shape.long_share >= settings.long_store_share

    def choose(self, settings: RecallSettings) -> RecallSettings:
        """The settings a recall uses now: ``settings``, or with
        ``recall.long_store``'s values in a store of long turns."""
        if not self.is_long(settings):
            return settings
        if self._long is None or self._long[0] is not settings:
            self._long = (settings, settings.model_copy(update=settings.long_store))
        return self._long[1]
