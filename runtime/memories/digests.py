"""Digests: daily notes roll up into weekly and then monthly digests (the trajectory).

They are written by the ``synthesis`` job's digest step
(:mod:`runtime.mind.digest_job`: when a period is ready, what a digest is made
from, retention), one per period local to the household's time zone: a
**daily note** (key ``2026-06-30``), a **weekly digest** (``2026-W27``, ISO
weeks), a **monthly digest** (``2026-06``). Every digest is grounded in
**episodes**: its ``refs`` are what it was made from: the episodes, and for
a digest a language model wrote, the turns whose lines it was given
(``turn:N``) and the digests it was given as colour (``digest:N``). Forgetting
any of them forgets it (:mod:`runtime.memories.derived`), and one forgotten
while the job works has it refused (:mod:`runtime.memories.cited`).

:class:`DigestService` writes them (``ctx.writer.write_digests``: the Graph
actor in the actor runtime, :class:`runtime.memory.Memory` in process), with
the write log, by writer ``synthesis``, and deletes those past retention;
**monthlies are kept forever** (the service refuses to delete one).

The prompt's **Trajectory** section (:func:`trajectory_for`, used by the
Turns actor): the latest monthly and the weeklies after it (at most
``TRAJECTORY_WEEKS``), bounded to ``TRAJECTORY_CHARS``. A digest one of whose
episodes or turns has since become sensitive, been disabled or forgotten is
not shown (nor by ``reverie digest``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.memories.cited import refuse_stale
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

WRITER = "synthesis"
TABLE = "digests"
Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = ("day", "week", "month")
KEY_PATTERNS: dict[str, str] = {
    "day": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    "week": r"^[0-9]{4}-W[0-9]{2}$",
    "month": r"^[0-9]{4}-[0-9]{2}$",
}
MAX_TEXT = 1200
MAX_REFS = 200
MAX_BATCH = 200
TRAJECTORY_HEADING = "# Trajectory"
TRAJECTORY_INSTRUCTION = (
    "What the household has been doing these past weeks and months, from your own "
    "digests of your memories (oldest first). Use it for the long view; what the user "
    "says now wins over it.")
TRAJECTORY_WEEKS = 4
TRAJECTORY_CHARS = 1600
#: What a digest is made from: an episode; for a language model's digest also a turn
#: whose line it was given, and a digest it was given as colour.
SourceRef = Annotated[str, Field(pattern=r"^(episode|turn|digest):[1-9][0-9]{0,17}$",
                                 max_length=40)]


class DigestIn(BaseModel):
    """One digest to store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    period: Period
    key: str = Field(min_length=7, max_length=10)
    starts_at: float
    ends_at: float
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    refs: list[SourceRef] = Field(default_factory=list, max_length=MAX_REFS)
    how: Literal["offline", "llm", "fallback"] = "offline"

    @model_validator(mode="after")
    def _consistent(self) -> DigestIn:
        if not re.match(KEY_PATTERNS[self.period], self.key):
            raise ValueError(f"key {self.key!r} is not a {self.period} key")
        if self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        return self


class DigestBatch(BaseModel):
    """Digests to add and digest ids to delete (retention), in one transaction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digests: list[DigestIn] = Field(default_factory=list, max_length=MAX_BATCH)
    prune: list[int] = Field(default_factory=list, max_length=10_000)


@dataclass(frozen=True)
class Digest:
    id: int
    period: str
    key: str
    starts_at: float
    ends_at: float
    text: str
    refs: tuple[str, ...]
    how: str
    created_at: float

    @classmethod
    def of(cls, row: Row) -> Digest:
        return cls(int(row["id"]), str(row["period"]), str(row["key"]),
                   float(row["starts_at"]), float(row["ends_at"]), str(row["text"]),
                   tuple(json.loads(row["refs"])), str(row["how"]), float(row["created_at"]))

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "period": self.period, "key": self.key,
                "starts_at": self.starts_at, "ends_at": self.ends_at, "text": self.text,
                "refs": list(self.refs), "how": self.how, "created_at": self.created_at}


class DigestService:
    """The ``digests`` table, written through the write log."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, batch: DigestBatch, writer: str = WRITER) -> list[int]:
        """Add the batch's digests (one already stored for its period and key is
        kept as it is: its id is answered) and delete the ``prune`` ids, all or
        nothing. ValueError for an unknown id or a monthly: monthlies are kept
        forever; :class:`runtime.memories.cited.StaleCitation` (a ValueError)
        naming the refs when a digest to add cites an episode no longer stored
        (or a turn or digest it was made from: forgotten since the job read it):
        nothing of the batch is written, and
        the caller may send the batch again without the digests citing them."""
        ids: list[int] = []
        with self.store.write_transaction():
            refuse_stale(self.store, "digest", (r for d in batch.digests for r in d.refs))
            for d in batch.digests:
                old = self.store.scalar(f"SELECT id FROM {TABLE} WHERE period = ? AND key = ?",
                                        (d.period, d.key))
                if old is not None:
                    ids.append(int(old))
                    continue
                ids.append(self.store.insert(writer, TABLE, {
                    "period": d.period, "key": d.key, "starts_at": d.starts_at,
                    "ends_at": d.ends_at, "text": d.text, "refs": json.dumps(d.refs),
                    "how": d.how, "created_at": self.store.clock.now()}))
            for digest_id in batch.prune:
                period = self.store.scalar(f"SELECT period FROM {TABLE} WHERE id = ?",
                                           (digest_id,))
                if period is None:
                    raise ValueError(f"no digest {digest_id}")
                if period == "month":
                    raise ValueError(f"digest {digest_id} is a monthly: monthlies are kept "
                                     "forever")
                self.store.delete(writer, TABLE, digest_id)
        return ids

    def listed(self, period: str | None = None) -> list[Digest]:
        """Every digest (of ``period``), oldest first."""
        if period is not None and period not in PERIODS:
            raise ValueError(f"period must be one of day, week, month; got {period!r}")
        where, args = ("WHERE period = ?", (period,)) if period else ("", ())
        return [Digest.of(r) for r in self.store.rows(
            f"SELECT * FROM {TABLE} {where} ORDER BY starts_at, id", args)]

    def keys(self, period: str) -> set[str]:
        return {str(r[0]) for r in self.store.conn.execute(
            f"SELECT key FROM {TABLE} WHERE period = ?", (period,))}


