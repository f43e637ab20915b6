"""Ollama-compatible chat: ``POST /api/chat`` (streamed as NDJSON by default, as
Ollama does, or one JSON object with ``"stream": false``), and the model calls
Ollama's clients make around it (Home Assistant's integration lists, polls
``ps`` and pulls before it chats): ``GET /api/tags``, ``GET /api/ps``,
``POST /api/show``, ``POST /api/pull`` and ``GET /api/version``.

Reverie loads no model itself: a served name answers through the configured
providers. So ``/api/tags`` and ``/api/ps`` list the served names with size 0;
``/api/show`` reports ``capabilities``: ``completion`` always, ``tools`` when the
name reaches an OpenAI-compatible provider first (those take tools; the offline
provider does not), ``vision`` when that provider is marked ``vision`` (a
message's ``images`` then reach it as ``data:`` URLs); ``/api/pull`` of a
served name succeeds at once, and of any other name fails with Ollama's
error ("pull model manifest: file does not exist"; a 404 where Ollama says
500).

Tools that speak Ollama's API can then use Reverie as their model, with
memory: the last user message is one turn on the same path as ``reverie
chat`` (turn-zero recall, the configured upstream model, transcript writes),
of the channel named by the ``X-Reverie-Channel`` header (default ``chat``),
spoken by the ``X-Reverie-Speaker`` header, through the memory layer
(``actors.http.layer``): the client's system prompt kept with Reverie's memory
added, its earlier messages the history, its ``tools`` sent upstream and the
model's calls sent back in Ollama's shape (``message.tool_calls[].function``
with ``arguments`` an object; streamed, in a message of their own before the
``done`` one), its ``role: "tool"`` results continuing the same turn. Ollama's
``format``, ``options`` and ``think`` go upstream as the OpenAI-compatible
fields that mean the same (:func:`upstream_fields`); the rest is dropped with a
log line. A channel with ``passthrough = false`` keeps only the last user
message. ``model`` is matched as in the
OpenAI-compatible endpoint (an alias, an upstream model or provider, or
``reverie``), with Ollama's ``:latest`` tag optional. The answer's last object
carries the ``reverie`` extension (citations, provider, turn and reply ids).

Like every endpoint, these need the bearer token; Ollama's own clients send
it with ``headers={"Authorization": "Bearer …"}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from actors.http.backend import Backend
from actors.http.layer import LayerError, arguments_text, client_turn, image_url, invalid
from actors.http.openai import Models, client_tools, extension, first_and_rest
from actors.messages import ClientMessage, ClientToolCall, TurnDelta, TurnReply
from runtime.config import Settings

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)

#: The Ollama API version this endpoint follows (clients check it is recent enough).
OLLAMA_VERSION = "0.6.0"


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(max_length=40)
    content: str | None = None
    images: list[str] | None = Field(default=None, max_length=16)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_name: str | None = Field(default=None, max_length=200)


class OllamaModelName(BaseModel):
    """The body of ``/api/show`` and ``/api/pull``: ``model`` (older clients
    send ``name``); ``stream`` is read by pull (Ollama streams by default)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, min_length=1, max_length=200)
    name: str | None = Field(default=None, min_length=1, max_length=200)
    stream: bool = True

    def named(self) -> str | None:
        return self.model or self.name


