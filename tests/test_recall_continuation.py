"""The earlier conversation the present one continues (issue 25,
``recall.continuation_slots``).

Real store, real MiniLM, real hnswlib, through ``Memory.recall``: a follow-up
that names nothing gets, right after the best item, a turn of the earlier
conversation the present one is most like; never a turn of the present
conversation itself, never a disabled or forgotten one; the budget holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.refs import parse_ref
from runtime.memories.transcript import Role, TurnIn
from runtime.memory import Memory
from runtime.recall.continuation import present_conversation
from runtime.time.clock import DAY, ManualClock

# earlier conversations, one a day, each its own (days apart)
EARLIER: list[list[tuple[Role, str]]] = [
    [("user", "Let's put the vegetable garden plan on hold until the frost is over."),
     ("assistant", "Agreed: the raised beds, the seed order and the compost wait until March.")],
    [("user", "The car's winter tyres are stored at the garage on Rua Augusta."),
     ("assistant", "Noted: the winter tyres are at the garage on Rua Augusta.")],
    [("user", "Grandma's birthday dinner is at the Italian place on the corner."),
     ("assistant", "I'll remember the birthday dinner at the Italian place.")],
    [("user", "The bathroom tap drips unless you turn it past the stop."),
     ("assistant", "Turn the bathroom tap past the stop, then.")],
    [("user", "Our wifi password is written on the back of the router."),
     ("assistant", "The wifi password is on the back of the router.")],
]
# the conversation now: the garden again, never naming the pause
NOW_TALK: list[tuple[Role, str]] = [
    ("user", "The frost is finally gone, the soil in the raised beds is soft again."),
    ("assistant", "Good news for the garden: the beds can be dug over this week."),
    ("user", "I bought tomato and bean seeds for the vegetable patch yesterday."),
    ("assistant", "Tomatoes and beans like the sunny side of the beds."),
]
HOUR = 3600.0
FOLLOW_UP = "Okay. So what comes next?"
# a message that does match other memories
ASKED = "Is the wifi password still written on the router?"


@pytest.fixture
def memory(make_settings: Callable[..., Settings], clock: ManualClock,
           embedder: Embedder) -> Iterator[Memory]:
    mem = Memory(make_settings(recall={"continuation_slots": 1}), clock=clock,
                 embedder=embedder)
    yield mem
    mem.close()


def seed_earlier(memory: Memory, clock: ManualClock) -> list[list[int]]:
    """Each earlier conversation's ids, a day apart, ten days back and after."""
    earlier = []
    for day, talk in enumerate(EARLIER):
        start = clock.now() - (10 - day) * DAY
        earlier.append(memory.add_turns([
            TurnIn(channel="kitchen", source=role, role=role, content=text,
                   created_at=start + i * 60) for i, (role, text) in enumerate(talk)]))
    return earlier


def seed(memory: Memory, clock: ManualClock) -> tuple[list[list[int]], list[int]]:
    """Each earlier conversation's ids (days back), then the present one's."""
    earlier = seed_earlier(memory, clock)
    now_ids = memory.add_turns([
        TurnIn(channel="kitchen", source=role, role=role, content=text,
               created_at=clock.now() - 600 + i * 60) for i, (role, text) in enumerate(NOW_TALK)])
    return earlier, now_ids


def refs(ids: list[int]) -> list[str]:
    return [f"turn:{i}" for i in ids]


def recall_with(memory: Memory, slots: int, query: str = FOLLOW_UP, **kw: object) -> list[str]:
    memory.recaller.settings = memory.recaller.settings.model_copy(
        update={"continuation_slots": slots})
    return memory.recall(query, **kw).refs  # type: ignore[arg-type]


def test_a_follow_up_that_names_nothing_gets_the_conversation_it_continues(
        memory: Memory, clock: ManualClock) -> None:
    earlier, now_ids = seed(memory, clock)
    history = refs(now_ids[-2:])  # the prompt's history: the last two turns
    assert recall_with(memory, 0, exclude=history) == []  # nothing matches the message
    found = recall_with(memory, 1, exclude=history)
    assert len(found) == 1 and found[0] in set(refs(earlier[0]))


