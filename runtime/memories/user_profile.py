"""The user profile with a lifecycle (issue 12, ChatCLI's "profile merging").

Fields (:data:`SCALARS`, :data:`LISTS`): scalars hold one value (``name``,
``role``, ``location``, ``language``, ``company``, ``expertise``, ``style``),
lists many (``goals``, ``skills``, ``interests``, ``certifications``,
``directives``, ``milestones``, ``stances``; the singular names are accepted
too). Operations, written ``FIELD=VALUE`` (:func:`parse_assignment`):

- ``FIELD=VALUE``: a scalar is set (the old value is ``replaced``; an empty
  value clears it); a list **upserts** its items: an item restated (the same
  text apart from case, parentheticals and status words such as "done" or "in
  progress": :func:`norm`) supersedes the old one (``replaced``, with
  ``replaced_by``) instead of adding a duplicate; the very same text only
  confirms it (``updated_at``).
- ``FIELD_done=VALUE``: the matching active items are ``done``; a finished
  goal becomes a milestone (``goals_done=earn the CKA``).
- ``FIELD_remove=VALUE``: the matching active items are ``removed``.
- ``FIELD_replace=VALUE``: every active item of the list is ``replaced`` by the
  items given; an empty value clears the list.

Goals, skills, interests and certifications take several items separated by
commas (a comma inside parentheses stays inside its item: ``"Quiz X (Provider,
60 questions)"`` is one item); a directive, milestone or stance is one item per
assignment (a rule may hold commas).

**Directives** may start with tags: ``[scope:NAME]`` and ``[hard]`` / ``[soft]``
(default soft: a preference; hard: a rule). A scope names a **channel**
(``voice``, ``chat``, …) or a **person** (the turn's speaker), compared without
case: a scoped directive reaches the prompt only on a turn whose channel or
speaker is that name; without a scope it applies everywhere. The same rule
under two scopes is two directives.

Nothing is ever deleted: ``profile_items`` (migration 0018) keeps every item
with its status (``active``, ``done``, ``removed``, ``replaced``) and times, so
a removed goal is still in the history. A batch of operations is applied all or
nothing: an unknown field, a malformed assignment, an operation on nothing
(``goals_done=`` naming no active goal) is a ValueError and writes nothing.
Written through one path: :class:`ProfileService` on the Graph actor
(``UpdateProfile``) or :class:`runtime.memory.Memory` in process, with the
write log.

The prompt's section (:func:`profile_section`, :func:`section_for` for the
Turns actor): the active scalars and list items, and the directives in scope,
bounded to :data:`PROFILE_CHARS`. An unknown speaker on a spoken channel (a
guest at the voice satellite: ``runtime.memories.privacy``) gets the directives only,
never the profile's fields.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

TABLE = "profile_items"
SCALARS = ("name", "role", "location", "language", "company", "expertise", "style")
LISTS = ("goals", "skills", "interests", "certifications", "directives", "milestones",
         "stances")
FIELDS = SCALARS + LISTS
COMMA_LISTS = frozenset(("goals", "skills", "interests", "certifications"))
ALIASES = {"goal": "goals", "skill": "skills", "interest": "interests",
           "certification": "certifications", "directive": "directives",
           "milestone": "milestones", "stance": "stances"}
SUFFIXES = ("done", "remove", "replace")
MAX_VALUE = 500
MAX_ITEMS = 40  # active items a list may hold
PROFILE_HEADING = "# About the user"
PROFILE_INSTRUCTION = (
    "What the user has told you about themselves (their profile). Use it when it helps; "
    "follow their directives; what the user says now wins over it.")
PROFILE_CHARS = 1500

Op = Literal["set", "done", "remove", "replace"]
Status = Literal["active", "done", "removed", "replaced"]


class ProfileOp(BaseModel):
    """One profile operation: ``field`` (canonical name), ``op``, ``value``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(min_length=1, max_length=40)
    op: Op = "set"
    value: str = Field(default="", max_length=MAX_VALUE)

    @model_validator(mode="after")
    def _valid(self) -> ProfileOp:
        if self.field not in FIELDS:
            raise ValueError(f"unknown profile field {self.field!r}; known: "
                             f"{', '.join(FIELDS)}")
        if self.op != "set" and self.field not in LISTS:
            raise ValueError(f"{self.field} is not a list: {self.field}_{self.op} is only "
                             f"for {', '.join(LISTS)}")
        if self.op in ("done", "remove") and not self.value.strip():
            raise ValueError(f"{self.field}_{self.op} needs the item(s) to {self.op}")
        if self.op == "set" and self.field in LISTS and not self.value.strip():
            raise ValueError(f"{self.field}= needs a value (to clear the list: "
                             f"{self.field}_replace=)")
        return self


