"""What the files keep after a forget (issue 24, item 5).

- Without replication, once the forget has answered, no file of the data
  directory (the database, its ``-wal`` and ``-shm``) holds the forgotten
  bytes: the owner resets the WAL (``Store.reset_wal``), while another
  connection keeps the database open as the other actors do.
- With Litestream (the file replica), which holds a read transaction so the
  forget cannot reset the WAL itself, the Replicator resets it with Litestream
  stopped a moment; forgotten text leaves the data directory (the WAL,
  Litestream's local copies) and the replica within the configured retention,
  and the replica still restores to the live database.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import apsw
import pytest

from device.replicator import Replicator, forgotten_within_s, render_config
from runtime.config import CONFIG_DIR, load_settings
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Ref, Services, change
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.test_replicator import (
    caught_up,
    contents,
    integrity,
    replica_settings,
    replicators,  # noqa: F401  (the fixture)
    restored_copy,
    write_turns,
)
from tests.waiting import wait_for

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
SECRET = "qvz8812"  # a word no other row shares
README = Path(__file__).resolve().parent.parent / "README.md"


def holding(root: Path, secret: str = SECRET) -> list[str]:
    """Every file under ``root`` whose bytes contain ``secret``, read by another
    process (``grep``). Never by this one: it holds SQLite connections on the
    database, and closing any descriptor of a file drops every POSIX lock the
    process holds on it (SQLite's "how to corrupt" §2.2). Another process's
    connection (Litestream restarted after a forget) then believes itself
    alone and resets the ``-shm`` under ours: a test process died of SIGBUS so
    (a run beside two CPU hogs); alone, that process deletes the WAL our
    connection still writes to."""
    found = subprocess.run(["grep", "-rlaFs", "--", secret, str(root)],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode in (0, 1, 2), found.stderr  # 2: a file vanished while read
    return sorted(str(Path(line).relative_to(root)) for line in found.stdout.splitlines())


def plant(services: Services) -> list[Ref]:
    """A turn (with a tool call), an episode and a fact holding the secret,
    among rows that do not."""
    t, e, g = services.transcript, services.episodes, services.graph
    for i in range(30):
        t.append(TurnIn(channel="hall", source="user", content=f"an ordinary turn {i}"))
    turn = t.append(TurnIn(channel="hall", source="user", content=f"the code is {SECRET}"))
    t.add_tool_call(turn, "unlock", {"code": SECRET}, f"opened with {SECRET}")
    episode = e.add(EpisodeIn(channel="hall", source="user", cites=[turn],
                              gist=f"Ana said the code is {SECRET}"))
    fact, _ = g.add(FactIn(kind="user_specific", subject="locker", key="code", value=SECRET))
    # the turn last: forgetting it takes the episode citing it too (derived.py)
    return [Ref("episode", episode), Ref("fact", fact), Ref("turn", turn)]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def services(data_dir: Path) -> Iterator[Services]:
    store = Store(data_dir / "reverie.db", KINDS)
    # Another actor's connection: the database stays open beside the owner's,
    # so nothing but the forget itself can clean the WAL.
    other = apsw.Connection(str(store.path))
    yield Services(TranscriptService(store, PROFILES), EpisodeService(store, PROFILES),
                   GraphService(store, KINDS, PROFILES))
    other.close()
    store.close()


def test_once_a_forget_has_answered_no_file_of_the_data_directory_holds_it(
        services: Services, data_dir: Path) -> None:
    refs = plant(services)
    assert "reverie.db-wal" in holding(data_dir)  # the test can see it
    for ref in refs:
        change(services.owner(ref.kind), ref, "delete", "user")
        # (no checkpoint, no close: only what the forget itself did)
    assert holding(data_dir) == []
    wal = data_dir / "reverie.db-wal"
    assert wal.stat().st_size == 0


def test_inside_a_transaction_the_wal_is_left_to_the_outermost_caller(
        services: Services) -> None:
    store = services.transcript.store
    with store.write_transaction():
        assert store.reset_wal() is False


# -- with Litestream ------------------------------------------------------------------


def test_the_replica_retention_is_in_the_config_and_the_readme() -> None:
    settings = load_settings(env={}, overrides={"replica": {"url": "file:///tmp/r"}})
    text = render_config(settings)
    assert 'interval: "21600000ms"' in text and 'retention: "86400000ms"' in text
    hours = forgotten_within_s(settings) / 3600
    assert hours == 36
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert re.search(rf"forgotten text leaves the replica within {hours:g} hours", readme)


def test_forgotten_text_leaves_the_file_replica_within_its_retention(
        tmp_path: Path, replicators: Callable[..., Replicator]) -> None:  # noqa: F811
    settings = replica_settings(tmp_path, snapshot_interval_s=1, retention_s=2)
    store = Store(settings.store.path, KINDS, replicated=True)
    rep = replicators(settings)
    rep.start()
    assert wait_for(lambda: rep.status()["last_sync_at"] is not None, 30)
    services = Services(TranscriptService(store, PROFILES), EpisodeService(store, PROFILES),
                        GraphService(store, KINDS, PROFILES))
    # A burst first (a consolidation run, an import): the WAL grows past
    # Litestream's checkpoint threshold, so the secret's frames lie far into
    # it, beyond what the writes of the next minutes overwrite.
    with store.write_transaction():
        for i in range(800):
            services.transcript.append(TurnIn(channel="hall", source="user",
                                              content=f"filler {i} " + "x" * 3000))
    refs = plant(services)
    assert caught_up(rep, time.time(), 60)
    replica, data = tmp_path / "replica", settings.store.resolved_dir
    assert holding(replica)  # it was replicated
    assert "reverie.db-wal" in holding(data)

    for ref in refs:
        change(services.owner(ref.kind), ref, "delete", "user")
    # The household goes on writing (retention drops a snapshot only once a
    # newer one exists, and a snapshot needs a new transaction).
    stop = threading.Event()

    def write() -> None:
        with Store(settings.store.path, KINDS, replicated=True) as writer:
            while not stop.is_set():
                write_turns(writer, "later", 1)
                stop.wait(0.3)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        # The data directory (its WAL, Litestream's local copies) and the replica.
        gone = wait_for(lambda: not holding(replica) and not holding(data), 120)
    finally:
        stop.set()
        writer.join()
    assert gone, (holding(replica), holding(data))
    assert rep.status()["restarts"] == 0 and rep.status()["gaps"] == []

    # Replication is still correct: the replica restores to what the store holds.
    assert caught_up(rep, time.time(), 60)
    expected = {r["content"] for r in store.rows("SELECT content FROM transcript")}
    copy = restored_copy(settings, tmp_path)
    assert integrity(copy) == "ok"
    assert contents(copy) == expected
    assert SECRET.encode() not in copy.read_bytes()
    store.close()


def test_a_households_wal_is_reset_after_a_forget_with_its_litestream_running(
        tmp_path: Path) -> None:
    """Many households (issue 26): a household's store is replicated by its
    node's one Litestream (device.household_replicator), whose read transaction
    keeps the forget's own ``wal_checkpoint(TRUNCATE)`` from resetting the WAL;
    the daemon lets that store go, resets its WAL and takes it back, while the
    other households' replication goes on. Real litestream, in process."""
    from device.household_replicator import HouseholdReplicator
    from runtime.store.households import Households

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path / "hub")},
        "households": {"enabled": True},
        "replica": {"url": f"file://{tmp_path / 'replica'}", "sync_interval_s": 0.5}})
    registry = Households(settings)
    registry.add("alpha")
    own = registry.settings_for("alpha")
    store = Store(own.store.path, KINDS, replicated=True)
    services = Services(TranscriptService(store, PROFILES), EpisodeService(store, PROFILES),
                        GraphService(store, KINDS, PROFILES))
    replication = HouseholdReplicator(settings, registry.root)
    replication.start()
    try:
        replication.register(own.store.path, own.replica.url)
        refs = plant(services)
        assert wait_for(lambda: bool(holding(tmp_path / "replica")), 60)  # it read the WAL
        data = own.store.path.parent
        assert "reverie.db-wal" in holding(data)
        for ref in refs:
            change(services.owner(ref.kind), ref, "delete", "user")
        # The store's own files (its WAL); Litestream's local copies leave with
        # the replica's retention, as the hub's do (the test above).
        def own_files() -> list[str]:
            return [name for name in holding(data) if not name.startswith(".reverie.db-litestream")]

        assert wait_for(lambda: own_files() == [], 60), holding(data)
        assert wait_for(lambda: replication.registered() == [str(own.store.path)], 30)
        write_turns(store, "later", 3)  # replicated again after the reset
        expected = {r["content"] for r in store.rows("SELECT content FROM transcript")}
        replication.final_sync(own.store.path, own.replica.url)
    finally:
        replication.stop()
        store.close()
    copy = restored_copy(own, tmp_path)
    assert contents(copy) == expected
    assert SECRET.encode() not in copy.read_bytes()
