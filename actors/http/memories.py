"""REST routes for reading and editing memories (the ``memories`` tag).

Browsing (``GET /v1/memories``, ``/v1/episodes``, ``/v1/facts``,
``/v1/timeline``) answers a :class:`actors.messages.MemoryPage`: the items of
one page and the total over all pages, from ``Recall.browse``
(:mod:`runtime.recall.browse`). ``since`` and ``until`` bound when an item was
written, ``[since, until)``; each is epoch seconds (``1767225600``) or an
ISO-8601 date or date and time (``2026-03-01``, ``2026-03-01T08:30``), read in
the household's zone (``household.timezone``) unless it names its own offset
(``2026-03-01T08:30+01:00``, ``...Z``). ``q`` keeps the items containing every
word of it (plain words: never a query language).
``GET /v1/timeline?expr=last week`` names the slice in words instead
(:mod:`runtime.recall.timeline`: the memories dated in it, by when they happened).

One memory: ``GET /v1/memories/{ref}`` (404 when the ref names nothing),
``PATCH /v1/memories/{ref}`` with ``{"text": ...}`` (an episode's gist is
rewritten; a fact gets a new claim that supersedes it, so the answer names the
ref now holding the text; a turn is refused with 400: the transcript is
append-only), ``POST /v1/memories/{ref}/pin`` and ``/unpin`` (episodes and
facts: pinned is the level that never fades), ``POST
/v1/memories/{ref}/sensitive`` and ``/not-sensitive`` (any memory: the
sensitive tier of ``runtime.memories.privacy``; each item's ``sensitive`` and
``person`` show it). A malformed ref is a 400 that
says what a ref looks like; a malformed query parameter a 422 naming it.

Remembering, disabling, enabling and deleting are in :mod:`actors.http.app`.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, tzinfo
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from actors.http.backend import Backend
from actors.http.common import MAX_QUERY_CHARS, Changed
from actors.messages import MAX_TURN_CHARS, BrowseMemories, MemoryPage, MemoryView
from runtime.config import Settings
from runtime.memories.refs import NoSuchItem, parse_ref
from runtime.recall import timeline as timelines
from runtime.time.clock import SystemClock, household_zone

log = logging.getLogger(__name__)

TAG = "memories"
KINDS = ("turn", "episode", "fact")
_KIND_NAMES = {**{k: k for k in KINDS}, **{k + "s": k for k in KINDS}}
MAX_LIMIT = 500
MAX_OFFSET = 1_000_000


class MemoryEdit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS,
                      description="What the memory should say now.")


class Edited(BaseModel):
    ref: str = Field(description="The ref that was edited.")
    now: str = Field(description="The ref that now holds the text: the same one for an "
                                 "episode, the new fact that supersedes a fact.")


class ErrorBody(BaseModel):
    error: dict[str, str]


class NotFound(Exception):
    """A well-formed ref that names no memory: answered 404."""


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "The ref names no memory."},
    400: {"model": ErrorBody, "description": "A malformed ref, or a refused change."},
}


def parse_when(text: str, zone: tzinfo) -> float:
    """Epoch seconds from ``text``: a number (epoch seconds) or an ISO-8601 date
    or date-time, in ``zone`` unless it carries its own offset. ValueError,
    saying what is expected, otherwise."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"{text!r} is not a time")
        return seconds
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: expected epoch seconds or an ISO-8601 "
                         "date or date and time (2026-03-01, 2026-03-01T08:30)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone)
    return when.timestamp()


def _invalid(name: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("query", name),
                                    "msg": message, "input": None}])


def _kinds(given: list[str] | None) -> list[str]:
    if not given:
        return list(KINDS)
    out: list[str] = []
    for part in (p.strip().lower() for item in given for p in item.split(",")):
        if not part:
            continue
        kind = _KIND_NAMES.get(part)
        if kind is None:
            raise _invalid("kind", f"unknown kind {part!r}: expected turn, episode or fact")
        if kind not in out:
            out.append(kind)
    return out or list(KINDS)


KindParam = Annotated[list[str] | None, Query(
    description="Kinds to list: `turn`, `episode`, `fact`; repeat the parameter or "
                "separate them with commas. Default: all three.")]
TextParam = Annotated[str | None, Query(
    max_length=MAX_QUERY_CHARS,
    description="Only memories containing every word of this (plain words).")]
SinceParam = Annotated[str | None, Query(
    max_length=64, description="Written at or after this time: epoch seconds or an "
                               "ISO-8601 date or date and time (household zone).")]
UntilParam = Annotated[str | None, Query(
    max_length=64, description="Written before this time (same forms as `since`).")]
DisabledParam = Annotated[bool, Query(
    description="List disabled (hidden) memories too, flagged.")]
OrderParam = Annotated[Literal["newest", "oldest"], Query(
    description="`newest` first (the default) or `oldest` first.")]
LimitParam = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Items per page.")]
OffsetParam = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Items to skip.")]
ExprParam = Annotated[str | None, Query(
    min_length=1, max_length=200,
    description='A time in words ("last week", "May 2023", "2023-05-07"): the memories '
                "dated in it (a turn when said, an episode when begun, a fact when true).")]


