"""Forgetting a fact or an episode forgets the summaries written from it: the
portrait versions and the digests that cite it, live or already pruned, with
their content in the write log (runtime.memories.derived). Forgetting a turn
forgets what quotes it; a forgotten memory's lines leave stored tool results and
its gist the compaction summaries. On a real SQLite store with the real model
(the ``memory`` fixture). The same through a running runtime and the command
line: tests/test_forget_everywhere.py."""

from __future__ import annotations

import json

from runtime.memories import derived
from runtime.memories.digests import DigestBatch, DigestIn, shown
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.portrait import PortraitIn, PortraitLine
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import distil, dmn
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import ManualClock

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


# -- what quotes a turn, tool results, compaction summaries (issue 24) ---------------


def a_turn(memory: Memory, content: str, channel: str = "voice") -> int:
    return memory.add_turn(TurnIn(channel=channel, source="user", speaker="Caroline",
                                  content=content))


def everywhere(memory: Memory, text: str) -> list[str]:
    """The tables (every one of sqlite_master, FTS5 shadow tables too) with a row
    holding ``text``."""
    found = []
    for (table,) in memory.store.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"):
        for row in memory.store.conn.execute(f'SELECT * FROM "{table}"'):
            if any(text.encode() in (v if isinstance(v, bytes) else str(v).encode())
                   for v in row if v is not None):
                found.append(str(table))
                break
    return found


def test_forgetting_a_turn_forgets_what_quotes_it(memory: Memory) -> None:
    """The episodes citing it (the leaf and the roll-up above it), the facts
    resting on it, the digests written from those and a language model's digest
    of its day (live, or pruned with its text in the log); each with its content
    in the write log. What does not quote it stays."""
    turn = a_turn(memory, f"{SECRET}, she told me this morning.")
    other = a_turn(memory, "Caroline planted tomatoes in the back garden.")
    now = memory.store.clock.now()
    leaf = memory.add_episode(EpisodeIn(
        channel="voice", source="user", gist=f"Caroline: {SECRET}, she told me this morning.",
        cites=[turn, other], started_at=now, ended_at=now))
    kept = memory.add_episode(EpisodeIn(channel="voice", source="user", cites=[other],
                                        gist="Caroline planted tomatoes.", started_at=now,
                                        ended_at=now))
    parent = memory.add_episode(EpisodeIn(channel="voice", source="user", level=1,
                                          gist=f"{SECRET}. Tomatoes.", cites=[turn, other],
                                          children=[leaf], started_at=now, ended_at=now))
    resting, _ = memory.add_fact(FactIn(kind="user_specific", subject="Caroline",
                                        key="concern_lawyer", value=SECRET, confidence=0.9,
                                        source="user", provenance=[f"turn:{turn}", "rule:x"]))
    unrelated, _ = memory.add_fact(FactIn(kind="user_specific", subject="Caroline",
                                          key="hobby", value="Caroline grows tomatoes",
                                          confidence=0.9, source="user",
                                          provenance=[f"turn:{other}"]))
    [by_model, pruned] = memory.write_digests(DigestBatch(digests=[
        DigestIn(period="day", key="2026-06-01", starts_at=now - 60, ends_at=now + 60,
                 text="A quiet day about the garden.", refs=[f"episode:{kept}"], how="llm"),
        DigestIn(period="week", key="2026-W22", starts_at=now - 3600, ends_at=now + 3600,
                 text=f"The week: {SECRET}.", refs=[f"episode:{kept}"], how="llm")]))
    memory.write_digests(DigestBatch(prune=[pruned]))
    offline = digest(memory, "day", "2026-06-02", "Tomatoes planted.", [f"episode:{kept}"])
    citing_leaf = digest(memory, "month", "2026-06", f"June: {SECRET}.", [f"episode:{leaf}"])

    memory.change(Ref("turn", turn), "delete")

    assert ids(memory, "episodes") == [kept]
    assert [r["id"] for r in memory.store.rows("SELECT id FROM facts")] == [unrelated]
    assert resting != unrelated
    assert ids(memory, "digests") == [offline]  # by_model: the model saw the day's lines
    assert {by_model, citing_leaf, pruned}.isdisjoint(ids(memory, "digests"))
    assert everywhere(memory, SECRET) == []
    assert everywhere(memory, "she told me") == []
    assert parent not in ids(memory, "episodes")


