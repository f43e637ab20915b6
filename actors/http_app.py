"""The HTTP API (FastAPI): REST over the actors, OpenAI-compatible chat, OpenAPI.

:func:`make_app` builds the app from the settings, the bearer token and a
backend (:class:`ActorBackend`: the actors through their typed clients; tests
may hand in another). The app holds no state of its own: every request is a
call to the actors, on the same paths as the ``reverie`` command
(``say``/``chat`` → ``TurnsClient.process``, ``recall``, ``remember``,
``disable``/``enable``/``forget``, ``status``).

Every request, ``/openapi.json`` included, needs ``Authorization: Bearer
<token>`` (compared in constant time); without it, or with a wrong one, the
answer is 401 before anything is read or called. Bodies over
``http.max_body_bytes`` are refused with 413 (by ``Content-Length`` and by the
bytes actually received). Malformed bodies get FastAPI's 422, which names the
field.

OpenAI-compatible ``POST /v1/chat/completions`` (not streamed yet: ``stream:
true`` is a 400): the last user message is one turn of the channel named by
the ``X-Reverie-Channel`` header (default ``chat``), spoken by the
``X-Reverie-Speaker`` header or the ``user`` field. The reply carries the
memories used as the extension field ``reverie: {"citations": [...],
"provider": ..., "turn_id": ..., "reply_id": ...}``.

Logs never hold a request body or the token (uvicorn's access log is off).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from actors.messages import MAX_TURN_CHARS, Recall, Recalled, Status, TurnReply, UserTurn
from runtime.config import Settings
from runtime.files import write_private

log = logging.getLogger(__name__)

TOKEN_FILE = "http-token"
CALL_TIMEOUT_S = 120.0
NOT_STREAMED = "streaming is not implemented yet; send the request without \"stream\": true"


# -- the token ----------------------------------------------------------------

def token_path(settings: Settings) -> Path:
    return settings.store.resolved_dir / TOKEN_FILE


def load_or_create_token(settings: Settings) -> str:
    """The bearer token: read from ``<data dir>/http-token``, written there (0600)
    on first run."""
    path = token_path(settings)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        token = secrets.token_urlsafe(32)
        write_private(path, token + "\n")
    return token


# -- the backend ----------------------------------------------------------------

class Backend(Protocol):
    def turn(self, msg: UserTurn) -> TurnReply: ...
    def recall(self, msg: Recall) -> Recalled: ...
    def remember(self, text: str) -> tuple[str, str]: ...
    def change(self, ref: str, change: str) -> str: ...
    def status(self) -> Status: ...


class ActorBackend:
    """The actors, through their typed clients (the same calls as ``reverie``'s commands)."""

    def __init__(self, settings: Settings, timeout_s: float = CALL_TIMEOUT_S) -> None:
        from actors.handles import GraphClient, RecallClient, TurnsClient

        ns = settings.runtime.namespace
        self.settings = settings
        self.namespace = ns
        self.timeout_s = timeout_s
        self.turns = TurnsClient(ns, timeout_s)
        self.recall_client = RecallClient(ns, timeout_s)
        self.graph = GraphClient(ns, timeout_s)

    def turn(self, msg: UserTurn) -> TurnReply:
        return self.turns.process(msg)

    def recall(self, msg: Recall) -> Recalled:
        return self.recall_client.recall(msg)

    def remember(self, text: str) -> tuple[str, str]:
        """An explicit "remember": a user-managed fact (as ``reverie remember``)."""
        from actors.messages import AddFact
        from runtime.facts import FactIn

        key = "note-" + hashlib.sha1(text.strip().lower().encode()).hexdigest()[:10]
        fact = FactIn(kind="user_specific", subject="user", key=key, value=text,
                      confidence=1.0, source="user", user_managed=True)
        written = self.graph.add(AddFact(fact=fact, writer="http"))
        self.recall_client.sync()
        return f"fact:{written.fact_id}", written.action

    def change(self, ref: str, change: str) -> str:
        from actors.handles import owner
        from actors.messages import ChangeMemory
        from runtime.refs import parse_ref

        parsed = str(parse_ref(ref))
        ack = owner(parsed, self.namespace, self.timeout_s).change(
            ChangeMemory(ref=parsed, change=change, writer="http"))  # type: ignore[arg-type]
        return str(ack.detail)

    def status(self) -> Status:
        from actors.status import gather_status

        return gather_status(self.settings)


# -- ASGI guards: the token, then the body size ------------------------------------

def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class Guard:
    """Bearer token on every request, then the body limit (pure ASGI: nothing of
    a refused request is read, no endpoint runs)."""

    def __init__(self, app: Any, token: str, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode()
        self.limit = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        scheme, _, given = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
            response = _error(401, "a valid bearer token is required", "unauthorized")
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _error(413, f"the body is over {self.limit} bytes",
                         "request_too_large")(scope, receive, send)
            return
        # The body is read here, whole (it is at most max_body_bytes), counting the
        # bytes received: a chunked body has no Content-Length to trust.
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.limit:
                await _error(413, f"the body is over {self.limit} bytes",
                             "request_too_large")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# -- request and response shapes ------------------------------------------------

class TurnRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS)
    channel: str = Field(default="chat", min_length=1, max_length=200)
    speaker: str | None = Field(default=None, max_length=200)


class TurnAnswer(BaseModel):
    text: str
    provider: str
    citations: list[str]
    turn_id: int | None
    reply_id: int | None
    notice: str | None = None


class RememberRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS)


