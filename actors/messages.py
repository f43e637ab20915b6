"""Every message the actors exchange, in one place.

Each message is a frozen pydantic model with a version field ``v``. A request
goes to one actor method and that method answers with the paired reply type;
errors travel back to the caller as exceptions (see ``actors/README.md``).
Bump ``v`` when a field changes meaning; add fields with defaults so that
older senders keep working.

| request            | actor      | reply            |
|--------------------|------------|------------------|
| AppendTurns        | Transcript | TurnsAppended    |
| RecentTurns        | Transcript | TurnList         |
| SetCitations       | Transcript | Ack              |
| Embed              | Embedder   | Embedded         |
| Recall             | Recall     | Recalled         |
| SyncIndex          | Recall     | IndexSynced      |
| DropFromIndex      | Recall     | Ack              |
| AddEpisode         | Episodes   | EpisodeWritten   |
| AddFact            | Graph      | FactWritten      |
| ChangeFact         | Graph      | Ack              |
| UserTurn           | Turns      | TurnReply        |
| StatusRequest      | Supervisor | Status           |
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runtime.episodes import EpisodeIn
from runtime.facts import FactIn
from runtime.recall import RecallItem, RecallResult
from runtime.transcript import MAX_TURN_CHARS, Location, TurnIn

VERSION = 1
MAX_BATCH = 1000


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1


class Ack(Message):
    ok: bool = True
    detail: str | None = None


# -- transcript -------------------------------------------------------------

class AppendTurns(Message):
    """Append turns; ``request_ids`` (optional, one per turn) make retries idempotent."""

    turns: list[TurnIn] = Field(min_length=1, max_length=MAX_BATCH)
    writer: str = "transcript"


class TurnsAppended(Message):
    ids: list[int]


class RecentTurns(Message):
    channel: str
    limit: int = Field(default=10, ge=0, le=200)


class TurnRow(Message):
    id: int
    channel: str
    source: str
    role: str
    speaker: str | None
    content: str
    created_at: float


class TurnList(Message):
    turns: list[TurnRow]


class SetCitations(Message):
    turn_id: int
    refs: list[str]


# -- embedder ---------------------------------------------------------------

class Embed(Message):
    texts: list[str] = Field(max_length=MAX_BATCH)


class Embedded(Message):
    """Row-major float32 vectors, L2-normalised (base64 in JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64",
                              val_json_bytes="base64")

    model: str
    dim: int
    data: bytes

    @classmethod
    def of(cls, model: str, vecs: np.ndarray) -> Embedded:
        arr = np.ascontiguousarray(vecs, dtype=np.float32)
        return cls(model=model, dim=int(arr.shape[1]), data=arr.tobytes())

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.float32).reshape(-1, self.dim)


# -- recall -----------------------------------------------------------------

class Recall(Message):
    query: str = Field(max_length=MAX_TURN_CHARS)
    max_items: int | None = Field(default=None, ge=0, le=200)
    max_tokens: int | None = Field(default=None, ge=0)
    now: float | None = None
    exclude: list[str] = Field(default_factory=list, max_length=MAX_BATCH)


class MemoryItem(Message):
    ref: str
    kind: Literal["turn", "episode", "fact"]
    item_id: int
    text: str
    score: float
    relevance: float
    channel: str | None
    created_at: float
    turns: list[int]
    tokens: int

    @classmethod
    def of(cls, item: RecallItem) -> MemoryItem:
        return cls(ref=item.ref, kind=item.kind, item_id=item.item_id,  # type: ignore[arg-type]
                   text=item.text, score=item.score, relevance=item.relevance,
                   channel=item.channel, created_at=item.created_at,
                   turns=list(item.turns), tokens=item.tokens)


class Recalled(Message):
    query: str
    items: list[MemoryItem]
    degraded: bool = False
    reason: str | None = None
    elapsed_ms: float = 0.0

    @classmethod
    def of(cls, result: RecallResult) -> Recalled:
        return cls(query=result.query, items=[MemoryItem.of(i) for i in result.items],
                   degraded=result.degraded, reason=result.reason,
                   elapsed_ms=result.elapsed_ms)

    @property
    def refs(self) -> list[str]:
        return [i.ref for i in self.items]


class SyncIndex(Message):
    limit: int | None = Field(default=None, ge=1)  # at most this many items this call


class IndexSynced(Message):
    added: int
    counts: dict[str, int]


class DropFromIndex(Message):
    kind: Literal["turn", "episode", "fact"]
    item_id: int


# -- episodes and graph -----------------------------------------------------

class AddEpisode(Message):
    episode: EpisodeIn
    writer: str = "episodes"


class EpisodeWritten(Message):
    episode_id: int


class AddFact(Message):
    fact: FactIn
    writer: str = "graph"


class FactWritten(Message):
    fact_id: int
    action: Literal["insert", "reinforce", "supersede", "keep"]


class ChangeFact(Message):
    """Disable (hide, reversible), enable, or delete (for good) one fact."""

    fact_id: int
    change: Literal["disable", "enable", "delete"]
    writer: str = "cli"


# -- the turn path ----------------------------------------------------------

class UserTurn(Message):
    channel: str = Field(min_length=1, max_length=200)
    source: str = Field(default="user", min_length=1, max_length=200)
    text: str = Field(max_length=MAX_TURN_CHARS)
    speaker: str | None = Field(default=None, max_length=200)
    location: Location | None = None
    temporary: bool = False  # a temporary chat writes no memory and no transcript
    # Optional caller-chosen id: resending the same turn never writes it twice.
    request_id: str | None = Field(default=None, min_length=1, max_length=80)


class TurnReply(Message):
    turn_id: int | None
    reply_id: int | None
    text: str
    citations: list[str]
    provider: str
    recall_degraded: bool = False
    notice: str | None = None


# -- supervision ------------------------------------------------------------

class StatusRequest(Message):
    pass


class Status(Message):
    namespace: str
    actors: dict[str, str]
    counts: dict[str, int]
    notice: str | None = None


REQUESTS: tuple[type[Message], ...] = (
    AppendTurns, RecentTurns, SetCitations, Embed, Recall, SyncIndex, DropFromIndex,
    AddEpisode, AddFact, ChangeFact, UserTurn, StatusRequest,
)
REPLIES: tuple[type[Message], ...] = (
    Ack, TurnsAppended, TurnList, TurnRow, Embedded, Recalled, MemoryItem, IndexSynced,
    EpisodeWritten, FactWritten, TurnReply, Status,
)
