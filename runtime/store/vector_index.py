"""hnswlib vector indexes, one per memory kind, persisted beside the database.

The database is the source of truth: every vector lives in the ``vectors``
table and its row id is the hnswlib label (labels are never reused). An index
file is only a cache. On open, an index is loaded if its metadata matches
(model, dimension), then reconciled with the database: labels whose vectors
are gone are marked deleted, vectors it lacks are added. A missing, stale or
unreadable file is rebuilt from the database. Deleted memories are also
filtered out at query time by the join against the database, so a crash
between a delete and :meth:`VectorIndex.save` cannot surface a forgotten item.

hnswlib only marks deleted elements; they keep their memory and their place
in the file. Once a kind's deleted elements pass a threshold (a share of its
elements, and a minimum count), its index is rebuilt from the database: after
the removes that crossed it, and on save. A search asks hnswlib for no more
neighbours than there are live elements; any failure beyond that is an error
(:class:`IndexUnavailable`), never a shorter answer. The index directory is
owner-only (0700) and its files 0600.

Beside the memory kinds, the long turns' passages (``PASSAGE``; migration
0021, :mod:`runtime.recall.passages`) have an index of their own: their
vectors live in the ``passages`` table, whose row id is the label.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import hnswlib
import numpy as np

from runtime.store.database import Store
from runtime.store.files import create_private, private_dir, write_private

log = logging.getLogger(__name__)

KINDS = ("turn", "episode", "fact")
# the long turns' passages (runtime.recall.passages): an index, not a memory kind
PASSAGE = "passage"
INDEXED = (*KINDS, PASSAGE)


def _source(kind: str) -> tuple[str, str, list[object]]:
    """Where ``kind``'s vectors are: the table, the condition and its parameters."""
    if kind == PASSAGE:
        return "passages", "vec IS NOT NULL", []
    return "vectors", "kind = ?", [kind]

# A kind's index is rebuilt once its deleted elements are more than this share
# of its elements, and more than COMPACT_MIN.
COMPACT_RATIO = 0.25
COMPACT_MIN = 256
_BATCH = 4096
_EMPTY = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))


class IndexUnavailable(RuntimeError):
    """The vector path cannot answer; recall falls back to keywords."""


