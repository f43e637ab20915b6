"""Open threads (issue 12, clanka): opened and resolved by consolidation, ranked
higher by recall until resolved, escalated by the decay job but never past
vivid. Real SQLite files, the real ONNX embedder, a real local HTTP fake for
the language model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import make_llm
from runtime.memories.episodes import EpisodeIn
from runtime.memories.threads import ThreadChange, ThreadService, detect
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import janitor
from runtime.mind.contract import JobContext
from runtime.mind.distil import distil
from runtime.recall.hybrid import Recaller
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY, ManualClock

T0 = 1_700_000_000.0
HOUR = 3600.0


def ctx_for(memory: Memory, clock: ManualClock, settings: Settings | None = None) -> JobContext:
    settings = settings or memory.settings
    return JobContext(store=memory.store, writer=memory, llm=make_llm(settings.llm),
                      clock=clock, settings=settings, embedder=memory.embedder)


def talk(memory: Memory, start: float, lines: list[tuple[str, str]],
         channel: str = "chat") -> list[int]:
    turns = [TurnIn(channel=channel, source="assistant" if who == "assistant" else "user",
                    role="assistant" if who == "assistant" else "user",
                    speaker=None if who == "assistant" else who, content=text,
                    created_at=start + i * 60.0)
             for i, (who, text) in enumerate(lines)]
    return memory.add_turns(turns)


def leaf_citing(memory: Memory, turn_id: int) -> dict[str, Any]:
    row = memory.store.row(
        "SELECT e.* FROM episodes e JOIN episode_citations c ON c.episode_id = e.id"
        " WHERE c.transcript_id = ? AND e.level = 0", (turn_id,))
    assert row is not None, f"no leaf episode cites turn {turn_id}"
    return row


# -- offline detection ---------------------------------------------------------------


@dataclass(frozen=True)
class T:
    role: str
    content: str


@pytest.mark.parametrize(("turns", "state", "what"), [
    ([T("user", "The sink leaks again. I'll call the plumber tomorrow about it.")],
     "hot", "I'll call the plumber tomorrow about it."),
    ([T("user", "We should book a table at Rosa's for mum's birthday dinner.")],
     "simmering", "We should book a table at Rosa's for mum's birthday dinner."),
    ([T("user", "Remind me to send the tax forms to the accountant by Friday.")],
     "hot", "Remind me to send the tax forms to the accountant by Friday."),
    # a hot plan wins over a later simmering one
    ([T("user", "I need to renew my passport today. We should repaint the fence someday.")],
     "hot", "I need to renew my passport today."),
    # the window ends on the people's question: nobody answered it
    ([T("assistant", "Morning!"), T("user", "Did the parcel from Porto arrive yet?")],
     "simmering", "Did the parcel from Porto arrive yet?"),
    # the assistant asked about the user and got no answer
    ([T("user", "Back from the clinic."), T("assistant", "How did your check-up go?")],
     "simmering", "How did your check-up go?"),
])
def test_offline_rules_find_plans_promises_and_open_questions(
        turns: list[T], state: str, what: str) -> None:
    found = detect(turns)
    assert found is not None and (found.state, found.what) == (state, what)


@pytest.mark.parametrize("turns", [
    [T("user", "I'll think about it.")],                      # no content to keep
    [T("user", "I'll never forget the day my youngest took her first steps.")],
    [T("user", "Thanks, I'll keep you posted about the results.")],
    [T("user", "Should I call the plumber tomorrow?"), T("assistant", "Yes, do.")],
    [T("assistant", "I'll remember that your sister lives in Porto.")],  # not the people's
    [T("user", "Thanks!"), T("assistant", "Anything else I can help you with?")],
    [T("user", "The weather was lovely at the beach today.")],
])
def test_offline_rules_leave_small_talk_and_answered_questions_alone(turns: list[T]) -> None:
    assert detect(turns) is None


# -- opened and resolved by consolidation -------------------------------------------


def test_a_thread_opened_in_one_conversation_is_resolved_by_a_later_one_that_closes_it(
        memory: Memory, clock: ManualClock) -> None:
    plumber = talk(memory, T0, [
        ("Caroline", "The kitchen sink is leaking again. I'll call the plumber tomorrow "
                     "about the leaking sink."),
        ("assistant", "Good idea, a leak only gets worse.")])
    table = talk(memory, T0 + 3 * HOUR, [
        ("Caroline", "We should book a table at Rosa's for mum's birthday dinner next month."),
        ("assistant", "Rosa's sounds lovely.")])
    clock.set(T0 + 6 * HOUR)
    distil(ctx_for(memory, clock))
    opened = leaf_citing(memory, plumber[0])
    other = leaf_citing(memory, table[0])
    assert (opened["thread"], opened["thread_resolved_at"]) == ("hot", None)
    assert opened["thread_what"].startswith("I'll call the plumber tomorrow")
    assert (other["thread"], other["thread_resolved_at"]) == ("simmering", None)
    assert memory.counts()["open_threads"] == 2  # reverie status shows the count

    # a day later: the plumber is done; flights booked is a closing cue about another thing
    later = talk(memory, T0 + DAY, [
        ("Caroline", "I called the plumber this morning, the sink is fixed now. "
                     "Also I booked flights to Lisbon for the conference."),
        ("assistant", "Great, one thing less to worry about.")])
    clock.set(T0 + DAY + 6 * HOUR)
    result = distil(ctx_for(memory, clock))
    closer = leaf_citing(memory, later[0])
    resolved = memory.episodes.get(opened["id"])
    still = memory.episodes.get(other["id"])
    assert resolved is not None and still is not None
    assert resolved["thread_resolved_at"] == clock.now()
    assert resolved["thread_resolved_by"] == closer["id"]
    assert still["thread_resolved_at"] is None
    assert "1 threads resolved" in result.detail
    # through the logged write path, by the consolidate job
    logged = memory.store.row(
        "SELECT writer FROM write_log WHERE table_name = 'episodes' AND row_id = ?"
        " AND op = 'update' AND json_extract(after, '$.thread_resolved_at') IS NOT NULL",
        (opened["id"],))
    assert logged is not None and logged["writer"] == "consolidate"
    assert [r["id"] for r in ThreadService(memory.store).open_threads("chat")] == [other["id"]]
    assert memory.counts()["open_threads"] == 1


def test_a_closing_word_on_another_channel_resolves_nothing(
        memory: Memory, clock: ManualClock) -> None:
    opened = talk(memory, T0, [("Ana", "I'll call the plumber tomorrow about the leaking sink.")])
    talk(memory, T0 + DAY, [("Ana", "I called the plumber, the sink is fixed.")],
         channel="voice")
    clock.set(T0 + 2 * DAY)
    distil(ctx_for(memory, clock))
    assert leaf_citing(memory, opened[0])["thread_resolved_at"] is None


def llm_settings(make_settings: Callable[..., Settings], server: FakeOpenAI) -> Settings:
    return make_settings(household={"timezone": "UTC"}, llm={"providers": [
        {"name": "fake", "base_url": server.base_url, "model": "m", "timeout_s": 5}]})


@pytest.fixture
def llm_memory(make_settings: Callable[..., Settings], clock: ManualClock, embedder: Embedder,
               fake_openai: FakeOpenAI) -> Iterator[Memory]:
    mem = Memory(llm_settings(make_settings, fake_openai), clock=clock, embedder=embedder)
    yield mem
    mem.close()


def answer(gist: str, **extra: Any) -> str:
    return json.dumps({"gist": gist, "salience": 5, "emotion": "neutral", **extra})


def test_with_a_model_its_answer_opens_the_thread_and_names_what_it_closes(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    first = talk(llm_memory, T0, [("Ana", "Could you find out when the bins go out?")])
    fake_openai.replies.append(answer(
        "Ana asked when the bins go out.", thread="simmering",
        thread_what="when the bins go out"))
    clock.set(T0 + 6 * HOUR)
    distil(ctx_for(llm_memory, clock))
    opened = leaf_citing(llm_memory, first[0])
    assert (opened["thread"], opened["thread_what"]) == ("simmering", "when the bins go out")

    # the next conversation: the model sees the open thread and says it is closed
    second = talk(llm_memory, T0 + DAY, [("Ana", "Mum says the bins go out on Tuesday mornings.")])
    fake_openai.replies.append(answer("Ana found the bins day.", closes=[opened["id"], 999]))
    clock.set(T0 + DAY + 6 * HOUR)
    distil(ctx_for(llm_memory, clock))
    prompt = fake_openai.requests[-1].body["messages"][1]["content"]
    assert f"- id {opened['id']}: when the bins go out" in prompt
    row = llm_memory.episodes.get(opened["id"])
    assert row is not None
    assert row["thread_resolved_by"] == leaf_citing(llm_memory, second[0])["id"]


def test_a_roll_up_parent_carries_its_leaves_hottest_open_thread(
        memory: Memory, clock: ManualClock) -> None:
    from runtime.mind.rollup import parent_of

    gists = [("Ana talked about the garden.", None, None),
             ("Ana should repaint the fence someday.", "simmering", "repaint the fence"),
             ("Ana must pay the water bill today.", "hot", "pay the water bill today")]
    ids = [memory.add_episode(EpisodeIn(channel="chat", source="user", gist=g, thread=state,  # type: ignore[arg-type]
                                        thread_what=what)) for g, state, what in gists]
    children = [row for i in ids if (row := memory.episodes.get(i)) is not None]
    vectors = dict(zip(ids, memory.embedder.embed([g for g, _, _ in gists])))
    parent = parent_of(memory.job_context(), children, vectors[ids[0]], vectors)
    assert (parent.thread, parent.thread_what) == ("hot", "pay the water bill today")
    resolved = children[2]["id"]
    memory.update_thread(ThreadChange(episode_id=resolved, change="resolve", at=clock.now()))
    children = [row for i in ids if (row := memory.episodes.get(i)) is not None]
    parent = parent_of(memory.job_context(), children, vectors[ids[0]], vectors)
    assert (parent.thread, parent.thread_what) == ("simmering", "repaint the fence")


# -- ranked higher until resolved ---------------------------------------------------


def recall_scores(memory: Memory, query: str, **weights: float) -> dict[str, float]:
    settings = memory.settings.recall.model_copy(update=weights)
    recaller = Recaller(memory.store, memory.index, memory.embedder, memory.kinds, settings,
                        memory.clock)
    return {i.ref: i.score for i in recaller.recall(query).items}


def test_an_open_thread_ranks_higher_hot_more_than_simmering_until_resolved(
        memory: Memory, clock: ManualClock) -> None:
    plain = memory.add_episode(EpisodeIn(
        channel="chat", source="user",
        gist="Caroline talked with the plumber about the bathroom tap."))
    thread = memory.add_episode(EpisodeIn(
        channel="chat", source="user",
        gist="The plumber will come to fix the bathroom tap for Caroline.",
        thread="simmering", thread_what="the plumber will come to fix the tap"))
    query = "the plumber and the bathroom tap"
    base = recall_scores(memory, query, weight_thread=0.0)
    assert base[f"episode:{plain}"] > base[f"episode:{thread}"]  # less relevant by itself

    simmering = recall_scores(memory, query)
    assert simmering[f"episode:{thread}"] > base[f"episode:{thread}"]
    assert simmering[f"episode:{plain}"] > simmering[f"episode:{thread}"]  # not enough yet
    memory.update_thread(ThreadChange(episode_id=thread, change="escalate", at=clock.now()))
    hot = recall_scores(memory, query)
    assert hot[f"episode:{thread}"] > simmering[f"episode:{thread}"]
    assert hot[f"episode:{thread}"] > hot[f"episode:{plain}"]  # now first

    memory.update_thread(ThreadChange(episode_id=thread, change="resolve", at=clock.now()))
    after = recall_scores(memory, query)
    assert after[f"episode:{thread}"] == pytest.approx(base[f"episode:{thread}"])
    assert after[f"episode:{plain}"] > after[f"episode:{thread}"]


def test_only_an_open_thread_can_be_changed(memory: Memory, clock: ManualClock) -> None:
    plain = memory.add_episode(EpisodeIn(channel="chat", source="user", gist="A walk."))
    with pytest.raises(ValueError, match=f"episode {plain} holds no open thread"):
        memory.update_thread(ThreadChange(episode_id=plain, change="resolve", at=clock.now()))
    with pytest.raises(ValueError, match="no episode 999"):
        memory.update_thread(ThreadChange(episode_id=999, change="escalate", at=clock.now()))


# -- escalated by the decay job -----------------------------------------------------


def test_a_thread_left_open_is_escalated_a_step_at_a_time_never_past_vivid(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    settings = make_settings(threads={"escalate_after_days": 3})
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        def thread(gist: str, level: str, state: str = "simmering") -> int:
            return memory.add_episode(EpisodeIn(
                channel="chat", source="user", gist=gist, memory_level=level,  # type: ignore[arg-type]
                thread=state, thread_what=gist, ended_at=clock.now()))  # type: ignore[arg-type]

        faint = thread("Ana will fix the garden gate.", "faint")
        normal = thread("Caroline must call the bank about the card.", "normal")
        seared = thread("Melanie promised to visit grandma in Braga.", "seared")
        closed = thread("Ana should return the library books.", "normal")
        memory.update_thread(ThreadChange(episode_id=closed, change="resolve", at=clock.now()))

        def levels() -> dict[int, tuple[str, str]]:
            return {i: (r["memory_level"], r["thread"]) for i in (faint, normal, seared, closed)
                    if (r := memory.episodes.get(i)) is not None}

        clock.advance(2 * DAY)  # not due yet
        janitor.run(memory.job_context())
        assert levels()[faint] == ("faint", "simmering")

        clock.advance(1 * DAY)  # three days open: one step, and hot
        result = janitor.run(memory.job_context())
        assert "2 open threads escalated" in result.detail
        assert levels() == {faint: ("normal", "hot"), normal: ("vivid", "hot"),
                            seared: ("seared", "simmering"), closed: ("normal", "simmering")}

        clock.advance(1 * DAY)  # one day since the last raise: not again yet
        janitor.run(memory.job_context())
        assert levels()[faint] == ("normal", "hot")

        for _ in range(10):  # many runs, many days: stops at vivid
            clock.advance(3 * DAY)
            janitor.run(memory.job_context())
        assert levels() == {faint: ("vivid", "hot"), normal: ("vivid", "hot"),
                            seared: ("seared", "simmering"), closed: ("normal", "simmering")}
        touched = memory.store.scalar(
            "SELECT count(*) FROM write_log WHERE table_name = 'episodes' AND row_id = ?"
            " AND op = 'update'", (seared,))
        assert touched == 0  # seared: never written to
        # nor when asked directly: the service keeps the rule, whoever calls
        for episode_id in (seared, normal):
            memory.update_thread(ThreadChange(episode_id=episode_id, change="escalate",
                                              at=clock.now()))
        assert levels()[seared] == ("seared", "simmering")
        assert levels()[normal] == ("vivid", "hot")
        raises = memory.store.scalar(
            "SELECT count(*) FROM write_log WHERE table_name = 'episodes' AND row_id = ?"
            " AND op = 'update' AND writer = 'decay'", (faint,))
        assert raises == 2  # faint to normal, normal to vivid: nothing more


# -- in the actor runtime: the jobs write through the Episodes actor ------------------

NS = "test-threads"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    from actors import supervisor
    from runtime.config import load_settings

    data = tmp_path_factory.mktemp("threads-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "http": {"enabled": False}, "jobs": {"idle_after_s": 3600},
        "threads": {"escalate_after_days": 1}})
    sup = supervisor.start(settings)
    yield settings
    sup.stop()


def test_the_decay_job_escalates_through_the_episodes_actor(runtime: Settings) -> None:
    import time

    from actors.common import BadRequest
    from actors.handles import CronClient, EpisodesClient
    from actors.messages import AddEpisode, RunJob, UpdateThread

    episodes = EpisodesClient(NS)
    opened = episodes.add(AddEpisode(episode=EpisodeIn(
        channel="chat", source="user", gist="Ana will renew the car insurance.",
        thread="simmering", thread_what="renew the car insurance",
        ended_at=time.time() - 2 * DAY), writer="test")).episode_id
    ran = CronClient(NS, timeout_s=300).run(RunJob(name="decay", wait=True), timeout=300)
    assert ran.outcome == "ok" and "1 open threads escalated" in (ran.detail or ""), ran

    store = Store(runtime.store.path, FactKinds.load(runtime.memory.fact_kinds_file))
    try:
        row = store.get("episodes", opened)
        writer = store.scalar("SELECT writer FROM write_log WHERE table_name = 'episodes'"
                              " AND row_id = ? AND op = 'update'", (opened,))
    finally:
        store.close()
    assert row is not None and (row["thread"], row["memory_level"]) == ("hot", "vivid")
    assert writer == "decay"
    with pytest.raises(BadRequest, match="no episode 99999"):
        episodes.update_thread(UpdateThread(change=ThreadChange(
            episode_id=99999, change="resolve", at=time.time())))
