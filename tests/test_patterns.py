"""The patterns job on a real store, with the real embedder and an injected clock:
a routine repeated over simulated weeks becomes a pattern, is reinforced by more
weeks, fades while it is silent and is retired, history kept; people and
recurring topics; only sources with the ``patterns`` switch count; what the user
disabled stays disabled; re-runs write nothing."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import make_llm
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.patterns import PatternParams, PatternsJob, When, in_words, run, topics
from runtime.mind.support import unsupported_facts
from runtime.store.database import Row
from runtime.time.clock import ManualClock

LISBON = ZoneInfo("Europe/Lisbon")
START = date(2024, 1, 1)  # a Monday
ROUTINE = "pattern_routine_weather_weekday_morning"
WEATHER = "What's the weather like today?"


def at(day: date, hour: int, minute: int = 0) -> float:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=LISBON).timestamp()


def nonsense(i: int) -> str:
    """A word said only once in the whole simulation."""
    letters = string.ascii_lowercase
    return "zq" + letters[i // 26 % 26] + letters[i % 26] + "ox"


class Household:
    """Caroline's weekdays: the weather at 07:30 (while the routine lasts) and one
    unremarkable request in the evening, one leaf episode a day."""

    def __init__(self, memory: Memory, clock: ManualClock) -> None:
        self.memory = memory
        self.clock = clock
        self.days = 0

    def say(self, day: date, hour: int, text: str, source: str = "user",
            speaker: str = "Caroline", role: str = "user") -> int:
        return self.memory.add_turns([TurnIn(channel="voice", source=source, speaker=speaker,
                                             role=role,  # type: ignore[arg-type]
                                             content=text, created_at=at(day, hour, 30))])[0]

    def week(self, n: int, weather: bool = True) -> None:
        for d in range(5):
            day = START + timedelta(weeks=n, days=d)
            ids = []
            if weather:
                ids.append(self.say(day, 7, WEATHER))
            ids.append(self.say(day, 19, f"Tell me about {nonsense(self.days)}."))
            self.days += 1
            self.clock.set(at(day, 21))
            # a gist of its own: the same gist twice is a near-duplicate
            # (runtime.memories.duplicates)
            self.memory.add_episode(EpisodeIn(channel="voice", source="user",
                                              gist=f"Caroline asked a few things on {day}",
                                              cites=ids,
                                              started_at=at(day, 7), ended_at=at(day, 20)))

    def end_of_week(self, n: int) -> None:
        """Saturday noon of week ``n``: when the job runs."""
        self.clock.set(at(START + timedelta(weeks=n, days=5), 12))


@pytest.fixture
def household_memory(make_settings: Callable[..., Settings], clock: ManualClock,
                     embedder: Embedder) -> Iterator[Memory]:
    clock.set(at(START, 0))
    mem = Memory(make_settings(household={"timezone": "Europe/Lisbon"}), clock=clock,
                 embedder=embedder)
    yield mem
    mem.close()


def ctx_for(memory: Memory, clock: ManualClock) -> JobContext:
    return JobContext(store=memory.store, writer=memory, llm=make_llm(memory.settings.llm),
                      clock=clock, settings=memory.settings)


def patterns_of(memory: Memory, key: str) -> list[Row]:
    return memory.store.rows("SELECT * FROM facts WHERE kind = 'behavioral_pattern'"
                             " AND key = ? ORDER BY id", (key,))


def current(memory: Memory, key: str) -> Row | None:
    rows = [r for r in patterns_of(memory, key) if r["valid_to"] is None]
    assert len(rows) <= 1
    return rows[0] if rows else None


def log_size(memory: Memory) -> int:
    return int(memory.store.scalar("SELECT count(*) FROM write_log"))


def fact_writes(memory: Memory) -> int:
    return int(memory.store.scalar("SELECT count(*) FROM write_log WHERE table_name = 'facts'"))


def writes_before(memory: Memory, log_rows: int) -> int:
    """The facts' write-log rows among the first ``log_rows`` of the log."""
    return int(memory.store.scalar(
        "SELECT count(*) FROM (SELECT table_name FROM write_log ORDER BY id LIMIT ?)"
        " WHERE table_name = 'facts'", (log_rows,)))


def run_job(memory: Memory, clock: ManualClock) -> JobResult:
    return PatternsJob()(ctx_for(memory, clock))


# -- a routine's life ---------------------------------------------------------------


