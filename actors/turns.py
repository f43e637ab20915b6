"""The Turns actor: the shell of the turn path.

The turn itself (who is listening, turn-zero recall, the prompt, a pull
channel's tool rounds, the citations and the reply written) is the turn's core,
plain functions in :mod:`runtime.turn`; read its module docstring for the path
of a turn, step by step. This actor wires the core to the other actors (the
Transcript, Recall, Graph and Episodes actors, through their clients) and keeps
what is its own business:

- the message accepted (:meth:`TurnsActor._accept`: a valid :class:`UserTurn`
  on a configured channel) and the Cron actor told the user is here;
- per-channel order (:class:`ChannelQueue`);
- a turn re-sent with the request id of one already answered (a caller's
  retry, or the Cron actor firing a scheduled prompt again after a crash) is
  answered with the stored reply: the language model is not asked twice,
  nothing is written again (:meth:`TurnsActor._answered`);
- fire-and-forget notes: Recall told of the turn after turn-zero recall, the
  Episodes actor of the episodes used; metrics; the language model's notice.

:meth:`TurnsActor.process_stream` is the same path for streamed replies (a Ray
streaming generator): it yields each piece of the reply as the language model
sends it (:class:`TurnDelta`), then the stored :class:`TurnReply`. The reply is
written once it is complete, also when nobody is reading the stream any more;
a stream that breaks half-way keeps the words that came. A pull channel's tool
rounds are whole answers, so its answer comes in one piece.

Channels are served concurrently: the actor is threaded (the Supervisor sets
``max_concurrency``), so a slow language model in one room never holds up
another. Within a channel, turns run one at a time in the order they reached
the actor (:class:`ChannelQueue`), so each turn sees the previous one and its
reply in its history, and the transcript keeps question-answer order.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

from pydantic import ValidationError

from actors import metrics
from actors.common import (
    BadRequest,
    accept,
    bad_request,
    load_profiles,
    open_store,
    setup_logging,
)
from actors.handles import (
    CronClient,
    EpisodesClient,
    GraphClient,
    RecallClient,
    TranscriptClient,
)
from actors.households import serving
from actors.messages import (
    Activity,
    AppendTurns,
    ClientMessage,
    ClientToolCall,
    Conversation,
    MemoryItem,
    Recall,
    Recalled,
    RecentTurns,
    TouchEpisodes,
    TurnDelta,
    TurnReply,
    TurnRow,
    UserTurn,
)
from actors.remember_turn import TurnRemembering
from runtime import turn
from runtime.config import ChannelSettings, Settings
from runtime.llm.persona import PersonaLoader
from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    LLMError,
    Tool,
    ToolCall,
    make_llm,
)
from runtime.llm.queue import LLMHealth
from runtime.memories.portrait import PortraitReader
from runtime.memories.transcript import ToolCallIn, TurnIn
from runtime.recall.reader import StoreReader
from runtime.store.database import Store
from runtime.time.clock import Clock, SystemClock, household_zone

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
NO_ANSWER = turn.NO_ANSWER
STORED = "stored"  # the provider of a reply answered before (a re-sent turn)
# client turns waiting for their tool results (the memory layer), kept by request id
OPEN_TURNS = 32

Prepared = turn.Prepared[MemoryItem]


def client_of(conversation: Conversation) -> turn.Client:
    """A client's conversation as the turn's core takes it."""
    return turn.Client(
        system=conversation.system,
        history=[chat_message(m) for m in conversation.history],
        continuation=[chat_message(m) for m in conversation.continuation],
        tools=[Tool(name=t.name, description=t.description, parameters=t.parameters)
               for t in conversation.tools],
        options=dict(conversation.options), images=list(conversation.images))


def chat_message(m: ClientMessage) -> ChatMessage:
    return ChatMessage(role=m.role, content=m.content, tool_call_id=m.tool_call_id,
                       images=list(m.images),
                       tool_calls=[ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                                   for c in m.tool_calls])


class ChannelQueue:
    """One turn at a time per channel, first come first served; channels never
    wait for each other. ``on_change`` hears the number of turns waiting, over
    all channels, whenever it changes."""

    def __init__(self, on_change: Callable[[int], None] | None = None) -> None:
        self._on_change = on_change or (lambda waiting: None)
        self._cond = threading.Condition()
        self._issued: dict[str, int] = {}   # next ticket to hand out, per channel
        self._serving: dict[str, int] = {}  # ticket allowed to run, per channel
        self._waiting: dict[str, int] = {}  # turns blocked behind another, per channel

    @contextmanager
    def turn(self, channel: str) -> Iterator[None]:
        with self._cond:
            ticket = self._issued.get(channel, 0)
            self._issued[channel] = ticket + 1
            if self._serving.get(channel, 0) != ticket:
                self._waiting[channel] = self._waiting.get(channel, 0) + 1
                self._on_change(sum(self._waiting.values()))
                self._cond.wait_for(lambda: self._serving.get(channel, 0) == ticket)
                self._waiting[channel] -= 1
                if not self._waiting[channel]:
                    del self._waiting[channel]
                self._on_change(sum(self._waiting.values()))
        try:
            yield
        finally:
            with self._cond:
                self._serving[channel] = ticket + 1
                if self._serving[channel] == self._issued[channel]:  # nobody queued
                    del self._serving[channel], self._issued[channel]
                self._cond.notify_all()

    def waiting(self) -> dict[str, int]:
        """Per channel, the turns blocked behind the one running."""
        with self._cond:
            return dict(self._waiting)


class HouseholdTurns:
    """The Turns actor's work for one household (``actors/households.py``)."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        setup_logging(settings, "turns")
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.zone = household_zone(settings.household.timezone)
        self.persona = PersonaLoader.from_settings(settings.persona)
        # thread-safe (FallbackChain); its notice is durable: it survives a restart
        self.llm = make_llm(settings.llm, LLMHealth(settings.store.resolved_dir, self.clock))
        namespace, household = settings.runtime.namespace, settings.household.id
        self.transcript = TranscriptClient(namespace, CALL_TIMEOUT_S, household=household)
        self.recall = RecallClient(namespace, CALL_TIMEOUT_S, household=household)
        self.cron = CronClient(namespace, CALL_TIMEOUT_S, household=household)
        self.episodes = EpisodesClient(namespace, CALL_TIMEOUT_S, household=household)
        # "remember: ..." in a turn: stored during the turn (actors.remember_turn)
        graph = GraphClient(namespace, CALL_TIMEOUT_S, household=household)
        self.remembering = TurnRemembering(graph, self.recall,
                                           load_profiles(settings), self.clock)
        self.channels = ChannelQueue(partial(metrics.queue_depth, "turns_waiting"))
        # its own read connection, opened on the first seeded turn
        self.portrait = PortraitReader(partial(open_store, settings, self.clock))
        # the profile, the trajectory (digests), the mood and a pull channel's
        # memory index: one read connection, opened on the first turn
        self.reader = StoreReader(partial(open_store, settings, self.clock))
        # the turn's core (runtime.turn) reaches the other actors through these
        self.wiring: turn.Wiring[MemoryItem] = turn.Wiring(
            append=self._append, remember=self.remembering.store, recent=self._recent,
            recall=self._recall, recalled=self._index_soon, touch=self._touch_used,
            persona=self.persona.load, portrait=self.portrait.lines, read=self.reader.read)
        # a read connection for re-sent turns (those with a caller's request id),
        # opened on the first one
        self._replies: Store | None = None
        self._replies_lock = threading.Lock()
        # a client's turn whose model called the client's tools, by request id:
        # its results continue it with the same memory context (no second recall)
        self._open: OrderedDict[str, Prepared] = OrderedDict()
        self._open_lock = threading.Lock()

    def _user_turn_in(self, msg: UserTurn) -> TurnIn:
        try:
            return TurnIn(channel=msg.channel, source=msg.source, role="user",
                          content=msg.text, speaker=msg.speaker, location=msg.location,
                          request_id=msg.request_id or turn.new_request_id())
        except ValidationError as exc:
            raise bad_request(exc) from None

    def _accept(self, msg: UserTurn) -> tuple[UserTurn, ChannelSettings, TurnIn]:
        msg = accept(UserTurn, msg)
        channel = self.settings.channels.get(msg.channel)
        if channel is None:
            known = ", ".join(sorted(self.settings.channels))
            raise BadRequest(f"unknown channel {msg.channel!r}; configured channels: {known}")
        user_turn = self._user_turn_in(msg)
        if msg.source == "user" and not channel.background:
            self._tell_cron()
        return msg, channel, user_turn

    def process(self, msg: UserTurn) -> TurnReply:
        msg, channel, user_turn = self._accept(msg)
        with self.channels.turn(msg.channel):
            answered = self._answered(msg, user_turn)
            if answered is not None:
                return answered
            prepared = self._prepare(msg, channel, user_turn)
            answer = self._answer(prepared, msg.model)
            metrics.turn(msg.channel, streamed=False)
            return self._finish(prepared, answer)

    def process_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]:
        """:meth:`process`, streamed: :class:`TurnDelta` pieces as the language
        model sends them, then the stored :class:`TurnReply`."""
        msg, channel, user_turn = self._accept(msg)
        with self.channels.turn(msg.channel):
            answered = self._answered(msg, user_turn)
            if answered is not None:
                yield TurnDelta(text=answered.text)
                yield answered
                return
            prepared = self._prepare(msg, channel, user_turn)
            pieces: list[str] = []
            provider = "none"
            pulled: turn.Answer[MemoryItem] | None = None
            calls: list[ToolCall] = []  # of the client's tools (the memory layer)
            try:
                if prepared.pull:  # whole rounds of tool calls: the answer in one piece
                    pulled = self._answer(prepared, msg.model)
                    provider = pulled.provider
                    pieces.append(pulled.text)
                    yield TurnDelta(text=pulled.text)
                else:
                    for name, piece in self.llm.stream(prepared.request, prefer=msg.model):
                        provider = name
                        if isinstance(piece, ToolCall):
                            calls.append(piece)
                            continue
                        pieces.append(piece)
                        yield TurnDelta(text=piece)
            except AllProvidersFailed as exc:
                log.error("no language model answered: %s", exc)
                pieces = [NO_ANSWER]
                yield TurnDelta(text=NO_ANSWER)
            except LLMError as exc:  # broke after the first words: keep them
                log.warning("the reply stream from %s broke: %s", provider, exc.kind)
            metrics.turn(msg.channel, streamed=True)
            yield self._finish(prepared, pulled if pulled is not None
                               else turn.Answer("".join(pieces), provider,
                                                client_calls=calls if prepared.opening else []))

    def _answered(self, msg: UserTurn, user_turn: TurnIn) -> TurnReply | None:
        """The reply already stored to a re-sent turn (the caller's request id):
        the language model is not asked again. Checked in the channel's queue, so
        a re-send that arrives while the first is answered waits and finds it."""
        if msg.temporary or msg.request_id is None:
            return None
        with self._replies_lock:
            if self._replies is None:
                self._replies = open_store(self.settings, self.clock)
            reply = self._replies.row(
                "SELECT id, content, citations FROM transcript WHERE request_id = ?",
                (f"reply-{user_turn.request_id}",))
            if reply is None:
                return None
            asked = self._replies.scalar("SELECT id FROM transcript WHERE request_id = ?",
                                         (user_turn.request_id,))
        log.info("turn re-sent: answered with the stored reply %d", reply["id"])
        return TurnReply(turn_id=None if asked is None else int(asked), reply_id=reply["id"],
                         text=reply["content"], citations=json.loads(reply["citations"] or "[]"),
                         provider=STORED, notice=self.llm.notice)

    def _prepare(self, msg: UserTurn, channel: ChannelSettings, user_turn: TurnIn) -> Prepared:
        """The turn written, recalled for and its request built (runtime.turn.prepare).
        A client's turn going on with its tool results takes the memory context
        it was prepared with (runtime.turn.resume): no second recall."""
        client = None if msg.conversation is None else client_of(msg.conversation)
        asked = turn.Asked(user_turn, channel, msg.temporary, client, msg.room)
        if client is not None and client.continuation:
            with self._open_lock:
                opened = self._open.get(user_turn.request_id or "")
            if opened is not None:
                return turn.resume(opened, asked)
            log.info("a client's tool results came for a turn not open here: recalled again")
        return turn.prepare(asked, self.settings, self.wiring, self.clock, self.zone)

    def _answer(self, prepared: Prepared, prefer: str | None) -> turn.Answer[MemoryItem]:
        """The model's answer; on a pull channel, after the recall calls it makes
        (answered by Recall: runtime.turn.answer)."""
        return turn.answer(prepared, partial(self.llm.complete, prefer=prefer), self._recall)

    def _finish(self, prepared: Prepared, answer: turn.Answer[MemoryItem]) -> TurnReply:
        """The reply written with its citations (runtime.turn.finish), as the actor's reply."""
        done = turn.finish(prepared, answer, self.wiring)
        self._keep_open(prepared, bool(done.tool_calls))
        return TurnReply(turn_id=done.turn_id, reply_id=done.reply_id, text=done.text,
                         citations=done.citations, provider=done.provider,
                         recall_degraded=done.recall_degraded, notice=self.llm.notice,
                         tool_calls=[ClientToolCall(id=c.id, name=c.name, arguments=c.arguments)
                                     for c in done.tool_calls])

    def _keep_open(self, prepared: Prepared, calls: bool) -> None:
        """A client's turn stays open while the client runs its tools (the
        oldest forgotten past :data:`OPEN_TURNS`), and is closed once answered."""
        key = prepared.asked.turn.request_id
        if prepared.asked.client is None or key is None:
            return
        with self._open_lock:
            if not calls:
                self._open.pop(key, None)
                return
            self._open[key] = prepared
            self._open.move_to_end(key)
            while len(self._open) > OPEN_TURNS:
                self._open.popitem(last=False)

    # -- the core's wiring: the other actors ------------------------------------------

    def _append(self, turn_in: TurnIn, *, citations: list[str] | None = None,
                tool_calls: Sequence[ToolCallIn] = (), index_now: bool = True) -> int:
        """One turn to the Transcript actor (it tells Recall when ``index_now``)."""
        return self.transcript.append(AppendTurns(
            turns=[turn_in], citations=None if citations is None else [citations],
            tool_calls=[list(tool_calls)] if tool_calls else None, index_now=index_now)).ids[0]

    def _recent(self, channel: str, limit: int) -> list[TurnRow]:
        return self.transcript.recent(RecentTurns(channel=channel, limit=limit)).turns

    def _recall(self, query: str, max_items: int | None, exclude: list[str]) -> Recalled:
        return self.recall.recall(Recall(query=query, max_items=max_items, exclude=exclude))

    def _touch_used(self, ids: list[int]) -> None:
        """The episodes given to the model become relevant again (fire and
        forget: a turn never waits for it, nor fails for it)."""
        try:
            self.episodes.touch_async(TouchEpisodes(ids=ids, at=self.clock.now()))
        except Exception as exc:
            log.debug("cannot refresh used episodes: %s", type(exc).__name__)

    def _index_soon(self) -> None:
        """Tell Recall there is news (fire and forget): the turn just answered
        for, written without telling it."""
        try:
            self.recall.sync_some_async()
        except Exception as exc:  # the next write's notification catches up
            log.debug("cannot tell recall about the turn: %s", type(exc).__name__)

    def _tell_cron(self) -> None:
        """The user is here: idleness starts again (fire and forget; the turn
        never waits for Cron, nor fails for it)."""
        try:
            self.cron.activity_async(Activity(at=self.clock.now()))
        except Exception as exc:  # no Cron (yet): the jobs just keep their gate
            log.debug("cannot tell cron about activity: %s", type(exc).__name__)

    def waiting(self, msg: object = None) -> dict[str, int]:
        """Per busy channel, the turns waiting for the one before them to finish."""
        return self.channels.waiting()

    def close(self) -> None:
        """Closed by the actor (least recently used, never while a turn runs here)."""
        self.portrait.close()
        self.reader.close()
        with self._replies_lock:
            if self._replies is not None:
                self._replies.close()
                self._replies = None

    def ping(self) -> str:
        return "ok"


# The actor: the households it serves, each a HouseholdTurns (actors/households.py).
TurnsActor = serving(HouseholdTurns, "TurnsActor")
