"""The write log's retention rule: what history of deleted rows may be dropped.

The write log is append-only (migration 0011); the one sanctioned delete is
this rule. The history of a transcript row the decay job pruned, or of an
episode it purged (its insert, updates, delete, and the rows that went with it
by cascade: a turn's tool calls, an episode's citations), is dropped once the
delete is :data:`runtime.memories.decay.WRITE_LOG_RETENTION_DAYS` old
(:func:`runtime.memories.decay.write_log_expired`). The history of facts and
compactions is kept, and so is the content-free trace of a row the user forgot
(:meth:`runtime.store.database.Store.forget` promises it). The newest entry of the log
is never dropped, so that its ids only grow.

The history of a row a **rollback** deleted (its delete is logged as writer
:data:`runtime.store.rollback.WRITER`) is kept for as long as that row stays
deleted: the undo a rollback prints (``reverie doctor rollback --writer
rollback --since T``) reads it to put the row back, and that undo is offered
without an end date. It is bounded by what rollbacks remove (a person's
explicit, rare action), not by time; a forget still erases its content.

Each owner of a pruned table expires its own tables' history: the Transcript
actor :data:`TRANSCRIPT_HISTORY`, the Episodes actor :data:`EPISODE_HISTORY`;
in-process :class:`runtime.memory.Memory` both. The decay job
(``runtime.mind.janitor``) asks for it through its writer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from runtime.memories.decay import WRITE_LOG_RETENTION_DAYS, write_log_expired
from runtime.store.database import Store
from runtime.store.rollback import WRITER as ROLLBACK
from runtime.time.clock import DAY

log = logging.getLogger(__name__)

_CHUNK = 500

# Pruned tables, and the tables whose rows went with theirs by cascade:
# (child table, JSON path in the child's log row that names the parent, or
# None when the child's log row_id is the parent id).
_CASCADES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "transcript": (("tool_calls", "$.transcript_id"),),
    "episodes": (("episode_citations", None),),
}
#: Whose history each owner expires (:func:`expire_write_log`'s ``tables``).
TRANSCRIPT_HISTORY = ("transcript",)
EPISODE_HISTORY = ("episodes",)


def expire_write_log(store: Store, now: float | None,
                     tables: Sequence[str] = (*TRANSCRIPT_HISTORY, *EPISODE_HISTORY)) -> int:
    """Drop the write-log history of transcript rows and episodes (``tables``:
    those of one owner, :data:`TRANSCRIPT_HISTORY` or :data:`EPISODE_HISTORY`)
    deleted (not forgotten) at least the retention period before ``now`` (None:
    the store's clock; the decay job passes its own, which is the tick's);
    return how many log rows went."""
    unknown = set(tables) - set(_CASCADES)
    if unknown:
        raise ValueError(f"no write-log retention rule for {sorted(unknown)}")
    now = store.clock.now() if now is None else now
    cutoff = now - WRITE_LOG_RETENTION_DAYS * DAY
    dropped = 0
    for table in tables:
        cascades = _CASCADES[table]
        # the rows a rollback deleted last: what its undo needs is kept
        undoable = {int(r["row_id"]): int(r["last"]) for r in store.rows(
            "SELECT row_id, max(id) AS last FROM write_log WHERE op = 'delete'"
            " AND table_name = ? AND writer = ? GROUP BY row_id", (table, ROLLBACK))}
        deleted = [
            int(r["row_id"]) for r in store.rows(
                "SELECT id, row_id, at FROM write_log WHERE op = 'delete' AND table_name = ?"
                " AND at <= ? AND writer != ? AND (before IS NULL OR"
                " json_extract(before, '$.forgotten') IS NULL) ORDER BY id",
                (table, cutoff, ROLLBACK))
            if write_log_expired(r["at"], now)
            and undoable.get(int(r["row_id"]), 0) < int(r["id"])]
        for start in range(0, len(deleted), _CHUNK):
            dropped += _drop(store, table, cascades, deleted[start:start + _CHUNK])
    if dropped:
        log.info("write log: %d rows of pruned memory expired (%s)", dropped,
                 ", ".join(tables))
    return dropped


def _drop(store: Store, table: str, cascades: tuple[tuple[str, str | None], ...],
          ids: Sequence[int]) -> int:
    # The log is append-only; this retention rule is the one sanctioned delete.
    with store.write_transaction(), store.expiring_write_log():
        marks = ", ".join("?" for _ in ids)
        # Ids are never reused, but be sure the row is really gone.
        live = {r[0] for r in store.conn.execute(
            f"SELECT id FROM {table} WHERE id IN ({marks})", list(ids))}
        gone = [i for i in ids if i not in live]
        if not gone:
            return 0
        marks = ", ".join("?" for _ in gone)
        # The newest entry stays, whatever it is: write_log.id has no
        # AUTOINCREMENT, so freeing the largest ids would let SQLite hand them
        # out again, and backups read "the entries after the replica's last id".
        # The next run drops it, once a later write is the newest.
        below = int(store.scalar("SELECT coalesce(max(id), 0) FROM write_log"))
        total = 0
        store.conn.execute(
            f"DELETE FROM write_log WHERE id < ? AND table_name = ? AND row_id IN ({marks})",
            [below, table, *gone])
        total += store.conn.changes()
        for child, path in cascades:
            if path is None:
                store.conn.execute(
                    f"DELETE FROM write_log WHERE id < ? AND table_name = ?"
                    f" AND row_id IN ({marks})", [below, child, *gone])
            else:
                store.conn.execute(
                    f"DELETE FROM write_log WHERE id < ? AND table_name = ?"
                    f" AND json_extract(coalesce(after, before), '{path}') IN ({marks})",
                    [below, child, *gone])
            total += store.conn.changes()
        return total
