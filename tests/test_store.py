import json
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import apsw
import pytest

from runtime.config import CONFIG_DIR
from runtime.store.database import Store, StoreError
from runtime.store.fact_kinds import FactKinds
from runtime.store.migrations import MIGRATIONS, migrate
from runtime.time.clock import ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "r.db", KINDS, clock=ManualClock(1000.0))
    yield s
    s.close()


def test_migrations_from_empty_are_recorded_once(tmp_path: Path) -> None:
    first = Store(tmp_path / "m.db", KINDS)
    assert first.applied_migrations == [name for name, _ in MIGRATIONS]
    recorded = [r[0] for r in first.conn.execute(
        "SELECT name FROM schema_migrations ORDER BY name")]
    assert recorded == sorted(name for name, _ in MIGRATIONS)
    first.close()
    again = Store(tmp_path / "m.db", KINDS)
    assert again.applied_migrations == []
    again.close()


def _open_after(path: str, barrier: Any) -> list[str]:
    barrier.wait(timeout=60)
    s = Store(Path(path), KINDS)
    try:
        return s.applied_migrations
    finally:
        s.close()


def test_processes_opening_a_new_store_at_once_apply_each_migration_once(
        tmp_path: Path) -> None:
    """The actors start side by side and each opens the store: every process
    opens it, and between them each migration was applied exactly once."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Manager().Barrier(4)
    with ProcessPoolExecutor(4, mp_context=ctx) as pool:
        opened = [f.result(timeout=120) for f in [
            pool.submit(_open_after, str(tmp_path / "race.db"), barrier) for _ in range(4)]]
    applied = sorted(name for names in opened for name in names)
    assert applied == sorted(name for name, _ in MIGRATIONS)


def test_unknown_migration_in_database_is_refused(tmp_path: Path) -> None:
    s = Store(tmp_path / "m.db", KINDS)
    s.conn.execute("INSERT INTO schema_migrations VALUES ('9999_future', 0)")
    s.close()
    with pytest.raises(RuntimeError, match="newer Reverie"):
        Store(tmp_path / "m.db", KINDS)


def test_synchronous_is_configurable_and_checked(tmp_path: Path) -> None:
    assert Store(tmp_path / "n.db", KINDS, synchronous="NORMAL").pragma("synchronous") == 1
    with pytest.raises(StoreError, match="NORMAL or FULL"):
        Store(tmp_path / "o.db", KINDS, synchronous="OFF")


def test_pragmas_for_litestream(store: Store) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL: a commit is on disk (power cuts)
    assert store.pragma("foreign_keys") == 1
    assert store.pragma("busy_timeout") == 5000
    assert (store.path.parent / (store.path.name + "-wal")).exists()


def _turn(**kw: object) -> dict[str, object]:
    return {"channel": "kitchen", "source": "user", "role": "user",
            "content": "hello", "created_at": 1.0, **kw}


def test_write_log_records_writer_before_and_after(store: Store) -> None:
    row_id = store.insert("tester", "transcript", _turn())
    store.update("editor", "transcript", row_id, {"content": "hello there"})
    store.delete("janitor", "transcript", row_id)
    log = store.rows("SELECT * FROM write_log WHERE table_name = 'transcript' ORDER BY id")
    assert [(r["writer"], r["op"]) for r in log] == [
        ("tester", "insert"), ("editor", "update"), ("janitor", "delete")]
    assert log[0]["before"] is None and json.loads(log[0]["after"])["content"] == "hello"
    assert json.loads(log[1]["before"])["content"] == "hello"
    assert json.loads(log[1]["after"])["content"] == "hello there"
    assert json.loads(log[2]["before"])["content"] == "hello there" and log[2]["after"] is None
    assert all(r["at"] == 1000.0 for r in log)


def test_failed_write_leaves_no_log_row(store: Store) -> None:
    with pytest.raises(apsw.ConstraintError):
        store.insert("tester", "transcript", _turn(role="wizard"))
    assert store.scalar("SELECT count(*) FROM write_log") == 0
    assert store.scalar("SELECT count(*) FROM transcript") == 0


def test_write_path_refuses_unknown_tables_and_columns(store: Store) -> None:
    with pytest.raises(StoreError):
        store.insert("x", "write_log", {"writer": "x"})
    with pytest.raises(StoreError, match="unknown columns"):
        store.insert("x", "transcript", {**_turn(), "content; DROP TABLE facts": 1})


def _fact(kind: str) -> dict[str, object]:
    return {"kind": kind, "subject": "Ana", "key": "lives_in", "value": "Porto",
            "source": "user", "valid_from": 1.0, "recorded_at": 1.0, "confirmed_at": 1.0}


def test_unknown_fact_kind_rejected_by_the_database_itself(store: Store) -> None:
    store.insert("graph", "facts", _fact("place"))
    with pytest.raises(apsw.ConstraintError):
        store.insert("graph", "facts", _fact("gossip"))
    assert store.scalar("SELECT count(*) FROM facts") == 1


def test_fact_kinds_table_follows_configuration(tmp_path: Path) -> None:
    s = Store(tmp_path / "k.db", KINDS)
    s.insert("graph", "facts", _fact("discovery"))
    s.close()
    fewer = FactKinds({n: KINDS.policy(n) for n in ("place", "user_specific")})
    s = Store(tmp_path / "k.db", fewer)
    names = {r[0] for r in s.conn.execute("SELECT name FROM fact_kinds")}
    # discovery is retired but kept while a fact still uses it: history stays
    assert names == {"place", "user_specific", "discovery"}
    s.close()


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from runtime.config import CONFIG_DIR
    from runtime.store.fact_kinds import FactKinds
    from runtime.store.database import Store
    s = Store(Path(sys.argv[1]), FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))
    i = 0
    while True:
        row = s.insert("writer", "transcript", {"channel": "c", "source": "user",
                       "role": "user", "content": f"turn {i}", "created_at": float(i)})
        print(row, flush=True)   # acknowledged only after the commit returned
        i += 1
""")


