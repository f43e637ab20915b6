
import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.fts import MAX_TERMS, match_expression, query_terms

HOSTILE = [
    '"', '""', "'", 'say "hello', "NEAR(a b)", "a NEAR b", "*", "foo*", "AND", "a AND",
    "OR OR OR", "NOT", "content:secret", "speaker:Ana", "{content speaker}:x", "((a)",
    "a)", "^start", "a + b", "-", "x" * 100_000, "", "   ", "\x00\x01", "🙂 emoji",
    "Ünïcödé wörds", "col:umn:: ::", "a\nb\tc", "%", "_", "'; DROP TABLE transcript;--",
]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> apsw.Connection:
    c = apsw.Connection(str(tmp_path_factory.mktemp("fts") / "f.db"))
    c.execute("CREATE VIRTUAL TABLE t USING fts5(content, speaker,"
              " tokenize = 'porter unicode61 remove_diacritics 2')")
    c.execute("INSERT INTO t VALUES ('hello there secret', 'Ana'), ('near and far', 'Bo')")
    return c


def _run(conn: apsw.Connection, text: str) -> list[tuple[int]]:
    expr = match_expression(text)
    if expr is None:
        return []
    return list(conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (expr,)))


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_never_raises(conn: apsw.Connection, text: str) -> None:
    _run(conn, text)


def test_operators_are_plain_words(conn: apsw.Connection) -> None:
    # "near" is a word here, not the NEAR operator; "content:" is not a column filter
    assert _run(conn, "NEAR") == [(2,)]
    assert _run(conn, "content:secret") == [(1,)]


def test_terms_are_bounded_and_stopwords_dropped() -> None:
    assert query_terms("What is the secret?") == ["secret"]
    assert match_expression("the and of") is None
    assert len(query_terms(" ".join(f"w{i}" for i in range(1000)))) == MAX_TERMS


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_a_valid_query(text: str) -> None:
    c = apsw.Connection(":memory:")
    c.execute("CREATE VIRTUAL TABLE t USING fts5(content)")
    c.execute("INSERT INTO t VALUES ('some words here')")
    _run(c, text)
