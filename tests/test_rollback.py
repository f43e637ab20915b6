"""Write log and rollback (runtime.store.rollback, actors.cli.doctor) on real SQLite files.

A job's bad writes are undone and nobody else's; ``--to T`` puts episodes and
facts back exactly as at T; seared memories are never touched; the log is
append-only (except a forget's scrub and the janitor's retention deletes); a
rollback can itself be rolled back; ``check-facts`` flags facts their turns do
not support. The ``reverie doctor`` commands run as subprocesses.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import apsw
import pytest

from actors.cli import doctor
from runtime.config import CONFIG_DIR
from runtime.memories.decay import WRITE_LOG_RETENTION_DAYS
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.mind import janitor
from runtime.mind.support import unsupported_facts
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.rollback import PlanOutdated, apply, log_entries, plan
from runtime.time.clock import DAY, ManualClock
from tests.reverie_process import reverie as run_reverie

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")


@dataclass
class World:
    store: Store
    clock: ManualClock
    turns: TranscriptService
    episodes: EpisodeService
    graph: GraphService

    def turn(self, content: str, speaker: str = "Ana") -> int:
        return self.turns.append(TurnIn(channel="hall", source="user", speaker=speaker,
                                        content=content))

    def episode(self, gist: str, writer: str, **kw: Any) -> int:
        return self.episodes.add(EpisodeIn(channel="hall", source="user", gist=gist, **kw),
                                 writer)

    def fact(self, subject: str, key: str, value: str, writer: str, **kw: Any) -> int:
        kw.setdefault("kind", "user_specific")
        fact_id, _ = self.graph.add(FactIn(subject=subject, key=key, value=value, **kw), writer)
        return fact_id


def open_world(path: Path, clock: ManualClock) -> World:
    store = Store(path, KINDS, clock=clock)
    return World(store, clock, TranscriptService(store, PROFILES),
                 EpisodeService(store, PROFILES), GraphService(store, KINDS, PROFILES))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = open_world(tmp_path / "r.db", ManualClock(1_700_000_000.0))
    yield w
    w.store.close()


def snapshot(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Every episode, fact and citation, full rows."""
    return {
        "episodes": store.rows("SELECT * FROM episodes ORDER BY id"),
        "facts": store.rows("SELECT * FROM facts ORDER BY id"),
        "citations": store.rows(
            "SELECT * FROM episode_citations ORDER BY episode_id, transcript_id"),
    }


def consistent(store: Store) -> None:
    """Foreign keys hold and the FTS indexes match their tables."""
    assert store.rows("PRAGMA foreign_key_check") == []
    for fts in ("episodes_fts", "facts_fts"):
        store.conn.execute(f"INSERT INTO {fts} ({fts}, rank) VALUES ('integrity-check', 1)")


def refs(p: Any) -> set[str]:
    return {c.ref for c in p.changes}


# -- a job's bad writes -------------------------------------------------------------