def parse_assignment(text: str) -> ProfileOp:
    """``"goals_done=earn the CKA"`` as an operation; ValueError naming what is wrong."""
    name, eq, value = text.partition("=")
    name = name.strip().lower()
    if not eq or not name or not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"expected FIELD=VALUE (e.g. goals=learn Go), got {text!r}")
    op: Op = "set"
    for suffix in SUFFIXES:
        if name.endswith("_" + suffix):
            name, op = name[: -len(suffix) - 1], suffix  # type: ignore[assignment]
            break
    field = ALIASES.get(name, name)
    if field not in FIELDS:
        raise ValueError(f"unknown profile field {name!r}; known: {', '.join(FIELDS)}")
    return ProfileOp(field=field, op=op, value=" ".join(value.split()))


def split_items(field: str, value: str) -> list[str]:
    """The items of a value: comma-separated (outside parentheses) for the comma
    lists, one item otherwise; blanks dropped."""
    value = " ".join(value.split())
    if field not in COMMA_LISTS:
        return [value] if value else []
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in value:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


_STATUS_WORDS = re.compile(
    r"\b(done|completed?|finished|in progress|ongoing|wip|todo|to do|planned|pending)\b")
_TAG = re.compile(r"^\s*\[([^\]]*)\]")


def norm(text: str) -> str:
    """The match key of an item: case, parentheticals, status words and
    punctuation removed. ``"Earn the CKA (in progress)"`` → ``"earn the cka"``."""
    t = re.sub(r"\([^()]*\)", " ", text.casefold())
    t = _STATUS_WORDS.sub(" ", t)
    t = re.sub(r"[^\w]+", " ", t)
    return " ".join(t.split())


@dataclass(frozen=True)
class Item:
    text: str
    scope: str | None = None
    severity: Literal["hard", "soft"] | None = None


def parse_item(field: str, text: str) -> Item:
    """An item's text, and for a directive its leading ``[scope:NAME]`` and
    ``[hard]``/``[soft]`` tags; ValueError for an unknown tag or no text."""
    scope: str | None = None
    severity: Literal["hard", "soft"] | None = None
    if field == "directives":
        severity = "soft"
        while (m := _TAG.match(text)) is not None:
            tag = m.group(1).strip()
            key, colon, rest = tag.partition(":")
            if colon and key.strip().lower() == "scope" and rest.strip():
                scope = " ".join(rest.split()).casefold()
            elif tag.lower() in ("hard", "soft"):
                severity = "hard" if tag.lower() == "hard" else "soft"
            else:
                raise ValueError(f"unknown directive tag [{tag}] (known: [scope:NAME], "
                                 "[hard], [soft])")
            text = text[m.end():]
    text = " ".join(text.split())
    if not text or not norm(text):
        raise ValueError(f"{field}: an item needs some text")
    return Item(text, scope, severity)


