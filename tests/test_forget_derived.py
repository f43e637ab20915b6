"""Forgetting a fact or an episode forgets the summaries written from it: the
portrait versions and the digests that cite it, live or already pruned, with
their content in the write log (runtime.memories.derived). On a real SQLite store with
the real model (the ``memory`` fixture)."""

from __future__ import annotations

import json

from runtime.memories import derived
from runtime.memories.digests import DigestBatch, DigestIn
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.portrait import PortraitIn, PortraitLine
from runtime.memories.refs import Ref
from runtime.memory import Memory
from runtime.mind import dmn
from runtime.store.job_state import get_state, set_state

SECRET = "Caroline is seeing a divorce lawyer"  # the forgotten content, searched for


def a_fact(memory: Memory, key: str, value: str) -> int:
    fact_id, _ = memory.add_fact(FactIn(kind="user_specific", subject="Caroline", key=key,
                                        value=value, confidence=0.9, source="user"))
    return fact_id


def an_episode(memory: Memory, gist: str) -> int:
    now = memory.store.clock.now()
    return memory.add_episode(EpisodeIn(channel="voice", source="user", gist=gist,
                                        salience=7, started_at=now, ended_at=now + 60))


def portrait(memory: Memory, *lines: tuple[str, list[str]]) -> int:
    return memory.add_portrait(PortraitIn(
        signature=f"sig-{len(lines)}-{lines[0][0][:8]}",
        lines=[PortraitLine(section="concerns", text=text, refs=refs) for text, refs in lines]))


def digest(memory: Memory, period: str, key: str, text: str, refs: list[str]) -> int:
    now = memory.store.clock.now()
    [digest_id] = memory.write_digests(DigestBatch(digests=[DigestIn(
        period=period, key=key, starts_at=now - 86400, ends_at=now, text=text, refs=refs)]))
    return digest_id


def log_text(memory: Memory, table: str) -> str:
    """Every write-log snapshot of ``table``, as one text."""
    return json.dumps([[r["before"], r["after"]] for r in memory.store.rows(
        "SELECT before, after FROM write_log WHERE table_name = ?", (table,))])


def ids(memory: Memory, table: str) -> list[int]:
    return [r["id"] for r in memory.store.rows(f"SELECT id FROM {table} ORDER BY id")]


def test_forgetting_a_fact_forgets_the_portrait_versions_citing_it(memory: Memory) -> None:
    lawyer = a_fact(memory, "concern_lawyer", SECRET)
    garden = a_fact(memory, "hobby_garden", "Caroline grows tomatoes")
    first = portrait(memory, ("Caroline grows tomatoes", [f"fact:{garden}"]))
    second = portrait(memory, (SECRET, [f"fact:{lawyer}"]),
                      ("Caroline grows tomatoes", [f"fact:{garden}"]))
    third = portrait(memory, ("Caroline grows tomatoes.", [f"fact:{garden}", f"fact:{lawyer}"]))
    assert SECRET in log_text(memory, "portraits")

    memory.change(Ref("fact", lawyer), "delete")

    assert ids(memory, "portraits") == [first]  # the two citing it went, whole
    assert SECRET not in log_text(memory, "portraits")
    forgotten = memory.store.rows(
        "SELECT row_id, op, before FROM write_log WHERE table_name = 'portraits'"
        " AND op = 'delete' ORDER BY row_id")
    assert [(r["row_id"], json.loads(r["before"])) for r in forgotten] == [
        (second, {"id": second, "forgotten": True}), (third, {"id": third, "forgotten": True})]
    # forgetting a fact nothing cites leaves the portrait alone
    memory.change(Ref("fact", a_fact(memory, "pet", "Caroline has a cat")), "delete")
    assert ids(memory, "portraits") == [first]


