"""Recall (turn zero) against the real store, the real MiniLM model and real hnswlib.

Every test writes through :class:`runtime.memory.Memory` and reads back through
``Memory.recall``. The vector path is only ever broken by real means: switching
the index off, or swapping in an embedder whose ``embed`` raises.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import apsw
import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.recall import temporal as temporal_recall
from runtime.recall.hybrid import NEIGHBOUR_REACH, Recaller
from runtime.recall.rendering import render
from runtime.recall.results import RecallResult
from runtime.store.fts import match_expression
from runtime.store.vector_index import KINDS
from runtime.time.clock import DAY, ManualClock
from runtime.time.expressions import Span


def read_only(max_examples: int) -> hsettings:
    """Recall is read-only, so hypothesis may reuse one seeded ``memory`` per test."""
    return hsettings(max_examples=max_examples, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def turn(content: str, channel: str = "living-room", source: str = "user",
         **kw: object) -> TurnIn:
    return TurnIn(channel=channel, source=source, content=content, **kw)  # type: ignore[arg-type]


class BrokenEmbedder:
    """Fault injection: an embedder whose model cannot run."""

    def __init__(self, like: Embedder) -> None:
        self.name, self.dim = like.name, like.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("onnx session lost")


def break_vector_path(memory: Memory, how: str) -> None:
    if how == "index-off":
        memory.index.available = False
    else:
        memory.recaller.embedder = BrokenEmbedder(memory.embedder)


HOUSEHOLD = {
    "sister": "My sister Ana lives in Porto.",
    "cat": "Our cat is named Miso.",
    "allergy": "I have a severe peanut allergy.",
    "trip": "We're planning a trip to Japan next April.",
    "job": "I work as a nurse at the city hospital.",
    "band": "My favourite band is Radiohead.",
    "boiler": "The boiler was serviced last week by a plumber.",
    "piano": "My son Leo starts piano lessons on Thursdays.",
    "italian": "I'm learning to speak Italian on weekends.",
    "car": "Our car is a blue Volvo estate.",
}


def seed_household(memory: Memory, clock: ManualClock) -> dict[str, int]:
    ids: dict[str, int] = {}
    for name, text in HOUSEHOLD.items():
        clock.advance(60)
        ids[name] = memory.add_turn(turn(text))
    return ids


def seed_soups(memory: Memory, n: int = 60) -> list[int]:
    """``n`` similar turns that are all relevant to a question about soup."""
    dishes = ["lentil", "tomato", "pumpkin", "mushroom", "carrot", "onion", "pea", "leek",
              "potato", "bean", "chickpea", "miso", "noodle", "chicken", "fish", "corn",
              "squash", "barley", "spinach", "kale"]
    verdicts = ["great", "okay", "a bit salty"]
    return memory.add_turns([
        turn(f"On day {i} I cooked a {dishes[i % len(dishes)]} soup for dinner"
             f" and it turned out {verdicts[i % 3]}.", channel="kitchen")
        for i in range(n)
    ])


# -- relevance --------------------------------------------------------------

@pytest.mark.parametrize(("want", "query"), [
    ("sister", "Where does my sister live?"),
    ("sister", "tell me about my sibling's home town"),
    ("cat", "What is the name of our cat?"),
    ("cat", "what's my pet called"),
    ("allergy", "What food am I allergic to?"),
    ("allergy", "Can I eat peanut butter?"),
    ("trip", "Where are we travelling next spring?"),
    ("trip", "vacation in Tokyo"),
    ("job", "where do I work"),
    ("band", "what music do I like"),
    ("boiler", "when was the heating last checked"),
    ("piano", "what day is my son's music class"),
    ("italian", "which language am I studying"),
    ("car", "what colour is our vehicle"),
])
def test_relevant_turn_ranks_first(memory: Memory, clock: ManualClock,
                                   want: str, query: str) -> None:
    ids = seed_household(memory, clock)
    result = memory.recall(query)
    assert not result.degraded
    assert result.items, f"nothing recalled for {query!r}"
    assert result.items[0].ref == f"turn:{ids[want]}", result.refs
    assert result.items[0].text.endswith(HOUSEHOLD[want])


@pytest.mark.parametrize("query", [
    "quantum chromodynamics and gauge symmetry",
    "capital gains tax law deductions",
    "explain the Krebs cycle in mitochondria",
    "who won the 1994 world cup",
])
def test_unrelated_query_recalls_nothing(memory: Memory, clock: ManualClock, query: str) -> None:
    """The score floor drops weak candidates instead of padding to a count."""
    seed_household(memory, clock)
    result = memory.recall(query)
    assert not result.degraded
    assert result.items == []


def test_recall_crosses_channels(memory: Memory, clock: ManualClock) -> None:
    """Recall has no channel argument: a kitchen turn answers a living-room question."""
    seed_household(memory, clock)
    kitchen = memory.add_turn(turn("The spare house key is hidden under the blue flowerpot.",
                                   channel="kitchen"))
    result = memory.recall("where did we hide the spare key?")
    assert result.items and result.items[0].ref == f"turn:{kitchen}"
    assert result.items[0].channel == "kitchen"


# -- per-source memory profiles ----------------------------------------------

MUTED_TEXT = "The zeppelin rental invoice number is 4471 for the Thursday airship tour."


@pytest.mark.parametrize("source", ["delegate:search", "scheduled", "weather-station"])
@pytest.mark.parametrize("path", ["hybrid", "index-off"])
def test_muted_source_is_kept_but_never_recalled(memory: Memory, clock: ManualClock,
                                                 source: str, path: str) -> None:
    """With the index off, only the profile filter keeps the turn out: it matches
    the keywords better than anything else."""
    seed_household(memory, clock)
    muted = memory.add_turn(turn(MUTED_TEXT, source=source))
    remembered = memory.add_turn(turn("We booked a zeppelin airship tour for Thursday."))

    # In the transcript (source of truth) but not embedded.
    row = memory.transcript.get(muted)
    assert row is not None and row["content"] == MUTED_TEXT and row["source"] == source
    assert memory.store.scalar(
        "SELECT count(*) FROM vectors WHERE kind = 'turn' AND item_id = ?", (muted,)) == 0
    assert memory.counts()["vectors"] == len(HOUSEHOLD) + 1

    if path == "index-off":
        break_vector_path(memory, path)
    for query in (MUTED_TEXT, "zeppelin rental invoice 4471", "airship tour"):
        result = memory.recall(query)
        assert result.degraded == (path == "index-off")
        assert f"turn:{muted}" not in result.refs
        assert muted not in result.cited_turns()
    # ...while the same words from a remembered source are found.
    assert f"turn:{remembered}" in memory.recall("zeppelin airship tour").refs


# -- budget -----------------------------------------------------------------

SOUP_QUERY = "what soups have I cooked for dinner"


def test_budget_caps_items(memory: Memory) -> None:
    seed_soups(memory)
    # The budget is what binds here, not the score floor.
    unbounded = memory.recall(SOUP_QUERY, max_items=1000, max_tokens=1_000_000)
    assert len(unbounded.items) > 20
    assert len(memory.recall(SOUP_QUERY).items) == memory.settings.recall.max_items == 20
    assert len(memory.recall(SOUP_QUERY, max_items=7).items) == 7


def test_budget_caps_tokens(memory: Memory) -> None:
    seed_soups(memory)
    result = memory.recall(SOUP_QUERY, max_tokens=60)
    assert 0 < len(result.items) < 20
    assert result.tokens == sum(i.tokens for i in result.items) <= 60


@pytest.mark.parametrize(("max_items", "max_tokens"), [(0, 2000), (20, 0)])
def test_zero_budget_recalls_nothing(memory: Memory, max_items: int, max_tokens: int) -> None:
    seed_soups(memory)
    assert memory.recall(SOUP_QUERY, max_items=20, max_tokens=2000).items  # not for lack of hits
    assert memory.recall(SOUP_QUERY, max_items=max_items, max_tokens=max_tokens).items == []


@read_only(max_examples=25)
@given(max_items=st.integers(1, 40), max_tokens=st.integers(10, 800))
def test_budget_property(memory: Memory, max_items: int, max_tokens: int) -> None:
    if memory.counts()["transcript"] == 0:
        seed_soups(memory)
    result = memory.recall(SOUP_QUERY, max_items=max_items, max_tokens=max_tokens)
    assert len(result.items) <= max_items
    assert sum(i.tokens for i in result.items) <= max_tokens
    # the budget only cuts: what is left keeps the unbounded ranking's order
    full = memory.recall(SOUP_QUERY, max_items=1000, max_tokens=1_000_000).refs
    assert [r for r in full if r in set(result.refs)] == result.refs
    if not result.items:
        assert memory.recall(SOUP_QUERY, max_items=1).items[0].tokens > max_tokens


# -- hostile queries ----------------------------------------------------------

HOSTILE = [
    '"', '""', "'", 'say "hello', 'soup" OR "x', "NEAR(soup dinner)", "soup NEAR dinner",
    "NEAR/2", "*", "soup*", "AND", "soup AND", "OR OR OR", "NOT soup", "soup NOT kale",
    "content:soup", "speaker:Ana", "{content speaker}:soup", "transcript_fts:soup",
    "((soup)", "soup)", "(", ")", "^soup", "soup + dinner", "-soup", "x" * 100_000,
    "\x00soup\x07", "\x00\x01\x1b[31m", "\u202esoup", "Ünïcödé wörds", "col:umn:: ::",
    "a\nb\tc", "%", "_", "'; DROP TABLE transcript;--", "🙂 soup",
]


@pytest.mark.parametrize("query", HOSTILE, ids=lambda q: repr(q[:24]))
def test_hostile_query_is_plain_text(memory: Memory, query: str) -> None:
    """No FTS5 error. On the hybrid path one would surface as a degraded result;
    on the keyword-only path (nothing left to fall back to) as an exception."""
    seed_soups(memory, 10)
    result = memory.recall(query)
    assert not result.degraded, result.reason
    assert_keyword_path_accepts(memory, query)


def assert_keyword_path_accepts(memory: Memory, query: str) -> None:
    memory.index.available = False
    try:
        fallback = memory.recall(query)
    finally:
        memory.index.available = True
    assert fallback.degraded
    assert fallback.reason == "IndexUnavailable: vector index switched off"


@pytest.mark.parametrize("query", ["", " ", "   \t\n  ", "\n"])
def test_empty_query_recalls_nothing(memory: Memory, query: str) -> None:
    seed_soups(memory, 10)
    result = memory.recall(query)
    assert result.items == [] and not result.degraded


@pytest.mark.parametrize("query", ["sou*", "soup NOT dinner", "NEAR(soup kale, 0)"])
def test_operators_are_not_applied_in_keyword_search(memory: Memory, query: str) -> None:
    """With only the keyword path left, FTS5 operators would show in the result:
    a prefix ``sou*`` would match every soup, ``NOT dinner`` would exclude them."""
    ids = seed_soups(memory, 10)
    memory.index.available = False
    refs = memory.recall(query).refs
    if query == "sou*":
        assert refs == []  # "sou" is not a word of any turn
    else:
        assert f"turn:{ids[0]}" in refs  # "soup ... for dinner" matches as plain words


@read_only(max_examples=50)
@given(text=st.text(max_size=400))
def test_any_text_is_a_safe_query(memory: Memory, text: str) -> None:
    if memory.counts()["transcript"] == 0:
        seed_soups(memory, 10)
    result = memory.recall(text)
    assert not result.degraded, result.reason
    if not text.strip():
        assert result.items == []
    else:
        assert_keyword_path_accepts(memory, text)


# -- degraded fallback --------------------------------------------------------

@pytest.mark.parametrize("how", ["index-off", "embedder-raises"])
def test_fallback_is_keyword_only_and_bounded(memory: Memory, how: str) -> None:
    ids = seed_soups(memory)
    break_vector_path(memory, how)
    first = memory.recall("miso soup", max_items=100)
    assert first.degraded and first.reason
    assert 0 < len(first.items) <= memory.settings.recall.fallback_items == 20
    # keyword matches only: every item is an FTS5 hit for the query's words
    expr = match_expression("miso soup")
    hits = {r[0] for r in memory.store.conn.execute(
        "SELECT rowid FROM transcript_fts WHERE transcript_fts MATCH ?", (expr,))}
    assert {i.item_id for i in first.items} <= hits
    # the exact-word match ranks first
    assert "miso" in first.items[0].text
    # deterministic, ties broken by kind then id
    second = memory.recall("miso soup", max_items=100)
    assert second.refs == first.refs
    order = [(-i.score, KINDS.index(i.kind), i.item_id) for i in first.items]
    assert order == sorted(order)
    assert set(ids) >= {i.item_id for i in first.items}


@pytest.mark.parametrize("how", ["index-off", "embedder-raises"])
def test_fallback_never_returns_everything(memory: Memory, clock: ManualClock,
                                           how: str) -> None:
    seed_household(memory, clock)
    seed_soups(memory)
    break_vector_path(memory, how)
    # Paraphrases with no shared keyword, stop words only, and unrelated words.
    for query in ("what's my pet called", "what is it that we did", "quantum chromodynamics"):
        result = memory.recall(query)
        assert result.degraded
        assert result.items == [], (query, result.refs)


def test_fallback_items_setting_is_the_cap(make_settings: Callable[..., Settings],
                                          clock: ManualClock, embedder: Embedder) -> None:
    with Memory(make_settings(recall={"fallback_items": 5}), clock=clock,
                embedder=embedder) as memory:
        seed_soups(memory)
        assert len(memory.recall(SOUP_QUERY).items) == 20
        memory.index.available = False
        result = memory.recall(SOUP_QUERY, max_items=50)
        assert result.degraded and len(result.items) == 5


def test_fallback_is_not_crowded_out_by_muted_rows(memory: Memory) -> None:
    mine = memory.add_turn(turn("I remember walking in the rain in Porto with my grandfather."))
    memory.add_turns([turn(f"Rain in Porto, search result {i}.", channel="search",
                           source="delegate:search") for i in range(80)])
    assert memory.recall("rain in Porto").refs == [f"turn:{mine}"]
    memory.index.available = False
    result = memory.recall("rain in Porto")
    assert result.degraded
    assert result.refs == [f"turn:{mine}"]


# -- episodes and facts -------------------------------------------------------

def seed_beach_day(memory: Memory) -> dict[str, int]:
    ids = {
        "castle": memory.add_turn(turn("On Saturday we drove to the coast and the kids built"
                                       " a huge sandcastle.")),
        "crab": memory.add_turn(turn("Leo found a crab under a rock near the lighthouse.")),
        "pancakes": memory.add_turn(turn("Leo says pancakes with blueberries are his"
                                         " favourite breakfast.", channel="kitchen")),
    }
    ids["episode"] = memory.add_episode(EpisodeIn(
        channel="living-room", source="user", salience=7,
        gist="A Saturday trip to the seaside: a big sandcastle and a crab by the lighthouse.",
        cites=[ids["castle"], ids["crab"]]))
    ids["fact"], resolution = memory.add_fact(FactIn(
        kind="user_specific", subject="Leo", key="favourite_breakfast",
        value="pancakes with blueberries", provenance=[f"turn:{ids['pancakes']}"]))
    assert resolution.action == "insert"
    return ids


def test_episode_is_recalled_with_its_cited_turns(memory: Memory, clock: ManualClock) -> None:
    seed_household(memory, clock)
    ids = seed_beach_day(memory)
    result = memory.recall("what did we do at the beach?")
    assert not result.degraded
    episode = next(i for i in result.items if i.kind == "episode")
    assert episode.ref == f"episode:{ids['episode']}"
    assert episode.turns == (ids["castle"], ids["crab"])
    assert {ids["castle"], ids["crab"]} <= set(result.cited_turns())
    contents = [memory.transcript.get(t)["content"] for t in episode.turns]  # type: ignore[index]
    assert "sandcastle" in contents[0] and "crab" in contents[1]


def test_fact_is_recalled_with_its_provenance_turn(memory: Memory, clock: ManualClock) -> None:
    seed_household(memory, clock)
    ids = seed_beach_day(memory)
    result = memory.recall("what does Leo like to eat in the morning?")
    assert not result.degraded
    fact = next(i for i in result.items if i.kind == "fact")
    assert fact.ref == f"fact:{ids['fact']}"
    assert "pancakes with blueberries" in fact.text
    assert fact.turns == (ids["pancakes"],)
    assert ids["pancakes"] in result.cited_turns()
    row = memory.transcript.get(fact.turns[0])
    assert row is not None and row["channel"] == "kitchen"


def test_cited_turns_have_no_repeats(memory: Memory) -> None:
    ids = seed_beach_day(memory)
    memory.add_fact(FactIn(kind="place", subject="family", key="beach_landmark",
                           value="the lighthouse where Leo found a crab",
                           provenance=[f"turn:{ids['crab']}"]))
    result = memory.recall("Leo and the crab at the lighthouse")
    cited = result.cited_turns()
    assert ids["crab"] in cited
    assert len(cited) == len(set(cited))
    assert sum(i.turns.count(ids["crab"]) for i in result.items) > 1  # cited more than once


def test_disabled_fact_is_not_recalled(memory: Memory, clock: ManualClock) -> None:
    seed_household(memory, clock)
    fact_id, _ = memory.add_fact(FactIn(kind="user_specific", subject="Miso", key="vet",
                                        value="Dr. Almeida on Rua Nova"))
    query = "who is Miso's vet?"
    assert f"fact:{fact_id}" in memory.recall(query).refs
    memory.graph.disable(fact_id)
    for q in (query, "Dr. Almeida Rua Nova"):
        assert f"fact:{fact_id}" not in memory.recall(q).refs
    memory.index.available = False
    assert f"fact:{fact_id}" not in memory.recall("Dr. Almeida Rua Nova").refs
    memory.index.available = True
    memory.graph.enable(fact_id)
    assert f"fact:{fact_id}" in memory.recall(query).refs


def roll_up(memory: Memory) -> tuple[int, int]:
    """A leaf episode, then a topic episode that rolls it up (tombstones it)."""
    leaf = memory.add_episode(EpisodeIn(
        channel="garden", source="user",
        gist="We planted three apple trees and a row of raspberry canes in the back garden."))
    topic = memory.add_episode(EpisodeIn(
        channel="garden", source="user", level=1, children=[leaf],
        gist="Spring gardening projects at home."))
    return leaf, topic


def test_tombstoned_episode_is_not_recalled(make_settings: Callable[..., Settings],
                                            clock: ManualClock, embedder: Embedder) -> None:
    settings = make_settings()
    exact = "planted three apple trees and a row of raspberry canes"
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        leaf, _ = roll_up(memory)
        assert memory.episodes.get(leaf)["tombstoned_at"] is not None  # type: ignore[index]
        for q in (exact, "which fruit trees did we plant?"):
            assert f"episode:{leaf}" not in memory.recall(q).refs
    # Rebuilt from the database, the index holds the leaf's vector again as a
    # live element: the database filter alone must keep it out.
    shutil.rmtree(settings.store.resolved_dir / "index")
    with Memory(settings, clock=clock, embedder=embedder) as memory:
        for q in (exact, "which fruit trees did we plant?"):
            result = memory.recall(q)
            assert not result.degraded, result.reason
            assert f"episode:{leaf}" not in result.refs


def test_roll_up_does_not_degrade_recall(memory: Memory, clock: ManualClock) -> None:
    ids = seed_household(memory, clock)
    roll_up(memory)
    result = memory.recall("what is the name of our cat?")
    assert not result.degraded, result.reason
    assert result.refs[:1] == [f"turn:{ids['cat']}"]


def test_superseded_fact_is_kept_but_current_one_is_recalled(memory: Memory,
                                                             clock: ManualClock) -> None:
    old, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    clock.advance(DAY)
    new, resolution = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in",
                                             value="Lisbon"))
    assert resolution.action == "supersede" and resolution.existing_id == old
    assert f"fact:{new}" in memory.recall("Where does Ana live?").refs


@pytest.mark.parametrize("days_later", [
    0,
    30,
])
def test_superseded_fact_ranks_below_its_replacement(memory: Memory, clock: ManualClock,
                                                     days_later: int) -> None:
    old, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    clock.advance(DAY)
    new, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in",
                                    value="Lisbon"))
    clock.advance(days_later * DAY)
    for query in ("Where does Ana live?", "Ana's home city"):
        refs = memory.recall(query).refs
        assert f"fact:{new}" in refs and f"fact:{old}" in refs, (query, refs)
        assert refs.index(f"fact:{new}") < refs.index(f"fact:{old}"), (query, refs)


# -- recency --------------------------------------------------------------------

@pytest.mark.parametrize("older_written_first", [True, False])
def test_much_older_turn_does_not_outrank_newer(memory: Memory, clock: ManualClock,
                                                older_written_first: bool) -> None:
    """Two turns with the same words: only their age differs."""
    text = "I'm thinking of repainting the hallway a dark green."
    now = clock.now()
    old_turn = turn(text, channel="hallway", created_at=now - 200 * DAY)
    new_turn = turn(text, channel="bedroom", created_at=now)
    if older_written_first:
        old, new = memory.add_turn(old_turn), memory.add_turn(new_turn)
    else:
        new, old = memory.add_turn(new_turn), memory.add_turn(old_turn)
    result: RecallResult = memory.recall("what colour will we paint the hallway?")
    refs = result.refs
    assert refs and refs[0] == f"turn:{new}", refs
    by_ref = {i.ref: i for i in result.items}
    assert f"turn:{old}" in by_ref, refs
    assert by_ref[f"turn:{old}"].relevance == pytest.approx(by_ref[f"turn:{new}"].relevance)
    assert by_ref[f"turn:{old}"].score < by_ref[f"turn:{new}"].score


# -- how a memory reads ---------------------------------------------------------------

# 2023-11-14 22:13:20 UTC, the clock fixture's start
DAY0 = "2023-11-14"


def fact_row(memory: Memory, fact_id: int) -> dict[str, object]:
    return memory.store.rows("SELECT * FROM facts WHERE id = ?", (fact_id,))[0]


@pytest.mark.parametrize(("fact", "text"), [
    # a user-managed note under any key: the user's own sentence
    (FactIn(kind="user_specific", subject="user", key="bike_lock", user_managed=True,
            value="The spare bike lock code is 2718."),
     f"The spare bike lock code is 2718. (noted {DAY0})"),
    (FactIn(kind="user_specific", subject="user", key="note-1a2b3c4d5e", user_managed=True,
            value="the boiler pressure should stay near 1.5 bar"),
     f"the boiler pressure should stay near 1.5 bar (noted {DAY0})"),
    (FactIn(kind="user_specific", subject="Ana", key="note-9f8e7d6c5b", user_managed=True,
            value="She takes her tea without sugar"),
     f"Ana: She takes her tea without sugar (noted {DAY0})"),
    # a user-managed value too short to read alone keeps its key
    (FactIn(kind="user_specific", subject="user", key="wifi_password", user_managed=True,
            value="hunter2"),
     f"user wifi password: hunter2 (noted {DAY0})"),
    # extracted facts: "subject key: value", whatever the key looks like
    (FactIn(kind="place", subject="Ana", key="lives_in", value="Lisbon"),
     f"Ana lives in: Lisbon (since {DAY0})"),
    (FactIn(kind="user_specific", subject="user", key="note-taking_app", value="Obsidian"),
     f"user note-taking app: Obsidian (since {DAY0})"),
    (FactIn(kind="user_specific", subject="user", key="allergy",
            value="I have a severe peanut allergy."),
     f"I have a severe peanut allergy. (since {DAY0})"),
    (FactIn(kind="discovery", subject="the city library", key="opening_hours",
            value="9am to 5pm on weekdays"),
     f"the city library opening hours: 9am to 5pm on weekdays (found {DAY0})"),
], ids=lambda v: v.key if isinstance(v, FactIn) else "")
def test_fact_reads_from_its_kind_and_fields(memory: Memory, fact: FactIn, text: str) -> None:
    fact_id, _ = memory.add_fact(fact)
    assert render("fact", fact_row(memory, fact_id), UTC) == text


def test_superseded_fact_reads_with_its_window(memory: Memory, clock: ManualClock) -> None:
    old, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    clock.advance(3 * DAY)
    memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Lisbon"))
    assert render("fact", fact_row(memory, old), UTC) == \
        f"Ana lives in: Porto ({DAY0} to 2023-11-17)"


def test_recalled_note_reads_as_the_users_sentence(memory: Memory, clock: ManualClock) -> None:
    seed_household(memory, clock)
    note, _ = memory.add_fact(FactIn(kind="user_specific", subject="user", key="bike_lock",
                                     value="The spare bike lock code is 2718.",
                                     confidence=1.0, user_managed=True))
    recaller = household_recaller(memory, UTC)
    item = next(i for i in recaller.recall("what is the bike lock code?").items
                if i.ref == f"fact:{note}")
    assert item.text == f"The spare bike lock code is 2718. (noted {DAY0})"


# -- dates in the household's time zone -----------------------------------------------

def household_recaller(memory: Memory, zone: tzinfo) -> Recaller:
    return Recaller(memory.store, memory.index, memory.embedder, memory.kinds,
                    memory.settings.recall, memory.clock, zone=zone)


@pytest.mark.parametrize(("zone", "utc", "local_date"), [
    # 23:30 UTC on Friday: already Saturday in Auckland
    ("Pacific/Auckland", datetime(2026, 3, 6, 23, 30, tzinfo=UTC), "2026-03-07"),
    # 03:30 UTC on Saturday: still Friday in Los Angeles
    ("America/Los_Angeles", datetime(2026, 3, 7, 3, 30, tzinfo=UTC), "2026-03-06"),
])
def test_recalled_dates_are_the_households(memory: Memory, clock: ManualClock, zone: str,
                                           utc: datetime, local_date: str) -> None:
    assert utc.date().isoformat() != local_date
    clock.set(utc.timestamp())
    said = memory.add_turn(turn("My sister Ana lives in Porto."))
    episode = memory.add_episode(EpisodeIn(channel="living-room", source="user",
                                           gist="Ana moved to Porto for her new job.",
                                           started_at=utc.timestamp()))
    fact, _ = memory.add_fact(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto"))
    result = household_recaller(memory, ZoneInfo(zone)).recall("Where does Ana live?")
    texts = {i.ref: i.text for i in result.items}
    assert texts[f"turn:{said}"] == f"[{local_date}] user: My sister Ana lives in Porto."
    assert texts[f"episode:{episode}"] == f"[{local_date}] Ana moved to Porto for her new job."
    assert texts[f"fact:{fact}"] == f"Ana lives in: Porto (since {local_date})"


@pytest.fixture
def auckland_system(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Pacific/Auckland")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("auckland_system")
def test_recaller_without_a_zone_uses_the_systems(memory: Memory, clock: ManualClock) -> None:
    clock.set(datetime(2026, 3, 6, 23, 30, tzinfo=UTC).timestamp())
    said = memory.add_turn(turn("My sister Ana lives in Porto."))
    recaller = Recaller(memory.store, memory.index, memory.embedder, memory.kinds,
                        memory.settings.recall, clock)
    result = recaller.recall("Where does Ana live?")
    assert result.items[0].ref == f"turn:{said}"
    assert result.items[0].text == "[2026-03-07] user: My sister Ana lives in Porto."


BROAD_DAY = [
    "We drove to the coast early in the morning.",
    "The ferry to the island was delayed by an hour.",
    "Lunch was grilled sardines at a small harbour cafe.",
    "Our daughter found a starfish in a rock pool.",
    "The lighthouse tour was cancelled because of the wind.",
    "We bought a kite shaped like a dragon at the market.",
    "Driving home we got stuck behind a tractor.",
    "Everyone fell asleep in the car before eight.",
]


def test_an_episodes_turns_come_best_first(memory: Memory, clock: ManualClock) -> None:
    ids = memory.add_turns([TurnIn(channel="chat", source="user", speaker="Ana", content=t)
                            for t in BROAD_DAY])
    clock.advance(60)
    episode = memory.add_episode(EpisodeIn(
        channel="chat", source="user", cites=ids,
        gist="A family day trip to the coast: ferry, harbour lunch, rock pools, a "
             "lighthouse, a dragon kite from the market, the drive home."))
    result = memory.recall("Where did we buy the dragon kite?")
    item = next(i for i in result.items if i.ref == f"episode:{episode}")
    assert item.turns[0] == ids[5], [BROAD_DAY[ids.index(t)] for t in item.turns]
    assert sorted(item.turns) == sorted(ids)  # reordered, nothing lost


def test_one_broad_item_cannot_fill_the_first_turns() -> None:
    from runtime.recall.results import TURNS_PER_ITEM_FIRST, RecallItem

    def item(ref: str, turns: tuple[int, ...]) -> RecallItem:
        return RecallItem(ref=ref, kind=ref.split(":")[0], item_id=1, text="", score=1.0,
                          relevance=1.0, channel="c", created_at=0.0, turns=turns, tokens=1)

    broad = item("episode:1", tuple(range(100, 120)))
    precise = item("turn:7", (7,))
    result = RecallResult(query="q", items=[broad, precise])
    cited = result.cited_turns()
    assert cited.index(7) == TURNS_PER_ITEM_FIRST  # right after the broad item's best
    assert sorted(cited) == sorted([*range(100, 120), 7])  # the rest still follow


def test_a_turn_borrows_from_its_neighbours_on_its_own_channel_only(memory: Memory,
                                                                     clock: ManualClock) -> None:
    """A turn takes part of the relevance of the turn just before or after it on
    its channel (``recall.context_turns``); the turn just before it in the
    transcript, said on another channel, lends nothing."""
    said = ["We adopted a beagle puppy called Rex from the shelter",
            "He already loves the long walks along the river every morning"]
    rows: dict[str, int] = {}
    for channel, text in [("kitchen", said[0]), ("kitchen", said[1]), ("garage", said[0]),
                          ("office", said[1])]:
        clock.advance(60)
        rows[channel] = memory.add_turn(TurnIn(channel=channel, source="user", role="user",
                                               content=text))
    query = "Rex the beagle puppy and his long walks along the river"

    def relevance(context_turns: int) -> dict[str, float]:
        memory.recaller.settings = memory.recaller.settings.model_copy(
            update={"context_turns": context_turns})
        found = {item.ref: item.relevance for item in memory.recall(query).items}
        return {"kitchen": found[f"turn:{rows['kitchen']}"],
                "office": found[f"turn:{rows['office']}"]}

    alone, with_neighbours = relevance(0), relevance(1)
    # the kitchen's second turn has the kitchen's first as its neighbour; the
    # office's turn follows the garage's beagle turn but has no turn of its own
    assert with_neighbours["kitchen"] > alone["kitchen"] + 0.05
    assert with_neighbours["office"] == pytest.approx(alone["office"])


def _relevance_by_ref(memory: Memory, query: str, **recall: object) -> dict[str, float]:
    memory.recaller.settings = memory.recaller.settings.model_copy(update=recall)
    return {item.ref: item.relevance for item in memory.recall(query).items}


def test_a_turn_borrows_its_neighbours_keywords_on_its_own_channel_only(
        memory: Memory, clock: ManualClock) -> None:
    """The words of a question sit in the turn before its answer: with
    ``recall.neighbour_keywords`` the answer borrows that share of its
    neighbour's keyword score above its own; the same answer on a channel whose
    turn before it is unrelated borrows nothing."""
    rows: dict[str, int] = {}
    for name, channel, text in [  # the hall's answer follows the kitchen's question
        ("other", "hall", "The bus was late again this morning."),
        ("asked", "kitchen", "Did you finish the pottery course at the community centre?"),
        ("answer_alone", "hall", "Yes, and I made a lopsided vase for my mother."),
        ("answer", "kitchen", "Yes, and I made a lopsided vase for my mother."),
    ]:
        clock.advance(60)
        rows[name] = memory.add_turn(TurnIn(channel=channel, source="user", role="user",
                                            content=text))
    query = "pottery course community centre vase"
    plain = _relevance_by_ref(memory, query, neighbour_keywords=0.0)
    borrowed = _relevance_by_ref(memory, query, neighbour_keywords=0.5)
    answer, alone = f"turn:{rows['answer']}", f"turn:{rows['answer_alone']}"
    assert borrowed[answer] > plain[answer] + 0.1  # the kitchen question's words
    assert borrowed[alone] == pytest.approx(plain[alone])  # its own channel's turn has none
    # with no neighbours to look at (context_turns 0) nothing is borrowed
    assert _relevance_by_ref(memory, query, neighbour_keywords=0.5,
                             context_turns=0)[answer] < borrowed[answer]


def test_speaker_bonus_is_the_setting(memory: Memory, clock: ManualClock) -> None:
    """A turn whose speaker the query names gains exactly ``recall.speaker_bonus``."""
    said = memory.add_turn(TurnIn(channel="chat", source="user", speaker="Caroline",
                                  content="I started volunteering at the animal shelter."))
    query = "Where does Caroline volunteer?"
    low = _relevance_by_ref(memory, query, speaker_bonus=0.0)[f"turn:{said}"]
    high = _relevance_by_ref(memory, query, speaker_bonus=0.3)[f"turn:{said}"]
    assert high - low == pytest.approx(0.3, abs=1e-5)


def test_weight_temporal_scales_the_time_bonus(memory: Memory, clock: ManualClock) -> None:
    """A turn said in the span the query names gains temporal recall's bonus
    times ``recall.weight_temporal``: 0 takes the bonus away, 2 doubles it."""
    said = memory.add_turn(turn("We went camping by the lake with the kids."))
    clock.advance(7 * DAY)
    query = "What did we do at the lake last week?"
    by_weight = {w: _relevance_by_ref(memory, query, weight_temporal=w)[f"turn:{said}"]
                 for w in (0.0, 1.0, 2.0)}
    bonus = by_weight[1.0] - by_weight[0.0]
    assert bonus > 0.1
    assert by_weight[2.0] - by_weight[1.0] == pytest.approx(bonus, abs=1e-5)


def test_keyword_feedback_finds_the_words_the_best_hits_share(memory: Memory,
                                                              clock: ManualClock) -> None:
    """``recall.keyword_feedback``: the best keyword hits for "Rex" share
    "beagle" and "shelter", so a turn with those words but not the name gains a
    keyword score of at most that share; without feedback it has none."""
    seed_household(memory, clock)  # other words, so that the shared ones are rare
    rows = []
    for channel, text in [("a", "Rex the beagle came home from the shelter today."),
                          ("b", "Rex the beagle loves the shelter volunteers."),
                          ("c", "The beagle from the shelter chewed my slippers."),
                          ("d", "The boiler was serviced last week by a plumber.")]:
        clock.advance(60)
        rows.append(memory.add_turn(turn(text, channel=channel)))
    query = "How is Rex doing?"
    memory.recaller.settings = memory.recaller.settings.model_copy(  # every candidate
        update={"min_cosine": -1.0, "relative_floor": 0.0})
    plain = _relevance_by_ref(memory, query, keyword_feedback=0.0)
    fed = _relevance_by_ref(memory, query, keyword_feedback=0.5)
    slippers, boiler = f"turn:{rows[2]}", f"turn:{rows[3]}"
    assert 0.02 < fed[slippers] - plain[slippers] <= 0.5 * 0.5 + 1e-6  # LEXICAL_WEIGHT * share
    assert fed.get(boiler) == plain.get(boiler)  # shares none of the words
    for named in rows[:2]:  # the name's own hits keep their own, higher score
        assert fed[f"turn:{named}"] == pytest.approx(plain[f"turn:{named}"])


def test_keyword_feedback_leaves_out_a_word_in_too_many_turns(memory: Memory,
                                                              clock: ManualClock) -> None:
    """On a store big enough, a word the best hits share but that is found in
    more than ``FEEDBACK_MAX_SHARE`` of the turns (and more than
    ``FEEDBACK_MIN_TURNS``) is not searched for: a turn that shares only that
    word with them gains nothing, one that shares a rarer word does."""
    from runtime.recall.hybrid import FEEDBACK_MAX_SHARE, FEEDBACK_MIN_TURNS

    common = FEEDBACK_MIN_TURNS + 10
    assert common > FEEDBACK_MAX_SHARE * (3 * common + 4)  # "garden" is common here
    # long, so that bm25 ranks the short "garden path" turn first among them;
    # and a word in under half the turns, so that bm25 still gives it weight
    memory.add_turns([turn(f"The garden needs a great deal of work before the spring "
                           f"comes round, said neighbour number {i} at length.",
                           channel=f"g{i % 5}") for i in range(common)])
    memory.add_turns([turn(f"Bin day moved to Thursday for street number {i}.",
                           channel=f"s{i % 5}") for i in range(2 * common)])
    rows = []
    for channel, text in [("a", "Rex the beagle dug up the garden again."),
                          ("b", "Rex the beagle hid in the garden shed."),
                          ("c", "A beagle puppy barked all night."),
                          ("d", "Weeds took over the garden path.")]:
        clock.advance(60)
        rows.append(memory.add_turn(turn(text, channel=channel)))
    memory.recaller.settings = memory.recaller.settings.model_copy(  # every candidate
        update={"min_cosine": -1.0, "relative_floor": 0.0, "max_items": 200,
                "max_tokens": 100_000, "neighbour_keywords": 0.0})
    plain = _relevance_by_ref(memory, "How is Rex doing?", keyword_feedback=0.0)
    fed = _relevance_by_ref(memory, "How is Rex doing?", keyword_feedback=0.5)
    puppy, path = f"turn:{rows[2]}", f"turn:{rows[3]}"
    assert fed[puppy] - plain[puppy] > 0.02  # "beagle": rare enough
    assert fed.get(path) == plain.get(path)  # "garden" only: in too many turns


def test_keyword_feedback_that_fails_leaves_the_keywords_found(
        memory: Memory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Feedback is an extra: an SQLite error in it (the word counts here) is
    logged by type, and recall answers with the keywords of the first search."""
    import apsw

    from runtime.store.fts import TermCounts

    seed_household(memory, clock)
    plain = _relevance_by_ref(memory, "when was the boiler serviced?", keyword_feedback=0.0)

    def broken(self: TermCounts, terms: object) -> dict[str, int]:
        raise apsw.SQLError("no such module: fts5vocab")

    monkeypatch.setattr(TermCounts, "docs", broken)
    with caplog.at_level("WARNING", logger="runtime.recall.hybrid"):
        fed = _relevance_by_ref(memory, "when was the boiler serviced?", keyword_feedback=0.5)
    assert fed == plain and fed
    assert "keyword feedback skipped: SQLError" in caplog.text


