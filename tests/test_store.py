import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest

from runtime.clock import ManualClock
from runtime.config import CONFIG_DIR
from runtime.fact_kinds import FactKinds
from runtime.migrations import MIGRATIONS
from runtime.store import Store, StoreError

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")


@pytest.fixture
def store(tmp_path: Path) -> Store:
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


def test_unknown_migration_in_database_is_refused(tmp_path: Path) -> None:
    s = Store(tmp_path / "m.db", KINDS)
    s.conn.execute("INSERT INTO schema_migrations VALUES ('9999_future', 0)")
    s.close()
    with pytest.raises(RuntimeError, match="newer Reverie"):
        Store(tmp_path / "m.db", KINDS)


def test_pragmas_for_litestream(store: Store) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 1  # NORMAL
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
    from runtime.fact_kinds import FactKinds
    from runtime.store import Store
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
