"""Forget means gone; disable hides; references a user can type (runtime.memories.refs).

After a forget, the text must be nowhere in the database: not in the row, not in
the write log (which keeps only that something was deleted, when and by whom),
not in the FTS index, not in a vector, and not in the file's free pages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import CONFIG_DIR
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import NoSuchItem, Ref, Services, change, find_matching, parse_ref
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.memory import Memory
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
SECRET = "zqx4711"  # a word no other row shares, so FTS never prefix-compresses it away


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    store = Store(tmp_path / "f.db", KINDS, clock=ManualClock(1000.0))
    yield Services(TranscriptService(store, PROFILES), EpisodeService(store, PROFILES),
                   GraphService(store, KINDS, PROFILES))
    store.close()


def fill(services: Services) -> dict[str, Ref]:
    """One turn (with a tool call), one episode and one fact holding the secret,
    beside rows that do not."""
    t, e, g = services.transcript, services.episodes, services.graph
    morning = t.append(TurnIn(channel="hall", source="user", content="good morning everyone"))
    turn = t.append(TurnIn(channel="hall", source="user", speaker="Ana",
                           content=f"the locker code is {SECRET}"))
    t.add_tool_call(turn, "unlock", {"code": SECRET}, f"opened with {SECRET}")
    t.set_citations(turn, ["fact:1"])  # an update: its before/after hold the content too
    e.add(EpisodeIn(channel="hall", source="user", gist="breakfast chat"))
    # cites a turn other than the secret's: forgetting that turn would take the
    # episode with it (runtime.memories.derived; tests/test_forget_everywhere.py),
    # and each kind is forgotten on its own here
    episode = e.add(EpisodeIn(channel="hall", source="user", cites=[morning],
                              gist=f"Ana shared the locker code {SECRET}"))
    g.add(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    fact, _ = g.add(FactIn(kind="user_specific", subject="locker", key="code", value=SECRET))
    return {"turn": Ref("turn", turn), "episode": Ref("episode", episode),
            "fact": Ref("fact", fact)}


def put_vector(store: Store, ref: Ref) -> None:
    store.put_vector(ref.kind, ref.id, "test-model", b"\x01" * 16)


def secret_anywhere(store: Store) -> list[str]:
    """Every place in the database the secret is still readable."""
    found = []
    for (table,) in store.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' AND sql NOT LIKE 'CREATE VIRTUAL%'"):
        columns = [r["name"] for r in store.rows(f"PRAGMA table_info({table})")]
        for column in columns:
            hits = store.scalar(
                f"SELECT count(*) FROM {table} WHERE instr(CAST({column} AS BLOB), ?) > 0",
                (SECRET.encode(),))
            if hits:
                found.append(f"{table}.{column}")
    return found


def fts_knows(store: Store, fts: str) -> bool:
    store.conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{fts}_vocab"
                       f" USING fts5vocab(main, {fts}, 'row')")
    in_vocab = store.scalar(f"SELECT count(*) FROM temp.{fts}_vocab WHERE term = ?", (SECRET,))
    matched = store.scalar(f"SELECT count(*) FROM {fts} WHERE {fts} MATCH ?", (f'"{SECRET}"',))
    return bool(in_vocab or matched)


FTS = {"turn": "transcript_fts", "episode": "episodes_fts", "fact": "facts_fts"}
TABLE = {"turn": "transcript", "episode": "episodes", "fact": "facts"}


@pytest.mark.parametrize("kind", ["turn", "episode", "fact"])
def test_forget_leaves_no_content_anywhere(services: Services, kind: str) -> None:
    refs = fill(services)
    store = services.transcript.store
    # forget the other kinds' secrets first (they are not under test here)
    for other, ref in refs.items():
        if other != kind:
            change(services.owner(ref.kind), ref, "delete", "user")
    ref = refs[kind]
    put_vector(store, ref)
    assert secret_anywhere(store) and fts_knows(store, FTS[kind])

    change(services.owner(ref.kind), ref, "delete", "user")

    assert services.get(ref) is None
    assert secret_anywhere(store) == []  # rows, write log (before/after), vectors
    assert not fts_knows(store, FTS[kind])
    assert store.scalar("SELECT count(*) FROM vectors WHERE kind = ? AND item_id = ?",
                        (ref.kind, ref.id)) == 0
    # that something was deleted, when and by whom, is kept
    deleted = store.row("SELECT * FROM write_log WHERE table_name = ? AND row_id = ?"
                        " AND op = 'delete'", (TABLE[kind], ref.id))
    assert deleted is not None
    assert (deleted["writer"], deleted["at"]) == ("user", 1000.0)
    # rows without the secret are untouched
    assert [m.text for m in find_matching(store, "good morning")] == [
        "user: good morning everyone"]
    assert [m.text for m in find_matching(store, "Porto")] == ["Ana lives_in: Porto"]


@pytest.mark.parametrize("kind", ["turn", "episode", "fact"])
def test_forgotten_text_is_not_left_in_the_file(services: Services, kind: str) -> None:
    """secure_delete zeroes freed pages and the FTS merge drops the deleted terms:
    once checkpointed, the file's bytes no longer hold the text."""
    refs = fill(services)
    store = services.transcript.store
    for ref in refs.values():
        put_vector(store, ref)
    for ref in refs.values():
        change(services.owner(ref.kind), ref, "delete", "user")
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a test may; the runtime never does
    assert SECRET.encode() not in store.path.read_bytes()


