"""Rollback: put episodes and facts back as the write log says they were.

Every write of memory is in ``write_log`` (:mod:`runtime.store.database`): who, when,
the row before and after. This module reads it (:func:`log_entries`), works
out how to undo a stretch of it (:func:`plan`) and does so through the store
(:func:`apply`), so a rollback is itself logged (writer ``rollback``) and can
be rolled back in turn.

Two ways to choose what is undone:

- ``to=T``: every change to episodes and facts after ``T``, whoever made it.
  Each row goes back to its state at ``T`` (the ``before`` of its first change
  after ``T``): rows added since are removed, rows deleted since come back with
  their original ids, changed rows get their old values.
- ``writer=W, since=T``: only what ``W`` (a job, ``cli``, ``rollback``...)
  changed from ``T`` on. Each row goes back to its state before ``W``'s first
  change. A row someone else changed after ``W`` did is a **conflict**: it is
  reported and left as it is (undoing ``W`` would also undo the other change).

The unit is a row of ``episodes`` or ``facts``; an episode's citations
(``episode_citations``, a link table) go with their episode: they are put back
to the set the episode had (but for turns pruned since: the transcript is not
rolled back), and a conflict or a skip of the episode covers them.

What is never done, and reported instead (:class:`Skipped`):

- **seared** memories are never touched: a row whose current state or whose
  state to go back to is ``memory_level = 'seared'`` is left as it is (a seared
  fact a job reinforced, a fact made seared after a job wrote it, a seared
  episode a job added);
- **forgotten** rows cannot come back: :meth:`runtime.store.database.Store.forget`
  erased their content from the log too, so a row whose log entries carry the
  forgotten marker is skipped (it is gone, and stays gone; undoing its insert
  has nothing left to do);
- a change that would leave a reference dangling is **blocked**: removing a
  row another row still points at after the rollback (an episode a seared
  child's ``parent_id`` names, a fact a kept fact's ``superseded_by`` names), or
  putting back a row that points at one that will not be there.

**Privacy marks are never loosened** (:mod:`runtime.memories.privacy`): a row
put back keeps a ``sensitive`` mark it has now (or had when it was deleted)
even if it had none at the point rolled back to, and keeps the owner
(``person``) it has, unless it has none: a household memory may go back to
being a person's, a person's never becomes the household's or someone else's.
A mark may only be tightened: one cleared since is set again. The columns kept
so are named in the change (:attr:`Change.kept`).

Rows are compared and put back column by column, as the log recorded them; a
column added to a table after an entry was written is left as it is (a
restored row gets its default).

A plan is checked again when applied: if a row it changes is no longer as the
plan saw it, :class:`PlanOutdated` is raised and nothing changes. Vectors of the
rows touched are dropped (derived data); the indexer embeds them again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from runtime.store.database import WRITABLE, Row, Store

log = logging.getLogger(__name__)

WRITER = "rollback"
SEARED = "seared"

# The rows a rollback restores, and the link tables that go with them: the
# link's write-log ``row_id`` is the parent's id.
ROWS: tuple[str, ...] = ("episodes", "facts")
LINKS: dict[str, str] = {"episode_citations": "episodes"}
SCOPE: tuple[str, ...] = (*ROWS, *LINKS)
KIND_OF: dict[str, str] = {"episodes": "episode", "facts": "fact"}
# The privacy marks (runtime.memories.privacy), which a rollback only tightens.
SENSITIVE, PERSON = "sensitive", "person"
# The column by which a row points at another row of its own table.
_POINTER: dict[str, str] = {"episodes": "parent_id", "facts": "superseded_by"}
_CHUNK = 500

Unit = tuple[str, int]  # (table, row id)
Action = Literal["delete", "restore", "update", "relink"]
Reason = Literal["seared", "conflict", "forgotten", "blocked"]


class PlanOutdated(RuntimeError):
    """Memory changed between the plan and its application; nothing was changed."""


def _is_forgotten(data: Row | None) -> bool:
    return isinstance(data, dict) and data.get("forgotten") is True


@dataclass(frozen=True)
class LogEntry:
    id: int
    at: float
    writer: str
    op: str
    table: str
    row_id: int | None
    before: Row | None
    after: Row | None

    @property
    def forgotten(self) -> bool:
        """Its content was erased by a forget (only the row's id is left)."""
        return _is_forgotten(self.before) or _is_forgotten(self.after)

    @classmethod
    def of(cls, row: Row) -> LogEntry:
        return cls(id=int(row["id"]), at=float(row["at"]), writer=row["writer"], op=row["op"],
                   table=row["table_name"], row_id=row["row_id"],
                   before=_json(row["before"]), after=_json(row["after"]))


def _json(text: str | None) -> Row | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def _marks(items: Sequence[Any]) -> str:
    return ", ".join("?" for _ in items)


def log_entries(store: Store, writer: str | None = None, since: float | None = None,
                until: float | None = None, tables: Iterable[str] | None = None,
                limit: int = 200) -> list[LogEntry]:
    """The newest ``limit`` write-log entries matching (``since <= at <= until``),
    oldest first."""
    where: list[str] = []
    args: list[Any] = []
    if writer is not None:
        where.append("writer = ?")
        args.append(writer)
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    if until is not None:
        where.append("at <= ?")
        args.append(until)
    if tables is not None:
        names = list(tables)
        where.append(f"table_name IN ({_marks(names)})")
        args.extend(names)
    sql = "SELECT * FROM write_log"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = store.rows(sql + " ORDER BY id DESC LIMIT ?", [*args, max(0, limit)])
    return [LogEntry.of(r) for r in reversed(rows)]


@dataclass(frozen=True)
class Change:
    """What the rollback does to one row (and, for an episode, its citations).

    ``delete`` removes a row added since; ``restore`` puts a deleted row back
    with its id; ``update`` puts ``columns`` back to their old values;
    ``relink`` only changes an episode's citations."""

    table: str
    row_id: int
    action: Action
    current: Row | None
    target: Row | None
    columns: tuple[str, ...]
    cites: tuple[int, ...]        # the episode's citations now
    cite_add: tuple[int, ...]
    cite_remove: tuple[int, ...]
    undoes: tuple[int, ...]       # the write-log ids undone, oldest first
    kept: tuple[str, ...] = ()    # privacy marks left tighter than the target had them

    @property
    def ref(self) -> str:
        return f"{KIND_OF[self.table]}:{self.row_id}"

    @property
    def newest(self) -> int:
        return self.undoes[-1]


@dataclass(frozen=True)
class Skipped:
    """A row the rollback leaves as it is, and why."""

    table: str
    row_id: int
    reason: Reason
    detail: str
    by: str | None = None      # conflict: who changed it after
    at: float | None = None    # conflict: when

    @property
    def ref(self) -> str:
        return f"{KIND_OF[self.table]}:{self.row_id}"


@dataclass(frozen=True)
class Plan:
    to: float | None
    writer: str | None
    since: float | None
    changes: tuple[Change, ...]   # newest undone change first
    skipped: tuple[Skipped, ...]

    @property
    def empty(self) -> bool:
        return not self.changes


@dataclass(frozen=True)
class Applied:
    at: float                     # when the rollback started (its log entries are later)
    writer: str
    changes: int
    refs: tuple[str, ...]         # the rows touched, e.g. ("fact:12", "episode:3")
    log_ids: tuple[int, int] | None  # first and last write-log id it wrote


# -- planning -------------------------------------------------------------------

def plan(store: Store, *, to: float | None = None, writer: str | None = None,
         since: float | None = None) -> Plan:
    """How to undo every change after ``to``, or ``writer``'s changes from
    ``since`` on (all of them without ``since``). Reads only."""
    if to is not None and (writer is not None or since is not None):
        raise ValueError("roll back either to a time, or one writer's changes since a time")
    if to is None and writer is None:
        raise ValueError("say what to roll back: a time to go back to, or a writer")
    if writer is not None and not writer.strip():
        raise ValueError("the writer is empty")

    start = float("-inf") if since is None else since
    if to is not None:
        found = store.rows(
            f"SELECT DISTINCT table_name, row_id FROM write_log WHERE at > ?"
            f" AND table_name IN ({_marks(SCOPE)}) AND row_id IS NOT NULL", [to, *SCOPE])
    else:
        found = store.rows(
            f"SELECT DISTINCT table_name, row_id FROM write_log WHERE writer = ? AND at >= ?"
            f" AND table_name IN ({_marks(SCOPE)}) AND row_id IS NOT NULL",
            [writer, start, *SCOPE])
    units = sorted({(_parent(str(r["table_name"])), int(r["row_id"])) for r in found})
    history = _histories(store, units)
    current = _current_rows(store, units)
    cites_now = _current_cites(store, [i for t, i in units if t == "episodes"])

    changes: dict[Unit, Change] = {}
    skipped: list[Skipped] = []
    for unit in units:
        entries = history.get(unit, [])
        if to is not None:
            undone = [e for e in entries if e.at > to]
        else:
            undone = [e for e in entries if e.writer == writer and e.at >= start]
        if not undone:
            continue
        outcome = _unit_plan(unit, entries, undone[0].id, writer, current.get(unit),
                             cites_now.get(unit[1], set()) if unit[0] == "episodes" else set())
        if isinstance(outcome, Change):
            changes[unit] = outcome
        elif outcome is not None:
            skipped.append(outcome)

    _without_pruned_turns(store, changes)
    skipped.extend(_blocked(store, changes))
    ordered = sorted(changes.values(), key=lambda c: c.newest, reverse=True)
    skipped.sort(key=lambda s: (s.table, s.row_id))
    return Plan(to=to, writer=writer, since=since, changes=tuple(ordered),
                skipped=tuple(skipped))


def _unit_plan(unit: Unit, entries: Sequence[LogEntry], boundary: int, writer: str | None,
               row_c: Row | None, cites_c: set[int]) -> Change | Skipped | None:
    """What to do to one row (and its links) to undo its log from the id
    ``boundary`` on; None when it is already as it was. ``writer``: the one
    writer undone (others' later changes conflict), or None (undo all)."""
    table, row_id = unit
    later = [e for e in entries if e.id >= boundary]
    if any(e.forgotten for e in entries):
        gone = later[0].table == table and later[0].op == "insert"
        return Skipped(table, row_id, "forgotten",
                       "forgotten since: already gone" if gone else
                       "its content was erased by a forget: it cannot come back")
    row_t, kept = _no_looser(_target_row(table, later, row_c), _latest(table, entries, row_c))
    cites_t = _target_cites(table, entries, boundary, row_t, cites_c)
    columns = _diff(table, row_t, row_c)
    if columns is not None and not columns and cites_t == cites_c:
        return None
    if _level(row_t) == SEARED or _level(row_c) == SEARED:
        return Skipped(table, row_id, "seared", "never touched")
    if writer is not None:
        others = [e for e in later if e.writer != writer]
        if others:
            return Skipped(table, row_id, "conflict", f"changed after by {others[0].writer}",
                           by=others[0].writer, at=others[0].at)
    action: Action
    if row_t is None:
        action = "delete"  # its citations go with it (schema cascade)
    elif row_c is None:
        action = "restore"
    else:
        action = "update" if columns else "relink"
    return Change(
        table=table, row_id=row_id, action=action, current=row_c, target=row_t,
        columns=tuple(columns or ()) if action == "update" else (),
        cites=tuple(sorted(cites_c)),
        cite_add=tuple(sorted(cites_t - cites_c)) if action != "delete" else (),
        cite_remove=tuple(sorted(cites_c - cites_t)) if action in ("update", "relink") else (),
        undoes=tuple(e.id for e in later),
        kept=kept if action in ("restore", "update") else ())


def _without_pruned_turns(store: Store, changes: dict[Unit, Change]) -> None:
    """Leave out the citations to put back that name a turn no longer there (the
    janitor prunes the turns no episode cites, so an episode a rollback removed
    comes back, when undone, without the turns pruned since). In place."""
    wanted = sorted({t for c in changes.values() for t in c.cite_add})
    there: set[int] = set()
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start:start + _CHUNK]
        there.update(int(r["id"]) for r in store.rows(
            f"SELECT id FROM transcript WHERE id IN ({_marks(chunk)})", chunk))
    for unit, change in list(changes.items()):
        kept = tuple(t for t in change.cite_add if t in there)
        if kept == change.cite_add:
            continue
        if change.action == "relink" and not kept and not change.cite_remove:
            del changes[unit]  # nothing left to do
        else:
            changes[unit] = replace(change, cite_add=kept)