def install(app: Any, settings: Settings, backend: Backend) -> None:
    """Add the memory routes (browse, one memory, edit, pin, unpin, episodes,
    facts, the timeline) to the FastAPI app."""
    zone = household_zone(settings.household.timezone)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "not_found"}},
                            status_code=404)

    def window(since: str | None, until: str | None) -> tuple[float | None, float | None]:
        bounds: dict[str, float | None] = {}
        for name, text in (("since", since), ("until", until)):
            try:
                bounds[name] = None if text is None or not text.strip() \
                    else parse_when(text, zone)
            except ValueError as exc:
                raise _invalid(name, str(exc)) from None
        start, end = bounds["since"], bounds["until"]
        if start is not None and end is not None and end < start:
            raise _invalid("until", "until is before since")
        return start, end

    def page(kinds: list[str], q: str | None, since: str | None, until: str | None,
             include_disabled: bool, oldest_first: bool, limit: int,
             offset: int) -> MemoryPage:
        start, end = window(since, until)
        return backend.browse(BrowseMemories(
            kinds=kinds, text=q if q and q.strip() else None,  # type: ignore[arg-type]
            since=start, until=end, include_disabled=include_disabled,
            oldest_first=oldest_first, limit=limit, offset=offset))

    def found(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except NoSuchItem as exc:
            raise NotFound(str(exc)) from None

    @app.get("/v1/memories", response_model=MemoryPage, tags=[TAG])
    def list_memories(kind: KindParam = None, q: TextParam = None,
                      since: SinceParam = None, until: UntilParam = None,
                      include_disabled: DisabledParam = True,
                      order: OrderParam = "newest", limit: LimitParam = 50,
                      offset: OffsetParam = 0) -> MemoryPage:
        """Memories of every kind (or those of `kind`), newest first, a page at a
        time; `total` counts the matches over all pages."""
        return page(_kinds(kind), q, since, until, include_disabled, order == "oldest",
                    limit, offset)

    @app.get("/v1/memories/{ref}", response_model=MemoryView, tags=[TAG],
             responses=NOT_FOUND)
    def get_memory(ref: str) -> MemoryView:
        """One memory (`turn:12`, `episode:3`, `fact:7`), whatever its state."""
        view: MemoryView = found(backend.get, ref)
        return view

    @app.patch("/v1/memories/{ref}", response_model=Edited, tags=[TAG],
               responses=NOT_FOUND)
    def edit_memory(ref: str, body: MemoryEdit) -> Edited:
        """Change what a memory says: an episode's gist is rewritten; a fact gets
        a new claim that supersedes it (history kept), named by `now`. Turns
        cannot be edited (the transcript is append-only): disable or delete one
        instead."""
        now: str = found(backend.edit, ref, body.text)
        return Edited(ref=str(parse_ref(ref)), now=now)

    @app.post("/v1/memories/{ref}/pin", response_model=Changed, tags=[TAG],
              responses=NOT_FOUND)
    def pin(ref: str) -> Changed:
        """Pin an episode or a fact: its memory level becomes `seared`, which
        never fades."""
        return Changed(ref=ref, change="pin", detail=found(backend.change, ref, "pin"))

    @app.post("/v1/memories/{ref}/unpin", response_model=Changed, tags=[TAG],
              responses=NOT_FOUND)
    def unpin(ref: str) -> Changed:
        """Unpin a pinned episode or fact: its level becomes `vivid` (it fades,
        never below a floor). One that is not pinned is left as it is."""
        return Changed(ref=ref, change="unpin", detail=found(backend.change, ref, "unpin"))

    @app.post("/v1/memories/{ref}/sensitive", response_model=Changed, tags=[TAG],
              responses=NOT_FOUND)
    def mark_sensitive(ref: str) -> Changed:
        """Mark a memory sensitive (codes, health, money): only its owner is told
        it, never an unknown speaker on a spoken channel; it never enters a
        portrait, digest or dmn finding."""
        return Changed(ref=ref, change="sensitive",
                       detail=found(backend.change, ref, "sensitive"))

    @app.post("/v1/memories/{ref}/not-sensitive", response_model=Changed, tags=[TAG],
              responses=NOT_FOUND)
    def unmark_sensitive(ref: str) -> Changed:
        """Take a memory's sensitive mark away."""
        return Changed(ref=ref, change="not_sensitive",
                       detail=found(backend.change, ref, "not_sensitive"))

    @app.get("/v1/episodes", response_model=MemoryPage, tags=[TAG])
    def list_episodes(q: TextParam = None, since: SinceParam = None,
                      until: UntilParam = None, include_disabled: DisabledParam = True,
                      order: OrderParam = "newest", limit: LimitParam = 50,
                      offset: OffsetParam = 0) -> MemoryPage:
        """Episodes (summaries of conversations, themes and eras), newest first."""
        return page(["episode"], q, since, until, include_disabled, order == "oldest",
                    limit, offset)

    @app.get("/v1/facts", response_model=MemoryPage, tags=[TAG])
    def list_facts(q: TextParam = None, since: SinceParam = None,
                   until: UntilParam = None, include_disabled: DisabledParam = True,
                   order: OrderParam = "newest", limit: LimitParam = 50,
                   offset: OffsetParam = 0) -> MemoryPage:
        """Facts, newest first by when they were learned; superseded ones too
        (`details.current` is false, `details.superseded_by` names the newer)."""
        return page(["fact"], q, since, until, include_disabled, order == "oldest",
                    limit, offset)

    @app.get("/v1/timeline", response_model=MemoryPage, tags=[TAG])
    def timeline(since: SinceParam = None, until: UntilParam = None,
                 limit: LimitParam = 50, offset: OffsetParam = 0,
                 expr: ExprParam = None) -> MemoryPage:
        """Everything remembered within `[since, until)`, every kind, oldest first;
        or, with `expr`, the memories dated in the time it names (runtime.recall.timeline)."""
        if expr is None:
            return page(list(KINDS), None, since, until, True, True, limit, offset)
        if since is not None or until is not None:
            raise _invalid("expr", "give either expr or since/until, not both")
        try:
            span = timelines.span_of(expr, SystemClock(), zone)
        except ValueError as exc:
            raise _invalid("expr", str(exc)) from None
        return backend.browse(BrowseMemories(since=span.start, until=span.end, dated=True,
                                             oldest_first=True, limit=limit, offset=offset))