def test_tool_calls_of_a_forgotten_turn_are_scrubbed_too(services: Services) -> None:
    refs = fill(services)
    store = services.transcript.store
    services.transcript.forget(refs["turn"].id, writer="user")
    assert store.scalar("SELECT count(*) FROM tool_calls") == 0
    ops = store.rows("SELECT table_name, op FROM write_log WHERE op = 'delete'")
    assert {"table_name": "tool_calls", "op": "delete"} in ops
    logged = store.rows("SELECT before, after FROM write_log WHERE table_name = 'tool_calls'")
    assert logged and not any(SECRET in str(r["before"]) + str(r["after"]) for r in logged)


def test_plain_delete_still_keeps_the_before(services: Services) -> None:
    """Only an explicit forget scrubs: pruning keeps its audit trail."""
    store = services.transcript.store
    turn = services.transcript.append(TurnIn(channel="c", source="user", content="keep me"))
    store.delete("pruner", "transcript", turn)
    assert "keep me" in store.scalar(
        "SELECT before FROM write_log WHERE op = 'delete' AND row_id = ?", (turn,))


# -- disable and enable ---------------------------------------------------------------------

def test_disable_and_enable_are_reversible_and_logged(services: Services) -> None:
    refs = fill(services)
    for kind, ref in refs.items():
        change(services.owner(ref.kind), ref, "disable", "user")
        assert services.get(ref)["disabled"] == 1, kind  # type: ignore[index]
        change(services.owner(ref.kind), ref, "enable", "user")
        row = services.get(ref)
        assert row is not None and row["disabled"] == 0 and SECRET in str(row), kind
    store = services.transcript.store
    assert store.scalar("SELECT count(*) FROM write_log WHERE writer = 'user'") == 6


def test_change_refuses_what_does_not_exist(services: Services) -> None:
    for ref in (Ref("turn", 99), Ref("episode", 99), Ref("fact", 99)):
        with pytest.raises(NoSuchItem, match=f"no {ref.kind} 99"):
            change(services.owner(ref.kind), ref, "delete", "user")
    with pytest.raises(ValueError, match="unknown action"):
        change(services.transcript, Ref("turn", 1), "explode", "user")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["turn", "episode"])
