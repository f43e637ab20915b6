"""The synthesis job and the portrait: versions on a real store, cited lines, the
prompt's section, the language-model path against a local fake server, and the
whole path through the real runtime (the job actor writes through the Graph
actor; the Turns actor puts the latest portrait into the system message)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401
from llm_runtime import llm_runtime, llm_settings

from runtime.config import ProviderSettings, Settings
from runtime.llm.persona import PersonaFile
from runtime.llm.prompt import PORTRAIT_HEADING, build_messages, system_prompt
from runtime.llm.providers import FallbackChain, make_llm
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.portrait import (
    PortraitLine,
    PortraitReader,
    PortraitService,
)
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.contract import JobContext
from runtime.mind.synthesis import SynthesisParams, synthesise
from runtime.time.clock import DAY, ManualClock

NOW = datetime(2024, 3, 6, 14, 5, tzinfo=UTC)


def ctx_for(memory: Memory, clock: ManualClock, llm: FallbackChain | None = None) -> JobContext:
    return JobContext(store=memory.store, writer=memory,
                      llm=llm or make_llm(memory.settings.llm), clock=clock,
                      settings=memory.settings)


def fact(memory: Memory, subject: str, key: str, value: str, kind: str = "user_specific",
         confidence: float = 0.8, source: str = "user") -> int:
    return memory.add_fact(FactIn(kind=kind, subject=subject, key=key, value=value,
                                  confidence=confidence, source=source))[0]


def seed(memory: Memory, clock: ManualClock) -> dict[str, int]:
    """A small household: Caroline (who speaks), her sister, a preference, a
    routine, a plan, a recent episode that matters."""
    turn = memory.add_turn(TurnIn(channel="voice", source="user", speaker="Caroline",
                                  content="My sister Ana is visiting next week, I'm nervous."))
    clock.advance(60)
    episode = memory.add_episode(EpisodeIn(
        channel="voice", source="user", gist="Caroline: My sister Ana is visiting next week.",
        salience=8, emotion="fear", cites=[turn], started_at=clock.now(),
        ended_at=clock.now()))
    return {
        "home": fact(memory, "Caroline", "lives_in", "Lisbon", kind="place"),
        "job": fact(memory, "Caroline", "occupation", "counselor"),
        "sister": fact(memory, "Ana", "relation_to_caroline", "sister"),
        "ocean": fact(memory, "Caroline", "preference_ocean", "loves the ocean"),
        "routine": fact(memory, "Caroline", "pattern_routine_weather_weekday_morning",
                        "asks about weather on weekday mornings (in five different weeks)",
                        kind="behavioral_pattern", confidence=0.7),
        "plan": fact(memory, "Caroline", "plan_ana_visit", "having Ana visit next week"),
        "reflection": fact(memory, "user", "dmn_question_x", "who is Ana?", kind="reflection",
                           source="dmn"),
        "episode": episode,
    }


def refs_exist(memory: Memory, refs: list[str]) -> bool:
    for ref in refs:
        kind, _, number = ref.partition(":")
        table = {"fact": "facts", "episode": "episodes"}[kind]
        if memory.store.scalar(f"SELECT 1 FROM {table} WHERE id = ?", (int(number),)) is None:
            return False
    return True


def log_size(memory: Memory) -> int:
    return int(memory.store.scalar("SELECT count(*) FROM write_log"))


# -- versions --------------------------------------------------------------------------------


def test_a_new_fact_makes_a_new_version_and_no_new_fact_none(memory: Memory,
                                                             clock: ManualClock) -> None:
    ids = seed(memory, clock)
    portraits = PortraitService(memory.store)
    first = synthesise(ctx_for(memory, clock))
    assert first.items == 1
    v1 = portraits.latest()
    assert v1 is not None and v1.how == "offline" and portraits.versions() == 1
    text = "\n".join(f"{line.section}: {line.text} {line.refs}" for line in v1.lines)
    for line in v1.lines:
        assert line.refs and refs_exist(memory, line.refs), line
    sections = {line.section for line in v1.lines}
    assert sections == {"who", "people", "preferences", "routines", "concerns"}, text
    by_ref = {r: line for line in v1.lines for r in line.refs}
    assert "Lisbon" in by_ref[f"fact:{ids['home']}"].text
    assert by_ref[f"fact:{ids['home']}"].section == "who"
    assert by_ref[f"fact:{ids['sister']}"].text.startswith("Ana: Caroline's sister")
    assert by_ref[f"fact:{ids['routine']}"].section == "routines"
    assert by_ref[f"fact:{ids['plan']}"].section == "concerns"
    assert by_ref[f"episode:{ids['episode']}"].section == "concerns"
    assert f"fact:{ids['reflection']}" not in by_ref, "dmn findings never feed the portrait"
    # written through the write log, by the synthesis writer
    assert memory.store.scalar(
        "SELECT writer FROM write_log WHERE table_name = 'portraits' AND row_id = ?",
        (v1.id,)) == "synthesis"

    before = log_size(memory)
    clock.advance(DAY)
    same = synthesise(ctx_for(memory, clock))
    assert (same.items, same.detail) == (0, "nothing new")
    assert portraits.versions() == 1 and log_size(memory) == before

    clock.advance(60)
    new = fact(memory, "Caroline", "works_at", "Google")
    assert synthesise(ctx_for(memory, clock)).items == 1
    v2 = portraits.latest()
    assert v2 is not None and v2.id != v1.id and portraits.versions() == 2
    assert v2.lines != v1.lines
    line = next(x for x in v2.lines if f"fact:{new}" in x.refs)
    assert "Google" in line.text and line.section == "who"
    assert portraits.get(v1.id) == v1, "older versions are kept as they were"


def test_a_forgotten_fact_leaves_the_shown_portrait_at_once_and_the_next_version(
        memory: Memory, clock: ManualClock) -> None:
    ids = seed(memory, clock)
    synthesise(ctx_for(memory, clock))
    reader = PortraitReader(lambda: memory.store)
    shown = reader.lines()
    assert any(f"fact:{ids['ocean']}" in line.refs for line in shown)
    memory.change(Ref("fact", ids["ocean"]), "delete", "user")
    assert not any(f"fact:{ids['ocean']}" in line.refs for line in reader.lines())
    assert len(reader.lines()) == len(shown) - 1
    clock.advance(60)
    # the forget already put the version without it in place (runtime.memories.derived):
    # the next run finds the portrait it would write
    assert synthesise(ctx_for(memory, clock)).detail == "nothing new (same portrait)"
    latest = PortraitService(memory.store).latest()
    assert latest is not None
    # every memory seeded but the forgotten one (and the dmn finding, never portrayed)
    expected = {f"fact:{ids[name]}" for name in ("home", "job", "sister", "routine", "plan")}
    expected.add(f"episode:{ids['episode']}")
    assert {ref for line in latest.lines for ref in line.refs} == expected
    assert {ref for line in reader.lines() for ref in line.refs} == expected


def test_nothing_to_portray_ends_ok(memory: Memory, clock: ManualClock) -> None:
    result = synthesise(ctx_for(memory, clock))
    assert result.items == 0 and not result.more
    assert PortraitService(memory.store).versions() == 0
    assert synthesise(ctx_for(memory, clock)).detail == "nothing new"


# -- the prompt -------------------------------------------------------------------------------


class _Memory:
    def __init__(self, ref: str, text: str) -> None:
        self.ref, self.text = ref, text


LINES = [PortraitLine(section="who", text="Caroline: lives in Lisbon", refs=["fact:3"]),
         PortraitLine(section="people", text="Ana: Caroline's sister\n# RULES.md",
                      refs=["fact:7", "episode:2"])]


def test_the_prompt_has_the_portrait_between_the_time_and_the_memories() -> None:
    persona = [PersonaFile(name="SOUL.md", path=Path("SOUL.md"), text="You are Wren.",
                           scope="global")]
    messages = build_messages(persona, [_Memory("turn:12", "Ana lives in Porto.")], [],
                              "Who is Ana?", NOW, portrait=LINES)
    system = messages[0].content
    assert system.index("Current date and time") < system.index(PORTRAIT_HEADING) \
        < system.index("# Memory")
    assert "- [fact:3] Caroline: lives in Lisbon" in system
    # one bullet per line, whatever its text holds
    assert "- [fact:7, episode:2] Ana: Caroline's sister # RULES.md" in system
    assert "\n# RULES.md" not in system
    assert PORTRAIT_HEADING not in system_prompt(persona, [], NOW)
    assert PORTRAIT_HEADING not in system_prompt(persona, [], NOW, mode="off", portrait=LINES)
    assert PORTRAIT_HEADING in system_prompt(persona, [], NOW, mode="index", portrait=LINES)


# -- the language model --------------------------------------------------------------------


def llm_for(server: FakeOpenAI) -> FallbackChain:
    from runtime.config import LLMSettings

    return make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=server.base_url, model="tiny", timeout_s=5)]))


def test_with_a_model_the_portrait_is_its_answer_validated(
        memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    ids = seed(memory, clock)
    good = {"lines": [{"section": "who", "text": "Caroline lives in Lisbon and is a counselor.",
                       "refs": [f"fact:{ids['home']}", f"fact:{ids['job']}"]}]}
    fake_openai.replies = ["I think she is nice.", json.dumps(good)]
    result = synthesise(ctx_for(memory, clock, llm_for(fake_openai)))
    assert result.items == 1
    latest = PortraitService(memory.store).latest()
    assert latest is not None and latest.how == "llm"
    assert [(x.section, x.text, x.refs) for x in latest.lines] == [
        ("who", "Caroline lives in Lisbon and is a counselor.",
         [f"fact:{ids['home']}", f"fact:{ids['job']}"])]
    assert len(fake_openai.requests) == 2, "an invalid answer is asked for once more"
    prompt = fake_openai.requests[0].body["messages"]
    assert "EVIDENCE START" in prompt[1]["content"] and f"[fact:{ids['home']}]" \
        in prompt[1]["content"]


def test_an_invalid_answer_twice_falls_back_to_the_offline_portrait(
        memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    ids = seed(memory, clock)
    made_up = {"lines": [{"section": "who", "text": "Caroline is a pilot.",
                          "refs": ["fact:999"]}]}
    fake_openai.replies = [json.dumps(made_up), json.dumps(made_up)]
    params = SynthesisParams(llm_retry_s=3600)
    assert synthesise(ctx_for(memory, clock, llm_for(fake_openai)), params).items == 1
    latest = PortraitService(memory.store).latest()
    assert latest is not None and latest.how == "fallback"
    assert any(f"fact:{ids['home']}" in x.refs for x in latest.lines)
    assert all(refs_exist(memory, x.refs) for x in latest.lines)
    # the model is asked again later, not on every run
    asked = len(fake_openai.requests)
    assert synthesise(ctx_for(memory, clock, llm_for(fake_openai)), params).items == 0
    assert len(fake_openai.requests) == asked
    clock.advance(3601)
    fake_openai.replies = [json.dumps({"lines": [{"section": "who", "text": "Caroline: Lisbon.",
                                                  "refs": [f"fact:{ids['home']}"]}]})]
    assert synthesise(ctx_for(memory, clock, llm_for(fake_openai)), params).items == 1
    newest = PortraitService(memory.store).latest()
    assert newest is not None and newest.how == "llm"


def test_an_unreachable_model_falls_back(memory: Memory, clock: ManualClock,
                                         fake_openai: FakeOpenAI) -> None:
    seed(memory, clock)
    fake_openai.mode = Mode.HTTP_500
    assert synthesise(ctx_for(memory, clock, llm_for(fake_openai))).items == 1
    latest = PortraitService(memory.store).latest()
    assert latest is not None and latest.how == "fallback" and latest.lines


# -- through the runtime ---------------------------------------------------------------------

NS = "test-portrait"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    settings = llm_settings(NS, tmp_path_factory.mktemp("portrait-data"), model_cache, server,
                            http={"enabled": False}, jobs={"idle_after_s": 3600})
    with llm_runtime(settings):
        yield settings


def test_the_turns_actor_gives_the_model_the_latest_portrait(
        runtime: Settings, server: FakeOpenAI) -> None:
    from actors.handles import CronClient, GraphClient, TranscriptClient, TurnsClient
    from actors.messages import AddFact, RunJob, UserTurn

    graph = GraphClient(NS)
    home = graph.add(AddFact(fact=FactIn(kind="place", subject="Caroline", key="lives_in",
                                         value="Lisbon", confidence=0.9), writer="test"))
    sister = graph.add(AddFact(fact=FactIn(kind="user_specific", subject="Ana",
                                           key="relation_to_caroline", value="sister",
                                           confidence=0.8), writer="test"))
    cron = CronClient(NS, timeout_s=300)
    server.mode = Mode.OK  # the model echoes: no JSON, so the portrait falls back offline
    ran = cron.run(RunJob(name="synthesis", wait=True), timeout=300)
    assert (ran.outcome, ran.items) == ("ok", 1), ran
    for name in ("patterns", "dmn"):  # the other two jobs run in the runtime too
        other = cron.run(RunJob(name=name, wait=True), timeout=300)
        assert other.outcome == "ok", other

    reply = TurnsClient(NS, timeout_s=120).process(UserTurn(channel="chat",
                                                            text="Where does Caroline live?"))
    TranscriptClient(NS).flush()
    assert reply.provider == "local"
    system = server.last.body["messages"][0]
    assert system["role"] == "system"
    assert PORTRAIT_HEADING in system["content"]
    assert f"- [fact:{home.fact_id}] Caroline: lives in Lisbon" in system["content"]
    assert f"[fact:{sister.fact_id}] Ana: Caroline's sister" in system["content"], \
        system["content"]

    # a new fact, a new version: the next turn sees it (cached by version)
    graph.add(AddFact(fact=FactIn(kind="user_specific", subject="Caroline", key="occupation",
                                  value="counselor", confidence=0.9), writer="test"))
    assert cron.run(RunJob(name="synthesis", wait=True), timeout=300).items == 1
    TurnsClient(NS, timeout_s=120).process(UserTurn(channel="chat", text="And her job?"))
    assert "works as counselor" in server.last.body["messages"][0]["content"]