def _ranked(memory: Memory, query: str, **recall: object) -> tuple[list[str], dict[str, float]]:
    memory.recaller.settings = memory.recaller.settings.model_copy(update=recall)
    items = memory.recall(query).items
    return [item.ref for item in items], {item.ref: item.score for item in items}


def test_weight_episodes_moves_an_episode_against_the_turns(memory: Memory,
                                                            clock: ManualClock) -> None:
    """``recall.weight_episodes`` multiplies an episode's score and nothing else's:
    the beach episode sits between its two turns at 1.0, falls below both at 0.5
    and rises above both at 1.2; ``recall.weight_facts`` does not move it."""
    seed_household(memory, clock)
    ids = seed_beach_day(memory)
    episode, castle, crab = f"episode:{ids['episode']}", f"turn:{ids['castle']}", \
        f"turn:{ids['crab']}"
    query = "what did we do at the beach?"
    order, scores = _ranked(memory, query, weight_episodes=1.0, weight_facts=1.0)
    assert order.index(castle) < order.index(episode) < order.index(crab), order
    low_order, low = _ranked(memory, query, weight_episodes=0.5)
    assert low_order.index(crab) < low_order.index(episode), low_order
    assert low[episode] == pytest.approx(0.5 * scores[episode], abs=1e-5)
    assert {low[castle], low[crab]} == {scores[castle], scores[crab]}  # turns keep 1.0
    high_order, _ = _ranked(memory, query, weight_episodes=1.2)
    assert high_order.index(episode) < high_order.index(castle), high_order
    assert _ranked(memory, query, weight_episodes=1.0, weight_facts=0.5)[1] == scores