def test_forgetting_an_episode_forgets_digests_live_and_pruned(memory: Memory) -> None:
    private = an_episode(memory, SECRET)
    garden = an_episode(memory, "Caroline planted tomatoes")
    day = digest(memory, "day", "2026-06-01", f"{SECRET}. Tomatoes planted.",
                 [f"episode:{private}", f"episode:{garden}"])
    other_day = digest(memory, "day", "2026-06-02", "Tomatoes planted.",
                       [f"episode:{garden}"])
    month = digest(memory, "month", "2026-06", f"June: {SECRET}.", [f"episode:{private}"])
    version = portrait(memory, (SECRET, [f"episode:{private}"]))
    # the daily is pruned after its roll-up: the write log kept its text
    memory.write_digests(DigestBatch(prune=[day]))
    assert SECRET in log_text(memory, "digests")

    memory.change(Ref("episode", private), "delete")

    assert ids(memory, "digests") == [other_day]
    assert month not in ids(memory, "digests") and ids(memory, "portraits") == []
    assert version not in ids(memory, "portraits")
    for table in ("digests", "portraits", "episodes"):
        assert SECRET not in log_text(memory, table), table
    # the pruned daily's history is scrubbed, not deleted: the log says it existed
    assert [r["op"] for r in memory.store.rows(
        "SELECT op FROM write_log WHERE table_name = 'digests' AND row_id = ? ORDER BY id",
        (day,))] == ["insert", "delete"]


def test_disabling_forgets_nothing_derived(memory: Memory) -> None:
    """Disabling is reversible: the summaries stay (hidden at read time)."""
    lawyer = a_fact(memory, "concern_lawyer", SECRET)
    version = portrait(memory, (SECRET, [f"fact:{lawyer}"]))
    memory.change(Ref("fact", lawyer), "disable")
    assert ids(memory, "portraits") == [version]
    assert SECRET in log_text(memory, "portraits")


def test_the_latest_portrait_is_replaced_by_its_other_lines(memory: Memory) -> None:
    """The prompt keeps the portrait it showed (less the forgotten lines) until
    the next synthesis run, instead of none."""
    lawyer = a_fact(memory, "concern_lawyer", SECRET)
    garden = a_fact(memory, "hobby_garden", "Caroline grows tomatoes")
    older = portrait(memory, ("Caroline grows tomatoes", [f"fact:{garden}"]))
    latest = portrait(memory, (SECRET, [f"fact:{lawyer}"]),
                      ("Caroline grows tomatoes", [f"fact:{garden}"]))

    memory.change(Ref("fact", lawyer), "delete")

    [kept, replacement] = ids(memory, "portraits")
    assert kept == older and replacement > latest
    row = memory.store.row("SELECT * FROM portraits WHERE id = ?", (replacement,))
    assert row is not None
    assert [(x["text"], x["refs"]) for x in json.loads(row["lines"])] == [
        ("Caroline grows tomatoes", [f"fact:{garden}"])]
    assert SECRET not in log_text(memory, "portraits")


def test_a_finding_not_told_yet_leaves_the_reflections_list(memory: Memory) -> None:
    """A reflection that stopped after writing a finding and before telling it
    (the next pass tells it) has it in its state: forgetting takes it out."""
    private = an_episode(memory, SECRET)
    finding = f"worth following up: {SECRET}"
    fact_id, _ = memory.add_fact(FactIn(
        kind="reflection", subject="user", key="dmn_follow_up_x", value=finding,
        confidence=0.6, source="dmn", provenance=[f"episode:{private}", "rule:dmn"]))
    set_state(memory.store, "dmn", "unsummarised", [finding, "a finding about tomatoes"])

    memory.change(Ref("episode", private), "delete")

    assert memory.store.row("SELECT id FROM facts WHERE id = ?", (fact_id,)) is None
    assert get_state(memory.store, "dmn", "unsummarised") == ["a finding about tomatoes"]
    assert SECRET not in log_text(memory, "facts")
    assert derived.REFLECTION == dmn.SOURCE  # the names runtime.mind.dmn writes under