def test_forgetting_a_memory_takes_its_lines_out_of_tool_results(memory: Memory) -> None:
    """The pull-mode recall tool's answer, stored in another turn's tool call:
    the forgotten fact's line goes, the others stay; the write log of that tool
    call (and of one gone with a pruned turn) keeps no content."""
    lawyer = a_fact(memory, "concern_lawyer", SECRET)
    garden = a_fact(memory, "hobby_garden", "Caroline grows tomatoes")
    answer = (f"- [fact:{lawyer}] Caroline concern_lawyer: {SECRET}\n"
              f"- [fact:{garden}] Caroline hobby_garden: Caroline grows tomatoes")
    asked = memory.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                   content="Here is what I know."))
    call = memory.transcript.add_tool_call(asked, "recall", {"query": "Caroline"}, answer)
    gone_turn = memory.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                       content="Earlier."))
    memory.transcript.add_tool_call(gone_turn, "recall", {"query": "x"}, answer)
    memory.store.delete("janitor", "transcript", gone_turn)  # pruned: its calls by cascade

    memory.change(Ref("fact", lawyer), "delete")

    row = memory.store.row("SELECT result FROM tool_calls WHERE id = ?", (call,))
    assert row == {"result": f"- [fact:{garden}] Caroline hobby_garden: Caroline grows tomatoes"}
    assert everywhere(memory, SECRET) == []
    assert memory.transcript.get(asked) is not None  # the turn stays


def test_forgetting_an_episode_rewrites_the_compaction_summaries_quoting_it(
        memory: Memory) -> None:
    """The summary keeps its header, its watermark and the other gists; the write
    log of the compaction keeps no content."""
    private = an_episode(memory, f"Caroline: {SECRET} since the spring.")
    an_episode(memory, "Melanie: we planted tomatoes in the back garden.")
    turn = a_turn(memory, "hello", channel="kitchen")
    summary = (f"Conversation on kitchen up to 2026-06-01 10:00: Caroline: {SECRET} since the "
               "spring. … Melanie: we planted tomatoes in the back garden.")
    compaction = memory.compact("kitchen", summary, turn)
    untouched = memory.compact("kitchen", "Conversation on kitchen up to 2026-06-02 10:00: "
                                          "nothing new to remember.", turn)

    memory.change(Ref("episode", private), "delete")

    assert memory.store.rows("SELECT id, summary, watermark FROM compactions ORDER BY id") == [
        {"id": compaction, "watermark": turn, "summary": "Conversation on kitchen up to "
         "2026-06-01 10:00: Melanie: we planted tomatoes in the back garden."},
        {"id": untouched, "watermark": turn, "summary": "Conversation on kitchen up to "
         "2026-06-02 10:00: nothing new to remember."}]
    assert everywhere(memory, SECRET) == []


def test_a_summary_loses_the_gist_quoting_a_text_clipped_or_not() -> None:
    gist = f"Caroline: {SECRET} since the spring, and she has not told her mother yet."
    head = "Conversation on kitchen up to 2026-06-01 10:00"
    other = "Melanie: we planted tomatoes."
    assert derived.summary_without(f"{head}: {other} … {gist}", gist) == f"{head}: {other}"
    clipped = f"{head}: {other} … {gist[:40]}…"  # distil clips the summary at its end
    assert derived.summary_without(clipped, gist) == f"{head}: {other}"
    # a turn's sentence copied into an extractive gist, under its speaker's name
    turn = f"Good morning. {SECRET} since the spring!"
    assert derived.summary_without(f"{head}: Ana: {SECRET} since the spring; Ben: ok", turn
                                   ) == f"{head}: {derived.FORGOTTEN}"
    assert derived.summary_without(f"{head}: {other}", gist) == f"{head}: {other}"
    assert derived.summary_without(f"{head}: {other}", "Oh no.") == f"{head}: {other}"


