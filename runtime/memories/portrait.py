"""The portrait: a running, cited summary of the household, kept as versions.

The ``synthesis`` job (:mod:`runtime.mind.synthesis`) writes a new version
when the facts it is made from have changed since the last one, offline or
with a language model.

A version is a list of lines in five sections (:data:`SECTIONS`): who they
are, the people around them, preferences, routines and current concerns. Every
line cites the memories it rests on (``fact:N``, ``episode:N``).

Versions are rows of ``portraits`` (migration 0012), written through the job
writer (``ctx.writer.add_portrait``: the Graph actor in the actor runtime,
:class:`runtime.memory.Memory` in-process), with the write log, by writer
``synthesis``. What the prompt sees is the latest version less the lines whose
sources are no longer current (superseded, disabled or forgotten since):
:class:`PortraitReader`, cached by version, used by the Turns actor.

Recall (:mod:`runtime.recall.hybrid`) does not return portrait lines: it ranks
individual turns, episodes and facts against the query, and each portrait
line is a summary of facts and episodes that recall can already find; the
portrait reaches the model as its own section of the system prompt instead.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from runtime.memories import privacy
from runtime.memories.cited import refuse_stale
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

WRITER = "synthesis"
TABLE = "portraits"

Section = Literal["who", "people", "preferences", "routines", "concerns"]
SECTIONS: dict[str, str] = {
    "who": "Who they are",
    "people": "The people around them",
    "preferences": "Preferences",
    "routines": "Routines",
    "concerns": "Current concerns",
}
MAX_LINES = 40
MAX_LINE_CHARS = 300
MAX_LINE_REFS = 12
SOURCE_REF = r"^(fact|episode):[1-9][0-9]{0,17}$"
SourceRef = Annotated[str, Field(pattern=SOURCE_REF, max_length=40)]


# -- what a version holds ----------------------------------------------------------


def one_line(value: str) -> str:
    """A model's line of text on one line, its spaces squashed; ValueError if empty."""
    value = " ".join(value.split())
    if not value:
        raise ValueError("the line is empty")
    return value


#: A line a model wrote: one line, spaces squashed, not empty.
OneLine = Annotated[str, AfterValidator(one_line)]


class PortraitLine(BaseModel):
    """One line of the portrait and the memories it rests on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    section: Section
    text: OneLine = Field(min_length=1, max_length=MAX_LINE_CHARS)
    refs: list[SourceRef] = Field(min_length=1, max_length=MAX_LINE_REFS)



class PortraitIn(BaseModel):
    """A new version of the portrait. ``signature`` names the facts it was made
    from; ``how``: offline, by the language model, or offline because the
    model failed (``fallback``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lines: list[PortraitLine] = Field(min_length=1, max_length=MAX_LINES)
    signature: str = Field(min_length=1, max_length=128)
    how: Literal["offline", "llm", "fallback"] = "offline"


@dataclass(frozen=True)
class Portrait:
    id: int
    created_at: float
    signature: str
    how: str
    lines: tuple[PortraitLine, ...]

    @classmethod
    def of(cls, row: Row) -> Portrait:
        lines = tuple(PortraitLine.model_validate(x) for x in json.loads(row["lines"]))
        return cls(int(row["id"]), float(row["created_at"]), str(row["signature"]),
                   str(row["how"]), lines)


class PortraitService:
    """The ``portraits`` table: versions, appended through the write log."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, portrait: PortraitIn, writer: str = WRITER) -> int:
        """Append a version. One whose lines cite a fact or episode no longer
        stored (forgotten since the job read it) is refused whole,
        :class:`runtime.memories.cited.StaleCitation`: a model wrote every line
        from every fact it was given, so no line is kept."""
        with self.store.write_transaction():
            refuse_stale(self.store, "portrait",
                         (r for line in portrait.lines for r in line.refs))
            return self.store.insert(writer, TABLE, {
                "created_at": self.store.clock.now(), "signature": portrait.signature,
                "how": portrait.how,
                "lines": json.dumps([line.model_dump() for line in portrait.lines]),
            })

    def latest(self) -> Portrait | None:
        row = self.store.row(f"SELECT * FROM {TABLE} ORDER BY id DESC LIMIT 1")
        return None if row is None else Portrait.of(row)

    def get(self, portrait_id: int) -> Portrait | None:
        row = self.store.row(f"SELECT * FROM {TABLE} WHERE id = ?", (portrait_id,))
        return None if row is None else Portrait.of(row)

    def versions(self) -> int:
        return int(self.store.scalar(f"SELECT count(*) FROM {TABLE}"))


def current_refs(store: Store, refs: Iterable[str]) -> set[str]:
    """The refs of ``refs`` that still name a current memory: an enabled fact
    whose window is open, an enabled episode; neither marked sensitive since
    (``runtime.memories.privacy``: a portrait line citing one is no longer shown)."""
    facts: list[int] = []
    episodes: list[int] = []
    for ref in set(refs):
        kind, _, number = ref.partition(":")
        if number.isdigit():
            (facts if kind == "fact" else episodes if kind == "episode" else []).append(
                int(number))
    live: set[str] = set()
    for table, kind, ids, where in (
            ("facts", "fact", facts,
             f"disabled = 0 AND valid_to IS NULL AND {privacy.SHAREABLE}"),
            ("episodes", "episode", episodes, f"disabled = 0 AND {privacy.SHAREABLE}")):
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" for _ in part)
            live.update(f"{kind}:{r[0]}" for r in store.conn.execute(
                f"SELECT id FROM {table} WHERE id IN ({marks}) AND {where}", part))
    return live


def shown_lines(store: Store, portrait: Portrait) -> list[PortraitLine]:
    """The lines of ``portrait`` every source of which is still current."""
    live = current_refs(store, (r for line in portrait.lines for r in line.refs))
    return [line for line in portrait.lines if all(r in live for r in line.refs)]


class PortraitReader:
    """The latest portrait for the prompt: parsed once per version, its lines
    checked against the memories they cite on every read (a fact forgotten or
    disabled since the version was written is not shown). Thread-safe; the
    store is opened on first use. Any failure reads as no portrait."""

    def __init__(self, open_store: Callable[[], Store]) -> None:
        self._open = open_store
        self._store: Store | None = None
        self._cached: Portrait | None = None
        self._lock = threading.Lock()

    def lines(self) -> list[PortraitLine]:
        with self._lock:
            try:
                if self._store is None:
                    self._store = self._open()
                store = self._store
                latest = store.scalar(f"SELECT max(id) FROM {TABLE}")
                if latest is None:
                    return []
                if self._cached is None or self._cached.id != int(latest):
                    self._cached = PortraitService(store).get(int(latest))
                return [] if self._cached is None else shown_lines(store, self._cached)
            except Exception as exc:  # a portrait never costs a turn
                log.warning("portrait unavailable: %s", type(exc).__name__)
                return []

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def latest_portrait(store: Store) -> list[PortraitLine]:
    """The latest portrait's lines still backed by current memories (for jobs
    that read the portrait: dmn, research)."""
    portrait = PortraitService(store).latest()
    return [] if portrait is None else shown_lines(store, portrait)
