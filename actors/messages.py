"""Every message the actors exchange, in one place.

Each message is a frozen pydantic model with a version field ``v``. A request
goes to one actor method and that method answers with the paired reply type;
errors travel back to the caller as exceptions (see ``actors/README.md``).
Bump ``v`` when a field changes meaning; add fields with defaults so that
older senders keep working.

| request            | actor.method             | reply            |
|--------------------|--------------------------|------------------|
| AppendTurns        | Transcript.append        | TurnsAppended    |
| RecentTurns        | Transcript.recent        | TurnList         |
| Embed              | Recall.embed             | Embedded         |
| Recall             | Recall.recall            | Recalled         |
| SyncIndex          | Recall.sync              | IndexSynced      |
| DropFromIndex      | Recall.drop              | Ack              |
| FindMemories       | Recall.find              | MemoryMatches    |
| NearestMemory      | Recall.nearest           | NearestFound     |
| AddEpisode         | Episodes.add             | EpisodeWritten   |
| TouchEpisodes      | Episodes.touch           | Ack              |
| UpdateThread       | Episodes.update_thread   | Ack              |
| AddMood            | Episodes.add_mood        | MoodWritten      |
| PurgeTombstones    | Episodes.purge_tombstones | TombstonesPurged |
| ExpireWriteLog     | Episodes.expire_write_log | WriteLogExpired (episodes' history) |
| AddFact            | Graph.add                | FactWritten      |
| AddPortrait        | Graph.add_portrait       | PortraitWritten  |
| WriteDigests       | Graph.write_digests      | DigestsWritten   |
| UpdateProfile      | Graph.update_profile     | ProfileUpdated   |
| ChangeMemory       | owner of the ref .change | Ack              |
| UserTurn           | Turns.process            | TurnReply        |
| UserTurn           | Turns.process_stream     | TurnDelta…, TurnReply (streamed) |
| EditMemory         | owner of the ref .edit   | Ack (detail: the new ref) |
| BrowseMemories     | Recall.browse            | MemoryPage       |
| ViewMemory         | Recall.view              | MemoryView (none: NoSuchMemory) |
| StatusRequest      | (actors.status, no actor) | Status          |
| Compact            | Transcript.compact       | Compacted        |
| PruneTranscript    | Transcript.prune         | TranscriptPruned |
| ExpireWriteLog     | Transcript.expire_write_log | WriteLogExpired (the transcript's history) |
| Activity           | Cron.activity            | Ack              |
| Presence           | Cron.presence            | Ack              |
| Tick               | Cron.tick                | Ticked           |
| JobsStatus         | Cron.status              | JobsReport       |
| RunJob             | Cron.run                 | JobRun           |
| Remind             | Cron.remind              | Reminded         |
| ListReminders      | Cron.list_reminders      | ReminderList     |
| CancelReminder     | Cron.cancel_reminder     | Ack              |
| HubJobState        | Cron.hub_job_state       | JobStateRows     |
| SaveJobState       | Cron.save_job_state      | Ack              |
| SaveLLMQueue       | Cron.save_llm_queue      | Ack              |
| PresenceRequest    | Cron.presence_report     | PresenceReport   |
| RecordFixes        | Transcript.record_fixes  | FixesStored      |
| LocationRequest    | Transcript.location      | LocationInfo     |
| EdgeRequest        | Edge.stats               | EdgeInfo         |
| PublishFix         | Edge.publish_fix         | Ack              |

``ChangeMemory`` and ``EditMemory`` go to the actor that owns the ref's kind
(``actors.common.OWNERS``: ``turn:`` Transcript, ``episode:`` Episodes,
``fact:`` Graph). Every request (:class:`Request`) carries the household it is
for. Typed clients for every row are in ``actors/handles.py``.
Actors validate what arrives again (``actors.common.accept``): a message built
without validation is refused with ``BadRequest``, never trusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime.config import HOUSEHOLD_ID, HUB_HOUSEHOLD
from runtime.memories.digests import DigestBatch
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.mood import MoodIn
from runtime.memories.portrait import PortraitIn
from runtime.memories.threads import ThreadChange
from runtime.memories.transcript import MAX_TURN_CHARS, Location, ToolCallIn, TurnIn
from runtime.memories.user_profile import ProfileOp
from runtime.recall.results import RecallItem, RecallResult

if TYPE_CHECKING:
    import numpy as np

VERSION = 1
MAX_BATCH = 1000
MAX_REFS = 200
# A memory ref: ``turn:12``, ``episode:3``, ``fact:7``.
REF_PATTERN = r"^(turn|episode|fact):[0-9]{1,18}$"
Ref = Annotated[str, Field(pattern=REF_PATTERN, max_length=40)]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    v: Literal[1] = 1


class Request(Message):
    """A request: it names the household it is for (``household``, checked by
    :data:`runtime.config.HOUSEHOLD_ID`; the hub's own, ``home``, unless it
    says otherwise). An owner serves it from that household's store only, and
    refuses a household it does not serve (``actors/households.py``); the
    typed clients fill it with theirs (``actors/handles.py``)."""

    household: str = Field(default=HUB_HOUSEHOLD, pattern=HOUSEHOLD_ID)


class Ack(Message):
    ok: bool = True
    detail: str | None = None


# -- transcript -------------------------------------------------------------

class AppendTurns(Request):
    """Append turns, all or nothing, in one write transaction.

    A turn's ``request_id`` (optional) makes a retry idempotent. ``citations``
    (optional, one list of refs per turn) records which memories the model was
    given for that turn, written in the same transaction as the turn itself.
    ``index_now``: tell Recall at once that there is news (the default). The
    Turns actor says no for the turn it is about to answer, and tells Recall
    itself after its turn-zero recall, which so never waits behind the
    embedding of the very turn it answers. ``tool_calls`` (optional, one list
    per turn) records the tool calls the model made for that turn (a pull
    channel's recalls), in the same transaction."""

    turns: list[TurnIn] = Field(min_length=1, max_length=MAX_BATCH)
    citations: list[list[Ref]] | None = Field(default=None, max_length=MAX_BATCH)
    tool_calls: list[list[ToolCallIn]] | None = Field(default=None, max_length=MAX_BATCH)
    writer: str = Field(default="transcript", min_length=1, max_length=80)
    index_now: bool = True

    @model_validator(mode="after")
    def _one_citation_list_per_turn(self) -> AppendTurns:
        if self.citations is not None:
            if len(self.citations) != len(self.turns):
                raise ValueError(f"citations: {len(self.citations)} lists for "
                                 f"{len(self.turns)} turns")
            if any(len(refs) > MAX_REFS for refs in self.citations):
                raise ValueError(f"citations: at most {MAX_REFS} refs per turn")
        if self.tool_calls is not None and len(self.tool_calls) != len(self.turns):
            raise ValueError(f"tool_calls: {len(self.tool_calls)} lists for "
                             f"{len(self.turns)} turns")
        return self


class TurnsAppended(Message):
    ids: list[int]


class RecentTurns(Request):
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
    disabled: bool = False  # hidden by the user: never put in a prompt
    sensitive: bool = False  # runtime.memories.privacy: who may hear it


class TurnList(Message):
    turns: list[TurnRow]


# -- embedding (the Recall actor holds the model) -------------------------

class Embed(Request):
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
        import numpy as np  # here: the `reverie` command carries messages, never vectors

        arr = np.ascontiguousarray(vecs, dtype=np.float32)
        return cls(model=model, dim=int(arr.shape[1]), data=arr.tobytes())

    def array(self) -> np.ndarray:
        import numpy as np

        return np.frombuffer(self.data, dtype=np.float32).reshape(-1, self.dim)


# -- recall -----------------------------------------------------------------

class Recall(Request):
    query: str = Field(max_length=MAX_TURN_CHARS)
    max_items: int | None = Field(default=None, ge=0, le=200)
    max_tokens: int | None = Field(default=None, ge=0)
    now: float | None = None
    exclude: list[str] = Field(default_factory=list, max_length=MAX_BATCH)
    # scoped to this person's memories and the household's (runtime.memories.privacy.in_scope)
    person: str | None = Field(default=None, min_length=1, max_length=200)


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
    sensitive: bool = False  # runtime.memories.privacy: who may be given it
    person: str | None = None  # whose memory it is (None: the household's)

    @classmethod
    def of(cls, item: RecallItem) -> MemoryItem:
        return cls(ref=item.ref, kind=item.kind, item_id=item.item_id,  # type: ignore[arg-type]
                   text=item.text, score=item.score, relevance=item.relevance,
                   channel=item.channel, created_at=item.created_at,
                   turns=list(item.turns), tokens=item.tokens, sensitive=item.sensitive,
                   person=item.person)


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


class SyncIndex(Request):
    """Index what has no vector yet. ``refs``: items to look at again even if the
    indexer has passed them (enabled again after a disable)."""

    limit: int | None = Field(default=None, ge=1)  # at most this many items this call
    refs: list[Ref] = Field(default_factory=list, max_length=MAX_BATCH)


class IndexSynced(Message):
    added: int
    counts: dict[str, int]


class DropFromIndex(Request):
    kind: Literal["turn", "episode", "fact"]
    item_id: int


class FindMemories(Request):
    """Memories whose text matches ``text`` (for ``forget --matching``): any
    kind, disabled ones included, newest first."""

    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS)
    limit: int = Field(default=20, ge=1, le=100)


