"""The transcript: an append-only record of every turn, per channel.

It is the source of truth; everything else is derived from it. Every turn is
written, whatever its source; the per-source memory profile decides only
whether the turn may become memory (episodes, facts, recall), and the service
decides it from the source, never the caller. Raw rows are pruned only once they
are below the channel's compaction watermark and no live episode cites them;
compaction summaries persist; a turn's tool calls go with it.

A user can disable a turn (hidden from recall and the index, reversibly) or
forget it: the row, its tool calls, their FTS terms and vectors go, and the
write log keeps only that they existed (:meth:`runtime.store.database.Store.forget`);
what quotes it goes or is rewritten without it (:mod:`runtime.memories.derived`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime.memories import derived
from runtime.memories.cited import refuse_stale
from runtime.memories.location import live_location
from runtime.memories.profiles import MemoryProfiles
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

MAX_TURN_CHARS = 32_000
WRITER = "transcript"

Role = Literal["user", "assistant", "system", "tool"]


class Location(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lat: float = Field(ge=-90.0, le=90.0)
    lon: float = Field(ge=-180.0, le=180.0)
    accuracy_m: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    place: str | None = Field(default=None, max_length=200)


class TurnIn(BaseModel):
    """One turn to append. ``created_at`` defaults to the store clock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, max_length=200)
    role: Role = "user"
    content: str = Field(max_length=MAX_TURN_CHARS)
    speaker: str | None = Field(default=None, max_length=200)
    created_at: float | None = Field(default=None, allow_inf_nan=False)
    location: Location | None = None
    external_id: str | None = Field(default=None, max_length=200)
    # Makes the append idempotent: a retry with the same id returns the first row.
    request_id: str | None = Field(default=None, min_length=1, max_length=100)
    # sensitive (runtime.memories.privacy): e.g. a reply that was given a sensitive memory
    sensitive: bool = False

    @field_validator("content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("content is empty")
        return value


MAX_TOOL_RESULT_CHARS = 8_000


class ToolCallIn(BaseModel):
    """One tool call the model made while answering a turn, and what it got."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=80)
    arguments: dict[str, object] = Field(default_factory=dict)
    result: str | None = Field(default=None, max_length=MAX_TOOL_RESULT_CHARS)


class TranscriptService:
    def __init__(self, store: Store, profiles: MemoryProfiles,
                 hub_person: str | None = None) -> None:
        self.store = store
        self.profiles = profiles
        # Whose GPS fixes are the hub's own (``gps.person``): see runtime.memories.location.
        self.hub_person = hub_person

    def append(self, turn: TurnIn, writer: str = WRITER) -> int:
        """Append one turn; return its id. It is memory (recallable, embedded)
        when its source's profile says so. With a ``request_id`` already
        stored, return that row's id and write nothing."""
        with self.store.write_transaction():
            if turn.request_id is not None:
                existing = self.store.scalar(
                    "SELECT id FROM transcript WHERE request_id = ?", (turn.request_id,))
                if existing is not None:
                    return int(existing)
            return self._insert(turn, writer)

    def recent(self, channel: str, limit: int) -> list[Row]:
        """A channel's ``limit`` most recent turns, oldest first (disabled ones
        too, flagged): the history a turn's prompt is made from."""
        rows = self.store.rows(
            "SELECT id, channel, source, role, speaker, content, created_at, disabled,"
            " sensitive FROM transcript"
            " WHERE channel = ? ORDER BY id DESC LIMIT ?", (channel, limit))
        return list(reversed(rows))

    def _insert(self, turn: TurnIn, writer: str) -> int:
        profile = self.profiles.for_source(turn.source)
        created_at = self.store.clock.now() if turn.created_at is None else turn.created_at
        loc: Location | Row | None = turn.location
        if loc is None and turn.role == "user" and profile.location:
            loc = live_location(self.store, turn.speaker, created_at, self.hub_person)
        where = loc.model_dump() if isinstance(loc, Location) else loc
        return self.store.insert(writer, "transcript", {
            "channel": turn.channel,
            "source": turn.source,
            "role": turn.role,
            "speaker": turn.speaker,
            "content": turn.content,
            "created_at": created_at,
            "lat": where["lat"] if where else None,
            "lon": where["lon"] if where else None,
            "accuracy_m": where["accuracy_m"] if where else None,
            "place": where["place"] if where else None,
            "external_id": turn.external_id,
            "memory": int(profile.remembered),
            "request_id": turn.request_id,
            "sensitive": int(turn.sensitive),
        })

    def get(self, turn_id: int) -> Row | None:
        return self.store.get("transcript", turn_id)

    def set_disabled(self, turn_id: int, disabled: bool, writer: str = WRITER) -> Row:
        """Hide a turn from recall and the index (or show it again); reversible."""
        return self.store.update(writer, "transcript", turn_id, {"disabled": int(disabled)})

    def forget(self, turn_id: int, writer: str = WRITER) -> Row | None:
        """Delete a turn and its tool calls for good, content scrubbed from the
        write log; return the turn, or None if there was none. What quotes it
        goes with it, in the same transaction (:mod:`runtime.memories.derived`):
        the episodes citing it, the facts resting on it and what was written from
        those; its lines in other turns' tool results and the compaction
        summaries' gists quoting it are rewritten without it."""
        with self.store.write_transaction():
            turn = self.get(turn_id)
            if turn is None:
                return None
            # first: the episodes citing it are found through its citations
            derived.forget_citing(self.store, f"turn:{turn_id}", writer, str(turn["content"]))
            calls = [r[0] for r in self.store.conn.execute(
                "SELECT id FROM tool_calls WHERE transcript_id = ?", (turn_id,))]
            for call_id in calls:
                self.store.forget(writer, "tool_calls", call_id)
            return self.store.forget(writer, "transcript", turn_id)

    def set_citations(self, turn_id: int, refs: list[str], writer: str = WRITER) -> None:
        """Record which memories were given to the model for this message."""
        self.store.update(writer, "transcript", turn_id, {"citations": json.dumps(refs)})

    def add_tool_call(self, turn_id: int, name: str, arguments: dict[str, object],
                      result: str | None, writer: str = WRITER) -> int:
        return self.store.insert(writer, "tool_calls", {
            "transcript_id": turn_id, "name": name,
            "arguments": json.dumps(arguments), "result": result,
            "created_at": self.store.clock.now(),
        })

    def add_tool_calls(self, turn_id: int, calls: list[ToolCallIn],
                       writer: str = WRITER) -> None:
        """Record the tool calls made for a turn, once: a turn that has its
        calls already (an append retried with its request id) gets no more."""
        with self.store.write_transaction():
            if self.store.scalar("SELECT 1 FROM tool_calls WHERE transcript_id = ? LIMIT 1",
                                 (turn_id,)) is not None:
                return
            for call in calls:
                self.add_tool_call(turn_id, call.name, call.arguments, call.result, writer)

    def neighbours(self, turn_id: int, before: int, after: int) -> list[Row]:
        """Up to ``before`` earlier and ``after`` later rows of the same channel."""
        row = self.get(turn_id)
        if row is None:
            return []
        earlier = self.store.rows(
            "SELECT * FROM transcript WHERE channel = ? AND id < ? ORDER BY id DESC LIMIT ?",
            (row["channel"], turn_id, before),
        )
        later = self.store.rows(
            "SELECT * FROM transcript WHERE channel = ? AND id > ? ORDER BY id LIMIT ?",
            (row["channel"], turn_id, after),
        )
        return [*reversed(earlier), row, *later]

    # -- compaction and pruning --------------------------------------------

    def compact(self, channel: str, summary: str, watermark: int, writer: str = WRITER,
                refs: Sequence[str] = ()) -> int:
        """Record a continuity summary of ``channel`` up to row ``watermark``;
        ``refs``: the episode each of its gists was copied from, in order
        (forgetting one takes its gist out: :mod:`runtime.memories.derived`).
        One naming an episode no longer stored (forgotten since the job read
        it) is refused whole, :class:`runtime.memories.cited.StaleCitation`:
        the caller writes it again without that gist."""
        if not summary.strip():
            raise ValueError("compaction summary is empty")
        with self.store.write_transaction():
            refuse_stale(self.store, "compaction", refs)  # no gap: in the write
            current = self.watermark(channel)
            if current is not None and watermark < current:
                raise ValueError(
                    f"watermark {watermark} is behind the current one ({current})")
            return self.store.insert(writer, "compactions", {
                "channel": channel, "summary": summary, "watermark": watermark,
                "created_at": self.store.clock.now(), "refs": json.dumps(list(refs)),
            })

    def watermark(self, channel: str) -> int | None:
        value = self.store.scalar(
            "SELECT max(watermark) FROM compactions WHERE channel = ?", (channel,)
        )
        return None if value is None else int(value)

    def prunable(self, channel: str) -> list[int]:
        """Rows below the watermark that no live (untombstoned) episode cites;
        never a disabled row (disabling is reversible: consolidation skips it,
        so nothing cites it, and it waits for its owner's ``enable``), nor one
        enabled again after a compaction had passed it (consolidation does not
        go back for it: it stays a turn, recalled as one)."""
        mark = self.watermark(channel)
        if mark is None:
            return []
        return [r[0] for r in self.store.conn.execute(
            """
            SELECT t.id FROM transcript t
            WHERE t.channel = ? AND t.id <= ? AND t.disabled = 0
              AND NOT EXISTS (
                SELECT 1 FROM episode_citations c JOIN episodes e ON e.id = c.episode_id
                WHERE c.transcript_id = t.id AND e.tombstoned_at IS NULL)
              AND NOT EXISTS (
                SELECT 1 FROM write_log w
                WHERE w.table_name = 'transcript' AND w.row_id = t.id AND w.op = 'update'
                  AND json_extract(w.before, '$.disabled') = 1
                  AND json_extract(w.after, '$.disabled') = 0
                  AND w.id > (
                    SELECT min(l.id) FROM compactions k JOIN write_log l
                      ON l.table_name = 'compactions' AND l.row_id = k.id AND l.op = 'insert'
                    WHERE k.channel = t.channel AND k.watermark >= t.id))
            ORDER BY t.id
            """,
            (channel, mark),
        )]

    def prune(self, channel: str, writer: str = WRITER) -> int:
        with self.store.write_transaction():
            ids = self.prunable(channel)
            for turn_id in ids:
                self.store.delete(writer, "transcript", turn_id)
        if ids:
            log.info("pruned %d transcript rows", len(ids), extra={"channel": channel})
        return len(ids)
