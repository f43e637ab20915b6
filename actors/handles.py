"""Typed clients of the actors: how one actor (or a script) calls another.

Each client wraps one named actor: one method per request type of
``actors/messages.py``, typed with the request and its reply, so the flow of
a turn reads as ``transcript.append(AppendTurns(...))`` and mypy checks it.

The Ray handle is looked up once, on first use (actors start in order and
may name one that starts later), and looked up again after the actor is gone
(``ActorDiedError`` or ``ActorUnavailableError``: killed, or replaced by a new
runtime). A call that is safe to repeat (a read, an idempotent write) is then
sent once more to the new handle; any other call raises and the next call uses
the new handle. Every call has a timeout. An error raised inside the callee
reaches the caller as itself (``BadRequest`` stays ``BadRequest``), not as a
``RayTaskError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Literal, TypeVar

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from actors.common import (
    CRON,
    EDGE,
    EPISODES,
    GRAPH,
    HTTP,
    RECALL,
    TRANSCRIPT,
    TURNS,
    BadRequest,
    HouseholdElsewhere,
    HouseholdMoving,
    bad_request,
    own_ref,
    unwrap,
)
from actors.household_routing import OWNERS, actor_name, route
from actors.messages import (
    Ack,
    Activity,
    AddEpisode,
    AddFact,
    AddMood,
    AddPortrait,
    AppendTurns,
    BrowseMemories,
    CancelReminder,
    ChangeMemory,
    Compact,
    Compacted,
    DigestsWritten,
    DropFromIndex,
    EdgeInfo,
    EdgeRequest,
    EditMemory,
    Embed,
    Embedded,
    EpisodeWritten,
    ExpireWriteLog,
    FactWritten,
    FindMemories,
    FixesStored,
    HubJobState,
    IndexSynced,
    JobRun,
    JobsReport,
    JobsStatus,
    JobStateRows,
    ListReminders,
    LocationInfo,
    LocationRequest,
    MemoryMatches,
    MemoryPage,
    MemoryView,
    MoodWritten,
    NearestFound,
    NearestMemory,
    PortraitWritten,
    Presence,
    PresenceReport,
    PresenceRequest,
    ProfileUpdated,
    PruneTranscript,
    PublishFix,
    PurgeTombstones,
    Recall,
    Recalled,
    RecentTurns,
    RecordFixes,
    Remind,
    Reminded,
    ReminderList,
    Request,
    RunJob,
    SaveJobState,
    SaveLLMQueue,
    SyncIndex,
    Tick,
    Ticked,
    TombstonesPurged,
    TouchEpisodes,
    TranscriptPruned,
    TurnDelta,
    TurnList,
    TurnReply,
    TurnsAppended,
    UpdateProfile,
    UpdateThread,
    UserTurn,
    ViewMemory,
    WriteDigests,
    WriteLogExpired,
)
from runtime.config import HUB_HOUSEHOLD
from runtime.memories.refs import MemoryService, NoSuchItem, change, edit
from runtime.store.households import check_id

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
MOVE_POLL_S = 0.2  # a request refused while its household moves is sent again this often

R = TypeVar("R")
Kind = Literal["turn", "episode", "fact"]

GONE = (ActorDiedError, ActorUnavailableError)


class NoActor(RuntimeError):
    """No actor of that name is running in the namespace."""


class NoSuchMemory(BadRequest, NoSuchItem):
    """A well-formed ref that names no stored item (``no fact 12``): a
    ``BadRequest`` like any other refused request, and a
    :class:`runtime.memories.refs.NoSuchItem`, so the HTTP API can answer 404."""


class ActorClient:
    """A client of one named actor; subclasses add one typed method per request."""

    name: ClassVar[str]

    def __init__(self, namespace: str, timeout_s: float = CALL_TIMEOUT_S,
                 handle: Any = None, household: str = HUB_HOUSEHOLD) -> None:
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.household = check_id(household)
        self._handle: Any = handle
        self._lock = threading.Lock()  # clients are shared by a threaded actor's threads

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.namespace!r}, household={self.household!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # sent elsewhere (a task, another actor), a client looks its actor up there
        return (type(self), (self.namespace, self.timeout_s, None, self.household))

    def _ours(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The call's request filled with this client's household. A request that
        names another household is refused here (BadRequest): a client never
        carries one household's request to another's store."""
        if not args or not isinstance(args[0], Request):
            return args
        msg = args[0]
        if msg.household == self.household:
            return args
        if "household" in msg.model_fields_set:
            raise BadRequest(f"a request for household {msg.household!r} sent through "
                             f"a client of household {self.household!r}")
        return (msg.model_copy(update={"household": self.household}), *args[1:])

    def _nothing(self) -> Request:
        """A request that says only which household (for calls without a message)."""
        return Request(household=self.household)

    def actor_name(self) -> str:
        """The actor serving this client's household: an owner of the node its
        route names (``actors/household_routing.py``); ``home``'s is the hub's."""
        if self.household == HUB_HOUSEHOLD or self.name not in OWNERS:
            return self.name
        return actor_name(self.name, route(self.namespace, self.household))

    @property
    def handle(self) -> Any:
        """The Ray handle, looked up on first use and after the actor was gone."""
        with self._lock:
            if self._handle is None:
                name = self.actor_name()
                try:
                    self._handle = ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    raise NoActor(f"no {name} actor in namespace "
                                  f"{self.namespace!r}") from None
            return self._handle

    def _gone(self, handle: Any) -> None:
        """Drop ``handle`` (if it is still the current one): the next call looks up again."""
        with self._lock:
            if self._handle is handle:
                self._handle = None

    def submit(self, method: str, *args: Any) -> Any:
        """Send a call without waiting; return its object ref."""
        return getattr(self.handle, method).remote(*self._ours(args))

    def call(self, method: str, *args: Any, reply: type[R], retry: bool = False,
             timeout: float | None = None) -> R:
        """Call ``method`` and wait for its ``reply``. ``retry``: the call is safe
        to repeat, so it is sent once more after the actor was found gone."""
        wait = self.timeout_s if timeout is None else timeout
        attempts = 2 if retry else 1
        args = self._ours(args)
        # A household being moved, or moved: the owner refused the request before
        # carrying it out, so it is sent again (to the node its route names now),
        # until the move ends or the call's time is up.
        deadline = time.monotonic() + wait
        attempt = 0
        while attempt < attempts:
            handle = self.handle
            try:
                out = ray.get(getattr(handle, method).remote(*args), timeout=wait)
            except RayTaskError as exc:  # raised inside the callee: hand it on as itself
                cause = unwrap(exc)
                if (isinstance(cause, HouseholdMoving | HouseholdElsewhere)
                        and time.monotonic() + MOVE_POLL_S < deadline):
                    self._gone(handle)
                    time.sleep(MOVE_POLL_S)
                    continue
                raise cause from None
            except GONE:
                attempt += 1
                self._gone(handle)
                if attempt == attempts:
                    raise
                log.info("%s actor gone; calling %s again on a fresh handle",
                         self.name, method)
                continue
            if not isinstance(out, reply):
                raise TypeError(f"{self.name}.{method} answered {type(out).__name__}, "
                                f"expected {reply.__name__}")
            return out
        raise AssertionError("unreachable")

    def ping(self, timeout: float | None = None) -> str:
        return self.call("ping", reply=str, retry=True, timeout=timeout)