def test_a_jobs_bad_writes_are_undone_and_nobody_elses(world: World) -> None:
    s, clock = world.store, world.clock
    turn = world.turn("I moved to Porto in 2023")
    e1 = world.episode("Ana talked about moving to Porto", "episodes", cites=[turn])
    home = world.fact("Ana", "lives_in", "Porto", "graph", kind="place",
                      provenance=[f"turn:{turn}"])
    job = world.fact("Ana", "job", "teacher", "graph")
    note = world.fact("Ana", "note", "likes jazz", "graph")
    clock.advance(60)
    since = clock.now()
    kept = {"home": s.get("facts", home), "job": s.get("facts", job),
            "e1": s.get("episodes", e1)}

    # The job's writes ("facts"), interleaved with other writers'.
    s.update("cli", "facts", note, {"value": "likes blues"})  # before the job touched it
    kept["note"] = s.get("facts", note)
    bad = world.fact("Ana", "lives_in", "Lisbon", "facts", kind="place", confidence=0.9)
    s.update("facts", "facts", note, {"value": "likes nothing", "confidence": 0.1})
    assert s.get("facts", home)["superseded_by"] == bad  # the job closed the old window
    clock.advance(5)
    bob = world.fact("Bob", "pet", "cat", "cli")
    s.delete("facts", "facts", job)
    bad_episode = world.episode("A wrong summary of the day", "facts", cites=[turn])
    clock.advance(5)
    other_episode = world.episode("Bob showed his cat", "episodes")
    world.episodes.set_disabled(e1, True, writer="facts")
    world.fact("Bob", "pet", "cat", "cli", confidence=0.5)  # reinforced by someone else
    others = {"bob": s.get("facts", bob), "other": s.get("episodes", other_episode)}
    clock.advance(60)

    p = plan(s, writer="facts", since=since)
    assert {c.ref: c.action for c in p.changes} == {
        f"fact:{bad}": "delete", f"fact:{home}": "update", f"fact:{job}": "restore",
        f"fact:{note}": "update", f"episode:{bad_episode}": "delete",
        f"episode:{e1}": "update"}
    assert p.skipped == ()
    assert [c.newest for c in p.changes] == sorted((c.newest for c in p.changes),
                                                   reverse=True)  # newest first
    applied = apply(s, p)

    assert s.get("facts", bad) is None and s.get("episodes", bad_episode) is None
    assert world.episodes.citations(bad_episode) == []
    assert s.get("facts", home) == kept["home"]
    assert s.get("facts", job) == kept["job"]  # back, with its id
    assert s.get("episodes", e1) == kept["e1"]
    assert s.get("facts", note) == kept["note"]  # the job's change only
    assert world.episodes.citations(e1) == [turn]
    assert s.get("facts", bob) == others["bob"]
    assert s.get("episodes", other_episode) == others["other"]
    assert world.graph.current("Ana", "lives_in")["id"] == home
    consistent(s)
    assert applied.changes == 6 and applied.log_ids is not None
    written = s.rows("SELECT DISTINCT writer FROM write_log WHERE id BETWEEN ? AND ?",
                     applied.log_ids)
    assert written == [{"writer": "rollback"}]
    again = plan(s, writer="facts", since=since)  # nothing left to undo, no conflicts
    assert again.empty and again.skipped == ()


def test_a_row_someone_else_changed_after_the_job_is_a_conflict_and_left(
        world: World) -> None:
    s, clock = world.store, world.clock
    fact = world.fact("Ana", "likes", "tea", "graph")
    since = clock.now()
    clock.advance(1)
    s.update("facts", "facts", fact, {"value": "coffee"})
    mine = world.fact("Ana", "drinks", "water", "facts")
    clock.advance(1)
    s.update("cli", "facts", fact, {"confidence": 0.95})
    after = s.get("facts", fact)

    p = plan(s, writer="facts", since=since)
    assert refs(p) == {f"fact:{mine}"}
    [conflict] = p.skipped
    assert (conflict.ref, conflict.reason, conflict.by) == (f"fact:{fact}", "conflict", "cli")
    apply(s, p)
    assert s.get("facts", fact) == after and s.get("facts", mine) is None


def test_a_change_that_would_leave_a_reference_dangling_is_blocked(world: World) -> None:
    s, clock = world.store, world.clock
    child = world.episode("Breakfast on the terrace", "episodes", memory_level="seared")
    since = clock.now()
    clock.advance(1)
    parent = world.episode("The summer, rolled up", "consolidate", level=1, children=[child])
    assert s.get("episodes", child)["parent_id"] == parent
    before = snapshot(s)

    p = plan(s, writer="consolidate", since=since)
    assert p.empty
    assert {(x.ref, x.reason) for x in p.skipped} == {
        (f"episode:{child}", "seared"), (f"episode:{parent}", "blocked")}
    apply(s, p)
    assert snapshot(s) == before


def test_a_plan_is_refused_when_memory_changed_since(world: World) -> None:
    s, clock = world.store, world.clock
    since = clock.now()
    fact = world.fact("Ana", "likes", "tea", "facts")
    p = plan(s, writer="facts", since=since)
    s.update("cli", "facts", fact, {"value": "green tea"})
    before = snapshot(s)
    log_size = s.scalar("SELECT count(*) FROM write_log")
    with pytest.raises(PlanOutdated):
        apply(s, p)
    assert snapshot(s) == before
    assert s.scalar("SELECT count(*) FROM write_log") == log_size


