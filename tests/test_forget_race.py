"""A job reads a memory, the user forgets it, then the job writes what it made
from it: the owners' services refuse the write (runtime.memories.cited), per
kind of derived memory, and nothing of it is stored, in the rows or in the
write log. The jobs take the refusal as "skip this item" (or, consolidate,
"write the rest without it"), never as a failed run. On a real SQLite store
with the real model (the ``memory`` fixture); through the actors:
tests/test_forget_actors.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401

from runtime.config import LLMSettings, ProviderSettings
from runtime.llm.providers import make_llm
from runtime.memories.cited import StaleCitation, stale
from runtime.memories.digests import DigestBatch, DigestIn
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.portrait import PortraitIn, PortraitLine
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import distil, dmn, extract
from runtime.mind.contract import JobContext
from runtime.mind.digest_job import digest_step, span_of
from runtime.mind.synthesis import synthesise
from runtime.store.job_state import get_state
from runtime.time.clock import DAY, ManualClock, household_zone

SECRET = "Caroline is seeing a divorce lawyer"  # what the forgotten turn said


def a_turn(memory: Memory, text: str = f"{SECRET}, she told me.") -> int:
    return memory.add_turn(TurnIn(channel="voice", role="user", content=text, source="user",
                                  speaker="Caroline"))


def an_episode(memory: Memory, gist: str, cites: list[int] | None = None) -> int:
    now = memory.store.clock.now()
    return memory.add_episode(EpisodeIn(channel="voice", source="user", gist=gist,
                                        salience=6, cites=cites or [], started_at=now,
                                        ended_at=now + 60))


def a_fact(memory: Memory, key: str, value: str, provenance: list[str]) -> int:
    fact_id, _ = memory.add_fact(FactIn(kind="user_specific", subject="Caroline", key=key,
                                        value=value, confidence=0.8, source="user",
                                        provenance=provenance))
    return fact_id


def forget(memory: Memory, ref: str) -> None:
    kind, _, number = ref.partition(":")
    memory.change(Ref(kind, int(number)), "delete")  # type: ignore[arg-type]


def nowhere(memory: Memory, words: str) -> bool:
    """``words`` are in no row of the derived tables and no write-log entry."""
    like = f"%{words}%"
    return not any(memory.store.scalar(sql, (like,) * sql.count("?")) for sql in (
        "SELECT count(*) FROM episodes WHERE gist LIKE ?",
        "SELECT count(*) FROM facts WHERE value LIKE ?",
        "SELECT count(*) FROM portraits WHERE lines LIKE ?",
        "SELECT count(*) FROM digests WHERE text LIKE ?",
        "SELECT count(*) FROM write_log WHERE before LIKE ? OR after LIKE ?"))


def refused(write: Callable[[], Any], *refs: str) -> StaleCitation:
    with pytest.raises(StaleCitation) as caught:
        write()
    assert caught.value.refs == refs
    assert SECRET not in str(caught.value)  # the refusal names refs, never content
    return caught.value


def test_an_episode_citing_a_turn_forgotten_since_the_read_is_refused(memory: Memory) -> None:
    kept, gone = a_turn(memory, "We booked the dentist for Friday."), a_turn(memory)
    forget(memory, f"turn:{gone}")  # between the job's read and its write
    rows = memory.store.scalar("SELECT count(*) FROM episodes")
    error = refused(lambda: an_episode(memory, f"Caroline said: {SECRET}.", [kept, gone]),
                    f"turn:{gone}")
    assert error.what == "episode"
    assert memory.store.scalar("SELECT count(*) FROM episodes") == rows
    assert memory.store.scalar("SELECT count(*) FROM episode_citations") == 0
    assert nowhere(memory, SECRET)


def test_a_rollup_of_a_forgotten_episode_is_refused(memory: Memory) -> None:
    first = an_episode(memory, "Caroline planted tomatoes in the allotment.")
    second = an_episode(memory, "Caroline met her lawyer about the divorce papers.")
    forget(memory, f"episode:{second}")
    now = memory.store.clock.now()
    parent = EpisodeIn(channel="voice", source="user", level=1, children=[first, second],
                       gist=f"Caroline's month: tomatoes; {SECRET}.", started_at=now,
                       ended_at=now + 60)
    refused(lambda: memory.add_episode(parent), f"episode:{second}")
    assert memory.episodes.get(first)["tombstoned_at"] is None  # nothing rolled up
    assert nowhere(memory, SECRET)


@pytest.mark.parametrize("source", ["turn", "episode", "fact"])
def test_a_fact_whose_provenance_was_forgotten_since_the_read_is_refused(
        memory: Memory, source: str) -> None:
    made = {"turn": lambda: a_turn(memory),
            "episode": lambda: an_episode(memory, "Caroline talked about a lawyer today."),
            "fact": lambda: a_fact(memory, "concern", "Caroline sees a lawyer", [])}[source]()
    ref = f"{source}:{made}"
    forget(memory, ref)
    error = refused(lambda: a_fact(memory, "concern_lawyer", SECRET,
                                   [ref, "rule:llm", "geo:place:3"]), ref)
    assert error.what == "fact"
    assert memory.store.scalar("SELECT count(*) FROM facts WHERE key = 'concern_lawyer'") == 0
    assert nowhere(memory, SECRET)


def test_a_portrait_citing_a_forgotten_fact_is_refused_whole(memory: Memory) -> None:
    garden = a_fact(memory, "hobby", "Caroline grows tomatoes", [])
    lawyer = a_fact(memory, "concern", "Caroline sees a lawyer", [])
    forget(memory, f"fact:{lawyer}")
    version = PortraitIn(signature="sig", lines=[
        PortraitLine(section="who", text="Caroline grows tomatoes", refs=[f"fact:{garden}"]),
        PortraitLine(section="concerns", text=SECRET, refs=[f"fact:{lawyer}"])])
    refused(lambda: memory.add_portrait(version), f"fact:{lawyer}")
    assert memory.store.scalar("SELECT count(*) FROM portraits") == 0
    assert nowhere(memory, SECRET)


def test_a_digest_batch_citing_a_forgotten_episode_is_refused(memory: Memory) -> None:
    kept = an_episode(memory, "Caroline planted tomatoes in the allotment.")
    gone = an_episode(memory, "Caroline met her lawyer about the divorce papers.")
    forget(memory, f"episode:{gone}")
    now = memory.store.clock.now()
    batch = DigestBatch(digests=[
        DigestIn(period="day", key="2026-06-01", starts_at=now - 86400, ends_at=now,
                 text="Tomatoes planted.", refs=[f"episode:{kept}"]),
        DigestIn(period="day", key="2026-06-02", starts_at=now, ends_at=now + 86400,
                 text=SECRET, refs=[f"episode:{kept}", f"episode:{gone}"])])
    refused(lambda: memory.write_digests(batch), f"episode:{gone}")
    assert memory.store.scalar("SELECT count(*) FROM digests") == 0  # all or nothing
    assert nowhere(memory, SECRET)


def test_a_disabled_memory_may_be_cited(memory: Memory) -> None:
    """Disabling is reversible: the row is kept, and so is what cites it."""
    turn = a_turn(memory, "The boiler service is booked for March.")
    memory.change(Ref("turn", turn), "disable")
    assert stale(memory.store, [f"turn:{turn}"]) == []
    episode = an_episode(memory, "The boiler service is booked for March.", [turn])
    assert memory.episodes.citations(episode) == [turn]


def test_forgetting_keeps_the_portrait_lines_that_cite_what_is_left(memory: Memory) -> None:
    """The forget cascade's own portrait (the latest less the forgotten lines)
    is not refused for a line citing a memory gone earlier: that line goes too."""
    garden = a_fact(memory, "hobby", "Caroline grows tomatoes", [])
    lawyer = a_fact(memory, "concern", SECRET, [])
    old = an_episode(memory, "Caroline's allotment has a shed.")
    memory.add_portrait(PortraitIn(signature="sig", lines=[
        PortraitLine(section="who", text="Caroline grows tomatoes", refs=[f"fact:{garden}"]),
        PortraitLine(section="routines", text="Caroline's shed", refs=[f"episode:{old}"]),
        PortraitLine(section="concerns", text=SECRET, refs=[f"fact:{lawyer}"])]))
    memory.store.delete("janitor", "episodes", old)  # gone otherwise (purged)
    forget(memory, f"fact:{lawyer}")
    lines = json.loads(memory.store.scalar("SELECT lines FROM portraits ORDER BY id DESC"))
    assert [line["refs"] for line in lines] == [[f"fact:{garden}"]]
    assert nowhere(memory, SECRET)


class ForgetFirst:
    """A job's writer that, before its first write of ``method``, lets the user
    forget ``ref`` (or the ref it names then): the forget lands between the job's
    read and its write."""

    def __init__(self, memory: Memory, method: str, ref: str | Callable[[], str]) -> None:
        self.memory, self.method, self.ref = memory, method, ref
        self.done = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.memory, name)
        if name != self.method or self.done:
            return target

        def first(*args: Any, **kwargs: Any) -> Any:
            self.done = True
            forget(self.memory, self.ref() if callable(self.ref) else self.ref)
            return target(*args, **kwargs)
        return first


def test_consolidate_writes_a_segment_again_without_a_turn_forgotten_meanwhile(
        memory: Memory, clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    kept = a_turn(memory, "We booked the dentist for Friday at nine.")
    gone = a_turn(memory)
    clock.advance(3600)  # the window is closed
    ctx = memory.job_context()
    ctx.writer = ForgetFirst(memory, "add_episode", f"turn:{gone}")
    with caplog.at_level(logging.INFO):
        result = distil.distil(ctx)  # not a failed run
    assert "1 refused (citing forgotten turns)" in result.detail
    [episode] = memory.store.rows("SELECT id, gist FROM episodes")
    assert memory.episodes.citations(episode["id"]) == [kept]  # the rest is not lost
    assert "dentist" in episode["gist"]
    assert nowhere(memory, SECRET)
    assert "lawyer" not in caplog.text


def test_the_facts_job_skips_a_fact_whose_turn_was_forgotten_meanwhile(
        memory: Memory, caplog: pytest.LogCaptureFixture) -> None:
    gone = a_turn(memory, "Remember that my locker code is 4417.")
    ctx = memory.job_context()
    ctx.writer = ForgetFirst(memory, "add_fact", f"turn:{gone}")
    with caplog.at_level(logging.INFO):
        result = extract.run(ctx)
    assert "citing forgotten memories" in result.detail
    assert memory.store.scalar("SELECT count(*) FROM facts") == 0
    assert nowhere(memory, "4417")
    assert "4417" not in caplog.text


def test_the_synthesis_job_skips_a_portrait_citing_a_fact_forgotten_meanwhile(
        memory: Memory, caplog: pytest.LogCaptureFixture) -> None:
    a_fact(memory, "lives_in", "Caroline lives in Lisbon", [])
    lawyer = a_fact(memory, "concern_lawyer", SECRET, [])
    ctx = memory.job_context()
    ctx.writer = ForgetFirst(memory, "add_portrait", f"fact:{lawyer}")
    with caplog.at_level(logging.INFO):
        result = synthesise(ctx)  # not a failed run
    assert result.items == 0 and "forgotten during the run" in result.detail
    assert memory.store.scalar("SELECT count(*) FROM portraits") == 0
    assert nowhere(memory, SECRET)
    assert "lawyer" not in caplog.text
    again = synthesise(memory.job_context())  # the next run makes it from what is left
    assert again.items == 1
    assert nowhere(memory, SECRET)


# -- the rows that quoted what they were given without citing it (issue 24) ---------


def test_a_model_digest_of_a_day_whose_uncited_turn_was_forgotten_meanwhile_is_refused(
        memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI,
        caplog: pytest.LogCaptureFixture) -> None:
    """The model is given the day's user lines, of turns no episode cites yet;
    the digest cites those turns, so one forgotten before the write refuses it."""
    gone = a_turn(memory)
    clock.advance(4 * DAY)  # the day has ended and settled, with no episode
    fake_openai.replies = [json.dumps({"summary": f"Caroline said: {SECRET}."})] * 4
    ctx = JobContext(store=memory.store, llm=make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=fake_openai.base_url, model="tiny", timeout_s=5)])),
        writer=ForgetFirst(memory, "write_digests", f"turn:{gone}"), clock=memory.clock,
        settings=memory.settings)
    with caplog.at_level(logging.INFO):
        result = digest_step(ctx)  # not a failed run
    assert any(SECRET in r.body["messages"][1]["content"] for r in fake_openai.requests)
    assert result.items == 0
    assert memory.store.scalar("SELECT count(*) FROM digests") == 0
    assert nowhere(memory, SECRET)
    assert "lawyer" not in caplog.text


def test_the_reflection_tells_no_finding_forgotten_during_its_run(
        memory: Memory, clock: ManualClock) -> None:
    """The reflection writes its findings, then tells them in an episode naming
    them (its provenance): one forgotten in between (here by forgetting the turn
    it rests on) is not told."""
    said = a_turn(memory, f"I am so scared: {SECRET}.")
    now = clock.now()
    memory.add_episode(EpisodeIn(channel="voice", source="user", salience=8, emotion="fear",
                                 gist=f"Caroline: I am so scared: {SECRET}.", cites=[said],
                                 started_at=now, ended_at=now))
    clock.advance(3600)
    ctx = memory.job_context()
    ctx.writer = ForgetFirst(memory, "add_episode", f"turn:{said}")
    result = dmn.reflect(ctx)  # not a failed run
    assert result.items == 1  # the finding was written (and then forgotten), nothing told
    assert memory.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 0
    assert get_state(memory.store, dmn.JOB, "unsummarised") == []
    assert nowhere(memory, SECRET)


def test_a_compaction_summary_quoting_an_episode_forgotten_meanwhile_is_written_without_it(
        memory: Memory, clock: ManualClock) -> None:
    """Consolidate's summary copies the gists it wrote in the pass and cites
    their episodes: a turn forgotten before the summary is written (its episode
    goes with it) has the summary refused, and written again without that gist;
    the watermark moves all the same."""
    kept = a_turn(memory, "We booked the dentist for Friday at nine.")
    clock.advance(3600)  # two windows: one episode each
    gone = a_turn(memory)
    clock.advance(3600)
    ctx = memory.job_context()
    ctx.writer = ForgetFirst(memory, "compact", f"turn:{gone}")
    distil.distil(ctx)
    [row] = memory.store.rows("SELECT id, summary, watermark FROM compactions")
    assert row["watermark"] == gone
    assert "dentist" in row["summary"] and SECRET not in row["summary"]
    [episode] = memory.store.rows("SELECT id FROM episodes")
    assert memory.episodes.citations(episode["id"]) == [kept]
    assert json.loads(memory.store.scalar("SELECT refs FROM compactions WHERE id = ?", (
        row["id"],))) == [f"episode:{episode['id']}"]
    assert nowhere(memory, SECRET)
    assert "lawyer" not in json.dumps(memory.store.rows(
        "SELECT before, after FROM write_log WHERE table_name = 'compactions'"))


def test_a_model_weekly_given_a_daily_note_forgotten_meanwhile_is_refused(
        memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    """A week's model is given its daily notes as colour and cites them
    (``digest:N``): the turn a daily was made from forgotten before the weekly
    is written takes the daily, and the weekly is refused."""
    gone = a_turn(memory)
    zone = household_zone(memory.settings.household.timezone)
    day = span_of("day", datetime.fromtimestamp(clock.now(), zone).date(), zone)
    [daily] = memory.write_digests(DigestBatch(digests=[DigestIn(
        period="day", key=day.key, starts_at=day.starts_at, ends_at=day.ends_at,
        text=f"Caroline said: {SECRET}.", refs=[f"turn:{gone}"], how="llm")]))
    clock.advance(9 * DAY)  # its week has ended and settled
    fake_openai.replies = [json.dumps({"summary": f"A hard week: {SECRET}."})] * 4
    ctx = JobContext(store=memory.store, llm=make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=fake_openai.base_url, model="tiny", timeout_s=5)])),
        writer=ForgetFirst(memory, "write_digests", f"turn:{gone}"), clock=memory.clock,
        settings=memory.settings)
    result = digest_step(ctx)
    assert any(SECRET in r.body["messages"][1]["content"] for r in fake_openai.requests)
    assert result.items == 0
    assert memory.store.row("SELECT id FROM digests WHERE id = ?", (daily,)) is None
    assert memory.store.scalar("SELECT count(*) FROM digests") == 0  # no weekly either
    assert nowhere(memory, SECRET)