class TranscriptClient(ActorClient):
    name = TRANSCRIPT

    def append(self, msg: AppendTurns) -> TurnsAppended:
        # repeatable only when every turn carries a request id
        return self.call("append", msg, reply=TurnsAppended,
                         retry=all(t.request_id for t in msg.turns))

    def recent(self, msg: RecentTurns) -> TurnList:
        return self.call("recent", msg, reply=TurnList, retry=True)

    def change(self, msg: ChangeMemory) -> Ack:
        return self.call("change", msg, reply=Ack)

    def edit(self, msg: EditMemory) -> Ack:
        """Always refused (the transcript is append-only); the ack type keeps
        the three owners alike."""
        return self.call("edit", msg, reply=Ack)

    def counts(self, timeout: float | None = None) -> dict[str, int]:
        return self.call("counts", self._nothing(), reply=dict, retry=True, timeout=timeout)

    def compact(self, msg: Compact) -> Compacted:
        return self.call("compact", msg, reply=Compacted)

    def prune(self, msg: PruneTranscript) -> TranscriptPruned:
        # repeatable: a second prune finds only what is still prunable
        return self.call("prune", msg, reply=TranscriptPruned, retry=True)

    def expire_write_log(self, msg: ExpireWriteLog) -> WriteLogExpired:
        """Expire the write-log history of pruned transcript rows (repeatable)."""
        return self.call("expire_write_log", msg, reply=WriteLogExpired, retry=True)

    def flush(self) -> Ack:
        return self.call("flush", self._nothing(), reply=Ack, retry=True)

    def record_fixes(self, msg: RecordFixes) -> FixesStored:
        # repeatable: a fix already stored is ignored
        return self.call("record_fixes", msg, reply=FixesStored, retry=True)

    def location(self, timeout: float | None = None) -> LocationInfo:
        return self.call("location", LocationRequest(), reply=LocationInfo, retry=True,
                         timeout=timeout)


