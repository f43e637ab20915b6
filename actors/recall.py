"""The Recall actor: owns the ONNX embedding session, the vectors table and the
hnswlib indexes; answers recall (and, reading the store, finds and browses
memories for people), and embeds for the jobs that need vectors.

The model lives here, not in an actor of its own: recall is its main user (the
query embedding is on every turn's path), and a separate Embedder actor cost a
Ray worker (≈ 62 MiB PSS, ≈ 0.5 % of a core idle) and a call per recall and per
indexing batch (docs/benchmarks.md, "Fewer workers: the model moved into the
Recall actor")."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from actors import metrics
from actors.common import accept, bad_request, open_store, setup_logging
from actors.handles import NoSuchMemory
from actors.households import serving
from actors.messages import (
    Ack,
    BrowseMemories,
    DropFromIndex,
    Embed,
    Embedded,
    FindMemories,
    IndexSynced,
    MemoryMatch,
    MemoryMatches,
    MemoryPage,
    MemoryView,
    NearestFound,
    NearestMemory,
    Recall,
    Recalled,
    Request,
    SyncIndex,
    ViewMemory,
)
from runtime.config import Settings
from runtime.llm.embedder import Embedder, QueryCache, make_embedder
from runtime.memories.duplicates import IndexFinder
from runtime.memories.refs import find_matching, parse_ref
from runtime.recall import browse as browsing
from runtime.recall import passages
from runtime.recall.hybrid import Recaller
from runtime.recall.indexing import Indexer
from runtime.store.fact_kinds import FactKinds
from runtime.store.vector_index import KINDS, VectorIndex
from runtime.time.clock import household_zone

log = logging.getLogger(__name__)

SYNC_STEP = 32  # items indexed per notification before recall requests get a turn (one batch)
SAVE_EVERY = 5000  # vectors added between index saves (the database is the truth)


def load_model(settings: Settings) -> dict[str, Any]:
    """The embedding model, loaded once per Recall actor and shared by every
    household it serves (``actors/households.py``)."""
    embedder = make_embedder(settings.embedder)
    embedder.embed(["warm up"])  # export/load the model now, not on first use
    return {"embedder": embedder}


class HouseholdRecall:
    """The Recall actor's work for one household (``actors/households.py``):
    its store, vectors and index; the model is the actor's."""

    def __init__(self, settings: Settings, embedder: Embedder | None = None) -> None:
        setup_logging(settings, "recall")
        self.household = settings.household.id
        self.store = open_store(settings)
        self.embedder = embedder if embedder is not None else load_model(settings)["embedder"]
        # questions asked again skip the model, and so does indexing a gist the
        # near-duplicate check has just embedded (the jobs' Embed calls do not go here)
        cached = QueryCache(self.embedder)
        index_dir = settings.store.resolved_dir / "index"
        self.index = VectorIndex(self.store, index_dir, self.embedder.name, self.embedder.dim)
        self.indexer = Indexer(self.store, self.index, cached,
                               batch=settings.embedder.batch_size,
                               cut=passages.configured(settings.recall))
        self.recaller = Recaller(self.store, self.index, cached,
                                 FactKinds.load(settings.memory.fact_kinds_file),
                                 settings.recall, self.store.clock,
                                 zone=household_zone(settings.household.timezone))
        self.duplicates = IndexFinder(self.store, self.index, cached)
        self.indexer.drop_stale_models()
        self._unsaved = self.indexer.sync()  # catch up with rows written while down

    def embedder_info(self) -> tuple[str, int]:
        """The model's name and dimension (``actors.embedder.RemoteEmbedder``)."""
        return self.embedder.name, self.embedder.dim

    def embed(self, msg: Embed) -> Embedded:
        """Vectors for a job's texts (at most ``MAX_BATCH`` a call)."""
        msg = accept(Embed, msg)
        return Embedded.of(self.embedder.name, self.embedder.embed(msg.texts))

    def recall(self, msg: Recall) -> Recalled:
        msg = accept(Recall, msg)
        started = time.perf_counter()
        found = Recalled.of(self.recaller.recall(
            msg.query, now=msg.now, max_items=msg.max_items, max_tokens=msg.max_tokens,
            exclude=msg.exclude, person=msg.person))
        metrics.recall_latency((time.perf_counter() - started) * 1000)
        return found

    def sync(self, msg: SyncIndex | None = None) -> IndexSynced:
        msg = SyncIndex() if msg is None else accept(SyncIndex, msg)
        for ref in msg.refs:
            parsed = parse_ref(ref)
            self.indexer.recheck(parsed.kind, parsed.id)
        added = self.indexer.sync(limit=msg.limit)
        self._unsaved += added
        if self._unsaved >= SAVE_EVERY:
            self.save()
        return IndexSynced(added=added, counts={k: self.index.count(k) for k in KINDS})

    def pending(self, msg: object = None) -> int:
        """Memory items still waiting for a vector."""
        return self.indexer.pending_count()

    def clear(self, msg: object = None) -> Ack:
        """Drop every vector (re-embedding follows through sync)."""
        cleared = self.indexer.clear()
        self.index.save()
        return Ack(detail=f"{cleared} vectors dropped")

    def sync_some(self, msg: object = None) -> IndexSynced:
        """A writer's notification: index a bounded amount, then queue the rest
        behind whatever is waiting, so recall never waits for a whole backlog."""
        synced = self.sync(SyncIndex(limit=SYNC_STEP))
        if synced.added >= SYNC_STEP:
            ray.get_runtime_context().current_actor.sync_some.remote(
                Request(household=self.household))
        metrics.queue_depth("index_pending", self.pending())
        return synced

    def drop(self, msg: DropFromIndex) -> Ack:
        msg = accept(DropFromIndex, msg)
        self.indexer.drop(msg.kind, msg.item_id)
        return Ack()

    def find(self, msg: FindMemories) -> MemoryMatches:
        """Memories matching a text, for ``forget --matching`` (disabled ones too)."""
        msg = accept(FindMemories, msg)
        try:
            found = find_matching(self.store, msg.text, msg.limit)
        except ValueError as exc:
            raise bad_request(exc) from None
        return MemoryMatches(items=[
            MemoryMatch(ref=str(m.ref), text=m.text, created_at=m.created_at,
                        disabled=bool(m.disabled)) for m in found])

    def nearest(self, msg: NearestMemory) -> NearestFound:
        """The live memory nearest to a text, for the writers' near-duplicate
        check (``runtime.memories.duplicates``); rows written but not yet indexed are
        indexed first, so a duplicate written a moment ago is found."""
        msg = accept(NearestMemory, msg)
        self._unsaved += self.indexer.sync(kinds=(msg.kind,))  # not the turns' backlog
        found = self.duplicates.nearest(msg.kind, msg.text, msg.subject)
        if found is None:
            return NearestFound(item_id=None)
        return NearestFound(item_id=found.item_id, similarity=found.similarity)

    def browse(self, msg: BrowseMemories) -> MemoryPage:
        """A page of memories for people to look through (runtime.recall.browse)."""
        msg = accept(BrowseMemories, msg)
        try:
            views, total = browsing.browse(self.store, msg)
        except ValueError as exc:
            raise bad_request(exc) from None
        return MemoryPage(items=[_view(v) for v in views], total=total)

    def view(self, msg: ViewMemory) -> MemoryView:
        """One memory by its ref, whatever its state; NoSuchMemory when none."""
        msg = accept(ViewMemory, msg)
        ref = parse_ref(msg.ref)  # the message's pattern admits only good refs
        found = browsing.get(self.store, ref)
        if found is None:
            raise NoSuchMemory(f"no {ref.kind} {ref.id}")
        return _view(found)

    def save(self) -> Ack:
        """The index to disk, with what is waiting for a vector indexed first (one
        step: a stop does not wait for a whole backlog; the rest is indexed from
        the database at the next start, as always). A memory written just before
        a clean stop, its writer's notification still queued, is in the saved
        index."""
        self._unsaved += self.indexer.sync(limit=SYNC_STEP)
        self.index.save()
        self._unsaved = 0
        return Ack()

    def close(self) -> None:
        """Closed by the actor (least recently used): the index saved, the store closed."""
        self.save()
        self.store.close()

    def ping(self) -> str:
        return "ok"


# The actor: the model, and the households it serves (actors/households.py).
RecallActor = serving(HouseholdRecall, "RecallActor", shared=load_model)


def _view(view: browsing.View) -> MemoryView:
    return MemoryView(ref=view.ref, kind=view.kind, item_id=view.item_id, text=view.text,
                      created_at=view.created_at, disabled=view.disabled, pinned=view.pinned,
                      level=view.level, channel=view.channel, source=view.source,
                      speaker=view.speaker, details=view.details,
                      sensitive=view.sensitive, person=view.person)
