"""Recall settings chosen by the store's shape (issue 25, ``recall.long_store``;
runtime.recall.policy). Real store, real MiniLM, real hnswlib; in process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from runtime.config import RecallSettings, Settings
from runtime.llm.embedder import Embedder
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.recall import passages, policy
from runtime.recall.excerpt import CHARS_PER_TOKEN
from runtime.time.clock import DAY, ManualClock

# small counts, so that a test writes a dozen turns, not a hundred (embedding
# long turns is what these tests cost)
MIN_TURNS = 4
REFRESH_TURNS = 3


@pytest.fixture(autouse=True)
def small_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "MIN_TURNS", MIN_TURNS)
    monkeypatch.setattr(policy, "REFRESH_TURNS", REFRESH_TURNS)

TOPICS = ["the boiler", "the garden hose", "the shed key", "the car battery", "the attic light",
          "the fridge seal", "the router", "the smoke alarm", "the gutter", "the piano tuner"]


def short(i: int) -> str:
    return f"Note {i}: we should look at {TOPICS[i % len(TOPICS)]} this week."


def long(i: int) -> str:
    """Longer than MiniLM reads (256 word pieces, about 1,024 characters)."""
    body = (f"Here is a long answer about {TOPICS[i % len(TOPICS)]}, step by step, with the"
            " reasons for each step and what to check before and after it. ")
    return f"Reply {i}: " + body * 10


def write(mem: Memory, clock: ManualClock, texts: list[str]) -> None:
    start = clock.now() - DAY
    mem.add_turns([TurnIn(channel="chat", source="assistant", role="assistant", content=t,
                          created_at=start + i * 30) for i, t in enumerate(texts)])


def switching(make_settings: Callable[..., Settings], clock: ManualClock,
              embedder: Embedder, **recall: object) -> Memory:
    """A memory whose long-turn settings are plain to see: one item at most."""
    values = {"long_store_share": 0.3, "long_store": {"max_items": 1}, "relative_floor": 0.0,
              **recall}
    return Memory(make_settings(recall=values), clock=clock, embedder=embedder)


def test_a_store_of_long_turns_is_recalled_with_its_own_settings(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    mem = switching(make_settings, clock, embedder)
    try:
        write(mem, clock, [short(i) for i in range(MIN_TURNS + 1)])
        assert len(mem.recall("what should we look at this week").items) > 1
        assert mem.recaller.policy.shape(500, 256).long_share == 0.0

        write(mem, clock, [long(i) for i in range(REFRESH_TURNS)])  # 3 of the 8 now
        found = mem.recall("what should we look at this week")
        assert len(found.items) == 1  # long_store's max_items
        shape = mem.recaller.policy.shape(500, 256)
        assert shape.turns == MIN_TURNS + 1 + REFRESH_TURNS and shape.long == REFRESH_TURNS
        assert mem.recaller.settings.max_items == 20  # the configured ones stay as they are
    finally:
        mem.close()


def test_the_share_is_counted_over_the_window_and_against_the_threshold(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    """Long turns further back than the window do not count; a share under the
    threshold does not switch; a threshold of 0 never does."""
    mem = switching(make_settings, clock, embedder, long_store_window=MIN_TURNS)
    try:
        write(mem, clock, [long(i) for i in range(MIN_TURNS)])
        assert mem.recaller.policy.is_long(mem.recaller.settings)
        write(mem, clock, [short(i) for i in range(MIN_TURNS)])  # the long ones drop out
        assert not mem.recaller.policy.is_long(mem.recaller.settings)
        assert len(mem.recall("what should we look at this week").items) > 1

        write(mem, clock, [short(0), long(1), short(2), short(3)])
        shape = mem.recaller.policy.shape(MIN_TURNS, 256)
        assert shape.long_share == 0.25  # 1 of the last 4 (under 0.3)
        assert not mem.recaller.policy.is_long(mem.recaller.settings)
        assert mem.recaller.policy.is_long(mem.recaller.settings.model_copy(
            update={"long_store_share": 0.25}))
        assert not mem.recaller.policy.is_long(mem.recaller.settings.model_copy(
            update={"long_store_share": 0.0}))
    finally:
        mem.close()


def test_the_share_is_counted_again_after_enough_new_turns_and_never_on_too_few(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    mem = switching(make_settings, clock, embedder)
    try:
        pol = mem.recaller.policy
        write(mem, clock, [long(i) for i in range(MIN_TURNS - 1)])
        assert pol.shape(500, 256).long == MIN_TURNS - 1
        assert not pol.is_long(mem.recaller.settings)  # too few turns to tell
        write(mem, clock, [long(MIN_TURNS)])
        # one turn more: not counted again yet (a recall reads the newest id only)
        assert pol.shape(500, 256).turns == MIN_TURNS - 1
        write(mem, clock, [long(i) for i in range(REFRESH_TURNS - 1)])
        assert pol.shape(500, 256).turns == MIN_TURNS + REFRESH_TURNS - 1
        assert pol.is_long(mem.recaller.settings)
        # another length counted at once (another key)
        assert pol.shape(500, 100_000).long == 0
    finally:
        mem.close()


def test_long_store_takes_recall_keys_checked_as_recall_checks_them() -> None:
    ok = RecallSettings(long_store_share=0.1,
                        long_store={"excerpt_tokens": 100, "diversity": 0.3, "temporal": False})
    assert ok.long_store == {"excerpt_tokens": 100, "diversity": 0.3, "temporal": False}
    for bad in ({"no_such_key": 1}, {"passage_tokens": 100}, {"long_store_share": 0.5},
                {"diversity": 7.0}, {"max_items": 0}):
        with pytest.raises(ValidationError):
            RecallSettings(long_store=bad)
    # passages only in a store of long turns: every long turn is cut (at writing)
    assert passages.configured(RecallSettings(long_store_share=0.1,
                                              long_store={"passages": True})) is not None
    assert passages.configured(RecallSettings(long_store_share=0.0,
                                              long_store={"passages": True})) is None
    assert passages.configured(RecallSettings()) is None


def test_a_long_store_injects_excerpts_when_its_settings_say_so(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    mem = switching(make_settings, clock, embedder,
                    long_store={"excerpt_tokens": 40})
    try:
        write(mem, clock, [long(i) for i in range(MIN_TURNS + 1)])
        found = mem.recall("the shed key step by step")
        assert found.items
        assert all(len(i.text) <= 40 * CHARS_PER_TOKEN + 60 for i in found.items)
    finally:
        mem.close()


def test_lexical_weight_sets_the_keyword_share_of_relevance(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    """``recall.lexical_weight`` (a constant 0.5 before; long_store sets 0.75):
    a keyword hit's relevance is its cosine plus that weight times its
    normalised bm25 (the best hit's is 1)."""
    mem = Memory(make_settings(recall={"context_turns": 0, "keyword_feedback": 0.0,
                                       "relative_floor": 0.0}),
                 clock=clock, embedder=embedder)
    try:
        write(mem, clock, [short(i) for i in range(6)])
        relevance = {}
        for weight in (0.0, 0.5, 1.0):
            mem.recaller.settings = mem.recaller.settings.model_copy(
                update={"lexical_weight": weight})
            found = mem.recall("the fridge seal")
            relevance[weight] = {i.ref: i.relevance for i in found.items}
        best = max(relevance[1.0], key=lambda ref: relevance[1.0][ref])
        assert relevance[1.0][best] - relevance[0.0][best] == pytest.approx(1.0, abs=1e-4)
        assert relevance[0.5][best] - relevance[0.0][best] == pytest.approx(0.5, abs=1e-4)
    finally:
        mem.close()
