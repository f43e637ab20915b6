"""Long turns as passages (issue 25, ``recall.passages``; runtime.recall.passages)
and diversity by similarity (``recall.diversity_similarity``, MMR). Real store,
real MiniLM, real hnswlib; in process (no Ray)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.recall.excerpt import CHARS_PER_TOKEN, ELLIPSIS
from runtime.recall.passages import Cut, split
from runtime.store.vector_index import PASSAGE
from runtime.time.clock import DAY, ManualClock

FILLER = "We talked about many other things that afternoon, none of them important. "
KEY = "The spare key to the shed hangs on the hook behind the pantry door."
WORD = "Zorblatt"  # a word only the long turn's far end says


def long_reply() -> str:
    """A reply whose key sentence lies far past the 256 word pieces MiniLM reads."""
    return FILLER * 30 + KEY + f" Ask {WORD} if it is not there. " + FILLER * 6


@hsettings(max_examples=80, deadline=None, database=None)
@given(text=st.text(min_size=1, max_size=4000),
       tokens=st.integers(min_value=5, max_value=300),
       overlap=st.integers(min_value=0, max_value=200))
def test_passages_cover_the_turn_within_their_length(text: str, tokens: int,
                                                     overlap: int) -> None:
    cut = Cut(tokens, overlap)
    got = split(text, cut)
    if len(text) <= tokens * CHARS_PER_TOKEN:
        assert got == []
        return
    assert got[0][0] == 0 and got[-1][1] == len(text)
    for start, stop in got:
        assert 0 < stop - start <= tokens * CHARS_PER_TOKEN
    for (a, b), (c, d) in pairwise(got):
        assert a < c <= b < d  # moving on, no gap
        assert b - c <= max(overlap * CHARS_PER_TOKEN, 0)  # the overlap is bounded


def memory_with(make_settings: Callable[..., Settings], clock: ManualClock,
                embedder: Embedder, **recall: object) -> Memory:
    return Memory(make_settings(recall=recall), clock=clock, embedder=embedder)


def passage_rows(mem: Memory, turn_id: int) -> int:
    return int(mem.store.scalar("SELECT count(*) FROM passages WHERE transcript_id = ?",
                                (turn_id,)))


def matches(mem: Memory, word: str) -> int:
    return int(mem.store.scalar("SELECT count(*) FROM passages_fts WHERE passages_fts MATCH ?",
                                (f'"{word}"',)))


def test_a_long_turn_is_recalled_and_injected_as_its_best_passage(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    mem = memory_with(make_settings, clock, embedder, passages=True, passage_tokens=60,
                      passage_overlap=15)
    try:
        text = long_reply()
        turn_id = mem.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                      content=text, created_at=clock.now() - DAY))
        short = mem.add_turn(TurnIn(channel="chat", source="user", content="Thanks!",
                                    created_at=clock.now() - DAY + 30))
        assert passage_rows(mem, turn_id) > 3 and passage_rows(mem, short) == 0
        assert mem.index.count(PASSAGE) == passage_rows(mem, turn_id)
        found = mem.recall("where is the spare key to the shed")
        item = next(i for i in found.items if i.ref == f"turn:{turn_id}")
        assert KEY in item.text
        assert len(item.text) <= 60 * CHARS_PER_TOKEN + 40  # the passage, date and speaker
        assert ELLIPSIS in item.text and item.turns == (turn_id,)
    finally:
        mem.close()


def test_the_passages_follow_the_turn(make_settings: Callable[..., Settings],
                                      clock: ManualClock, embedder: Embedder) -> None:
    """Disable, enable, edit, reindex and forget: the passages, their keywords and
    their vectors go and come with the turn."""
    mem = memory_with(make_settings, clock, embedder, passages=True, passage_tokens=60,
                      passage_overlap=15)
    try:
        turn_id = mem.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                      content=long_reply(), created_at=clock.now() - DAY))
        made = passage_rows(mem, turn_id)
        assert made > 3 and matches(mem, WORD) == 1
        ref = Ref("turn", turn_id)

        mem.change(ref, "disable")
        assert passage_rows(mem, turn_id) == 0 and matches(mem, WORD) == 0
        assert mem.index.count(PASSAGE) == 0
        assert f"turn:{turn_id}" not in mem.recall(f"ask {WORD}").refs

        mem.change(ref, "enable")
        assert passage_rows(mem, turn_id) == made and mem.index.count(PASSAGE) == made
        assert f"turn:{turn_id}" in mem.recall(f"ask {WORD}").refs

        # an edit of the turn's text drops its passages (the trigger), a sync cuts anew
        mem.store.update("test", "transcript", turn_id, {"content": FILLER * 40})
        assert matches(mem, WORD) == 0
        mem.indexer.recheck("turn", turn_id)
        mem.indexer.sync()
        assert passage_rows(mem, turn_id) > 3 and matches(mem, "afternoon") > 0

        mem.indexer.clear()  # reindex: everything derived goes, a sync rebuilds it
        assert passage_rows(mem, turn_id) == 0 and mem.index.count(PASSAGE) == 0
        mem.indexer.sync()
        assert passage_rows(mem, turn_id) > 3

        mem.change(ref, "delete")
        assert int(mem.store.scalar("SELECT count(*) FROM passages")) == 0
        assert matches(mem, "afternoon") == 0
        assert mem.index.count(PASSAGE) == 0
    finally:
        mem.close()


def test_a_forgotten_turn_leaves_no_passage_behind(make_settings: Callable[..., Settings],
                                                   clock: ManualClock,
                                                   embedder: Embedder) -> None:
    """Forgetting through the store's forget (the runtime's path) merges the
    passages' FTS5 index too: the word is in none of its shadow tables."""
    mem = memory_with(make_settings, clock, embedder, passages=True, passage_tokens=60)
    try:
        turn_id = mem.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                                      content=long_reply(), created_at=clock.now() - DAY))
        mem.add_turn(TurnIn(channel="chat", source="assistant", role="assistant",
                            content=FILLER * 30, created_at=clock.now() - DAY + 30))
        mem.indexer.drop("turn", turn_id)
        mem.store.forget("test", "transcript", turn_id)
        for (table,) in list(mem.store.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name LIKE 'passages%' AND name != 'passages_fts'")):
            for row in mem.store.conn.execute(f"SELECT * FROM {table}"):
                for value in row:
                    raw = value if isinstance(value, bytes) else str(value).encode()
                    assert WORD.lower().encode() not in raw.lower(), table
    finally:
        mem.close()


def test_diversity_by_similarity_makes_room_for_something_else(
        make_settings: Callable[..., Settings], clock: ManualClock,
        embedder: Embedder) -> None:
    """Near-copies said on other channels days apart (the same-conversation
    term sees nothing to mark down): MMR lets the different one in."""
    picked = []
    copies: list[int] = []
    other = 0
    for alike in (0.0, 0.5):
        mem = memory_with(make_settings, clock, embedder, diversity_similarity=alike,
                          diversity=0.5, relative_floor=0.0)
        try:
            if not copies:
                start = clock.now() - 9 * DAY
                copies = [mem.add_turn(TurnIn(
                    channel=channel, source="user", content=text, created_at=start + i * DAY))
                    for i, (channel, text) in enumerate([
                        ("kitchen", "The boiler pressure dropped below one bar again."),
                        ("hall", "The boiler pressure dropped below one bar again today."),
                        ("chat", "Again the boiler pressure dropped below one bar."),
                    ])]
                other = mem.add_turn(TurnIn(
                    channel="garage", source="user",
                    content="Boiler pressure below one bar means the expansion vessel needs"
                            " recharging, the plumber said.",
                    created_at=start + 4 * DAY))
            picked.append(mem.recall("boiler pressure below one bar", max_items=2).refs)
        finally:
            mem.close()
    plain, diverse = picked
    assert set(plain) <= {f"turn:{i}" for i in copies}
    assert f"turn:{other}" in diverse and diverse[0] == plain[0]
