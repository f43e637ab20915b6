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

With ``cut`` (``recall.passages``), a long turn is also cut into passages
(:mod:`runtime.recall.passages`), rows of the ``passages`` table, each embedded
into the passage index. A turn dropped (disabled, forgotten, edited) takes its
passages with it (:meth:`Indexer.drop`; the database's triggers delete them on
a delete or an edit of the turn's row whatever the path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from runtime.llm.embedder import Embedder
from runtime.recall.passages import Cut, split
from runtime.store.database import Row, Store
from runtime.store.vector_index import PASSAGE, VectorIndex

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


# long turns not cut yet (Indexer.cut: its length in characters, after the last id checked)
_UNCUT = """
    SELECT t.id, t.content FROM transcript t
    WHERE t.memory = 1 AND t.disabled = 0 AND t.id > ? AND length(t.content) > ?
      AND NOT EXISTS (SELECT 1 FROM passages p WHERE p.transcript_id = t.id)
    ORDER BY t.id LIMIT ?"""
_UNEMBEDDED = """
    SELECT p.id, p.content, t.speaker, t.role FROM passages p
    JOIN transcript t ON t.id = p.transcript_id
    WHERE p.vec IS NULL ORDER BY p.id LIMIT ?"""


def document(kind: str, row: Row) -> str:
    """The text embedded for a memory item."""
    if kind == "turn":
        return f"{row['speaker'] or row['role']}: {row['content']}"
    if kind == "episode":
        return str(row["gist"])
    return f"{row['subject']} {row['key']}: {row['value']}"


class Indexer:
    def __init__(self, store: Store, index: VectorIndex, embedder: Embedder,
                 batch: int = 64, cut: Cut | None = None) -> None:
        """``cut``: how long turns are cut into passages (None: they are not)."""
        self.store = store
        self.index = index
        self.embedder = embedder
        self.batch = batch
        self.cut = cut
        # Rows at or below these ids have been checked; a full scan on start.
        # (PASSAGE: the turns looked at for cutting.)
        self._checked: dict[str, int] = {"turn": 0, "episode": 0, "fact": 0, PASSAGE: 0}

    def pending_count(self) -> int:
        """Memory items without a vector, counted in SQLite (the rows are never read
        out: the Recall actor asks after every indexing step)."""
        items = sum(int(self.store.scalar(f"SELECT count(*) FROM ({sql})", (0, 1 << 62)) or 0)
                    for sql in _PENDING.values())
        if self.cut is None:
            return items
        # the turns not cut yet count from the last one checked: length() reads
        # every turn's text, and the others were looked at already
        return (items + int(self.store.scalar(
            f"SELECT count(*) FROM ({_UNCUT})",
            (self._checked[PASSAGE], self.cut.limit, 1 << 62)) or 0)
            + int(self.store.scalar("SELECT count(*) FROM passages WHERE vec IS NULL") or 0))

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
        if self.cut is not None and (kinds is None or "turn" in kinds):
            done += self._passages(None if limit is None else limit - done)
            if progress:
                progress(done, total)
        return done

    def _passages(self, limit: int | None) -> int:
        """Cut the long turns not cut yet into passages, then embed and index up
        to ``limit`` passages (all, when None); return how many were embedded."""
        assert self.cut is not None
        while True:
            rows = self.store.rows(_UNCUT, (self._checked[PASSAGE], self.cut.limit, self.batch))
            if not rows:
                break
            with self.store.write_transaction():
                for row in rows:
                    text = str(row["content"])
                    for seq, (start, stop) in enumerate(split(text, self.cut)):
                        self.store.conn.execute(
                            "INSERT INTO passages (transcript_id, seq, start, stop, content)"
                            " VALUES (?, ?, ?, ?, ?)",
                            (row["id"], seq, start, stop, text[start:stop]))
            self._checked[PASSAGE] = rows[-1]["id"]
        done = 0
        while limit is None or done < limit:
            size = self.batch if limit is None else min(self.batch, limit - done)
            rows = self.store.rows(_UNEMBEDDED, (size,))
            if not rows:
                break
            vecs = np.asarray(self.embedder.embed(
                [f"{r['speaker'] or r['role']}: {r['content']}" for r in rows]), dtype=np.float32)
            with self.store.write_transaction():
                for row, vec in zip(rows, vecs):
                    self.store.conn.execute(
                        "UPDATE passages SET model = ?, vec = ? WHERE id = ?",
                        (self.embedder.name, vec.tobytes(), row["id"]))
            self.index.add(PASSAGE, [r["id"] for r in rows], vecs)
            done += len(rows)
        return done

    def recheck(self, kind: str, item_id: int) -> None:
        """Look at ``item_id`` again on the next sync (it was enabled again, or
        its content changed)."""
        self._checked[kind] = min(self._checked[kind], item_id - 1)
        if kind == "turn":  # its passages too
            self._checked[PASSAGE] = min(self._checked[PASSAGE], item_id - 1)

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
            passages = self.store.rows("SELECT id FROM passages WHERE vec IS NOT NULL")
            self.store.conn.execute("DELETE FROM passages")
        for row in rows:
            self.index.remove(row["kind"], row["id"])
        for row in passages:
            self.index.remove(PASSAGE, row["id"])
        self._settle_passages()
        self._checked = dict.fromkeys(self._checked, 0)
        return len(rows)

    def drop(self, kind: str, item_id: int) -> None:
        """Forget an item's vector (it was tombstoned, deleted or superseded),
        and a turn's passages with theirs."""
        passages: list[int] = []
        with self.store.write_transaction():
            label = self.store.scalar(
                "SELECT id FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
            if label is not None:
                self.store.conn.execute("DELETE FROM vectors WHERE id = ?", (label,))
            if kind == "turn":
                passages = [int(r[0]) for r in self.store.conn.execute(
                    "SELECT id FROM passages WHERE transcript_id = ? AND vec IS NOT NULL",
                    (item_id,))]
                self.store.conn.execute("DELETE FROM passages WHERE transcript_id = ?",
                                        (item_id,))
        if label is not None:
            self.index.remove(kind, int(label))
        for passage in passages:
            self.index.remove(PASSAGE, passage)
        if kind == "turn":
            self._settle_passages()

    def _settle_passages(self) -> None:
        """Passages a trigger deleted (an edit of their turn's text) leave their
        labels in the index: forget them when the counts disagree."""
        held = int(self.store.scalar("SELECT count(*) FROM passages WHERE vec IS NOT NULL"))
        if self.index.count(PASSAGE) != held:
            self.index.prune(PASSAGE)

    def drop_stale_models(self) -> int:
        """Delete vectors made by another embedding model; sync re-embeds them."""
        with self.store.write_transaction():
            stale = self.store.rows(
                "SELECT id, kind FROM vectors WHERE model != ?", (self.embedder.name,))
            for row in stale:
                self.store.conn.execute("DELETE FROM vectors WHERE id = ?", (row["id"],))
            # a passage's label is never reused: stale ones go, and are cut again
            # (all of a turn's, so that the turn is cut whole again)
            turns = "SELECT transcript_id FROM passages WHERE model != ?"
            stale_passages = self.store.rows(
                f"SELECT id FROM passages WHERE vec IS NOT NULL AND transcript_id IN ({turns})",
                (self.embedder.name,))
            self.store.conn.execute(f"DELETE FROM passages WHERE transcript_id IN ({turns})",
                                    (self.embedder.name,))
        for row in stale:
            self.index.remove(row["kind"], row["id"])
        for row in stale_passages:
            self.index.remove(PASSAGE, row["id"])
        if stale_passages:
            self._checked[PASSAGE] = 0
        if stale:
            log.info("dropped %d vectors of another embedding model", len(stale))
        return len(stale)
