"""Browsing memories: pages of turns, episodes and facts for people to look through.

Pure reads over a :class:`runtime.store.database.Store` (the memory page, the REST API,
MCP's timeline), no writes:

- :func:`browse` lists the memories of some kinds, newest (or oldest) first,
  merged across kinds by when they were written (turns and episodes:
  ``created_at``; facts: ``recorded_at``, when Reverie learned them), with the
  total count for paging. ``text`` keeps only the items containing every word
  of it (FTS5; user text is never FTS5 syntax, see :func:`runtime.memories.refs.all_terms`:
  a text with no searchable word matches nothing); ``[since, until)`` bounds
  the time written.
- :func:`get` is one memory by its ref, whatever its state.

What is listed: every transcript row (the transcript is the record of what was
said; ``details.memory`` tells whether its source's profile lets recall use
it), every fact (history too: a superseded claim has ``valid_to`` and
``superseded_by``), and the episodes that are still memories: an episode
rolled up into a parent (tombstoned) is left out, since its parent holds it,
and is purged within 30 days anyway (:func:`get` still shows it). Compaction
summaries are continuity notes for the prompt, not memories, and are not
listed.

Every view carries its privacy mark and owner (``sensitive``, ``person``:
:mod:`runtime.memories.privacy`); browsing is for the household, so nothing is hidden.

How each reads (``text``): a turn ``speaker: content`` (the role when no
speaker), an episode its gist, a fact as recall renders it without its dates
(:func:`runtime.recall.rendering.render_fact`: a user's note reads as its sentence,
other facts ``subject key: value``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

from runtime.memories import privacy
from runtime.memories.decay import MemoryLevel, episode_weight
from runtime.memories.refs import Kind, Ref, all_terms
from runtime.recall.rendering import USER_SUBJECT, _reads_alone
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

PINNED_LEVEL = "seared"
EPISODE_LEVELS = {0: "leaf", 1: "theme", 2: "era"}


class BrowseParams(Protocol):
    """What :func:`browse` reads (``actors.messages.BrowseMemories`` has it)."""

    @property
    def kinds(self) -> Sequence[str]: ...
    @property
    def text(self) -> str | None: ...
    @property
    def since(self) -> float | None: ...
    @property
    def until(self) -> float | None: ...
    @property
    def include_disabled(self) -> bool: ...
    @property
    def oldest_first(self) -> bool: ...
    @property
    def limit(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def dated(self) -> bool: ...


@dataclass(frozen=True)
class Browse:
    """Browse parameters, for callers without a ``BrowseMemories`` message."""

    kinds: Sequence[str] = ("turn", "episode", "fact")
    text: str | None = None
    since: float | None = None
    until: float | None = None
    include_disabled: bool = True
    oldest_first: bool = False
    limit: int = 50
    offset: int = 0
    dated: bool = False


@dataclass(frozen=True)
class View:
    """One memory as a person sees it (the fields of ``actors.messages.MemoryView``)."""

    ref: str
    kind: Literal["turn", "episode", "fact"]
    item_id: int
    text: str
    created_at: float
    disabled: bool
    pinned: bool = False
    level: str | None = None
    channel: str | None = None
    source: str | None = None
    speaker: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    sensitive: bool = False  # runtime.memories.privacy: codes, health, money
    person: str | None = None  # whose memory it is (None: the household's)


# kind -> (table, FTS table, the time it was written, the rows browsing lists)
_TABLES: dict[str, tuple[str, str, str, str]] = {
    "turn": ("transcript", "transcript_fts", "created_at", "1"),
    "episode": ("episodes", "episodes_fts", "created_at", "tombstoned_at IS NULL"),
    "fact": ("facts", "facts_fts", "recorded_at", "1"),
}
# With ``dated`` (the timeline), when each memory happened: a turn when it was
# said, an episode when its conversation started, a fact when it became true
# (``valid_from``: for an extracted fact, the time of the turn it came from).
DATED = {"turn": "created_at", "episode": "coalesce(started_at, created_at)",
         "fact": "valid_from"}
# Ties in time are broken by kind, then id, so pages never overlap or skip.
_KIND_ORDER = {"turn": 0, "episode": 1, "fact": 2}


def browse(store: Store, params: BrowseParams) -> tuple[list[View], int]:
    """One page of memories and how many match over all pages (see the module
    docstring). An unknown kind is a ValueError."""
    kinds = list(dict.fromkeys(params.kinds))
    unknown = [k for k in kinds if k not in _TABLES]
    if unknown:
        raise ValueError(f"unknown memory kind {unknown[0]!r}: expected turn, episode or fact")
    expr: str | None = None
    if params.text is not None and params.text.strip():
        expr = all_terms(params.text)
        if expr is None:  # no searchable word: nothing contains all of them
            return [], 0
    if params.limit < 1 or params.offset < 0:
        raise ValueError("limit must be at least 1 and offset at least 0")
    parts: list[str] = []
    args: list[Any] = []
    for kind in kinds:
        table, fts, when, listed = _TABLES[kind]
        when = DATED[kind] if params.dated else when
        where = [listed]
        if not params.include_disabled:
            where.append("disabled = 0")
        if params.since is not None:
            where.append(f"{when} >= ?")
            args.append(params.since)
        if params.until is not None:
            where.append(f"{when} < ?")
            args.append(params.until)
        if expr is not None:
            where.append(f"id IN (SELECT rowid FROM {fts} WHERE {fts} MATCH ?)")
            args.append(expr)
        parts.append(f"SELECT '{kind}' AS kind, {_KIND_ORDER[kind]} AS k, id,"
                     f" {when} AS at FROM {table} WHERE {' AND '.join(where)}")
    union = " UNION ALL ".join(parts)
    total = int(store.scalar(f"SELECT count(*) FROM ({union})", args) or 0)
    if total <= params.offset:
        return [], total
    way = "ASC" if params.oldest_first else "DESC"
    keys = store.rows(f"SELECT kind, id FROM ({union}) ORDER BY at {way}, k {way}, id {way}"
                      " LIMIT ? OFFSET ?", [*args, params.limit, params.offset])
    return _views(store, [(str(r["kind"]), int(r["id"])) for r in keys]), total


def get(store: Store, ref: Ref) -> View | None:
    """The memory ``ref`` names, whatever its state (disabled, rolled up,
    superseded), or None when there is none."""
    found = _views(store, [(ref.kind, ref.id)])
    return found[0] if found else None


def _views(store: Store, keys: list[tuple[str, int]]) -> list[View]:
    """Views of ``keys``, in their order (keys with no row are left out)."""
    by_kind: dict[str, list[int]] = {}
    for kind, item_id in keys:
        by_kind.setdefault(kind, []).append(item_id)
    now = store.clock.now()
    made: dict[tuple[str, int], View] = {}
    for kind, ids in by_kind.items():
        table = _TABLES[kind][0]
        marks = ", ".join("?" for _ in ids)
        for row in store.rows(f"SELECT * FROM {table} WHERE id IN ({marks})", ids):
            made[(kind, int(row["id"]))] = _view(cast(Kind, kind), row, now)
    return [made[key] for key in keys if key in made]


def _view(kind: Kind, row: Row, now: float) -> View:
    view = _plain_view(kind, row, now)
    return replace(view, sensitive=bool(row.get("sensitive")),
                   person=privacy.row_person(kind, row))


def _plain_view(kind: Kind, row: Row, now: float) -> View:
    item_id = int(row["id"])
    ref = f"{kind}:{item_id}"
    disabled = bool(row["disabled"])
    if kind == "turn":
        who = row["speaker"] or row["role"]
        return View(ref=ref, kind=kind, item_id=item_id, text=f"{who}: {row['content']}",
                    created_at=row["created_at"], disabled=disabled,
                    channel=row["channel"], source=row["source"], speaker=who,
                    details={"role": row["role"], "speaker": row["speaker"],
                             "channel": row["channel"], "source": row["source"],
                             "memory": bool(row["memory"])})
    level = str(row["memory_level"])
    if kind == "episode":
        tombstoned = row["tombstoned_at"] is not None
        weight = episode_weight(row["level"], row["last_relevant_at"], now,
                                tombstoned=tombstoned, memory_level=cast(MemoryLevel, level))
        return View(ref=ref, kind=kind, item_id=item_id, text=str(row["gist"]),
                    created_at=row["created_at"], disabled=disabled,
                    pinned=level == PINNED_LEVEL, level=level, channel=row["channel"],
                    source=row["source"],
                    details={"salience": row["salience"], "emotion": row["emotion"],
                             "weight": round(weight, 4), "level": row["level"],
                             "level_name": EPISODE_LEVELS.get(row["level"]),
                             "started_at": row["started_at"], "ended_at": row["ended_at"],
                             "last_relevant_at": row["last_relevant_at"],
                             "rolled_up_into": row["parent_id"] if tombstoned else None})
    return View(ref=ref, kind=kind, item_id=item_id, text=fact_text(row),
                created_at=row["recorded_at"], disabled=disabled,
                pinned=level == PINNED_LEVEL, level=level, source=row["source"],
                details={"kind": row["kind"], "subject": row["subject"], "key": row["key"],
                         "value": row["value"], "confidence": row["confidence"],
                         "valid_from": row["valid_from"], "valid_to": row["valid_to"],
                         "superseded_by": row["superseded_by"],
                         "user_managed": bool(row["user_managed"]),
                         "current": row["valid_to"] is None})


def fact_text(row: Row) -> str:
    """A fact as :func:`runtime.recall.rendering.render_fact` renders it, without its dates:
    a value that reads on its own (a user's note) is that sentence, behind its
    subject unless the subject is the user; any other fact ``subject key: value``
    with the key's underscores as spaces."""
    subject = str(row["subject"]).strip()
    value = str(row["value"]).strip()
    if _reads_alone(value, bool(row["user_managed"])):
        return value if subject.casefold() == USER_SUBJECT else f"{subject}: {value}"
    key = " ".join(str(row["key"]).replace("_", " ").split())
    return f"{subject} {key}: {value}"