def test_kill_9_loses_no_acknowledged_write(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked: list[int] = []
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    s = Store(db, KINDS)
    stored = {r[0] for r in s.conn.execute("SELECT id FROM transcript")}
    logged = {r[0] for r in s.conn.execute(
        "SELECT row_id FROM write_log WHERE table_name = 'transcript'")}
    s.close()
    assert set(acked) <= stored
    assert stored == logged


# -- owner-only files ---------------------------------------------------------------

def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_data_dir_and_database_files_are_owner_only(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        s = Store(tmp_path / "data" / "r.db", KINDS)
        s.insert("tester", "transcript", _turn())
        files = [s.path, s.path.with_name("r.db-wal"), s.path.with_name("r.db-shm")]
        assert _mode(s.path.parent) == 0o700
        assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
        s.close()
    finally:
        os.umask(old)


def test_files_left_readable_by_an_older_version_are_narrowed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = Store(data / "r.db", KINDS)
    old.insert("tester", "transcript", _turn())
    files = [old.path, old.path.with_name("r.db-wal"), old.path.with_name("r.db-shm")]
    os.chmod(data, 0o755)
    for f in files:
        os.chmod(f, 0o644)
    again = Store(data / "r.db", KINDS)  # a second connection, the first still open
    assert _mode(data) == 0o700
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
    again.close()
    old.close()


def test_secure_delete_is_on(store: Store) -> None:
    assert store.pragma("secure_delete") == 1


# -- ids are never reused --------------------------------------------------------------

def test_deleted_max_id_is_not_reused(store: Store) -> None:
    for table, values in (("transcript", _turn()), ("facts", _fact("place"))):
        first = store.insert("t", table, values)
        store.delete("t", table, first)
        assert store.insert("t", table, values) == first + 1, table
    episode = {"channel": "c", "source": "user", "level": 0, "gist": "g",
               "last_relevant_at": 1.0, "created_at": 1.0}
    first = store.insert("t", "episodes", episode)
    store.delete("t", "episodes", first)
    assert store.insert("t", "episodes", episode) == first + 1


def _old_database(path: Path) -> apsw.Connection:
    """A database as the version before 0007 left it."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA foreign_keys = ON")
    assert MIGRATIONS[6][0] == "0007_ids_never_reused"
    migrate(conn, MIGRATIONS[:6])
    return conn


def _old_insert(conn: apsw.Connection, table: str, values: dict[str, object]) -> int:
    """What the old Store.insert did: the row and its write-log entry."""
    cols = list(values)
    conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES"
                 f" ({', '.join('?' for _ in cols)})", list(values.values()))
    row_id = conn.last_insert_rowid()
    conn.execute("INSERT INTO write_log (at, writer, op, table_name, row_id, after)"
                 " VALUES (1, 'old', 'insert', ?, ?, '{}')", (table, row_id))
    return row_id


def _old_delete(conn: apsw.Connection, table: str, row_id: int) -> None:
    conn.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
    conn.execute("INSERT INTO write_log (at, writer, op, table_name, row_id)"
                 " VALUES (1, 'old', 'delete', ?, ?)", (table, row_id))


def test_migration_0007_keeps_rows_links_and_triggers(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = _old_database(db)
    conn.execute("INSERT INTO fact_kinds (name) VALUES ('place')")
    t1 = _old_insert(conn, "transcript", _turn(content="the locker code is 4711"))
    t2 = _old_insert(conn, "transcript", _turn(content="pizza on friday", request_id="r-1"))
    t3 = _old_insert(conn, "transcript", _turn(content="to be deleted"))
    call = _old_insert(conn, "tool_calls", {"transcript_id": t1, "name": "lock",
                                            "created_at": 1.0})
    ep = {"channel": "c", "source": "user", "level": 0, "last_relevant_at": 1.0,
          "created_at": 1.0}
    leaf = _old_insert(conn, "episodes", {**ep, "gist": "talked about the locker"})
    top = _old_insert(conn, "episodes", {**ep, "gist": "a week of chores", "level": 1})
    conn.execute("UPDATE episodes SET parent_id = ? WHERE id = ?", (top, leaf))
    conn.execute("INSERT INTO episode_citations VALUES (?, ?)", (leaf, t1))
    old_fact = _old_insert(conn, "facts", {**_fact("place"), "value": "Porto"})
    new_fact = _old_insert(conn, "facts", {**_fact("place"), "value": "Lisbon"})
    conn.execute("UPDATE facts SET valid_to = 2, superseded_by = ? WHERE id = ?",
                 (new_fact, old_fact))
    gone_fact = _old_insert(conn, "facts", {**_fact("place"), "key": "works_in"})
    conn.execute("INSERT INTO vectors (kind, item_id, model, vec) VALUES"
                 " ('turn', ?, 'm', x'00'), ('episode', ?, 'm', x'00'), ('fact', ?, 'm', x'00')",
                 (t2, top, new_fact))
    _old_delete(conn, "transcript", t3)  # the max ids, deleted: the old schema reuses them
    _old_delete(conn, "facts", gone_fact)
    conn.close()

    s = Store(db, KINDS)
    assert s.applied_migrations[0] == "0007_ids_never_reused"
    assert s.scalar("PRAGMA foreign_keys") == 1
    assert list(s.conn.execute("PRAGMA foreign_key_check")) == []
    assert s.scalar("PRAGMA integrity_check") == "ok"
    for fts in ("transcript_fts", "episodes_fts", "facts_fts"):
        s.conn.execute(f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')")
    # rows and their ids are kept; the new column defaults
    assert [(r["id"], r["content"], r["disabled"]) for r in s.rows(
        "SELECT * FROM transcript ORDER BY id")] == [
        (t1, "the locker code is 4711", 0), (t2, "pizza on friday", 0)]
    assert s.get("episodes", leaf)["parent_id"] == top  # type: ignore[index]
    assert s.get("facts", old_fact)["superseded_by"] == new_fact  # type: ignore[index]
    # ids deleted before the migration are not handed out again
    assert s.insert("t", "transcript", _turn(content="a new turn")) == t3 + 1
    assert s.insert("t", "facts", {**_fact("place"), "key": "born_in"}) == gone_fact + 1
    assert s.insert("t", "episodes", {**ep, "gist": "new"}) == top + 1
    # FTS still follows the rebuilt tables, old rows and new
    hits = s.rows("SELECT rowid FROM transcript_fts WHERE transcript_fts MATCH 'locker'")
    assert hits == [{"rowid": t1}]
    assert s.scalar("SELECT count(*) FROM transcript_fts WHERE transcript_fts MATCH 'new'") == 1
    # the unique request id survives
    with pytest.raises(apsw.ConstraintError):
        s.insert("t", "transcript", _turn(request_id="r-1"))
    # foreign keys are enforced on the rebuilt tables
    with pytest.raises(apsw.ConstraintError):
        s.update("t", "facts", old_fact, {"superseded_by": 999})
    # and their actions and the triggers still fire
    s.delete("t", "transcript", t1)
    assert s.scalar("SELECT count(*) FROM tool_calls WHERE id = ?", (call,)) == 0
    assert s.scalar("SELECT count(*) FROM transcript_fts WHERE transcript_fts MATCH 'locker'"
                    ) == 0
    s.delete("t", "transcript", t2)
    s.delete("t", "episodes", top)
    with pytest.raises(apsw.ConstraintError):  # still superseding old_fact
        s.delete("t", "facts", new_fact)
    s.update("t", "facts", old_fact, {"superseded_by": None})
    s.delete("t", "facts", new_fact)
    assert s.scalar("SELECT count(*) FROM vectors") == 0
    assert s.get("episodes", leaf)["parent_id"] is None  # type: ignore[index]
    s.delete("t", "episodes", leaf)
    assert s.scalar("SELECT count(*) FROM episode_citations") == 0
    s.close()


def test_fresh_and_migrated_schemas_are_the_same(tmp_path: Path) -> None:
    _old_database(tmp_path / "old.db").close()
    migrated, fresh = Store(tmp_path / "old.db", KINDS), Store(tmp_path / "new.db", KINDS)
    sql = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    assert migrated.rows(sql) == fresh.rows(sql)
    migrated.close()
    fresh.close()


# -- transactions that write ---------------------------------------------------------

def test_write_transaction_nests_and_rolls_back(store: Store) -> None:
    with pytest.raises(RuntimeError, match="inner"), store.write_transaction():
        store.insert("t", "transcript", _turn(content="outer"))
        try:
            with store.write_transaction():
                store.insert("t", "transcript", _turn(content="inner"))
                raise RuntimeError("inner")
        finally:
            assert store.scalar("SELECT count(*) FROM transcript") == 1  # savepoint undone
    assert store.scalar("SELECT count(*) FROM transcript") == 0
    assert not store.conn.in_transaction


def test_write_transaction_takes_the_write_lock_first(tmp_path: Path) -> None:
    a = Store(tmp_path / "w.db", KINDS, busy_timeout_ms=0)
    b = Store(tmp_path / "w.db", KINDS, busy_timeout_ms=0)
    with a.write_transaction():
        with pytest.raises(apsw.BusyError):  # before any write: the lock is already held
            with b.write_transaction():
                pass
    a.close()
    b.close()


HAMMER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from runtime.config import CONFIG_DIR
    from runtime.store.fact_kinds import FactKinds
    from runtime.memories.facts import FactIn, GraphService
    from runtime.memories.profiles import MemoryProfiles
    from runtime.store.database import Store
    from runtime.memories.transcript import TranscriptService, TurnIn
    kinds = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
    profiles = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
    store = Store(Path(sys.argv[1]), kinds, busy_timeout_ms=20000)
    transcript = TranscriptService(store, profiles)
    graph = GraphService(store, kinds, profiles)
    sys.stdin.readline()  # start together
    n = int(sys.argv[2])
    for i in range(n):
        transcript.append(TurnIn(channel="c", source="user", content=f"turn {i}",
                                 request_id=f"req-{i}"))
    for i in range(n):
        graph.add(FactIn(kind="place", subject="Ana", key=f"k{i % 7}", value=f"v{i % 3}"))
    print("done", flush=True)
""")


def test_two_processes_hammering_one_file(tmp_path: Path) -> None:
    """Both processes append the same request ids and write the same facts: every
    read-then-write must serialise (no BusyError, no duplicate, no unique clash)."""
    db, n = tmp_path / "shared.db", 500
    Store(db, KINDS).close()
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, str(db), str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outcomes = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outcomes):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "done"
    s = Store(db, KINDS)
    assert s.scalar("SELECT count(*) FROM transcript") == n
    assert s.scalar("SELECT count(DISTINCT request_id) FROM transcript") == n
    current = s.rows("SELECT subject, key, count(*) AS n FROM facts WHERE valid_to IS NULL"
                     " GROUP BY subject, key")
    assert len(current) == 7 and all(r["n"] == 1 for r in current)
    s.close()


def test_keyed_tables_are_inserted_and_logged_never_touched_by_id(store: Store) -> None:
    episode = store.insert("t", "episodes", {
        "channel": "c", "source": "user", "level": 0, "gist": "g",
        "last_relevant_at": 1.0, "created_at": 1.0})
    link = {"episode_id": episode, "transcript_id": 7}
    assert store.insert("distiller", "episode_citations", link) == episode
    logged = store.row("SELECT * FROM write_log WHERE table_name = 'episode_citations'")
    assert logged is not None and logged["writer"] == "distiller"
    assert (logged["row_id"], json.loads(logged["after"])) == (episode, link)
    for touch in (lambda: store.get("episode_citations", episode),
                  lambda: store.update("t", "episode_citations", episode, {"transcript_id": 8}),
                  lambda: store.delete("t", "episode_citations", episode),
                  lambda: store.forget("t", "episode_citations", episode)):
        with pytest.raises(StoreError, match="has no id"):
            touch()