def test_vectors_of_rows_put_back_are_dropped_for_reindexing(world: World) -> None:
    s, clock = world.store, world.clock
    kept = world.fact("Ana", "likes", "tea", "graph")
    changed = world.fact("Ana", "car", "red", "graph")
    since = clock.now()
    clock.advance(1)
    s.update("facts", "facts", changed, {"value": "blue"})
    for fact in (kept, changed):
        s.put_vector("fact", fact, "test-model", b"\x01" * 16)
    applied = apply(s, plan(s, writer="facts", since=since))
    assert applied.refs == (f"fact:{changed}",)
    vectors = s.rows("SELECT item_id FROM vectors WHERE kind = 'fact'")
    assert vectors == [{"item_id": kept}]


# -- --to T -------------------------------------------------------------------------

def test_to_t_puts_episodes_and_facts_back_exactly_as_at_t(world: World) -> None:
    s, clock = world.store, world.clock
    t1, t2 = world.turn("We went to Porto"), world.turn("Bob has a cat", "Bob")
    leaf1 = world.episode("A trip to Porto", "episodes", cites=[t1])
    leaf2 = world.episode("Bob's cat", "episodes", cites=[t2])
    home = world.fact("Ana", "lives_in", "Porto", "graph", kind="place")
    pet = world.fact("Bob", "pet", "cat", "graph")
    gone = world.fact("Ana", "job", "teacher", "graph")
    clock.advance(60)
    at_t = clock.now()
    expected = snapshot(s)
    clock.advance(60)

    # After T: every kind of write, by several writers.
    world.fact("Ana", "lives_in", "Lisbon", "facts", kind="place", confidence=0.9)
    world.fact("Bob", "pet", "cat", "graph", confidence=0.9)          # reinforced
    s.delete("cli", "facts", gone)
    world.graph.set_disabled(pet, True, writer="cli")
    parent = world.episode("The trip and the cat", "consolidate", level=1,
                           children=[leaf1, leaf2])
    new_turn = world.turn("Carol came over")
    world.episode("Carol's visit", "episodes", cites=[new_turn])
    s.update("cli", "episodes", leaf2, {"salience": 9})
    world.fact("Carol", "visits", "Sundays", "facts")
    assert snapshot(s) != expected

    p = plan(s, to=at_t)
    assert p.skipped == ()
    applied = apply(s, p)
    assert snapshot(s) == expected
    # The children were put back before their parent went: no silent SET NULL,
    # the log holds each change with its true before.
    [child] = [e for e in log_entries(s, writer="rollback", tables=["episodes"],
                                      since=applied.at) if e.row_id == leaf1]
    assert child.op == "update" and child.before is not None
    assert child.before["parent_id"] == parent
    assert world.graph.current("Ana", "lives_in")["id"] == home
    consistent(s)


# -- seared memories ----------------------------------------------------------------

def test_seared_memories_are_never_touched(world: World) -> None:
    """Seared now, or seared in the state to go back to: left as it is, reported.

    Covers a seared fact the job reinforced, a fact the job wrote and the user
    seared afterwards, a seared episode the job added, a fact the job seared
    and one it un-seared."""
    s, clock = world.store, world.clock
    vow = world.fact("Ana", "wedding_day", "June 3", "cli", memory_level="seared",
                     user_managed=True)
    was_seared = world.fact("Ana", "first_pet", "Rex", "cli", memory_level="seared")
    plain = world.fact("Ana", "car", "red", "graph")
    since = clock.now()
    clock.advance(1)
    world.fact("Ana", "wedding_day", "June 3", "facts")                    # reinforces vow
    later_seared = world.fact("Ana", "daughter", "Maria", "facts")
    made_seared = world.fact("Ana", "son", "Rui", "facts")
    seared_episode = world.episode("The day Maria was born", "facts", memory_level="seared")
    s.update("facts", "facts", plain, {"memory_level": "seared"})
    s.update("facts", "facts", was_seared, {"memory_level": "normal"})
    clock.advance(1)
    s.update("cli", "facts", later_seared, {"memory_level": "seared"})
    harmless = world.fact("Ana", "shoe_size", "38", "facts")
    before = snapshot(s)

    seared = {f"fact:{i}" for i in (vow, later_seared, plain, was_seared)} | {
        f"episode:{seared_episode}"}
    for p in (plan(s, writer="facts", since=since), plan(s, to=since)):
        assert {x.ref for x in p.skipped if x.reason == "seared"} == seared
        assert refs(p) & seared == set()
    p = plan(s, writer="facts", since=since)
    assert refs(p) == {f"fact:{made_seared}", f"fact:{harmless}"}
    apply(s, p)
    after = snapshot(s)
    for table, rows in before.items():
        if table == "citations":
            continue
        kind = table[:-1] if table == "facts" else "episode"
        for row in rows:
            if f"{kind}:{row['id']}" in seared:
                assert row in after[table], f"{kind}:{row['id']} changed"
    assert s.get("facts", harmless) is None and s.get("facts", made_seared) is None


