"""Memory over its life: reopening, crashes, broken index caches, the write log.

The database is the source of truth and the hnswlib files under
``<data_dir>/index`` are only a cache: whatever happens to them, a reopened
:class:`Memory` must answer from every vector the database holds.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import apsw
import hnswlib
import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.facts import FactIn
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.store.vector_index import KINDS
from runtime.time.clock import ManualClock

OpenMemory = Callable[[], Memory]

FIRST = {
    "cat": "Our cat is named Miso.",
    "sister": "My sister Ana lives in Porto.",
    "allergy": "I have a severe peanut allergy.",
}
LATER = {
    "car": "Our car is a blue Volvo estate.",
    "piano": "My son Leo starts piano lessons on Thursdays.",
}
# Paraphrases that share no keyword with the turn: only the vector path finds them.
PARAPHRASE = {
    "cat": "what's my pet called",
    "sister": "tell me about my sibling's home town",
    "allergy": "Can I eat peanut butter?",
    "car": "what colour is our vehicle",
    "piano": "what day is my son's music class",
}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def open_memory(settings: Settings, clock: ManualClock, embedder: Embedder) -> OpenMemory:
    """A new Memory on the same data directory each call (a process restart)."""
    return lambda: Memory(settings, clock=clock, embedder=embedder)


def index_dir(settings: Settings) -> Path:
    return settings.store.resolved_dir / "index"


def add(memory: Memory, texts: dict[str, str]) -> dict[str, int]:
    ids = memory.add_turns([TurnIn(channel="kitchen", source="user", content=t)
                            for t in texts.values()])
    return dict(zip(texts, ids, strict=True))


def assert_index_matches_database(memory: Memory) -> None:
    for kind in KINDS:
        rows = memory.store.scalar("SELECT count(*) FROM vectors WHERE kind = ?", (kind,))
        assert memory.index.count(kind) == rows, kind


def assert_recalls(memory: Memory, ids: dict[str, int]) -> None:
    for name, turn_id in ids.items():
        result = memory.recall(PARAPHRASE[name])
        assert not result.degraded, result.reason
        assert result.refs[:1] == [f"turn:{turn_id}"], (name, result.refs)


def crash(open_memory: OpenMemory, texts: dict[str, str]) -> dict[str, int]:
    """Write through a Memory that is dropped without ``close()``: its rows are
    committed, its in-memory index is never saved."""
    memory = open_memory()
    ids = add(memory, texts)
    del memory
    gc.collect()
    return ids


# -- the index cache ------------------------------------------------------------

def test_index_is_rebuilt_when_its_directory_is_gone(open_memory: OpenMemory,
                                                     settings: Settings) -> None:
    with open_memory() as memory:
        ids = add(memory, FIRST)
    assert (index_dir(settings) / "turn.hnsw").exists()
    shutil.rmtree(index_dir(settings))
    with open_memory() as memory:
        assert memory.counts()["vectors"] == len(FIRST)
        assert_index_matches_database(memory)
        assert_recalls(memory, ids)


def test_clean_reopen_loads_without_duplicates(open_memory: OpenMemory) -> None:
    with open_memory() as memory:
        ids = add(memory, FIRST)
    for _ in range(2):
        with open_memory() as memory:
            assert_index_matches_database(memory)
            assert_recalls(memory, ids)


def test_index_catches_up_after_a_crash(open_memory: OpenMemory, settings: Settings) -> None:
    with open_memory() as memory:
        first = add(memory, FIRST)
    later = crash(open_memory, LATER)
    meta = json.loads((index_dir(settings) / "turn.json").read_text())
    assert meta["max_label"] < max(later.values())  # the saved cache is behind the database
    with open_memory() as memory:
        assert memory.counts()["vectors"] == len(FIRST) + len(LATER)
        assert_index_matches_database(memory)
        assert_recalls(memory, {**first, **later})


def test_crash_before_the_first_save(open_memory: OpenMemory, settings: Settings) -> None:
    ids = crash(open_memory, FIRST)
    assert not (index_dir(settings) / "turn.json").exists()
    with open_memory() as memory:
        assert_index_matches_database(memory)
        assert_recalls(memory, ids)


def test_catch_up_after_delete_and_crash(open_memory: OpenMemory) -> None:
    """Delete the newest memory, write another, crash: the cache must not keep the
    deleted memory's vector under the new memory's label."""
    allergy = FactIn(kind="user_specific", subject="user", key="allergy", value="peanuts")
    gym = FactIn(kind="place", subject="user", key="gym",
                 value="the climbing gym on Rua Augusta")
    with open_memory() as memory:
        add(memory, FIRST)
        deleted, _ = memory.add_fact(allergy)
    memory = open_memory()
    memory.graph.delete(deleted)
    current, _ = memory.add_fact(gym)
    del memory
    gc.collect()
    with open_memory() as memory:
        assert f"fact:{current}" not in memory.recall("what am I allergic to?").refs
        assert f"fact:{current}" in memory.recall("where do I go climbing?").refs


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(64 * 1024))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _text(path: Path) -> None:
    path.write_text("this is not an hnswlib index\n" * 200)


@pytest.mark.parametrize("damage", [_garbage, _empty, _truncated, _text],
                         ids=lambda f: f.__name__.strip("_"))
def test_corrupt_index_file_is_rebuilt(open_memory: OpenMemory, settings: Settings,
                                       damage: Callable[[Path], None]) -> None:
    with open_memory() as memory:
        ids = add(memory, FIRST)
    damage(index_dir(settings) / "turn.hnsw")
    with open_memory() as memory:
        assert_index_matches_database(memory)
        assert_recalls(memory, ids)


def test_unreadable_metadata_is_rebuilt(open_memory: OpenMemory, settings: Settings) -> None:
    with open_memory() as memory:
        ids = add(memory, FIRST)
    (index_dir(settings) / "turn.json").write_text("{not json")
    with open_memory() as memory:
        assert_index_matches_database(memory)
        assert_recalls(memory, ids)


@pytest.mark.parametrize(("field", "value"), [("model", "all-mpnet-base-v2/fp32"),
                                              ("dim", 768)])
def test_index_built_for_another_model_is_rebuilt(open_memory: OpenMemory, settings: Settings,
                                                  embedder: Embedder, field: str,
                                                  value: object) -> None:
    """The cache left by another model is a valid hnswlib file (here: empty); only
    its metadata tells it apart. Loading it would leave the index empty."""
    with open_memory() as memory:
        ids = add(memory, FIRST)
    data_path, meta_path = index_dir(settings) / "turn.hnsw", index_dir(settings) / "turn.json"
    other = hnswlib.Index(space="ip", dim=embedder.dim)
    other.init_index(max_elements=16)
    other.save_index(str(data_path))
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    with open_memory() as memory:
        assert_index_matches_database(memory)
        assert_recalls(memory, ids)
    rewritten = json.loads(meta_path.read_text())
    assert (rewritten["model"], rewritten["dim"]) == (embedder.name, embedder.dim)


# -- forget, then remember -------------------------------------------------------

def test_forget_then_remember_a_turn_indexes_the_new_one(memory: Memory) -> None:
    """remember A, forget it, remember B: B used to get A's id, which the indexer
    had already checked, so B was never indexed until a restart."""
    (a,) = add(memory, {"cat": FIRST["cat"]}).values()
    assert memory.recall(PARAPHRASE["cat"]).refs[:1] == [f"turn:{a}"]
    memory.change(Ref("turn", a), "delete")
    assert memory.recall(PARAPHRASE["cat"]).refs == []
    (b,) = add(memory, {"car": LATER["car"]}).values()
    assert b != a
    assert memory.index.count("turn") == 1
    assert memory.recall(PARAPHRASE["car"]).refs[:1] == [f"turn:{b}"]


def test_forget_then_remember_a_fact_indexes_the_new_one(memory: Memory) -> None:
    a, _ = memory.add_fact(FactIn(kind="user_specific", subject="user", key="allergy",
                                  value="peanuts"))
    memory.change(Ref("fact", a), "delete")
    b, _ = memory.add_fact(FactIn(kind="place", subject="user", key="gym",
                                  value="the climbing gym on Rua Augusta"))
    assert b != a
    assert memory.index.count("fact") == 1
    assert f"fact:{b}" in memory.recall("where do I go climbing?").refs


def test_pinning_keeps_the_vector_and_sears_the_level(memory: Memory) -> None:
    a, _ = memory.add_fact(FactIn(kind="place", subject="user", key="gym",
                                  value="the climbing gym on Rua Augusta"))
    memory.change(Ref("fact", a), "pin")
    assert memory.index.count("fact") == 1
    assert f"fact:{a}" in memory.recall("where do I go climbing?").refs
    row = memory.services.get(Ref("fact", a))
    assert row is not None and row["memory_level"] == "seared"


# -- the write log ------------------------------------------------------------------

def log_rows(memory: Memory, table: str) -> list[dict[str, object]]:
    return memory.store.rows(
        "SELECT writer, op, row_id, after FROM write_log WHERE table_name = ? ORDER BY id",
        (table,))


def test_add_turn_is_in_the_write_log(memory: Memory) -> None:
    plain = memory.add_turn(TurnIn(channel="kitchen", source="user", content="Hello there."))
    imported = memory.add_turn(TurnIn(channel="kitchen", source="user", content="Old chat."),
                               writer="importer")
    muted = memory.add_turn(TurnIn(channel="kitchen", source="delegate:search",
                                   content="Search results."))
    rows = log_rows(memory, "transcript")
    assert [(r["writer"], r["op"], r["row_id"]) for r in rows] == [
        ("transcript", "insert", plain), ("importer", "insert", imported),
        ("transcript", "insert", muted)]
    assert json.loads(str(rows[1]["after"]))["content"] == "Old chat."
    # vectors are derived data: never in the write log
    assert log_rows(memory, "vectors") == []


def test_add_fact_is_in_the_write_log(memory: Memory, clock: ManualClock) -> None:
    old, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    clock.advance(60)
    new, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in",
                                    value="Lisbon"), writer="extraction")
    rows = log_rows(memory, "facts")
    assert [(r["writer"], r["op"], r["row_id"]) for r in rows] == [
        ("graph", "insert", old), ("extraction", "insert", new), ("extraction", "update", old)]
    assert json.loads(str(rows[2]["after"]))["superseded_by"] == new


# -- atomic batches -------------------------------------------------------------

def test_add_turns_is_all_or_nothing(memory: Memory) -> None:
    """The database rejects the batch's last row (built without validation, as a
    fault injection, with a role the CHECK constraint refuses): none may remain."""
    before = memory.counts()
    log_before = memory.store.scalar("SELECT count(*) FROM write_log")
    batch = [
        TurnIn(channel="kitchen", source="user", content="The wifi password is on the fridge."),
        TurnIn(channel="kitchen", source="delegate:search", content="Router manual found."),
        TurnIn.model_construct(channel="kitchen", source="user", role="wizard",
                               content="Broken row.", speaker=None, created_at=None,
                               location=None, external_id=None),
    ]
    with pytest.raises(apsw.ConstraintError):
        memory.add_turns(batch)
    assert memory.counts() == before
    assert memory.store.scalar("SELECT count(*) FROM write_log") == log_before
    assert memory.index.count("turn") == 0
    assert memory.recall("wifi password").items == []
    # the store and index are still usable afterwards
    ok = memory.add_turns(batch[:2])
    assert memory.index.count("turn") == memory.counts()["vectors"] == 1
    assert memory.recall("where is the wifi password?").refs[:1] == [f"turn:{ok[0]}"]


def test_rows_committed_without_vectors_are_embedded_on_open(open_memory: OpenMemory) -> None:
    """A crash after a turn's commit but before its embedding: the next open embeds it."""
    memory = open_memory()
    row_id = memory.transcript.append(
        TurnIn(channel="hall", source="user", content="The spare key is under the blue pot."))
    assert memory.counts()["vectors"] == 0
    del memory  # no close(), no sync: as if killed here
    with open_memory() as reopened:
        assert reopened.counts()["vectors"] == 1
        assert reopened.recall("where is the spare key?").refs[:1] == [f"turn:{row_id}"]


def test_embedder_model_change_reembeds_everything(open_memory: OpenMemory,
                                                   embedder: Embedder) -> None:
    with open_memory() as memory:
        add(memory, FIRST)
        memory.store.conn.execute("UPDATE vectors SET model = 'old-model/v0'")
    with open_memory() as memory:
        models = {r[0] for r in memory.store.conn.execute("SELECT DISTINCT model FROM vectors")}
        assert models == {embedder.name}
        assert_index_matches_database(memory)
