"""Turning user text into a safe FTS5 query.

User text is never FTS5 syntax: it is split into word tokens, stop words are
dropped, and every remaining token is quoted as a string literal and joined
with OR. Quotes, ``NEAR``, ``*``, ``AND``, column filters and parentheses in
the input become plain words or vanish; an input with no usable words gives no
query at all (and so no keyword candidates), never an error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

import apsw

MAX_QUERY_CHARS = 4000
MAX_TERMS = 32

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are aren as at be because been
    before being below between both but by can could couldn did didn do does doesn doing
    don down during each few for from further had hadn has hasn have haven having he her
    here hers herself him himself his how i if in into is isn it its itself just let ll
    me might more most must my myself no nor not now of off on once only or other ought
    our ours ourselves out over own re s same shall she should shouldn so some such t than
    that the their theirs them themselves then there these they this those through to too
    under until up very was wasn we were weren what when where which while who whom why
    will with won would wouldn you your yours yourself yourselves ve d m o y also get got
    did does like really yeah oh ok okay well much many thing things one
    """.split()
)


def query_terms(text: str) -> list[str]:
    """The distinct, lower-cased, non-stop-word terms of ``text``, in order."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(text[:MAX_QUERY_CHARS]):
        term = match.group(0).lower()
        if term in STOPWORDS or term in seen:
            continue
        if len(term) == 1 and not term.isdigit():
            continue
        seen[term] = None
        if len(seen) >= MAX_TERMS:
            break
    return list(seen)


def match_expression(text: str) -> str | None:
    """An FTS5 MATCH expression that ORs the quoted terms of ``text``, or None."""
    terms = query_terms(text)
    if not terms:
        return None
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


# The tokenizer of every FTS5 table (runtime.store.migrations._FTS_TOKENIZE says the same).
TOKENIZER = ("porter", ("unicode61", "remove_diacritics", "2"))


class TermCounts:
    """How many rows of an FTS5 table each term is found in, from an
    ``fts5vocab`` table over it (a temporary one, this connection's own), the
    terms tokenized as the table tokenizes them (stemmed), and how many rows
    the table has. What was looked up is kept for ``ttl_s``: a household's
    words recur, and the counts move slowly."""

    def __init__(self, conn: apsw.Connection, table: str, content: str, ttl_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.table = table  # the FTS5 table
        self.content = content  # its content table (its row count)
        self.ttl_s = ttl_s
        self.clock = clock
        self._vocab = ""
        self._tokenize: apsw.FTS5Tokenizer | None = None
        self._rows: tuple[float, int] | None = None
        self._docs: dict[str, tuple[float, int]] = {}

    def rows(self) -> int:
        """The rows of the content table."""
        now = self.clock()
        if self._rows is None or now - self._rows[0] > self.ttl_s:
            count = self.conn.execute(f"SELECT count(*) FROM {self.content}").fetchone()
            self._rows = (now, int(count[0]) if count else 0)
        return self._rows[1]

    def docs(self, terms: Iterable[str]) -> dict[str, int]:
        """How many rows each term is in (0: none)."""
        now = self.clock()
        if self._tokenize is None:
            self._vocab = f"temp.{self.table}_vocab"
            self.conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {self._vocab}"
                              f" USING fts5vocab(main, {self.table}, row)")
            self._tokenize = self.conn.fts5_tokenizer(TOKENIZER[0], list(TOKENIZER[1]))
        stem = {t: self._stem(t) for t in terms}
        stale = sorted({s for s in stem.values() if s
                        and (s not in self._docs or now - self._docs[s][0] > self.ttl_s)})
        if stale:
            found = dict(self.conn.execute(
                f"SELECT term, doc FROM {self._vocab} WHERE term IN"
                f" ({','.join('?' * len(stale))})", stale))
            for s in stale:
                self._docs[s] = (now, int(found.get(s, 0)))
        return {t: (self._docs[s][1] if s else 0) for t, s in stem.items()}

    def _stem(self, term: str) -> str:
        assert self._tokenize is not None
        tokens = list(self._tokenize(term.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY, None,
                                     include_offsets=False, include_colocated=False))
        return str(tokens[0]) if tokens else ""
