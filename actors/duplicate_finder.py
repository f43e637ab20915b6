"""The near-duplicate finder of the Episodes and Graph actors: they hold no
embedder, so they ask the Recall actor, which holds it and the vector index
(``NearestMemory`` -> ``NearestFound``). The policy (threshold, details,
logging, storing when Recall cannot answer) is
:class:`runtime.memories.duplicates.DuplicateCheck`'s."""

from __future__ import annotations

import logging

from actors.handles import RecallClient
from actors.messages import NearestMemory
from runtime.config import Settings
from runtime.memories.duplicates import DuplicateCheck, Kind, Nearest
from runtime.store.database import Store

log = logging.getLogger(__name__)


class RecallFinder:
    """:class:`runtime.memories.duplicates.DuplicateFinder` through the Recall actor."""

    def __init__(self, recall: RecallClient) -> None:
        self.recall = recall

    def nearest(self, kind: Kind, text: str, subject: str | None = None) -> Nearest | None:
        found = self.recall.nearest(NearestMemory(kind=kind, text=text, subject=subject))
        if found.item_id is None:
            return None
        return Nearest(found.item_id, found.similarity)


def duplicate_check(store: Store, recall: RecallClient, settings: Settings) -> DuplicateCheck:
    """The check an owner of episodes or facts applies to every write."""
    return DuplicateCheck(store, RecallFinder(recall), settings.memory.duplicate_similarity)