# -- forgotten rows -----------------------------------------------------------------

def test_a_forgotten_row_cannot_come_back_and_is_reported(world: World) -> None:
    s, clock = world.store, world.clock
    secret = world.fact("locker", "code", "zqx4711", "graph")
    since = clock.now()
    clock.advance(1)
    s.update("facts", "facts", secret, {"confidence": 0.2})
    inserted = world.fact("Ana", "pin", "1234", "facts")
    clock.advance(1)
    world.graph.forget(secret, writer="cli")
    world.graph.forget(inserted, writer="cli")

    for p in (plan(s, writer="facts", since=since), plan(s, to=since)):
        assert p.empty
        assert {(x.ref, x.reason) for x in p.skipped} == {
            (f"fact:{secret}", "forgotten"), (f"fact:{inserted}", "forgotten")}
    apply(s, plan(s, to=since))
    assert s.get("facts", secret) is None
    assert s.scalar("SELECT count(*) FROM write_log WHERE before LIKE '%zqx4711%'"
                    " OR after LIKE '%zqx4711%'") == 0


# -- privacy marks are only ever tightened -----------------------------------------

def _marks(store: Store, table: str, row_id: int) -> tuple[int, str | None]:
    row = store.get(table, row_id)
    assert row is not None
    return row["sensitive"], row["person"]


def test_a_rollback_never_loosens_a_privacy_mark(world: World) -> None:
    """Marks made after T stay: a sensitive mark is never cleared, an owner never
    removed or changed; a mark cleared after T is set again (tightening)."""
    s, clock = world.store, world.clock
    code = world.fact("gate", "code", "4711", "graph", kind="user_specific")
    owned = world.fact("Ana", "doctor", "Dr Reis", "graph")
    cleared = world.fact("Bob", "salary", "high", "graph", sensitive=True, person="Bob")
    gone = world.fact("Ana", "bank", "Millennium", "graph")
    leaf = world.episode("Ana talked about her test results", "episodes",
                         cites=[world.turn("my blood test came back", "Bob")])
    assert _marks(s, "episodes", leaf) == (0, "Bob")
    at_t = clock.now()
    clock.advance(60)
    s.update("cli", "facts", code, {"sensitive": 1, "value": "4712"})
    s.update("cli", "facts", owned, {"person": "Ana", "confidence": 0.3})
    s.update("cli", "facts", cleared, {"sensitive": 0})
    s.update("cli", "facts", gone, {"sensitive": 1, "person": "Ana"})
    s.delete("cli", "facts", gone)
    s.update("cli", "episodes", leaf, {"sensitive": 1, "person": "Ana", "salience": 9})

    p = plan(s, to=at_t)
    apply(s, p)
    assert (s.get("facts", code)["value"], _marks(s, "facts", code)) == ("4711", (1, None))
    assert _marks(s, "facts", owned) == (0, "Ana")
    assert s.get("facts", owned)["confidence"] != 0.3       # the rest went back
    assert _marks(s, "facts", cleared) == (1, "Bob")        # tightened again
    assert _marks(s, "facts", gone) == (1, "Ana")           # back, as marked when deleted
    assert _marks(s, "episodes", leaf) == (1, "Ana")
    assert s.get("episodes", leaf)["salience"] != 9
    consistent(s)
    # the plan names the marks it keeps (doctor rollback prints them)
    kept = {c.ref: c.kept for c in p.changes}
    assert kept == {f"fact:{code}": ("sensitive",), f"fact:{owned}": ("person",),
                    f"fact:{cleared}": (), f"fact:{gone}": ("sensitive", "person"),
                    f"episode:{leaf}": ("sensitive", "person")}
    [line] = [doctor._change_line(c) for c in p.changes if c.ref == f"fact:{code}"]
    assert line.endswith("put back   value (keeps sensitive)"), line
    # and the undo of that rollback loosens nothing either
    clock.advance(60)
    apply(s, plan(s, writer="rollback", since=at_t))
    assert _marks(s, "facts", cleared) == (1, "Bob")
    assert _marks(s, "facts", code) == (1, None)


