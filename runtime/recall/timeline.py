"""The timeline: the memories of one slice of time, named in words.

``reverie timeline "May 2023"`` and ``GET /v1/timeline?expr=...`` read an
expression (:mod:`runtime.time.expressions`, in the household's zone, at the clock's
now) and list the memories dated inside its span, oldest first, through
:func:`runtime.recall.browse.browse` with ``dated``: a turn is dated when it was said,
an episode when its conversation started (``started_at``), a fact when it
became true (``valid_from``; an extracted fact takes the time of the turn it
came from, a user's note the time it was noted). That date is what the
timeline shows as ``created_at`` (:func:`dated_at`), so an episode distilled
today from a conversation of 2023 is listed, and dated, in 2023.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, tzinfo
from typing import Any, Protocol

from runtime.recall.browse import Browse
from runtime.time.clock import Clock
from runtime.time.expressions import Span, parse

log = logging.getLogger(__name__)

PAGE = 500  # items per browse call (the message's own cap)
KINDS = ("turn", "episode", "fact")


class Viewed(Protocol):
    """What a listed memory carries (``runtime.recall.browse.View``, ``MemoryView``)."""

    @property
    def ref(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def created_at(self) -> float: ...
    @property
    def details(self) -> dict[str, Any]: ...


class Page(Protocol):
    @property
    def items(self) -> Sequence[Viewed]: ...
    @property
    def total(self) -> int: ...


def span_of(expr: str, clock: Clock, zone: tzinfo) -> Span:
    """The span ``expr`` names now (TimeExpressionError, a ValueError, if none)."""
    return parse(expr, clock.now(), zone)


def query(span: Span, kinds: Sequence[str] = KINDS, limit: int = PAGE,
          offset: int = 0) -> Browse:
    """The browse parameters of one page of ``span``'s memories, oldest first."""
    return Browse(kinds=tuple(kinds), since=span.start, until=span.end, oldest_first=True,
                  dated=True, include_disabled=False, limit=limit, offset=offset)


def collect(span: Span, browse: Callable[[Browse], Page], limit: int | None = None,
            kinds: Sequence[str] = KINDS) -> list[Viewed]:
    """Every memory of ``span`` (at most ``limit``), page by page through ``browse``."""
    out: list[Viewed] = []
    while limit is None or len(out) < limit:
        step = PAGE if limit is None else min(PAGE, limit - len(out))
        page = browse(query(span, kinds, step, len(out)))
        out.extend(page.items)
        if not page.items or len(out) >= page.total:
            break
    return out


def dated_at(view: Viewed) -> float:
    """When ``view``'s memory happened (see the module docstring)."""
    details = view.details or {}
    if view.kind == "episode" and details.get("started_at") is not None:
        return float(details["started_at"])
    if view.kind == "fact" and details.get("valid_from") is not None:
        return float(details["valid_from"])
    return float(view.created_at)


def item(view: Viewed) -> dict[str, Any]:
    """One timeline entry: ``{"ref", "kind", "text", "created_at"}``."""
    return {"ref": view.ref, "kind": view.kind, "text": view.text,
            "created_at": dated_at(view)}


def lines(items: Sequence[dict[str, Any]], span: Span, zone: tzinfo) -> list[str]:
    """The entries in words: a heading with the span, then one line each."""
    def local(t: float) -> str:
        return datetime.fromtimestamp(t, tz=zone).strftime("%Y-%m-%d %H:%M")

    head = f"{span.text}: {local(span.start)} to {local(span.end)}, {len(items)} memories"
    return [head, *(f"{local(i['created_at'])}  {i['ref']:<12} {i['text']}" for i in items)]