def test_it_comes_right_after_the_best_item(memory: Memory, clock: ManualClock) -> None:
    earlier, now_ids = seed(memory, clock)
    history = refs(now_ids[-2:])
    without = recall_with(memory, 0, ASKED, exclude=history)
    found = recall_with(memory, 1, ASKED, exclude=history)
    garden = set(refs(earlier[0]))
    assert without and not garden.intersection(without)
    assert found[0] == without[0] and found[1] in garden
    assert found[2:] == without[1:len(found) - 1]  # the rest as it was, the last gives way
    # a budget of two items: the best and the continuation
    assert recall_with(memory, 1, ASKED, exclude=history, max_items=2) == found[:2]


def test_never_the_present_conversation(memory: Memory, clock: ManualClock) -> None:
    earlier, now_ids = seed(memory, clock)
    # only the last turn in the prompt: the present conversation's older turns
    # are the nearest to its own vector, and they are not what the slot gives
    history = refs(now_ids[-1:])
    added = [r for r in recall_with(memory, 1, exclude=history)
             if r not in recall_with(memory, 0, exclude=history)]
    assert len(added) == 1 and added[0] in set(refs(earlier[0]))


def test_a_disabled_or_forgotten_turn_is_never_given(memory: Memory,
                                                     clock: ManualClock) -> None:
    earlier, now_ids = seed(memory, clock)
    history = refs(now_ids[-2:])
    first, second = earlier[0]
    memory.change(parse_ref(f"turn:{first}"), "disable")
    memory.change(parse_ref(f"turn:{second}"), "delete")
    found = recall_with(memory, 1, exclude=history)
    assert f"turn:{first}" not in found and f"turn:{second}" not in found


def test_the_present_conversation_ends_at_a_gap(memory: Memory, clock: ManualClock) -> None:
    now = clock.now()
    old, new = memory.add_turns([
        TurnIn(channel="kitchen", source="user", role="user", content=text, created_at=at)
        for text, at in (("first", now - HOUR), ("later", now - 60))])
    other = memory.add_turn(TurnIn(channel="car", source="user", role="user", content="elsewhere",
                                   created_at=now - 30))
    store = memory.store
    # an hour back is further than the 30-minute gap; another channel is not it
    assert present_conversation(store, [f"turn:{new}"], now, 1800.0) == [new]
    assert present_conversation(store, [f"turn:{new}"], now, 2 * HOUR) == [new, old]
    assert present_conversation(store, [f"turn:{other}"], now, 1800.0) == [other]
    # a conversation that ended longer ago than the gap is not the present one
    assert present_conversation(store, [f"turn:{new}"], now + HOUR, 1800.0) == []
    assert present_conversation(store, [], now, 1800.0) == []


def test_turn_zero_recall_gives_the_model_the_conversation_it_continues(
        memory: Memory, clock: ManualClock) -> None:
    """Through the turn's core (``Memory.turn``, as the Turns actor runs it):
    the prompt's history is what recall excludes, so a follow-up on a chat
    channel gets the earlier conversation its own continues."""
    earlier = seed_earlier(memory, clock)
    for role, text in NOW_TALK:
        if role == "user":
            memory.turn(text)
    garden = set(refs(earlier[0]))
    follow_up = "What should I do after that?"
    # the message alone (what a caller that excludes nothing asks) gets the
    # nearest turn to itself, not the garden's pause
    assert not garden & set(memory.recall(follow_up).refs)

    def cited(slots: int) -> set[str]:
        memory.recaller.settings = memory.recaller.settings.model_copy(
            update={"continuation_slots": slots})
        return set(memory.turn(follow_up, temporary=True).citations)

    assert not garden & cited(0)
    assert garden & cited(1)


def test_a_failing_continuation_costs_only_itself(memory: Memory, clock: ManualClock,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, now_ids = seed(memory, clock)
    history = refs(now_ids[-2:])
    without = recall_with(memory, 0, ASKED, exclude=history)

    def broken(*_: object) -> list[int]:
        raise RuntimeError("the index is gone")

    monkeypatch.setattr("runtime.recall.hybrid.continuation_hits", broken)
    memory.recaller.settings = memory.recaller.settings.model_copy(
        update={"continuation_slots": 1})
    result = memory.recall(ASKED, exclude=history)
    assert not result.degraded and result.refs == without
