"""A query that knows the conversation (issue 25, ``recall.context_query``).

Real store, real MiniLM, real hnswlib, through ``Memory.recall`` and the
Recaller: a follow-up that names nothing finds what the turns before it were
about; the message still leads; turns older than the window, or none at all,
leave recall as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.transcript import Role, TurnIn
from runtime.memory import Memory
from runtime.time.clock import DAY, ManualClock

EARLIER: list[tuple[Role, str]] = [
    ("user", "The sourdough starter for our bread lives in the fridge, fed rye flour on Sundays."),
    ("user", "The tomato seedlings need repotting once they have four true leaves."),
    ("user", "The car's winter tyres are stored at the garage on Rua Augusta."),
    ("user", "Grandma's birthday dinner is at the Italian place on the corner."),
    ("user", "The bathroom tap drips unless you turn it past the stop."),
    ("user", "Our wifi password is written on the back of the router."),
]
# the conversation now: about baking bread, never naming the starter
NOW_TALK: list[tuple[Role, str]] = [
    ("user", "I want to bake a loaf of bread this weekend, a proper crusty one."),
    ("assistant", "A crusty loaf needs a hot oven and a long, slow rise of the dough."),
]
FOLLOW_UP = "What else should I get ready for it?"


@pytest.fixture
def memory(make_settings: Callable[..., Settings], clock: ManualClock,
           embedder: Embedder) -> Iterator[Memory]:
    mem = Memory(make_settings(recall={"context_query": 0.5}), clock=clock,
                 embedder=embedder)
    yield mem
    mem.close()


def seed(memory: Memory, clock: ManualClock) -> tuple[int, list[str]]:
    """The earlier turns a week back, then the conversation now; the starter
    turn's id and the conversation's refs (oldest first)."""
    start = clock.now() - 7 * DAY
    ids = memory.add_turns([TurnIn(channel="kitchen", source="user", role=role, content=text,
                                   created_at=start + i * 600)
                            for i, (role, text) in enumerate(EARLIER)])
    now_ids = memory.add_turns([
        TurnIn(channel="kitchen", source="user" if role == "user" else "assistant", role=role,
               content=text, created_at=clock.now() - 60 + i * 20)
        for i, (role, text) in enumerate(NOW_TALK)])
    return ids[0], [f"turn:{i}" for i in now_ids]


def first_ref(memory: Memory, query: str, **kw: object) -> str | None:
    refs = memory.recall(query, **kw).refs  # type: ignore[arg-type]
    return refs[0] if refs else None


def test_follow_up_finds_what_the_conversation_is_about(memory: Memory,
                                                        clock: ManualClock) -> None:
    starter, convo = seed(memory, clock)
    # the message alone names nothing: the starter is not what it finds first
    assert first_ref(memory, FOLLOW_UP, context=()) != f"turn:{starter}"
    # with the conversation (the prompt's history, excluded from the answer)
    assert first_ref(memory, FOLLOW_UP, exclude=convo) == f"turn:{starter}"
    # the same when the conversation is given apart from what is excluded
    assert first_ref(memory, FOLLOW_UP, context=convo) in (f"turn:{starter}", *convo)


def test_the_message_leads(memory: Memory, clock: ManualClock) -> None:
    seed(memory, clock)
    found = memory.recall("Where are the winter tyres for the car kept?").refs
    with_bread = memory.recall("Where are the winter tyres for the car kept?",
                               exclude=seed_refs(memory)).refs
    assert found and with_bread and found[0] == with_bread[0]


def seed_refs(memory: Memory) -> list[str]:
    return [f"turn:{r['id']}" for r in memory.transcript.recent("kitchen", 2)]


def test_an_old_conversation_does_not_steer(make_settings: Callable[..., Settings],
                                            clock: ManualClock, embedder: Embedder) -> None:
    mem = Memory(make_settings(recall={"context_query": 0.5, "context_window_s": 30.0}),
                 clock=clock, embedder=embedder)
    try:
        _, convo = seed(mem, clock)  # the conversation ended 40 s ago and more
        alone = mem.recall(FOLLOW_UP).refs
        assert mem.recall(FOLLOW_UP, exclude=convo).refs == [
            r for r in alone if r not in convo]
    finally:
        mem.close()


def test_context_off_is_the_message_alone(make_settings: Callable[..., Settings],
                                          clock: ManualClock, embedder: Embedder) -> None:
    mem = Memory(make_settings(recall={"context_query": 0.0}), clock=clock,
                 embedder=embedder)
    try:
        _, convo = seed(mem, clock)
        alone = mem.recall(FOLLOW_UP).refs
        assert mem.recall(FOLLOW_UP, exclude=convo).refs == [
            r for r in alone if r not in convo]
    finally:
        mem.close()
