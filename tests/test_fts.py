
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.store.fts import MAX_TERMS, TermCounts, match_expression, query_terms

ROWS = {
    1: ("hello there secret", "Ana"),
    2: ("near and far", "Bo"),
    3: ("unicode words: drop the table of transcript", "Cy"),
}

# Hostile input, and the rows it must find when read as plain words (never as
# FTS5 syntax: no operator, prefix, column filter or phrase survives).
HOSTILE: list[tuple[str, set[int]]] = [
    ('"', set()), ('""', set()), ("'", set()), ('say "hello', {1}),
    ("NEAR(a b)", {2}), ("a NEAR b", {2}),  # "near" is a word in row 2
    ("*", set()), ("hell*", set()), ("hello*", {1}),  # no prefix queries
    ("AND", set()), ("a AND", set()), ("OR OR OR", set()), ("NOT", set()),
    ("secret NOT hello", {1}), ("far NOT near", {2}),  # NOT excludes nothing
    ("content:secret", {1}), ("speaker:Ana", {1}),  # no column filters
    ("{content speaker}:x", set()), ("((a)", set()), ("a)", set()), ("^start", set()),
    ("^hello", {1}), ("a + b", set()), ("-", set()), ("x" * 100_000, set()),
    ("", set()), ("   ", set()), ("\x00\x01", set()), ("🙂 emoji", set()),
    ("Ünïcödé wörds", {3}),  # diacritics removed on both sides
    ("col:umn:: ::", set()), ("a\nb\tc", set()), ("%", set()), ("_", set()),
    ("'; DROP TABLE transcript;--", {3}),
]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> apsw.Connection:
    c = apsw.Connection(str(tmp_path_factory.mktemp("fts") / "f.db"))
    c.execute("CREATE VIRTUAL TABLE t USING fts5(content, speaker,"
              " tokenize = 'porter unicode61 remove_diacritics 2')")
    for rowid, (content, speaker) in ROWS.items():
        c.execute("INSERT INTO t (rowid, content, speaker) VALUES (?, ?, ?)",
                  (rowid, content, speaker))
    return c


def _run(conn: apsw.Connection, text: str) -> set[int]:
    expr = match_expression(text)
    if expr is None:
        return set()
    return {r[0] for r in conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (expr,))}


@pytest.mark.parametrize(("text", "rows"), HOSTILE, ids=lambda v: repr(v)[:30])
def test_hostile_text_is_only_words(conn: apsw.Connection, text: str, rows: set[int]) -> None:
    assert _run(conn, text) == rows


def test_operators_are_plain_words(conn: apsw.Connection) -> None:
    # "near" is a word here, not the NEAR operator; "content:" is not a column filter
    assert _run(conn, "NEAR") == {2}
    assert _run(conn, "content:secret") == {1}


def test_terms_are_bounded_and_stopwords_dropped() -> None:
    assert query_terms("What is the secret?") == ["secret"]
    assert query_terms("Secret, secret SECRET") == ["secret"]
    assert match_expression("the and of") is None
    assert len(query_terms(" ".join(f"w{i}" for i in range(1000)))) == MAX_TERMS
    assert query_terms("a b 7 x") == ["7"]  # single letters go, digits stay


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_a_valid_query_for_its_own_words(text: str) -> None:
    """Whatever the text, its query runs, finds each of its (ASCII) words and
    nothing that holds none of them."""
    control = "qqqcontrolrow"
    terms = query_terms(text)
    expr = match_expression(text)
    assert (expr is None) == (not terms)
    if expr is None or control in terms:
        return
    c = apsw.Connection(":memory:")
    c.execute("CREATE VIRTUAL TABLE t USING fts5(content)")
    c.execute("INSERT INTO t (rowid, content) VALUES (0, ?)", (control,))
    for rowid, term in enumerate(terms, start=1):
        c.execute("INSERT INTO t (rowid, content) VALUES (?, ?)", (rowid, term))
    found = {r[0] for r in c.execute("SELECT rowid FROM t WHERE t MATCH ?", (expr,))}
    assert 0 not in found
    ascii_rows = {i for i, term in enumerate(terms, start=1) if term.isascii()}
    assert ascii_rows <= found


def test_term_counts_are_stemmed_like_the_table_and_kept_for_their_ttl(
        tmp_path: Path) -> None:
    """The store's FTS5 tables (runtime.store.migrations) stem their words, so the count
    of "recipes" is that of "recipe"; a count is kept ``ttl_s``, then read again."""
    from runtime.config import CONFIG_DIR
    from runtime.store.database import Store
    from runtime.store.fact_kinds import FactKinds
    from runtime.time.clock import ManualClock

    store = Store(tmp_path / "r.db", FactKinds.load(CONFIG_DIR / "fact_kinds.toml"),
                  clock=ManualClock(1_000.0))
    texts = ["Grandma's curry recipe", "the recipes book", "a new recipe", "nothing here"]
    with store.write_transaction():
        for text in texts:
            store.insert("test", "transcript", {"channel": "chat", "role": "user",
                                                "source": "user", "content": text,
                                                "created_at": 1_000.0})
    now = [0.0]
    counts = TermCounts(store.conn, "transcript_fts", "transcript", ttl_s=60,
                        clock=lambda: now[0])
    assert counts.rows() == 4
    assert counts.docs(["recipes", "curry", "unheard", "the"]) == {
        "recipes": 3, "curry": 1, "unheard": 0, "the": 1}
    with store.write_transaction():
        store.insert("test", "transcript", {"channel": "chat", "role": "user",
                                            "source": "user", "content": "curry again",
                                            "created_at": 1_000.0})
    assert counts.docs(["curry"]) == {"curry": 1} and counts.rows() == 4  # kept
    now[0] = 61.0
    assert counts.docs(["curry"]) == {"curry": 2} and counts.rows() == 5  # read again
