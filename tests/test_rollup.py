"""Roll-up: clusters of apex episodes become level-1 (and level-2) parents.

Real SQLite through :class:`runtime.memory.Memory` (the real embedder embeds
the gists), then each episode's vector is replaced by a synthetic one with a
known cluster structure (three tight groups and scattered noise), so the
expected clusters are known exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.config import Settings
from runtime.llm.providers import (
    Completion,
    FallbackChain,
    LLMError,
    LLMErrorKind,
    LLMRequest,
    OfflineProvider,
)
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import clustering, rollup
from runtime.mind.contract import JobContext
from runtime.time.clock import ManualClock

GROUP = 15
GROUPS = 3
NOISE = 10


def _ctx(memory: Memory, settings: Settings, clock: ManualClock, writer: Any = None,
         llm: FallbackChain | None = None) -> JobContext:
    return JobContext(store=memory.store, writer=writer or memory,
                      llm=llm or FallbackChain([OfflineProvider()]), clock=clock,
                      settings=settings)


def _seed(memory: Memory, groups: int = GROUPS, per_group: int = GROUP, noise: int = NOISE,
          level: int = 0, channel: str = "voice", seed: int = 3,
          memory_levels: dict[int, str] | None = None) -> dict[int, int]:
    """Episodes with two cited turns each and synthetic vectors; return id -> true group
    (-1: noise). ``memory_levels`` maps a position to a non-normal memory level."""
    n = groups * per_group
    vectors, truth = clustering.synthetic(n, groups, noise=noise, seed=seed)
    ids: dict[int, int] = {}
    for i, group in enumerate(truth.tolist()):
        turns = memory.add_turns([
            TurnIn(channel=channel, source="user", content=f"turn {i} a about topic {group}"),
            TurnIn(channel=channel, source="user", content=f"turn {i} b about topic {group}"),
        ])
        level_of = (memory_levels or {}).get(i, "normal")
        episode_id = memory.add_episode(EpisodeIn(
            channel=channel, source="user", level=level,
            gist=f"Topic {group} memory number {i}. More detail {i}.",
            salience=1 + i % 9, emotion="calm" if i % 2 else "joy", cites=turns,
            memory_level=level_of,  # type: ignore[arg-type]
            started_at=1000.0 + i, ended_at=2000.0 + i))
        ids[episode_id] = int(group)
    items = list(ids)
    memory.indexer.put("episode", items, vectors[: len(items)])
    return ids


def _episode(memory: Memory, episode_id: int) -> dict[str, Any]:
    row = memory.store.get("episodes", episode_id)
    assert row is not None
    return row


def _parents(memory: Memory, level: int = 1) -> list[dict[str, Any]]:
    return memory.store.rows("SELECT * FROM episodes WHERE level = ? ORDER BY id", (level,))


def _children(memory: Memory, parent_id: int) -> set[int]:
    return {r[0] for r in memory.store.conn.execute(
        "SELECT id FROM episodes WHERE parent_id = ?", (parent_id,))}


def test_leaf_round_makes_a_parent_per_cluster_and_leaves_noise_alone(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    truth = _seed(memory)
    clock.advance(60)
    result = rollup.roll_up(_ctx(memory, make_settings(), clock))

    parents = _parents(memory)
    assert result.items == GROUPS == len(parents)
    groups = {g: {i for i, t in truth.items() if t == g} for g in range(GROUPS)}
    assert sorted(map(sorted, (_children(memory, p["id"]) for p in parents))) == \
        sorted(map(sorted, groups.values()))
    for parent in parents:
        kids = _children(memory, parent["id"])
        assert parent["parent_id"] is None and parent["tombstoned_at"] is None
        assert parent["channel"] == "voice" and parent["source"] == "user"
        cited = set(memory.episodes.citations(parent["id"]))
        assert cited == {t for k in kids for t in memory.episodes.citations(k)}
        assert len(cited) == 2 * len(kids)
        assert parent["salience"] == max(_episode(memory, k)["salience"] for k in kids)
        assert parent["started_at"] == min(_episode(memory, k)["started_at"] for k in kids)
        assert parent["ended_at"] == max(_episode(memory, k)["ended_at"] for k in kids)
        # the extractive summary quotes the children's gists
        topic = {truth[k] for k in kids}.pop()
        assert f"Topic {topic} memory number" in parent["gist"]
        for kid in kids:
            row = _episode(memory, kid)
            assert row["tombstoned_at"] == clock.now()
    for noise_id in (i for i, t in truth.items() if t == -1):
        row = _episode(memory, noise_id)
        assert row["parent_id"] is None and row["tombstoned_at"] is None
    # the parents are indexed for recall (and for the era round); the children are not
    vec_ids = {r[0] for r in memory.store.conn.execute(
        "SELECT item_id FROM vectors WHERE kind = 'episode'")}
    assert {p["id"] for p in parents} <= vec_ids
    assert not vec_ids & {i for i, t in truth.items() if t >= 0}


def test_below_the_trigger_nothing_happens(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    truth = _seed(memory, noise=4)  # 45 clustered + 4 = 49 apex leaves: one short of 50
    assert len(truth) == 49
    settings = make_settings()
    result = rollup.roll_up(_ctx(memory, settings, clock))
    assert result.items == 0
    assert not _parents(memory)
    assert memory.store.scalar(
        "SELECT count(*) FROM episodes WHERE tombstoned_at IS NOT NULL") == 0
    # the fiftieth leaf starts the round
    memory.add_episode(EpisodeIn(channel="voice", source="user", gist="The fiftieth."))
    assert rollup.roll_up(_ctx(memory, settings, clock)).items == GROUPS


class _CrashAfter:
    """A writer that dies after ``n`` episodes, as a job process killed mid-round.
    It writes through the episode service alone (the children keep their vectors),
    so only the tombstones tell a re-run what was already rolled up."""

    def __init__(self, memory: Memory, n: int) -> None:
        self.memory, self.left = memory, n

    def add_episode(self, episode: EpisodeIn, writer: str) -> int:
        if self.left == 0:
            raise RuntimeError("job actor died")
        self.left -= 1
        return self.memory.episodes.add(episode, writer)

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        raise NotImplementedError

    def compact(self, channel: str, summary: str, watermark: int, writer: str) -> int:
        raise NotImplementedError


def test_a_crash_mid_round_resumes_without_duplicates(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    truth = _seed(memory)
    settings = make_settings()
    with pytest.raises(RuntimeError, match="died"):
        rollup.roll_up(_ctx(memory, settings, clock, writer=_CrashAfter(memory, 1)))
    assert len(_parents(memory)) == 1

    result = rollup.roll_up(_ctx(memory, settings, clock, writer=_CrashAfter(memory, 99)))
    assert result.items == GROUPS - 1
    parents = _parents(memory)
    assert len(parents) == GROUPS
    seen: list[int] = []
    for parent in parents:
        kids = _children(memory, parent["id"])
        assert len({truth[k] for k in kids}) == 1  # one true group per parent
        seen.extend(kids)
    assert len(seen) == len(set(seen)) == GROUPS * GROUP  # nobody rolled up twice
    # a third run finds nothing new to do
    assert rollup.roll_up(_ctx(memory, settings, clock)).items == 0
    assert len(_parents(memory)) == GROUPS


def test_out_of_time_stops_after_a_parent_and_the_next_run_goes_on(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    truth = _seed(memory)
    settings = make_settings()
    runs = []
    while True:
        ctx = _ctx(memory, settings, clock)
        ctx.budget_s = 0.0  # out of time as soon as the first parent is written
        result = rollup.roll_up(ctx)
        runs.append((result.items, result.more))
        if not result.more:
            break
        assert len(runs) < 10
    assert runs[:GROUPS] == [(1, True)] * GROUPS
    parents = _parents(memory)
    assert len(parents) == GROUPS
    kids = [k for p in parents for k in _children(memory, p["id"])]
    assert sorted(kids) == sorted(i for i, t in truth.items() if t >= 0)


def test_user_managed_and_hidden_episodes_are_never_rolled_up(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    # positions 0, 3, 6 are in group 0: seared, vivid, faint
    levels = {0: "seared", 3: "vivid", 6: "faint"}
    truth = _seed(memory, noise=NOISE + 8, memory_levels=levels)
    hidden = [i for i, t in truth.items() if t == 1][:2]
    for episode_id in hidden:
        memory.episodes.set_disabled(episode_id, True)
    protected = [list(truth)[p] for p in levels]
    rollup.roll_up(_ctx(memory, make_settings(), clock))

    assert len(_parents(memory)) == GROUPS
    for episode_id in [*protected, *hidden]:
        row = _episode(memory, episode_id)
        assert row["parent_id"] is None and row["tombstoned_at"] is None


def test_no_round_again_until_a_new_apex_arrives(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(memory, groups=0, per_group=0, noise=rollup.LEAF_TRIGGER)  # all noise
    calls: list[int] = []
    real = clustering.cluster

    def counting(vectors: np.ndarray, **kwargs: Any) -> np.ndarray:
        calls.append(len(vectors))
        return real(vectors, **kwargs)

    monkeypatch.setattr(clustering, "cluster", counting)
    settings = make_settings()
    assert rollup.roll_up(_ctx(memory, settings, clock)).items == 0
    assert rollup.roll_up(_ctx(memory, settings, clock)).items == 0
    assert calls == [rollup.LEAF_TRIGGER]
    memory.add_episode(EpisodeIn(channel="voice", source="user", gist="Something new."))
    rollup.roll_up(_ctx(memory, settings, clock))
    assert calls == [rollup.LEAF_TRIGGER, rollup.LEAF_TRIGGER + 1]


def test_era_round_rolls_level_one_apexes_into_level_two(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    truth = _seed(memory, groups=2, per_group=13, noise=0, level=1)  # 26 >= 25
    assert len(truth) >= rollup.ERA_TRIGGER
    result = rollup.roll_up(_ctx(memory, make_settings(), clock))
    eras = _parents(memory, level=2)
    assert result.items == len(eras) == 2
    for era in eras:
        kids = _children(memory, era["id"])
        assert len(kids) == 13 and len({truth[k] for k in kids}) == 1


class _Recorder:
    name = "fake"
    model = "fake-model"

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    def complete(self, request: LLMRequest) -> Completion:
        self.requests.append(request)
        return Completion(text=f"Summary {len(self.requests)}.", provider=self.name,
                          model=self.model)


def test_llm_summaries_carry_at_most_twelve_evidence_items(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    fake = _Recorder()
    ctx = _ctx(memory, make_settings(), clock, llm=FallbackChain([fake, OfflineProvider()]))
    gists = [f"Memory {i} about the garden." for i in range(30)]
    text, how = rollup.summarise(ctx, gists)
    evidence = [r.messages[-1].content.splitlines() for r in fake.requests]
    assert how == "llm" and text == "Summary 4."
    assert [len(e) for e in evidence] == [12, 12, 6, 3]  # three groups, then their summaries
    assert all(len(e) <= rollup.MAX_EVIDENCE for e in evidence)


class _Down:
    name = "down"
    model = "down-model"

    def complete(self, request: LLMRequest) -> Completion:
        raise LLMError(self.name, LLMErrorKind.CONNECTION_REFUSED, "nothing listening")


def test_a_failing_model_falls_back_to_the_extractive_summary(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    gists = ["Ana booked the dentist. Friday.", "Tom fixed the boiler."]
    for chain in (FallbackChain([_Down(), OfflineProvider()]), FallbackChain([_Down()])):
        ctx = _ctx(memory, make_settings(), clock, llm=chain)
        assert rollup.summarise(ctx, gists) == (
            "Ana booked the dentist. Tom fixed the boiler.", "extractive")


def test_offline_summary_is_extractive_and_deterministic(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    ctx = _ctx(memory, make_settings(), clock)
    gists = ["Ana booked the dentist. She will go on Friday.", "Ana booked the dentist.",
             "Tom fixed the boiler! It was loud.", "The cat slept."]
    first = rollup.summarise(ctx, gists)
    assert first == rollup.summarise(ctx, gists)
    assert first == ("Ana booked the dentist. Tom fixed the boiler! The cat slept.",
                     "extractive")


def test_too_few_points_are_not_clustered() -> None:
    """Below the floor (two minimum clusters) every point is noise; UMAP is not run
    (it cannot embed fewer points than its neighbourhood and dimensions need)."""
    for n in (0, 1, 2, 5, 12, clustering.MIN_POINTS - 1):
        vectors, _ = clustering.synthetic(n, 2, spread=0.01)
        assert clustering.cluster(vectors).tolist() == [-1] * n, n


_WARM = ("from pathlib import Path; import sys; from runtime.mind import clustering; "
         "clustering.warm_up(Path(sys.argv[1]))")
_UMAP_HOT = ("_optimize_layout_euclidean_single_epoch", "smooth_knn_dist",
             "compute_membership_strengths")


def test_numba_cache_is_written_once_and_hit_by_the_next_process(tmp_path: Path) -> None:
    """UMAP's own numba functions are cached in the given directory: the first
    process compiles and saves them, a second one loads them and compiles nothing.

    The directory is the test run's own numba cache (tests/conftest.py) when
    there is one: an earlier UMAP call of the run (the leaf round above, a job)
    may have written it already through the same ``configure_cache``, and then
    the first process here loads from it instead of compiling UMAP a second time
    (8-30 s of CPU). Either way, every hot function comes from that directory:
    saved to it by the first process or loaded from it, and the second process
    loads them all and saves nothing."""
    env = {**os.environ, "NUMBA_DEBUG_CACHE": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    root = Path(__file__).resolve().parents[1]
    shared = os.environ.get("NUMBA_CACHE_DIR")
    cache = Path(shared) if shared else tmp_path / "numba-cache"

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", _WARM, str(cache)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=280, check=True)
        return done.stdout + done.stderr

    first = [line for line in run().splitlines() if line.startswith("[cache]")]
    second = [line for line in run().splitlines() if line.startswith("[cache]")]
    for name in _UMAP_HOT:
        assert any(("data saved" in line or "data loaded" in line) and f".{name}-" in line
                   for line in first), name
        assert any("data loaded" in line and f".{name}-" in line for line in second), name
    if not shared:  # a fresh directory: the first process wrote every one
        for name in _UMAP_HOT:
            assert any("data saved" in line and f".{name}-" in line for line in first), name
    assert not [line for line in second if "data saved" in line]
    assert all(str(cache) in line for line in first + second
               if "saved" in line or "loaded" in line)