class OllamaChat(BaseModel):
    """Ollama's chat request. ``tools`` go to the upstream model; ``format``,
    ``options`` and ``think`` go as the OpenAI-compatible fields that mean the
    same (:func:`upstream_fields`); what has none is dropped with a log line."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[OllamaMessage] = Field(min_length=1, max_length=1000)
    stream: bool = True
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None


#: Ollama's ``options`` the upstream's chat-completions API takes, by its name there.
OPTION_FIELDS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed",
                 "stop": "stop", "frequency_penalty": "frequency_penalty",
                 "presence_penalty": "presence_penalty", "num_predict": "max_tokens"}
EFFORTS = frozenset({"low", "medium", "high"})


def upstream_fields(body: OllamaChat) -> dict[str, Any]:
    """Ollama's request fields as the OpenAI-compatible upstream names them:
    ``format`` ("json" or a JSON schema) as ``response_format``, the options of
    :data:`OPTION_FIELDS`, ``think`` as ``reasoning_effort`` when it names one.
    The rest (``num_ctx``, ``keep_alive``, ``think`` on/off...) has no
    such field: dropped, named in a log line (names only, never values)."""
    fields: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in (body.options or {}).items():
        wire = OPTION_FIELDS.get(key)
        if value is None:
            continue
        if wire is None or (key == "num_predict" and not (isinstance(value, int)
                                                          and value > 0)):
            dropped.append(f"options.{key}"[:60])
            continue
        fields[wire] = value
    if body.format == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "response", "schema": body.format}}
    elif body.format:
        dropped.append("format")
    if isinstance(body.think, str) and body.think in EFFORTS:
        fields["reasoning_effort"] = body.think
    elif body.think is not None:
        dropped.append("think")
    if body.keep_alive is not None:
        dropped.append("keep_alive")
    dropped += sorted(k[:60] for k, v in (body.model_extra or {}).items() if v is not None)
    if dropped:
        log.info("ollama: not sent upstream (no such field there): %s", ", ".join(dropped))
    return fields


Role = Literal["system", "user", "assistant", "tool"]
ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant",
                          "tool": "tool"}


def client_messages(messages: list[OllamaMessage]) -> list[ClientMessage]:
    """Ollama's messages as the layer takes them. Ollama's tool calls carry no
    id and its tool results name no call, so each call gets one from where it
    is (``call_<message>_<call>``: the same conversation sent again gets the
    same ids) and each result answers the first unanswered call of the last
    assistant message (the one its ``tool_name`` names, when it names one).
    :class:`LayerError` for a malformed call or a result with no call."""
    out: list[ClientMessage] = []
    open_calls: list[ClientToolCall] = []
    for i, m in enumerate(messages):
        role = ROLES.get(m.role)
        if role is None:
            log.info("ollama: a %r message left out", m.role[:40])
            continue
        calls: list[ClientToolCall] = []
        answers: str | None = None
        if m.role == "assistant":
            calls = [_call_in(c, i, j) for j, c in enumerate(m.tool_calls or [])]
            open_calls = list(calls)
        elif m.role == "tool":
            named = [c for c in open_calls if c.name == m.tool_name] or open_calls
            if not named:
                raise LayerError(f"messages[{i}]: a tool result with no tool call before it")
            answers = named[0].id
            open_calls.remove(named[0])
        images = [image_url(data, f"messages[{i}].images[{k}]")
                  for k, data in enumerate(m.images or [])]
        out.append(ClientMessage(role=role, content=m.content or "", tool_calls=calls,
                                 tool_call_id=answers, images=images))
    return out


def _call_in(call: dict[str, Any], i: int, j: int) -> ClientToolCall:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise LayerError(f"messages[{i}].tool_calls[{j}]: needs a function with a name")
    given = call.get("id")
    return ClientToolCall(id=given if isinstance(given, str) and given else f"call_{i}_{j}",
                          name=function["name"],
                          arguments=arguments_text(function.get("arguments")))


def wire_calls(calls: list[ClientToolCall]) -> list[dict[str, Any]]:
    """The model's calls of the client's tools in Ollama's shape: ``arguments``
    an object (text that is not a JSON object goes under ``"arguments"``)."""
    return [{"function": {"name": c.name, "arguments": _arguments_object(c.arguments)}}
            for c in calls]


def _arguments_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    log.info("ollama: a tool call's arguments were not a JSON object; sent as text")
    return {"arguments": text}


def inline_defs(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` written in place: in the OpenAPI
    document, ``#/$defs/…`` would point at the document's root, not at the schema."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return dict(walk(schema))


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


#: Ollama's answer to a pull of a model its registry does not have.
NOT_PULLABLE = "pull model manifest: file does not exist"


async def _parsed(request: Request, model: type[Body]) -> Body:
    """The body as ``model``, JSON whatever its Content-Type says (``curl -d``
    sends a form type; Ollama reads JSON); a 422 naming the field otherwise."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None


