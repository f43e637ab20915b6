"""Near-duplicate refusal (``memory.duplicate_similarity``): a new episode or
fact that says what a live one already says is refused, the refusal is logged
with the ref it duplicates (never the content) and the caller gets that id;
a different memory is stored. In one process (:class:`runtime.memory.Memory`)
and through the actors (the Episodes and Graph actors ask Recall)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors import supervisor
from actors.handles import EpisodesClient, GraphClient
from actors.messages import AddEpisode, AddFact
from runtime.config import Settings, load_settings
from runtime.llm.embedder import Embedder
from runtime.memories.duplicates import details
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.remember import note_fact
from runtime.time.clock import ManualClock

HIKE = "We went hiking in the Serra da Estrela last weekend and it snowed."
HIKE_AGAIN = "Last weekend we hiked in Serra da Estrela; there was snow."
HIKE_OTHER = "We had dinner with Rui and talked about his new job in Porto."
KEY = "The spare key is under the blue flower pot."
KEY_AGAIN = "The spare key is under the blue plant pot."
KEY_OTHER = "The spare key is under the red doormat."
TEA = ("likes a pot of mint tea in the evening, after the long walk along the river "
       "with the dog, before the news comes on")
BIRTHDAY = "Ana's birthday is on the 14th of May."
BIRTHDAY_CHANGED = "Ana's birthday is on the 15th of May."


def episode(gist: str, level: int = 0, children: list[int] | None = None) -> EpisodeIn:
    return EpisodeIn(channel="voice", source="user", gist=gist, level=level,
                     children=children or [])


def count(memory: Memory, table: str) -> int:
    return int(memory.store.scalar(f"SELECT count(*) FROM {table}"))


# -- in one process -----------------------------------------------------------------


def test_a_near_duplicate_episode_is_refused_and_logged_by_ref(
        memory: Memory, caplog: pytest.LogCaptureFixture) -> None:
    first = memory.add_episode(episode(HIKE))
    caplog.set_level(logging.INFO, logger="runtime.memories.duplicates")
    again = memory.add_episode(episode(HIKE_AGAIN))
    assert again == first and count(memory, "episodes") == 1
    refused = [r for r in caplog.records if "near-duplicate refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].__dict__["duplicate_of"] == f"episode:{first}"
    for record in caplog.records:  # the ref, never the content (message or extras)
        logged = str(vars(record)).lower()
        assert "serra" not in logged and "snow" not in logged


def test_a_duplicate_episode_asking_a_higher_level_raises_the_kept_one(memory: Memory) -> None:
    first = memory.add_episode(episode(HIKE))
    again = memory.add_episode(EpisodeIn(channel="voice", source="user", gist=HIKE_AGAIN,
                                         memory_level="vivid"))
    assert again == first and count(memory, "episodes") == 1
    assert memory.episodes.get(first)["memory_level"] == "vivid"  # type: ignore[index]


def test_a_refused_episode_s_turns_are_cited_by_the_one_it_repeats(memory: Memory) -> None:
    """Its turns stay evidence (the janitor prunes uncited turns), and a sensitive
    one among them marks the kept episode sensitive."""
    turns = memory.add_turns([TurnIn(channel="voice", source="user", role="user",
                                     content=f"hike story {i}") for i in range(4)])
    memory.store.conn.execute("UPDATE transcript SET sensitive = 1 WHERE id = ?", (turns[3],))
    first = memory.add_episode(EpisodeIn(channel="voice", source="user", gist=HIKE,
                                         cites=turns[:2]))
    again = memory.add_episode(EpisodeIn(channel="voice", source="user", gist=HIKE_AGAIN,
                                         cites=turns[1:]))
    assert again == first and count(memory, "episodes") == 1
    cited = [r["transcript_id"] for r in memory.store.rows(
        "SELECT transcript_id FROM episode_citations WHERE episode_id = ?"
        " ORDER BY transcript_id", (first,))]
    assert cited == turns
    assert memory.store.scalar("SELECT sensitive FROM episodes WHERE id = ?", (first,)) == 1


def test_a_different_episode_is_stored(memory: Memory) -> None:
    first = memory.add_episode(episode(HIKE))
    other = memory.add_episode(episode(HIKE_OTHER))
    assert other != first and count(memory, "episodes") == 2


def test_a_roll_up_parent_is_never_refused(memory: Memory) -> None:
    leaf = memory.add_episode(episode(HIKE))
    parent = memory.add_episode(episode(HIKE, level=1, children=[leaf]))
    assert parent != leaf and count(memory, "episodes") == 2


def test_a_near_duplicate_of_a_hidden_episode_is_stored(memory: Memory) -> None:
    first = memory.add_episode(episode(HIKE))
    memory.episodes.set_disabled(first, True)
    assert memory.add_episode(episode(HIKE_AGAIN)) != first


def test_a_near_duplicate_fact_is_refused_with_the_id_it_duplicates(memory: Memory) -> None:
    first, made = memory.add_fact(note_fact(KEY))
    assert made.action == "insert"
    again, refused = memory.add_fact(note_fact(KEY_AGAIN))
    assert (again, refused.action, refused.existing_id) == (first, "duplicate", first)
    assert count(memory, "facts") == 1
    other, stored = memory.add_fact(note_fact(KEY_OTHER))
    assert other != first and stored.action == "insert"


def test_a_duplicate_asking_a_higher_level_raises_the_one_it_duplicates(memory: Memory) -> None:
    first, _ = memory.add_fact(note_fact(KEY))
    again, refused = memory.add_fact(note_fact(KEY_AGAIN, level="seared"))
    assert again == first and refused.action == "duplicate"
    assert memory.graph.get(first)["memory_level"] == "seared"  # type: ignore[index]
    memory.add_fact(note_fact(KEY_AGAIN, level="vivid"))  # never lowered by it
    assert memory.graph.get(first)["memory_level"] == "seared"  # type: ignore[index]


def test_facts_about_another_subject_are_not_duplicates(memory: Memory) -> None:
    # grandma's and grandpa's habit embed at 0.93: only the subject tells them apart
    first, _ = memory.add_fact(FactIn(kind="user_specific", subject="grandma", key="note_tea",
                                      value=TEA))
    other, made = memory.add_fact(FactIn(kind="user_specific", subject="grandpa",
                                         key="note_tea", value=TEA))
    assert other != first and made.action == "insert"


def test_a_different_number_is_not_a_duplicate(memory: Memory) -> None:
    assert details(BIRTHDAY) != details(BIRTHDAY_CHANGED)
    first, _ = memory.add_fact(note_fact(BIRTHDAY))
    other, made = memory.add_fact(note_fact(BIRTHDAY_CHANGED))
    assert other != first and made.action == "insert"


def test_the_same_subject_and_key_is_resolved_not_refused(memory: Memory) -> None:
    first, _ = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="lives_in",
                                      value="Porto, near the river"))
    again, same = memory.add_fact(FactIn(kind="user_specific", subject="Ana", key="lives_in",
                                         value="porto, near the river"))
    assert (again, same.action) == (first, "reinforce")


def test_the_threshold_is_the_configured_one(make_settings: Callable[..., Settings],
                                             clock: ManualClock, embedder: Embedder) -> None:
    settings = make_settings(memory={"duplicate_similarity": 1.01})  # above 1: never refused
    with Memory(settings, clock=clock, embedder=embedder) as mem:
        first = mem.add_episode(episode(HIKE))
        assert mem.add_episode(episode(HIKE_AGAIN)) != first
        assert mem.add_fact(note_fact(KEY_AGAIN))[1].action == "insert"
        assert mem.add_fact(note_fact(KEY))[1].action == "insert"


# -- through the actors -------------------------------------------------------------

NS = "test-duplicates"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("duplicates-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "http": {"enabled": False},
    })
    sup = supervisor.start(settings)
    yield settings
    sup.stop()


def test_actors_refuse_a_near_duplicate_episode_and_store_a_different_one(
        runtime: Settings) -> None:
    episodes = EpisodesClient(NS)
    first = episodes.add(AddEpisode(episode=episode(HIKE), writer="consolidate"))
    assert not first.duplicate
    # written a moment ago, maybe not indexed yet: Recall indexes it before comparing
    again = episodes.add(AddEpisode(episode=episode(HIKE_AGAIN), writer="consolidate"))
    assert again.duplicate and again.episode_id == first.episode_id
    other = episodes.add(AddEpisode(episode=episode(HIKE_OTHER), writer="consolidate"))
    assert not other.duplicate and other.episode_id != first.episode_id


def test_actors_refuse_a_near_duplicate_fact_and_store_a_different_one(
        runtime: Settings) -> None:
    graph = GraphClient(NS)
    first = graph.add(AddFact(fact=note_fact(KEY), writer="cli"))
    assert first.action == "insert"
    again = graph.add(AddFact(fact=note_fact(KEY_AGAIN), writer="facts"))
    assert (again.action, again.fact_id) == ("duplicate", first.fact_id)
    other = graph.add(AddFact(fact=note_fact(KEY_OTHER), writer="facts"))
    assert other.action == "insert" and other.fact_id != first.fact_id
