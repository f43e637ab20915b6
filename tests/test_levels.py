"""Memory levels (clanka): the system only raises a level, escalation stops at
vivid, seared never fades or changes (the decay job, a job's writes), and
recall returns at most a couple of seared memories at once.

Seared memories and consolidation (a roll-up never takes one) are covered in
tests/test_rollup.py (``test_user_managed_and_hidden_episodes_are_never_rolled_up``);
seared memories and rollback in tests/test_rollback.py
(``test_seared_memories_are_never_touched``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.levels import LevelLowered, raise_level
from runtime.memories.refs import Ref
from runtime.memory import Memory
from runtime.mind import janitor
from runtime.time.clock import DAY, ManualClock

# -- raising ------------------------------------------------------------------------


def test_escalation_goes_one_step_at_a_time_and_stops_at_vivid() -> None:
    level = "faint"
    seen = []
    for _ in range(5):
        level = raise_level(level)
        seen.append(level)
    assert seen == ["normal", "vivid", "vivid", "vivid", "vivid"]
    assert raise_level("faint", steps=10) == "vivid"
    assert raise_level("normal", steps=0) == "normal"


def test_raising_never_lowers_a_level_above_the_cap() -> None:
    assert raise_level("seared") == "seared"
    assert raise_level("vivid", cap="normal") == "vivid"
    assert raise_level("normal", cap="seared", steps=2) == "seared"


def test_bad_levels_and_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="memory level must be one of"):
        raise_level("bright")
    with pytest.raises(ValueError, match="memory level must be one of"):
        raise_level("normal", cap="loud")
    with pytest.raises(ValueError, match="steps must be 0 or more"):
        raise_level("normal", steps=-1)


# -- who may change a level ---------------------------------------------------------


def _episode(memory: Memory, gist: str, level: str = "normal") -> int:
    return memory.add_episode(EpisodeIn(channel="voice", source="user", gist=gist,
                                        memory_level=level))  # type: ignore[arg-type]


def _fact(memory: Memory, key: str, value: str, level: str = "normal") -> int:
    fact_id, _ = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key=key,
                                        value=value, memory_level=level))  # type: ignore[arg-type]
    return fact_id


@pytest.mark.parametrize("job", ["consolidate", "threads", "facts", "turns"])
def test_a_job_cannot_lower_a_level(memory: Memory, job: str) -> None:
    seared_ep = _episode(memory, "The day Maria was born, in the spring rain.", "seared")
    vivid_ep = _episode(memory, "Moving the piano up three flights of stairs.", "vivid")
    seared_fact = _fact(memory, "wedding_day", "June 3", "seared")
    for service, item, lower in ((memory.episodes, seared_ep, "vivid"),
                                 (memory.episodes, vivid_ep, "normal"),
                                 (memory.episodes, vivid_ep, "faint"),
                                 (memory.graph, seared_fact, "normal")):
        before = service.get(item)
        with pytest.raises(LevelLowered, match="only the user lowers"):
            service.set_level(item, lower, job)  # type: ignore[arg-type]
        assert service.get(item) == before
    assert memory.episodes.get(seared_ep)["memory_level"] == "seared"  # type: ignore[index]
    assert memory.graph.get(seared_fact)["memory_level"] == "seared"  # type: ignore[index]


def test_a_jobs_correction_keeps_the_level_of_the_fact_it_replaces(memory: Memory) -> None:
    old = _fact(memory, "lives_in", "Porto", "vivid")
    new, decision = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="lives_in",
                                           value="Lisbon", confidence=0.9), "facts")
    assert decision.action == "supersede" and new != old
    assert memory.graph.get(new)["memory_level"] == "vivid"  # type: ignore[index]
    # the user's own correction sets what it says
    mine, _ = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="lives_in",
                                     value="Braga", user_managed=True), "cli")
    assert memory.graph.get(mine)["memory_level"] == "normal"  # type: ignore[index]


def test_a_job_may_raise_a_level(memory: Memory) -> None:
    ep = _episode(memory, "A long talk about the garden wall.")
    fact = _fact(memory, "favourite_tea", "mint")
    memory.episodes.set_level(ep, "vivid", "threads")
    memory.graph.set_level(fact, "vivid", "facts")
    assert memory.episodes.get(ep)["memory_level"] == "vivid"  # type: ignore[index]
    assert memory.graph.get(fact)["memory_level"] == "vivid"  # type: ignore[index]


@pytest.mark.parametrize("writer", ["user", "cli", "http"])
def test_the_users_unpin_still_lowers_seared_to_vivid(memory: Memory, writer: str) -> None:
    ep = _episode(memory, "Grandpa's last birthday by the sea.", "seared")
    fact = _fact(memory, "first_pet", "Rex", "seared")
    memory.change(Ref("episode", ep), "unpin", writer)
    memory.change(Ref("fact", fact), "unpin", writer)
    assert memory.episodes.get(ep)["memory_level"] == "vivid"  # type: ignore[index]
    assert memory.graph.get(fact)["memory_level"] == "vivid"  # type: ignore[index]


def test_a_job_cannot_unpin(memory: Memory) -> None:
    ep = _episode(memory, "The night the power went out for the whole street.", "seared")
    with pytest.raises(LevelLowered):
        memory.change(Ref("episode", ep), "unpin", "patterns")
    assert memory.episodes.get(ep)["memory_level"] == "seared"  # type: ignore[index]


def test_an_unknown_level_is_refused(memory: Memory) -> None:
    ep = _episode(memory, "Painting the kitchen yellow.")
    with pytest.raises(ValueError, match="memory level must be one of"):
        memory.episodes.set_level(ep, "loud", "user")  # type: ignore[arg-type]


# -- seared never fades or changes ----------------------------------------------------


def test_seared_survives_the_decay_job_for_years(memory: Memory, clock: ManualClock,
                                                 make_settings: Callable[..., Settings]) -> None:
    seared_ep = _episode(memory, "Our wedding in the olive grove, under the lanterns.", "seared")
    seared_fact = _fact(memory, "wedding_place", "the olive grove", "seared")
    rows = (memory.episodes.get(seared_ep), memory.graph.get(seared_fact))
    for _ in range(3):  # ten years of the decay job, in three runs
        clock.advance(1200 * DAY)
        janitor.run(memory.job_context(settings=make_settings()))
    assert (memory.episodes.get(seared_ep), memory.graph.get(seared_fact)) == rows
    refs = [i.ref for i in memory.recall("the wedding in the olive grove").items]
    assert f"episode:{seared_ep}" in refs and f"fact:{seared_fact}" in refs


def test_only_an_explicit_delete_removes_a_seared_memory(memory: Memory) -> None:
    ep = _episode(memory, "The first snow the children ever saw.", "seared")
    fact = _fact(memory, "first_snow", "the winter of 2019", "seared")
    kept, decision = memory.add_fact(FactIn(kind="user_specific", subject="Ana",
                                            key="first_snow", value="the winter of 2020",
                                            confidence=0.99), "facts")
    assert (kept, decision.action) == (fact, "keep")  # a job's contradiction loses
    memory.change(Ref("episode", ep), "delete", "cli")
    memory.change(Ref("fact", fact), "delete", "cli")
    assert memory.episodes.get(ep) is None and memory.graph.get(fact) is None


# -- recall: at most a couple of seared memories --------------------------------------


SEARED = ["The spare key to the blue door is under the olive pot.",
          "The blue door's spare key hangs in the shed by the rake.",
          "Grandma hid a spare key for the blue door in the letterbox.",
          "A spare key to the blue door is with the neighbour Tomas."]


def _seared_keys(memory: Memory) -> list[int]:
    ids = []
    for i, text in enumerate(SEARED):
        fact_id, _ = memory.add_fact(FactIn(kind="user_specific", subject="house",
                                            key=f"spare_key_{i}", value=text,
                                            memory_level="seared"))
        ids.append(fact_id)
    return ids


def _seared_in(memory: Memory, **kw: Any) -> list[str]:
    found = memory.recall("where is the spare key to the blue door?", **kw)
    rows = [memory.services.get(Ref(i.kind, i.item_id)) for i in found.items]  # type: ignore[arg-type]
    return [i.ref for i, r in zip(found.items, rows) if r and r.get("memory_level") == "seared"]


def test_recall_returns_at_most_two_seared_memories(memory: Memory) -> None:
    ids = _seared_keys(memory)
    plain, _ = memory.add_fact(FactIn(kind="user_specific", subject="house", key="front_door_key",
                                      value="The front door key is on the hook."))
    seared = _seared_in(memory)
    assert len(seared) == 2 and set(seared) <= {f"fact:{i}" for i in ids}
    refs = [i.ref for i in memory.recall("where is the spare key to the blue door?").items]
    assert f"fact:{plain}" in refs  # the others still come


def test_max_seared_is_configurable(make_settings: Callable[..., Settings], clock: ManualClock,
                                    embedder: Embedder) -> None:
    with Memory(make_settings(recall={"max_seared": 3}), clock=clock, embedder=embedder) as mem:
        _seared_keys(mem)
        assert len(_seared_in(mem)) == 3