# -- what an undo needs outlives the write log's retention ---------------------------

def test_a_rollbacks_undo_still_works_after_the_write_log_retention(world: World) -> None:
    """The history of an episode a rollback deleted is not expired: the printed
    undo (``--writer rollback --since T``) puts it back, however late."""
    s, clock = world.store, world.clock
    at_t = clock.now()
    clock.advance(60)
    turn = world.turn("We planted an olive tree")
    added = world.episode("Ana planted an olive tree", "episodes", cites=[turn])
    clock.advance(60)
    rolled = apply(s, plan(s, to=at_t))
    assert s.get("episodes", added) is None
    wanted = s.rows("SELECT * FROM write_log WHERE table_name IN ('episodes',"
                    " 'episode_citations') AND row_id = ?", (added,))
    clock.advance((WRITE_LOG_RETENTION_DAYS + 10) * DAY)
    world.turn("much later")  # the log's newest entry, which never expires, is not the episode's
    janitor.expire_write_log(s, clock.now())
    assert s.rows("SELECT * FROM write_log WHERE table_name IN ('episodes',"
                  " 'episode_citations') AND row_id = ?", (added,)) == wanted
    undo = plan(s, writer="rollback", since=rolled.at)
    assert refs(undo) == {f"episode:{added}"}
    undone = apply(s, undo)
    assert s.get("episodes", added)["gist"] == "Ana planted an olive tree"
    assert world.episodes.citations(added) == [turn]
    # a turn the janitor pruned meanwhile (no episode cited it) is not cited again
    clock.advance(60)
    again = apply(s, plan(s, writer="rollback", since=undone.at))
    assert s.get("episodes", added) is None
    s.delete("janitor", "transcript", turn)
    clock.advance(60)
    apply(s, plan(s, writer="rollback", since=again.at))
    assert s.get("episodes", added)["gist"] == "Ana planted an olive tree"
    assert world.episodes.citations(added) == []
    consistent(s)
    # once the janitor deletes it again, its history expires as any other's
    clock.advance(31 * DAY)
    s.delete("janitor", "episodes", added)
    clock.advance((WRITE_LOG_RETENTION_DAYS + 1) * DAY)
    world.turn("later still")
    assert janitor.expire_write_log(s, clock.now()) >= len(wanted)
    assert s.scalar("SELECT count(*) FROM write_log WHERE table_name = 'episodes'"
                    " AND row_id = ?", (added,)) == 0


# -- the log is append-only ---------------------------------------------------------