class MemoryMatch(Message):
    ref: str
    text: str
    created_at: float
    disabled: bool


class MemoryMatches(Message):
    items: list[MemoryMatch]


class NearestMemory(Request):
    """The live episode or fact (about ``subject``) nearest to ``text``, for the
    near-duplicate check (``runtime.memories.duplicates``)."""

    kind: Literal["episode", "fact"]
    text: str = Field(min_length=1, max_length=20_000)
    subject: str | None = Field(default=None, max_length=500)


class NearestFound(Message):
    item_id: int | None  # None: no live memory of that kind
    similarity: float = 0.0


# -- episodes and graph -----------------------------------------------------

class AddEpisode(Request):
    episode: EpisodeIn
    writer: str = "episodes"


class EpisodeWritten(Message):
    episode_id: int
    # refused as a near-duplicate: episode_id is the live episode it duplicates
    duplicate: bool = False


class AddFact(Request):
    fact: FactIn
    writer: str = "graph"


class FactWritten(Message):
    """What ``AddFact`` did (``runtime.memories.facts.Resolution``): ``fact_id`` is the
    fact now current; ``existing_id`` the fact it met (reinforced, superseded,
    kept, or duplicated: then ``fact_id`` is that one too); ``claim_id``, for a
    ``keep``, the history row that records the claim that lost."""

    fact_id: int
    action: Literal["insert", "reinforce", "supersede", "keep", "duplicate"]
    existing_id: int | None = None
    claim_id: int | None = None


