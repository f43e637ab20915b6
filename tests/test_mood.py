"""The companion's mood (issue 12, clanka): read from the people's turns by the
consolidate job, kept with its history, decaying toward neutral with time
away, shown to the model in one line and pulling mood-congruent episodes up a
little in recall. Real SQLite files, the real ONNX embedder, the real Ray
runtime and a real local HTTP fake for the language model."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

from runtime.config import Settings
from runtime.llm.prompt import build_messages
from runtime.memories.episodes import EpisodeIn
from runtime.memories.mood import (
    HALF_LIFE_HOURS,
    MoodIn,
    MoodService,
    current,
    mood_line,
)
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.consolidate import update_mood
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY, ManualClock

T0 = 1_700_000_000.0
HOUR = 3600.0
SAD = ["I'm so sad today, I miss my dad.", "I cried all evening and I feel exhausted.",
       "Everything feels hopeless and lonely since the funeral."]
HAPPY = ["We won the match, I'm so happy!", "I'm thrilled and proud of the kids.",
         "What a wonderful, joyful day, we laughed a lot."]


def say(memory: Memory, lines: list[str], start: float, source: str = "user") -> list[int]:
    return memory.add_turns([TurnIn(channel="chat", source=source, content=text,
                                    created_at=start + i * 60.0)
                             for i, text in enumerate(lines)])


# -- the reading ----------------------------------------------------------------------


def test_the_consolidate_job_reads_the_mood_from_new_turns_and_keeps_its_history(
        memory: Memory, clock: ManualClock) -> None:
    say(memory, SAD, T0)
    clock.set(T0 + HOUR)
    assert update_mood(memory.job_context())[0] == 1
    sad = MoodService(memory.store).latest()
    assert sad is not None
    assert sad.valence < -0.3 and sad.energy < 0.5
    assert sad.why.startswith("3 new turns that sounded mostly sad (sadness")
    assert update_mood(memory.job_context()) == (0, "mood: no new turns")

    # a scheduled prompt's muted source is no feeling of the household
    say(memory, HAPPY, T0 + 2 * HOUR, source="scheduled")
    assert update_mood(memory.job_context())[0] == 0

    say(memory, HAPPY * 2, T0 + 3 * HOUR)
    clock.set(T0 + 4 * HOUR)
    update_mood(memory.job_context())
    happy = MoodService(memory.store).latest()
    assert happy is not None and happy.id != sad.id
    assert happy.valence > 0.2 and happy.energy > sad.energy and happy.warmth > sad.warmth
    history = memory.store.rows("SELECT valence, how FROM mood ORDER BY id")
    assert [r["valence"] for r in history] == [sad.valence, happy.valence]  # history kept
    logged = memory.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'mood' AND writer = 'consolidate'")
    assert logged == 2


def test_time_away_brings_the_mood_back_toward_neutral(memory: Memory,
                                                       clock: ManualClock) -> None:
    memory.add_mood(MoodIn(valence=-0.8, energy=0.1, warmth=0.9, why="a sad talk"))
    mood = MoodService(memory.store).latest()
    now = current(mood, clock.now())
    assert now is not None
    assert (now.valence, now.energy, now.warmth) == pytest.approx((-0.8, 0.1, 0.9))
    half = current(mood, clock.now() + HALF_LIFE_HOURS * HOUR)
    assert half is not None
    assert half.valence == pytest.approx(-0.4) and half.energy == pytest.approx(0.3)
    assert half.warmth == pytest.approx(0.7)
    gone = current(mood, clock.now() + 30 * DAY)
    assert gone is not None
    assert abs(gone.valence) < 0.01 and abs(gone.energy - 0.5) < 0.01
    assert gone.valence < 0  # toward neutral, never past it


def test_a_mood_needs_sane_numbers_and_a_reason() -> None:
    with pytest.raises(ValueError, match="valence"):
        MoodIn(valence=-1.5, energy=0.5, warmth=0.5, why="x")
    with pytest.raises(ValueError, match="why"):
        MoodIn(valence=0.0, energy=0.5, warmth=0.5, why="  \n ")


def test_the_prompt_carries_the_mood_in_one_line(memory: Memory, clock: ManualClock) -> None:
    memory.add_mood(MoodIn(valence=-0.6, energy=0.2, warmth=0.8,
                           why="3 new turns that sounded mostly sad\n(sadness 3)"))
    mood = current(MoodService(memory.store).latest(), clock.now())
    assert mood is not None
    line = mood_line(mood)
    assert line == ("Your mood: low, tired, warm toward the household (valence -0.60, "
                    "energy 0.20, warmth 0.80); why: 3 new turns that sounded mostly sad "
                    "(sadness 3)")
    system = build_messages([], [], [], "hi", datetime(2026, 3, 6, 14, 5),
                            context=[line])[0].content
    assert line in system.splitlines()


# -- recall ----------------------------------------------------------------------------

LAKE = [("Caroline spent a quiet afternoon at the lake thinking about her father.", "sadness"),
        ("Caroline spent an afternoon at the lake with her kids and the dog.", "joy"),
        ("Melanie walked around the lake on Sunday after the funeral.", "sadness"),
        ("Melanie walked around the lake on Sunday with her new puppy.", "joy")]


def scores(memory: Memory) -> dict[str, float]:
    return {i.ref: i.score for i in memory.recall("the lake").items}


def test_a_mood_congruent_memory_moves_up_a_little(memory: Memory, clock: ManualClock) -> None:
    ids = [memory.add_episode(EpisodeIn(channel="chat", source="user", gist=gist,
                                        emotion=emotion)) for gist, emotion in LAKE]
    happy_walk, sad_walk = f"episode:{ids[1]}", f"episode:{ids[2]}"
    neutral = scores(memory)  # no mood yet

    memory.add_mood(MoodIn(valence=-1.0, energy=0.2, warmth=0.5, why="a sad week"))
    sad = scores(memory)
    assert sad[sad_walk] > sad[happy_walk]
    gain = sad[sad_walk] - neutral[sad_walk]
    assert 0 < gain <= memory.settings.recall.weight_mood + 1e-6  # a little, bounded
    assert sad[happy_walk] == pytest.approx(neutral[happy_walk])  # no penalty either

    memory.add_mood(MoodIn(valence=1.0, energy=0.8, warmth=0.8, why="a happy week"))
    happy = scores(memory)
    assert happy[happy_walk] > happy[sad_walk]

    clock.advance(60 * DAY)  # long away: the mood has faded, and its pull with it
    faded = scores(memory)
    assert faded[happy_walk] - faded[sad_walk] < happy[happy_walk] - happy[sad_walk]


# -- durable, and in the prompt of the real runtime --------------------------------------

NS = "test-mood"


@pytest.fixture(scope="module")
def settings(server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
             model_cache: Path) -> Settings:
    from runtime.config import load_settings

    data = tmp_path_factory.mktemp("mood-data")
    return load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "http": {"enabled": False}, "jobs": {"idle_after_s": 3600},
        "llm": {"providers": [{"name": "local", "base_url": server.base_url,
                               "model": "tiny", "timeout_s": 10}]},
    })


def test_the_mood_survives_a_restart_and_reaches_the_prompt(
        ray_instance: str, settings: Settings, server: FakeOpenAI) -> None:
    import time

    from actors import supervisor
    from actors.handles import CronClient, TranscriptClient, TurnsClient
    from actors.messages import AppendTurns, RunJob, UserTurn

    sup = supervisor.start(settings)
    try:
        TranscriptClient(NS).append(AppendTurns(turns=[
            TurnIn(channel="chat", source="user", content=text,
                   created_at=time.time() - 3 * HOUR + i * 60) for i, text in enumerate(SAD)]))
        ran = CronClient(NS, timeout_s=300).run(RunJob(name="consolidate", wait=True),
                                                timeout=300)
        assert ran.outcome == "ok", ran
        assert "mood: updated from 3 turns" in (ran.detail or "")
    finally:
        sup.stop()

    store = Store(settings.store.path, FactKinds.load(settings.memory.fact_kinds_file))
    try:
        mood = MoodService(store).latest()
    finally:
        store.close()
    assert mood is not None and mood.valence < -0.3

    sup = supervisor.start(settings)  # a new runtime on the same data directory
    try:
        reply = TurnsClient(NS, timeout_s=120).process(UserTurn(channel="chat",
                                                                text="How are you today?"))
        assert reply.provider == "local"
        system = server.last.body["messages"][0]["content"]
        line = next((x for x in system.splitlines() if x.startswith("Your mood: ")), None)
        assert line is not None, system
        assert line.startswith("Your mood: low, ")
        assert "why: 3 new turns that sounded mostly sad" in line
    finally:
        sup.stop()
