"""The facts job: rules, provenance, "remember: ...", contradictions, resumption."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401

from runtime.config import ProviderSettings
from runtime.llm.providers import FallbackChain, make_llm
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.contract import JobContext
from runtime.mind.extract import FactsJob, parse_llm_facts, run
from runtime.mind.extract_rules import Candidate, extract, note_key, remembered
from runtime.store.database import Row
from runtime.store.job_state import get_state
from runtime.time.clock import ManualClock

CHANNEL = "chat"


def ctx_for(memory: Memory, clock: ManualClock, writer: object | None = None,
            budget_s: float = 600.0, llm: FallbackChain | None = None) -> JobContext:
    return JobContext(store=memory.store, writer=writer or memory,  # type: ignore[arg-type]
                      llm=llm or make_llm(memory.settings.llm), clock=clock,
                      settings=memory.settings, budget_s=budget_s)


def say(memory: Memory, clock: ManualClock, lines: list[tuple[str, str]],
        source: str = "user") -> list[int]:
    """Turns of a conversation, one a minute, and one leaf episode citing them."""
    ids = []
    for speaker, text in lines:
        clock.advance(60)
        ids.append(memory.add_turn(TurnIn(channel=CHANNEL, source=source, speaker=speaker,
                                          content=text)))
    # a gist of its own: the same gist twice is a near-duplicate (runtime.memories.duplicates)
    memory.add_episode(EpisodeIn(channel=CHANNEL, source="user", gist=f"a chat at turn {ids[0]}",
                                 cites=ids))
    return ids


def facts(memory: Memory) -> list[Row]:
    return memory.store.rows("SELECT * FROM facts ORDER BY id")


def fact_turn(fact: Row) -> int:
    return int(next(r for r in json.loads(fact["provenance"]) if r.startswith("turn:"))[5:])


def current(memory: Memory, subject: str, key: str) -> Row | None:
    return memory.store.row("SELECT * FROM facts WHERE subject = ? AND key = ?"
                            " AND valid_to IS NULL", (subject, key))


CONVERSATION = [
    ("Caroline", "Hi Mel! I moved to Lisbon last spring, and I love the ocean here."),
    ("Melanie", "Nice! My husband Tom and I live in Porto. Our dog named Max says hi."),
    ("Caroline", "Ha! I work as a counselor now. My sister Ana visits often."),
    ("Melanie", "Next month we're going to Paris. My birthday is on June 5th!"),
    ("Caroline", "I'm allergic to cats, so no pets for me."),
]


# -- the rules, one turn at a time -------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("My sister Ana lives nearby.", ("user_specific", "Ana", "relation_to_caroline", "sister")),
    ("Ana is my best friend!", ("user_specific", "Ana", "relation_to_caroline", "best friend")),
    ("My husband's name is Tom.", ("user_specific", "Caroline", "husband", "Tom")),
    ("I live in New York.", ("place", "Caroline", "lives_in", "New York")),
    ("We just moved to Lisbon.", ("place", "Caroline", "lives_in", "Lisbon")),
    ("I grew up in Sweden.", ("place", "Caroline", "grew_up_in", "Sweden")),
    ("We visited the Grand Canyon.", ("place", "Caroline", "visited_grand_canyon",
                                      "Grand Canyon")),
    ("I really like the beach.", ("user_specific", "Caroline", "preference_beach",
                                  "likes the beach")),
    ("I hate mornings.", ("user_specific", "Caroline", "preference_mornings", "hates mornings")),
    ("I am allergic to peanuts.", ("user_specific", "Caroline", "allergy_peanuts",
                                   "allergic to peanuts")),
    ("My favorite color is blue.", ("user_specific", "Caroline", "favourite_color", "blue")),
    ("I'm a nurse.", ("user_specific", "Caroline", "occupation", "nurse")),
    ("I work as a nurse at the clinic.", ("user_specific", "Caroline", "occupation", "nurse")),
    ("I work at Google.", ("user_specific", "Caroline", "works_at", "Google")),
    ("Our cat, Luna, is asleep.", ("user_specific", "Caroline", "pet_luna", "cat named Luna")),
    ("We adopted a puppy called Rex.", ("user_specific", "Caroline", "pet_rex",
                                        "puppy named Rex")),
    ("My birthday is May 5th.", ("user_specific", "Caroline", "birthday", "May 5th")),
    ("I went to the gym.", ("user_specific", "Caroline", "event_gym", "went to the gym")),
    ("Last Friday, I went to an LGBTQ+ workshop.", (
        "user_specific", "Caroline", "event_lgbtq_workshop",
        "went to an LGBTQ+ workshop last Friday")),
    ("We went camping two weekends ago.", ("user_specific", "Caroline", "event_camping",
                                           "went camping two weekends ago")),
    ("Next month, we're going to Paris.", ("place", "Caroline", "plan_paris",
                                           "going to Paris next month")),
    ("I'm getting married on June 12.", ("user_specific", "Caroline", "plan_married",
                                         "getting married on June 12")),
])
def test_rule_shapes(text: str, expected: tuple[str, str, str, str]) -> None:
    found = [(c.kind, c.subject, c.key, c.value) for c in extract(text, "Caroline")]
    assert found == [expected]


@pytest.mark.parametrize("text", [
    "I love it!",  # a pronoun: nothing to pin down
    "I don't live in Porto anymore.",  # negated
    "I don't think I like sushi.",  # negated before the shape
    "Why do I love rainy days so much?",  # a question
    "Should I work as a nurse?",
    "It was the parade I went to a few weeks ago.",  # a time, not an event
    "I went to Melanie's party.",  # someone's, not a place
    "I'm a big fan of that.",  # not a job in the list
    "She lives in Paris.",  # third person: not covered
])
def test_rules_stay_quiet(text: str) -> None:
    assert extract(text, "Caroline") == []


def test_remember_shapes() -> None:
    assert remembered("remember: the spare key is under the blue pot") == \
        "the spare key is under the blue pot"
    assert remembered("Please remember that Ana lands Tuesday") == "Ana lands Tuesday"
    assert remembered("Do you remember that?") is None
    assert remembered("I remember that day") is None
    assert note_key("the spare key is under the blue pot") == "note_spare_key"
    assert note_key("The spare key is now in the drawer.") == "note_spare_key"


# -- the job over real SQLite ------------------------------------------------------


def test_a_conversation_becomes_facts_with_provenance(memory: Memory,
                                                      clock: ManualClock) -> None:
    ids = say(memory, clock, CONVERSATION)
    result = run(ctx_for(memory, clock))
    got = {(f["kind"], f["subject"], f["key"], f["value"]) for f in facts(memory)}
    assert got == {
        ("place", "Caroline", "lives_in", "Lisbon"),
        ("user_specific", "Caroline", "preference_ocean", "loves the ocean"),
        ("user_specific", "Melanie", "husband", "Tom"),
        ("place", "Melanie", "lives_in", "Porto"),
        ("user_specific", "Melanie", "pet_max", "dog named Max"),
        ("user_specific", "Caroline", "occupation", "counselor"),
        ("user_specific", "Ana", "relation_to_caroline", "sister"),
        ("place", "Melanie", "plan_paris", "going to Paris next month"),
        ("user_specific", "Melanie", "birthday", "June 5th"),
        ("user_specific", "Caroline", "allergy_cats", "allergic to cats"),
    }
    assert result.items == 10 and not result.more
    assert "10 facts" in result.detail and "Lisbon" not in result.detail  # no content
    episode = memory.store.scalar("SELECT id FROM episodes")
    tom = current(memory, "Melanie", "husband")
    assert tom is not None
    assert json.loads(tom["provenance"]) == [f"episode:{episode}", f"turn:{ids[1]}",
                                             "rule:relation"]
    said = memory.store.scalar("SELECT created_at FROM transcript WHERE id = ?", (ids[1],))
    assert tom["valid_from"] == said  # valid from when it was said
    lisbon = current(memory, "Caroline", "lives_in")
    assert lisbon is not None and json.loads(lisbon["provenance"])[-1] == "rule:moved_to"
    assert all(0 < f["confidence"] < 1 and not f["user_managed"] for f in facts(memory))


def test_remember_turn_becomes_a_user_managed_fact(memory: Memory, clock: ManualClock) -> None:
    turn = memory.add_turn(TurnIn(channel=CHANNEL, source="user", speaker="Caroline",
                                  content="remember: the spare key is under the blue pot"))
    result = run(ctx_for(memory, clock))  # no episode needed: explicit
    [fact] = facts(memory)
    assert (fact["kind"], fact["subject"], fact["key"], fact["value"]) == (
        "document", "Caroline", "note_spare_key", "the spare key is under the blue pot")
    assert fact["user_managed"] == 1 and fact["confidence"] == 1.0
    assert json.loads(fact["provenance"]) == [f"turn:{turn}", "rule:remember"]
    assert result.items == 1
    # A later episode citing that turn does not write it again at a lower confidence.
    memory.add_episode(EpisodeIn(channel=CHANNEL, source="user", gist="keys", cites=[turn]))
    assert run(ctx_for(memory, clock)).items == 0
    [again] = facts(memory)
    assert again["claims"] == 1 and again["confidence"] == 1.0


def test_remember_with_a_rule_shape_writes_the_rule_fact_user_managed(
        memory: Memory, clock: ManualClock) -> None:
    memory.add_turn(TurnIn(channel=CHANNEL, source="user", speaker="Caroline",
                           content="Remember that I'm allergic to peanuts"))
    run(ctx_for(memory, clock))
    [fact] = facts(memory)
    assert (fact["key"], fact["value"], fact["user_managed"]) == (
        "allergy_peanuts", "allergic to peanuts", 1)
    # The episode that later cites the turn does not claim it again, weaker.
    memory.add_episode(EpisodeIn(channel=CHANNEL, source="user", gist="food",
                                 cites=[fact_turn(fact)]))
    run(ctx_for(memory, clock))
    [again] = facts(memory)
    assert (again["claims"], again["confidence"]) == (1, 1.0)


def test_muted_sources_feed_no_facts(memory: Memory, clock: ManualClock) -> None:
    say(memory, clock, [("assistant", "I live in Porto.")], source="assistant")
    memory.add_turn(TurnIn(channel=CHANNEL, source="scheduled",
                           content="remember: the spare key is under the blue pot"))
    result = run(ctx_for(memory, clock))
    assert facts(memory) == [] and result.items == 0
    assert "0 refused" in result.detail  # filtered by the job, not refused by the graph


def test_a_contradiction_closes_the_old_window(memory: Memory, clock: ManualClock) -> None:
    say(memory, clock, [("Caroline", "I live in Porto.")])
    run(ctx_for(memory, clock))
    clock.advance(86400 * 30)
    say(memory, clock, [("Caroline", "Big news: we moved to Lisbon!")])
    result = run(ctx_for(memory, clock))
    assert result.detail.count("supersede 1") == 1
    old, new = memory.store.rows("SELECT * FROM facts WHERE subject = 'Caroline'"
                                 " AND key = 'lives_in' ORDER BY id")
    assert (old["value"], new["value"]) == ("Porto", "Lisbon")
    assert old["valid_to"] == new["valid_from"] and old["superseded_by"] == new["id"]
    assert new["valid_to"] is None  # current


def test_near_duplicates_reinforce(memory: Memory, clock: ManualClock) -> None:
    say(memory, clock, [("Caroline", "I love the Beach."), ("Caroline", "i love beach!!")])
    say(memory, clock, [("caroline", "My sister Ana came over.")])
    say(memory, clock, [("Caroline", "Ana is my sister, you know.")])
    run(ctx_for(memory, clock))
    rows = facts(memory)
    assert [(f["subject"], f["key"], f["value"], f["claims"]) for f in rows] == [
        ("Caroline", "preference_beach", "loves the Beach", 2),
        ("Ana", "relation_to_caroline", "sister", 2),
    ]


def test_rerunning_extracts_nothing_new(memory: Memory, clock: ManualClock) -> None:
    say(memory, clock, CONVERSATION)
    memory.add_turn(TurnIn(channel=CHANNEL, source="user", speaker="Caroline",
                           content="remember: the spare key is under the blue pot"))
    memory.add_turn(TurnIn(channel=CHANNEL, source="user", speaker="Melanie",
                           content="Will do."))
    first = run(ctx_for(memory, clock))
    before = facts(memory)
    second = run(ctx_for(memory, clock))
    assert first.items == 11 and second.items == 0
    assert facts(memory) == before  # not even a reinforcement
    # Progress covers every turn read, not only the last "remember" one.
    last = memory.store.scalar("SELECT max(id) FROM transcript")
    assert get_state(memory.store, "facts", "turns")["after"] == last


class CrashingWriter:
    """Forwards to memory, then raises after ``limit`` facts (a crash mid-run)."""

    def __init__(self, memory: Memory, limit: int) -> None:
        self.memory = memory
        self.limit = limit

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        if self.limit == 0:
            raise RuntimeError("crash")
        self.limit -= 1
        return self.memory.add_fact(fact, writer)


def test_a_crash_mid_run_resumes_without_duplicates(memory: Memory,
                                                    clock: ManualClock) -> None:
    say(memory, clock, CONVERSATION[:2])
    say(memory, clock, CONVERSATION[2:])
    with pytest.raises(RuntimeError, match="crash"):
        run(ctx_for(memory, clock, writer=CrashingWriter(memory, 4)))  # mid-episode 2
    assert len(facts(memory)) == 4
    result = run(ctx_for(memory, clock))
    rows = facts(memory)
    assert result.items == 6 and len(rows) == 10
    assert all(f["claims"] == 1 for f in rows)  # none written twice
    assert run(ctx_for(memory, clock)).items == 0


def test_out_of_time_stops_between_episodes_with_more(memory: Memory,
                                                      clock: ManualClock) -> None:
    say(memory, clock, CONVERSATION[:2])
    say(memory, clock, CONVERSATION[2:])
    stopped = run(ctx_for(memory, clock, budget_s=0.0))
    assert stopped.more and stopped.items == 0
    done = run(ctx_for(memory, clock))
    assert not done.more and done.items == 10


def test_an_unsupported_fact_is_refused(memory: Memory, clock: ManualClock) -> None:
    def inventive(content: str, speaker: str) -> list[Candidate]:
        out = extract(content, speaker)
        # A claim naming a place the turn never mentions.
        out.append(Candidate("place", speaker, "lives_in_too", "Madrid", 0.7, "invented"))
        return out

    say(memory, clock, [("Caroline", "I live in Porto.")])
    result = FactsJob(inventive)(ctx_for(memory, clock))
    assert [(f["key"], f["value"]) for f in facts(memory)] == [("lives_in", "Porto")]
    assert "1 unsupported" in result.detail and result.items == 1


# -- with a language model -----------------------------------------------------------


def fake_llm(memory: Memory, server: FakeOpenAI) -> FallbackChain:
    provider = ProviderSettings(name="fake", base_url=server.base_url, model="fake-llama",
                                timeout_s=5)
    return make_llm(memory.settings.llm.model_copy(update={"providers": [provider]}))


def test_llm_facts_are_validated_and_support_checked(memory: Memory, clock: ManualClock,
                                                     fake_openai: FakeOpenAI) -> None:
    [turn] = say(memory, clock, [("Caroline", "Work is busy: I teach at Hillside School.")])
    fake_openai.replies.append(json.dumps({"facts": [
        {"kind": "user_specific", "subject": "Caroline", "key": "Works At",
         "value": "Hillside School", "confidence": 0.9, "turn": turn},
        {"kind": "place", "subject": "Caroline", "key": "lives_in", "value": "Madrid",
         "confidence": 0.9, "turn": turn},  # not in the turn: refused
    ]}))
    result = run(ctx_for(memory, clock, llm=fake_llm(memory, fake_openai)))
    [fact] = facts(memory)
    assert (fact["subject"], fact["key"], fact["value"], fact["confidence"]) == (
        "Caroline", "works_at", "Hillside School", 0.9)
    assert json.loads(fact["provenance"])[-1] == "rule:llm"
    assert "1 unsupported" in result.detail
    [request] = fake_openai.requests
    assert f"[{turn}] Caroline: Work is busy" in request.body["messages"][1]["content"]


@pytest.mark.parametrize("answer", [
    "Sure! Caroline lives in Porto.",  # not JSON
    '{"facts": [{"kind": "opinion", "subject": "C", "key": "k", "value": "v",'
    ' "confidence": 0.5, "turn": 1}]}',  # a kind outside the set
    None,  # the endpoint fails: the chain answers offline
])
def test_invalid_llm_output_falls_back_to_the_rules(memory: Memory, clock: ManualClock,
                                                    fake_openai: FakeOpenAI,
                                                    answer: str | None,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    say(memory, clock, [("Caroline", "I live in Porto.")])
    if answer is None:
        fake_openai.mode = Mode.HTTP_500
    else:
        fake_openai.replies.append(answer)
    result = run(ctx_for(memory, clock, llm=fake_llm(memory, fake_openai)))
    assert [(f["key"], f["value"]) for f in facts(memory)] == [("lives_in", "Porto")]
    assert "1 LLM fallbacks" in result.detail
    # The offline provider's reply is not mistaken for the model's invalid answer.
    assert ("invalid answer" in caplog.text) == (answer is not None)


def test_parse_llm_facts_rejects_turns_it_was_not_given() -> None:
    good = {"kind": "place", "subject": "A", "key": "k", "value": "v", "confidence": 1,
            "turn": 3}
    assert parse_llm_facts("```json\n" + json.dumps({"facts": [good]}) + "\n```", {3})
    assert parse_llm_facts(json.dumps({"facts": [good]}), {4}) is None
    assert parse_llm_facts(json.dumps({"facts": [{**good, "confidence": 2}]}), {3}) is None