def test_the_write_log_is_append_only(world: World, tmp_path: Path) -> None:
    s = world.store
    fact = world.fact("Ana", "likes", "tea", "graph")
    world.fact("Ana", "likes", "coffee", "graph")
    entry = s.row("SELECT * FROM write_log WHERE table_name = 'facts' ORDER BY id LIMIT 1")
    assert entry is not None
    count = s.scalar("SELECT count(*) FROM write_log")
    refused = [
        "DELETE FROM write_log",
        f"DELETE FROM write_log WHERE id = {entry['id']}",
        "UPDATE write_log SET writer = 'someone else'",
        "UPDATE write_log SET at = at - 86400",
        "UPDATE write_log SET after = '{\"value\": \"forged\"}'",
        "UPDATE write_log SET before = NULL WHERE before IS NOT NULL",
        # the forget marker, but for another row than the entry's own
        f"UPDATE write_log SET after = '{{\"id\": {fact + 1}, \"forgotten\": true}}'"
        f" WHERE id = {entry['id']}",
        # the marker with something else beside it
        f"UPDATE write_log SET after = '{{\"id\": {fact}, \"forgotten\": true, \"v\": 1}}'"
        f" WHERE id = {entry['id']}",
        # a marker where there was nothing
        f"UPDATE write_log SET before = '{{\"id\": {fact}, \"forgotten\": true}}'"
        f" WHERE id = {entry['id']}",
        f"INSERT OR REPLACE INTO write_log (id, at, writer, op, table_name, row_id)"
        f" VALUES ({entry['id']}, 0, 'x', 'insert', 'facts', {fact})",
    ]
    for sql in refused:
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            s.conn.execute(sql)
    # Even the janitor's permission never covers the history of facts.
    with s.write_transaction(), s.expiring_write_log(), \
            pytest.raises(apsw.ConstraintError, match="append-only"):
        s.conn.execute("DELETE FROM write_log WHERE table_name = 'facts'")
    assert s.scalar("SELECT count(*) FROM write_log") == count
    assert s.row("SELECT * FROM write_log WHERE id = ?", (entry["id"],)) == entry
    # Another connection (the sqlite3 shell) has no permission to give at all.
    raw = apsw.Connection(str(s.path))
    with pytest.raises(apsw.SQLError, match="write_log_expiry_allowed"):
        raw.execute("DELETE FROM write_log")
    raw.close()
    # Appending still works.
    world.fact("Ana", "likes", "cocoa", "graph")
    assert s.scalar("SELECT count(*) FROM write_log") > count


def test_the_two_sanctioned_changes_still_work(world: World) -> None:
    """A forget scrubs its row's content from the log; the janitor expires the
    history of pruned episodes."""
    s, clock = world.store, world.clock
    secret = world.fact("locker", "code", "zqx4711", "graph")
    s.update("graph", "facts", secret, {"confidence": 0.9})
    world.graph.forget(secret, writer="cli")
    scrubbed = s.rows("SELECT before, after FROM write_log WHERE table_name = 'facts'"
                      " AND row_id = ?", (secret,))
    assert len(scrubbed) == 3 and not any("zqx4711" in str(r) for r in scrubbed)

    leaf = world.episode("A leaf", "episodes", cites=[world.turn("hello")])
    world.episode("Its parent", "consolidate", level=1, children=[leaf])
    clock.advance(31 * DAY)
    assert world.episodes.purge_tombstones("janitor") == 1
    clock.advance(WRITE_LOG_RETENTION_DAYS * DAY)
    world.turn("later")  # the log's newest entry, which never expires, is not the leaf's
    assert janitor.expire_write_log(s, clock.now()) >= 3  # insert, update, delete, citation
    assert s.scalar("SELECT count(*) FROM write_log WHERE table_name IN"
                    " ('episodes', 'episode_citations') AND row_id = ?", (leaf,)) == 0
    assert not s._expiring_write_log  # the permission ends with the janitor's transaction
    with pytest.raises(apsw.ConstraintError, match="append-only"):
        s.conn.execute("DELETE FROM write_log WHERE table_name = 'episodes'")


# -- a rollback is logged, and can be rolled back -----------------------------------

