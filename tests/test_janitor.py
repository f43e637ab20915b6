"""The decay job (janitor) deletes exactly what the rules say, on real SQLite."""

from __future__ import annotations

from collections.abc import Callable

import apsw
import pytest

from actors.job_actor import guard
from runtime.config import Settings
from runtime.llm.providers import FallbackChain, OfflineProvider
from runtime.memories.decay import WRITE_LOG_RETENTION_DAYS
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import janitor
from runtime.mind.contract import JobContext
from runtime.store.database import Store
from runtime.time.clock import DAY, ManualClock


def _run(memory: Memory, settings: Settings, clock: ManualClock) -> janitor.JobResult:
    ctx = JobContext(store=memory.store, writer=memory, llm=FallbackChain([OfflineProvider()]),
                     clock=clock, settings=settings)
    return janitor.run(ctx)


def _leaf(memory: Memory, gist: str, cites: list[int] | None = None) -> int:
    return memory.add_episode(EpisodeIn(channel="voice", source="user", gist=gist,
                                        cites=cites or []))


def _log_rows(memory: Memory, table: str, row_id: int) -> int:
    return int(memory.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = ? AND row_id = ?", (table, row_id)))


def test_tombstones_go_after_thirty_days_not_before(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    turn = memory.add_turn(TurnIn(channel="voice", source="user", content="We went to Porto."))
    old, young, live = (_leaf(memory, f"Leaf {n}.", [turn]) for n in ("old", "young", "live"))
    memory.add_episode(EpisodeIn(channel="voice", source="user", level=1, gist="Old parent.",
                                 children=[old]))
    clock.advance(2 * DAY)
    memory.add_episode(EpisodeIn(channel="voice", source="user", level=1, gist="New parent.",
                                 children=[young]))
    clock.advance(29 * DAY)  # old: tombstoned 31 days ago; young: 29 days ago

    result = _run(memory, make_settings(), clock)

    assert memory.episodes.get(old) is None
    assert memory.episodes.citations(old) == []
    assert memory.episodes.get(young) is not None
    assert memory.episodes.get(live) is not None
    assert result.items == 1 and "1 tombstones purged" in result.detail
    assert memory.store.row(
        "SELECT writer FROM write_log WHERE table_name = 'episodes' AND row_id = ?"
        " AND op = 'delete'", (old,)) == {"writer": "janitor"}


def test_transcript_rows_below_the_watermark_and_uncited_go_with_their_tool_calls(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    rows = memory.add_turns([TurnIn(channel="voice", source="user", content=f"Turn {i}.")
                             for i in range(6)])
    other = memory.add_turns([TurnIn(channel="chat", source="user", content="Unsummarised.")])
    r0, r1, r2, r3, r4, r5 = rows
    uncited_call = memory.transcript.add_tool_call(r1, "lights", {"on": True}, "ok")
    cited_call = memory.transcript.add_tool_call(r2, "timer", {"min": 5}, "set")
    _leaf(memory, "A live episode cites turn 2.", [r2])
    dead = _leaf(memory, "A tombstoned episode cites turn 0.", [r0])
    memory.store.update("test", "episodes", dead, {"tombstoned_at": clock.now()})
    _leaf(memory, "A live episode cites turn 5, above the watermark.", [r5])
    memory.compact("voice", "Turns up to 3.", r3)

    _run(memory, make_settings(), clock)

    remaining = {r[0] for r in memory.store.conn.execute("SELECT id FROM transcript")}
    assert remaining == {r2, r4, r5, *other}  # r0 (only a tombstone cites it), r1, r3 go
    calls = {r[0] for r in memory.store.conn.execute("SELECT id FROM tool_calls")}
    assert calls == {cited_call}
    assert uncited_call not in calls
    assert memory.store.scalar(
        "SELECT count(*) FROM vectors WHERE kind = 'turn' AND item_id IN (?, ?, ?)",
        (r0, r1, r3)) == 0
    assert memory.transcript.watermark("voice") == r3  # the compaction persists


def test_write_log_keeps_fact_history_and_drops_pruned_rows_after_retention(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    settings = make_settings()
    first, _ = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="lives in",
                                      value="Porto", confidence=0.6))
    clock.advance(DAY)
    second, decision = memory.add_fact(FactIn(kind="user_specific", subject="Ana",
                                              key="lives in", value="Lisbon", confidence=0.9))
    assert decision.action == "supersede"
    turns = memory.add_turns([TurnIn(channel="voice", source="user", content=f"Turn {i}.")
                              for i in range(3)])
    pruned, forgotten, kept = turns
    call = memory.transcript.add_tool_call(pruned, "lights", {}, "ok")
    memory.transcript.forget(forgotten)
    leaf = _leaf(memory, "Soon a tombstone.", [kept])
    memory.add_episode(EpisodeIn(channel="voice", source="user", level=1, gist="Parent.",
                                 children=[leaf], cites=[kept]))
    memory.compact("voice", "All of it.", turns[-1])
    fact_log = int(memory.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'facts'"))
    assert _log_rows(memory, "tool_calls", call) == 1

    clock.advance(31 * DAY)
    _run(memory, settings, clock)  # prunes `pruned`, purges `leaf`
    assert memory.transcript.get(pruned) is None and memory.episodes.get(leaf) is None
    assert memory.transcript.get(kept) is not None  # the parent cites it
    assert _log_rows(memory, "transcript", pruned) == 2  # insert, delete: within retention
    assert _log_rows(memory, "episodes", leaf) >= 3
    assert _log_rows(memory, "episode_citations", leaf) == 1

    clock.advance((WRITE_LOG_RETENTION_DAYS - 1) * DAY)
    _run(memory, settings, clock)
    assert _log_rows(memory, "transcript", pruned) == 2  # one day short of retention

    clock.advance(2 * DAY)
    # a later write: the log's newest entry, which never expires, is not theirs
    memory.add_turn(TurnIn(channel="chat", source="user", content="Later."))
    before = int(memory.store.scalar("SELECT count(*) FROM write_log"))
    result = _run(memory, settings, clock)
    after = int(memory.store.scalar("SELECT count(*) FROM write_log"))
    assert f"{before - after} write-log rows expired" in result.detail and before > after
    assert _log_rows(memory, "transcript", pruned) == 0
    assert _log_rows(memory, "tool_calls", call) == 0
    assert _log_rows(memory, "episodes", leaf) == 0
    assert _log_rows(memory, "episode_citations", leaf) == 0
    # facts' history stays whole, and so does the trace of a forgotten turn
    assert memory.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'facts'") == fact_log
    assert _log_rows(memory, "facts", first) >= 2 and _log_rows(memory, "facts", second) >= 1
    assert _log_rows(memory, "transcript", forgotten) == 2
    assert _log_rows(memory, "transcript", kept) >= 1


def test_the_janitor_only_reads_its_connection_and_deletes_through_the_writer_at_its_now(
        memory: Memory, clock: ManualClock) -> None:
    """As in a job actor: the job's own connection may write only ``job_state``
    (``actors.job_actor.guard``) and its clock is the tick's, ahead of the
    owner's. The deletes go through the writer, which selects by the job's now
    and stamps the write log with its own clock."""
    turn = memory.add_turn(TurnIn(channel="voice", source="user", content="The boiler."))
    old = _leaf(memory, "The boiler pressure dropped.", [turn])
    memory.add_episode(EpisodeIn(channel="voice", source="user", level=1,
                                 gist="Home repairs.", children=[old]))
    memory.compact("voice", "The boiler.", turn)
    job_clock = ManualClock(clock.now() + 31 * DAY)  # the owner's clock stays behind
    reader = guard(Store(memory.settings.store.path, memory.kinds, clock=job_clock))
    try:
        with pytest.raises(apsw.AuthError):  # the guard holds on this connection
            reader.delete(janitor.WRITER, "episodes", old)
        result = janitor.run(JobContext(store=reader, writer=memory,
                                        llm=FallbackChain([OfflineProvider()]),
                                        clock=job_clock, settings=memory.settings))
    finally:
        reader.close()
    assert result.items == 2, result.detail  # the tombstone, and the turn only it cited
    assert memory.episodes.get(old) is None and memory.transcript.get(turn) is None
    deletes = memory.store.rows("SELECT table_name, writer, at FROM write_log"
                                " WHERE op = 'delete' ORDER BY id")
    assert [(d["table_name"], d["writer"], d["at"]) for d in deletes] == [
        ("episodes", "janitor", clock.now()), ("transcript", "janitor", clock.now())]


def test_write_log_ids_never_go_back_when_the_newest_rows_expire(
        memory: Memory, clock: ManualClock) -> None:
    """A hub left quiet past retention after its last writes (pruning deletes):
    the expiry would free the newest ids, and SQLite would hand them out again
    (write_log.id has no AUTOINCREMENT). Backup checks read "the rows after the
    replica's last id", so ids must only grow: the newest row is never expired."""
    from runtime.memories.retention import expire_write_log

    turn = memory.add_turn(TurnIn(channel="voice", source="user", content="Soon pruned."))
    memory.store.delete("janitor", "transcript", turn)
    newest = int(memory.store.scalar("SELECT max(id) FROM write_log"))
    clock.advance((WRITE_LOG_RETENTION_DAYS + 1) * DAY)

    assert expire_write_log(memory.store, clock.now()) >= 1  # the turn's insert went

    memory.add_turn(TurnIn(channel="voice", source="user", content="Months later."))
    assert int(memory.store.scalar("SELECT max(id) FROM write_log")) > newest
