"""The Turns actor: the turn path.

A user turn is checked, written to the transcript, seeded with turn-zero
recall (when its channel's memory-seed flag is on), assembled into a prompt
with the bootstrap persona files, the household's portrait (the latest
version, read from the store and cached by version: ``runtime.memories.portrait``;
seeded channels only), the recalled memories and the household's local time,
answered by the language model, and the reply is written with the
refs of the memories the model was given (its citations), in one call. What
the model is given (recalled memories, the channel's history) passes the
privacy rules for this speaker on this channel (``runtime.memories.privacy``); a reply
given a sensitive memory is stored sensitive. A
temporary turn writes nothing at all. On a channel with ``injection = "pull"``
the prompt carries a stable memory index and a capped auto-recall instead of
the recalled memories, and the model reads more with the recall tool, answered
by the Recall actor (``runtime.recall.pull``); its calls are written with the reply,
and what they returned joins its citations.

A turn re-sent with the request id of one already answered (a caller's retry,
or the Cron actor firing a scheduled prompt again after a crash) is answered
with the stored reply: the language model is not asked twice, nothing is
written again.

:meth:`TurnsActor.process_stream` is the same path for streamed replies (a Ray
streaming generator): it yields each piece of the reply as the language model
sends it (:class:`TurnDelta`), then the stored :class:`TurnReply`. The reply is
written once it is complete, also when nobody is reading the stream any more;
a stream that breaks half-way keeps the words that came.

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
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
from actors.messages import (
    Activity,
    AppendTurns,
    MemoryItem,
    Recall,
    RecentTurns,
    TouchEpisodes,
    TurnDelta,
    TurnReply,
    UserTurn,
)
from actors.remember_turn import TurnRemembering, with_acknowledgement
from runtime.config import ChannelSettings, Settings
from runtime.llm.persona import PersonaLoader
from runtime.llm.prompt import build_messages
from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    Completion,
    LLMError,
    LLMRequest,
    make_llm,
)
from runtime.llm.queue import LLMHealth
from runtime.memories import privacy
from runtime.memories.digests import trajectory_for
from runtime.memories.mood import current_line
from runtime.memories.portrait import PortraitLine, PortraitReader
from runtime.memories.transcript import MAX_TURN_CHARS, ToolCallIn, TurnIn
from runtime.memories.user_profile import section_for
from runtime.recall.pull import (
    INDEX_FALLBACK,
    RECALL_TOOL,
    Shown,
    auto_recall,
    index_text,
    pull_answer,
)
from runtime.recall.reader import StoreReader
from runtime.store.database import Store
from runtime.time.clock import Clock, SystemClock, household_zone, local_datetime

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
ASSISTANT_SOURCE = "assistant"
NO_ANSWER = "Sorry, I cannot answer right now."
STORED = "stored"  # the provider of a reply answered before (a re-sent turn)


@dataclass(frozen=True)
class _Prepared:
    """A turn written and recalled for, ready for the language model."""

    msg: UserTurn
    user_turn: TurnIn
    turn_id: int | None
    memories: list[MemoryItem]
    degraded: bool
    request: LLMRequest
    pull: bool = False  # a pull channel's turn (runtime.recall.pull)
    pulled: list[MemoryItem] = field(default_factory=list)  # what its recall tool returned
    tool_calls: list[ToolCallIn] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)  # in the prompt already: not recalled

    def used(self) -> list[MemoryItem]:
        """The memories given to the model: in the prompt, then pulled by its tool."""
        shown = {m.ref for m in self.memories}
        return [*self.memories, *(m for m in self.pulled if m.ref not in shown)]


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


class TurnsActor:
    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        setup_logging(settings, "turns")
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.zone = household_zone(settings.household.timezone)
        self.persona = PersonaLoader.from_settings(settings.persona)
        # thread-safe (FallbackChain); its notice is durable: it survives a restart
        self.llm = make_llm(settings.llm, LLMHealth(settings.store.resolved_dir, self.clock))
        namespace = settings.runtime.namespace
        self.transcript = TranscriptClient(namespace, CALL_TIMEOUT_S)
        self.recall = RecallClient(namespace, CALL_TIMEOUT_S)
        self.cron = CronClient(namespace, CALL_TIMEOUT_S)
        self.episodes = EpisodesClient(namespace, CALL_TIMEOUT_S)
        # "remember: ..." in a turn: stored during the turn (actors.remember_turn)
        self.remembering = TurnRemembering(GraphClient(namespace, CALL_TIMEOUT_S), self.recall,
                                           load_profiles(settings), self.clock)
        self.channels = ChannelQueue(partial(metrics.queue_depth, "turns_waiting"))
        # its own read connection, opened on the first seeded turn
        self.portrait = PortraitReader(partial(open_store, settings, self.clock))
        # the profile, the trajectory (digests), the mood and a pull channel's
        # memory index: one read connection, opened on the first turn
        self.reader = StoreReader(partial(open_store, settings, self.clock))
        # a read connection for re-sent turns (those with a caller's request id),
        # opened on the first one
        self._replies: Store | None = None
        self._replies_lock = threading.Lock()

    def _user_turn_in(self, msg: UserTurn) -> TurnIn:
        try:
            return TurnIn(channel=msg.channel, source=msg.source, role="user",
                          content=msg.text, speaker=msg.speaker, location=msg.location,
                          request_id=msg.request_id or f"turn-{uuid.uuid4().hex}")
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
            try:
                completion = self._complete(prepared, msg.model)
                text, provider = completion.text, completion.provider
            except AllProvidersFailed as exc:
                log.error("no language model answered: %s", exc)
                text, provider = NO_ANSWER, "none"
            metrics.turn(msg.channel, streamed=False)
            return self._finish(prepared, text, provider)

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
            try:
                for name, piece in self._streamed(prepared, msg.model):
                    provider = name
                    pieces.append(piece)
                    yield TurnDelta(text=piece)
            except AllProvidersFailed as exc:
                log.error("no language model answered: %s", exc)
                pieces = [NO_ANSWER]
                yield TurnDelta(text=NO_ANSWER)
            except LLMError as exc:  # broke after the first words: keep them
                log.warning("the reply stream from %s broke: %s", provider, exc.kind)
            metrics.turn(msg.channel, streamed=True)
            yield self._finish(prepared, "".join(pieces), provider)

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

    def _prepare(self, msg: UserTurn, channel: ChannelSettings,
                 user_turn: TurnIn) -> _Prepared:
        seeding = channel.seed and not channel.background
        turn_id: int | None = None
        if not msg.temporary:
            # Recall hears of this turn after the turn-zero recall below (which so
            # does not wait behind the embedding of the very turn it answers).
            turn_id = self.transcript.append(
                AppendTurns(turns=[user_turn], index_now=not seeding)).ids[0]
        stored = self.remembering.store(user_turn, turn_id)

        history = self.transcript.recent(
            RecentTurns(channel=msg.channel, limit=self.settings.runtime.history_turns + 1))
        # privacy: what this speaker on this channel may be told (runtime.memories.privacy)
        who = privacy.audience(self.settings, channel, msg.speaker)
        past = privacy.history_for_audience(
            [t for t in history.turns if t.id != turn_id and not t.disabled],
            who)[-self.settings.runtime.history_turns:]

        memories: list[MemoryItem] = []
        degraded = False
        if seeding:
            shown = [f"turn:{t.id}" for t in history.turns]  # already in the prompt
            try:
                recalled = self.recall.recall(Recall(query=msg.text, exclude=shown))
            finally:
                if turn_id is not None:
                    self._index_soon()
            memories = privacy.for_audience(recalled.items, who)
            degraded = recalled.degraded

        in_prompt: list[MemoryItem] | list[Shown] = memories
        index = ""
        if seeding and channel.injection == "pull":  # index, tool and auto-recall
            memories, in_prompt = auto_recall(memories)
            lines = self.portrait.lines()
            index = self.reader.read("memory index", lambda s: index_text(s, lines),
                                     INDEX_FALLBACK)
        messages = with_acknowledgement(build_messages(
            self.persona.load(), in_prompt,
            [_as_message(t.role, t.content) for t in past],
            msg.text, local_datetime(self.clock, self.zone),
            portrait=self._portrait(channel), mode="pull" if index else "push", index=index,
            context=self._context(msg, channel)),
            stored)
        request = LLMRequest(messages=messages, memories=[m.text for m in memories],
                             remembered=stored,
                             sensitive=[m.sensitive for m in memories],
                             tools=[RECALL_TOOL] if index else [])
        return _Prepared(msg, user_turn, turn_id, memories, degraded, request, pull=bool(index),
                         exclude=[f"turn:{t.id}" for t in history.turns] if index else [])

    def _complete(self, prepared: _Prepared, prefer: str | None) -> Completion:
        """The model's answer; on a pull channel, after the recall calls it makes
        (answered by Recall, for the same audience as the prompt: runtime.recall.pull)."""
        if not prepared.pull:
            return self.llm.complete(prepared.request, prefer=prefer)
        msg = prepared.msg
        who = privacy.audience(self.settings, self.settings.channels[msg.channel], msg.speaker)
        outcome = pull_answer(
            prepared.request, partial(self.llm.complete, prefer=prefer),
            lambda query, limit: privacy.for_audience(
                self.recall.recall(Recall(query=query, max_items=limit,
                                          exclude=prepared.exclude)).items, who))
        prepared.pulled.extend(outcome.used)
        prepared.tool_calls.extend(outcome.calls)
        return outcome.completion

    def _streamed(self, prepared: _Prepared, prefer: str | None) -> Iterator[tuple[str, str]]:
        """``(provider, piece)`` of the model's answer as it streams; a pull
        channel's tool rounds are whole answers, so its answer comes in one piece."""
        if not prepared.pull:
            yield from self.llm.stream(prepared.request, prefer=prefer)
            return
        completion = self._complete(prepared, prefer)
        yield completion.provider, completion.text

    def _context(self, msg: UserTurn, channel: ChannelSettings) -> list[str]:
        """The user profile (directives in scope of the turn's channel and speaker)
        and, on a seeded channel, the trajectory and the mood; nothing on a
        background channel."""
        if channel.background:
            return []
        who = privacy.audience(self.settings, channel, msg.speaker)  # a guest: directives only
        stranger = who.spoken and not who.known
        now = self.clock.now()
        read = self.reader.read
        return [read("profile", lambda s: section_for(s, msg.channel, msg.speaker, stranger), ""),
                read("trajectory", trajectory_for, "") if channel.seed else "",
                read("mood", lambda s: current_line(s, now), "") if channel.seed else ""]

    def _portrait(self, channel: ChannelSettings) -> list[PortraitLine]:
        """The household's portrait for a seeded channel's prompt (none on a
        background channel, nor when it cannot be read)."""
        if not channel.seed or channel.background or channel.injection == "pull":
            return []  # a pull channel has the portrait's first line in its index
        return self.portrait.lines()

    def _finish(self, prepared: _Prepared, text: str, provider: str) -> TurnReply:
        msg, memories = prepared.msg, prepared.used()
        citations = [m.ref for m in memories]
        reply_id: int | None = None
        if not msg.temporary:
            reply = TurnIn(channel=msg.channel, source=ASSISTANT_SOURCE, role="assistant",
                           content=(text or "…")[:MAX_TURN_CHARS],
                           request_id=f"reply-{prepared.user_turn.request_id}",
                           sensitive=any(m.sensitive for m in memories))
            # the reply and its citations: one call, one transaction
            calls = [prepared.tool_calls] if prepared.tool_calls else None
            reply_id = self.transcript.append(
                AppendTurns(turns=[reply], citations=[citations], tool_calls=calls)).ids[0]
            self._touch_used(memories)
        return TurnReply(turn_id=prepared.turn_id, reply_id=reply_id, text=text,
                         citations=citations, provider=provider,
                         recall_degraded=prepared.degraded, notice=self.llm.notice)

    def _touch_used(self, memories: list[MemoryItem]) -> None:
        """The episodes given to the model become relevant again (fire and
        forget: a turn never waits for it, nor fails for it)."""
        ids = [m.item_id for m in memories if m.kind == "episode"]
        if not ids:
            return
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

    def waiting(self) -> dict[str, int]:
        """Per busy channel, the turns waiting for the one before them to finish."""
        return self.channels.waiting()

    def ping(self) -> str:
        return "ok"


def _as_message(role: str, content: str) -> ChatMessage:
    return ChatMessage(role="assistant" if role == "assistant" else "user", content=content)
