"""Many households behind one HTTP server (issue 26: tokens bound to one household).

With ``households.enabled``, the HTTP actor serves household ``ID`` under
``/households/ID/`` (its REST API, chat APIs, MCP, memory page: the whole app
of :func:`actors.http.app.make_app`), built on its first request from that
household's settings: its own bearer token (``<root>/ID/http-token``), its own
bound tokens and OAuth grants, a backend whose every request names ``ID``.
A token is so bound to its household by construction: each household's app
knows its own token only, and another household's is refused (401) like any
wrong token. Everything else (no prefix) is the hub's household, as before.

Each household app believes it is served at ``/`` (its ``root_path`` says
where it is), so what it sends back that names a path of its own is put under
its prefix on the way out, as a reverse proxy does: a root-relative
``Location`` (its redirects: the login, the OAuth approval) and a cookie's
``Path`` (the memory page's session: one household's login is sent to that
household only). Its memory page writes its links under the prefix itself
(:mod:`actors.http.page`). MCP's OAuth discovery asks the well-known URLs
with the resource's or issuer's path inserted (RFC 9728 and RFC 8414 §3.1:
``/.well-known/oauth-protected-resource/households/ID/mcp``,
``/.well-known/oauth-authorization-server/households/ID``): those go to
household ID's app too, as its own well-known paths.

An id that is not a household id, or names no household served here, is 404
(the same answer, whatever exists). Each household app's lifespan (the MCP
session manager's task group) is started here when it is built and stopped
with the server, or when the app is let go: at most ``households.max_open``
household apps are kept (the owners' bound on open stores), the least
recently used one without a request under way let go first, built again on its
next request (MCP here is stateless: no session is lost with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from actors.http.oauth import AS_PATH, PRM_PATH
from runtime.config import Settings
from runtime.store.households import Households, check_id

log = logging.getLogger(__name__)

PREFIX = "/households/"
WELL_KNOWN = (PRM_PATH, AS_PATH)  # served per household with the path inserted


def split(path: str) -> tuple[str, str] | None:
    """``(household, path in its app)`` of a request path for a household, or
    None (the hub's)."""
    if path.startswith(PREFIX):
        household, _, rest = path[len(PREFIX):].partition("/")
        return household, "/" + rest
    for known in WELL_KNOWN:
        if path.startswith(known + PREFIX):
            household, _, rest = path[len(known + PREFIX):].partition("/")
            return household, known + ("/" + rest if rest else "")
    return None


def rooted_header(name: bytes, value: bytes, root: bytes) -> tuple[bytes, bytes]:
    """A response header of an app served under ``root``, its own paths put
    under it: a root-relative ``Location``, a cookie's ``Path``."""
    key = name.lower()
    if key == b"location" and value.startswith(b"/") and not value.startswith(b"//"):
        return name, root + value
    if key == b"set-cookie":
        parts = value.split(b";")
        for i, part in enumerate(parts[1:], start=1):
            attribute, sep, path = part.strip().partition(b"=")
            if sep and attribute.lower() == b"path" and path.startswith(b"/"):
                parts[i] = b" Path=" + root + (b"" if path == b"/" else path)
        return name, b";".join(parts)
    return name, value


class _Lifespan:
    """An ASGI app's lifespan, run by hand (the app is not uvicorn's own)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed = ""

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind.startswith("lifespan.startup"):
            self.failed = message.get("message", "") if kind.endswith("failed") else ""
            self._started.set()
        elif kind.startswith("lifespan.shutdown"):
            self._stopped.set()

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._inbox.get, self._send))
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started.wait()

    async def stop(self) -> None:
        if self._task is None:
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait([self._task], timeout=10)


class HouseholdsApp:
    """``/households/ID/...`` to household ID's app; the rest to the hub's."""

    def __init__(self, hub: Any, settings: Settings,
                 build: Callable[[Settings], Any]) -> None:
        self.hub = hub
        self.registry = Households(settings)
        self.build = build
        self.max_apps = settings.households.max_open
        self._apps: OrderedDict[str, Any] = OrderedDict()
        self._lifespans: dict[str, _Lifespan] = {}
        self._active: dict[str, int] = {}  # requests under way, per household
        self._lock: asyncio.Lock | None = None
        self.built = 0  # apps built so far (the LRU's test)

    def apps(self) -> list[str]:
        """The households whose app is kept, least recently used first."""
        return list(self._apps)

    async def _let_go(self, household: str) -> None:
        self._apps.pop(household, None)
        life = self._lifespans.pop(household, None)
        if life is not None:
            await life.stop()

    async def _evict(self, keep: str) -> None:
        for household in list(self._apps):
            if len(self._apps) <= self.max_apps:
                return
            if household != keep and not self._active.get(household):
                await self._let_go(household)

    async def _app_of(self, household: str) -> Any | None:
        try:
            check_id(household)
        except ValueError:
            return None
        if not self.registry.served_somewhere(household):  # stopped or deleted since: not served
            await self._let_go(household)
            return None
        found = self._apps.get(household)
        if found is not None:
            self._apps.move_to_end(household)
            return found
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            found = self._apps.get(household)
            if found is not None:
                return found
            if not self.registry.served_somewhere(household):
                return None
            app = self.build(self.registry.settings_for_new(household))
            life = _Lifespan(app)
            await life.start()
            if life.failed:
                log.error("http: household app did not start: %s", life.failed)
                return None
            self._lifespans[household] = life
            self._apps[household] = app
            self.built += 1
            await self._evict(keep=household)
            return app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        found = split(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            await self.hub(scope, receive, send)
            return
        household, path = found
        app = await self._app_of(household)
        if app is None:
            await _not_found(send)
            return
        inner = dict(scope)
        inner["path"] = path
        inner["raw_path"] = path.encode()
        inner["root_path"] = root = scope.get("root_path", "") + PREFIX + household
        prefix = root.encode()

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[rooted_header(k, v, prefix)
                                                 for k, v in message.get("headers", [])])
            await send(message)

        self._active[household] = self._active.get(household, 0) + 1
        try:
            await app(inner, receive, sending)
        finally:
            self._active[household] -= 1
            if not self._active[household]:
                del self._active[household]

    async def _lifespan(self, scope: Any, receive: Any, send: Any) -> None:
        """The hub's app's lifespan; at shutdown, the households' apps' too."""

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                for life in list(self._lifespans.values()):
                    await life.stop()
            await send(message)

        await self.hub(scope, receive, sending)


async def _not_found(send: Any) -> None:
    body = b'{"detail":"not found","error":"not_found"}'
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