class AddPortrait(Request):
    """A new version of the household's portrait (the synthesis job)."""

    portrait: PortraitIn
    writer: str = Field(default="synthesis", min_length=1, max_length=80)


class PortraitWritten(Message):
    portrait_id: int


class WriteDigests(Request):
    """Digests to add and expired ones to delete (the synthesis job's digest step,
    ``runtime.memories.digests``); a monthly is never deleted."""

    batch: DigestBatch
    writer: str = Field(default="synthesis", min_length=1, max_length=80)


class DigestsWritten(Message):
    digest_ids: list[int]


class UpdateProfile(Request):
    """Profile operations (``runtime.memories.user_profile``), applied all or nothing."""

    ops: list[ProfileOp] = Field(min_length=1, max_length=100)
    source: str = Field(default="user", min_length=1, max_length=80)
    writer: str = Field(default="cli", min_length=1, max_length=80)


class ProfileUpdated(Message):
    changes: list[str]


class TouchEpisodes(Request):
    """These episodes were recalled and used in an answer: their decay restarts
    (``last_relevant_at``). Fire and forget, from Turns to Episodes."""

    ids: list[int] = Field(min_length=1, max_length=MAX_BATCH)
    at: float | None = None


class UpdateThread(Request):
    """Resolve or escalate an episode's open thread (``runtime.memories.threads``: the
    consolidate and decay jobs)."""

    change: ThreadChange
    writer: str = Field(default="consolidate", min_length=1, max_length=80)


class AddMood(Request):
    """A new reading of the companion's mood (``runtime.memories.mood``: the consolidate job)."""

    mood: MoodIn
    writer: str = Field(default="consolidate", min_length=1, max_length=80)


class MoodWritten(Message):
    mood_id: int


class PurgeTombstones(Request):
    """Hard-delete the episodes tombstoned long enough ago (``runtime.memories.decay``:
    30 days) as of ``now`` (the decay job's clock; None: the actor's)."""

    now: float | None = Field(default=None, allow_inf_nan=False)
    writer: str = Field(default="janitor", min_length=1, max_length=80)


class TombstonesPurged(Message):
    purged: int