def _parent(table: str) -> str:
    return LINKS.get(table, table)


def _histories(store: Store, units: Sequence[Unit]) -> dict[Unit, list[LogEntry]]:
    """Every write-log entry of each unit (its row, and its links), oldest first."""
    out: dict[Unit, list[LogEntry]] = {}
    for table in ROWS:
        ids = [i for t, i in units if t == table]
        names = [table, *(link for link, parent in LINKS.items() if parent == table)]
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start:start + _CHUNK]
            for row in store.rows(
                    f"SELECT * FROM write_log WHERE table_name IN ({_marks(names)})"
                    f" AND row_id IN ({_marks(chunk)}) ORDER BY id", [*names, *chunk]):
                out.setdefault((table, int(row["row_id"])), []).append(LogEntry.of(row))
    return out


def _current_rows(store: Store, units: Sequence[Unit]) -> dict[Unit, Row]:
    out: dict[Unit, Row] = {}
    for table in ROWS:
        ids = [i for t, i in units if t == table]
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start:start + _CHUNK]
            for row in store.rows(f"SELECT * FROM {table} WHERE id IN ({_marks(chunk)})",
                                  chunk):
                out[(table, int(row["id"]))] = row
    return out


def _current_cites(store: Store, episode_ids: Sequence[int]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for start in range(0, len(episode_ids), _CHUNK):
        chunk = list(episode_ids[start:start + _CHUNK])
        for row in store.rows(
                "SELECT episode_id, transcript_id FROM episode_citations"
                f" WHERE episode_id IN ({_marks(chunk)})", chunk):
            out.setdefault(int(row["episode_id"]), set()).add(int(row["transcript_id"]))
    return out


def _target_row(table: str, later: Sequence[LogEntry], current: Row | None) -> Row | None:
    """The row as it was just before ``later`` (its own changes, oldest first)."""
    for entry in later:
        if entry.table == table:
            return None if entry.op == "insert" else entry.before
    return current


def _latest(table: str, entries: Sequence[LogEntry], current: Row | None) -> Row | None:
    """The row as it is now or, deleted, as it was when it was deleted."""
    if current is not None:
        return current
    for entry in reversed(entries):
        if entry.table == table:
            return entry.before if entry.op == "delete" else entry.after
    return None


def _no_looser(target: Row | None, latest: Row | None) -> tuple[Row | None, tuple[str, ...]]:
    """``target`` with privacy marks no looser than ``latest``'s: a sensitive
    mark is never cleared, an owner never removed or changed (a household
    memory, person None, may become a person's). Also the marks so kept."""
    if target is None or latest is None:
        return target, ()
    out = dict(target)
    kept: list[str] = []
    if SENSITIVE in out and latest.get(SENSITIVE) and not out[SENSITIVE]:
        out[SENSITIVE] = latest[SENSITIVE]
        kept.append(SENSITIVE)
    if PERSON in out and latest.get(PERSON) is not None and out[PERSON] != latest[PERSON]:
        out[PERSON] = latest[PERSON]
        kept.append(PERSON)
    return out, tuple(kept)


def _citation(entry: LogEntry) -> int | None:
    data = entry.after if entry.op == "insert" else entry.before
    value = None if data is None else data.get("transcript_id")
    return None if value is None else int(value)


def _target_cites(table: str, entries: Sequence[LogEntry], boundary: int,
                  row_t: Row | None, current: set[int]) -> set[int]:
    """An episode's citations as they were at the log id ``boundary``: replayed
    from its log (a delete or insert of the episode starts from none; the
    schema cascade that removes them is not logged on its own)."""
    if table != "episodes":
        return set()
    later = [e for e in entries if e.id >= boundary]
    if not any(e.table != table or e.op in ("insert", "delete") for e in later):
        return set(current)  # nothing after the boundary touched them
    if row_t is None:
        return set()
    cites: set[int] = set()
    for entry in entries:
        if entry.id >= boundary:
            break
        if entry.table == table:
            if entry.op in ("insert", "delete"):
                cites.clear()
            continue
        turn = _citation(entry)
        if turn is None:
            continue
        if entry.op == "insert":
            cites.add(turn)
        elif entry.op == "delete":
            cites.discard(turn)
    return cites


def _diff(table: str, target: Row | None, current: Row | None) -> list[str] | None:
    """The columns to put back (empty: equal); None when one side is absent
    (and the other not)."""
    if target is None and current is None:
        return []
    if target is None or current is None:
        return None
    writable = WRITABLE[table]
    return [c for c in target if c in writable and c in current and current[c] != target[c]]


def _level(row: Row | None) -> str | None:
    return None if row is None else row.get("memory_level")


def _blocked(store: Store, changes: dict[Unit, Change]) -> list[Skipped]:
    """Take out, until none is left, the changes that would leave a reference
    dangling; return them as skipped. ``changes`` is trimmed in place."""
    exists: dict[Unit, bool] = {}

    def there_now(unit: Unit) -> bool:
        if unit not in exists:
            exists[unit] = store.scalar(
                f"SELECT 1 FROM {unit[0]} WHERE id = ?", (unit[1],)) is not None
        return exists[unit]

    def there_after(unit: Unit) -> bool:
        change = changes.get(unit)
        if change is not None:
            return change.action != "delete"
        return there_now(unit)

    def points_at(change: Change) -> Any:
        if change.action == "delete":
            return None
        row = change.current if change.action == "relink" else change.target
        return None if row is None else row.get(_POINTER[change.table])

    out: list[Skipped] = []
    while True:
        blocked: dict[Unit, str] = {}
        for unit, change in changes.items():
            table, row_id = unit
            kind = KIND_OF[table]
            if change.action in ("restore", "update"):
                pointer = points_at(change)
                if pointer is not None and not there_after((table, int(pointer))):
                    blocked[unit] = f"it would point at {kind}:{pointer}, which would not be there"
                    continue
                fact_kind = (change.target or {}).get("kind")
                if table == "facts" and fact_kind is not None and store.scalar(
                        "SELECT 1 FROM fact_kinds WHERE name = ?", (fact_kind,)) is None:
                    blocked[unit] = f"its kind {fact_kind!r} is no longer configured"
                    continue
            if change.action == "delete":
                column = _POINTER[table]
                referrers = {int(r["id"]) for r in store.rows(
                    f"SELECT id FROM {table} WHERE {column} = ?", (row_id,))}
                referrers |= {i for (t, i), c in changes.items()
                              if t == table and points_at(c) == row_id}
                for other in sorted(referrers - {row_id}):
                    change_of_other = changes.get((table, other))
                    still = (change_of_other is None
                             or points_at(change_of_other) == row_id)
                    if still:
                        blocked[unit] = f"{kind}:{other} would still point at it"
                        break
        if not blocked:
            return out
        for unit, why in blocked.items():
            del changes[unit]
            out.append(Skipped(unit[0], unit[1], "blocked", why))


# -- applying ---------------------------------------------------------------------

def apply(store: Store, plan: Plan, writer: str = WRITER) -> Applied:
    """Carry out ``plan`` in one transaction, through the store's write path
    (logged as ``writer``). Raises :class:`PlanOutdated`, changing nothing, if a
    row it changes is no longer as the plan saw it."""
    at = store.clock.now()
    if plan.empty:
        return Applied(at, writer, 0, (), None)
    with store.write_transaction():
        # References between rows being put back are checked at commit, not
        # after each statement (a restored fact may name one restored later).
        store.conn.execute("PRAGMA defer_foreign_keys = ON")
        for change in plan.changes:
            _check_unchanged(store, change)
        first = int(store.scalar("SELECT coalesce(max(id), 0) FROM write_log")) + 1
        for change in plan.changes:
            if change.action == "restore":
                assert change.target is not None
                _restore(store, writer, change.table, change.target)
            elif change.action == "update":
                assert change.target is not None
                store.update(writer, change.table, change.row_id,
                             {c: change.target[c] for c in change.columns})
            for turn in change.cite_add:
                store.insert(writer, "episode_citations",
                             {"episode_id": change.row_id, "transcript_id": turn})
            for turn in change.cite_remove:
                _unlink(store, writer, change.row_id, turn)
        # Deletes last: by now no row that stays points at one that goes.
        for change in plan.changes:
            if change.action == "delete":
                store.delete(writer, change.table, change.row_id)
        for change in plan.changes:  # derived data: the indexer embeds them again
            store.conn.execute("DELETE FROM vectors WHERE kind = ? AND item_id = ?",
                               (KIND_OF[change.table], change.row_id))
        last = int(store.scalar("SELECT coalesce(max(id), 0) FROM write_log"))
    log.info("rollback applied: %d changes, %d skipped", len(plan.changes), len(plan.skipped))
    return Applied(at, writer, len(plan.changes), tuple(c.ref for c in plan.changes),
                   (first, last) if last >= first else None)


def _check_unchanged(store: Store, change: Change) -> None:
    now = store.get(change.table, change.row_id)
    cites = tuple(r[0] for r in store.conn.execute(
        "SELECT transcript_id FROM episode_citations WHERE episode_id = ?"
        " ORDER BY transcript_id", (change.row_id,))) if change.table == "episodes" else ()
    if now != change.current or cites != change.cites:
        raise PlanOutdated(f"{change.ref} changed since the plan was made; nothing was "
                           "changed: plan again")


def _restore(store: Store, writer: str, table: str, row: Row) -> None:
    """Put a deleted row back with its original id, logged as an insert.

    :meth:`Store.insert` gives a row a fresh id; a rollback needs the old one
    (the ids others point at, and that the log names), so it is written here,
    with the store's own log entry, inside the caller's transaction."""
    values = {c: v for c, v in row.items() if c == "id" or c in WRITABLE[table]}
    cols = list(values)
    store.conn.execute(
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({_marks(cols)})",
        [values[c] for c in cols])
    row_id = int(values["id"])
    store._log(writer, "insert", table, row_id, None, store.get(table, row_id))


def _unlink(store: Store, writer: str, episode_id: int, turn_id: int) -> None:
    """Remove one citation of an episode, logged as a delete of the link (the
    store's write path has no delete for link tables: they go with their parent)."""
    store.conn.execute(
        "DELETE FROM episode_citations WHERE episode_id = ? AND transcript_id = ?",
        (episode_id, turn_id))
    if store.conn.changes():
        link = {"episode_id": episode_id, "transcript_id": turn_id}
        store._log(writer, "delete", "episode_citations", episode_id, link, None)