def test_weight_facts_moves_a_fact_against_the_turns(memory: Memory, clock: ManualClock) -> None:
    """``recall.weight_facts`` multiplies a fact's score and nothing else's: Leo's
    breakfast fact ranks above the turn it comes from at 1.0 and below it at 0.5;
    ``recall.weight_episodes`` does not move it."""
    seed_household(memory, clock)
    ids = seed_beach_day(memory)
    fact, said = f"fact:{ids['fact']}", f"turn:{ids['pancakes']}"
    query = "what does Leo like to eat in the morning?"
    order, scores = _ranked(memory, query, weight_episodes=1.0, weight_facts=1.0)
    assert order.index(fact) < order.index(said), order
    low_order, low = _ranked(memory, query, weight_facts=0.5)
    assert low_order.index(said) < low_order.index(fact), low_order
    assert low[fact] == pytest.approx(0.5 * scores[fact], abs=1e-5)
    assert low[said] == scores[said]  # turns keep 1.0
    assert _ranked(memory, query, weight_facts=1.0, weight_episodes=0.5)[1] == scores


def test_neighbours_are_found_past_other_channels_within_the_reach(
        memory: Memory, clock: ManualClock) -> None:
    """A turn's same-channel neighbours are the nearest ones on each side, looked
    for up to ``NEIGHBOUR_REACH * context_turns`` rows away: turns of other
    channels in between are stepped over, and a turn farther than the reach is
    not a neighbour."""
    ids: list[int] = []
    for channel in ["kitchen", "hall", "hall", "kitchen", "kitchen", "hall", "hall", "hall",
                    "hall", "hall", "kitchen"]:
        clock.advance(60)
        ids.append(memory.add_turn(turn(f"said in the {channel}", channel=channel)))
    rows = {int(r["id"]): r for r in memory.store.rows("SELECT * FROM transcript")}

    def neighbours(i: int, span: int) -> list[int]:
        found = []
        for wide in (False, True):  # rows beside first, or the whole reach at once
            memory.recaller._wide = wide
            found.append(memory.recaller._neighbours([rows[ids[i]]], span)[ids[i]])
        assert found[0] == found[1]
        return found[0]

    assert NEIGHBOUR_REACH == 4
    assert neighbours(0, 1) == [ids[3]]  # two hall turns stepped over
    assert neighbours(4, 1) == [ids[3]]  # the next kitchen turn is 6 rows on: out of reach
    assert neighbours(4, 2) == [ids[3], ids[0], ids[10]]  # reach 8: nearest first
    assert neighbours(10, 1) == []
    assert neighbours(10, 2) == [ids[4], ids[3]]
    assert neighbours(3, 1) == [ids[0], ids[4]]  # before, then after