def test_disabled_items_leave_the_index_and_come_back(memory: Memory, kind: str) -> None:
    if kind == "turn":
        item = memory.add_turn(TurnIn(channel="hall", source="user",
                                      content="The spare key is under the blue pot."))
    else:
        item = memory.add_episode(EpisodeIn(channel="hall", source="user",
                                            gist="We hid the spare key under the blue pot."))
    ref = Ref(kind, item)  # type: ignore[arg-type]
    assert memory.index.count(kind) == 1
    memory.change(ref, "disable")
    assert memory.index.count(kind) == 0
    assert memory.indexer.pending_count() == 0  # disabled: not waiting to be embedded
    memory.indexer.sync()
    assert memory.index.count(kind) == 0
    # enabled behind the indexer's back: it is pending again
    if kind == "turn":
        memory.transcript.set_disabled(item, False)
    else:
        memory.episodes.set_disabled(item, False)
    assert memory.indexer.pending_count() == 1
    memory.change(ref, "disable")
    memory.change(ref, "enable")  # through Memory: indexed again at once
    assert memory.index.count(kind) == 1
    assert memory.indexer.pending_count() == 0


# -- references ----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ref"), [
    ("turn:12", Ref("turn", 12)), ("episode:3", Ref("episode", 3)),
    (" fact:7 ", Ref("fact", 7)),
])
def test_parse_ref(text: str, ref: Ref) -> None:
    assert parse_ref(text) == ref
    assert str(ref) == text.strip()


@pytest.mark.parametrize("text", [
    "", "turn", "turn:", "turn:x", "turn:-1", "turn:0", "turn:1.5", "Turn:1", "memo:1",
    "12", ":12", "turn:١٢", "turn: 1", "fact:1:2",
])
def test_bad_refs_say_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"bad reference .*(turn:<id>|ids start at 1)"):
        parse_ref(text)


def test_find_matching_finds_every_kind_containing_all_words(services: Services) -> None:
    refs = fill(services)
    services.graph.disable(refs["fact"].id)
    found = find_matching(services.transcript.store, "locker code")
    assert {m.ref for m in found} == set(refs.values())
    by_ref = {m.ref: m for m in found}
    assert by_ref[refs["turn"]].text == f"Ana: the locker code is {SECRET}"
    assert by_ref[refs["fact"]].text == f"locker code: {SECRET}"
    assert by_ref[refs["fact"]].disabled and not by_ref[refs["turn"]].disabled
    assert by_ref[refs["episode"]].created_at == 1000.0
    # every word must be there: "locker breakfast" is in no single row
    assert find_matching(services.transcript.store, "locker breakfast") == []
    assert len(find_matching(services.transcript.store, "locker code", limit=2)) == 2


@pytest.mark.parametrize(("text", "kinds"), [
    ("NEAR(locker code)", set()),  # "near" is a word here, and no row has it
    ("lock*", set()),  # not a prefix query
    ("content:locker", set()),  # not a column filter: "content" is a word no row has
    ('"locker', {"turn", "episode", "fact"}),
    ("locker AND", {"turn", "episode", "fact"}),  # "and" is a stop word, not an operator
    ("{subject}: locker", set()),
    ("'; DROP TABLE transcript;--", set()),
    ('"', set()), ("", set()), ("the of and", set()), ("\x00", set()), ("OR OR", set()),
])
def test_find_matching_never_reads_user_text_as_fts_syntax(
        services: Services, text: str, kinds: set[str]) -> None:
    fill(services)
    found = find_matching(services.transcript.store, text)
    assert {m.ref.kind for m in found} == kinds
    assert services.transcript.store.scalar("SELECT count(*) FROM transcript") == 2


@pytest.mark.parametrize("kind", ["turn", "episode"])
def test_disabled_items_are_never_recalled_even_by_keyword(memory: Memory, kind: str) -> None:
    """Recall filters disabled rows itself: a vector or an FTS row left behind never
    brings a disabled memory back."""
    if kind == "turn":
        item = memory.add_turn(TurnIn(channel="hall", source="user",
                                      content="The kayak paddles hang in the garage loft."))
        memory.transcript.set_disabled(item, True)
    else:
        item = memory.add_episode(EpisodeIn(channel="hall", source="user",
                                            gist="We hung the kayak paddles in the garage loft."))
        memory.episodes.set_disabled(item, True)
    assert memory.index.count(kind) == 1  # disabled behind the index's back: vector still there
    assert f"{kind}:{item}" not in memory.recall("kayak paddles garage loft").refs
    memory.index.available = False  # the keyword-only fallback must filter too
    assert f"{kind}:{item}" not in memory.recall("kayak paddles garage loft").refs
