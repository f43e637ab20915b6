"""References to memory items (``turn:12``, ``episode:3``, ``fact:7``) and what a
user may do to them: find them by their words, disable, enable or delete them,
pin or unpin them, edit what they say.

The policy lives in the services: the transcript, episode and graph services
each offer ``get``, ``set_disabled`` and ``forget`` (:class:`MemoryService`);
every ``forget`` scrubs the write log. Episodes and facts also have a memory
level, which ``set_level`` changes (pin: ``seared``, the level that never
fades; unpin: back to ``vivid``), and can be edited (an episode's gist is
rewritten; a fact gets a new claim that supersedes it, history kept). Turns
have no level and are never edited: the transcript is append-only.
:func:`change` and :func:`edit` only dispatch. Disabling is reversible and
keeps the content; the caller also drops a disabled item's vector from its
index (and hands an enabled or edited one back to the indexer), since the
index lives with the caller.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from runtime.memories import privacy
from runtime.memories.decay import MemoryLevel
from runtime.memories.episodes import EpisodeService
from runtime.memories.facts import GraphService
from runtime.memories.transcript import TranscriptService
from runtime.store.database import Row, Store
from runtime.store.fts import query_terms

log = logging.getLogger(__name__)

Kind = Literal["turn", "episode", "fact"]
Action = Literal["disable", "enable", "delete", "pin", "unpin", "sensitive", "not_sensitive"]
KINDS: tuple[str, ...] = get_args(Kind)
ACTIONS: tuple[str, ...] = get_args(Action)
PINNED: MemoryLevel = "seared"  # never fades (runtime.memories.decay)
UNPINNED: MemoryLevel = "vivid"  # what an unpinned item falls back to


class NoSuchItem(ValueError):
    """The reference names no stored item."""


@dataclass(frozen=True)
class Ref:
    kind: Kind
    id: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


def turn_ids(refs: Iterable[str]) -> list[int]:
    """The ids of the turn refs among ``refs`` (``"turn:12"`` -> 12), in order;
    anything else is passed over."""
    return [int(r[5:]) for r in refs
            if r.startswith("turn:") and r[5:].isascii() and r[5:].isdigit()]


def parse_ref(text: str) -> Ref:
    """``"turn:12"`` -> ``Ref("turn", 12)``; ValueError, saying what is expected, otherwise."""
    kind, sep, number = text.strip().partition(":")
    if not sep or kind not in KINDS or not number.isascii() or not number.isdigit():
        raise ValueError(
            f"bad reference {text!r}: expected turn:<id>, episode:<id> or fact:<id>, "
            "e.g. turn:12")
    item_id = int(number)
    if item_id < 1:
        raise ValueError(f"bad reference {text!r}: ids start at 1")
    return Ref(kind, item_id)  # type: ignore[arg-type]  # kind checked against KINDS


@dataclass(frozen=True)
class Match:
    ref: Ref
    text: str
    created_at: float
    disabled: bool


# (kind, FTS table, content table, the text shown, when it was written)
_SEARCHED: tuple[tuple[Kind, str, str, str, str], ...] = (
    ("turn", "transcript_fts", "transcript",
     "coalesce(c.speaker, c.role) || ': ' || c.content", "c.created_at"),
    ("episode", "episodes_fts", "episodes", "c.gist", "c.created_at"),
    ("fact", "facts_fts", "facts", "c.subject || ' ' || c.key || ': ' || c.value",
     "c.recorded_at"),
)


def all_terms(text: str) -> str | None:
    """An FTS5 expression matching rows that contain every word of ``text``.

    Words come from :func:`runtime.store.fts.query_terms` and are quoted, so user
    text is never FTS5 syntax. All of them must match (not any, as in recall):
    this finds what to delete, so it should be narrow."""
    terms = query_terms(text)
    if not terms:
        return None
    return " AND ".join('"' + t.replace('"', '""') + '"' for t in terms)


def find_matching(store: Store, text: str, limit: int = 20) -> list[Match]:
    """Turns, episodes and facts (disabled or not) containing every word of
    ``text``, best keyword match first, at most ``limit``; then the turns whose
    stored tool calls do (:func:`tool_matches`), within the same limit."""
    expr = all_terms(text)
    if expr is None or limit < 1:
        return []
    found = _memory_matches(store, expr, limit)
    found += tool_matches(store, query_terms(text), {str(m.ref) for m in found},
                          limit - len(found))
    return found


def tool_matches(store: Store, terms: list[str], refs: set[str], limit: int) -> list[Match]:
    """The turns whose tool calls hold every one of ``terms`` (whole words, any
    case), newest first, at most ``limit``: a client tool's result (the voice
    layer keeps them), the arguments the model called a tool with, or the
    pull-mode recall tool's answer. A turn is named (``turn:N``) since a tool
    call is part of the turn it was made for and goes with it.

    The recall tool's answer holds one ``- [ref] text`` line per memory; the
    lines of memories in ``refs`` (found already) are left out of the search:
    forgetting those memories takes their lines out of the answer
    (:mod:`runtime.memories.derived`), and the turn need not go with them. The
    table has no full-text index: a scan (``LIKE`` on the longest term, then
    every term as a whole word), over the tool calls only."""
    if not terms or limit < 1:
        return []
    words = [re.compile(rf"(?<!\w){re.escape(t)}(?!\w)", re.IGNORECASE) for t in terms]
    like = "%" + max(terms, key=len).replace("\\", "\\\\").replace("%", "\\%").replace(
        "_", "\\_") + "%"
    marks = [f"[{r}]" for r in refs]
    seen: dict[int, Match] = {}
    for row in store.rows(
            "SELECT c.transcript_id AS turn, c.name AS name, c.arguments AS arguments,"
            " c.result AS result, c.created_at AS created_at, t.disabled AS disabled"
            " FROM tool_calls c JOIN transcript t ON t.id = c.transcript_id"
            " WHERE c.result LIKE :like ESCAPE '\\' OR c.arguments LIKE :like ESCAPE '\\'"
            " ORDER BY c.id DESC", {"like": like}):
        turn = int(row["turn"])
        if turn in seen or f"turn:{turn}" in refs:
            continue
        result = "\n".join(line for line in str(row["result"] or "").split("\n")
                           if not any(m in line for m in marks))
        said = f"{row['arguments']}\n{result}"
        if all(w.search(said) for w in words):
            shown = " ".join(f"tool {row['name']}: {result}".split())
            seen[turn] = Match(Ref("turn", turn), shown[:300], float(row["created_at"]),
                               bool(row["disabled"]))
            if len(seen) >= limit:
                break
    return list(seen.values())


def _memory_matches(store: Store, expr: str, limit: int) -> list[Match]:
    """Turns, episodes and facts matching the FTS5 expression ``expr``."""
    scored: list[tuple[float, Match]] = []
    for kind, fts, table, shown, when in _SEARCHED:
        rows = store.rows(
            f"SELECT f.rowid AS id, f.rank AS rank, {shown} AS text, {when} AS created_at,"
            f" c.disabled AS disabled FROM {fts} f JOIN {table} c ON c.id = f.rowid"
            f" WHERE {fts} MATCH ? ORDER BY f.rank LIMIT ?", (expr, limit))
        scored.extend(
            (r["rank"], Match(Ref(kind, r["id"]), r["text"], r["created_at"],
                              bool(r["disabled"])))
            for r in rows)
    scored.sort(key=lambda s: (s[0], -s[1].created_at))
    return [m for _, m in scored[:limit]]


class MemoryService(Protocol):
    """What a service that owns one kind of memory item offers a user."""

    store: Store

    def get(self, item_id: int) -> Row | None: ...

    def set_disabled(self, item_id: int, disabled: bool, writer: str = ...) -> Row: ...

    def forget(self, item_id: int, writer: str = ...) -> Row | None: ...


@dataclass(frozen=True)
class Services:
    """The services that own each kind of memory item."""

    transcript: TranscriptService
    episodes: EpisodeService
    graph: GraphService

    def owner(self, kind: Kind) -> MemoryService:
        if kind == "turn":
            return self.transcript
        if kind == "episode":
            return self.episodes
        return self.graph

    def get(self, ref: Ref) -> Row | None:
        return self.owner(ref.kind).get(ref.id)


def change(service: MemoryService, ref: Ref, action: Action, writer: str) -> None:
    """Disable, enable, delete (forget for good), pin or unpin the item ``ref``
    names, through the service that owns its kind, or mark it sensitive (or
    not: ``sensitive``, ``not_sensitive``; :func:`runtime.memories.privacy.mark`).

    Pinning sets an episode's or a fact's memory level to ``seared`` (it never
    fades); unpinning a pinned one sets it to ``vivid``, and leaves an item that
    is not pinned as it is. A turn has no level: pinning one is a ValueError.

    Raises :class:`NoSuchItem` when there is none, ValueError for an unknown action."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: expected one of {', '.join(ACTIONS)}")
    if service.get(ref.id) is None:
        raise NoSuchItem(f"no {ref.kind} {ref.id}")
    if action == "delete":
        service.forget(ref.id, writer)
        service.store.reset_wal()  # no frame of it left in the WAL (Store.reset_wal)
    elif action in ("pin", "unpin"):
        _set_pinned(service, ref, action == "pin", writer)
    elif action in (privacy.MARK, privacy.UNMARK):  # any kind; logged
        privacy.mark(service.store, ref.kind, ref.id, action == privacy.MARK, writer)
    else:
        service.set_disabled(ref.id, action == "disable", writer)
    log.info("memory item changed", extra={"ref": str(ref), "action": action})