class ChangeMemory(Request):
    """Disable (hide from recall, reversible), enable, or delete (for good: its
    text, vector and keyword rows go; the write log keeps only that it was
    deleted, when and by whom) one memory: ``turn:12``, ``episode:3``,
    ``fact:7``; or pin it (memory level ``seared``: it never fades) or unpin it
    (a pinned one becomes ``vivid``). Only episodes and facts have a level:
    pinning a turn is refused. ``sensitive`` / ``not_sensitive`` set or clear
    any memory's sensitive mark (``runtime.memories.privacy``). Answered by the owner of
    the ref's kind (``OWNERS``)."""

    ref: Ref
    change: Literal["disable", "enable", "delete", "pin", "unpin", "sensitive",
                    "not_sensitive"]
    writer: str = Field(default="cli", min_length=1, max_length=80)


class EditMemory(Request):
    """Change what a memory says: an episode's gist, a fact's value (a new
    claim that supersedes the old one, history kept). Turns are the append-only
    transcript: editing one is refused. Answered by the owner of the ref's kind
    with an ``Ack`` whose ``detail`` is the ref that now holds the text."""

    ref: Ref
    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS)
    writer: str = Field(default="cli", min_length=1, max_length=80)


# -- browsing ---------------------------------------------------------------

MemoryKind = Literal["turn", "episode", "fact"]
ALL_KINDS: tuple[MemoryKind, ...] = ("turn", "episode", "fact")


class BrowseMemories(Request):
    """A page of memories for people to look through (the memory page, REST,
    MCP's timeline): some kinds, optionally only those containing every word of
    ``text``, optionally written within ``[since, until)`` (epoch seconds),
    newest first unless ``oldest_first``."""

    kinds: list[MemoryKind] = Field(default_factory=lambda: list(ALL_KINDS),
                                    min_length=1, max_length=3)
    text: str | None = Field(default=None, max_length=MAX_TURN_CHARS)
    since: float | None = None
    until: float | None = None
    include_disabled: bool = True
    oldest_first: bool = False
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=1_000_000)
    # [since, until) bounds when each happened instead (runtime.recall.browse.DATED): the timeline
    dated: bool = False


class MemoryView(Message):
    """One memory as a person sees it."""

    ref: str
    kind: Literal["turn", "episode", "fact"]
    item_id: int
    text: str
    created_at: float
    disabled: bool
    pinned: bool = False
    level: str | None = None          # faint | normal | vivid | seared (episodes, facts)
    channel: str | None = None
    source: str | None = None
    speaker: str | None = None        # turns: who spoke (or the role)
    details: dict[str, Any] = Field(default_factory=dict)  # kind-specific fields
    sensitive: bool = False           # runtime.memories.privacy: codes, health, money
    person: str | None = None         # whose memory it is (None: the household's)


class MemoryPage(Message):
    items: list[MemoryView]
    total: int                        # matching items over all pages


class ViewMemory(Request):
    """One memory by its ref, whatever its state (``Recall.view`` answers a
    ``MemoryView``; a ref that names nothing is a ``BadRequest`` that is also a
    ``runtime.memories.refs.NoSuchItem``)."""

    ref: Ref


# -- the turn path ----------------------------------------------------------

MAX_CLIENT_MESSAGES = 1000
MAX_CLIENT_TOOLS = 128
MAX_CLIENT_CHARS = 200_000  # a client's system prompt, one message, one tool call's arguments
MAX_CLIENT_IMAGES = 16  # with one message
# one image, as a URL (a data: URL holds the image; the HTTP body limit bounds them all)
MAX_IMAGE_URL_CHARS = 64 * 1_048_576


class ClientToolCall(Message):
    """A tool call of the client's own tools (OpenAI's shape: ``arguments``
    is JSON text)."""

    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    arguments: str = Field(default="", max_length=MAX_CLIENT_CHARS)


class ClientMessage(Message):
    """One message of a client's conversation (the memory layer)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=MAX_CLIENT_CHARS)
    tool_calls: list[ClientToolCall] = Field(default_factory=list, max_length=MAX_CLIENT_TOOLS)
    tool_call_id: str | None = Field(default=None, max_length=200)
    # images with a user message, as URLs (data: or https:); sent upstream only
    # to a provider marked vision, never stored
    images: list[Annotated[str, Field(max_length=MAX_IMAGE_URL_CHARS)]] = Field(
        default_factory=list, max_length=MAX_CLIENT_IMAGES)


class ClientTool(Message):
    """A function of the client's that the model may call."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(default="", max_length=MAX_CLIENT_CHARS)
    parameters: dict[str, Any] = Field(default_factory=dict)


