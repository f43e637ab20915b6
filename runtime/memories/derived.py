"""What is written from a memory, forgotten with it.

The portrait's versions (:mod:`runtime.memories.portrait`) and the digests
(:mod:`runtime.memories.digests`) are text written from facts and episodes, and each
names what it rests on (``fact:N``, ``episode:N``). Read-time filters hide a
portrait line or a digest once one of its sources is disabled, marked
sensitive or forgotten. Forgetting (the user's "delete for good") goes
further: every portrait version and every digest citing the forgotten memory
is forgotten too, the row and its content in the write log. That includes
digests already pruned after their roll-up, whose text the log still held.
The latest portrait version is replaced at once by one without the forgotten
memory's lines; the next synthesis run writes the rest from what remains.

The reflection (:mod:`runtime.mind.dmn`) quotes the episodes and facts its
findings rest on, word for word, in facts that recall returns and in an
episode that tells them. Those are forgotten with their source too, and what
cites them in turn.

:func:`forget_citing` is called by the services that forget facts
(:class:`runtime.memories.facts.GraphService`) and episodes
(:class:`runtime.memories.episodes.EpisodeService`), inside their write transaction:
a cascade, like the schema's own ``ON DELETE CASCADE``. So forgetting an
episode may write tables the Graph actor otherwise writes alone, and
forgetting a fact the episodes table; SQLite serialises the writers. The
vectors of cascaded facts and episodes stay in the index until its next
compaction: recall joins every hit against the rows, so none is returned.
"""

from __future__ import annotations

import logging

from runtime.memories.portrait import PortraitIn, PortraitService
from runtime.store.database import Store
from runtime.store.job_state import get_state, set_state

log = logging.getLogger(__name__)

#: Per table, SQL listing the refs a row cites (``r.value``), over its column
#: named in braces: the live column, or the column in a write-log snapshot.
_REFS = {
    # lines: [{"section", "text", "refs": [...]}]
    "portraits": "SELECT r.value AS ref FROM json_each({lines}) l,"
                 " json_each(l.value, '$.refs') r",
    # refs: [...]
    "digests": "SELECT r.value AS ref FROM json_each({refs}) r",
}
_COLUMN = {"portraits": "lines", "digests": "refs"}
#: The reflection (runtime.mind.dmn): the source of its findings and episodes, and
#: the job-state key of the findings it has not told in an episode yet.
REFLECTION = "dmn"
UNTOLD = "unsummarised"
#: A finding is matched in a ``dmn`` episode's gist on its first characters.
QUOTED = 80


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
    """Forget everything written from ``ref`` (a fact or an episode just
    forgotten), with its write-log content; return how many rows went.

    - The portrait versions and digests citing it. When the latest portrait
      version goes, a new one takes its place with its other lines: the prompt
      shows what it showed a moment before (the read-time filter had already
      dropped the forgotten memory's lines), not nothing until the next
      synthesis run.
    - The reflection's findings citing it (facts of source ``dmn``, which quote
      the episodes and facts they rest on), the ``dmn`` episodes telling them,
      and the told-later list in the reflection's state. What goes is followed
      in turn: a digest citing a ``dmn`` episode goes too."""
    forgotten = 0
    todo, done = [ref], set()
    with store.write_transaction():
        while todo:
            ref = todo.pop()
            if ref in done:
                continue
            done.add(ref)
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
            findings = _findings_citing(store, ref)
            for fact_id in findings:
                _forget_finding(store, fact_id, writer)
                todo.append(f"fact:{fact_id}")
            told = _telling(store, list(findings.values()))
            _drop_untold(store, list(findings.values()))
            for episode_id in told:
                store.forget(writer, "episodes", episode_id)
                todo.append(f"episode:{episode_id}")
            forgotten += len(findings) + len(told)
    if forgotten:
        log.info("forgot %d memories and summaries made from a forgotten memory", forgotten)
    return forgotten


def _findings_citing(store: Store, ref: str) -> dict[int, str]:
    """The reflection's findings whose provenance names ``ref``: id -> text."""
    return {int(r["id"]): str(r["value"]) for r in store.rows(
        "SELECT id, value FROM facts f WHERE source = ? AND EXISTS ("
        " SELECT 1 FROM json_each(f.provenance) j WHERE j.value = ?) ORDER BY id",
        (REFLECTION, ref))}


def _forget_finding(store: Store, fact_id: int, writer: str) -> None:
    for row in store.rows("SELECT id FROM facts WHERE superseded_by = ?", (fact_id,)):
        store.update(writer, "facts", row["id"], {"superseded_by": None})
    store.forget(writer, "facts", fact_id)


def _telling(store: Store, texts: list[str]) -> list[int]:
    """The ``dmn`` episodes quoting one of these findings (a gist joins them,
    clipped at its end: matched on each one's start)."""
    ids: set[int] = set()
    for text in texts:
        ids.update(int(r[0]) for r in store.conn.execute(
            "SELECT id FROM episodes WHERE source = ? AND instr(gist, ?) > 0",
            (REFLECTION, text[:QUOTED])))
    return sorted(ids)


def _drop_untold(store: Store, texts: list[str]) -> None:
    """Take these findings out of the reflection's list of those not told yet."""
    untold = get_state(store, REFLECTION, UNTOLD)
    if isinstance(untold, list) and any(t in untold for t in texts):
        set_state(store, REFLECTION, UNTOLD, [t for t in untold if t not in texts])


def _latest_without(store: Store, ref: str) -> PortraitIn | None:
    """The latest portrait version less its lines citing ``ref``, if it cites
    ``ref`` and has other lines; else None."""
    latest = _portraits(store).latest()
    if latest is None or not any(ref in line.refs for line in latest.lines):
        return None
    kept = [line for line in latest.lines if ref not in line.refs]
    if not kept:
        return None
    return PortraitIn.model_validate({"lines": kept, "signature": latest.signature,
                                      "how": latest.how})


def _portraits(store: Store) -> PortraitService:
    return PortraitService(store)
