"""hnswlib vector indexes, one per memory kind, persisted beside the database.

The database is the source of truth: every vector lives in the ``vectors``
table and its row id is the hnswlib label. An index file is only a cache. On
open, an index is loaded if its metadata matches (model, dimension), then
caught up with every vector row newer than the last label it holds; a missing,
stale or unreadable file is rebuilt from the database. Deleted memories are
filtered out at query time by the join against the database, so a crash
between a delete and :meth:`VectorIndex.save` cannot surface a forgotten item.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import hnswlib
import numpy as np

from runtime.store import Store

log = logging.getLogger(__name__)

KINDS = ("turn", "episode", "fact")


class IndexUnavailable(RuntimeError):
    """The vector path cannot answer; recall falls back to keywords."""


class _KindIndex:
    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = dim
        self.index = hnswlib.Index(space="ip", dim=dim)
        self.index.init_index(max_elements=capacity, ef_construction=200, M=16)
        self.index.set_num_threads(1)
        self.max_label = 0
        self.deleted = 0

    @classmethod
    def load(cls, path: Path, dim: int, max_label: int, deleted: int) -> _KindIndex:
        self = cls.__new__(cls)
        self.dim = dim
        self.index = hnswlib.Index(space="ip", dim=dim)
        self.index.load_index(str(path), allow_replace_deleted=False)
        self.index.set_num_threads(1)
        self.max_label = max_label
        self.deleted = deleted
        return self

    def add(self, labels: np.ndarray, vecs: np.ndarray) -> None:
        if len(labels) == 0:
            return
        need = self.index.get_current_count() + len(labels)
        capacity = self.index.get_max_elements()
        if need > capacity:
            self.index.resize_index(max(need, capacity * 2))
        self.index.add_items(vecs, labels)
        self.max_label = max(self.max_label, int(labels.max()))

    def search(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        count = self.index.get_current_count()
        if count == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        k = min(k, count)
        self.index.set_ef(max(2 * k, 64))
        while True:
            try:
                labels, dists = self.index.knn_query(vec.reshape(1, -1), k=k)
                break
            except RuntimeError:
                # fewer than k live elements (the count includes deleted ones)
                if k <= 1:
                    return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
                k //= 2
        return labels[0].astype(np.int64), (1.0 - dists[0]).astype(np.float32)

    def remove(self, label: int) -> None:
        try:
            self.index.mark_deleted(label)
            self.deleted += 1
        except RuntimeError:
            pass  # not present, or already removed


class VectorIndex:
    def __init__(self, store: Store, directory: Path, model: str, dim: int) -> None:
        self.store = store
        self.directory = Path(directory)
        self.model = model
        self.dim = dim
        self.available = True
        self._kinds: dict[str, _KindIndex] = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        for kind in KINDS:
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
                    idx = _KindIndex.load(data_path, self.dim, int(meta["max_label"]),
                                          int(meta.get("deleted", 0)))
                else:
                    log.info("index %s built for another model; rebuilding", kind)
            except Exception as exc:  # unreadable cache: rebuild from the database
                log.warning("index %s unreadable (%s); rebuilding", kind, exc)
                idx = None
        if idx is None:
            idx = _KindIndex(self.dim)
        self._catch_up(kind, idx)
        return idx

    def _catch_up(self, kind: str, idx: _KindIndex) -> int:
        added = 0
        batch_labels: list[int] = []
        batch_vecs: list[bytes] = []
        cur = self.store.conn.execute(
            "SELECT id, vec FROM vectors WHERE kind = ? AND id > ? AND model = ? ORDER BY id",
            (kind, idx.max_label, self.model),
        )
        for label, blob in cur:
            batch_labels.append(label)
            batch_vecs.append(blob)
            if len(batch_labels) >= 4096:
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
        """Write each index atomically (temp file + rename), then its metadata."""
        for kind, idx in self._kinds.items():
            data_path, meta_path = self._paths(kind)
            tmp = data_path.with_suffix(".hnsw.tmp")
            idx.index.save_index(str(tmp))
            os.replace(tmp, data_path)
            meta_tmp = meta_path.with_suffix(".json.tmp")
            meta_tmp.write_text(json.dumps(
                {"model": self.model, "dim": self.dim, "max_label": idx.max_label,
                 "count": idx.index.get_current_count(), "deleted": idx.deleted}
            ))
            os.replace(meta_tmp, meta_path)

    # -- use --------------------------------------------------------------

    def add(self, kind: str, labels: Iterable[int], vecs: np.ndarray) -> None:
        self._kinds[kind].add(np.fromiter(labels, dtype=np.int64), vecs)

    def remove(self, kind: str, label: int) -> None:
        self._kinds[kind].remove(label)

    def count(self, kind: str) -> int:
        """Live vectors in the index (removed ones not counted)."""
        idx = self._kinds[kind]
        return int(idx.index.get_current_count()) - idx.deleted

    def search(self, kind: str, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.available:
            raise IndexUnavailable("vector index switched off")
        try:
            return self._kinds[kind].search(np.asarray(vec, dtype=np.float32), k)
        except Exception as exc:
            raise IndexUnavailable(f"{kind} index failed: {exc}") from exc