# -- what may be shown ------------------------------------------------------------


def hidden_episodes(store: Store, refs: Iterable[str]) -> set[str]:
    """The refs of ``refs`` naming an episode or a turn that is now sensitive or
    disabled, or was forgotten by the user (the write log's content-free trace)."""
    hidden: set[str] = set()
    refs = list(refs)
    for kind, table in (("episode", "episodes"), ("turn", "transcript")):
        ids = sorted({int(r.partition(":")[2]) for r in refs if r.startswith(f"{kind}:")})
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" for _ in part)
            hidden.update(f"{kind}:{r[0]}" for r in store.conn.execute(
                f"SELECT id FROM {table} WHERE id IN ({marks})"
                " AND (sensitive = 1 OR disabled = 1)", part))
            hidden.update(f"{kind}:{r[0]}" for r in store.conn.execute(
                f"SELECT row_id FROM write_log WHERE table_name = '{table}' AND op = 'delete'"
                f" AND row_id IN ({marks}) AND json_extract(before, '$.forgotten') = 1", part))
    return hidden


def shown(store: Store, digests: Sequence[Digest], depth: int = len(PERIODS)) -> list[Digest]:
    """The digests none of whose episodes or turns has become private or gone by
    the user's hand, and none of whose cited digests (a language model's weekly
    given its daily notes, ``digest:N``) is hidden in turn. A cited digest that
    is no longer stored (pruned after its roll-up) hides nothing: a forgotten
    one took its citers with it (:mod:`runtime.memories.derived`)."""
    hidden = hidden_episodes(store, (r for d in digests for r in d.refs))
    cited = sorted({int(r[7:]) for d in digests for r in d.refs if r.startswith("digest:")})
    if cited and depth > 0:
        marks = ",".join("?" for _ in cited)
        given = [Digest.of(r) for r in store.rows(
            f"SELECT * FROM {TABLE} WHERE id IN ({marks})", cited)]
        kept = {d.id for d in shown(store, given, depth - 1)}
        hidden.update(f"digest:{d.id}" for d in given if d.id not in kept)
    return [d for d in digests if not hidden.intersection(d.refs)]


def trajectory(store: Store) -> list[Digest]:
    """The latest shown monthly and the shown weeklies after it (at most
    :data:`TRAJECTORY_WEEKS`, the most recent), oldest first."""
    months = shown(store, [Digest.of(r) for r in store.rows(
        f"SELECT * FROM {TABLE} WHERE period = 'month' ORDER BY starts_at DESC LIMIT 3")])
    month = months[0] if months else None
    since = month.ends_at if month else float("-inf")
    weeks = shown(store, [Digest.of(r) for r in store.rows(
        f"SELECT * FROM {TABLE} WHERE period = 'week' AND ends_at > ?"
        f" ORDER BY starts_at DESC LIMIT ?", (since, TRAJECTORY_WEEKS + 4))])
    weeks = sorted(weeks[:TRAJECTORY_WEEKS], key=lambda d: d.starts_at)
    return ([month] if month else []) + weeks


def trajectory_section(digests: Sequence[Digest], limit: int = TRAJECTORY_CHARS) -> str:
    """The prompt's Trajectory section, at most ``limit`` characters of bullets
    (the oldest go first when it is too long), or "" with none."""
    bullets = [f"- {d.key}: {' '.join(d.text.split())}" for d in digests]
    while bullets and sum(len(b) + 1 for b in bullets) > limit:
        if len(bullets) == 1:
            bullets[0] = bullets[0][:limit - 1].rstrip() + "…"
            break
        bullets.pop(0)
    if not bullets:
        return ""
    return "\n".join((TRAJECTORY_HEADING, TRAJECTORY_INSTRUCTION, *bullets))


def trajectory_for(store: Store) -> str:
    """The Trajectory section for the prompt, from the store."""
    return trajectory_section(trajectory(store))