def test_find_matching_searches_tool_calls(memory: Memory) -> None:
    """A client tool's result names its turn; a recall answer whose only matching
    line is that of a memory found already does not (forgetting the memory takes
    the line out)."""
    fact = a_fact(memory, "concern_lawyer", SECRET)
    told = memory.add_turn(TurnIn(channel="voice", source="assistant", role="assistant",
                                  content="I read your notes."))
    memory.transcript.add_tool_call(told, "read_notes", {}, f"Friday: {SECRET} at ten")
    recalled = memory.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                      content="Here is what I know."))
    memory.transcript.add_tool_call(recalled, "recall", {"query": "Caroline"},
                                    f"- [fact:{fact}] Caroline concern_lawyer: {SECRET}")
    found = memory.find_matching(SECRET)
    assert [str(m.ref) for m in found] == [f"fact:{fact}", f"turn:{told}"]
    assert found[1].text == f"tool read_notes: Friday: {SECRET} at ten"
    assert memory.find_matching("Friday ten")[0].ref == Ref("turn", told)
    assert memory.find_matching("Friday eleven") == []


# -- what the reflection's episode, a model's digest and a compaction were made from ----


def test_forgetting_a_finding_forgets_the_episode_telling_it(memory: Memory) -> None:
    """The reflection's episode names the findings it tells (its provenance):
    forgetting one of them, by hand, forgets the episode, whole."""
    said = a_turn(memory, f"I am so scared: {SECRET}.")
    now = memory.store.clock.now()
    memory.add_episode(EpisodeIn(channel="voice", source="user", salience=8, emotion="fear",
                                 gist=f"Caroline: I am so scared: {SECRET}.", cites=[said],
                                 started_at=now, ended_at=now))
    dmn.reflect(memory.job_context())
    [finding] = memory.store.rows("SELECT id FROM facts WHERE source = 'dmn'")
    [told] = memory.store.rows("SELECT id, gist FROM episodes WHERE source = 'dmn'")
    assert SECRET in told["gist"]

    memory.change(Ref("fact", finding["id"]), "delete")

    assert memory.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 0
    assert not [t for (t,) in memory.store.conn.execute(
        "SELECT before || after FROM write_log WHERE table_name = 'episodes' AND row_id = ?",
        (told["id"],)) if t and SECRET in t]


def test_forgetting_an_episode_forgets_the_model_digests_given_a_digest_citing_it(
        memory: Memory) -> None:
    """A model's weekly cites the daily notes it was given (``digest:N``): when a
    daily goes with its episode, the weekly that may quote it goes too."""
    private = an_episode(memory, SECRET)
    garden = an_episode(memory, "Caroline planted tomatoes")
    daily = digest(memory, "day", "2026-06-01", f"{SECRET}.", [f"episode:{private}"])
    weekly = digest(memory, "week", "2026-W23", f"A week of worry: {SECRET}.",
                    [f"episode:{garden}", f"digest:{daily}"])
    monthly = digest(memory, "month", "2026-06", "June: tomatoes.", [f"episode:{garden}"])

    memory.change(Ref("episode", private), "delete")

    assert {daily, weekly}.isdisjoint(ids(memory, "digests"))
    assert ids(memory, "digests") == [monthly]
    assert everywhere(memory, SECRET) == []


def test_a_digest_given_a_turn_now_disabled_is_not_shown(memory: Memory) -> None:
    turn = a_turn(memory, "Caroline booked the vet for the cat.")
    day = digest(memory, "day", "2026-06-01", "The vet is booked.", [f"turn:{turn}"])
    assert [d.id for d in shown(memory.store, memory.digests.listed())] == [day]
    memory.change(Ref("turn", turn), "disable")
    assert shown(memory.store, memory.digests.listed()) == []


