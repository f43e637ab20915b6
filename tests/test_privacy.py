"""Privacy in a shared home (runtime.memories.privacy) on a real store with the real
embedder: who may be told a sensitive memory, the mark and its write log,
sensitivity and owner inherited by episodes and facts (the consolidate and
facts jobs), scoped recall, the offline provider, and the generated artefacts
(portrait, dmn, patterns) that never read a sensitive memory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime.config import Settings, load_settings
from runtime.llm.providers import ChatMessage, LLMRequest, OfflineProvider, make_llm
from runtime.memories import privacy
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.portrait import current_refs
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.contract import JobContext
from runtime.mind.distil import distil
from runtime.mind.dmn import DmnParams, follow_ups
from runtime.mind.extract import run as facts_job
from runtime.mind.patterns import PatternsJob
from runtime.mind.research import interests
from runtime.mind.synthesis import SynthesisParams, gather
from runtime.recall.browse import get as browse_get
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY, ManualClock, household_zone

T0 = 1_700_000_000.0
HOUR = 3600.0


def ctx_for(memory: Memory, clock: ManualClock) -> JobContext:
    return JobContext(store=memory.store, writer=memory, llm=make_llm(memory.settings.llm),
                      clock=clock, settings=memory.settings)


def said(memory: Memory, speaker: str | None, text: str, at: float,
         channel: str = "voice", role: str = "user") -> int:
    return memory.add_turn(TurnIn(channel=channel, source="user" if role == "user" else
                                  "assistant", role=role,  # type: ignore[arg-type]
                                  speaker=speaker, content=text, created_at=at))


def row(memory: Memory, table: str, item_id: int) -> dict[str, Any]:
    found = memory.store.row(f"SELECT * FROM {table} WHERE id = ?", (item_id,))
    assert found is not None
    return found


def fact(memory: Memory, value: str, key: str, sensitive: bool = False,
         person: str | None = None, kind: str = "user_specific", subject: str = "user") -> int:
    return memory.add_fact(FactIn(kind=kind, subject=subject, key=key, value=value,
                                  confidence=1.0, user_managed=True, sensitive=sensitive,
                                  person=person))[0]


# -- who may be told ----------------------------------------------------------------


@pytest.fixture
def household(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(household={"people": ["Ana", "Bob"]},
                         mqtt={"people": {"phone_of_cleo": "Cleo"}})


def test_voice_is_spoken_by_default_and_the_household_knows_its_people(
        household: Settings) -> None:
    assert household.channels["voice"].spoken and not household.channels["chat"].spoken
    assert privacy.known_people(household) == {"ana", "bob", "cleo"}
    voice = household.channels["voice"]
    assert privacy.audience(household, voice, " ana ") == privacy.Audience("ana", True, True)
    assert privacy.audience(household, voice, "Dave").known is False


@pytest.mark.parametrize(("channel", "speaker", "person", "allowed"), [
    ("voice", None, None, False),        # nobody said who speaks: never read aloud
    ("voice", "Dave", None, False),      # a stranger
    ("voice", "Dave", "Dave", False),    # a stranger naming himself as an owner
    ("voice", "Ana", "Ana", True),       # its owner
    ("voice", "ANA", "ana", True),       # names compare case-insensitively
    ("voice", "Bob", "Ana", False),      # another of the household's people
    ("voice", "Bob", None, True),        # the household's own, to one of its people
    ("voice", "Cleo", None, True),       # known through [mqtt.people]
    ("chat", None, None, True),          # the household's typed channel
    ("chat", None, "Ana", False),        # ... but not a person's own
    ("chat", "Dave", None, False),       # a named stranger, typed
])
def test_who_may_be_given_a_sensitive_memory(household: Settings, channel: str,
                                             speaker: str | None, person: str | None,
                                             allowed: bool) -> None:
    who = privacy.audience(household, household.channels[channel], speaker)
    assert privacy.may_use(who, True, person) is allowed
    assert privacy.may_use(who, False, person) is True  # not sensitive: anybody


def test_a_scoped_recall_is_that_persons_and_the_households(memory: Memory) -> None:
    ana = fact(memory, "Ana keeps her bike in the garage by the freezer.", "ana_bike",
               person="Ana")
    bob = fact(memory, "Bob keeps his bike in the garage near the door.", "bob_bike",
               person="Bob")
    ours = fact(memory, "The family bikes are kept in the garage.", "family_bikes")
    memory.indexer.sync()
    query = "where are the bikes kept in the garage?"
    assert {f"fact:{i}" for i in (ana, bob, ours)} <= set(memory.recall(query).refs)
    scoped = memory.recall(query, person="ana").refs
    assert f"fact:{ana}" in scoped and f"fact:{ours}" in scoped
    assert f"fact:{bob}" not in scoped
    items = {i.ref: i for i in memory.recall(query).items}
    assert items[f"fact:{ana}"].person == "Ana" and items[f"fact:{ours}"].person is None


def test_a_reply_given_a_sensitive_memory_is_never_recalled(memory: Memory) -> None:
    asked = said(memory, "Ana", "What is the locker code?", T0)
    answer = memory.add_turn(TurnIn(channel="voice", source="assistant", role="assistant",
                                    content="The locker code is 9902.", created_at=T0 + 1,
                                    sensitive=True))
    plain = memory.add_turn(TurnIn(channel="voice", source="assistant", role="assistant",
                                   content="The locker is by the gym door.", created_at=T0 + 2))
    memory.indexer.sync()
    refs = memory.recall("the locker code at the gym").refs
    assert f"turn:{plain}" in refs and f"turn:{answer}" not in refs
    assert asked


def test_recalled_items_carry_the_mark(memory: Memory) -> None:
    code = fact(memory, "The garage code is 4471.", "garage_code", sensitive=True)
    memory.indexer.sync()
    [item] = [i for i in memory.recall("what is the garage code?").items
              if i.ref == f"fact:{code}"]
    assert item.sensitive


# -- the mark -----------------------------------------------------------------------


def test_marking_is_a_logged_reversible_write_on_any_kind(memory: Memory,
                                                         clock: ManualClock) -> None:
    turn = said(memory, "Ana", "My PIN is 1234.", T0)
    note = fact(memory, "The bank PIN is 1234.", "bank_pin")
    for ref, table in ((Ref("turn", turn), "transcript"), (Ref("fact", note), "facts")):
        memory.change(ref, "sensitive", writer="cli")
        assert row(memory, table, ref.id)["sensitive"] == 1
        logged = memory.store.row(
            "SELECT writer, op, after FROM write_log WHERE table_name = ? AND row_id = ?"
            " ORDER BY id DESC LIMIT 1", (table, ref.id))
        assert logged is not None and (logged["writer"], logged["op"]) == ("cli", "update")
        assert json.loads(logged["after"])["sensitive"] == 1
        memory.change(ref, "not_sensitive", writer="cli")
        assert row(memory, table, ref.id)["sensitive"] == 0
    # the vector stays: marking is not disabling
    memory.indexer.sync()
    memory.change(Ref("fact", note), "sensitive")
    assert memory.store.scalar("SELECT count(*) FROM vectors WHERE kind = 'fact' AND"
                               " item_id = ?", (note,)) == 1


def test_a_sensitive_kind_makes_its_facts_sensitive(memory: Memory) -> None:
    kinds = FactKinds.load(memory.settings.memory.fact_kinds_file)
    assert {"health", "finance", "credential"} <= {
        n for n in kinds.names if kinds.policy(n).sensitive}
    pill = fact(memory, "takes blood thinners", "medication", kind="health")
    assert row(memory, "facts", pill)["sensitive"] == 1
    plain = fact(memory, "likes tea", "drink")
    assert row(memory, "facts", plain)["sensitive"] == 0
    # a sensitive restatement makes the fact sensitive; a plain one never unmarks it
    again = memory.add_fact(FactIn(kind="user_specific", subject="user", key="drink",
                                   value="likes tea", sensitive=True))[0]
    assert again == plain and row(memory, "facts", plain)["sensitive"] == 1
    memory.add_fact(FactIn(kind="user_specific", subject="user", key="drink",
                           value="likes tea"))
    assert row(memory, "facts", plain)["sensitive"] == 1


def test_an_edited_fact_keeps_its_mark_and_owner(memory: Memory) -> None:
    code = fact(memory, "The locker code is 4471.", "locker", sensitive=True, person="Ana")
    new = memory.graph.edit(code, "The locker code is 9902.")[0]
    assert (row(memory, "facts", new)["sensitive"], row(memory, "facts", new)["person"]) == (
        1, "Ana")


# -- inherited by the jobs' episodes and facts ----------------------------------------


def test_consolidated_episodes_inherit_the_mark_and_their_one_speaker(
        memory: Memory, clock: ManualClock) -> None:
    ana = [said(memory, "Ana", "I saw the doctor about my blood pressure today.", T0),
           said(memory, None, "I hope it went well.", T0 + 60, role="assistant"),
           said(memory, "Ana", "The new tablets start on Monday.", T0 + 120)]
    memory.change(Ref("turn", ana[0]), "sensitive")
    both = [said(memory, "Ana", "Shall we paint the shed green?", T0, channel="chat"),
            said(memory, "Bob", "Green sounds good to me.", T0 + 60, channel="chat")]
    clock.set(T0 + 10 * HOUR)
    assert distil(ctx_for(memory, clock)).items == 2
    by_channel = {r["channel"]: r for r in memory.store.rows(
        "SELECT * FROM episodes WHERE level = 0")}
    assert (by_channel["voice"]["sensitive"], by_channel["voice"]["person"]) == (1, "Ana")
    assert (by_channel["chat"]["sensitive"], by_channel["chat"]["person"]) == (0, None)
    assert both  # two speakers: the household's
    # the continuity summary of a channel never repeats a sensitive gist
    summaries = {r["channel"]: r["summary"] for r in memory.store.rows(
        "SELECT channel, summary FROM compactions")}
    assert "blood pressure" in by_channel["voice"]["gist"]
    assert "blood pressure" not in summaries["voice"] and "shed" in summaries["chat"]
    # a roll-up of a sensitive episode is sensitive, and keeps the one owner
    theme = memory.add_episode(EpisodeIn(
        channel="voice", source="user", gist="Ana's health this week.", level=1,
        children=[by_channel["voice"]["id"]]))
    assert (row(memory, "episodes", theme)["sensitive"],
            row(memory, "episodes", theme)["person"]) == (1, "Ana")


def test_extracted_facts_carry_their_speaker_and_what_extraction_proposes(
        memory: Memory, clock: ManualClock) -> None:
    allergy = said(memory, "Ana", "I'm allergic to penicillin.", T0)
    hiking = said(memory, "Ana", "I love hiking in the hills.", T0 + 60)
    home = said(memory, "Bob", "I live in Porto.", T0 + 120)
    memory.change(Ref("turn", home), "sensitive")  # the user marked what Bob said
    clock.set(T0 + 10 * HOUR)
    distil(ctx_for(memory, clock))
    facts_job(ctx_for(memory, clock))
    got = {f["key"]: f for f in memory.store.rows("SELECT * FROM facts")}
    assert (got["allergy_penicillin"]["sensitive"], got["allergy_penicillin"]["person"]) == (
        1, "Ana")                                  # health: proposed by the rules
    [love] = [f for k, f in got.items() if k.startswith("preference_")]
    assert (love["sensitive"], love["person"]) == (0, "Ana")
    assert (got["lives_in"]["sensitive"], got["lives_in"]["person"]) == (1, "Bob")  # inherited
    assert allergy and hiking


@pytest.mark.parametrize(("texts", "category"), [
    (("garage_code", "the garage code is 4471"), "credential"),
    (("note_wifi", "the wifi password is on the fridge"), "credential"),
    (("allergy_cats", "allergic to cats"), "health"),
    (("medication", "takes insulin at night"), "health"),
    (("salary", "earns 3000 a month"), "money"),
    (("note_loan", "the car loan ends in May"), "money"),
    (("preference_hiking", "loves hiking"), None),
    (("lives_in", "Lisbon"), None),
    (("occupation", "code reviewer"), None),      # "code" alone is no secret
    (("occupation", "doctor"), None),             # a job, not a health matter
    (("works_at", "City Hospital"), None),
    (("plan_dentist", "a dentist appointment on Friday"), "health"),
])
def test_what_extraction_reads_as_sensitive(texts: tuple[str, str],
                                            category: str | None) -> None:
    assert privacy.proposed(*texts) == category


# -- the offline provider -------------------------------------------------------------


def test_the_offline_provider_never_quotes_a_sensitive_memory() -> None:
    ask = [ChatMessage(role="user", content="what is the garage code?")]
    request = LLMRequest(messages=ask, memories=["The garage code is 4471.",
                                                 "The bins go out on Tuesday."],
                         sensitive=[True, False])
    text = OfflineProvider().complete(request).text
    assert "4471" not in text and "bins go out on Tuesday" in text
    only = LLMRequest(messages=ask, memories=["The garage code is 4471."], sensitive=[True])
    assert OfflineProvider().complete(only).text == OfflineProvider.NO_MEMORY_REPLY
    with pytest.raises(ValueError, match="2 flags for 1 memories"):
        LLMRequest(messages=ask, memories=["x"], sensitive=[True, False])


# -- generated artefacts never read a sensitive memory ------------------------------------


def test_the_portrait_never_gathers_a_sensitive_memory(memory: Memory,
                                                       clock: ManualClock) -> None:
    clock.set(T0)
    turn = said(memory, "Ana", "I have an appointment at the fertility clinic.", T0 - 60)
    memory.change(Ref("turn", turn), "sensitive")
    secret = fact(memory, "The garage code is 4471.", "garage_code", sensitive=True)
    shared = fact(memory, "Ana lives in Lisbon.", "lives_in")
    episode = memory.add_episode(EpisodeIn(channel="voice", source="user", salience=9,
                                           gist="Ana: fertility clinic appointment.",
                                           cites=[turn], started_at=T0 - 60))
    plain = memory.add_episode(EpisodeIn(channel="voice", source="user", salience=9,
                                         gist="Ana planted tomatoes.", started_at=T0 - 60))
    ev = gather(memory.store, T0, SynthesisParams())
    assert {f["id"] for f in ev.facts} == {shared}
    assert {e["id"] for e in ev.episodes} == {plain}
    # a line citing a memory marked sensitive after the portrait was written goes
    assert current_refs(memory.store, [f"fact:{shared}", f"fact:{secret}",
                                       f"episode:{episode}"]) == {f"fact:{shared}"}
    memory.change(Ref("fact", shared), "sensitive")
    assert current_refs(memory.store, [f"fact:{shared}"]) == set()


def test_dmn_never_follows_up_on_a_sensitive_episode(memory: Memory,
                                                     clock: ManualClock) -> None:
    clock.set(T0)
    hard = memory.add_episode(EpisodeIn(channel="voice", source="user", salience=9,
                                        emotion="sadness", gist="Ana cried about her debts.",
                                        started_at=T0 - HOUR, sensitive=True))
    sad = memory.add_episode(EpisodeIn(channel="voice", source="user", salience=9,
                                       emotion="sadness", gist="Bob missed his old dog.",
                                       started_at=T0 - HOUR))
    found = {ref for f in follow_ups(memory.store, T0, DmnParams()) for ref in f.refs}
    assert found == {f"episode:{sad}"}
    assert hard


def test_research_never_sends_a_sensitive_memory_out_as_a_query(
        memory: Memory, clock: ManualClock) -> None:
    clock.set(T0)
    shown = fact(memory, "loves sourdough baking", "preference_sourdough")
    hidden = fact(memory, "loves diabetes cookbooks", "preference_cookbooks", sensitive=True)
    memory.add_episode(EpisodeIn(channel="voice", source="user", gist="Ana planned a garden",
                                 started_at=T0 - HOUR))
    memory.add_episode(EpisodeIn(channel="voice", source="user", started_at=T0 - HOUR,
                                 gist="Ana worried about her overdraft", sensitive=True))
    said(memory, "Ana", "I want to learn the cello this winter", T0 - 60)
    secret = said(memory, "Ana", "I want to hide my chemotherapy from the kids", T0 - 30)
    memory.change(Ref("turn", secret), "sensitive")
    found = " | ".join(i.text for i in interests(
        memory.store, MemoryProfiles.load(memory.settings.memory.profiles_file), T0))
    assert "sourdough" in found and "garden" in found and "cello" in found
    for word in ("diabetes", "overdraft", "chemotherapy"):
        assert word not in found
    assert shown and hidden


def test_patterns_never_read_a_sensitive_turn(memory: Memory) -> None:
    plain = said(memory, "Ana", "I practise the piano every morning.", T0)
    secret = said(memory, "Ana", "I take my insulin every morning.", T0 + DAY)
    memory.change(Ref("turn", secret), "sensitive")
    seen = [turn["id"] for turn, *_ in PatternsJob._turns(
        memory.store, MemoryProfiles.load(memory.settings.memory.profiles_file),
        household_zone("UTC"), frozenset())]
    assert seen == [plain]


# -- browsing -----------------------------------------------------------------------------


def test_browsing_shows_the_mark_and_the_owner(memory: Memory) -> None:
    code = fact(memory, "The garage code is 4471.", "garage_code", sensitive=True,
                person="Ana")
    turn = said(memory, "Bob", "Hello there.", T0)
    view = browse_get(memory.store, Ref("fact", code))
    assert view is not None and (view.sensitive, view.person) == (True, "Ana")
    plain = browse_get(memory.store, Ref("turn", turn))
    assert plain is not None and (plain.sensitive, plain.person) == (False, "Bob")


def test_the_memory_page_shows_the_mark(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from test_http_page import TOKEN, FakeBackend, logged_in

    from actors.http.app import make_app

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path / "data")}, "http": {"port": 0}})
    backend = FakeBackend()
    code = backend.add("The garage code is 4471.", sensitive=True, person="Ana")
    backend.add("The bins go out on Tuesday.")
    app = make_app(settings, TOKEN, backend)  # type: ignore[arg-type]
    with TestClient(app, follow_redirects=False) as client:
        logged_in(client)
        listed = client.get("/").text
        one = client.get(f"/memories/{code.ref}").text
    assert listed.count('<span class="badge sensitive">sensitive</span>') == 1
    assert '<span class="badge sensitive">sensitive</span>' in one