class RecallClient(ActorClient):
    name = RECALL

    def recall(self, msg: Recall) -> Recalled:
        return self.call("recall", msg, reply=Recalled, retry=True)

    def embedder_info(self) -> tuple[str, int]:
        """The name and dimension of the model Recall holds."""
        return self.call("embedder_info", reply=tuple, retry=True)

    def embed(self, msg: Embed) -> Embedded:
        return self.call("embed", msg, reply=Embedded, retry=True)

    def sync(self, msg: SyncIndex | None = None) -> IndexSynced:
        return self.call("sync", msg, reply=IndexSynced, retry=True)

    def drop(self, msg: DropFromIndex) -> Ack:
        return self.call("drop", msg, reply=Ack, retry=True)

    def find(self, msg: FindMemories) -> MemoryMatches:
        return self.call("find", msg, reply=MemoryMatches, retry=True)

    def nearest(self, msg: NearestMemory) -> NearestFound:
        """The live memory nearest to a text (the near-duplicate check)."""
        return self.call("nearest", msg, reply=NearestFound, retry=True)

    def browse(self, msg: BrowseMemories) -> MemoryPage:
        return self.call("browse", msg, reply=MemoryPage, retry=True)

    def view(self, msg: ViewMemory) -> MemoryView:
        """One memory; :class:`NoSuchMemory` when the ref names nothing."""
        return self.call("view", msg, reply=MemoryView, retry=True)

    def save(self, timeout: float | None = None) -> Ack:
        return self.call("save", reply=Ack, retry=True, timeout=timeout)

    def pending(self) -> int:
        """Memory items still waiting for a vector."""
        return self.call("pending", self._nothing(), reply=int, retry=True)

    def clear(self) -> Ack:
        """Drop every vector; syncs re-embed everything."""
        return self.call("clear", self._nothing(), reply=Ack, retry=True)

    def before_forget(self, kind: Kind, item_id: int) -> None:
        """Take an item out of the index before its row is deleted (the delete
        takes the item's vector row with it, and with it the index label)."""
        try:
            self.drop(DropFromIndex(kind=kind, item_id=item_id))
        except Exception as exc:  # the next start reconciles the index with the rows
            log.warning("index drop before forgetting %s:%d failed: %s", kind, item_id,
                        type(exc).__name__)

    def after_change(self, kind: Kind, item_id: int, change: str) -> None:
        """Bring the index in step after a committed disable or enable: a
        disabled item's vector goes, an enabled one is indexed again.

        The change is committed already, so a failure here is logged, not
        raised: recall checks rows, never trusts a vector alone, and the next
        start re-syncs."""
        try:
            if change == "enable":
                self.sync(SyncIndex(refs=[f"{kind}:{item_id}"]))
            else:
                self.drop(DropFromIndex(kind=kind, item_id=item_id))
        except Exception as exc:
            log.warning("index update after %s of %s:%d failed: %s", change, kind, item_id,
                        type(exc).__name__)

    def after_edit(self, kind: Kind, item_id: int) -> None:
        """Bring the index in step after a committed edit of an item's text: its
        old vector goes and the new text is embedded now (a disabled item stays
        out until it is enabled). A failure is logged, not raised, as in
        :meth:`after_change`: the edit is committed, and recall joins every
        vector hit against the row."""
        try:
            self.drop(DropFromIndex(kind=kind, item_id=item_id))
            self.sync(SyncIndex(refs=[f"{kind}:{item_id}"]))
        except Exception as exc:
            log.warning("index update after an edit of %s:%d failed: %s", kind, item_id,
                        type(exc).__name__)

    def sync_some_async(self) -> Any:
        """A writer's "there is news" notification; returns its object ref."""
        return self.submit("sync_some", self._nothing())

    def drop_async(self, msg: DropFromIndex) -> Any:
        return self.submit("drop", msg)