class Served:
    """What Ollama's clients read about a served name: its ``details`` block,
    digest and capabilities."""

    def __init__(self, settings: Settings, models: Models) -> None:
        self.models = models
        self.providers = {p.name for p in settings.llm.providers} | {
            p.model for p in settings.llm.providers}
        self.order = [p.name for p in settings.llm.providers]
        self.seeing = {p.name for p in settings.llm.providers if p.vision} | {
            p.model for p in settings.llm.providers if p.vision}

    def takes_tools(self, name: str) -> bool:
        """Whether the provider asked first for ``name`` is an OpenAI-compatible
        one (tools go upstream); the offline provider takes none."""
        upstream = self.models.upstream(name)
        if upstream is None:  # "reverie": the configured order, providers first
            return bool(self.providers)
        return upstream in self.providers

    def details(self, name: str) -> dict[str, Any]:
        return {"parent_model": "",
                "format": "openai" if self.takes_tools(name) else "offline",
                "family": "reverie", "families": ["reverie"],
                "parameter_size": "", "quantization_level": ""}

    def sees(self, name: str) -> bool:
        """Whether the provider asked first for ``name`` reads images (``vision``)."""
        upstream = self.models.upstream(name)
        if upstream is None:
            return bool(self.seeing) and next(iter(self.order)) in self.seeing
        return upstream in self.seeing

    def capabilities(self, name: str) -> list[str]:
        return (["completion"] + (["tools"] if self.takes_tools(name) else [])
                + (["vision"] if self.sees(name) else []))

    @staticmethod
    def digest(name: str) -> str:
        """A stable digest of the name (Ollama's is the model file's): clients
        compare digests to see a model change."""
        return hashlib.sha256(f"reverie:{name}".encode()).hexdigest()