class Conversation(Message):
    """What a client sent besides its last user message (the memory layer,
    ``actors.http.layer``): its own system prompt, its history before that
    message (empty: it sent none, the channel's transcript is the history),
    what came after it (the model's tool calls and the client's results: the
    turn continues), its tools and its own request fields for the upstream."""

    system: str = Field(default="", max_length=MAX_CLIENT_CHARS)
    history: list[ClientMessage] = Field(default_factory=list, max_length=MAX_CLIENT_MESSAGES)
    continuation: list[ClientMessage] = Field(default_factory=list,
                                              max_length=MAX_CLIENT_MESSAGES)
    tools: list[ClientTool] = Field(default_factory=list, max_length=MAX_CLIENT_TOOLS)
    options: dict[str, Any] = Field(default_factory=dict)
    # the images sent with the last user message (the turn's text)
    images: list[Annotated[str, Field(max_length=MAX_IMAGE_URL_CHARS)]] = Field(
        default_factory=list, max_length=MAX_CLIENT_IMAGES)


class UserTurn(Request):
    channel: str = Field(min_length=1, max_length=200)
    source: str = Field(default="user", min_length=1, max_length=200)
    text: str = Field(max_length=MAX_TURN_CHARS)
    speaker: str | None = Field(default=None, max_length=200)
    location: Location | None = None
    # where it was said (a Wyoming satellite's room): a line of the prompt, not stored
    room: str | None = Field(default=None, max_length=80)
    temporary: bool = False  # a temporary chat writes no memory and no transcript
    # The upstream model (or provider name) to ask first; None: the configured order.
    model: str | None = Field(default=None, min_length=1, max_length=200)
    # Optional caller-chosen id: resending the same turn never writes it twice.
    request_id: str | None = Field(default=None, min_length=1, max_length=80)
    # The client's conversation (the memory layer); None: the transcript is the history.
    conversation: Conversation | None = None


class TurnDelta(Message):
    """A piece of a reply as the language model writes it (streamed turns)."""

    text: str


class TurnReply(Message):
    turn_id: int | None
    reply_id: int | None
    text: str
    citations: list[str]
    provider: str
    recall_degraded: bool = False
    notice: str | None = None
    # the model called the client's tools (the memory layer): nothing written
    # yet, the turn continues when the client sends their results
    tool_calls: list[ClientToolCall] = Field(default_factory=list)


# -- supervision ------------------------------------------------------------

class StatusRequest(Request):
    pass


class Status(Message):
    namespace: str
    actors: dict[str, str]
    counts: dict[str, int]
    notice: str | None = None
    mqtt: EdgeInfo | None = None
    location: LocationInfo | None = None
    presence: dict[str, PersonPresence] | None = None  # person -> where, since when
    # Litestream: enabled, url, running, pid, restarts, last_sync_at, lag_s, gaps, error
    replica: dict[str, Any] | None = None



# -- compaction (written by the consolidation job) --------------------------

class Compact(Request):
    """Record a continuity summary of ``channel`` up to transcript row ``watermark``."""

    channel: str = Field(min_length=1, max_length=200)
    summary: str = Field(min_length=1, max_length=MAX_TURN_CHARS)
    watermark: int = Field(ge=0)
    writer: str = Field(default="transcript", min_length=1, max_length=80)
    # the episode each gist of the summary was copied from, in order (runtime.memories.derived)
    refs: list[Annotated[str, Field(pattern=r"^episode:[1-9][0-9]{0,17}$")]] = Field(
        default_factory=list, max_length=100)


class Compacted(Message):
    compaction_id: int


# -- the janitor (the decay job) ---------------------------------------------

class PruneTranscript(Request):
    """Delete ``channel``'s rows at or below its compaction watermark that no
    live episode cites (``runtime.memories.transcript.TranscriptService.prune``)."""

    channel: str = Field(min_length=1, max_length=200)
    writer: str = Field(default="janitor", min_length=1, max_length=80)


class TranscriptPruned(Message):
    pruned: int