def _set_pinned(service: MemoryService, ref: Ref, pinned: bool, writer: str) -> None:
    if not isinstance(service, (EpisodeService, GraphService)):
        raise ValueError(f"{ref.kind}s cannot be pinned: only episodes and facts have a "
                         f"memory level ({ref} can be disabled or deleted instead)")
    row = service.get(ref.id)
    assert row is not None  # checked by the caller
    if pinned:
        level: MemoryLevel = PINNED
    elif row["memory_level"] == PINNED:
        level = UNPINNED
    else:  # not pinned: nothing to undo
        return
    if row["memory_level"] != level:
        service.set_level(ref.id, level, writer)


def edit(service: MemoryService, ref: Ref, text: str, writer: str) -> Ref:
    """Change what the item ``ref`` names says; return the ref that now holds
    ``text``. An episode's gist is rewritten in place (same ref); a fact gets a
    new user-managed claim for its subject and key that supersedes it (a new
    ref; the old one stays as history). A turn is refused: the transcript is
    append-only.

    Raises :class:`NoSuchItem` when there is none, ValueError when the edit is
    refused (a turn, a fact that is history already, empty text)."""
    if service.get(ref.id) is None:
        raise NoSuchItem(f"no {ref.kind} {ref.id}")
    if isinstance(service, EpisodeService):
        service.edit(ref.id, text, writer)
        new = ref
    elif isinstance(service, GraphService):
        fact_id, _ = service.edit(ref.id, text, writer)
        new = Ref("fact", fact_id)
    else:
        raise ValueError(f"{ref.kind}s cannot be edited: the transcript is append-only "
                         f"(disable or delete {ref} instead)")
    log.info("memory item edited", extra={"ref": str(ref), "now": str(new)})
    return new
