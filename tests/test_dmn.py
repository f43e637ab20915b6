"""The dmn job on a real store with the real embedder and an injected clock:
connections between distant memories, open questions, things worth following
up; saved as source ``dmn`` (facts and one episode), never as a chat turn;
re-runs, disabled and forgotten findings write nothing new; a crash mid-run
leaves no duplicate; the language-model path against a local fake server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401

from runtime.config import LLMSettings, ProviderSettings, Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import FallbackChain, make_llm
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.contract import JobContext
from runtime.mind.dmn import DmnParams, finding_key, reflect, run
from runtime.mind.support import unsupported_facts
from runtime.mind.synthesis import synthesise
from runtime.store.database import Row
from runtime.time.clock import DAY, ManualClock

LISBON = ZoneInfo("Europe/Lisbon")


def at(y: int, m: int, d: int, h: int = 12) -> float:
    return datetime(y, m, d, h, tzinfo=LISBON).timestamp()


@pytest.fixture
def home(make_settings: Callable[..., Settings], clock: ManualClock,
         embedder: Embedder) -> Iterator[Memory]:
    clock.set(at(2023, 11, 1))
    mem = Memory(make_settings(household={"timezone": "Europe/Lisbon"}), clock=clock,
                 embedder=embedder)
    yield mem
    mem.close()


def episode(memory: Memory, clock: ManualClock, when: float, text: str, salience: int = 5,
            emotion: str | None = None) -> int:
    clock.set(when)
    turn = memory.add_turn(TurnIn(channel="voice", source="user", speaker="Caroline",
                                  content=text))
    return memory.add_episode(EpisodeIn(channel="voice", source="user",
                                        gist=f"Caroline: {text}", salience=salience,
                                        emotion=emotion, cites=[turn], started_at=when,
                                        ended_at=when))


def seed(memory: Memory, clock: ManualClock) -> dict[str, int]:
    ids = {
        "bees_then": episode(memory, clock, at(2023, 11, 5),
                             "We started keeping bees in the garden. The hive needs a new queen."),
        "same_month": episode(memory, clock, at(2024, 2, 2),
                              "Our beehive in the garden made honey for the first time."),
        "bees_now": episode(memory, clock, at(2024, 2, 26),
                            "The bees swarmed out of the hive this morning."),
        "car": episode(memory, clock, at(2024, 2, 27), "The car needs new tyres before Easter."),
        "worry": episode(memory, clock, at(2024, 2, 28),
                         "I am worried about my mother's surgery on Friday.", salience=8,
                         emotion="fear"),
    }
    clock.set(at(2024, 1, 2))
    ids["plan"] = memory.add_fact(FactIn(kind="place", subject="Caroline", key="plan_paris",
                                         value="going to Paris next month", confidence=0.6))[0]
    ids["tom"] = memory.add_fact(FactIn(
        kind="behavioral_pattern", subject="Caroline", key="pattern_person_tom",
        value="often mentions Tom (in four different weeks)", confidence=0.7))[0]
    ids["ana_pattern"] = memory.add_fact(FactIn(
        kind="behavioral_pattern", subject="Caroline", key="pattern_person_ana",
        value="often mentions Ana (in four different weeks)", confidence=0.7))[0]
    ids["ana"] = memory.add_fact(FactIn(kind="user_specific", subject="Ana",
                                        key="relation_to_caroline", value="sister"))[0]
    clock.set(at(2024, 3, 1))
    return ids


def ctx_for(memory: Memory, clock: ManualClock, writer: Any = None,
            llm: FallbackChain | None = None) -> JobContext:
    return JobContext(store=memory.store, writer=writer or memory,
                      llm=llm or make_llm(memory.settings.llm), clock=clock,
                      settings=memory.settings)


def findings(memory: Memory) -> list[Row]:
    return memory.store.rows("SELECT * FROM facts WHERE source = 'dmn' ORDER BY id")


def log_size(memory: Memory) -> int:
    return int(memory.store.scalar("SELECT count(*) FROM write_log"))


def test_findings_are_saved_as_dmn_memory_never_as_chat(home: Memory,
                                                       clock: ManualClock) -> None:
    ids = seed(home, clock)
    synthesise(ctx_for(home, clock))  # the portrait the reflection reads
    turns = home.store.scalar("SELECT count(*) FROM transcript")
    result = run(ctx_for(home, clock))
    rows = findings(home)
    assert result.items == len(rows) + 1, result.detail
    by_type: dict[str, list[Row]] = {}
    for row in rows:
        assert (row["kind"], row["subject"], row["source"]) == ("reflection", "user", "dmn")
        refs = json.loads(row["provenance"])
        assert "rule:dmn" in refs
        by_type.setdefault(row["key"].split("_")[1], []).append(row)
    assert set(by_type) == {"connection", "question", "follow"}, [r["key"] for r in rows]

    # a connection across months, not within one
    (link,) = by_type["connection"]
    assert sorted(r for r in json.loads(link["provenance"]) if r.startswith("episode:")) == \
        sorted([f"episode:{ids['bees_now']}", f"episode:{ids['bees_then']}"])
    assert "swarmed" in link["value"] and "new queen" in link["value"]
    # questions: Tom comes up and nobody knows who he is; the Paris plan's outcome
    questions = {r["value"] for r in by_type["question"]}
    assert any("who is Tom to Caroline?" in q for q in questions)
    assert any("how did it go?" in q and "Paris" in q for q in questions)
    assert not any("Ana" in q for q in questions), "Ana's relation is known"
    (follow,) = by_type["follow"]
    assert f"episode:{ids['worry']}" in json.loads(follow["provenance"])
    assert unsupported_facts(home.store) == [], "findings pass the word-for-word check"

    # one dmn episode tells what was found; nothing was said in any chat
    told = home.store.rows("SELECT * FROM episodes WHERE source = 'dmn'")
    assert len(told) == 1 and told[0]["channel"] == "dmn"
    assert home.store.scalar("SELECT count(*) FROM episode_citations WHERE episode_id = ?",
                             (told[0]["id"],)) == 0
    assert home.store.scalar("SELECT count(*) FROM transcript") == turns
    assert home.store.scalar("SELECT count(*) FROM transcript WHERE source = 'dmn'") == 0
    # never geo: no place, no location
    assert home.store.scalar("SELECT count(*) FROM facts WHERE source = 'dmn'"
                             " AND kind = 'place'") == 0
    assert home.store.scalar("SELECT count(*) FROM location_fixes") == 0

    # recall finds what the reflection saved
    hits = home.recall("who is Tom?").refs
    assert any(ref == f"fact:{r['id']}" for r in by_type["question"] for ref in hits)

    before = log_size(home)
    clock.advance(DAY)
    again = run(ctx_for(home, clock))
    assert (again.items, again.detail) == (0, "nothing new")
    assert log_size(home) == before, "a re-run writes nothing"


def test_a_disabled_or_forgotten_finding_is_not_written_again(home: Memory,
                                                            clock: ManualClock) -> None:
    seed(home, clock)
    run(ctx_for(home, clock))
    first, second = findings(home)[:2]
    home.change(Ref("fact", first["id"]), "disable", "user")
    home.change(Ref("fact", second["id"]), "delete", "user")
    clock.advance(DAY)
    assert run(ctx_for(home, clock)).items == 0
    keys = [r["key"] for r in findings(home)]
    assert first["key"] in keys and second["key"] not in keys


def test_the_finding_key_is_its_type_and_refs_not_its_words() -> None:
    assert finding_key("question", ["fact:2", "episode:1"]) == \
        finding_key("question", ["episode:1", "fact:2"])
    assert finding_key("question", ["fact:2"]) != finding_key("follow_up", ["fact:2"])


class _Crash(RuntimeError):
    pass


class _CrashAfter:
    """Writes through ``memory``; dies after ``n`` facts, or right after writing
    the episode (before the job could note it)."""

    def __init__(self, memory: Memory, n: int, after_episode: bool = False) -> None:
        self.memory, self.left, self.after_episode = memory, n, after_episode

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        if self.left == 0:
            raise _Crash("killed mid-run")
        self.left -= 1
        return self.memory.add_fact(fact, writer)

    def add_episode(self, episode: EpisodeIn, writer: str) -> int:
        episode_id = self.memory.add_episode(episode, writer)
        if self.after_episode:
            raise _Crash("killed after the episode")
        return episode_id


def test_a_crash_mid_run_leaves_no_duplicate(home: Memory, clock: ManualClock) -> None:
    seed(home, clock)
    with pytest.raises(_Crash):
        run(ctx_for(home, clock, writer=_CrashAfter(home, 2)))
    assert len(findings(home)) == 2
    assert home.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 0
    run(ctx_for(home, clock))
    keys = [r["key"] for r in findings(home)]
    assert len(keys) == len(set(keys)) > 2
    told = home.store.rows("SELECT gist FROM episodes WHERE source = 'dmn'")
    assert len(told) == 1 and told[0]["gist"].count("|") == len(keys) - 1
    assert run(ctx_for(home, clock)).items == 0


def test_a_crash_after_the_episode_does_not_tell_it_twice(home: Memory,
                                                         clock: ManualClock) -> None:
    seed(home, clock)
    with pytest.raises(_Crash):
        run(ctx_for(home, clock, writer=_CrashAfter(home, 99, after_episode=True)))
    assert home.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 1
    run(ctx_for(home, clock))
    assert home.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 1
    assert run(ctx_for(home, clock)).items == 0


def test_a_quote_its_turns_do_not_support_is_not_saved(home: Memory,
                                                      clock: ManualClock) -> None:
    """A gist naming what its turns never said (a model's paraphrase) is not quoted."""
    clock.set(at(2024, 2, 28))
    turn = home.add_turn(TurnIn(channel="voice", source="user", speaker="Caroline",
                                content="I'm scared about the operation."))
    home.add_episode(EpisodeIn(channel="voice", source="user", salience=8, emotion="fear",
                               gist="Caroline fears Dr Silva's operation in Coimbra.",
                               cites=[turn], started_at=clock.now(), ended_at=clock.now()))
    clock.set(at(2024, 3, 1))
    run(ctx_for(home, clock))
    (follow,) = findings(home)
    assert follow["value"] == "worth following up: a recent conversation that sounded hard."
    assert unsupported_facts(home.store) == []


def test_connections_need_similar_memories_months_apart(home: Memory,
                                                       clock: ManualClock) -> None:
    episode(home, clock, at(2024, 2, 2), "Our beehive in the garden made honey.")
    episode(home, clock, at(2024, 2, 26), "The bees swarmed out of the hive this morning.")
    episode(home, clock, at(2023, 10, 3), "The car needs new tyres before the trip.")
    clock.set(at(2024, 3, 1))
    assert run(ctx_for(home, clock)).items == 0  # the bees are weeks apart, not months
    assert reflect(ctx_for(home, clock), DmnParams(min_gap_days=0)).items == 0, \
        "a memory of the same month is no distant memory"
    assert findings(home) == []
    lower = reflect(ctx_for(home, clock), DmnParams(similarity=0.3, min_gap_days=120))
    assert lower.items > 0, "the car connects with a looser threshold"


def llm_for(server: FakeOpenAI) -> FallbackChain:
    return make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=server.base_url, model="tiny", timeout_s=5)]))


