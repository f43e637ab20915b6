"""Filling recall's budget (issue 25): long turns as excerpts
(``recall.excerpt_tokens``, runtime.recall.excerpt) and a diversity term
(``recall.diversity``). Real store, real MiniLM, real hnswlib."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.recall.excerpt import CHARS_PER_TOKEN, ELLIPSIS, excerpt
from runtime.time.clock import DAY, ManualClock

FILLER = ("We talked about many other things that afternoon, none of them important. ")
KEY = "The spare key to the shed hangs on the hook behind the pantry door."


def long_reply(n: int = 30) -> str:
    return FILLER * (n // 2) + KEY + " " + FILLER * (n - n // 2)


def test_a_short_text_is_its_own_excerpt() -> None:
    assert excerpt("Short and sweet.", "sweet", 50) == "Short and sweet."


def test_the_excerpt_holds_the_query_words() -> None:
    text = long_reply()
    got = excerpt(text, "where is the spare key to the shed", 40)
    assert KEY in got
    assert got.startswith(ELLIPSIS) and got.endswith(ELLIPSIS)
    assert len(got) <= 40 * CHARS_PER_TOKEN + 2 * (len(ELLIPSIS) + 1)


@hsettings(max_examples=60, deadline=None, database=None)
@given(text=st.text(min_size=1, max_size=3000), query=st.text(max_size=200),
       tokens=st.integers(min_value=1, max_value=300))
def test_an_excerpt_is_bounded_and_from_the_text(text: str, query: str, tokens: int) -> None:
    got = excerpt(text, query, tokens)
    if len(text) <= tokens * CHARS_PER_TOKEN:
        assert got == text
        return
    assert len(got) <= tokens * CHARS_PER_TOKEN + 2 * (len(ELLIPSIS) + 1)
    assert got.strip(ELLIPSIS + " ").strip() in text


def memory_with(make_settings: Callable[..., Settings], clock: ManualClock,
                embedder: Embedder, **recall: object) -> Memory:
    return Memory(make_settings(recall=recall), clock=clock, embedder=embedder)


def test_a_long_turn_is_injected_as_its_excerpt(make_settings: Callable[..., Settings],
                                                clock: ManualClock,
                                                embedder: Embedder) -> None:
    mem = memory_with(make_settings, clock, embedder, excerpt_tokens=40)
    try:
        text = long_reply()
        turn_id = mem.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                      content=text, created_at=clock.now() - DAY))
        found = mem.recall("where is the spare key to the shed")
        item = next(i for i in found.items if i.ref == f"turn:{turn_id}")
        assert KEY in item.text and len(item.text) < len(text) / 4
        assert item.turns == (turn_id,)
    finally:
        mem.close()


def test_excerpts_let_the_budget_hold_more(make_settings: Callable[..., Settings],
                                           clock: ManualClock, embedder: Embedder) -> None:
    counts = []
    for tokens in (0, 60):
        mem = memory_with(make_settings, clock, embedder, excerpt_tokens=tokens,
                          relative_floor=0.0)
        try:
            if tokens == 0:
                mem.add_turns([TurnIn(channel="chat", source="assistant", role="assistant",
                                      content=long_reply(20 + i),
                                      created_at=clock.now() - DAY + i)
                               for i in range(6)])
            counts.append(len(mem.recall("the spare key to the shed", max_tokens=600).items))
        finally:
            mem.close()
    assert counts[1] > counts[0] >= 1


def conversations(mem: Memory, clock: ManualClock) -> tuple[list[int], int]:
    """Three turns about the boiler in one conversation a week back, one
    about it in another conversation two days later."""
    start = clock.now() - 7 * DAY
    first = mem.add_turns([TurnIn(channel="chat", source="user", content=text,
                                  created_at=start + i * 60) for i, text in enumerate([
        "The boiler pressure dropped below one bar again this morning.",
        "The boiler pressure gauge reads below one bar, it keeps dropping.",
        "I topped up the boiler pressure to one and a half bar.",
    ])])
    other = mem.add_turn(TurnIn(channel="chat", source="user",
                                content="The plumber said the boiler's expansion vessel "
                                        "needs recharging.",
                                created_at=start + 2 * DAY))
    return first, other


def test_diversity_makes_room_for_another_conversation(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    picked = []
    first: list[int] = []
    other = 0
    # one store, read with each setting; diversity_after 2: the best two as they rank
    for diversity, after in ((0.0, 0), (0.5, 0), (0.5, 2)):
        mem = memory_with(make_settings, clock, embedder, diversity=diversity,
                          diversity_after=after, relative_floor=0.0)
        try:
            if not first:
                first, other = conversations(mem, clock)
            picked.append(mem.recall("boiler pressure below one bar", max_items=2).refs)
        finally:
            mem.close()
    plain, diverse, later = picked
    assert set(plain) <= {f"turn:{i}" for i in first}
    assert f"turn:{other}" in diverse and diverse[0] == plain[0]
    assert later == plain
