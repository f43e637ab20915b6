"""Consolidation part 1: transcript windows become leaf episodes. Real SQLite,
the real offline provider, and a real local HTTP fake for the language model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401

from runtime.config import Settings
from runtime.llm.providers import make_llm
from runtime.llm.queue import PendingQueue
from runtime.memories.emotion import EmotionReading, read_emotion
from runtime.memories.episodes import EpisodeIn
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import consolidate
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.distil import (
    EMOTIONS,
    JOB,
    DistilOut,
    DistilParams,
    Turn,
    chunks,
    distil,
    extractive_gist,
    offline_salience,
    parse_output,
    split_windows,
)
from runtime.store.job_state import get_state
from runtime.time.clock import ManualClock

T0 = 1_700_000_000.0
HOUR = 3600.0

LINES = [
    ("Caroline", "Hey Mel! Good to see you."),
    ("Melanie", "Hi Caroline! How have you been?"),
    ("Caroline", "I went to an LGBTQ support group in Boston on 7 May 2023 and it was "
                 "so powerful."),
    ("Melanie", "Wow, that sounds amazing. I'm really happy for you."),
    ("Caroline", "Thanks! I decided to study counseling so I can help trans people."),
    ("Melanie", "That's great. I painted a lake sunrise last year, my kids loved it."),
]


@pytest.fixture
def memory(make_settings: Callable[..., Settings], clock: ManualClock,
           embedder: Any) -> Iterator[Memory]:
    """The windows here repeat the same six lines by design (what is tested is how
    transcript is cut into episodes), so near-duplicate refusal is off
    (``duplicate_similarity`` above 1); tests/test_duplicates.py tests it."""
    mem = Memory(make_settings(memory={"duplicate_similarity": 1.01}), clock=clock,
                 embedder=embedder)
    yield mem
    mem.close()


def ctx_for(memory: Memory, clock: ManualClock, settings: Settings | None = None,
            writer: Any = None) -> JobContext:
    settings = settings or memory.settings
    return JobContext(store=memory.store, writer=writer or memory,
                      llm=make_llm(settings.llm), clock=clock, settings=settings)


def add(memory: Memory, channel: str, n: int, start: float, step: float = 60.0,
        source: str = "user", lines: list[tuple[str, str]] | None = None) -> list[int]:
    lines = lines or LINES
    turns = []
    for i in range(n):
        speaker, text = lines[i % len(lines)]
        turns.append(TurnIn(channel=channel, source=source, role="user", speaker=speaker,
                            content=f"{text} (turn {i})", created_at=start + i * step))
    return memory.add_turns(turns)


def leaves(memory: Memory, channel: str | None = None) -> list[dict[str, Any]]:
    rows = memory.store.rows("SELECT * FROM episodes WHERE level = 0 ORDER BY id")
    return [r for r in rows if channel is None or r["channel"] == channel]


def cites(memory: Memory, episode_id: int) -> list[int]:
    return memory.episodes.citations(episode_id)


# -- windows ----------------------------------------------------------------------


def test_windows_are_split_per_channel_by_gap_and_count(memory: Memory,
                                                        clock: ManualClock) -> None:
    a = add(memory, "chat", 25, T0)                    # 20 + 5 by count
    b = add(memory, "chat", 4, T0 + 3 * HOUR)          # after a gap
    v = add(memory, "voice", 3, T0 + 30.0)             # its own channel, same time
    clock.set(T0 + 10 * HOUR)
    result = distil(ctx_for(memory, clock))
    assert result.items == 4 and not result.more
    chat = leaves(memory, "chat")
    assert [cites(memory, e["id"]) for e in chat] == [a[:20], a[20:], b]
    assert [cites(memory, e["id"]) for e in leaves(memory, "voice")] == [v]
    first = chat[0]
    assert first["started_at"] == T0 and first["ended_at"] == T0 + 19 * 60.0
    assert chat[2]["started_at"] == T0 + 3 * HOUR
    for e in leaves(memory):
        assert 1 <= e["salience"] <= 10 and e["emotion"] in EMOTIONS
        assert e["source"] == "user" and e["level"] == 0
        assert e["gist"].startswith(("Caroline: ", "Melanie: "))


def test_split_windows_and_chunks() -> None:
    turns = [Turn(i, "user", "user", None, "x", T0 + i * 10.0) for i in range(7)]
    late = [Turn(7, "user", "user", None, "x", T0 + 999.0)]
    assert [[t.id for t in w] for w in split_windows(turns + late, 500.0, 3)] == [
        [0, 1, 2], [3, 4, 5], [6], [7]]
    assert [len(c) for c in chunks(list(range(20)), 12)] == [10, 10]
    assert [len(c) for c in chunks(list(range(25)), 12)] == [8, 9, 8]
    assert [len(c) for c in chunks(list(range(12)), 12)] == [12]


def test_only_sources_that_become_episodes_are_distilled_the_rest_is_passed(
        memory: Memory, clock: ManualClock) -> None:
    ids = []
    for i, source in enumerate(["user", "scheduled", "assistant", "delegate:x", "user",
                                "nobody-knows-me"]):
        ids += memory.add_turns([TurnIn(channel="chat", source=source,
                                        role="assistant" if source == "assistant" else "user",
                                        content=f"I moved to Porto in 2021, row {i}.",
                                        created_at=T0 + i)])
    hidden = add(memory, "chat", 1, T0 + 10)[0]
    memory.transcript.set_disabled(hidden, True)
    muted_only = add(memory, "reminders", 3, T0, source="scheduled")
    clock.set(T0 + 5 * HOUR)
    assert distil(ctx_for(memory, clock)).items == 1
    (episode,) = leaves(memory)
    assert cites(memory, episode["id"]) == [ids[0], ids[2], ids[4]]
    assert episode["source"] == "user"
    # Skipped rows still advance the position and the watermark.
    assert memory.transcript.watermark("chat") == hidden
    assert memory.transcript.watermark("reminders") == muted_only[-1]
    summary = memory.store.scalar("SELECT summary FROM compactions WHERE channel = ?",
                                  ("reminders",))
    assert "nothing new to remember" in summary and "Hey Mel" not in summary
    assert leaves(memory, "reminders") == []


def test_an_open_window_waits_until_it_is_closed(memory: Memory, clock: ManualClock) -> None:
    ids = add(memory, "chat", 5, T0)
    clock.set(T0 + 4 * 60.0 + 60.0)  # the last turn is a minute old
    assert distil(ctx_for(memory, clock)).items == 0
    assert memory.transcript.watermark("chat") is None
    clock.set(T0 + HOUR)
    assert distil(ctx_for(memory, clock)).items == 1
    assert cites(memory, leaves(memory)[0]["id"]) == ids


def test_compaction_moves_the_watermark_and_a_second_run_does_nothing(
        memory: Memory, clock: ManualClock) -> None:
    ids = add(memory, "chat", 45, T0)
    clock.set(T0 + 10 * HOUR)
    assert distil(ctx_for(memory, clock)).items == 3
    assert memory.transcript.watermark("chat") == ids[-1]
    summary = memory.store.scalar("SELECT summary FROM compactions WHERE channel = 'chat'"
                                  " ORDER BY id DESC LIMIT 1")
    assert summary.startswith("Conversation on chat up to ")
    assert leaves(memory)[-1]["gist"][:40] in summary
    compactions = memory.store.scalar("SELECT count(*) FROM compactions")
    again = distil(ctx_for(memory, clock))
    assert again.items == 0 and not again.more
    assert memory.store.scalar("SELECT count(*) FROM compactions") == compactions
    assert get_state(memory.store, JOB, "distil.position.chat") == ids[-1]
    # Below the watermark, every row is cited by a live episode: nothing to prune.
    assert memory.transcript.prunable("chat") == []


def test_it_never_touches_user_managed_facts(memory: Memory, clock: ManualClock) -> None:
    from runtime.memories.facts import FactIn

    memory.add_fact(FactIn(kind="user_specific", subject="user", key="likes",
                           value="tea", source="user", user_managed=True), writer="user")
    before = memory.store.rows("SELECT * FROM facts")
    add(memory, "chat", 8, T0)
    clock.set(T0 + 10 * HOUR)
    distil(ctx_for(memory, clock))
    assert memory.store.rows("SELECT * FROM facts") == before


# -- crash and time budget -----------------------------------------------------------


class Crash(RuntimeError):
    pass


@dataclass
class CrashingWriter:
    """Writes through ``memory``, then dies right after the ``after``-th episode
    is committed (before the job records its progress)."""

    memory: Memory
    after: int
    written: int = 0

    def add_episode(self, episode: EpisodeIn, writer: str) -> int:
        episode_id = self.memory.add_episode(episode, writer)
        self.written += 1
        if self.written == self.after:
            raise Crash("killed mid-run")
        return episode_id

    def compact(self, channel: str, summary: str, watermark: int, writer: str,
                refs: Sequence[str] = ()) -> int:
        return self.memory.compact(channel, summary, watermark, writer, refs)

    def add_fact(self, fact: Any, writer: str) -> Any:
        return self.memory.add_fact(fact, writer)


def test_a_crash_mid_run_resumes_without_duplicates(memory: Memory,
                                                    clock: ManualClock) -> None:
    ids = add(memory, "chat", 100, T0) + add(memory, "voice", 30, T0)
    clock.set(T0 + 10 * HOUR)
    with pytest.raises(Crash):
        distil(ctx_for(memory, clock, writer=CrashingWriter(memory, after=3)))
    assert len(leaves(memory)) == 3
    result = distil(ctx_for(memory, clock))
    assert result.items == 4 and not result.more  # 5 + 2 windows in all
    cited = [t for e in leaves(memory) for t in cites(memory, e["id"])]
    assert sorted(cited) == sorted(ids) and len(cited) == len(set(cited))
    assert len(leaves(memory)) == 7


class Budget(JobContext):
    """A context whose time runs out after ``checks`` questions."""

    checks: int = 0

    def out_of_time(self) -> bool:
        self.checks -= 1
        return self.checks < 0


def test_it_stops_on_its_budget_and_resumes(memory: Memory, clock: ManualClock) -> None:
    ids = add(memory, "chat", 100, T0)
    clock.set(T0 + 10 * HOUR)
    total = 0
    runs = 0
    while True:
        ctx = Budget(store=memory.store, writer=memory, llm=make_llm(memory.settings.llm),
                     clock=clock, settings=memory.settings)
        ctx.checks = 3
        result = distil(ctx)
        total += result.items
        runs += 1
        if not result.more:
            break
        assert runs < 10
    assert runs > 1 and total == 5
    cited = sorted(t for e in leaves(memory) for t in cites(memory, e["id"]))
    assert cited == ids


def test_consolidate_runs_distil(memory: Memory, clock: ManualClock) -> None:
    add(memory, "chat", 10, T0)
    clock.set(T0 + 10 * HOUR)
    result: JobResult = consolidate.run(ctx_for(memory, clock))
    assert result.items >= 1 and "distil: 1 episodes" in result.detail


# -- the offline distiller -------------------------------------------------------------


def turns_of(lines: list[tuple[str, str]]) -> list[Turn]:
    return [Turn(i, "user", "user", s, t, T0 + i) for i, (s, t) in enumerate(lines)]


def test_extractive_gist_keeps_the_informative_sentences_under_their_speakers() -> None:
    gist = extractive_gist(turns_of(LINES), 420)
    assert len(gist) <= 420
    assert "Boston on 7 May 2023" in gist and "counseling" in gist
    assert gist.startswith("Caroline: ") and "; Melanie: " in gist
    assert gist == (
        "Caroline: I went to an LGBTQ support group in Boston on 7 May 2023 and it was so "
        "powerful. I decided to study counseling so I can help trans people.; Melanie: I "
        "painted a lake sunrise last year, my kids loved it.")  # no greetings, no "wow"
    assert gist == extractive_gist(turns_of(LINES), 420)  # deterministic
    short = extractive_gist(turns_of(LINES), 120)
    assert len(short) <= 120 and short.startswith("Caroline: ")
    # A first-person disclosure outranks a plain statement of about its weight.
    one = turns_of([("Ana", "The bakery sells bread."),
                    ("Ana", "I adopted a shelter puppy from the farm.")])
    assert extractive_gist(one, 50) == "Ana: I adopted a shelter puppy from the farm."


def test_offline_salience_rises_with_disclosures_names_dates_and_feeling() -> None:
    small_talk = turns_of([("A", "Hey! So happy to see you :)"), ("B", "Hi! How are you?"),
                           ("A", "Fine, thanks.")])
    big = turns_of([
        ("Ana", "I got married to Joao in Lisbon on 12 June 2021, I'm so happy!"),
        ("Rui", "Wow, congratulations Ana! Did Maria and Pedro come?"),
        ("Ana", "Yes, and we decided to move to Porto next year. Remember that."),
    ])
    assert offline_salience(small_talk) <= 2
    assert offline_salience(big) >= 8
    assert 1 <= offline_salience(turns_of([("A", "ok")])) <= 10
    disclosure = turns_of([("A", "I got married last spring and we bought a small house "
                                 "near the river.")])
    plain = turns_of([("A", "The weather turned grey over the hills near the river.")])
    assert offline_salience(disclosure) > offline_salience(plain)


# -- with a language model ---------------------------------------------------------------


def llm_settings(make_settings: Callable[..., Settings], server: FakeOpenAI,
                 offline: bool = True) -> Settings:
    return make_settings(household={"timezone": "UTC"}, llm={
        "offline_fallback": offline, "providers": [
            {"name": "fake", "base_url": server.base_url, "model": "m", "timeout_s": 5}]})


def good(gist: str = "Caroline told Melanie about the support group.", salience: int = 7,
         emotion: str = "Joy") -> str:
    return "```json\n" + json.dumps({"gist": gist, "salience": salience,
                                     "emotion": emotion}) + "\n```"


@pytest.fixture
def llm_memory(make_settings: Callable[..., Settings], clock: ManualClock, embedder: Any,
               fake_openai: FakeOpenAI) -> Iterator[Memory]:
    mem = Memory(llm_settings(make_settings, fake_openai), clock=clock, embedder=embedder)
    yield mem
    mem.close()


def completions(server: FakeOpenAI) -> list[Any]:
    return [r.body for r in server.requests if r.path.endswith("/chat/completions")]


def test_llm_gist_from_a_json_schema_prompt_at_most_12_turns_a_call(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    ids = add(llm_memory, "chat", 20, T0)
    fake_openai.replies += [good("First half."), good("Second half.", 3, "neutral")]
    clock.set(T0 + 10 * HOUR)
    assert distil(ctx_for(llm_memory, clock)).items == 2
    bodies = completions(fake_openai)
    assert len(bodies) == 2
    system, user = bodies[0]["messages"]
    assert '"salience"' in system["content"] and "JSON schema" in system["content"]
    evidence = [line for line in user["content"].splitlines() if line.startswith("[")]
    assert len(evidence) == 10 and evidence[0].startswith("[1] 2023-11-14 22:13 ")
    assert "Caroline: Hey Mel! Good to see you. (turn 0)" in evidence[0]
    first, second = leaves(llm_memory)
    assert (first["gist"], first["salience"], first["emotion"]) == ("First half.", 7, "joy")
    assert (second["gist"], second["salience"], second["emotion"]) == (
        "Second half.", 3, "neutral")
    assert cites(llm_memory, first["id"]) == ids[:10]
    assert cites(llm_memory, second["id"]) == ids[10:]


def test_invalid_output_is_retried_once(llm_memory: Memory, clock: ManualClock,
                                        fake_openai: FakeOpenAI) -> None:
    add(llm_memory, "chat", 5, T0)
    fake_openai.replies += ['{"gist": "x", "salience": 42, "emotion": "joy"}', good()]
    clock.set(T0 + 10 * HOUR)
    assert distil(ctx_for(llm_memory, clock)).items == 1
    bodies = completions(fake_openai)
    assert len(bodies) == 2
    retry = bodies[1]["messages"]
    assert retry[-2]["role"] == "assistant" and "invalid salience" in retry[-1]["content"]
    assert leaves(llm_memory)[0]["gist"] == "Caroline told Melanie about the support group."


def test_invalid_twice_is_queued_the_job_goes_on_and_the_next_run_retries_it_first(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    a = add(llm_memory, "chat", 5, T0)
    b = add(llm_memory, "chat", 5, T0 + 2 * HOUR)
    fake_openai.replies += ["not json at all", "still {not json", good("B window.")]
    clock.set(T0 + 10 * HOUR)
    result = distil(ctx_for(llm_memory, clock))
    assert result.items == 1 and "1 queued" in result.detail
    (episode,) = leaves(llm_memory)
    assert cites(llm_memory, episode["id"]) == b
    queue = PendingQueue.in_data_dir(llm_memory.data_dir)
    (pending,) = queue.entries()
    assert pending.entry.payload == {"channel": "chat", "turn_ids": a}
    raw = b"".join(p.read_bytes() for p in (llm_memory.data_dir / "llm_queue").iterdir())
    assert b"Hey Mel" not in raw  # references, never content
    # The watermark stays below the queued rows, so the janitor cannot prune them.
    assert llm_memory.transcript.watermark("chat") is None  # a[0] is the first row
    assert llm_memory.transcript.prunable("chat") == []
    # The next run (after a restart: a new chain) retries it first.
    fake_openai.replies += [good("A window, at last.")]
    result = distil(ctx_for(llm_memory, clock))
    assert result.items == 1 and "1 retried" in result.detail
    assert [e["gist"] for e in leaves(llm_memory)] == ["B window.", "A window, at last."]
    assert cites(llm_memory, leaves(llm_memory)[1]["id"]) == a
    assert len(queue) == 0
    assert llm_memory.transcript.watermark("chat") == b[-1]


def test_a_crash_after_queueing_does_not_queue_or_ask_twice(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.mind.distil

    add(llm_memory, "chat", 5, T0)
    clock.set(T0 + 10 * HOUR)  # the fake echoes: never valid JSON

    def crash(*args: Any) -> None:
        raise Crash("killed before the position was recorded")

    with monkeypatch.context() as patch:
        patch.setattr(runtime.mind.distil, "set_state", crash)
        with pytest.raises(Crash):
            distil(ctx_for(llm_memory, clock))
    assert len(completions(fake_openai)) == 2
    result = distil(ctx_for(llm_memory, clock))
    assert "0 queued" in result.detail
    assert len(completions(fake_openai)) == 4  # the queued retry only, not the window again
    (pending,) = PendingQueue.in_data_dir(llm_memory.data_dir).entries()
    assert pending.entry.attempts == 2


def test_a_segment_that_stays_invalid_is_distilled_offline_in_the_end(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    ids = add(llm_memory, "chat", 5, T0)
    clock.set(T0 + 10 * HOUR)  # the fake echoes: never valid JSON
    params = DistilParams(max_attempts=2)
    assert distil(ctx_for(llm_memory, clock), params).items == 0
    assert distil(ctx_for(llm_memory, clock), params).items == 1
    (episode,) = leaves(llm_memory)
    assert cites(llm_memory, episode["id"]) == ids and episode["gist"].startswith("Caroline:")
    assert len(completions(fake_openai)) == 4  # two runs, each a try and a retry


def test_outage_with_offline_fallback_distils_offline_asking_once(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    add(llm_memory, "chat", 5, T0)
    add(llm_memory, "chat", 5, T0 + 2 * HOUR)
    add(llm_memory, "voice", 5, T0)
    fake_openai.mode = Mode.HTTP_500
    clock.set(T0 + 10 * HOUR)
    result = distil(ctx_for(llm_memory, clock))
    assert result.items == 3 and "3 offline" in result.detail
    assert len(completions(fake_openai)) == 1  # then offline for the rest of the run
    assert len(PendingQueue.in_data_dir(llm_memory.data_dir)) == 0


def test_outage_without_offline_fallback_queues_and_holds_the_watermark(
        make_settings: Callable[..., Settings], clock: ManualClock, embedder: Any,
        fake_openai: FakeOpenAI) -> None:
    settings = llm_settings(make_settings, fake_openai, offline=False)
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        a = add(memory, "chat", 5, T0)
        b = add(memory, "chat", 5, T0 + 2 * HOUR)
        fake_openai.mode = Mode.HTTP_500
        clock.set(T0 + 10 * HOUR)
        result = distil(ctx_for(memory, clock))
        assert result.items == 0 and "2 queued" in result.detail
        assert len(completions(fake_openai)) == 1
        assert memory.transcript.watermark("chat") is None  # held below a[0]
        assert memory.transcript.prunable("chat") == []
        fake_openai.mode = Mode.OK
        fake_openai.replies += [good("one"), good("two")]
        assert distil(ctx_for(memory, clock)).items == 2
        assert [cites(memory, e["id"]) for e in leaves(memory)] == [a, b]  # oldest first
        assert [e["gist"] for e in leaves(memory)] == ["one", "two"]
        assert memory.transcript.watermark("chat") == b[-1]
        assert len(PendingQueue.in_data_dir(memory.data_dir)) == 0


def test_segments_dropped_by_the_queue_cap_are_distilled_offline(
        llm_memory: Memory, clock: ManualClock, fake_openai: FakeOpenAI) -> None:
    for k in range(3):
        add(llm_memory, "chat", 3, T0 + k * 2 * HOUR)
    clock.set(T0 + 20 * HOUR)  # echo: every segment invalid
    result = distil(ctx_for(llm_memory, clock), DistilParams(queue_cap=2))
    assert result.items == 1 and "3 queued" in result.detail
    assert len(PendingQueue.in_data_dir(llm_memory.data_dir)) == 2
    assert PendingQueue.in_data_dir(llm_memory.data_dir).counters["dropped_cap"] == 1


def test_parse_output() -> None:
    out = parse_output('Sure! {"gist": "  A  b ", "salience": "7", "emotion": "LOVE"} ok')
    assert out == DistilOut(gist="A b", salience=7, emotion="love")
    for bad, why in [("nothing", "no JSON object"), ("{oops}", "not valid JSON"),
                     ('{"gist": "", "salience": 3, "emotion": "joy"}', "invalid gist"),
                     ('{"gist": "g", "salience": 3, "emotion": "bored"}', "invalid emotion")]:
        with pytest.raises(ValueError, match=why):
            parse_output(bad)
    assert set(EMOTIONS) == set(DistilOut.model_json_schema()["properties"]["emotion"]["enum"])


def test_queue_dir_is_in_the_data_dir(memory: Memory) -> None:
    assert PendingQueue.in_data_dir(memory.data_dir).dir == Path(memory.data_dir) / "llm_queue"


def test_emotion_lexicon_negation_intensifiers_and_neutral() -> None:
    assert read_emotion("I am so happy today!") == EmotionReading("joy", 1.5, 1)
    assert read_emotion("I'm not happy about it").label == "neutral"
    assert read_emotion("I never felt scared there").label == "neutral"
    assert read_emotion("My dog died, I cried all night").label == "sadness"
    assert read_emotion("I was really worried and anxious about the exam").label == "fear"
    assert read_emotion("That is so unfair, I'm furious").label == "anger"
    assert read_emotion("We adore each other 😍").label == "love"
    assert read_emotion("The meeting is at 3pm in room 4").label == "neutral"
    assert read_emotion("That's nice, but I'm terrified").label == "fear"  # politeness: half