class ExpireWriteLog(Request):
    """Drop the write-log history of the rows the janitor deleted at least
    ``runtime.memories.decay.WRITE_LOG_RETENTION_DAYS`` before ``now`` (None: the actor's
    clock). Each owner expires the history of its own tables: Transcript that
    of transcript rows (and their tool calls), Episodes that of episodes (and
    their citations)."""

    now: float | None = Field(default=None, allow_inf_nan=False)


class WriteLogExpired(Message):
    dropped: int  # write-log rows deleted


# -- the subconscious: Cron ------------------------------------------------
# Every ``at`` / ``now`` is seconds since the epoch; None: the Cron actor's
# clock. Tests and simulations give them, to jump time instead of sleeping.

class Activity(Request):
    """The user did something (a user turn): idleness starts again."""

    at: float | None = Field(default=None, allow_inf_nan=False)


class Presence(Request):
    """Someone came home or left (or moved to another room or zone); everyone
    away counts as idle. ``activity``: someone is active at home right now
    (motion, occupancy), which resets idleness like a user turn."""

    person: str = Field(default="household", min_length=1, max_length=80)
    state: Literal["home", "away"]
    at: float | None = Field(default=None, allow_inf_nan=False)
    place: str | None = Field(default=None, max_length=80)
    source: str | None = Field(default=None, max_length=40)
    activity: bool = False


class Tick(Request):
    """Check now (or at ``now``): fire due reminders, start the jobs the idle
    gate lets through. ``wait``: answer when those runs have ended."""

    now: float | None = Field(default=None, allow_inf_nan=False)
    wait: bool = False


class JobRun(Message):
    """One run of a job: ``outcome`` None while it runs (or when not waited for)."""

    name: str
    run_id: int | None = None
    outcome: Literal["ok", "failed"] | None = None
    items: int = 0
    error: str | None = None
    detail: str = ""


class Ticked(Message):
    reminders: list[int]  # ids of the reminders fired (prompts: answered, with ``wait``)
    started: list[str]  # jobs started
    runs: list[JobRun] = Field(default_factory=list)  # their ends, with ``wait``
    # ids of the scheduled prompts sent to the assistant (answered in the background;
    # with ``wait``, already answered or failed)
    prompts: list[int] = Field(default_factory=list)


class JobsStatus(Request):
    now: float | None = Field(default=None, allow_inf_nan=False)


