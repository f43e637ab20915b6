"""Summaries written from memories, forgotten with them.

The portrait's versions (:mod:`runtime.portrait`) and the digests
(:mod:`runtime.digests`) are text written from facts and episodes, and each
names what it rests on (``fact:N``, ``episode:N``). Read-time filters hide a
portrait line or a digest once one of its sources is disabled, marked
sensitive or forgotten. Forgetting (the user's "delete for good") goes
further: every portrait version and every digest citing the forgotten memory
is forgotten too, the row and its content in the write log. That includes
digests already pruned after their roll-up, whose text the log still held.
The latest portrait version is replaced at once by one without the forgotten
memory's lines; the next synthesis run writes the rest from what remains.

:func:`forget_citing` is called by the services that forget facts
(:class:`runtime.facts.GraphService`) and episodes
(:class:`runtime.episodes.EpisodeService`), inside their write transaction:
a cascade, like the schema's own ``ON DELETE CASCADE``. So forgetting an
episode writes two tables the Graph actor otherwise writes alone; SQLite
serialises the writers, and both tables are append-and-forget (nothing
caches a row across a write).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runtime.store import Store

if TYPE_CHECKING:
    from runtime.portrait import PortraitIn, PortraitService

log = logging.getLogger(__name__)

#: Per table, the refs of a row as SQL over ``src`` (the row's JSON text: the
#: live row, or a write-log snapshot of it): one ``ref`` per output row.
_REFS = {
    # lines: [{"section", "text", "refs": [...]}]
    "portraits": "SELECT r.value AS ref FROM json_each({lines}) l,"
                 " json_each(l.value, '$.refs') r",
    # refs: [...]
    "digests": "SELECT r.value AS ref FROM json_each({refs}) r",
}
_COLUMN = {"portraits": "lines", "digests": "refs"}


def citing(store: Store, table: str, ref: str) -> tuple[list[int], list[int]]:
    """The rows of ``table`` whose refs include ``ref``: (live ids, ids that are
    gone but whose write-log entries still hold a citing snapshot)."""
    column = _COLUMN[table]
    live_refs = _REFS[table].format(**{column: f"t.{column}"})
    live = [int(r[0]) for r in store.conn.execute(
        f"SELECT t.id FROM {table} t WHERE EXISTS ({live_refs} WHERE r.value = ?)"
        " ORDER BY t.id", (ref,))]
    logged: set[int] = set()
    for side in ("before", "after"):
        snapshot = _REFS[table].format(**{column: f"json_extract(w.{side}, '$.{column}')"})
        logged.update(int(r[0]) for r in store.conn.execute(
            f"SELECT DISTINCT w.row_id FROM write_log w WHERE w.table_name = ?"
            f" AND w.{side} IS NOT NULL AND EXISTS ({snapshot} WHERE r.value = ?)",
            (table, ref)))
    return live, sorted(logged - set(live))


def forget_citing(store: Store, ref: str, writer: str) -> int:
    """Forget every portrait version and digest citing ``ref`` (a fact or an
    episode just forgotten), with their write-log content; return how many.

    When the latest portrait version goes, a new one takes its place with its
    other lines: what the prompt shows is what it showed a moment before (the
    read-time filter had already dropped the forgotten memory's lines), not
    nothing until the next synthesis run."""
    forgotten = 0
    with store.write_transaction():
        replacement = _latest_without(store, ref)
        for table in _REFS:
            live, gone = citing(store, table, ref)
            for row_id in live:
                store.forget(writer, table, row_id)
            for row_id in gone:
                store.forget_history(table, row_id)
            forgotten += len(live) + len(gone)
        if replacement is not None:
            _portraits(store).add(replacement, writer)
    if forgotten:
        log.info("forgot %d summaries made from a forgotten memory", forgotten)
    return forgotten


def _latest_without(store: Store, ref: str) -> PortraitIn | None:
    """The latest portrait version less its lines citing ``ref``, if it cites
    ``ref`` and has other lines; else None."""
    from runtime.portrait import PortraitIn

    latest = _portraits(store).latest()
    if latest is None or not any(ref in line.refs for line in latest.lines):
        return None
    kept = [line for line in latest.lines if ref not in line.refs]
    if not kept:
        return None
    return PortraitIn.model_validate({"lines": kept, "signature": latest.signature,
                                      "how": latest.how})


def _portraits(store: Store) -> PortraitService:
    # runtime.portrait imports the job context, which imports the fact and
    # episode services that call this module: imported when used
    from runtime.portrait import PortraitService

    return PortraitService(store)