def test_a_rollback_can_itself_be_rolled_back(world: World) -> None:
    s, clock = world.store, world.clock
    turn = world.turn("We adopted a dog called Rex")
    old = world.fact("Ana", "pet", "none", "graph")
    gone = world.fact("Ana", "city", "Porto", "graph")
    earlier = world.episode("Ana wanted a dog", "episodes", cites=[turn])
    since = clock.now()
    clock.advance(1)
    world.fact("Ana", "pet", "Rex", "facts", confidence=0.9)
    s.delete("facts", "facts", gone)
    world.episode("The dog arrived", "facts", cites=[turn])
    other_turn = world.turn("Rex is a terrier")
    s.insert("facts", "episode_citations", {"episode_id": earlier, "transcript_id": other_turn})
    clock.advance(60)
    bad = snapshot(s)

    p = plan(s, writer="facts", since=since)
    relinked = [c for c in p.changes if c.action == "relink"]
    assert [(c.ref, c.cite_remove) for c in relinked] == [(f"episode:{earlier}", (other_turn,))]
    first = apply(s, p)
    assert first.changes == 5
    assert world.episodes.citations(earlier) == [turn]
    undone = snapshot(s)
    assert undone != bad
    clock.advance(60)

    p = plan(s, writer="rollback", since=first.at)
    assert refs(p) == set(first.refs) and p.skipped == ()
    second = apply(s, p)
    assert snapshot(s) == bad  # back to the job's writes, ids and citations included
    consistent(s)
    clock.advance(60)
    apply(s, plan(s, writer="rollback", since=second.at))  # and undone once more
    assert snapshot(s) == undone
    assert s.get("facts", old)["valid_to"] is None


# -- the log, read ------------------------------------------------------------------

def test_log_entries_filter_by_writer_time_and_table(world: World) -> None:
    s, clock = world.store, world.clock
    world.fact("Ana", "likes", "tea", "graph")
    clock.advance(10)
    mid = clock.now()
    world.fact("Ana", "likes", "coffee", "facts")
    world.turn("hello")
    entries = log_entries(s, writer="facts")
    assert [(e.op, e.table) for e in entries] == [("insert", "facts"), ("update", "facts")]
    assert entries[1].before is not None and entries[1].before["value"] == "tea"
    assert {e.writer for e in log_entries(s, since=mid)} == {"facts", "transcript"}
    assert {e.writer for e in log_entries(s, until=mid - 1)} == {"graph"}
    assert [e.table for e in log_entries(s, tables=["transcript"])] == ["transcript"]
    newest = log_entries(s, limit=2)
    assert [e.id for e in newest] == sorted(e.id for e in newest)
    assert newest[-1].table == "transcript"


# -- check-facts --------------------------------------------------------------------

def test_check_facts_flags_what_the_cited_turns_do_not_say(world: World) -> None:
    turn = world.turn("I moved to Porto in 2023")
    good = world.fact("Ana", "lives_in", "Porto", "facts", kind="place",
                      provenance=[f"turn:{turn}"])
    bad = world.fact("Ana", "moved_in", "Lisbon, 2021", "facts", provenance=[f"turn:{turn}"])
    found = {u.fact_id: u.missing for u in unsupported_facts(world.store)}
    assert found == {bad: ("Lisbon", "2021")}
    assert good not in found


# -- times --------------------------------------------------------------------------

def test_times_are_read_in_the_household_zone() -> None:
    zone = timezone(timedelta(hours=-3))
    now = datetime(2026, 5, 10, 15, 0, tzinfo=zone).timestamp()

    def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
        return datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()

    assert doctor.parse_time("2026-05-01 14:30", now, zone) == at(2026, 5, 1, 14, 30)
    assert doctor.parse_time("2026-05-01", now, zone) == at(2026, 5, 1)
    assert doctor.parse_time("2026-05-01T14:30:00+02:00", now, zone) == at(2026, 5, 1, 9, 30)
    assert doctor.parse_time("today", now, zone) == at(2026, 5, 10)
    assert doctor.parse_time("yesterday 21:30", now, zone) == at(2026, 5, 9, 21, 30)
    assert doctor.parse_time("14:30", now, zone) == at(2026, 5, 10, 14, 30)
    assert doctor.parse_time("16:00", now, zone) == at(2026, 5, 9, 16, 0)  # its last time
    assert doctor.parse_time("9am", now, zone) == at(2026, 5, 10, 9, 0)
    assert doctor.parse_time("2 hours ago", now, zone) == now - 7200
    assert doctor.parse_time("3 days ago", now, zone) == now - 3 * 86400
    assert doctor.parse_time("@1777642200", now, zone) == 1777642200.0
    for bad in ("tomorrow", "in 2 hours", "2026-13-01", "25:00", "2027-01-01"):
        with pytest.raises(ValueError):
            doctor.parse_time(bad, now, zone)


