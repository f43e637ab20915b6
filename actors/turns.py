"""The Turns actor: the turn path.

A user turn is checked, written to the transcript, seeded with turn-zero
recall (when its channel's memory-seed flag is on), assembled into a prompt
with the bootstrap persona files and the recalled memories, answered by the
language model, and the reply is written with the refs of the memories the
model was given (its citations). A temporary turn writes nothing at all.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import ray
from pydantic import ValidationError

from actors.common import RECALL, TRANSCRIPT, BadRequest, actor, bad_request, setup_logging
from actors.messages import (
    AppendTurns,
    MemoryItem,
    Recall,
    Recalled,
    RecentTurns,
    SetCitations,
    TurnList,
    TurnReply,
    TurnsAppended,
    UserTurn,
)
from runtime.config import Settings
from runtime.llm import AllProvidersFailed, ChatMessage, LLMRequest, make_llm
from runtime.persona import PersonaLoader
from runtime.prompt import build_messages
from runtime.transcript import TurnIn

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
ASSISTANT_SOURCE = "assistant"


class TurnsActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "turns")
        self.settings = settings
        self.namespace = settings.runtime.namespace
        self.persona = PersonaLoader.from_settings(settings.persona)
        self.llm = make_llm(settings.llm)

    def _call(self, name: str, method: str, msg: Any) -> Any:
        handle = actor(name, self.namespace)
        return ray.get(getattr(handle, method).remote(msg), timeout=CALL_TIMEOUT_S)

    def _user_turn_in(self, msg: UserTurn) -> TurnIn:
        try:
            return TurnIn(channel=msg.channel, source=msg.source, role="user",
                          content=msg.text, speaker=msg.speaker, location=msg.location,
                          request_id=msg.request_id or f"turn-{uuid.uuid4().hex}")
        except ValidationError as exc:
            raise bad_request(exc) from None

    def process(self, msg: UserTurn) -> TurnReply:
        channel = self.settings.channels.get(msg.channel)
        if channel is None:
            known = ", ".join(sorted(self.settings.channels))
            raise BadRequest(f"unknown channel {msg.channel!r}; configured channels: {known}")
        user_turn = self._user_turn_in(msg)

        turn_id: int | None = None
        if not msg.temporary:
            appended: TurnsAppended = self._call(
                TRANSCRIPT, "append", AppendTurns(turns=[user_turn]))
            turn_id = appended.ids[0]

        history: TurnList = self._call(
            TRANSCRIPT, "recent",
            RecentTurns(channel=msg.channel, limit=self.settings.runtime.history_turns + 1))
        past = [t for t in history.turns if t.id != turn_id][-self.settings.runtime.history_turns:]

        memories: list[MemoryItem] = []
        degraded = False
        if channel.seed and not channel.background:
            shown = [f"turn:{t.id}" for t in history.turns]  # already in the prompt
            recalled: Recalled = self._call(RECALL, "recall", Recall(query=msg.text,
                                                                     exclude=shown))
            memories = recalled.items
            degraded = recalled.degraded

        messages = build_messages(
            self.persona.load(), memories,
            [_as_message(t.role, t.content) for t in past],
            msg.text, datetime.now(UTC))
        request = LLMRequest(messages=messages, memories=[m.text for m in memories])
        try:
            completion = self.llm.complete(request)
            text, provider = completion.text, completion.provider
        except AllProvidersFailed as exc:
            log.error("no language model answered: %s", exc)
            text, provider = "Sorry, I cannot answer right now.", "none"
        citations = [m.ref for m in memories]

        reply_id: int | None = None
        if not msg.temporary:
            reply = TurnIn(channel=msg.channel, source=ASSISTANT_SOURCE, role="assistant",
                           content=text or "…", request_id=f"reply-{user_turn.request_id}")
            reply_id = self._call(TRANSCRIPT, "append", AppendTurns(turns=[reply])).ids[0]
            if citations:
                self._call(TRANSCRIPT, "set_citations",
                           SetCitations(turn_id=reply_id, refs=citations))
        return TurnReply(turn_id=turn_id, reply_id=reply_id, text=text, citations=citations,
                         provider=provider, recall_degraded=degraded, notice=self.llm.notice)

    def ping(self) -> str:
        return "ok"


def _as_message(role: str, content: str) -> ChatMessage:
    return ChatMessage(role="assistant" if role == "assistant" else "user", content=content)