def _done(model: str, reply: TurnReply, content: str, started: float,
          calls: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls and reply.tool_calls:
        message["tool_calls"] = wire_calls(reply.tool_calls)
    return {"model": model, "created_at": _now(), "message": message,
            "done": True, "done_reason": "stop",
            "total_duration": int((time.monotonic() - started) * 1e9),
            "reverie": extension(reply)}


def install(app: FastAPI, settings: Settings, backend: Backend) -> None:
    models = Models(settings)
    about = Served(settings, models)

    def served(name: str) -> str | None:
        """The name as /v1/models knows it; None when not served."""
        for candidate in (name, name.removesuffix(":latest")):
            if candidate in models.names:
                return candidate
        return None

    @app.get("/api/version", tags=["ollama"])
    def version() -> dict[str, str]:
        """The Ollama API version this server follows."""
        return {"version": OLLAMA_VERSION}

    @app.get("/api/tags", tags=["ollama"])
    def tags() -> dict[str, Any]:
        """The models a chat request may name (as ``/v1/models``), tagged
        ``:latest``, each with Ollama's ``details`` block."""
        stamp = _now()
        return {"models": [
            {"name": f"{name}:latest", "model": f"{name}:latest", "modified_at": stamp,
             "size": 0, "digest": about.digest(name), "details": about.details(name)}
            for name in models.names]}

    @app.get("/api/ps", tags=["ollama"])
    def ps() -> dict[str, Any]:
        """The models ready to answer: every served name (Reverie holds no model
        in memory itself, so size and size_vram are 0)."""
        return {"models": [
            {"name": f"{name}:latest", "model": f"{name}:latest", "size": 0,
             "digest": about.digest(name), "details": about.details(name),
             "size_vram": 0}
            for name in models.names]}

    @app.post("/api/show", tags=["ollama"], response_model=None, openapi_extra={
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": inline_defs(OllamaModelName.model_json_schema())}}}})
    async def show(request: Request) -> JSONResponse | dict[str, Any]:
        """A served model as Ollama describes one: ``details``, ``model_info`` and
        ``capabilities`` (``tools`` when its first provider takes them); 404
        for a name not served."""
        body = await _parsed(request, OllamaModelName)
        asked = body.named() or ""
        name = served(asked)
        if name is None:
            return _error(404, f"model '{asked}' not found")
        return {"modelfile": "", "parameters": "", "template": "", "license": "",
                "details": about.details(name), "model_info": {},
                "capabilities": about.capabilities(name), "modified_at": _now()}

    @app.post("/api/pull", tags=["ollama"], response_model=None, openapi_extra={
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": inline_defs(OllamaModelName.model_json_schema())}}}})
    async def pull(request: Request) -> JSONResponse | StreamingResponse | dict[str, Any]:
        """A served model is already here: ``success`` (streamed as NDJSON unless
        ``"stream": false``). Any other name fails with the error Ollama's pull
        gives, ``"pull model manifest: file does not exist"``, in the stream, or
        not streamed as a 404 (Ollama says 500; a 5xx here is kept for
        Reverie's own failures, and Ollama's clients take any error status
        alike)."""
        body = await _parsed(request, OllamaModelName)
        asked = body.named()
        if not asked:
            return _error(400, "model is required")
        found = served(asked) is not None
        if not body.stream:
            return {"status": "success"} if found else _error(404, NOT_PULLABLE)
        last = {"status": "success"} if found else {"error": NOT_PULLABLE}
        lines = [{"status": "pulling manifest"}, last]
        return StreamingResponse((json.dumps(x).encode() + b"\n" for x in lines),
                                 media_type="application/x-ndjson")

    @app.post("/api/chat", tags=["ollama"], response_model=None, openapi_extra={
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": inline_defs(OllamaChat.model_json_schema())}}}})
    async def chat(request: Request,
                   x_reverie_speaker: str | None = Header(default=None, max_length=200),
                   x_reverie_channel: str = Header(default="chat", min_length=1,
                                                   max_length=200),
                   ) -> JSONResponse | StreamingResponse | dict[str, Any]:
        """Ollama-compatible chat: the last user message is one turn (as ``reverie
        chat``); streamed as NDJSON unless ``"stream": false``. Extension:
        ``reverie`` in the last object. The body is JSON whatever its
        Content-Type says (``curl -d`` sends a form type; Ollama reads JSON)."""
        body = await _parsed(request, OllamaChat)
        return await run_in_threadpool(answer, body, x_reverie_speaker, x_reverie_channel)

    def answer(body: OllamaChat, speaker: str | None,
               channel: str) -> JSONResponse | StreamingResponse | dict[str, Any]:
        name = served(body.model)
        if name is None:
            return _error(404, f"model {body.model!r} not found; see /api/tags")
        try:
            turn = client_turn(settings, channel=channel, speaker=speaker,
                               model=models.upstream(name),
                               messages=client_messages(body.messages),
                               tools=client_tools(body.tools),
                               fields=upstream_fields(body))
        except LayerError as exc:
            return _error(400, str(exc))
        except ValidationError as exc:
            return _error(400, invalid(exc))
        started = time.monotonic()
        if not body.stream:
            reply = backend.turn(turn)
            return _done(body.model, reply, reply.text, started)
        first, rest = first_and_rest(backend.turn_stream(turn))
        return StreamingResponse(_lines(first, rest, body.model, started),
                                 media_type="application/x-ndjson")


def _lines(first: TurnDelta | TurnReply, rest: Iterator[TurnDelta | TurnReply],
           model: str, started: float) -> Iterator[bytes]:
    """One JSON object per line: a message piece each, then the ``done`` one."""
    item = first
    while True:
        if isinstance(item, TurnReply):
            if item.tool_calls:  # as Ollama streams them: a message of their own
                yield json.dumps({"model": model, "created_at": _now(),
                                  "message": {"role": "assistant", "content": "",
                                              "tool_calls": wire_calls(item.tool_calls)},
                                  "done": False}).encode() + b"\n"
            yield json.dumps(_done(model, item, "", started, calls=False)).encode() + b"\n"
            return
        if item.text:
            yield json.dumps({"model": model, "created_at": _now(),
                              "message": {"role": "assistant", "content": item.text},
                              "done": False}).encode() + b"\n"
        try:
            item = next(rest)
        except Exception as exc:  # StopIteration included: the client learns it failed
            log.warning("a streamed turn failed half-way: %s", type(exc).__name__)
            yield json.dumps({"error": "the reply stream broke"}).encode() + b"\n"
            return
