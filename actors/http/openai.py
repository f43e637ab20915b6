"""OpenAI-compatible chat: ``POST /v1/chat/completions`` (streamed or not) and
``GET /v1/models``.

The last user message is one turn on the same path as ``reverie chat``
(turn-zero recall, the configured language model, transcript writes), of the
channel named by the ``X-Reverie-Channel`` header (default ``chat``), spoken by
the ``X-Reverie-Speaker`` header or else the ``user`` field, through the memory
layer (``actors.http.layer``, which says what it does): the client's own system
prompt is kept and Reverie's memory added to it; the client's earlier messages
are the history (none sent: the channel's transcript); ``tools`` go upstream and
the model's ``tool_calls`` come back in OpenAI's shape (``finish_reason``
``"tool_calls"``; streamed as ``delta.tool_calls``); the client's ``role: tool``
results continue the same turn (no second recall, nothing stored as a user
turn); ``response_format``, ``temperature`` and the other fields of
``layer.UPSTREAM_FIELDS`` go to the upstream that takes them. Each request
writes only what is new: the same conversation sent again is answered with the
stored reply. A channel with ``passthrough = false`` keeps the older way: only
the last user message, the transcript as the history, the rest ignored.

``model`` names an upstream model, a provider, an alias of ``[http.models]``
(alias → upstream model), or ``reverie`` (the configured order). The named
model is asked first; the others stay behind it as fallbacks.

Extension: every answer carries ``reverie: {"citations": [refs of the memories
the model was given], "provider", "turn_id", "reply_id", "notice"}``; streamed,
it comes in the last chunk (the one with ``finish_reason``).

Streamed (``"stream": true``), the reply goes out as server-sent events, each
piece as soon as the upstream sends it, then ``data: [DONE]``. With ``tools``
the upstream streams too; each tool call goes out as ``delta.tool_calls``
once the upstream's pieces of it are in. Errors found
before the first piece (unknown channel, bad input) are plain HTTP errors; the
stored reply is written even when the client leaves half-way.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actors.http.backend import Backend
from actors.http.layer import LayerError, arguments_text, client_turn
from actors.messages import ClientMessage, ClientTool, ClientToolCall, TurnDelta, TurnReply
from runtime.config import Settings

log = logging.getLogger(__name__)


class ChatMessage(BaseModel):
    role: str = Field(max_length=40)
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=200)


class ChatRequest(BaseModel):
    """OpenAI's chat-completions request; fields Reverie does not use are accepted."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = False
    user: str | None = Field(default=None, max_length=200)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)


Role = Literal["system", "user", "assistant", "tool"]
ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                          "assistant": "assistant", "tool": "tool"}


def client_messages(messages: list[ChatMessage]) -> list[ClientMessage]:
    """OpenAI's messages as the layer takes them: their text and images (other
    parts, such as audio, are not sent upstream: logged); a role it does not
    know (the old ``function``) is left out. :class:`LayerError` for a
    malformed tool call or image part."""
    out: list[ClientMessage] = []
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            log.info("memory layer: a %r message left out", m.role[:40])
            continue
        if isinstance(m.content, list) and any(p.get("type") not in ("text", "image_url")
                                               for p in m.content):
            log.info("memory layer: a message's parts other than text and images "
                     "not sent upstream")
        calls = [tool_call(c, f"messages[{i}].tool_calls[{j}]")
                 for j, c in enumerate(m.tool_calls or [])] if role == "assistant" else []
        out.append(ClientMessage(role=role, content=text_of(m.content), tool_calls=calls,
                                 tool_call_id=m.tool_call_id if role == "tool" else None,
                                 images=images_of(m.content, f"messages[{i}]")))
    return out


def images_of(content: str | list[dict[str, Any]] | None, where: str) -> list[str]:
    """The URLs of a message's ``image_url`` parts (a string or ``{"url": ...}``)."""
    urls: list[str] = []
    for j, part in enumerate(content if isinstance(content, list) else []):
        if part.get("type") != "image_url":
            continue
        given = part.get("image_url")
        url = given.get("url") if isinstance(given, dict) else given
        if not isinstance(url, str) or not url.startswith(("data:image/", "https://",
                                                           "http://")):
            raise LayerError(f"{where}.content[{j}]: image_url needs a data:image/ or "
                             "http(s) URL")
        urls.append(url)
    return urls


def tool_call(call: dict[str, Any], where: str) -> ClientToolCall:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
            or not isinstance(call.get("id"), str):
        raise LayerError(f"{where}: needs an id and a function with a name")
    return ClientToolCall(id=call["id"], name=function["name"],
                          arguments=arguments_text(function.get("arguments")))


def client_tools(tools: list[dict[str, Any]] | None) -> list[ClientTool]:
    """OpenAI's function tools as the layer takes them."""
    out: list[ClientTool] = []
    for i, tool in enumerate(tools or []):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise LayerError(f"tools[{i}]: only function tools, each with a name")
        description = function.get("description")
        parameters = function.get("parameters")
        out.append(ClientTool(
            name=function["name"], description=description if isinstance(description, str)
            else "", parameters=parameters if isinstance(parameters, dict) else {}))
    return out


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
        try:
            turn = client_turn(settings, channel=x_reverie_channel,
                               speaker=x_reverie_speaker or body.user, model=upstream,
                               messages=client_messages(body.messages),
                               tools=client_tools(body.tools), fields=body.model_extra)
        except (LayerError, ValidationError) as exc:
            why = str(exc) if isinstance(exc, LayerError) else "messages: invalid"
            return error(400, why, "invalid_request_error")
        created = int(time.time())
        if not body.stream:
            reply = backend.turn(turn)
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if reply.tool_calls:
                message["content"] = reply.text or None
                message["tool_calls"] = wire_calls(reply.tool_calls)
            return {
                "id": _completion_id(reply), "object": "chat.completion", "created": created,
                "model": body.model,
                "choices": [{"index": 0, "finish_reason": finish_reason(reply),
                             "logprobs": None, "message": message}],
                "reverie": extension(reply),
            }
        first, rest = first_and_rest(backend.turn_stream(turn))
        return StreamingResponse(_events(first, rest, body.model, created),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})


def wire_calls(calls: list[ClientToolCall]) -> list[dict[str, Any]]:
    """The model's calls of the client's tools, in OpenAI's shape."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def finish_reason(reply: TurnReply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


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
            for i, call in enumerate(wire_calls(item.tool_calls)):
                yield chunk({"tool_calls": [{"index": i, **call}]})
            yield chunk({}, finish_reason(item), reverie=extension(item))
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