class JobLine(BaseModel):
    """One line of ``reverie jobs`` (no version field: ``jobs --json`` prints it as is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    last_outcome: Literal["ok", "failed"] | None
    last_run_at: float | None
    next_eligible_at: float | None


class IdleInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    idle: bool
    idle_since: float | None
    eligible_at: float | None
    reason: str
    last_activity: float | None
    presence: dict[str, str]  # person -> "home" | "away"
    now: float


class JobsReport(Message):
    jobs: list[JobLine]
    idle: IdleInfo
    # each job's last run in words, by name: an ok run's detail line, a failed
    # run's error (``runtime.mind.registry.last_details``). For the text of ``reverie
    # jobs`` only: ``jobs --json`` keeps its fixed shape (``jobs`` and ``idle``).
    details: dict[str, str] = Field(default_factory=dict)


class RunJob(Request):
    """Fire one job now, past the idle gate (admin). ``wait``: answer when it ended."""

    name: str = Field(min_length=1, max_length=40)
    wait: bool = False
    now: float | None = Field(default=None, allow_inf_nan=False)


class Remind(Request):
    """Say ``text`` on ``channel`` at ``when`` (``tomorrow 8:00``, ``in 2 hours``,
    ``tuesday 19:00``..., read in the household's zone). ``kind`` ``ask``: a
    scheduled prompt, answered by the assistant as a turn. ``every``: repeat
    (``day``, ``week``, ``weekday``, ``N days``, ``N hours``)."""

    text: str = Field(min_length=1, max_length=2000)
    when: str = Field(min_length=1, max_length=100)
    channel: str = Field(default="cli", min_length=1, max_length=200)
    now: float | None = Field(default=None, allow_inf_nan=False)
    kind: Literal["say", "ask"] = "say"
    every: str | None = Field(default=None, min_length=1, max_length=40)


class Reminded(Message):
    id: int
    due_at: float
    due_local: str  # the due time in the household's zone, ISO 8601
    channel: str
    kind: Literal["say", "ask"] = "say"
    repeat: str | None = None  # the repeat rule as stored (``week``, ``3 days``...)


class ListReminders(Request):
    """The reminders still to fire (``reverie remind --list``)."""


class ReminderLine(BaseModel):
    """One pending reminder (no version field: ``remind --list --json`` prints it as is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int
    text: str
    channel: str
    kind: Literal["say", "ask"]
    repeat: str | None  # None: once
    due_at: float  # the next occurrence
    due_local: str  # the same in the household's zone, ISO 8601
    fired: int  # occurrences fired so far
    last_outcome: str | None  # said, answered, unanswered, refused
    error: str | None  # the last failed attempt, if the next firing has not cleared it


class ReminderList(Message):
    reminders: list[ReminderLine]


class CancelReminder(Request):
    """Cancel a pending reminder (a repeating one: every occurrence to come)."""

    id: int = Field(ge=1)


# -- a job off the hub: its bookkeeping on the hub (actors/job_snapshot.py) --------

#: A ``job_state`` value's JSON text may be this long.
JOB_STATE_MAX = 16 * 1024 * 1024


class HubJobState(Request):
    """What a job run on a snapshot needs from the hub when it starts."""


class JobStateRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(min_length=1, max_length=200)
    key: str = Field(min_length=1, max_length=1000)
    value: str = Field(max_length=JOB_STATE_MAX)  # JSON text


class QueueFile(BaseModel):
    """One file of the language model's retry queue (``runtime.llm.queue``:
    references, never memory content)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^(\d{12}|counters)\.json$")
    data: str = Field(max_length=1024 * 1024)


class JobStateRows(Message):
    """The hub's newest write-log id (what the snapshot must hold), every
    ``job_state`` row, and the files of the hub's language-model retry queue."""

    write_log_id: int = Field(ge=0)
    rows: list[JobStateRow] = Field(default_factory=list)
    llm_queue: list[QueueFile] = Field(default_factory=list)


class SaveLLMQueue(Request):
    """The retry queue as a run off the hub left it: the hub's queue becomes
    exactly these files."""

    files: list[QueueFile] = Field(default_factory=list, max_length=10_000)


class SaveJobState(Request):
    """Write one ``job_state`` row on the hub (a job run on a snapshot); ``at``:
    the job's clock."""

    job: str = Field(min_length=1, max_length=200)
    key: str = Field(min_length=1, max_length=1000)
    value: str = Field(max_length=JOB_STATE_MAX)  # JSON text
    at: float = Field(allow_inf_nan=False)


# -- the edge: location and presence (device/) ---------------------------------

class Fix(BaseModel):
    """One position fix (``device.records.LocationRecord`` on the wire)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    person: str = Field(min_length=1, max_length=80)
    lat: float = Field(ge=-90.0, le=90.0, allow_inf_nan=False)
    lon: float = Field(ge=-180.0, le=180.0, allow_inf_nan=False)
    at: float = Field(allow_inf_nan=False)
    source: str = Field(min_length=1, max_length=40)
    accuracy_m: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    device: str | None = Field(default=None, max_length=200)
    place: str | None = Field(default=None, max_length=200)
    event: str | None = Field(default=None, max_length=20)


class RecordFixes(Request):
    """Store fixes in the location history and back-fill user turns from them."""

    fixes: list[Fix] = Field(min_length=1, max_length=MAX_BATCH)


class FixesStored(Message):
    stored: int       # new fixes (one already stored is ignored)
    backfilled: int   # transcript rows that took a location


class LocationRequest(Request):
    pass


class LocationInfo(Message):
    fixes: int
    last_fix_at: float | None


class PresenceRequest(Request):
    pass


class PersonPresence(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state: Literal["home", "away"]
    place: str | None
    source: str | None
    since: float
    reported_at: float


class PresenceReport(Message):
    people: dict[str, PersonPresence]


class EdgeRequest(Request):
    pass


class EdgeInfo(Message):
    """``mqtt`` of ``reverie status --json``."""

    configured: bool
    connected: bool
    subscribed: bool = False  # the broker granted the topic subscriptions (SUBACK)
    accepted: int = 0
    rejected: dict[str, int] = Field(default_factory=dict)
    stored: int = 0
    pending: int = 0
    broker: str | None = None
    connects: int = 0
    disconnects: int = 0
    last_message_at: float | None = None
    last_connect_at: float | None = None
    error: str | None = None


class PublishFix(Request):
    """Publish a GPS fix on Reverie's own topic (``<prefix>/gps/<person>``)."""

    fix: Fix


Status.model_rebuild()