def test_pull_in_brings_the_spans_turns_most_like_the_query(
        memory: Memory, clock: ManualClock) -> None:
    """Temporal recall's pull-in: of the turns said in the span a query names (or
    in the week after it), the recallable ones most like the query, with their
    cosine; a turn outside the span, a disabled one and one already found
    (``skip``) are left out. The turns are found by their time index: turns
    said at other times cost the search nothing."""
    start = clock.now()
    said: dict[str, int] = {}
    for name, text, days in [("before", "We baked bread with the kids", 0),
                             ("in_span", "We baked a cake with the kids", 10),
                             ("other", "The boiler needs a service", 10),
                             ("disabled", "We baked cookies with the kids", 10),
                             ("skipped", "We baked muffins with the kids", 10),
                             ("week_after", "The bread we baked was lovely", 14),
                             ("after", "We baked pies with the kids", 30)]:
        clock.set(start + days * DAY)
        said[name] = memory.add_turn(turn(text))
    memory.change(Ref("turn", said["disabled"]), "disable")
    day = start + 10 * DAY
    hint = temporal_recall.TimeHint(span=Span(day - 3600, day + 3600, "that day"),
                                    asks_when=False)
    qvec = memory.embedder.embed(["What did we bake with the kids?"])[0]

    def pull_in() -> tuple[dict[tuple[str, int], float], int]:
        steps: list[int] = []

        def profile(event: dict[str, Any]) -> None:
            if {"transcript", "vectors"} <= set(event.get("sql", "").split()):
                steps.append(event["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"])

        memory.store.conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, profile)
        try:
            found = temporal_recall.pull_in(memory.store, hint, qvec,
                                            skip={("turn", said["skipped"])})
        finally:
            memory.store.conn.trace_v2(0, None)
        assert len(steps) == 1
        return found, steps[0]

    found, steps = pull_in()
    assert set(found) == {("turn", said[n]) for n in ("in_span", "other", "week_after")}
    assert found[("turn", said["in_span"])] > found[("turn", said["other"])]
    for n in range(40):  # said long after: the same search, the same work
        clock.set(start + (60 + n) * DAY)
        memory.add_turn(turn(f"We baked {n} loaves with the kids"))
    assert pull_in() == (found, steps)


def test_a_memory_written_but_not_indexed_yet_is_recalled(memory: Memory) -> None:
    """The Recall actor indexes after the writer's notification, so a recall may
    come before the vector is stored: the memory, found by its words, is scored
    by embedding it then, not dropped under the cosine gate (a failure seen once
    in a loaded run: an episode written through its actor, not found by the
    recall asked right after)."""
    episode = memory.episodes.add(EpisodeIn(  # the service: nothing indexed
        channel="kitchen", source="user",
        gist="The family went to the aquarium in Lisbon and watched the otters."))
    assert memory.store.scalar("SELECT count(*) FROM vectors WHERE kind = 'episode'") == 0
    found = [i.ref for i in memory.recall("aquarium otters").items]
    assert f"episode:{episode}" in found
