"""The HTTP API (FastAPI): REST over the actors, OpenAI-compatible chat, OpenAPI.

:func:`make_app` builds the app from the settings, the bearer token and a
backend (:class:`ActorBackend`: the actors through their typed clients; tests
may hand in another). The app holds no state of its own: every request is a
call to the actors, on the same paths as the ``reverie`` command
(``say``/``chat`` → ``TurnsClient.process``, ``recall``, ``remember``,
``disable``/``enable``/``forget``, ``status``).

Every request, ``/openapi.json`` included, needs ``Authorization: Bearer
<token>`` (compared in constant time); without it, or with a wrong one, the
answer is 401 before anything is read or called. Apart: the memory page's
session cookie (:mod:`actors.http.page`), and OAuth 2.0 for ``/mcp``
(:mod:`actors.http.oauth`: its endpoints are open, ``/mcp`` also takes the
access tokens it issues). Bodies over
``http.max_body_bytes`` are refused with 413 (by ``Content-Length`` and by the
bytes actually received). Malformed bodies get FastAPI's 422, which names the
field.

The parts: REST memories (:mod:`actors.http.memories`), OpenAI-compatible chat
(:mod:`actors.http.openai`), Ollama-compatible chat (:mod:`actors.http.ollama`),
the MCP server (:mod:`actors.http.mcp`) and the memory page
(:mod:`actors.http.page`); each adds its routes through ``install``.

Logs never hold a request body or the token (uvicorn's access log is off).
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any, Literal, cast

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from actors import metrics
from actors.common import HouseholdMoving
from actors.http.audience import (
    ADMIN,
    STRANGER,
    AudienceBackend,
    Caller,
    Refused,
    entered,
    load_bound_tokens,
    token_at,
)
from actors.http.backend import Backend
from actors.http.common import MAX_QUERY_CHARS, Changed
from actors.http.oauth import APPROVE_PATH, AUDIENCE_KEY, OAUTH_KEY, OAuthServer
from actors.http.oauth import OPEN_PATHS as OAUTH_PATHS
from actors.messages import MAX_TURN_CHARS, Recall, Recalled, Status, TurnReply, UserTurn
from runtime.config import Settings
from runtime.memories.privacy import Audience
from runtime.time.clock import Clock

log = logging.getLogger(__name__)

TOKEN_FILE = "http-token"


# -- the token ----------------------------------------------------------------

def token_path(settings: Settings) -> Path:
    return settings.store.resolved_dir / TOKEN_FILE


def load_or_create_token(settings: Settings) -> str:
    """The bearer token: read from ``<data dir>/http-token``, written there (0600)
    on first run."""
    return token_at(token_path(settings))[0]


# -- ASGI guards: the token, then the body size ------------------------------------

def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class Guard:
    """Bearer token on every request, then the body limit (pure ASGI: nothing of
    a refused request is read, no endpoint runs).

    The memory page's paths (:func:`actors.http.page.is_page_path`: ``/``,
    ``/login``, ``/logout``, ``/timeline``, ``/pictures``, ``/memories/…``,
    ``/viz/…``) may carry the page's session cookie instead (HttpOnly, derived
    from the token: :class:`actors.http.page.PageAuth`), and ``/login`` and
    ``/logout`` are open; without either, a page GET is sent to ``/login``
    (303) and anything else is 401. Every other path (``/v1/…``, ``/api/…``,
    ``/mcp``, ``/openapi.json``) takes the bearer token only, but for ``/mcp``,
    which also takes an OAuth access token (:mod:`actors.http.oauth`: its
    audience is left in the scope under ``AUDIENCE_KEY``; the admin token leaves
    none, and sees everything), and a 401 there names the protected-resource
    metadata (RFC 9728). The OAuth endpoints themselves are open (the SDK's
    handlers authenticate the client).

    A bound token (``bound``: token → audience, ``[http.tokens]``) is taken
    wherever the admin token is but on the memory page (the household
    administrator's: its login, its approvals of apps); its audience goes in
    the scope under ``AUDIENCE_KEY`` too. Every request runs with its caller
    entered (:func:`actors.http.audience.entered`): the admin token and the
    page's login are :data:`~actors.http.audience.ADMIN`."""

    def __init__(self, app: Any, token: str, max_body_bytes: int,
                 oauth: OAuthServer | None = None,
                 bound: dict[str, Audience] | None = None) -> None:
        from actors.http import page as http_page

        self.app = app
        self.token = token.encode()
        self.limit = max_body_bytes
        self.page = http_page
        self.page_auth = http_page.PageAuth(token)
        self.oauth = oauth
        self.bound = [(t.encode(), who) for t, who in (bound or {}).items()]

    def _bound(self, given: bytes) -> Audience | None:
        """The audience of a bound token, compared in constant time with each."""
        found = None
        for token, who in self.bound:
            if hmac.compare_digest(given, token):
                found = who
        return found

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        scheme, _, given = auth.partition(b" ")
        bearer = scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        path = scope.get("path", "")
        page = self.page.is_page_path(path)
        if page:
            scope[self.page.SCOPE_KEY] = self.page_auth
        oauth = self.oauth
        mcp = oauth is not None and path == "/mcp"
        scope.pop(AUDIENCE_KEY, None)
        if oauth is not None:
            scope[OAUTH_KEY] = oauth
        who: Caller = ADMIN if bearer else STRANGER
        if not bearer and not page and scheme.lower() == b"bearer" and self.bound:
            bound = self._bound(given.strip())
            if bound is not None:
                scope[AUDIENCE_KEY] = who = bound
                bearer = True
        if mcp and not bearer and oauth is not None and scheme.lower() == b"bearer":
            client = oauth.audience(given.strip().decode("latin-1"))
            if client is not None:
                scope[AUDIENCE_KEY] = who = client
                bearer = True
        if page and not bearer and self.page_auth.cookie_ok(headers.get(b"cookie")):
            who = ADMIN
        open_path = oauth is not None and oauth.is_open_path(path)
        if not bearer and not open_path and not (
                page and (self.page.is_open_path(path)
                          or self.page_auth.cookie_ok(headers.get(b"cookie")))):
            if page and scope.get("method") in ("GET", "HEAD"):
                from urllib.parse import urlencode

                from fastapi.responses import RedirectResponse

                query = scope.get("query_string", b"").decode("latin-1")
                back = path + (f"?{query}" if query else "")
                # back to the approval after logging in (any other page: to /)
                where = "/login" + (f"?{urlencode({'next': back})}"
                                    if path == APPROVE_PATH else "")
                response: Any = RedirectResponse(where, status_code=303,
                                                 headers={"Cache-Control": "no-store"})
            elif page:
                response = _error(401, "log in first (/login)", "unauthorized")
            else:
                response = _error(401, "a valid bearer token is required", "unauthorized")
                response.headers["WWW-Authenticate"] = (
                    oauth.challenge(scope) if mcp and oauth is not None else "Bearer")
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

        with entered(who):
            await self.app(scope, replay, send)


class Metered:
    """Counts every HTTP request by method, route template and status
    (``actors.metrics``: never the raw path, which can hold a ref or a query)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "-"
            metrics.http_request(scope.get("method", "-"), route, status)


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
    level: Literal["normal", "vivid", "seared"] = Field(
        default="normal", description="Memory level: vivid never fades below half, "
                                      "seared never fades (runtime.memories.levels).")
    sensitive: bool = Field(
        default=False, description="Codes, health, money: only its owner is ever told it, "
                                   "never an unknown voice (runtime.memories.privacy).")
    person: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="Whose it is, a household member's name (default: the household's).")


class MemoryWritten(BaseModel):
    ref: str
    action: str


# -- the app ----------------------------------------------------------------------

def make_app(settings: Settings, token: str, backend: Backend,
             clock: Clock | None = None) -> Any:
    """The ASGI app: FastAPI behind the token and body-size guard. ``clock``
    times the OAuth tokens of ``/mcp`` (default: the system's). The bound
    tokens of ``[http.tokens]`` are read (or written) here; every part but
    ``/mcp`` (which filters by the scope's audience itself) is given the
    backend as the request's caller may use it
    (:class:`actors.http.audience.AudienceBackend`)."""
    bound = load_bound_tokens(settings)
    raw, backend = backend, AudienceBackend(backend, settings)
    app = FastAPI(title="Reverie", version="1", docs_url=None, redoc_url=None,
                  description="Reverie's memory runtime over HTTP. Every request needs "
                              "`Authorization: Bearer <token>` (the token is in "
                              "`<data dir>/http-token`).")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the framework's own refusals (no such route, wrong method, a body that
        # cannot be parsed) in the same shape as every other error here
        response = _error(exc.status_code, str(exc.detail), "http_error")
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(ValueError)
    async def _bad_request(request: Request, exc: ValueError) -> JSONResponse:
        # BadRequest (a ValueError) from an actor, a bad ref, a refused message
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _error(400, first, "invalid_request_error")

    @app.exception_handler(HouseholdMoving)
    async def _moving(request: Request, exc: HouseholdMoving) -> JSONResponse:
        # the household is moving to another node: nothing was done; send it again
        response = _error(503, str(exc), "household_moving")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        # a bound token asked for more than its audience (actors.http.audience)
        return _error(403, str(exc), "forbidden")

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
    def get_recall(q: str = Query(min_length=1, max_length=MAX_QUERY_CHARS),
                   limit: int | None = Query(default=None, ge=0, le=200)) -> Recalled:
        """What recall finds for ``q`` (as ``reverie recall``)."""
        return backend.recall(Recall(query=q, max_items=limit))

    @app.post("/v1/memories", response_model=MemoryWritten, status_code=201,
              tags=["memories"])
    def post_memory(body: RememberRequest) -> MemoryWritten:
        """Remember ``text`` as a user-managed fact (as ``reverie remember``)."""
        ref, action = backend.remember(body.text, body.level, body.sensitive, body.person)
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

    from actors.http import mcp as http_mcp
    from actors.http import memories as http_memories
    from actors.http import ollama as http_ollama
    from actors.http import openai as http_openai
    from actors.http import page as http_page
    from actors.http import responses as http_responses

    for part in (http_memories, http_openai, http_responses, http_ollama, http_page):
        part.install(app, settings, backend)
    http_mcp.install(app, settings, raw)  # its tools filter by the scope's audience

    oauth = OAuthServer(settings, clock)
    for path in sorted(OAUTH_PATHS):
        app.router.add_route(path, cast(Any, oauth), include_in_schema=False)  # SDK handlers

    return Metered(Guard(app, token, settings.http.max_body_bytes, oauth, bound))

