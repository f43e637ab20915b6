"""The hnswlib index cache: reclaimed deletions, honest searches, owner-only files.

Everything is real: a SQLite store in ``tmp_path``, hnswlib, and, for the
re-embedding cycles, the ONNX MiniLM embedder. Vectors go in and out through
:class:`runtime.recall.indexing.Indexer` (the database row first, then the index), the
way the runtime writes them. An index is only ever broken through hnswlib's own
API on its saved file, as a damaged or inconsistent cache would be.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import hnswlib
import numpy as np
import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.recall.indexing import Indexer
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.vector_index import (
    COMPACT_MIN,
    KINDS,
    IndexUnavailable,
    VectorIndex,
)
from runtime.time.clock import ManualClock

DIM = 32
MODEL = "test-random/32"
NEVER = 10**9  # a compaction minimum that is never reached


class NamedModel:
    """What :class:`Indexer` reads of an embedder to store vectors it is given."""

    name, dim = MODEL, DIM


@pytest.fixture
def store(make_settings: Callable[..., Settings], clock: ManualClock) -> Iterator[Store]:
    settings = make_settings()
    with Store(settings.store.path, FactKinds.load(settings.memory.fact_kinds_file),
               clock=clock) as s:
        yield s


def unit_vectors(n: int, seed: int = 7) -> np.ndarray:
    vecs = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def open_index(store: Store, directory: Path, compact_min: int = COMPACT_MIN) -> VectorIndex:
    return VectorIndex(store, directory, MODEL, DIM, compact_min=compact_min)


def fill(store: Store, index: VectorIndex, n: int) -> tuple[Indexer, list[int], np.ndarray]:
    """``n`` turn vectors (items 1..n); returns the indexer, their labels, the vectors."""
    indexer = Indexer(store, index, NamedModel())  # type: ignore[arg-type]
    vecs = unit_vectors(n)
    labels = indexer.put("turn", list(range(1, n + 1)), vecs)
    return indexer, labels, vecs


def stored_labels(store: Store) -> set[int]:
    return {r[0] for r in store.conn.execute("SELECT id FROM vectors WHERE kind = 'turn'")}


def damage_saved_index(path: Path, change: Callable[[hnswlib.Index], hnswlib.Index],
                       dim: int = DIM) -> None:
    """Load a saved index file with hnswlib, change it, save it back (metadata untouched)."""
    raw = hnswlib.Index(space="ip", dim=dim)
    raw.load_index(str(path))
    change(raw).save_index(str(path))


# -- searches answer k live results, or fail loudly ---------------------------------

def test_search_with_many_deleted_returns_every_live_result(store: Store,
                                                            tmp_path: Path) -> None:
    """hnswlib counts deleted elements; asking it for more than the live ones
    fails, which must not be answered with a shrunken k."""
    index = open_index(store, tmp_path / "index", compact_min=NEVER)
    indexer, labels, vecs = fill(store, index, 100)
    for item_id in range(11, 101):
        indexer.drop("turn", item_id)
    live = set(labels[:10])
    assert index.count("turn") == 10 and index.elements("turn") == 100

    found, sims = index.search("turn", vecs[0], 12)
    assert sorted(found.tolist()) == sorted(live)
    assert len(sims) == 10

    found, _ = index.search("turn", vecs[3], 5)
    assert len(found) == 5 and set(found.tolist()) <= live
    assert found[0] == labels[3]  # a stored vector's nearest neighbour is itself


def test_search_of_an_empty_or_emptied_index_is_empty(store: Store, tmp_path: Path) -> None:
    index = open_index(store, tmp_path / "index", compact_min=NEVER)
    assert len(index.search("turn", unit_vectors(1)[0], 10)[0]) == 0
    indexer, _, vecs = fill(store, index, 5)
    for item_id in range(1, 6):
        indexer.drop("turn", item_id)
    assert len(index.search("turn", vecs[0], 10)[0]) == 0


def test_inconsistent_index_raises_instead_of_answering_fewer(store: Store,
                                                              tmp_path: Path) -> None:
    """A saved index whose elements were marked deleted while their vectors are
    still in the database cannot find k of them: that is an error, not a
    shorter list; the next save rebuilds it from the database."""
    directory = tmp_path / "index"
    index = open_index(store, directory)
    _, labels, vecs = fill(store, index, 50)
    index.save()

    def mark_most_deleted(raw: hnswlib.Index) -> hnswlib.Index:
        for label in labels[5:]:
            raw.mark_deleted(label)
        return raw

    damage_saved_index(directory / "turn.hnsw", mark_most_deleted)
    index = open_index(store, directory)
    with pytest.raises(IndexUnavailable, match="turn index failed"):
        index.search("turn", vecs[0], 20)

    index.save()  # the failed kind is rebuilt from the database
    found, _ = index.search("turn", vecs[0], 20)
    assert len(found) == 20 and found[0] == labels[0]
    assert open_index(store, directory).search("turn", vecs[0], 20)[0].tolist() == found.tolist()


@pytest.mark.parametrize("dim", [DIM - 1, DIM + 1])
def test_query_of_the_wrong_dimension_raises(store: Store, tmp_path: Path, dim: int) -> None:
    """hnswlib itself does not check: it would read past the vector, or ignore its tail."""
    index = open_index(store, tmp_path / "index")
    fill(store, index, 20)
    with pytest.raises(IndexUnavailable, match="shape"):
        index.search("turn", np.ones(dim, dtype=np.float32), 5)


def test_broken_index_degrades_recall_visibly(make_settings: Callable[..., Settings],
                                             clock: ManualClock, embedder: Embedder) -> None:
    settings = make_settings()
    texts = [f"Note {i}: the plumber fixed the kitchen tap on day {i}." for i in range(40)]
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        memory.add_turns([TurnIn(channel="kitchen", source="user", content=t) for t in texts])
        assert not memory.recall("who fixed the kitchen tap?").degraded
        labels = sorted(stored_labels(memory.store))

    def mark_deleted(raw: hnswlib.Index) -> hnswlib.Index:
        for label in labels[3:]:
            raw.mark_deleted(label)
        return raw

    damage_saved_index(settings.store.resolved_dir / "index" / "turn.hnsw", mark_deleted,
                       embedder.dim)
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        result = memory.recall("who fixed the kitchen tap?")
        assert result.degraded and result.reason and "IndexUnavailable" in result.reason
        assert result.items  # the keyword fallback still answers
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        assert not memory.recall("who fixed the kitchen tap?").degraded


# -- deletions are reclaimed ---------------------------------------------------------

def test_reembed_cycles_keep_the_index_bounded(memory: Memory) -> None:
    """``reverie reindex --reembed`` clears every vector, then re-embeds them all
    under new labels: without reclaiming, each cycle adds a full copy."""
    texts = [f"Day {i}: we walked the dog along the river and met a neighbour." for i in range(40)]
    memory.add_turns([TurnIn(channel="garden", source="user", content=t) for t in texts])
    path = memory.index_dir / "turn.hnsw"
    elements, sizes = [], []
    for _ in range(14):
        memory.indexer.clear()
        memory.indexer.sync()
        memory.index.save()
        assert memory.index.count("turn") == 40
        elements.append(memory.index.elements("turn"))
        sizes.append(path.stat().st_size)
    assert max(elements) <= 40 + COMPACT_MIN
    assert min(elements[7:]) == 40  # a rebuild happened, not only in the first cycles
    assert max(sizes[7:]) <= max(sizes[:7])
    labels = stored_labels(memory.store)
    assert min(labels) > 40 * 14  # labels are never reused
    result = memory.recall("walking the dog by the river")
    assert not result.degraded and result.items


def test_compaction_reclaims_deleted_elements_and_keeps_labels(store: Store,
                                                                tmp_path: Path) -> None:
    directory = tmp_path / "index"
    index = open_index(store, directory, compact_min=10)
    indexer, labels, vecs = fill(store, index, 100)
    for item_id in range(1, 26):  # 25 deleted: not more than a quarter yet
        indexer.drop("turn", item_id)
    assert index.elements("turn") == 100
    indexer.drop("turn", 26)  # 26 > 25: rebuilt from the database
    assert index.elements("turn") == index.count("turn") == 74
    found, _ = index.search("turn", vecs[50], 1)
    assert found.tolist() == [labels[50]]  # same label (the vectors row id)
    index.save()
    assert json.loads((directory / "turn.json").read_text())["count"] == 74


def test_a_saved_index_full_of_deletions_is_rebuilt_on_open(store: Store,
                                                            tmp_path: Path) -> None:
    directory = tmp_path / "index"
    index = open_index(store, directory, compact_min=NEVER)
    indexer, _, _ = fill(store, index, 60)
    for item_id in range(1, 41):
        indexer.drop("turn", item_id)
    index.save()
    assert open_index(store, directory, compact_min=NEVER).elements("turn") == 60
    reopened = open_index(store, directory, compact_min=10)
    assert reopened.elements("turn") == reopened.count("turn") == 20


# -- a cache out of step with the database is reconciled on open --------------------

def test_vectors_deleted_while_the_cache_was_not_saved(store: Store, tmp_path: Path) -> None:
    """A crash after rows (and their vectors, by trigger) were deleted: the saved
    cache still holds them as live elements."""
    directory = tmp_path / "index"
    index = open_index(store, directory, compact_min=NEVER)
    _, labels, vecs = fill(store, index, 50)
    index.save()
    for label in labels[:20]:  # as the triggers do when their rows are deleted
        store.conn.execute("DELETE FROM vectors WHERE id = ?", (label,))
    reopened = open_index(store, directory, compact_min=NEVER)
    assert reopened.count("turn") == 30
    found, _ = reopened.search("turn", vecs[0], 50)
    assert sorted(found.tolist()) == sorted(labels[20:])


def test_vectors_missing_from_the_cache_are_added_on_open(store: Store, tmp_path: Path) -> None:
    directory = tmp_path / "index"
    index = open_index(store, directory)
    _, labels, vecs = fill(store, index, 30)
    index.save()
    lost = labels[12]

    def without_lost(raw: hnswlib.Index) -> hnswlib.Index:
        kept = [label for label in labels if label != lost]
        rebuilt = hnswlib.Index(space="ip", dim=DIM)
        rebuilt.init_index(max_elements=64)
        rebuilt.add_items(np.asarray(raw.get_items(kept), dtype=np.float32), kept)
        return rebuilt

    damage_saved_index(directory / "turn.hnsw", without_lost)
    assert json.loads((directory / "turn.json").read_text())["max_label"] == max(labels)
    reopened = open_index(store, directory)
    assert reopened.count("turn") == 30
    assert reopened.search("turn", vecs[12], 1)[0].tolist() == [lost]


# -- owner-only files -----------------------------------------------------------------

def test_index_files_are_owner_only(store: Store, tmp_path: Path) -> None:
    directory = tmp_path / "index"
    old_umask = os.umask(0o022)
    try:
        directory.mkdir(mode=0o755)
        for kind in KINDS:  # left world-readable by an older version
            for suffix in (".hnsw", ".json"):
                (directory / f"{kind}{suffix}").write_text("")
                os.chmod(directory / f"{kind}{suffix}", 0o644)
        index = open_index(store, directory)
        fill(store, index, 10)
        index.save()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = sorted(p.name for p in directory.iterdir())
    # the turns' index and its metadata; a kind with no vector has no index, and
    # its world-readable leftovers are gone (no hnswlib index made for nothing)
    assert files == ["turn.hnsw", "turn.json"]
    for name in files:
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