class MemoryWritten(BaseModel):
    ref: str
    action: str


class Changed(BaseModel):
    ref: str
    change: str
    detail: str


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    """OpenAI's chat-completions request; fields Reverie does not use are accepted."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(default=None, max_length=200)


def _text_of(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = message.content or []
    return "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


# -- the app ----------------------------------------------------------------------

def make_app(settings: Settings, token: str, backend: Backend) -> Any:
    """The ASGI app: FastAPI behind the token and body-size guard."""
    app = FastAPI(title="Reverie", version="1", docs_url=None, redoc_url=None,
                  description="Reverie's memory runtime over HTTP. Every request needs "
                              "`Authorization: Bearer <token>` (the token is in "
                              "`<data dir>/http-token`).")
    aliases = dict(settings.http.models)
    upstream = [p.model for p in settings.llm.providers]
    known = list(dict.fromkeys([*aliases, *upstream, "reverie"]))

    @app.exception_handler(ValueError)
    async def _bad_request(request: Request, exc: ValueError) -> JSONResponse:
        # BadRequest (a ValueError) from an actor, a bad ref, a refused message
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _error(400, first, "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        return _error(503, f"the runtime could not answer ({type(exc).__name__}); "
                           "see `reverie status`", "runtime_error")

    def answer(reply: TurnReply) -> TurnAnswer:
        return TurnAnswer(text=reply.text, provider=reply.provider, citations=reply.citations,
                          turn_id=reply.turn_id, reply_id=reply.reply_id, notice=reply.notice)

    @app.post("/v1/turns", response_model=TurnAnswer, tags=["turns"])
    def post_turn(body: TurnRequest) -> TurnAnswer:
        """One user turn, as ``reverie say``: turn-zero recall, the LLM, transcript writes."""
        return answer(backend.turn(UserTurn(channel=body.channel, text=body.text,
                                            speaker=body.speaker)))

    @app.get("/v1/recall", response_model=Recalled, tags=["memories"])
    def get_recall(q: str = Query(min_length=1, max_length=MAX_TURN_CHARS),
                   limit: int | None = Query(default=None, ge=0, le=200)) -> Recalled:
        """What recall finds for ``q`` (as ``reverie recall``)."""
        return backend.recall(Recall(query=q, max_items=limit))

    @app.post("/v1/memories", response_model=MemoryWritten, status_code=201,
              tags=["memories"])
    def post_memory(body: RememberRequest) -> MemoryWritten:
        """Remember ``text`` as a user-managed fact (as ``reverie remember``)."""
        ref, action = backend.remember(body.text)
        return MemoryWritten(ref=ref, action=action)

    def change(ref: str, what: str) -> Changed:
        return Changed(ref=ref, change=what, detail=backend.change(ref, what))

    @app.post("/v1/memories/{ref}/disable", response_model=Changed, tags=["memories"])
    def disable(ref: str) -> Changed:
        """Hide a memory from recall (reversible)."""
        return change(ref, "disable")

    @app.post("/v1/memories/{ref}/enable", response_model=Changed, tags=["memories"])
    def enable(ref: str) -> Changed:
        """Show a disabled memory to recall again."""
        return change(ref, "enable")

    @app.delete("/v1/memories/{ref}", response_model=Changed, tags=["memories"])
    def delete(ref: str) -> Changed:
        """Forget a memory for good (as ``reverie forget``)."""
        return change(ref, "delete")

    @app.get("/v1/status", response_model=Status, tags=["status"])
    def get_status() -> Status:
        """The actors, the counts, the notice (as ``reverie status``)."""
        return backend.status()

    @app.get("/v1/models", tags=["openai"])
    def models() -> dict[str, Any]:
        """The models a chat-completions request may name: the aliases of
        ``[http.models]``, the upstream models, and ``reverie``."""
        now = int(time.time())
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": "reverie"}
            for name in known]}

    @app.post("/v1/chat/completions", tags=["openai"], response_model=None)
    def chat(body: ChatRequest,
             x_reverie_speaker: str | None = Header(default=None, max_length=200),
             x_reverie_channel: str = Header(default="chat", min_length=1,
                                             max_length=200)) -> JSONResponse | dict[str, Any]:
        """OpenAI-compatible chat completion (not streamed): the last user message is
        one turn (as ``reverie chat``). Extension: ``reverie.citations``."""
        if body.stream:
            return _error(400, NOT_STREAMED, "invalid_request_error")
        if body.model not in known:
            return _error(404, f"model {body.model!r} is not served here; see /v1/models",
                          "model_not_found")
        users = [m for m in body.messages if m.role == "user"]
        if not users or not _text_of(users[-1]).strip():
            return _error(400, "messages: no user message with text", "invalid_request_error")
        reply = backend.turn(UserTurn(channel=x_reverie_channel, text=_text_of(users[-1]),
                                      speaker=x_reverie_speaker or body.user))
        return {
            "id": f"chatcmpl-{reply.reply_id if reply.reply_id is not None else uuid.uuid4().hex}",
            "object": "chat.completion", "created": int(time.time()), "model": body.model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": reply.text}}],
            "reverie": {"citations": reply.citations, "provider": reply.provider,
                        "turn_id": reply.turn_id, "reply_id": reply.reply_id,
                        "notice": reply.notice},
        }

    return Guard(app, token, settings.http.max_body_bytes)