def test_a_digest_given_a_hidden_digest_is_not_shown(memory: Memory) -> None:
    """A model's weekly given a daily note (``digest:N``) is hidden when the daily
    is, here because its turn was marked sensitive; a weekly given a daily that is
    no longer stored (pruned after its roll-up) still shows."""
    turn = a_turn(memory, "Caroline booked the vet for the cat.")
    day = digest(memory, "day", "2026-06-01", "The vet is booked.", [f"turn:{turn}"])
    other = digest(memory, "day", "2026-06-02", "Tomatoes.", [])
    week = digest(memory, "week", "2026-W22", "A week of the vet.", [f"digest:{day}"])
    month = digest(memory, "month", "2026-06", "June.", [f"digest:{week}"])
    pruned_day = digest(memory, "week", "2026-W23", "Tomatoes all week.", [f"digest:{other}"])
    memory.write_digests(DigestBatch(prune=[other]))
    assert {d.id for d in shown(memory.store, memory.digests.listed())} == {
        day, week, month, pruned_day}
    memory.change(Ref("turn", turn), "sensitive")
    assert [d.id for d in shown(memory.store, memory.digests.listed())] == [pruned_day]


def test_forgetting_an_episode_takes_its_gist_out_of_a_summary_by_its_ref(
        memory: Memory, clock: ManualClock) -> None:
    """Consolidate's summary cites the episode of each gist: the gist goes with
    its episode even when its text no longer matches the episode's (the user
    corrected the gist since)."""
    a_turn(memory, "We booked the dentist for Friday at nine.")
    clock.advance(3600)
    a_turn(memory, f"{SECRET}, she told me this morning.")
    clock.advance(3600)
    distil.distil(memory.job_context())
    [summary] = memory.store.rows("SELECT id, summary FROM compactions")
    assert SECRET in summary["summary"]
    [private] = [r["id"] for r in memory.store.rows("SELECT id, gist FROM episodes")
                 if SECRET in r["gist"]]
    memory.episodes.edit(private, "Caroline talked about a personal matter.")

    memory.change(Ref("episode", private), "delete")

    [row] = memory.store.rows("SELECT id, summary FROM compactions")
    assert "dentist" in row["summary"] and SECRET not in row["summary"]
    assert SECRET not in log_text(memory, "compactions")
    [kept] = [r["id"] for r in memory.store.rows("SELECT id FROM episodes")]
    assert json.loads(memory.store.scalar("SELECT refs FROM compactions")) == [
        f"episode:{kept}"]


def test_forgetting_an_episode_forgets_the_roll_ups_above_it(memory: Memory) -> None:
    """A roll-up's gist is written from its children's gists: forgetting a child
    episode by hand (not its turns) forgets the roll-up above it and the one
    above that, with their content in the write log; a sibling stays, and comes
    back as an apex (no longer tombstoned: the next roll-up round rolls it up
    again, the janitor does not purge it), and an unrelated apex stays."""
    now = memory.store.clock.now()
    child = an_episode(memory, f"Caroline: {SECRET}.")
    sibling = an_episode(memory, "Caroline planted tomatoes.")
    apart = an_episode(memory, "Bob fixed the bike.")

    def roll_up(level: int, gist: str, children: list[int]) -> int:
        return memory.add_episode(EpisodeIn(channel="voice", source="user", level=level,
                                            gist=gist, children=children, started_at=now,
                                            ended_at=now + 60))

    theme = roll_up(1, f"{SECRET}; tomatoes.", [child, sibling])
    era = roll_up(2, f"A season: {SECRET}.", [theme])
    assert SECRET in log_text(memory, "episodes")
    assert memory.store.get("episodes", sibling)["tombstoned_at"] is not None

    memory.change(Ref("episode", child), "delete")

    assert ids(memory, "episodes") == [sibling, apart]
    assert {theme, era}.isdisjoint(ids(memory, "episodes"))
    assert SECRET not in log_text(memory, "episodes")
    assert everywhere(memory, SECRET) == []
    revived = memory.store.get("episodes", sibling)
    assert (revived["tombstoned_at"], revived["parent_id"]) == (None, None)
    assert [r["id"] for r in memory.episodes.apexes("voice", 0)] == [sibling, apart]