class _KindIndex:
    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = dim
        self._capacity = max(capacity, 16)
        # made on the first add: an hnswlib index costs 2.5 MiB the moment it
        # exists, whatever its capacity (its 65,536 label locks), and a kind
        # with no vectors needs none (issue 26: one Recall actor holds many
        # households' indexes, most kinds of a small household empty)
        self._index: hnswlib.Index | None = None
        self.max_label = 0
        self.deleted = 0
        self.broken = False  # a search failed: rebuild on the next save

    @classmethod
    def load(cls, path: Path, dim: int, max_label: int) -> _KindIndex:
        self = cls.__new__(cls)
        self.dim = dim
        self._capacity = 16
        self._index = hnswlib.Index(space="ip", dim=dim)
        self._index.load_index(str(path), allow_replace_deleted=False)
        self._index.set_num_threads(1)
        self.max_label = max_label
        self.deleted = 0  # counted by VectorIndex._reconcile
        self.broken = False
        return self

    @property
    def index(self) -> hnswlib.Index:
        """The hnswlib index, made on first use."""
        if self._index is None:
            self._index = hnswlib.Index(space="ip", dim=self.dim)
            self._index.init_index(max_elements=self._capacity, ef_construction=200, M=16)
            self._index.set_num_threads(1)
        return self._index

    @property
    def made(self) -> bool:
        """Whether the hnswlib index exists (it does once anything was added)."""
        return self._index is not None

    def labels(self) -> list[int]:
        """Every label held, deleted ones included."""
        return [] if self._index is None else [int(x) for x in self._index.get_ids_list()]

    @property
    def elements(self) -> int:
        """Elements held, deleted ones included."""
        return 0 if self._index is None else int(self._index.get_current_count())

    @property
    def live(self) -> int:
        return self.elements - self.deleted

    def add(self, labels: np.ndarray, vecs: np.ndarray) -> None:
        if len(labels) == 0:
            return
        need = self.elements + len(labels)
        capacity = self.index.get_max_elements()
        if need > capacity:
            self.index.resize_index(max(need, capacity * 2))
        self.index.add_items(vecs, labels)
        self.max_label = max(self.max_label, int(labels.max()))

    def search(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if vec.shape != (self.dim,):
            raise ValueError(f"query vector has shape {vec.shape}, the index holds {self.dim}")
        # hnswlib's count includes deleted elements, and it raises when it cannot
        # find k live ones: never ask for more than there are
        k = min(k, self.live)
        if k <= 0:
            return _EMPTY
        self.index.set_ef(max(2 * k, 64))
        labels, dists = self.index.knn_query(vec.reshape(1, -1), k=k)
        return labels[0].astype(np.int64), (1.0 - dists[0]).astype(np.float32)

    def remove(self, label: int) -> bool:
        """Mark ``label`` deleted; False if it is absent or already deleted."""
        if self._index is None:
            return False
        try:
            self.index.mark_deleted(label)
        except RuntimeError:
            return False
        self.deleted += 1
        return True


class VectorIndex:
    def __init__(self, store: Store, directory: Path, model: str, dim: int, *,
                 compact_ratio: float = COMPACT_RATIO, compact_min: int = COMPACT_MIN) -> None:
        self.store = store
        self.directory = Path(directory)
        self.model = model
        self.dim = dim
        self.compact_ratio = compact_ratio
        self.compact_min = compact_min
        self.available = True
        self._kinds: dict[str, _KindIndex] = {}
        private_dir(self.directory)
        for kind in INDEXED:
            self._kinds[kind] = self._open(kind)

    # -- files ------------------------------------------------------------

    def _paths(self, kind: str) -> tuple[Path, Path]:
        return self.directory / f"{kind}.hnsw", self.directory / f"{kind}.json"

    def _open(self, kind: str) -> _KindIndex:
        data_path, meta_path = self._paths(kind)
        idx: _KindIndex | None = None
        if data_path.exists() and meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                if meta.get("model") == self.model and meta.get("dim") == self.dim:
                    idx = _KindIndex.load(data_path, self.dim, int(meta["max_label"]))
                    self._reconcile(kind, idx)
                else:
                    log.info("index %s built for another model; rebuilding", kind)
            except Exception as exc:  # unreadable cache: rebuild from the database
                log.warning("index %s unreadable (%s); rebuilding", kind, exc)
                idx = None
        if idx is None:
            return self._build(kind)
        self._catch_up(kind, idx)
        if self._wants_compaction(idx):
            return self._build(kind)
        return idx

    def _reconcile(self, kind: str, idx: _KindIndex) -> None:
        """Make a loaded cache hold exactly the database's vectors up to its last
        label: mark the ones deleted since it was saved, add the ones it lacks."""
        held = {int(label) for label in idx.index.get_ids_list()}
        # ids only (the covering (kind, item_id) index): never the vectors themselves
        table, where, params = _source(kind)
        stored = {int(r[0]) for r in self.store.conn.execute(
            f"SELECT id FROM {table} WHERE {where} AND id <= ?", [*params, idx.max_label])}
        gone = held - stored
        for label in gone:
            idx.remove(label)  # False when it was deleted before the save
        idx.deleted = len(gone)
        missing = sorted(stored - held)
        added = 0
        for start in range(0, len(missing), _BATCH):
            chunk = missing[start:start + _BATCH]
            marks = ",".join("?" for _ in chunk)
            rows = list(self.store.conn.execute(
                f"SELECT id, vec FROM {table} WHERE id IN ({marks}) AND {where} AND model = ?"
                " ORDER BY id",
                [*chunk, *params, self.model]))
            added += self._add_blobs(idx, [r[0] for r in rows], [r[1] for r in rows])
        if added:
            log.info("index %s: %d vectors missing from the cache added", kind, added)

    def _build(self, kind: str) -> _KindIndex:
        """A fresh index for ``kind`` from every vector the database holds."""
        table, where, params = _source(kind)
        live = int(self.store.scalar(
            f"SELECT count(*) FROM {table} WHERE {where} AND model = ?", [*params, self.model]))
        idx = _KindIndex(self.dim, capacity=max(1024, live))
        self._catch_up(kind, idx)
        return idx

    def _catch_up(self, kind: str, idx: _KindIndex) -> int:
        added = 0
        batch_labels: list[int] = []
        batch_vecs: list[bytes] = []
        table, where, params = _source(kind)
        cur = self.store.conn.execute(
            f"SELECT id, vec FROM {table} WHERE {where} AND id > ? AND model = ? ORDER BY id",
            [*params, idx.max_label, self.model],
        )
        for label, blob in cur:
            batch_labels.append(label)
            batch_vecs.append(blob)
            if len(batch_labels) >= _BATCH:
                added += self._add_blobs(idx, batch_labels, batch_vecs)
                batch_labels, batch_vecs = [], []
        added += self._add_blobs(idx, batch_labels, batch_vecs)
        if added:
            log.info("index %s caught up with %d vectors from the database", kind, added)
        return added

    def _add_blobs(self, idx: _KindIndex, labels: list[int], blobs: list[bytes]) -> int:
        if not labels:
            return 0
        vecs = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(labels), self.dim)
        idx.add(np.asarray(labels, dtype=np.int64), vecs)
        return len(labels)

    def save(self) -> None:
        """Rebuild the kinds due for it, then write each index atomically (an
        owner-only temp file renamed over the old one), then its metadata."""
        for kind in INDEXED:
            idx = self._kinds[kind]
            if idx.broken or self._wants_compaction(idx):
                self.compact(kind)
        for kind, idx in self._kinds.items():
            data_path, meta_path = self._paths(kind)
            if not idx.made:  # nothing ever added: no file (an old one would be stale)
                data_path.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                continue
            tmp = data_path.with_suffix(".hnsw.tmp")
            create_private(tmp)  # hnswlib truncates it and keeps its mode
            idx.index.save_index(str(tmp))
            tmp.replace(data_path)
            write_private(meta_path, json.dumps(
                {"model": self.model, "dim": self.dim, "max_label": idx.max_label,
                 "count": idx.elements, "deleted": idx.deleted}))

    # -- upkeep -----------------------------------------------------------

    def _wants_compaction(self, idx: _KindIndex) -> bool:
        return (idx.deleted > self.compact_min
                and idx.deleted > self.compact_ratio * idx.elements)

    def compact(self, kind: str) -> None:
        """Rebuild ``kind``'s index from the database, reclaiming deleted elements."""
        old = self._kinds[kind]
        self._kinds[kind] = self._build(kind)
        log.info("index %s rebuilt: %d elements (%d deleted) -> %d",
                 kind, old.elements, old.deleted, self._kinds[kind].elements)

    # -- use --------------------------------------------------------------

    def add(self, kind: str, labels: Iterable[int], vecs: np.ndarray) -> None:
        self._kinds[kind].add(np.fromiter(labels, dtype=np.int64), vecs)

    def remove(self, kind: str, label: int) -> None:
        """Forget ``label`` (its row is already gone from the database)."""
        idx = self._kinds[kind]
        if idx.remove(label) and self._wants_compaction(idx):
            self.compact(kind)

    def prune(self, kind: str) -> int:
        """Forget every label of ``kind`` whose vector the database no longer
        holds (rows a trigger deleted: a turn's passages when its text was
        edited); return how many."""
        idx = self._kinds[kind]
        table, where, params = _source(kind)
        stored = {int(r[0]) for r in self.store.conn.execute(
            f"SELECT id FROM {table} WHERE {where}", params)}
        gone = [label for label in idx.labels() if label not in stored]
        removed = sum(idx.remove(label) for label in gone)
        if removed and self._wants_compaction(idx):
            self.compact(kind)
        return removed

    def count(self, kind: str) -> int:
        """Live vectors in the index (removed ones not counted)."""
        return self._kinds[kind].live

    def elements(self, kind: str) -> int:
        """Elements the index holds, removed ones included (what its file stores)."""
        return self._kinds[kind].elements

    def search(self, kind: str, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest live labels and their similarities (fewer only when the
        index holds fewer). Raises IndexUnavailable when it cannot answer."""
        if not self.available:
            raise IndexUnavailable("vector index switched off")
        idx = self._kinds[kind]
        try:
            return idx.search(np.asarray(vec, dtype=np.float32), k)
        except RuntimeError as exc:  # hnswlib itself failed: rebuild it on the next save
            idx.broken = True
            log.warning("%s index search failed (%s); rebuilt on the next save", kind, exc)
            raise IndexUnavailable(f"{kind} index failed: {exc}") from exc
        except Exception as exc:
            log.warning("%s index search failed: %s", kind, exc)
            raise IndexUnavailable(f"{kind} index failed: {exc}") from exc
