"""The SQLite store: one file through APSW.

Pragmas are set for a file that Litestream replicates beside us: WAL,
``busy_timeout``, ``synchronous`` (``store.synchronous``, default FULL) and
foreign keys on. With FULL every commit reaches the disk before it returns, so
an acknowledged turn survives a power cut, not only a crash (with NORMAL, a
WAL commit survives a killed process but the last ones can be lost when the
power goes); it costs one fsync per commit (0.25 ms here on a virtual disk,
more on an SD card), and writers batch. The one TRUNCATE checkpoint we
force is after a forget (:meth:`Store.reset_wal`), so that the WAL keeps no
frame of the forgotten row; where Litestream replicates the file it does not
wait for it (a TRUNCATE stalls while Litestream holds a read transaction) and
leaves the reset to the Replicator (``device.replicator``).
SQLite's own passive auto-checkpoint is left alone. ``secure_delete`` is on, so
the pages a delete frees are zeroed rather than left holding the old content.

The data directory is 0700 and the database, its WAL and shared-memory files
are 0600 whatever the umask (:mod:`runtime.store.files`).

Every write of memory goes through :meth:`Store.insert`, :meth:`Store.update`,
:meth:`Store.delete` or :meth:`Store.forget`, which record the change in
``write_log`` (writer, time, before and after) inside the same transaction as
the change itself. Rows removed by a schema cascade (a turn's tool calls, an
episode's citations) are covered by their parent's delete. Outside the write
log, on purpose: vectors (derived data, rebuilt from the rows at any time) and
the ``fact_kinds`` table (a copy of the configuration).

The write log itself is append-only (migration 0011, enforced by triggers): an
update may only erase a row's content in the shape :meth:`Store.forget` does,
and a delete is refused except inside :meth:`Store.expiring_write_log` (the
janitor's retention rule), which sets the connection's
``write_log_expiry_allowed()`` SQL function the delete trigger asks.

A transaction that will write starts with ``BEGIN IMMEDIATE``
(:meth:`Store.write_transaction`): several processes share one WAL file, and a
deferred transaction that read first cannot be upgraded to a writer once
another process has committed (SQLITE_BUSY, with no retry).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from device.replicator import WAL_RESET_DUE
from runtime.store.fact_kinds import FactKinds
from runtime.store.files import create_private, make_private, private_dir, write_private
from runtime.store.migrations import migrate
from runtime.time.clock import Clock, SystemClock

log = logging.getLogger(__name__)

Row = dict[str, Any]

# Tables writable through the generic write path, and their columns. Column
# names in SQL come only from here, never from callers' data.
WRITABLE: dict[str, frozenset[str]] = {
    "transcript": frozenset(
        "channel source role speaker content created_at lat lon accuracy_m place "
        "external_id citations memory request_id disabled sensitive".split()
    ),
    "compactions": frozenset("channel summary watermark created_at refs".split()),
    "tool_calls": frozenset("transcript_id name arguments result created_at".split()),
    "episodes": frozenset(
        "channel source level gist salience emotion memory_level weight started_at "
        "ended_at last_relevant_at created_at parent_id tombstoned_at disabled "
        "thread thread_what thread_opened_at thread_escalated_at thread_resolved_at "
        "thread_resolved_by sensitive person provenance".split()
    ),
    "facts": frozenset(
        "kind subject key value confidence source provenance valid_from valid_to "
        "recorded_at confirmed_at superseded_by disabled memory_level user_managed "
        "weight claims sensitive person".split()
    ),
    "episode_citations": frozenset("episode_id transcript_id".split()),
    "portraits": frozenset("created_at signature how lines".split()),
    "digests": frozenset("period key starts_at ends_at text refs how created_at".split()),
    "profile_items": frozenset(
        "field value norm scope severity status source created_at updated_at ended_at "
        "replaced_by".split()),
    "mood": frozenset("valence energy warmth why how through_turn created_at".split()),
}

# Tables without an ``id`` (WITHOUT ROWID links): their key columns. Their
# write-log rows carry the first key column as ``row_id`` and the whole key in
# ``after``.
KEYED: dict[str, tuple[str, ...]] = {
    "episode_citations": ("episode_id", "transcript_id"),
}

# The FTS5 index over each table's text, merged after a forget.
FTS_OF: dict[str, str] = {
    "transcript": "transcript_fts",
    "episodes": "episodes_fts",
    "facts": "facts_fts",
}
# ... and the FTS5 indexes over text derived from a table's rows (a turn's
# passages, migration 0021: its triggers delete them with the turn)
DERIVED_FTS_OF: dict[str, tuple[str, ...]] = {
    "transcript": ("passages_fts",),
}


class StoreError(RuntimeError):
    pass


class Store:
    def __init__(
        self,
        path: Path,
        fact_kinds: FactKinds,
        busy_timeout_ms: int = 5000,
        clock: Clock | None = None,
        synchronous: str = "FULL",
        replicated: bool = False,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        # Litestream replicates this file (``replica.url``): it owns the
        # checkpoints, and :meth:`reset_wal` does not wait for it.
        self.replicated = replicated
        private_dir(self.path.parent)
        # Created 0600 before SQLite opens it: SQLite gives the -wal and -shm
        # files the database file's mode.
        create_private(self.path)
        self.clock: Clock = clock or SystemClock()
        self.fact_kinds = fact_kinds
        self.conn = apsw.Connection(str(self.path))
        self.conn.setbusytimeout(busy_timeout_ms)
        mode = self._wal_mode(busy_timeout_ms)
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: could not switch to WAL (journal_mode={mode})")
        for suffix in ("-wal", "-shm"):  # left readable by an older version
            make_private(self.path.with_name(self.path.name + suffix))
        if synchronous not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.conn.execute("PRAGMA secure_delete = ON")
        # Asked by the write log's delete trigger (migration 0011).
        self._expiring_write_log = False

        def expiry_allowed(*_: object) -> int:
            return int(self._expiring_write_log)

        self.conn.create_scalar_function("write_log_expiry_allowed", expiry_allowed, 0)
        self.applied_migrations = migrate(self.conn)
        self._sync_fact_kinds()

    def _wal_mode(self, busy_timeout_ms: int) -> object:
        """Switch to WAL (persistent: a no-op once the file is in WAL mode).

        Processes that create the store at once (the actors start side by side)
        race for the switch, and SQLite answers the loser "busy" at once instead
        of waiting for it: it tries again until the busy timeout."""
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                return self.scalar("PRAGMA journal_mode = WAL")
            except apsw.BusyError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    # -- plumbing ---------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        """A transaction that will write: ``BEGIN IMMEDIATE``, or a savepoint
        when one is already open (it nests). Commits on success, rolls back on
        any exception.

        Taking the write lock first means a read inside it can never be
        followed by a write that fails because another process committed in
        between; waiting for the lock honours ``busy_timeout``."""
        if self.conn.in_transaction:
            with self.conn:
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:  # SQLite may have rolled back already
                self.conn.execute("ROLLBACK")
            raise

    @contextmanager
    def expiring_write_log(self) -> Iterator[None]:
        """Inside: write-log rows of transcript rows and episodes (and of what
        went with them by cascade) may be deleted. Only the janitor's retention
        rule uses it; everywhere else the log is append-only (migration 0011)."""
        if self._expiring_write_log:
            yield
            return
        self._expiring_write_log = True
        try:
            yield
        finally:
            self._expiring_write_log = False

    # Every transaction opened through the store writes (readers need none:
    # each read statement sees one snapshot), so they are all immediate.
    transaction = write_transaction

    def rows(self, sql: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
        cur = self.conn.cursor()
        cur.execute(sql, args)
        try:
            names = [d[0] for d in cur.getdescription()]
        except apsw.ExecutionCompleteError:
            return []
        return [dict(zip(names, r)) for r in cur]

    def row(self, sql: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> Row | None:
        found = self.rows(sql, args)
        return found[0] if found else None

    def scalar(self, sql: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        for r in self.conn.execute(sql, args):
            return r[0]
        return None

    def pragma(self, name: str) -> Any:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"bad pragma name {name!r}")
        return self.scalar(f"PRAGMA {name}")

    # -- the write path ---------------------------------------------------

    def _check(self, table: str, columns: Sequence[str]) -> None:
        allowed = WRITABLE.get(table)
        if allowed is None:
            raise StoreError(f"table {table!r} is not writable")
        bad = set(columns) - allowed
        if bad:
            raise StoreError(f"{table}: unknown columns {sorted(bad)}")

    def _check_by_id(self, table: str) -> None:
        self._check(table, [])
        if table in KEYED:
            raise StoreError(f"{table} has no id: rows are inserted, and go with their parent")

    def _log(self, writer: str, op: str, table: str, row_id: int,
             before: Row | None, after: Row | None) -> None:
        self.conn.execute(
            "INSERT INTO write_log (at, writer, op, table_name, row_id, before, after)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                self.clock.now(), writer, op, table, row_id,
                None if before is None else json.dumps(before, default=str),
                None if after is None else json.dumps(after, default=str),
            ),
        )

    def get(self, table: str, row_id: int) -> Row | None:
        self._check_by_id(table)
        return self.row(f"SELECT * FROM {table} WHERE id = ?", (row_id,))

    def insert(self, writer: str, table: str, values: Mapping[str, Any]) -> int:
        """Insert a row; return its id (for a keyed table: its first key column)."""
        self._check(table, list(values))
        cols = list(values)
        sql = (
            f"INSERT INTO {table} ({', '.join(cols)})"
            f" VALUES ({', '.join('?' for _ in cols)})"
        )
        with self.write_transaction():
            self.conn.execute(sql, [values[c] for c in cols])
            if table in KEYED:
                row_id = int(values[KEYED[table][0]])
                self._log(writer, "insert", table, row_id, None, dict(values))
            else:
                row_id = self.conn.last_insert_rowid()
                self._log(writer, "insert", table, row_id, None, {"id": row_id, **values})
        return row_id

    def update(self, writer: str, table: str, row_id: int, changes: Mapping[str, Any]) -> Row:
        self._check_by_id(table)
        self._check(table, list(changes))
        if not changes:
            raise StoreError("update with no changes")
        with self.write_transaction():
            before = self.get(table, row_id)
            if before is None:
                raise StoreError(f"{table}: no row {row_id}")
            sets = ", ".join(f"{c} = ?" for c in changes)
            self.conn.execute(
                f"UPDATE {table} SET {sets} WHERE id = ?", [*changes.values(), row_id]
            )
            after = self.get(table, row_id)
            self._log(writer, "update", table, row_id, before, after)
        assert after is not None
        return after

    def delete(self, writer: str, table: str, row_id: int) -> Row | None:
        """Delete a row; the write log keeps its content (see :meth:`forget`)."""
        self._check_by_id(table)
        with self.write_transaction():
            before = self._take(table, row_id)
            if before is None:
                return None
            self._log(writer, "delete", table, row_id, before, None)
        return before

    def forget(self, writer: str, table: str, row_id: int) -> Row | None:
        """Delete a row and its content everywhere the store kept it; return it.

        The write log keeps that the row existed and was deleted, when and by
        whom, but no content: the delete is logged with only the id, and the
        row's earlier log entries have their before/after replaced by the id
        too. The row's FTS index is merged ('optimize') so the deleted terms
        are not left behind in older segments, and ``secure_delete`` zeroes the
        freed pages. The merge rewrites the whole index: measured with
        25-word turns, about 3 ms at 1,000 turns, 30 ms at 10,000 and 0.2 s at
        100,000. Forgetting is rare and user-driven, so that is acceptable."""
        self._check_by_id(table)
        with self.write_transaction():
            before = self._take(table, row_id)
            if before is None:
                return None
            self.forget_history(table, row_id)
            self._log(writer, "delete", table, row_id, {"id": row_id, "forgotten": True},
                      None)
            for fts in (*([FTS_OF[table]] if table in FTS_OF else []),
                        *DERIVED_FTS_OF.get(table, ())):
                self.conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('optimize')")
        log.info("row forgotten", extra={"table": table, "row_id": row_id})
        return before

    def reset_wal(self) -> bool:
        """After a forget: checkpoint the whole WAL into the database file and
        truncate the WAL to zero bytes (``wal_checkpoint(TRUNCATE)``), so that
        the frames that held a forgotten row's content (its insert, the pages
        the forget rewrote) are in no file any more; the ``-shm`` file holds
        only the WAL's index (page and frame numbers, salts), never content,
        and is reset with it. True when the WAL was reset.

        The owner calls it once the forget has committed, before it answers
        (:func:`runtime.memories.refs.change`); inside a transaction it does
        nothing (a checkpoint cannot run there) and returns False. It waits up
        to the busy timeout for other connections' reads to end. Where
        Litestream replicates the file (``replicated``) it does not wait: its
        long read transaction makes a TRUNCATE wait the whole busy timeout and
        fail (measured: 2.0 s at 2,000 ms, WAL untouched); the attempt then
        only copies to the database file the frames Litestream has already
        read, like SQLite's passive auto-checkpoint, and leaves the marker
        ``device.replicator.WAL_RESET_DUE`` in the data directory: the
        Replicator stops Litestream, resets the WAL and starts it again within
        seconds (Litestream then takes a new snapshot; docs/edge.md)."""
        if self.conn.in_transaction:
            return False
        wait = 0 if self.replicated else self.busy_timeout_ms
        self.conn.setbusytimeout(wait)
        try:
            busy, frames, done = next(self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
        finally:
            self.conn.setbusytimeout(self.busy_timeout_ms)
        if busy:
            log.info("WAL not reset after a forget: another connection is reading",
                     extra={"frames": frames, "checkpointed": done,
                            "replicated": self.replicated})
            if self.replicated:  # the Replicator resets it, Litestream stopped
                write_private(self.path.parent / WAL_RESET_DUE, "")
        return not busy

    def forget_history(self, table: str, row_id: int) -> None:
        """Replace the content of every write-log entry of the row ``row_id`` of
        ``table`` with the marker ``{"id": row_id, "forgotten": true}`` (the one
        change to the log its trigger allows). :meth:`forget` does it for a row
        it deletes; :mod:`runtime.memories.derived` for a row deleted earlier whose
        content the log still holds."""
        gone = json.dumps({"id": row_id, "forgotten": True})
        with self.write_transaction():
            self.conn.execute(
                "UPDATE write_log SET"
                " before = CASE WHEN before IS NULL THEN NULL ELSE ? END,"
                " after = CASE WHEN after IS NULL THEN NULL ELSE ? END"
                " WHERE table_name = ? AND row_id = ?",
                (gone, gone, table, row_id),
            )

    def _take(self, table: str, row_id: int) -> Row | None:
        """Inside a write transaction: delete the row ``row_id`` of ``table``
        and return it as it was (None, and nothing deleted, when there is none).
        The caller logs the delete (:meth:`delete`, :meth:`forget`)."""
        before = self.get(table, row_id)
        if before is not None:
            self.conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
        return before

    def counts(self) -> dict[str, int]:
        """How much memory there is: transcript rows, live episodes, current facts,
        open threads (``reverie status`` shows them)."""
        return {
            "transcript": int(self.scalar("SELECT count(*) FROM transcript")),
            "episodes": int(self.scalar(
                "SELECT count(*) FROM episodes WHERE tombstoned_at IS NULL")),
            "facts": int(self.scalar(
                "SELECT count(*) FROM facts WHERE valid_to IS NULL AND disabled = 0")),
            "open_threads": int(self.scalar(  # runtime.memories.threads
                "SELECT count(*) FROM episodes WHERE thread IS NOT NULL AND"
                " thread_resolved_at IS NULL AND tombstoned_at IS NULL AND disabled = 0")),
            "vectors": int(self.scalar("SELECT count(*) FROM vectors")),
        }

    # -- vectors (derived data: not in the write log) ----------------------

    def put_vector(self, kind: str, item_id: int, model: str, vec: bytes) -> tuple[int, int | None]:
        """Store an item's vector under a fresh label; return (label, replaced label).

        Labels are never reused (AUTOINCREMENT), so an index cache that missed a
        delete can never answer with another item's vector."""
        old = self.scalar(
            "SELECT id FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
        if old is not None:
            self.conn.execute("DELETE FROM vectors WHERE id = ?", (old,))
        self.conn.execute(
            "INSERT INTO vectors (kind, item_id, model, vec) VALUES (?, ?, ?, ?)",
            (kind, item_id, model, vec),
        )
        return self.conn.last_insert_rowid(), old

    # -- fact kinds -------------------------------------------------------

    def _sync_fact_kinds(self) -> None:
        """Make the fact_kinds table equal the configured closed set.

        Kinds dropped from the configuration stay in the table only while
        facts still use them (history is never deleted); new writes of such a
        kind are still refused by the graph service."""
        names = self.fact_kinds.names
        with self.write_transaction():
            for name in names:
                system = int(self.fact_kinds.policy(name).system)
                self.conn.execute(
                    "INSERT INTO fact_kinds (name, system) VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET system = excluded.system",
                    (name, system),
                )
            placeholders = ", ".join("?" for _ in names)
            self.conn.execute(
                f"DELETE FROM fact_kinds WHERE name NOT IN ({placeholders})"
                " AND name NOT IN (SELECT DISTINCT kind FROM facts)",
                names,
            )
