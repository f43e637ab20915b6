"""The user profile with a lifecycle (runtime.memories.user_profile): list fields upsert,
``_done`` / ``_remove`` / ``_replace``, history kept, directives with a scope, bad
input refused with nothing written; on a real store, then through the real
runtime (``reverie profile set`` reaches the Graph actor; the Turns actor puts the
profile and the directives in scope into the system message the model receives)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401

from runtime.memories.user_profile import (
    PROFILE_HEADING,
    ProfileOp,
    ProfileService,
    parse_assignment,
    profile_fields,
    profile_section,
    split_items,
)
from runtime.memory import Memory
from runtime.mind.spoken_profile import facts_text, is_instruction, spoken_ops
from tests.reverie_process import joined_runtime, runtime_env
from tests.reverie_process import reverie as run_reverie

ROOT = Path(__file__).resolve().parent.parent


def apply(memory: Memory, *assignments: str) -> list[str]:
    return memory.update_profile([parse_assignment(a) for a in assignments], writer="test")


def profile(memory: Memory) -> dict[str, object]:
    return profile_fields(ProfileService(memory.store).items())


def history(memory: Memory, field: str) -> list[tuple[str, str]]:
    return [(i.value, i.status) for i in ProfileService(memory.store).items(include_ended=True)
            if i.field == field]


def log_size(memory: Memory) -> int:
    return int(memory.store.scalar("SELECT count(*) FROM write_log"))


# -- parsing ------------------------------------------------------------------------------


def test_assignments_are_read_with_their_operation() -> None:
    assert parse_assignment("goals_done=earn the CKA") == ProfileOp(
        field="goals", op="done", value="earn the CKA")
    assert parse_assignment("milestone=Earned the CKA") == ProfileOp(
        field="milestones", op="set", value="Earned the CKA")
    assert parse_assignment("goals_replace=") == ProfileOp(field="goals", op="replace")
    assert parse_assignment(" Name = Caroline  Silva ") == ProfileOp(
        field="name", value="Caroline Silva")
    assert split_items("certifications", "Quiz X (Provider, 60 questions), AWS SAA") == [
        "Quiz X (Provider, 60 questions)", "AWS SAA"]
    assert split_items("directives", "keep it short, and kind") == ["keep it short, and kind"]


@pytest.mark.parametrize(("text", "why"), [
    ("goals", "expected FIELD=VALUE"),
    ("=x", "expected FIELD=VALUE"),
    ("favourite_colour=blue", "unknown profile field 'favourite_colour'"),
    ("goals_finish=x", "unknown profile field 'goals_finish'"),
    ("name_done=Caroline", "name is not a list"),
    ("goals_done=", "needs the item"),
    ("goals=", "to clear the list: goals_replace="),
])
def test_malformed_assignments_are_refused_clearly(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_assignment(text)


# -- the lifecycle ------------------------------------------------------------------------


def test_goals_done_moves_the_goal_out_of_the_list_into_milestones(memory: Memory) -> None:
    apply(memory, "goals=earn the CKA, learn Go")
    assert profile(memory)["goals"] == ["earn the CKA", "learn Go"]
    changes = apply(memory, "goals_done=Earn the CKA (finally)")
    assert changes == ["goals: 1 done (now milestones)"]
    assert profile(memory)["goals"] == ["learn Go"]
    assert profile(memory)["milestones"] == ["earn the CKA"]
    assert history(memory, "goals") == [("earn the CKA", "done"), ("learn Go", "active")]
    done = next(i for i in ProfileService(memory.store).items(include_ended=True)
                if i.status == "done")
    assert done.ended_at == memory.clock.now()


def test_restating_an_item_supersedes_it_instead_of_duplicating(memory: Memory) -> None:
    apply(memory, "goals=earn the CKA (by June)", "skills=Python, Go")
    assert apply(memory, "goals=Earn the CKA") == ["goals: 1 superseded"]
    assert profile(memory)["goals"] == ["Earn the CKA"]
    old, new = ProfileService(memory.store).items(include_ended=True)[0], \
        ProfileService(memory.store).items()[-1]
    assert (old.value, old.status) == ("earn the CKA (by June)", "replaced")
    assert memory.store.scalar("SELECT replaced_by FROM profile_items WHERE id = ?",
                               (old.id,)) == new.id
    before = log_size(memory)
    assert apply(memory, "skills=python,  Go") == ["skills: 1 superseded, 1 confirmed"]
    assert profile(memory)["skills"] == ["Go", "python"]
    assert log_size(memory) == before + 3  # one insert, one replaced, one confirmed
    assert apply(memory, "goals=earn the CKA - in progress") == ["goals: 1 superseded"]
    assert profile(memory)["goals"] == ["earn the CKA - in progress"], "status words aside"


def test_remove_and_replace_and_an_empty_replace_clears(memory: Memory) -> None:
    apply(memory, "interests=jazz, sailing (weekends), chess")
    apply(memory, "interests_remove=Sailing")
    assert profile(memory)["interests"] == ["jazz", "chess"]
    assert ("sailing (weekends)", "removed") in history(memory, "interests"), \
        "a removed item stays in the history"
    apply(memory, "interests_replace=pottery, birds")
    assert profile(memory)["interests"] == ["pottery", "birds"]
    assert [s for v, s in history(memory, "interests") if v in ("jazz", "chess")] == [
        "replaced", "replaced"]
    apply(memory, "interests_replace=")
    assert "interests" not in profile(memory)
    assert len(history(memory, "interests")) == 5


def test_scalars_are_set_replaced_and_cleared(memory: Memory) -> None:
    apply(memory, "name=Caroline", "location=Lisbon")
    apply(memory, "location=Porto")
    assert profile(memory) == {"name": "Caroline", "location": "Porto"}
    assert history(memory, "location") == [("Lisbon", "replaced"), ("Porto", "active")]
    apply(memory, "name=")
    assert profile(memory) == {"location": "Porto"}


def test_a_bad_operation_writes_nothing_not_even_the_good_ones_before_it(
        memory: Memory) -> None:
    apply(memory, "goals=learn Go")
    before = log_size(memory)
    with pytest.raises(ValueError, match="no active item of goals matches 'run a marathon'"):
        apply(memory, "skills=Rust", "goals_done=run a marathon")
    with pytest.raises(ValueError, match=r"unknown directive tag \[urgent\]"):
        apply(memory, "directives=[urgent] call me")
    assert log_size(memory) == before
    assert profile(memory) == {"goals": ["learn Go"]}


def test_directives_apply_on_their_scope_only(memory: Memory) -> None:
    apply(memory, "directives=[scope:voice] keep answers short",
          "directives=[hard] never share the door code",
          "directives=[scope:Leo][soft] use simple words", "name=Caroline")
    items = ProfileService(memory.store).items()
    voice = profile_section(items, "voice", None)
    chat = profile_section(items, "chat", "leo")
    assert voice.startswith(PROFILE_HEADING)
    assert "- keep answers short" in voice and "keep answers short" not in chat
    assert "use simple words" in chat and "use simple words" not in voice
    assert "- (always) never share the door code" in voice and "door code" in chat
    assert voice.index("door code") < voice.index("keep answers short"), "hard rules first"
    assert "- name: Caroline" in voice
    guest = profile_section(items, "voice", None, stranger=True)
    assert "keep answers short" in guest and "Caroline" not in guest, \
        "a stranger at a spoken channel gets the directives, not the profile"
    assert profile_section([], "voice", None) == ""
    assert len(profile_section(items, "voice", None, limit=250)) <= 250


# -- through the runtime ---------------------------------------------------------------------

NS = "test-user-profile"


@pytest.fixture(scope="module")
def running(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    config = (f'[[llm.providers]]\nname = "local"\nbase_url = "{server.base_url}"\n'
              'model = "tiny"\ntimeout_s = 10\n[household]\npeople = ["Caroline"]\n')
    env = runtime_env(tmp_path_factory.mktemp("profile-data"), NS, model_cache, config)
    with joined_runtime(env, ray_instance):
        yield env


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_reverie(env, *args, timeout=300, cwd=ROOT)  # in-process when joined here


def shown(env: dict[str, str]) -> dict[str, object]:
    out = reverie(env, "profile", "show", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["profile"])


def test_reverie_profile_set_goes_through_the_runtime_and_reaches_the_prompt(
        running: dict[str, str], server: FakeOpenAI) -> None:
    from actors.handles import TurnsClient
    from actors.messages import UserTurn

    done = reverie(running, "profile", "set", "goals=earn the CKA, learn Go", "name=Caroline",
                   "directives=[scope:voice] keep answers short",
                   "directives=[hard] never share the door code")
    assert done.returncode == 0, done.stderr
    assert "goals: 2 added" in done.stdout
    assert reverie(running, "profile", "set", "goals_done=earn the CKA").returncode == 0
    profile = shown(running)
    assert profile["goals"] == ["learn Go"] and profile["milestones"] == ["earn the CKA"]
    assert profile["name"] == "Caroline"
    assert profile["directives"] == [
        {"text": "keep answers short", "scope": "voice", "severity": "soft"},
        {"text": "never share the door code", "scope": None, "severity": "hard"}]
    text = reverie(running, "profile")
    assert text.returncode == 0 and "  - [scope:voice] [soft] keep answers short" in text.stdout

    # bad input: a clear error, exit 2, nothing written
    for args, why in ((("favourite=blue",), "unknown profile field 'favourite'"),
                      (("goals", "x"), "expected FIELD=VALUE"),
                      (("skills=Rust", "goals_done=sail around the world"),
                       "no active item of goals matches")):
        bad = reverie(running, "profile", "set", *args)
        assert bad.returncode == 2, (args, bad.stdout, bad.stderr)
        assert why in bad.stderr and "Traceback" not in bad.stderr
    assert shown(running) == profile

    turns = TurnsClient(NS, timeout_s=120)
    turns.process(UserTurn(channel="voice", speaker="Caroline", text="What is on today?"))
    voice = server.last.body["messages"][0]["content"]
    assert PROFILE_HEADING in voice and "- keep answers short" in voice
    assert "- (always) never share the door code" in voice and "- goals: learn Go" in voice
    turns.process(UserTurn(channel="voice", text="Who lives here?"))  # an unknown voice
    guest = server.last.body["messages"][0]["content"]
    assert "- keep answers short" in guest and "learn Go" not in guest, guest
    turns.process(UserTurn(channel="chat", text="And tomorrow?"))
    chat = server.last.body["messages"][0]["content"]
    assert "keep answers short" not in chat, "a voice directive stays on voice"
    assert "never share the door code" in chat and "- milestones: earn the CKA" in chat


# -- spoken instructions (the facts job) -----------------------------------------------------


def test_spoken_instructions_are_read_as_operations() -> None:
    active = {"goals": ["earn the CKA (by June)", "learn Go"], "interests": ["sailing"]}
    assert spoken_ops("Please remove sailing from my interests.", active) == [
        ProfileOp(field="interests", op="remove", value="sailing")]
    assert spoken_ops("Add Rust to my skills!", active) == [
        ProfileOp(field="skills", value="Rust")]
    assert spoken_ops("OK. My new goal is to run the Lisbon marathon.", active) == [
        ProfileOp(field="goals", value="run the Lisbon marathon")]
    assert spoken_ops("Guess what, I finally earned the CKA!", active) == [
        ProfileOp(field="goals", op="done", value="earn the CKA (by June)")]
    assert spoken_ops("I finished the dishes.", active) == [], "names no goal"
    assert spoken_ops("Remove chess from my interests.", active) == [], "names nothing"
    assert spoken_ops("The weather is nice and Ana lives in Porto.", active) == []
    assert is_instruction("my goal is to learn Go") and not is_instruction("I love my goals")
    assert facts_text("Remove sailing from my interests. My sister Ana lives in Porto.") == \
        "My sister Ana lives in Porto."
    assert facts_text("My goal is to learn Go!") == ""
    assert facts_text("I finished the book. It was long.") == "I finished the book. It was long."


def test_the_facts_job_applies_spoken_instructions_and_records_no_fact_of_them(
        memory: Memory, fake_openai: FakeOpenAI) -> None:
    from runtime.config import LLMSettings, ProviderSettings
    from runtime.llm.providers import make_llm
    from runtime.memories.episodes import EpisodeIn
    from runtime.memories.transcript import TurnIn
    from runtime.mind import extract
    from runtime.mind.contract import JobContext

    apply(memory, "goals=earn the CKA", "interests=sailing, chess")
    said = ["Remove sailing from my interests. My sister Ana lives in Porto.",
            "My goal is to visit Japan with Ana.", "I finally earned the CKA!"]
    turns = [memory.add_turn(TurnIn(channel="voice", source="user", speaker="Caroline",
                                    content=text)) for text in said]
    memory.add_episode(EpisodeIn(channel="voice", source="user", gist="Caroline's news",
                                 cites=turns))
    # a language model that answers no valid facts: the rules take over after it
    llm = make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=fake_openai.base_url, model="tiny", timeout_s=5)]))
    ctx = JobContext(store=memory.store, writer=memory, llm=llm, clock=memory.clock,
                     settings=memory.settings)
    result = extract.run(ctx)
    assert "profile: 3 applied" in result.detail
    assert profile(memory) == {"goals": ["visit Japan with Ana"], "interests": ["chess"],
                               "milestones": ["earn the CKA"]}
    assert ("sailing", "removed") in history(memory, "interests")
    read = json.dumps([r.body for r in fake_openai.requests])
    assert "Ana lives in Porto" in read and "CKA" in read
    assert "sailing" not in read and "Japan" not in read, "instructions are not facts"
    cited = {t for (p,) in memory.store.conn.execute("SELECT provenance FROM facts")
             for t in json.loads(p)}
    assert f"turn:{turns[0]}" in cited, "the rest of the turn still becomes facts"
    assert f"turn:{turns[1]}" not in cited
    assert "profile" not in extract.run(ctx).detail, "each turn is read once"
