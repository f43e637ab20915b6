"""Turning user text into a safe FTS5 query.

User text is never FTS5 syntax: it is split into word tokens, stop words are
dropped, and every remaining token is quoted as a string literal and joined
with OR. Quotes, ``NEAR``, ``*``, ``AND``, column filters and parentheses in
the input become plain words or vanish; an input with no usable words gives no
query at all (and so no keyword candidates), never an error.
"""

from __future__ import annotations

import re

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
