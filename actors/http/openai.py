"""OpenAI-compatible chat: ``POST /v1/chat/completions`` (streamed or not) and
``GET /v1/models``.

The last user message is one turn on the same path as ``reverie chat``
(turn-zero recall, the configured language model, transcript writes), of the
channel named by the ``X-Reverie-Channel`` header (default ``chat``), spoken by
the ``X-Reverie-Speaker`` header or else the ``user`` field. Earlier messages
are not re-sent upstream: the channel's own transcript is the history.

``model`` names an upstream model, a provider, an alias of ``[http.models]``
(alias → upstream model), or ``reverie`` (the configured order). The named
model is asked first; the others stay behind it as fallbacks.

Extension: every answer carries ``reverie: {"citations": [refs of the memories
the model was given], "provider", "turn_id", "reply_id", "notice"}``; streamed,
it comes in the last chunk (the one with ``finish_reason``).

Streamed (``"stream": true``), the reply goes out as server-sent events, each
piece as soon as the upstream sends it, then ``data: [DONE]``. Errors found
before the first piece (unknown channel, bad input) are plain HTTP errors; the
stored reply is written even when the client leaves half-way.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from actors.http.backend import Backend
from actors.messages import TurnDelta, TurnReply, UserTurn
from runtime.config import Settings

log = logging.getLogger(__name__)


class ChatMessage(BaseModel):
    role: str = Field(max_length=40)
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    """OpenAI's chat-completions request; fields Reverie does not use are accepted."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = False
    user: str | None = Field(default=None, max_length=200)


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """The text of a message's content (a string, or OpenAI's list of parts)."""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content or [] if p.get("type") == "text")


def error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class Models:
    """The model names a client may ask for, and what each means upstream."""

    def __init__(self, settings: Settings) -> None:
        self.aliases = dict(settings.http.models)
        upstream = [p.model for p in settings.llm.providers]
        names = [p.name for p in settings.llm.providers]
        self.names = list(dict.fromkeys([*self.aliases, *upstream, *names, "reverie"]))

    def upstream(self, name: str) -> str | None:
        """The upstream model (or provider) to ask first; None: the configured order.
        KeyError when ``name`` is not served here."""
        if name not in self.names:
            raise KeyError(name)
        if name == "reverie":
            return None
        return self.aliases.get(name, name)


def extension(reply: TurnReply) -> dict[str, Any]:
    return {"citations": reply.citations, "provider": reply.provider,
            "turn_id": reply.turn_id, "reply_id": reply.reply_id, "notice": reply.notice}


def first_and_rest(pieces: Iterator[TurnDelta | TurnReply]
                   ) -> tuple[TurnDelta | TurnReply, Iterator[TurnDelta | TurnReply]]:
    """The first item of a streamed turn (errors before it are raised here, so
    they become plain HTTP errors) and the iterator for the rest."""
    first = next(pieces)
    return first, pieces


def install(app: FastAPI, settings: Settings, backend: Backend) -> None:
    models = Models(settings)

    @app.get("/v1/models", tags=["openai"])
    def list_models() -> dict[str, Any]:
        """The models a chat-completions request may name: the aliases of
        ``[http.models]``, the upstream models and providers, and ``reverie``."""
        now = int(time.time())
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": "reverie"}
            for name in models.names]}

    @app.post("/v1/chat/completions", tags=["openai"], response_model=None)
    def chat(body: ChatRequest,
             x_reverie_speaker: str | None = Header(default=None, max_length=200),
             x_reverie_channel: str = Header(default="chat", min_length=1, max_length=200),
             ) -> JSONResponse | StreamingResponse | dict[str, Any]:
        """OpenAI-compatible chat completion: the last user message is one turn
        (as ``reverie chat``), streamed as server-sent events with ``"stream":
        true``. Extension: ``reverie.citations``."""
        try:
            upstream = models.upstream(body.model)
        except KeyError:
            return error(404, f"model {body.model!r} is not served here; see /v1/models",
                         "model_not_found")
        users = [m for m in body.messages if m.role == "user"]
        text = text_of(users[-1].content) if users else ""
        if not text.strip():
            return error(400, "messages: no user message with text", "invalid_request_error")
        turn = UserTurn(channel=x_reverie_channel, text=text, model=upstream,
                        speaker=x_reverie_speaker or body.user)
        created = int(time.time())
        if not body.stream:
            reply = backend.turn(turn)
            return {
                "id": _completion_id(reply), "object": "chat.completion", "created": created,
                "model": body.model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": reply.text}}],
                "reverie": extension(reply),
            }
        first, rest = first_and_rest(backend.turn_stream(turn))
        return StreamingResponse(_events(first, rest, body.model, created),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})


def _completion_id(reply: TurnReply | None) -> str:
    if reply is not None and reply.reply_id is not None:
        return f"chatcmpl-{reply.reply_id}"
    return f"chatcmpl-{uuid.uuid4().hex}"


def _events(first: TurnDelta | TurnReply, rest: Iterator[TurnDelta | TurnReply],
            model: str, created: int) -> Iterator[bytes]:
    """The SSE body: a role chunk, one chunk per piece, the closing chunk with
    ``finish_reason`` and the ``reverie`` extension, then ``[DONE]``."""
    stream_id = f"chatcmpl-{uuid.uuid4().hex}"

    def chunk(delta: dict[str, Any], finish: str | None = None,
              **extra: Any) -> bytes:
        data = {"id": stream_id, "object": "chat.completion.chunk", "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}], **extra}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    item = first
    while True:
        if isinstance(item, TurnReply):
            yield chunk({}, "stop", reverie=extension(item))
            break
        if item.text:
            yield chunk({"content": item.text})
        try:
            item = next(rest)
        except StopIteration:  # the actor ended without a reply: say so, then stop
            log.warning("a streamed turn ended without its stored reply")
            yield chunk({}, "error")
            break
        except Exception as exc:
            log.warning("a streamed turn failed half-way: %s", type(exc).__name__)
            yield chunk({}, "error")
            break
    yield b"data: [DONE]\n\n"