class EpisodesClient(ActorClient):
    name = EPISODES

    def add(self, msg: AddEpisode) -> EpisodeWritten:
        return self.call("add", msg, reply=EpisodeWritten)

    def change(self, msg: ChangeMemory) -> Ack:
        return self.call("change", msg, reply=Ack)

    def edit(self, msg: EditMemory) -> Ack:
        """Rewrite an episode's gist; the ack's detail is its ref."""
        return self.call("edit", msg, reply=Ack)

    def touch_async(self, msg: TouchEpisodes) -> Any:
        """Refresh used episodes without waiting; returns the object ref."""
        return self.submit("touch", msg)

    def update_thread(self, msg: UpdateThread) -> Ack:
        """Resolve or escalate an episode's open thread."""
        return self.call("update_thread", msg, reply=Ack)

    def add_mood(self, msg: AddMood) -> MoodWritten:
        return self.call("add_mood", msg, reply=MoodWritten)

    def purge_tombstones(self, msg: PurgeTombstones) -> TombstonesPurged:
        # repeatable: a second purge at the same instant finds nothing more
        return self.call("purge_tombstones", msg, reply=TombstonesPurged, retry=True)

    def expire_write_log(self, msg: ExpireWriteLog) -> WriteLogExpired:
        """Expire the write-log history of purged episodes (repeatable)."""
        return self.call("expire_write_log", msg, reply=WriteLogExpired, retry=True)


class GraphClient(ActorClient):
    name = GRAPH

    def add(self, msg: AddFact) -> FactWritten:
        return self.call("add", msg, reply=FactWritten)

    def add_portrait(self, msg: AddPortrait) -> PortraitWritten:
        return self.call("add_portrait", msg, reply=PortraitWritten)

    def write_digests(self, msg: WriteDigests) -> DigestsWritten:
        return self.call("write_digests", msg, reply=DigestsWritten)

    def update_profile(self, msg: UpdateProfile) -> ProfileUpdated:
        return self.call("update_profile", msg, reply=ProfileUpdated)

    def change(self, msg: ChangeMemory) -> Ack:
        return self.call("change", msg, reply=Ack)

    def edit(self, msg: EditMemory) -> Ack:
        """Correct a fact: a new claim supersedes it; the ack's detail is the new ref."""
        return self.call("edit", msg, reply=Ack)


class TurnsClient(ActorClient):
    name = TURNS

    def process(self, msg: UserTurn) -> TurnReply:
        return self.call("process", msg, reply=TurnReply)

    def process_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]:
        """The turn's reply piece by piece as the actor yields it (a Ray
        streaming generator), ending with the stored :class:`TurnReply`. An
        error in the actor is raised from the iterator, as itself."""
        gen = self.handle.process_stream.options(num_returns="streaming").remote(
            *self._ours((msg,)))
        for ref in gen:
            try:
                out = ray.get(ref, timeout=self.timeout_s)
            except RayTaskError as exc:
                raise unwrap(exc) from None
            if not isinstance(out, TurnDelta | TurnReply):
                raise TypeError(f"{self.name}.process_stream yielded {type(out).__name__}")
            yield out

    def waiting(self) -> dict[str, int]:
        """Per busy channel, the turns waiting behind the one running."""
        return self.call("waiting", self._nothing(), reply=dict, retry=True)


class CronClient(ActorClient):
    name = CRON

    def activity(self, msg: Activity) -> Ack:
        return self.call("activity", msg, reply=Ack, retry=True)

    def activity_async(self, msg: Activity) -> Any:
        """Fire and forget (the turn path never waits for Cron)."""
        return self.submit("activity", msg)

    def presence(self, msg: Presence) -> Ack:
        return self.call("presence", msg, reply=Ack, retry=True)

    def tick(self, msg: Tick | None = None, timeout: float | None = None) -> Ticked:
        return self.call("tick", msg or Tick(), reply=Ticked, timeout=timeout)

    def status(self, msg: JobsStatus | None = None) -> JobsReport:
        return self.call("status", msg or JobsStatus(), reply=JobsReport, retry=True)

    def run(self, msg: RunJob, timeout: float | None = None) -> JobRun:
        return self.call("run", msg, reply=JobRun, timeout=timeout)

    def remind(self, msg: Remind) -> Reminded:
        return self.call("remind", msg, reply=Reminded)

    def list_reminders(self, msg: ListReminders | None = None) -> ReminderList:
        return self.call("list_reminders", msg or ListReminders(), reply=ReminderList,
                         retry=True)

    def cancel_reminder(self, msg: CancelReminder) -> Ack:
        # idempotent: a reminder cancelled already answers Ack again
        return self.call("cancel_reminder", msg, reply=Ack, retry=True)

    def presence_report(self, timeout: float | None = None) -> PresenceReport:
        return self.call("presence_report", PresenceRequest(), reply=PresenceReport,
                         retry=True, timeout=timeout)

    def hub_job_state(self) -> JobStateRows:
        return self.call("hub_job_state", HubJobState(), reply=JobStateRows, retry=True)

    def save_job_state(self, msg: SaveJobState) -> Ack:
        # idempotent: the same row written twice is the same row
        return self.call("save_job_state", msg, reply=Ack, retry=True)

    def save_llm_queue(self, msg: SaveLLMQueue) -> Ack:
        # idempotent: the queue becomes these files, however often
        return self.call("save_llm_queue", msg, reply=Ack, retry=True)