def test_a_routine_becomes_a_pattern_is_reinforced_fades_and_is_retired(
        household_memory: Memory, clock: ManualClock) -> None:
    memory = household_memory
    home = Household(memory, clock)

    for n in range(2):
        home.week(n)
    home.end_of_week(1)
    run_job(memory, clock)
    assert patterns_of(memory, ROUTINE) == [], "two weeks are not a routine yet"

    home.week(2)
    home.end_of_week(2)
    first = run_job(memory, clock)
    assert first.items == 1
    born = current(memory, ROUTINE)
    assert born is not None
    assert (born["subject"], born["value"]) == (
        "Caroline", "asks about weather on weekday mornings (in three different weeks)")
    assert born["confidence"] == pytest.approx(0.6)
    assert born["source"] == "user" and not born["disabled"]
    refs = json.loads(born["provenance"])
    assert "rule:patterns" in refs
    cited = [int(r[5:]) for r in refs if r.startswith("turn:")]
    assert cited and all(
        memory.store.scalar("SELECT content FROM transcript WHERE id = ?", (t,)) == WEATHER
        for t in cited)
    assert any(r.startswith("episode:") for r in refs)
    # the only pattern: the evening requests never repeat, the weather is no mere topic
    assert [r["key"] for r in memory.store.rows(
        "SELECT key FROM facts WHERE kind = 'behavioral_pattern'")] == [ROUTINE]

    before = log_size(memory)
    again = run_job(memory, clock)
    assert (again.items, again.detail) == (0, "nothing new")
    assert log_size(memory) == before, "a re-run writes nothing"
    clock.advance(86400)  # a new day, nothing new said, still within the grace of silence
    quiet = run_job(memory, clock)
    assert quiet.detail != "nothing new" and quiet.items == 0
    assert fact_writes(memory) == writes_before(memory, before)

    for n in (3, 4):
        home.week(n)
        home.end_of_week(n)
        run_job(memory, clock)
    strong = current(memory, ROUTINE)
    assert strong is not None
    assert strong["value"] == "asks about weather on weekday mornings (in five different weeks)"
    assert strong["confidence"] > born["confidence"]
    history = patterns_of(memory, ROUTINE)
    assert history[0]["id"] == born["id"] and len(history) == 3
    assert all(r["valid_to"] is not None and r["superseded_by"] for r in history[:-1])
    assert unsupported_facts(memory.store) == [], "the values pass the word-for-word check"

    # The routine stops: each silent week lowers the confidence until it is retired.
    confidences = [strong["confidence"]]
    retired_after = None
    for n in range(5, 13):
        home.week(n, weather=False)
        home.end_of_week(n)
        run_job(memory, clock)
        row = current(memory, ROUTINE)
        assert row is not None and row["id"] == strong["id"], "silence adds no new version"
        if row["disabled"]:
            retired_after = n
            break
        confidences.append(row["confidence"])
    assert retired_after is not None, "a silent routine is retired"
    assert len(confidences) >= 3
    assert all(b < a for a, b in pairwise(confidences)), confidences
    retired = current(memory, ROUTINE)
    assert retired is not None and retired["claims"] > 1  # the fading claims are counted
    assert len(patterns_of(memory, ROUTINE)) == 3, "history kept"
    assert memory.store.scalar(
        "SELECT writer FROM write_log WHERE table_name = 'facts' AND row_id = ?"
        " AND op = 'update' ORDER BY id DESC LIMIT 1", (retired["id"],)) == "patterns"

    # Retired, it stays quiet while the silence goes on.
    home.week(retired_after + 1, weather=False)
    home.end_of_week(retired_after + 1)
    writes = fact_writes(memory)
    run_job(memory, clock)
    assert fact_writes(memory) == writes

    # The routine comes back: a new enabled version with one more week of support.
    home.week(retired_after + 2)
    home.end_of_week(retired_after + 2)
    run_job(memory, clock)
    back = current(memory, ROUTINE)
    assert back is not None and not back["disabled"]
    assert back["value"] == "asks about weather on weekday mornings (in six different weeks)"
    assert patterns_of(memory, ROUTINE)[-2]["id"] == retired["id"]


def test_the_household_time_zone_decides_the_part_of_the_day() -> None:
    ts = at(date(2024, 1, 3), 7, 30)  # a Wednesday, 07:30 in Lisbon
    assert When.of(ts, LISBON).part == "morning"
    assert When.of(ts, ZoneInfo("Asia/Tokyo")).part == "afternoon"  # 16:30 there
    saturday = When.of(at(date(2024, 1, 6), 10), LISBON)
    assert saturday.daytype == "weekend"
    assert When.of(at(date(2024, 1, 8), 10), LISBON).week - saturday.week == 7


def test_topics_are_content_words_as_said() -> None:
    assert topics(WEATHER) == {"weather": "weather"}
    assert topics("Can you water the tomatoes? My sister's plants too.",
                  frozenset({"ana"})) == {"water": "water", "tomatoe": "tomatoes",
                                          "plant": "plants"}
    assert topics("Ana phoned me about the Garden", frozenset({"ana"})) == {"garden": "Garden"}
    assert in_words(5) == "five" and in_words(42) == "more than twenty"


# -- people, topics and sources -----------------------------------------------------------