# -- the commands -------------------------------------------------------------------

def _env(data_dir: Path) -> dict[str, str]:
    return {**os.environ, "REVERIE_DATA_DIR": str(data_dir),
            "REVERIE_HOUSEHOLD__TIMEZONE": "UTC",
            "REVERIE_RUNTIME__NAMESPACE": "test-doctor"}


def reverie(env: dict[str, str], *args: str,
            stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_reverie(env, "doctor", *args, stdin=stdin, timeout=120)  # no runtime here: a process


def test_doctor_commands(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = _env(data)
    missing = reverie(env, "log")
    assert missing.returncode == 2 and "no memory database" in missing.stderr

    start = time.time() - 3600
    w = open_world(data / "reverie.db", ManualClock(start))
    turn = w.turn("I moved to Porto in 2023")
    home = w.fact("Ana", "lives_in", "Porto", "graph", kind="place",
                  provenance=[f"turn:{turn}"])
    w.clock.advance(600)
    since = w.clock.now()
    w.clock.advance(600)
    bad = w.fact("Ana", "lives_in", "Lisbon", "facts", kind="place", confidence=0.9,
                 provenance=[f"turn:{turn}"])
    w.episode("Ana moved to Lisbon", "facts", cites=[turn])
    before = snapshot(w.store)
    w.store.close()

    def now_snapshot() -> dict[str, list[dict[str, Any]]]:
        with Store(data / "reverie.db", KINDS) as store:
            return snapshot(store)

    logged = reverie(env, "log", "--writer", "facts")
    assert logged.returncode == 0, logged.stderr
    lines = logged.stdout.splitlines()
    assert len(lines) == 4 and all(" facts " in line for line in lines)
    assert f"fact:{bad}" in logged.stdout and "valid_to, superseded_by" in logged.stdout

    checked = reverie(env, "check-facts")
    assert checked.returncode == 0, checked.stderr
    assert f"fact:{bad}" in checked.stdout and "Lisbon" in checked.stdout
    assert f"fact:{home} " not in checked.stdout

    for bad_input in (["rollback"], ["rollback", "--since", "1 hour ago"],
                      ["rollback", "--to", "1 hour ago", "--writer", "facts"],
                      ["rollback", "--to", "someday"], ["rollback", "--to", "2099-01-01"]):
        result = reverie(env, *bad_input)
        assert result.returncode == 2, (bad_input, result.stdout, result.stderr)
    when = f"@{since:.3f}"
    declined = reverie(env, "rollback", "--writer", "facts", "--since", when, stdin="n\n")
    assert declined.returncode == 1, declined.stderr
    assert "Apply? [y/N]" in declined.stdout and f"fact:{bad}" in declined.stdout
    no_answer = reverie(env, "rollback", "--writer", "facts", "--since", when)
    assert no_answer.returncode == 1
    assert now_snapshot() == before

    done = reverie(env, "rollback", "--writer", "facts", "--since", when, stdin="y\n")
    assert done.returncode == 0, done.stderr
    after = now_snapshot()
    assert [f["id"] for f in after["facts"]] == [home] and after["episodes"] == []
    nothing = reverie(env, "rollback", "--writer", "facts", "--since", when)
    assert nothing.returncode == 0 and "nothing to roll back" in nothing.stdout

    undo = re.search(r"--since '([^']+)'", done.stdout)
    assert undo is not None, done.stdout
    redo = reverie(env, "rollback", "--writer", "rollback", "--since", undo.group(1), "--yes")
    assert redo.returncode == 0, redo.stderr
    assert "Apply?" not in redo.stdout
    assert now_snapshot() == before
    log_of_rollbacks = reverie(env, "log", "--writer", "rollback", "--since",
                               (datetime.now(UTC) - timedelta(minutes=5)).isoformat())
    assert log_of_rollbacks.returncode == 0
    assert len(log_of_rollbacks.stdout.splitlines()) >= 6  # both rollbacks, logged