class EdgeClient(ActorClient):
    """The edge: the MQTT bridge and the GPS reader (running only when configured)."""

    name = EDGE

    def stats(self, timeout: float | None = None) -> EdgeInfo:
        return self.call("stats", EdgeRequest(), reply=EdgeInfo, retry=True, timeout=timeout)

    def publish_fix_async(self, msg: PublishFix) -> Any:
        return self.submit("publish_fix", msg)


class HttpClient(ActorClient):
    """The HTTP server's actor (running when ``http.enabled``)."""

    name = HTTP

    def address(self, timeout: float | None = None) -> str:
        """Its base URL, ``http://127.0.0.1:PORT``."""
        return self.call("address", reply=str, retry=True, timeout=timeout)

    def stop(self, timeout: float | None = None) -> Ack:
        return self.call("stop", reply=Ack, retry=True, timeout=timeout)


OWNER_CLIENTS: dict[str, type[TranscriptClient | EpisodesClient | GraphClient]] = {
    "turn": TranscriptClient, "episode": EpisodesClient, "fact": GraphClient,
}


def owner(ref: str, namespace: str, timeout_s: float = CALL_TIMEOUT_S,
          household: str = HUB_HOUSEHOLD) -> TranscriptClient | EpisodesClient | GraphClient:
    """A client of the actor that owns ``ref`` (``turn:12``, ``episode:3``, ``fact:7``)
    in ``household``."""
    kind = ref.partition(":")[0]
    try:
        return OWNER_CLIENTS[kind](namespace, timeout_s, household=household)
    except KeyError:
        raise ValueError(f"{ref!r} is not a memory ref (turn:, episode: or fact:)") from None


DONE: dict[str, str] = {"disable": "disabled", "enable": "enabled", "delete": "deleted",
                        "pin": "pinned", "unpin": "unpinned",
                        "sensitive": "marked sensitive", "not_sensitive": "marked not sensitive"}


def change_memory(recall: RecallClient, service: MemoryService, msg: ChangeMemory,
                  kind: Kind) -> Ack:
    """An owner's side of :class:`ChangeMemory`: change the item through the
    service that owns it (:func:`runtime.memories.refs.change`) and keep Recall's index
    in step. A ref of another kind is a BadRequest, an id with no item a
    :class:`NoSuchMemory`, a change the kind does not have (pinning a turn) a
    BadRequest.

    Forgetting drops the vector first (the row's delete takes its vector row,
    and so the index label, with it); if the forget then fails, the item is
    handed back to the indexer. Pinning changes only a weight recall computes
    from the row: the index is left as it is."""
    ref = own_ref(msg.ref, kind)
    if service.get(ref.id) is None:
        raise NoSuchMemory(f"no {kind} {ref.id}")
    if msg.change == "delete":
        recall.before_forget(kind, ref.id)
        try:
            change(service, ref, msg.change, msg.writer)
        except BaseException:
            recall.after_change(kind, ref.id, "enable")
            raise
    elif msg.change in ("pin", "unpin", "sensitive", "not_sensitive"):  # index unchanged
        try:
            change(service, ref, msg.change, msg.writer)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    else:
        change(service, ref, msg.change, msg.writer)
        recall.after_change(kind, ref.id, msg.change)
    return Ack(detail=f"{kind} {ref.id} {DONE[msg.change]}")


def edit_memory(recall: RecallClient, service: MemoryService, msg: EditMemory,
                kind: Kind) -> Ack:
    """An owner's side of :class:`EditMemory`: edit the item through the service
    that owns it (:func:`runtime.memories.refs.edit`), then have Recall re-embed what
    now holds the text. The ack's detail is that ref (an episode keeps its
    own; a fact's correction is a new fact). A ref of another kind, or an edit
    refused (a turn, a fact that is history), is a BadRequest; an id with no
    item a :class:`NoSuchMemory`."""
    ref = own_ref(msg.ref, kind)
    if service.get(ref.id) is None:
        raise NoSuchMemory(f"no {kind} {ref.id}")
    try:
        now = edit(service, ref, msg.text, msg.writer)
    except NoSuchItem as exc:  # gone in between
        raise NoSuchMemory(str(exc)) from None
    except ValueError as exc:  # refused; pydantic's ValidationError is one too
        raise bad_request(exc) from None
    recall.after_edit(now.kind, now.id)
    return Ack(detail=str(now))