def test_people_and_recurring_topics_only_from_pattern_sources(
        household_memory: Memory, clock: ManualClock) -> None:
    memory = household_memory
    home = Household(memory, clock)
    memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="relation_to_caroline",
                           value="sister", confidence=0.8))
    hours = (8, 13, 18, 22)
    for n in range(4):
        for d, hour in ((0, hours[n % 4]), (3, hours[(n + 1) % 4])):
            day = START + timedelta(weeks=n, days=d)
            home.say(day, hour, "Ana phoned again.")
            home.say(day, (hour + 2) % 24, "The vegetable garden needs water.")
            # the same words from sources that are not the user's behaviour
            home.say(day, hour, "Ana phoned again, from Porto.", source="external-agent:bot")
            home.say(day, hour, "The garden needs watering, Ana.", source="assistant",
                     speaker="Wren", role="assistant")
    home.end_of_week(3)
    result = run(ctx_for(memory, clock))
    rows = {r["key"]: r for r in memory.store.rows(
        "SELECT * FROM facts WHERE kind = 'behavioral_pattern' AND valid_to IS NULL")}
    topic = "pattern_topic_vegetable_garden_water"  # words always said together: one topic
    assert set(rows) == {"pattern_person_ana", topic}, result.detail
    assert rows["pattern_person_ana"]["value"] == "often mentions Ana (in four different weeks)"
    assert rows[topic]["value"] == (
        "often talks about vegetable garden water (in four different weeks)")
    assert {r["subject"] for r in rows.values()} == {"Caroline"}
    cited = {int(r[5:]) for row in rows.values() for r in json.loads(row["provenance"])
             if r.startswith("turn:")}
    assert {memory.store.scalar("SELECT source FROM transcript WHERE id = ?", (t,))
            for t in cited} == {"user"}
    assert unsupported_facts(memory.store) == []


def test_only_the_strongest_few_patterns_are_in_force(household_memory: Memory,
                                                     clock: ManualClock) -> None:
    memory = household_memory
    home = Household(memory, clock)
    for n in range(4):
        for d, hour in ((0, 9), (2, 15), (4, 20)):
            day = START + timedelta(weeks=n, days=d)
            home.say(day, hour, "The chess club meets again.")
            if n < 3:  # the bread, one week less: weaker
                home.say(day, (hour + 1) % 24, "I baked sourdough bread.")
    home.end_of_week(3)
    job = PatternsJob(PatternParams(max_live=1))
    job(ctx_for(memory, clock))
    clock.advance(86400)
    job(ctx_for(memory, clock))
    keys = [r["key"] for r in memory.store.rows(
        "SELECT key FROM facts WHERE kind = 'behavioral_pattern'")]
    assert keys == ["pattern_topic_chess_club_meet"]


def test_only_user_behaviour_counts(household_memory: Memory, clock: ManualClock) -> None:
    """The same routine said by a source without the ``patterns`` switch is no pattern."""
    memory = household_memory
    home = Household(memory, clock)
    for n in range(4):
        for d in range(5):
            home.say(START + timedelta(weeks=n, days=d), 7, WEATHER, source="external-agent:hub")
    home.end_of_week(3)
    result = run_job(memory, clock)
    assert result.items == 0 and "0 user turns read" in result.detail
    assert memory.store.scalar("SELECT count(*) FROM facts") == 0


@pytest.mark.parametrize("action", ["disable", "delete"])
def test_a_pattern_the_user_disabled_or_forgot_is_not_written_again(
        household_memory: Memory, clock: ManualClock, action: str) -> None:
    memory = household_memory
    home = Household(memory, clock)
    for n in range(3):
        home.week(n)
    home.end_of_week(2)
    run_job(memory, clock)
    born = current(memory, ROUTINE)
    assert born is not None
    memory.change(Ref("fact", born["id"]), action, "user")  # type: ignore[arg-type]
    for n in (3, 4):
        home.week(n)
        home.end_of_week(n)
        run_job(memory, clock)
    if action == "disable":
        assert [r["id"] for r in patterns_of(memory, ROUTINE)] == [born["id"]]
        assert current(memory, ROUTINE)["disabled"]  # type: ignore[index]
    else:
        assert patterns_of(memory, ROUTINE) == [], "a forgotten pattern is never brought back"


def test_support_the_user_took_back_is_tried_once_not_every_run(
        household_memory: Memory, clock: ManualClock) -> None:
    """Turns disabled by the user shrink a pattern's support: the weaker claim loses
    to the one in force (the graph keeps the stronger), and is not written again."""
    memory = household_memory
    home = Household(memory, clock)
    for n in range(5):
        home.week(n)
    home.end_of_week(4)
    run_job(memory, clock)
    strong = current(memory, ROUTINE)
    assert strong is not None and "five different weeks" in strong["value"]
    first_weeks = memory.store.rows(
        "SELECT id FROM transcript WHERE content = ? AND created_at < ?",
        (WEATHER, at(START + timedelta(weeks=2), 0)))
    for turn in first_weeks:
        memory.change(Ref("turn", turn["id"]), "disable", "user")
    clock.advance(86400)
    run_job(memory, clock)
    assert current(memory, ROUTINE)["id"] == strong["id"]  # type: ignore[index]
    writes = fact_writes(memory)
    clock.advance(86400)
    run_job(memory, clock)
    assert fact_writes(memory) == writes


def test_nothing_to_do_ends_ok(household_memory: Memory, clock: ManualClock) -> None:
    first = run_job(household_memory, clock)
    assert first.items == 0 and not first.more
    assert run_job(household_memory, clock).detail == "nothing new"
    assert household_memory.store.scalar("SELECT count(*) FROM facts") == 0
