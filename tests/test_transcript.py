import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.config import CONFIG_DIR
from runtime.memories.episodes import EpisodeIn, EpisodeService, MutedSource
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import MAX_TURN_CHARS, Location, TranscriptService, TurnIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "t.db", KINDS, clock=ManualClock(500.0))
    yield s
    s.close()


@pytest.mark.parametrize("bad", [
    {"content": ""}, {"content": "   \n"}, {"content": "x" * (MAX_TURN_CHARS + 1)},
    {"channel": ""}, {"role": "wizard"}, {"location": {"lat": 91, "lon": 0}},
    {"colour": "blue"}, {"created_at": float("nan")}, {"created_at": float("inf")},
])
def test_bad_turns_are_refused_with_the_field_named(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as err:
        TurnIn.model_validate({"channel": "c", "source": "user", "content": "hi", **bad})
    assert next(iter(bad)) in str(err.value)


def test_append_uses_clock_and_location(store: Store) -> None:
    t = TranscriptService(store, PROFILES)
    tid = t.append(TurnIn(channel="c", source="user", content="at the park",
                          location=Location(lat=41.1, lon=-8.6, place="park")))
    row = t.get(tid)
    assert row is not None
    assert (row["created_at"], row["lat"], row["lon"], row["place"]) == (500.0, 41.1, -8.6, "park")


def test_prune_respects_watermark_and_live_citations(store: Store) -> None:
    t, e = TranscriptService(store, PROFILES), EpisodeService(store, PROFILES)
    ids = [t.append(TurnIn(channel="c", source="user", content=f"turn {i}")) for i in range(6)]
    other = t.append(TurnIn(channel="elsewhere", source="user", content="other"))
    t.add_tool_call(ids[0], "weather", {"city": "Porto"}, "sunny")
    live = e.add(EpisodeIn(channel="c", source="user", gist="talked", cites=[ids[1]]))
    dead = e.add(EpisodeIn(channel="c", source="user", gist="old", cites=[ids[2]]))
    store.update("test", "episodes", dead, {"tombstoned_at": 1.0})
    assert t.prunable("c") == []  # no watermark: nothing goes
    t.compact("c", "they talked about turns 0-3", watermark=ids[3])
    assert t.prunable("c") == [ids[0], ids[2], ids[3]]
    assert t.prune("c") == 3
    remaining = {r[0] for r in store.conn.execute("SELECT id FROM transcript")}
    assert remaining == {ids[1], ids[4], ids[5], other}
    assert store.scalar("SELECT count(*) FROM tool_calls") == 0  # reaped with its turn
    assert store.scalar("SELECT count(*) FROM compactions") == 1  # summaries persist
    assert live


def test_watermark_never_moves_back(store: Store) -> None:
    t = TranscriptService(store, PROFILES)
    t.compact("c", "summary", watermark=10)
    with pytest.raises(ValueError, match="behind"):
        t.compact("c", "summary", watermark=5)


def test_muted_source_cannot_become_episodes(store: Store) -> None:
    e = EpisodeService(store, PROFILES)
    with pytest.raises(MutedSource):
        e.add(EpisodeIn(channel="c", source="delegate:search", gist="x"))


def test_roll_up_tombstones_children(store: Store) -> None:
    e = EpisodeService(store, PROFILES)
    kids = [e.add(EpisodeIn(channel="c", source="user", gist=f"leaf {i}")) for i in range(3)]
    parent = e.add(EpisodeIn(channel="c", source="user", gist="topic", level=1, children=kids))
    assert [r["id"] for r in e.apexes("c", 0)] == []
    assert [r["id"] for r in e.apexes("c", 1)] == [parent]
    clock = store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(31 * 86400)
    assert e.purge_tombstones() == 3


def test_request_id_makes_append_idempotent(store: Store) -> None:
    t = TranscriptService(store, PROFILES)
    first = t.append(TurnIn(channel="c", source="user", content="hi", request_id="r-1"))
    again = t.append(TurnIn(channel="c", source="user", content="hi", request_id="r-1"))
    other = t.append(TurnIn(channel="c", source="user", content="hi", request_id="r-2"))
    assert first == again != other
    assert store.scalar("SELECT count(*) FROM transcript") == 2


def test_append_decides_memory_from_the_source_profile(store: Store) -> None:
    t = TranscriptService(store, PROFILES)
    remembered = t.append(TurnIn(channel="c", source="user", content="mine"))
    muted = t.append(TurnIn(channel="c", source="delegate:search", content="results"))
    unknown = t.append(TurnIn(channel="c", source="never-configured", content="x"))
    assert [t.get(i)["memory"] for i in (remembered, muted, unknown)] == [1, 0, 0]  # type: ignore[index]


def test_episode_citations_go_through_the_write_log(store: Store) -> None:
    t, e = TranscriptService(store, PROFILES), EpisodeService(store, PROFILES)
    turns = [t.append(TurnIn(channel="c", source="user", content=f"turn {i}")) for i in range(2)]
    episode = e.add(EpisodeIn(channel="c", source="user", gist="talked", cites=turns),
                    writer="distiller")
    assert e.citations(episode) == turns
    logged = store.rows("SELECT writer, op, row_id, after FROM write_log"
                        " WHERE table_name = 'episode_citations' ORDER BY id")
    assert [(r["writer"], r["op"], r["row_id"]) for r in logged] == [
        ("distiller", "insert", episode)] * 2
    assert [json.loads(r["after"]) for r in logged] == [
        {"episode_id": episode, "transcript_id": turn} for turn in turns]