@dataclass(frozen=True)
class ProfileItem:
    id: int
    field: str
    value: str
    scope: str | None
    severity: str | None
    status: str
    source: str
    created_at: float
    updated_at: float
    ended_at: float | None

    @classmethod
    def of(cls, row: Row) -> ProfileItem:
        return cls(int(row["id"]), str(row["field"]), str(row["value"]), row["scope"],
                   row["severity"], str(row["status"]), str(row["source"]),
                   float(row["created_at"]), float(row["updated_at"]),
                   None if row["ended_at"] is None else float(row["ended_at"]))

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "field": self.field, "value": self.value, "scope": self.scope,
                "severity": self.severity, "status": self.status, "source": self.source,
                "created_at": self.created_at, "updated_at": self.updated_at,
                "ended_at": self.ended_at}


class ProfileService:
    """The ``profile_items`` table; every change through the write log."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(self, ops: Sequence[ProfileOp], source: str = "user",
              writer: str = "graph") -> list[str]:
        """Apply ``ops`` in order, all or nothing; return one line per change
        (fields and counts, never the items' text). ValueError: nothing written."""
        if not ops:
            raise ValueError("no profile operation given")
        changes: list[str] = []
        with self.store.write_transaction():
            for op in ops:
                changes.append(self._apply(op, source, writer))
        return changes

    def _active(self, field: str) -> list[Row]:
        return self.store.rows(f"SELECT * FROM {TABLE} WHERE field = ? AND status = 'active'"
                               " ORDER BY id", (field,))

    def _end(self, row: Row, status: Status, writer: str,
             replaced_by: int | None = None) -> None:
        now = self.store.clock.now()
        changes: dict[str, Any] = {"status": status, "ended_at": now, "updated_at": now}
        if replaced_by is not None:
            changes["replaced_by"] = replaced_by
        self.store.update(writer, TABLE, int(row["id"]), changes)

    def _insert(self, field: str, item: Item, source: str, writer: str) -> int:
        now = self.store.clock.now()
        return self.store.insert(writer, TABLE, {
            "field": field, "value": item.text, "norm": norm(item.text), "scope": item.scope,
            "severity": item.severity, "status": "active", "source": source,
            "created_at": now, "updated_at": now})

    def _upsert(self, field: str, item: Item, source: str, writer: str) -> str:
        key = norm(item.text)
        same = [r for r in self._active(field) if r["norm"] == key and r["scope"] == item.scope]
        if same and same[0]["value"] == item.text and same[0]["severity"] == item.severity:
            self.store.update(writer, TABLE, int(same[0]["id"]),
                              {"updated_at": self.store.clock.now(), "source": source})
            return "confirmed"
        if field in LISTS and not same and len(self._active(field)) >= MAX_ITEMS:
            raise ValueError(f"{field} already holds {MAX_ITEMS} items; remove some first")
        new_id = self._insert(field, item, source, writer)
        for row in same:
            self._end(row, "replaced", writer, new_id)
        return "superseded" if same else "added"

    def _apply(self, op: ProfileOp, source: str, writer: str) -> str:
        field = op.field
        if field in SCALARS:
            old = self._active(field)
            if not op.value:
                for row in old:
                    self._end(row, "removed", writer)
                return f"{field}: cleared" if old else f"{field}: already empty"
            item = Item(op.value)
            if old and old[0]["value"] == item.text:
                return f"{field}: {self._upsert(field, item, source, writer)}"
            new_id = self._insert(field, item, source, writer)
            for row in old:
                self._end(row, "replaced", writer, new_id)
            return f"{field}: set"
        items = [parse_item(field, text) for text in split_items(field, op.value)]
        if op.op == "set":
            done = [self._upsert(field, item, source, writer) for item in items]
            return f"{field}: " + ", ".join(f"{done.count(w)} {w}" for w in
                                            ("added", "superseded", "confirmed")
                                            if done.count(w))
        if op.op == "replace":
            old = self._active(field)
            for row in old:
                self._end(row, "replaced", writer)
            for item in items:
                self._upsert(field, item, source, writer)
            return f"{field}: {len(old)} replaced by {len(items)}"
        status: Status = "done" if op.op == "done" else "removed"
        ended = 0
        for item in items:
            key = norm(item.text)
            matches = [r for r in self._active(field) if r["norm"] == key
                       and (item.scope is None or r["scope"] == item.scope)]
            if not matches:
                raise ValueError(f"{field}_{op.op}: no active item of {field} matches "
                                 f"{item.text!r}")
            for row in matches:
                self._end(row, status, writer)
                ended += 1
                if field == "goals" and status == "done":
                    self._upsert("milestones", Item(str(row["value"])), source, writer)
        moved = " (now milestones)" if field == "goals" and status == "done" else ""
        return f"{field}: {ended} {status}{moved}"

    def items(self, include_ended: bool = False) -> list[ProfileItem]:
        where = "" if include_ended else "WHERE status = 'active'"
        return [ProfileItem.of(r) for r in self.store.rows(
            f"SELECT * FROM {TABLE} {where} ORDER BY id")]


def profile_fields(items: Iterable[ProfileItem]) -> dict[str, Any]:
    """The active profile as ``{field: value}`` (scalars) / ``{field: [values]}``
    (lists), directives as ``{"text", "scope", "severity"}``, in field order."""
    active = [i for i in items if i.status == "active"]
    out: dict[str, Any] = {}
    for field in FIELDS:
        mine = [i for i in active if i.field == field]
        if not mine:
            continue
        if field in SCALARS:
            out[field] = mine[-1].value
        elif field == "directives":
            out[field] = [{"text": i.value, "scope": i.scope, "severity": i.severity}
                          for i in mine]
        else:
            out[field] = [i.value for i in mine]
    return out


def in_scope(item: ProfileItem, channel: str | None, speaker: str | None) -> bool:
    """Whether a directive applies on a turn of ``channel`` by ``speaker``."""
    if item.scope is None:
        return True
    names = {n.casefold() for n in (channel, speaker) if n}
    return item.scope.casefold() in names


def profile_section(items: Sequence[ProfileItem], channel: str | None, speaker: str | None,
                    limit: int = PROFILE_CHARS, stranger: bool = False) -> str:
    """The prompt's profile section: active fields, then the directives in scope
    (hard ones first); "" when there is nothing. A ``stranger`` (an unknown
    speaker on a spoken channel: ``runtime.memories.privacy``) is told nothing of the
    profile's fields; the directives still apply. Bounded to ``limit`` characters
    (directives kept first, then fields in order)."""
    active = [i for i in items if i.status == "active"]
    directives = sorted((i for i in active if i.field == "directives"
                         and in_scope(i, channel, speaker)),
                        key=lambda i: (i.severity != "hard", i.id))
    rules = [f"- {'(always) ' if d.severity == 'hard' else ''}{' '.join(d.value.split())}"
             for d in directives]
    fields = {} if stranger else profile_fields(i for i in active if i.field != "directives")
    lines = []
    for field, value in fields.items():
        text = value if isinstance(value, str) else "; ".join(value)
        lines.append(f"- {field}: {' '.join(text.split())}")
    body: list[str] = []
    used = len(PROFILE_HEADING) + len(PROFILE_INSTRUCTION) + 2
    for group, heading in ((rules, "Directives:"), (lines, "Profile:")):
        kept: list[str] = []
        for line in group:
            cost = len(line) + 1 + (0 if kept else len(heading) + 1)
            if used + cost > limit:
                break
            kept.append(line)
            used += cost
        if kept:
            body += [heading, *kept]
    if not body:
        return ""
    return "\n".join((PROFILE_HEADING, PROFILE_INSTRUCTION, *body))


def section_for(store: Store, channel: str | None, speaker: str | None,
                stranger: bool = False) -> str:
    """The profile section for a turn's prompt, from the store."""
    return profile_section(ProfileService(store).items(), channel, speaker, stranger=stranger)


