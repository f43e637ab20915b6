"""A conversation turn, as plain functions: the turn's core.

One user turn, from the question to the stored reply. The Turns actor
(``actors.turns``, the shell: per-channel order, the re-sent-turn lookup,
metrics, streaming) and :meth:`runtime.memory.Memory.turn` (in process) run
this same flow; what differs between them comes in as a :class:`Wiring`: how
a turn is appended, how a "remember: ..." is stored, how the channel's recent
turns are read, how memories are recalled, where the prompt's parts are read
from. Nothing here knows Ray.

The path of a turn (:func:`prepare`, then :func:`answer`, then :func:`finish`;
:func:`run` does the three):

1. :func:`prepare` writes the user's turn (``wiring.append``, with nothing
   indexed yet on a seeded channel; a temporary turn writes nothing) and
   stores what it asks to remember (``wiring.remember``, which calls
   :func:`remember`).
2. :func:`audience`: who is listening (the speaker, known or not, on a
   channel read aloud or not: ``runtime.memories.privacy``).
3. :func:`history_for_prompt`: the channel's recent turns (``wiring.recent``)
   that this audience may hear, the turn itself and disabled turns left out.
4. :func:`recall_for_turn`: on a seeded channel, turn-zero recall
   (``wiring.recall``) of the turn's text, the turns already in the prompt
   excluded, and what this audience may be given of it; then
   ``wiring.recalled`` (the turn just written may be indexed now).
5. The prompt's parts: on a pull channel, :func:`runtime.recall.pull.auto_recall`
   and the memory index (:func:`memory_index`); :func:`portrait_for`,
   :func:`context_for` (the user profile, the trajectory, the mood).
6. :func:`build_request`: the messages (``runtime.llm.prompt.build_messages``,
   and :func:`with_acknowledgement` of what was remembered) and the
   :class:`~runtime.llm.providers.LLMRequest`, which says which memories are
   sensitive and, on a pull channel, offers the recall tool.
7. :func:`answer`: the model's completion (``complete``); on a pull channel
   :func:`pull_rounds`, whose recall calls go through ``wiring.recall`` for the
   same audience and exclusions. When no model answers: :data:`NO_ANSWER`.
8. :func:`finish`: what the model was given (:func:`used`: the prompt's
   memories, then what its tool pulled) makes the :func:`citations`;
   :func:`reply_to_write` is the reply (stored sensitive when it was given a
   sensitive memory) with those citations and the tool calls, appended with
   ``wiring.append`` (nothing for a temporary turn); the episodes used are
   touched (``wiring.touch``: their decay restarts).

A client's own conversation (:class:`Client`, the memory layer of
``actors.http.layer``) changes three things: its system prompt opens the
system message (Reverie's memory added after it), its history is the
prompt's history (none sent: the transcript, as always), and its tools and
request fields go with the request (:func:`build_request`). When the model
calls the client's tools, :func:`finish` writes no reply and returns the calls
(the caller keeps the turn open); the client's results come back in its
continuation and :func:`resume` goes on from the same prepared turn (no
second recall); the reply then written keeps the calls and their results
(:func:`kept_calls`). A client's turn is answered as on a push channel.

The memories are whatever the caller's recall returns (the actor's
``actors.messages.MemoryItem``, ``runtime.recall.hybrid.RecallItem`` in
process): anything with the fields of :class:`Item`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo
from typing import Any, Generic, Protocol, TypeVar

from runtime.config import ChannelSettings, Settings
from runtime.llm.persona import PersonaFile
from runtime.llm.prompt import build_messages
from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    Completion,
    LLMRequest,
    Tool,
    ToolCall,
)
from runtime.memories import privacy
from runtime.memories.digests import trajectory_for
from runtime.memories.facts import FactIn
from runtime.memories.mood import current_line
from runtime.memories.portrait import PortraitLine
from runtime.memories.privacy import Audience
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import (
    MAX_TOOL_RESULT_CHARS,
    MAX_TURN_CHARS,
    ToolCallIn,
    TranscriptService,
    TurnIn,
)
from runtime.memories.user_profile import section_for
from runtime.mind.remember import acknowledgement, turn_facts
from runtime.recall.pull import (
    INDEX_FALLBACK,
    RECALL_TOOL,
    PullOutcome,
    Shown,
    auto_recall,
    index_text,
    pull_answer,
)
from runtime.store.database import Store
from runtime.time.clock import Clock, local_datetime

log = logging.getLogger(__name__)

ASSISTANT_SOURCE = "assistant"
NO_ANSWER = "Sorry, I cannot answer right now."
WRITER = "turns"  # the writer of what a turn stores besides the transcript: facts, touches


# -- what the turn works on ---------------------------------------------------------


class Item(Protocol):
    """A recalled memory (``actors.messages.MemoryItem`` and
    ``runtime.recall.hybrid.RecallItem`` fit)."""

    @property
    def ref(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def item_id(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def sensitive(self) -> bool: ...
    @property
    def person(self) -> str | None: ...


M = TypeVar("M", bound=Item)
M_co = TypeVar("M_co", bound=Item, covariant=True)
T = TypeVar("T")
S = TypeVar("S", bound="Said")


class Found(Protocol[M_co]):
    """What a recall returns (``actors.messages.Recalled``,
    ``runtime.recall.hybrid.RecallResult``)."""

    @property
    def items(self) -> Sequence[M_co]: ...
    @property
    def degraded(self) -> bool: ...


class Said(Protocol):
    """A turn of a channel's recent history (``actors.messages.TurnRow``, :class:`Turn`)."""

    @property
    def id(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def speaker(self) -> str | None: ...
    @property
    def content(self) -> str: ...
    @property
    def sensitive(self) -> bool: ...
    @property
    def disabled(self) -> bool: ...


class Append(Protocol):
    """Append one turn (all in one write transaction) and return its id.
    ``citations``: the refs the model was given (None: a user's turn, none
    recorded); ``tool_calls``: the calls the model made for it; ``index_now``:
    index it at once (False: the caller's ``recalled`` does it later)."""

    def __call__(self, turn: TurnIn, /, *, citations: list[str] | None = None,
                 tool_calls: Sequence[ToolCallIn] = (), index_now: bool = True) -> int: ...


class ReadPart(Protocol):
    """``fn(store)``, or ``default`` when the store cannot be read
    (``runtime.recall.reader.StoreReader.read`` fits): a prompt part never costs a turn."""

    def __call__(self, what: str, fn: Callable[[Store], T], default: T) -> T: ...


@dataclass(frozen=True)
class Wiring(Generic[M]):
    """How a caller reaches the transcript, recall and the prompt's parts."""

    append: Append
    # store what a user turn (written as the id, None: not written) asks to remember
    remember: Callable[[TurnIn, int | None], list[str]]
    # a channel's most recent turns, oldest first: (channel, limit)
    recent: Callable[[str, int], Sequence[Said]]
    # recall: (query, max_items or None, refs to exclude)
    recall: Callable[[str, int | None, list[str]], Found[M]]
    # turn-zero recall is done: the user's turn just written may be indexed now
    recalled: Callable[[], object]
    # the episodes given to the model (ids): their decay restarts
    touch: Callable[[list[int]], object]
    persona: Callable[[], Sequence[PersonaFile]]
    portrait: Callable[[], list[PortraitLine]]
    read: ReadPart


@dataclass(frozen=True)
class Client:
    """A client's own conversation around its last user message (the memory
    layer, ``actors.http.layer``): its system prompt (kept, Reverie's memory
    added after it), its history before that message (empty: the channel's
    transcript is the history), what came after it (the model's calls of the
    client's tools and their results: the turn continues), its tools and its
    own request fields (``LLMRequest.options``), and the images sent with its
    last user message."""

    system: str = ""
    history: list[ChatMessage] = field(default_factory=list)
    continuation: list[ChatMessage] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Asked:
    """A user's turn as the caller accepted it: ``turn`` as it is written (its
    request id set), its channel's settings, whether it is temporary, and the
    client's conversation (None: the transcript is the history, as always)."""

    turn: TurnIn
    channel: ChannelSettings
    temporary: bool = False
    client: Client | None = None
    room: str | None = None  # where it was said (a Wyoming satellite's room)

    @property
    def text(self) -> str:
        return self.turn.content

    @property
    def seeding(self) -> bool:
        """Whether turn-zero recall runs (a seeded channel with a user present)."""
        return self.channel.seed and not self.channel.background


@dataclass(frozen=True)
class Prepared(Generic[M]):
    """A turn written and recalled for, ready for the language model."""

    asked: Asked
    turn_id: int | None  # None: a temporary turn, not written
    who: Audience
    memories: list[M]  # given to the model in the prompt
    degraded: bool  # turn-zero recall answered degraded
    request: LLMRequest
    pull: bool = False  # a pull channel's turn (runtime.recall.pull)
    exclude: list[str] = field(default_factory=list)  # in the prompt already: not recalled
    # a client's turn: the request before the client's continuation (what
    # :func:`resume` builds on when its tool results come back)
    opening: LLMRequest | None = None


@dataclass(frozen=True)
class Answer(Generic[M]):
    """The model's answer: its text, who gave it, and on a pull channel what its
    recall tool returned (first seen first) and every call it made."""

    text: str
    provider: str
    pulled: list[M] = field(default_factory=list)
    tool_calls: list[ToolCallIn] = field(default_factory=list)
    # the model called the client's tools: the turn goes on when their results come
    client_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class Write:
    """The reply to append: the turn, its citations, the tool calls made for it."""

    turn: TurnIn
    citations: list[str]
    tool_calls: list[ToolCallIn]


@dataclass(frozen=True)
class Replied:
    """A turn answered: the ids written (None: not written), the reply's text,
    its citations, the provider that answered, whether recall was degraded."""

    turn_id: int | None
    reply_id: int | None
    text: str
    citations: list[str]
    provider: str
    recall_degraded: bool = False
    tool_calls: list[ToolCall] = field(default_factory=list)  # the client's, to run


# -- the steps -----------------------------------------------------------------------


def new_request_id() -> str:
    """A request id for a turn whose caller gave none."""
    return f"turn-{uuid.uuid4().hex}"


def remember(turn: TurnIn, turn_id: int | None, profiles: MemoryProfiles, clock: Clock,
             add: Callable[[FactIn], object]) -> list[str]:
    """Store with ``add`` what ``turn`` (written as ``turn_id``) asks to remember
    (:func:`runtime.mind.remember.turn_facts`); return the texts stored. A
    temporary turn (no id) stores nothing; a fact ``add`` fails on is left to
    the facts job, which stores it later."""
    if turn_id is None:  # a temporary turn writes nothing
        return []
    facts = turn_facts({"id": turn_id, "content": turn.content, "source": turn.source,
                        "speaker": turn.speaker, "created_at": clock.now()}, profiles)
    stored: list[str] = []
    for fact in facts:
        try:
            add(fact)
        except Exception as exc:  # the facts job stores it later
            log.warning("remember in turn %d not stored now (%s)", turn_id,
                        type(exc).__name__)
            continue
        stored.append(fact.value)
    return stored


def audience(settings: Settings, asked: Asked) -> Audience:
    """Who the answer goes to (``runtime.memories.privacy.audience``)."""
    return privacy.audience(settings, asked.channel, asked.turn.speaker)


def history_for_prompt(history: Sequence[S], turn_id: int | None, who: Audience,
                       limit: int) -> list[S]:
    """The last ``limit`` turns of ``history`` (oldest first) for the prompt:
    not the turn being answered, no disabled turn, and only what ``who`` may
    hear (``runtime.memories.privacy.history_for_audience``)."""
    return privacy.history_for_audience(
        [t for t in history if t.id != turn_id and not t.disabled], who)[-limit:]


#: The most turns of a client's history looked for in the transcript (the
#: layer wrote each of its user messages and text replies there once).
MAX_COPIES = 64


def stored_copies(messages: Sequence[ChatMessage], recent: Sequence[S],
                  turn_id: int | None) -> list[S]:
    """The turns of ``recent`` (the channel's latest) that a client's history
    ``messages`` holds word for word: in the prompt already, as
    :func:`shown_refs` says of the transcript's history."""
    said = {("assistant" if m.role == "assistant" else "user", m.content.strip())
            for m in messages if m.role in ("user", "assistant") and m.content.strip()}
    return [t for t in recent if t.id != turn_id and (
        "assistant" if t.role == "assistant" else "user", t.content.strip()) in said]


def shown_refs(history: Sequence[Said]) -> list[str]:
    """The refs of the history's turns: in the prompt already, never recalled."""
    return [f"turn:{t.id}" for t in history]


def recall_for_turn(recall: Callable[[str, int | None, list[str]], Found[M]], text: str,
                    exclude: list[str], who: Audience) -> tuple[list[M], bool]:
    """Turn-zero recall: the memories for ``text`` (``exclude`` left out) that
    ``who`` may be given, and whether recall answered degraded."""
    recalled = recall(text, None, exclude)
    return privacy.for_audience(recalled.items, who), recalled.degraded


def memory_index(read: ReadPart, portrait: Sequence[PortraitLine]) -> str:
    """A pull channel's stable memory index (``runtime.recall.pull.index_text``)."""
    return read("memory index", lambda s: index_text(s, portrait), INDEX_FALLBACK)


def portrait_for(channel: ChannelSettings,
                 portrait: Callable[[], list[PortraitLine]]) -> list[PortraitLine]:
    """The household's portrait for a seeded channel's prompt (none on a
    background channel, nor when it cannot be read)."""
    if not channel.seed or channel.background or channel.injection == "pull":
        return []  # a pull channel has the portrait's first line in its index
    return portrait()


def room_line(room: str | None) -> str:
    """The prompt's line saying where the user speaks from ("" when unknown):
    "turn on the light" then means this room's."""
    return f"The user is speaking in the {room.strip()}." if room and room.strip() else ""


def context_for(read: ReadPart, asked: Asked, who: Audience, now: float) -> list[str]:
    """Where the turn was said (a satellite's room), the user profile
    (directives in scope of the turn's channel and speaker) and, on a seeded
    channel, the trajectory and the mood; nothing on a background channel."""
    channel = asked.channel
    if channel.background:
        return []
    stranger = who.spoken and not who.known  # a guest: directives only
    name, speaker = asked.turn.channel, asked.turn.speaker
    return [room_line(asked.room),
            read("profile", lambda s: section_for(s, name, speaker, stranger), ""),
            read("trajectory", trajectory_for, "") if channel.seed else "",
            read("mood", lambda s: current_line(s, now), "") if channel.seed else ""]


def with_acknowledgement(messages: list[ChatMessage], stored: list[str]) -> list[ChatMessage]:
    """``messages`` with the system message telling the model what was stored."""
    if not stored or not messages or messages[0].role != "system":
        return messages
    first = messages[0].model_copy(
        update={"content": messages[0].content + "\n\n" + acknowledgement(stored)})
    return [first, *messages[1:]]


def as_message(turn: Said) -> ChatMessage:
    """A history turn as a chat message (anything not the assistant's is the user's)."""
    return ChatMessage(role="assistant" if turn.role == "assistant" else "user",
                       content=turn.content)


def build_request(*, persona: Sequence[PersonaFile], memories: Sequence[M],
                  in_prompt: Sequence[M] | Sequence[Shown], past: Sequence[Said], text: str,
                  now: datetime, portrait: Sequence[PortraitLine], index: str,
                  context: Sequence[str], remembered: list[str],
                  client: Client | None = None) -> LLMRequest:
    """The request to the model: the messages (persona, ``in_prompt`` memories
    or, on a pull channel (``index``), the index and the auto-recall block,
    the portrait, the context, the history, the user's text), what was
    remembered, ``memories`` (what the offline provider may quote, and which
    of them are sensitive), and the recall tool on a pull channel. A
    ``client``'s system prompt opens the system message, its history follows
    ``past``, its tools and options go with the request (its continuation
    does not: :func:`resume` adds it)."""
    history: list[ChatMessage] = [as_message(t) for t in past]
    messages = with_acknowledgement(build_messages(
        persona, in_prompt, [*history, *(client.history if client else [])], text, now,
        portrait=portrait, mode="pull" if index else "push", index=index, context=context,
        client_system=client.system if client else "",
        user_images=client.images if client else ()),
        remembered)
    return LLMRequest(messages=messages, memories=[m.text for m in memories],
                      remembered=remembered, sensitive=[m.sensitive for m in memories],
                      tools=[RECALL_TOOL] if index else list(client.tools if client else []),
                      options=dict(client.options) if client else {})


def resume(prepared: Prepared[M], asked: Asked) -> Prepared[M]:
    """A client's turn going on with what ``asked`` brings (the model's calls
    of its tools and their results, its tools and options now): the same
    memory context as when it was prepared, no second recall."""
    opening = prepared.opening or prepared.request
    client = asked.client or Client()
    request = opening.model_copy(update={
        "messages": [*opening.messages, *client.continuation],
        "tools": list(client.tools), "options": dict(client.options)})
    return replace(prepared, asked=asked, request=request, opening=opening)


def kept_calls(continuation: Sequence[ChatMessage]) -> list[ToolCallIn]:
    """The calls the model made of a client's tools and the results the client
    sent back, as the transcript's ``tool_calls`` keep them (arguments that
    are not a JSON object are kept under ``"arguments"`` as their text)."""
    results = {m.tool_call_id: m.content for m in continuation
               if m.role == "tool" and m.tool_call_id is not None}
    kept: list[ToolCallIn] = []
    for message in continuation:
        for call in message.tool_calls if message.role == "assistant" else []:
            try:
                arguments = json.loads(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                arguments = {"arguments": call.arguments[:MAX_TOOL_RESULT_CHARS]}
            result = results.get(call.id)
            kept.append(ToolCallIn(name=call.name[:80], arguments=arguments,
                                   result=None if result is None
                                   else result[:MAX_TOOL_RESULT_CHARS]))
    return kept


def prepare(asked: Asked, settings: Settings, wiring: Wiring[M], clock: Clock,
            zone: tzinfo) -> Prepared[M]:
    """Steps 1 to 6 of the module docstring: the turn written, recalled for and
    its request to the model built."""
    seeding = asked.seeding
    client = asked.client
    turn_id: int | None = None
    if not asked.temporary:
        # recall is told of this turn after the turn-zero recall below (which so
        # does not wait behind the embedding of the very turn it answers)
        turn_id = wiring.append(asked.turn, index_now=not seeding)
    # a client's turn going on (its tool results) asked it already
    stored = [] if client and client.continuation else wiring.remember(asked.turn, turn_id)

    who = audience(settings, asked)
    history: Sequence[Said] = []
    past: list[Said] = []
    if client is None or not client.history:  # the transcript is the history
        history = wiring.recent(asked.turn.channel, settings.runtime.history_turns + 1)
        past = history_for_prompt(history, turn_id, who, settings.runtime.history_turns)
    else:  # the client's history is in the prompt: its stored copies are never recalled
        history = stored_copies(client.history, wiring.recent(
            asked.turn.channel, min(len(client.history), MAX_COPIES) + 1), turn_id)

    memories: list[M] = []
    degraded = False
    if seeding:
        try:
            memories, degraded = recall_for_turn(wiring.recall, asked.text,
                                                 shown_refs(history), who)
        finally:
            if turn_id is not None:
                wiring.recalled()

    in_prompt: list[M] | list[Shown] = memories
    index = ""
    if seeding and asked.channel.injection == "pull" and client is None:  # index, tool, auto
        memories, in_prompt = auto_recall(memories)
        index = memory_index(wiring.read, wiring.portrait())
    request = build_request(
        persona=wiring.persona(), memories=memories, in_prompt=in_prompt, past=past,
        text=asked.text, now=local_datetime(clock, zone),
        portrait=portrait_for(asked.channel, wiring.portrait), index=index,
        context=context_for(wiring.read, asked, who, clock.now()), remembered=stored,
        client=client)
    prepared = Prepared(asked, turn_id, who, memories, degraded, request, pull=bool(index),
                        exclude=shown_refs(history) if index else [])
    return prepared if client is None else resume(prepared, asked)


def pull_rounds(prepared: Prepared[M], complete: Callable[[LLMRequest], Completion],
                recall: Callable[[str, int | None, list[str]], Found[M]]) -> PullOutcome[M]:
    """A pull channel's answer (``runtime.recall.pull.pull_answer``): the model's
    recall calls answered by ``recall``, the turns in the prompt excluded, for
    the same audience as the prompt."""
    return pull_answer(
        prepared.request, complete,
        lambda query, limit: privacy.for_audience(
            recall(query, limit, prepared.exclude).items, prepared.who))


def answer(prepared: Prepared[M], complete: Callable[[LLMRequest], Completion],
           recall: Callable[[str, int | None, list[str]], Found[M]]) -> Answer[M]:
    """The model's answer to the prepared turn; on a pull channel after the
    recall calls it makes (:func:`pull_rounds`). :data:`NO_ANSWER` (provider
    ``none``) when no language model answered."""
    try:
        if not prepared.pull:
            completion = complete(prepared.request)
            calls = completion.tool_calls if prepared.opening and prepared.request.tools else []
            return Answer(completion.text, completion.provider, client_calls=list(calls))
        outcome = pull_rounds(prepared, complete, recall)
    except AllProvidersFailed as exc:
        log.error("no language model answered: %s", exc)
        return Answer(NO_ANSWER, "none")
    return Answer(outcome.completion.text, outcome.completion.provider, list(outcome.used),
                  list(outcome.calls))


def used(prepared: Prepared[M], answered: Answer[M]) -> list[M]:
    """The memories given to the model: in the prompt, then pulled by its tool."""
    shown = {m.ref for m in prepared.memories}
    return [*prepared.memories, *(m for m in answered.pulled if m.ref not in shown)]


def citations(memories: Sequence[Item]) -> list[str]:
    """A reply's citations: the refs of the memories the model was given."""
    return [m.ref for m in memories]


def reply_to_write(prepared: Prepared[M], answered: Answer[M]) -> Write | None:
    """The reply to append (None for a temporary turn): sensitive when the model
    was given a sensitive memory, with its citations and tool calls."""
    if prepared.asked.temporary:
        return None
    memories = used(prepared, answered)
    asked = prepared.asked.turn
    reply = TurnIn(channel=asked.channel, source=ASSISTANT_SOURCE, role="assistant",
                   content=(answered.text or "…")[:MAX_TURN_CHARS],
                   request_id=f"reply-{asked.request_id}",
                   sensitive=any(m.sensitive for m in memories))
    client = prepared.asked.client
    return Write(reply, citations(memories), [
        *answered.tool_calls, *(kept_calls(client.continuation) if client else [])])


def episodes_used(memories: Sequence[Item]) -> list[int]:
    """The ids of the episodes among the memories the model was given."""
    return [m.item_id for m in memories if m.kind == "episode"]


def finish(prepared: Prepared[M], answered: Answer[M], wiring: Wiring[M]) -> Replied:
    """Step 8: the reply written with its citations and tool calls (one append),
    the episodes used touched; nothing written for a temporary turn."""
    memories = used(prepared, answered)
    if answered.client_calls:  # the client runs its tools; the reply comes after
        return Replied(turn_id=prepared.turn_id, reply_id=None, text=answered.text,
                       citations=citations(memories), provider=answered.provider,
                       recall_degraded=prepared.degraded,
                       tool_calls=list(answered.client_calls))
    reply_id: int | None = None
    write = reply_to_write(prepared, answered)
    if write is not None:
        # the reply and its citations: one call, one transaction
        reply_id = wiring.append(write.turn, citations=write.citations,
                                 tool_calls=write.tool_calls)
        ids = episodes_used(memories)
        if ids:
            wiring.touch(ids)
    return Replied(turn_id=prepared.turn_id, reply_id=reply_id, text=answered.text,
                   citations=citations(memories), provider=answered.provider,
                   recall_degraded=prepared.degraded)


def run(asked: Asked, settings: Settings, wiring: Wiring[M], clock: Clock, zone: tzinfo,
        complete: Callable[[LLMRequest], Completion]) -> Replied:
    """A whole turn: :func:`prepare`, :func:`answer`, :func:`finish`."""
    prepared = prepare(asked, settings, wiring, clock, zone)
    return finish(prepared, answer(prepared, complete, wiring.recall), wiring)


# -- in process ----------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """A stored turn of a channel's history, as :func:`recent_turns` reads it."""

    id: int
    role: str
    speaker: str | None
    content: str
    sensitive: bool
    disabled: bool


def recent_turns(transcript: TranscriptService, channel: str, limit: int) -> list[Turn]:
    """A channel's ``limit`` most recent turns, oldest first (what the
    Transcript actor's ``recent`` answers), read through ``transcript``."""
    return [Turn(id=r["id"], role=r["role"], speaker=r["speaker"], content=r["content"],
                 sensitive=bool(r["sensitive"]), disabled=bool(r["disabled"]))
            for r in transcript.recent(channel, limit)]
