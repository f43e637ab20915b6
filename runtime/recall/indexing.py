"""Keeping vectors in step with memory rows.

Rows are committed first (the transcript, episodes, facts); their vectors are
derived data. :meth:`Indexer.sync` embeds every memory item that has no vector
yet, stores the vectors in the ``vectors`` table and adds them to the hnswlib
indexes. A crash between a row's commit and its vector loses nothing: the next
sync (at the latest on the next open) picks the row up.

What is indexed: transcript rows marked as memory and not disabled, live
(untombstoned, not disabled) episodes, and current facts (open validity window,
not disabled). Ids are never reused (AUTOINCREMENT), so looking only past the
last id checked misses nothing new; an item enabled again is handed back with
:meth:`Indexer.recheck`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from runtime.llm.embedder import Embedder
from runtime.store.database import Row, Store
from runtime.store.vector_index import VectorIndex

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

_PENDING: dict[str, str] = {
    "turn": """
        SELECT t.id, t.speaker, t.role, t.content FROM transcript t
        WHERE t.memory = 1 AND t.disabled = 0 AND t.id > ? AND NOT EXISTS (
            SELECT 1 FROM vectors v WHERE v.kind = 'turn' AND v.item_id = t.id)
        ORDER BY t.id LIMIT ?""",
    "episode": """
        SELECT e.id, e.gist FROM episodes e
        WHERE e.tombstoned_at IS NULL AND e.disabled = 0 AND e.id > ? AND NOT EXISTS (
            SELECT 1 FROM vectors v WHERE v.kind = 'episode' AND v.item_id = e.id)
        ORDER BY e.id LIMIT ?""",
    "fact": """
        SELECT f.id, f.subject, f.key, f.value FROM facts f
        WHERE f.valid_to IS NULL AND f.disabled = 0 AND f.id > ? AND NOT EXISTS (
            SELECT 1 FROM vectors v WHERE v.kind = 'fact' AND v.item_id = f.id)
        ORDER BY f.id LIMIT ?""",
}


def document(kind: str, row: Row) -> str:
    """The text embedded for a memory item."""
    if kind == "turn":
        return f"{row['speaker'] or row['role']}: {row['content']}"
    if kind == "episode":
        return str(row["gist"])
    return f"{row['subject']} {row['key']}: {row['value']}"


class Indexer:
    def __init__(self, store: Store, index: VectorIndex, embedder: Embedder,
                 batch: int = 64) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.batch = batch
        # Rows at or below these ids have been checked; a full scan on start.
        self._checked: dict[str, int] = {"turn": 0, "episode": 0, "fact": 0}

    def pending_count(self) -> int:
        """Memory items without a vector, counted in SQLite (the rows are never read
        out: the Recall actor asks after every indexing step)."""
        return sum(int(self.store.scalar(f"SELECT count(*) FROM ({sql})", (0, 1 << 62)) or 0)
                   for sql in _PENDING.values())

    def sync(self, progress: Progress | None = None, limit: int | None = None,
             kinds: tuple[str, ...] | None = None) -> int:
        """Embed and index memory items that have no vector (all of them, or up to
        ``limit``; of ``kinds`` only, when given); return how many."""
        done = 0
        total = self.pending_count() if progress else 0
        for kind, sql in _PENDING.items():
            if kinds is not None and kind not in kinds:
                continue
            while limit is None or done < limit:
                size = self.batch if limit is None else min(self.batch, limit - done)
                rows = self.store.rows(sql, (self._checked[kind], size))
                if not rows:
                    break
                vecs = self.embedder.embed([document(kind, r) for r in rows])
                self.put(kind, [r["id"] for r in rows], vecs)
                self._checked[kind] = rows[-1]["id"]
                done += len(rows)
                if progress:
                    progress(done, total)
        return done

    def recheck(self, kind: str, item_id: int) -> None:
        """Look at ``item_id`` again on the next sync (it was enabled again, or
        its content changed)."""
        self._checked[kind] = min(self._checked[kind], item_id - 1)

    def put(self, kind: str, item_ids: list[int], vecs: np.ndarray) -> list[int]:
        """Store vectors for items (replacing older ones) and index them."""
        replaced: list[int] = []
        labels: list[int] = []
        with self.store.write_transaction():
            for item_id, vec in zip(item_ids, vecs):
                label, old = self.store.put_vector(
                    kind, item_id, self.embedder.name, vec.astype(np.float32).tobytes())
                labels.append(label)
                if old is not None:
                    replaced.append(old)
        self.index.add(kind, labels, np.asarray(vecs, dtype=np.float32))
        for old in replaced:
            self.index.remove(kind, old)
        return labels

    def clear(self) -> int:
        """Forget every vector; the next syncs re-embed everything."""
        with self.store.write_transaction():
            rows = self.store.rows("SELECT id, kind FROM vectors")
            self.store.conn.execute("DELETE FROM vectors")
        for row in rows:
            self.index.remove(row["kind"], row["id"])
        self._checked = dict.fromkeys(self._checked, 0)
        return len(rows)

    def drop(self, kind: str, item_id: int) -> None:
        """Forget an item's vector (it was tombstoned, deleted or superseded)."""
        with self.store.write_transaction():
            label = self.store.scalar(
                "SELECT id FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
            if label is None:
                return
            self.store.conn.execute("DELETE FROM vectors WHERE id = ?", (label,))
        self.index.remove(kind, int(label))

    def drop_stale_models(self) -> int:
        """Delete vectors made by another embedding model; sync re-embeds them."""
        with self.store.write_transaction():
            stale = self.store.rows(
                "SELECT id, kind FROM vectors WHERE model != ?", (self.embedder.name,))
            for row in stale:
                self.store.conn.execute("DELETE FROM vectors WHERE id = ?", (row["id"],))
        for row in stale:
            self.index.remove(row["kind"], row["id"])
        if stale:
            log.info("dropped %d vectors of another embedding model", len(stale))
        return len(stale)
