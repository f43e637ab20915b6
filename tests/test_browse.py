"""Browsing, pinning and editing memories on a real store (runtime.recall.browse,
runtime.memories.refs.change/edit and the services' set_level/edit)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import CONFIG_DIR
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import NoSuchItem, Ref, Services, change, edit
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.recall import browse
from runtime.recall.browse import Browse
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY, ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
T0 = 1_750_000_000.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def services(tmp_path: Path, clock: ManualClock) -> Iterator[Services]:
    store = Store(tmp_path / "b.db", KINDS, clock=clock)
    yield Services(TranscriptService(store, PROFILES), EpisodeService(store, PROFILES),
                   GraphService(store, KINDS, PROFILES))
    store.close()


def store_of(services: Services) -> Store:
    return services.transcript.store


def turn(services: Services, content: str, speaker: str | None = "Ana",
         role: str = "user") -> Ref:
    source = "user" if role == "user" else "assistant"
    return Ref("turn", services.transcript.append(TurnIn(
        channel="kitchen", source=source, role=role, speaker=speaker,  # type: ignore[arg-type]
        content=content)))


def episode(services: Services, gist: str) -> Ref:
    return Ref("episode", services.episodes.add(EpisodeIn(channel="kitchen", source="user",
                                                          gist=gist)))


def fact(services: Services, subject: str, key: str, value: str, **kw: object) -> Ref:
    fact_id, _ = services.graph.add(FactIn(kind=str(kw.pop("kind", "place")), subject=subject,
                                           key=key, value=value, **kw))  # type: ignore[arg-type]
    return Ref("fact", fact_id)


def page(services: Services, **kw: object) -> tuple[list[str], int]:
    views, total = browse.browse(store_of(services), Browse(**kw))  # type: ignore[arg-type]
    return [v.ref for v in views], total


@pytest.fixture
def timeline(services: Services, clock: ManualClock) -> list[Ref]:
    """Nine memories of the three kinds, interleaved, the k-th written k hours
    after T0, except the last two: both at T0 + 7 h (a tie in time)."""
    made = []
    for i in range(3):
        made.append(turn(services, f"turn number {i} about the garden"))
        clock.advance(3600)
        made.append(episode(services, f"episode number {i} about the garden"))
        if i < 2:
            clock.advance(3600)
        made.append(fact(services, f"Person{i}", "lives_in", f"Town{i}"))
        clock.advance(3600)
    return made


# -- browsing ------------------------------------------------------------------


def test_pages_merge_the_kinds_by_time_without_gaps_or_overlaps(
        services: Services, timeline: list[Ref]) -> None:
    newest = [str(r) for r in reversed(timeline)]
    refs, total = page(services)
    assert total == 9 and refs == newest
    for size in (1, 2, 4):
        pages = [page(services, limit=size, offset=start)
                 for start in range(0, 9, size)]
        assert [r for refs, _ in pages for r in refs] == newest
        assert {t for _, t in pages} == {9}  # the total counts every page's matches
    oldest = [r for start in range(0, 9, 4)
              for r in page(services, oldest_first=True, limit=4, offset=start)[0]]
    assert oldest == [str(r) for r in timeline]
    assert page(services, offset=9) == ([], 9)


def test_kinds_filter(services: Services, timeline: list[Ref]) -> None:
    refs, total = page(services, kinds=["episode"])
    assert total == 3 and refs == [str(r) for r in reversed(timeline) if r.kind == "episode"]
    refs, total = page(services, kinds=["fact", "turn"], limit=2, offset=1)
    both = [str(r) for r in reversed(timeline) if r.kind != "episode"]
    assert total == 6 and refs == both[1:3]
    with pytest.raises(ValueError, match="unknown memory kind"):
        page(services, kinds=["dream"])


def test_since_is_inclusive_and_until_exclusive(services: Services,
                                                timeline: list[Ref]) -> None:
    # timeline[3] was written at T0 + 3 h (turn 1), timeline[6] at T0 + 6 h (turn 2)
    refs, total = page(services, since=T0 + 3 * 3600, until=T0 + 6 * 3600,
                       oldest_first=True)
    assert refs == [str(r) for r in timeline[3:6]] and total == 3
    assert page(services, since=T0 + 3 * 3600 + 0.001, until=T0 + 6 * 3600,
                oldest_first=True)[0] == [str(r) for r in timeline[4:6]]
    assert page(services, since=T0 + 3 * 3600, until=T0 + 6 * 3600 + 0.001,
                oldest_first=True)[0] == [str(r) for r in timeline[3:7]]
    assert page(services, until=T0) == ([], 0)
    assert page(services, since=T0 + 7 * 3600)[1] == 2  # the last two share an instant


def test_every_word_must_match(services: Services) -> None:
    cake = turn(services, "we baked a lemon cake for the party")
    pie = turn(services, "the lemon pie was too sour")
    gist = episode(services, "Ana and Rui planned the party and the cake")
    rui = fact(services, "Rui", "favourite_cake", "lemon drizzle")
    assert page(services, text="lemon")[0] == [str(rui), str(pie), str(cake)]
    assert page(services, text="LEMON cake")[0] == [str(rui), str(cake)]
    assert page(services, text="party cake")[0] == [str(gist), str(cake)]
    assert page(services, text="lemon", kinds=["turn"], limit=1) == ([str(pie)], 2)
    assert page(services, text="   ") == page(services)  # blank: no filter


@pytest.mark.parametrize("hostile", [
    '"NEAR( AND *', "cak*", "content:lemon", "lemon OR nothing", "^lemon", ")(",
    "'; DROP TABLE transcript; --", "NOT lemon", "*", '"',
])
def test_user_text_is_never_fts_syntax(services: Services, hostile: str) -> None:
    cake = turn(services, "we baked a lemon cake")
    near = turn(services, "the shop near the station")
    refs, total = page(services, text=hostile)  # never raises
    expected = {'"NEAR( AND *': [str(near)], "content:lemon": [], "lemon OR nothing": [],
                "^lemon": [str(cake)], "NOT lemon": [str(cake)], "cak*": []}
    assert refs == expected.get(hostile, []) and total == len(refs)
    assert store_of(services).scalar("SELECT count(*) FROM transcript") == 2


def test_disabled_listed_flagged_or_left_out(services: Services) -> None:
    shown = turn(services, "the bins go out on Tuesday")
    hidden = episode(services, "a private matter")
    change(services.episodes, hidden, "disable", "test")
    views, total = browse.browse(store_of(services), Browse())
    assert total == 2 and {v.ref: v.disabled for v in views} == {str(hidden): True,
                                                                   str(shown): False}
    assert page(services, include_disabled=False) == ([str(shown)], 1)


def test_how_each_kind_reads(services: Services) -> None:
    said = turn(services, "the gate code is 4711")
    answered = turn(services, "noted", speaker=None, role="assistant")
    gist = episode(services, "Ana set the gate code")
    lives = fact(services, "Ana", "lives_in", "Porto", valid_from=T0 - DAY)
    note = fact(services, "user", "note-1a2b3c4d5e", "The spare key is under the mat.",
                kind="user_specific", confidence=1.0, user_managed=True)
    store = store_of(services)
    views = {v.ref: v for v in browse.browse(store, Browse())[0]}
    assert views[str(said)].text == "Ana: the gate code is 4711"
    assert views[str(said)].speaker == "Ana" and views[str(said)].level is None
    assert views[str(said)].details == {"role": "user", "speaker": "Ana", "channel": "kitchen",
                                        "source": "user", "memory": True}
    assert views[str(answered)].text == "assistant: noted"
    assert views[str(gist)].text == "Ana set the gate code"
    assert views[str(gist)].level == "normal" and not views[str(gist)].pinned
    assert views[str(gist)].details["level"] == 0
    assert views[str(gist)].details["weight"] == 1.0
    assert views[str(lives)].text == "Ana lives in: Porto"
    assert views[str(lives)].created_at == T0  # when it was learned, not valid_from
    assert views[str(lives)].details["valid_from"] == T0 - DAY
    assert views[str(note)].text == "The spare key is under the mat."
    assert views[str(note)].details["user_managed"] is True
    assert browse.get(store, lives) == views[str(lives)]
    assert browse.get(store, Ref("fact", 999)) is None


def test_rolled_up_episodes_are_not_listed_but_can_be_looked_at(services: Services) -> None:
    child = episode(services, "breakfast on Monday")
    parent_id = services.episodes.add(EpisodeIn(channel="kitchen", source="user", level=1,
                                                gist="breakfasts", children=[child.id]))
    assert page(services) == ([f"episode:{parent_id}"], 1)
    view = browse.get(store_of(services), child)
    assert view is not None and view.details["rolled_up_into"] == parent_id


# -- pin and unpin --------------------------------------------------------------


def levels(services: Services, *refs: Ref) -> list[str]:
    return [str(services.get(r)["memory_level"]) for r in refs]  # type: ignore[index]


def test_pin_and_unpin_episodes_and_facts(services: Services, clock: ManualClock) -> None:
    gist = episode(services, "the day we moved in")
    lives = fact(services, "Ana", "lives_in", "Porto")
    plain = episode(services, "an ordinary day")
    for ref in (gist, lives):
        change(services.owner(ref.kind), ref, "pin", "test")
    assert levels(services, gist, lives, plain) == ["seared", "seared", "normal"]
    clock.advance(3650 * DAY)  # ten years: a pinned episode has not faded at all
    views = {v.ref: v for v in browse.browse(store_of(services), Browse())[0]}
    assert views[str(gist)].pinned and views[str(gist)].details["weight"] == 1.0
    assert views[str(plain)].details["weight"] < 0.01
    assert views[str(lives)].pinned and views[str(lives)].level == "seared"
    log = store_of(services).rows(
        "SELECT writer, before, after FROM write_log WHERE op = 'update'"
        " AND table_name = 'episodes' AND row_id = ?", (gist.id,))
    assert [(r["writer"], json.loads(r["before"])["memory_level"],
             json.loads(r["after"])["memory_level"]) for r in log] == [
        ("test", "normal", "seared")]
    for ref in (gist, lives, plain):  # unpinning lowers a level: the user's alone
        change(services.owner(ref.kind), ref, "unpin", "user")
    # unpinned ones fall back to vivid; one that was not pinned is left alone
    assert levels(services, gist, lives, plain) == ["vivid", "vivid", "normal"]


def test_turns_cannot_be_pinned(services: Services) -> None:
    said = turn(services, "hello")
    with pytest.raises(ValueError, match="turns cannot be pinned"):
        change(services.transcript, said, "pin", "test")
    with pytest.raises(NoSuchItem):
        change(services.episodes, Ref("episode", 42), "pin", "test")


# -- edits ----------------------------------------------------------------------


def test_edit_an_episode_rewrites_its_gist_and_keyword_index(services: Services) -> None:
    gist = episode(services, "we went to the aquarium in Lisbon")
    assert edit(services.episodes, gist, "we went to the zoo in Porto", "test") == gist
    store = store_of(services)
    assert services.episodes.get(gist.id)["gist"] == "we went to the zoo in Porto"  # type: ignore[index]
    assert page(services, text="aquarium") == ([], 0)
    assert page(services, text="zoo porto") == ([str(gist)], 1)
    logged = store.row("SELECT writer, before, after FROM write_log WHERE op = 'update'"
                       " AND table_name = 'episodes' AND row_id = ?", (gist.id,))
    assert logged is not None and logged["writer"] == "test"
    assert json.loads(logged["before"])["gist"] == "we went to the aquarium in Lisbon"
    with pytest.raises(ValueError, match="empty"):
        edit(services.episodes, gist, "   ", "test")


def test_edit_a_fact_supersedes_it_and_keeps_history(services: Services,
                                                     clock: ManualClock) -> None:
    old = fact(services, "Ana", "lives_in", "Porto", confidence=0.9)
    change(services.graph, old, "pin", "test")
    clock.advance(DAY)
    new = edit(services.graph, old, "Braga", "test")
    assert new.kind == "fact" and new != old
    now, before = services.graph.get(new.id), services.graph.get(old.id)
    assert now is not None and before is not None
    assert (now["value"], now["source"], now["user_managed"], now["confidence"],
            now["memory_level"], now["valid_to"]) == ("Braga", "user", 1, 1.0, "seared", None)
    assert before["value"] == "Porto" and before["superseded_by"] == new.id
    assert before["valid_to"] == T0 + DAY
    assert [r["value"] for r in services.graph.history("Ana", "lives_in")] == ["Porto", "Braga"]
    views = {v.ref: v for v in browse.browse(store_of(services), Browse())[0]}
    assert views[str(old)].details["current"] is False
    assert views[str(new)].text == "Ana lives in: Braga"
    with pytest.raises(ValueError, match=f"superseded by {new}"):
        edit(services.graph, old, "Faro", "test")  # history: edit the current one
    assert edit(services.graph, new, "braga", "test") == new  # same value: reinforced


def test_turns_cannot_be_edited(services: Services) -> None:
    said = turn(services, "I said this")
    with pytest.raises(ValueError, match="append-only"):
        edit(services.transcript, said, "I said that", "test")
    assert services.transcript.get(said.id)["content"] == "I said this"  # type: ignore[index]
    with pytest.raises(NoSuchItem):
        edit(services.episodes, Ref("episode", 7), "text", "test")