def test_with_a_model_its_findings_are_used_when_valid(home: Memory, clock: ManualClock,
                                                       fake_openai: FakeOpenAI) -> None:
    ids = seed(home, clock)
    found = {"findings": [
        {"type": "question", "text": "does tom live nearby?", "refs": [f"fact:{ids['tom']}"]},
        {"type": "connection", "text": "the bees again, months later.",
         "refs": [f"episode:{ids['bees_now']}", f"episode:{ids['bees_then']}"]},
    ]}
    fake_openai.replies = ["not json", json.dumps(found)]
    result = reflect(ctx_for(home, clock, llm=llm_for(fake_openai)))
    assert "(llm)" in result.detail
    values = sorted(r["value"] for r in findings(home))
    assert values == ["does tom live nearby?", "the bees again, months later."]
    assert len(fake_openai.requests) == 2
    assert "EVIDENCE START" in fake_openai.requests[0].body["messages"][1]["content"]
    # the candidates it weighed and left out are not put to it again
    clock.advance(DAY)
    assert reflect(ctx_for(home, clock, llm=llm_for(fake_openai))).items == 0
    assert len(fake_openai.requests) == 2


def test_an_invalid_model_falls_back_to_the_offline_findings(
        home: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    seed(home, clock)
    bad = json.dumps({"findings": [{"type": "question", "text": "x?", "refs": ["fact:999"]}]})
    fake_openai.replies = [bad, bad]
    result = reflect(ctx_for(home, clock, llm=llm_for(fake_openai)))
    assert "(offline)" in result.detail and result.items > 1
    assert all(not r["value"].startswith("x?") for r in findings(home))


def test_forgetting_an_episode_forgets_the_findings_quoting_it(home: Memory,
                                                              clock: ManualClock) -> None:
    """The reflection quotes episodes word for word, in facts recall returns and
    in the episode telling them: forgetting the episode forgets those too."""
    ids = seed(home, clock)
    run(ctx_for(home, clock))
    quoting = [r for r in findings(home) if "swarmed" in r["value"]]
    assert len(quoting) == 1  # the connection: "The bees swarmed out..." echoes...
    told = home.store.rows("SELECT id, gist FROM episodes WHERE source = 'dmn'")
    assert len(told) == 1 and "swarmed" in told[0]["gist"]
    others = [r["id"] for r in findings(home) if r["id"] != quoting[0]["id"]]

    home.change(Ref("episode", ids["bees_now"]), "delete", "user")

    assert [r["id"] for r in findings(home)] == others  # the rest stay
    assert home.store.scalar("SELECT count(*) FROM episodes WHERE source = 'dmn'") == 0
    dump = json.dumps([list(r) for r in home.store.conn.execute(
        "SELECT before, after FROM write_log WHERE table_name IN ('facts', 'episodes')")])
    assert "swarmed" not in dump  # nor in the write log
    texts = [t for (t,) in home.store.conn.execute(
        "SELECT value FROM facts UNION ALL SELECT gist FROM episodes")]
    assert not [t for t in texts if "swarmed" in t]
    # recall finds the turn itself (not forgotten), no memory written from it
    recalled = home.recall("the bees swarmed out of the hive").items
    assert any(i.kind == "turn" and "swarmed" in i.text for i in recalled)
    assert not [i.ref for i in recalled if i.kind != "turn" and "swarmed" in i.text]
    # the next pass does not write it again
    clock.advance(DAY)
    run(ctx_for(home, clock))
    assert not [r for r in findings(home) if "swarmed" in r["value"]]
