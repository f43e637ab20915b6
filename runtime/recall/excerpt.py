"""Excerpts of long turns (issue 25).

An assistant's reply can run to pages; injected whole, a few of them fill
recall's 2,000-token budget. A turn longer than ``recall.excerpt_tokens`` is
injected as an excerpt instead: the run of whole sentences (lines, when a
sentence is longer than the excerpt: words) of at most that length that holds
the most of the query's words, the earliest of equals (the start, when none of
them is in the turn), with ``…`` where text was left out. The item still cites
the whole turn by its ref.
"""

from __future__ import annotations

import re

from runtime.store.fts import query_terms

# about four characters a token (runtime.recall.budget.approx_tokens)
CHARS_PER_TOKEN = 4
ELLIPSIS = "…"
_PIECE = re.compile(r"[^\n.!?]*(?:[.!?]+|\n+|$)")


def _pieces(text: str, limit: int) -> list[str]:
    """``text`` cut into sentences and lines, none longer than ``limit``
    characters (a longer one is cut between words)."""
    out: list[str] = []
    for match in _PIECE.finditer(text):
        piece = match.group(0)
        if not piece:
            continue
        while len(piece) > limit:
            cut = piece.rfind(" ", 0, limit)
            cut = limit if cut <= 0 else cut
            out.append(piece[:cut])
            piece = piece[cut:]
        if piece:
            out.append(piece)
    return out


def excerpt(text: str, query: str, tokens: int) -> str:
    """``text`` itself when it is at most ``tokens`` long, else its stretch of
    at most ``tokens`` that holds the most distinct words of ``query``."""
    limit = max(1, tokens) * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text
    pieces = _pieces(text, limit)
    words = set(query_terms(query))
    found = [set(query_terms(p)) & words for p in pieces]
    best: tuple[int, int, int] = (-1, 0, 0)  # (words held, -start, end)
    end = 0
    size = 0
    for start in range(len(pieces)):
        if end < start:
            end, size = start, 0
        while end < len(pieces) and size + len(pieces[end]) <= limit:
            size += len(pieces[end])
            end += 1
        held = len(set().union(*found[start:end])) if end > start else 0
        if held > best[0]:
            best = (held, -start, end)
        size -= len(pieces[start]) if end > start else 0
    start, stop = -best[1], best[2]
    body = "".join(pieces[start:stop]).strip()
    return ((ELLIPSIS + " " if start > 0 else "") + body
            + (" " + ELLIPSIS if stop < len(pieces) else ""))
