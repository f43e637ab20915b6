"""Many households behind one HTTP server (issue 26: tokens bound to one household).

With ``households.enabled``, the HTTP actor serves household ``ID`` under
``/households/ID/`` (its REST API, chat APIs, MCP, memory page: the whole app
of :func:`actors.http.app.make_app`), built on its first request from that
household's settings: its own bearer token (``<root>/ID/http-token``), its own
bound tokens and OAuth grants, a backend whose every request names ``ID``.
A token is so bound to its household by construction: each household's app
knows its own token only, and another household's is refused (401) like any
wrong token. Everything else (no prefix) is the hub's household, as before.

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

from runtime.config import Settings
from runtime.store.households import Households, check_id

log = logging.getLogger(__name__)

PREFIX = "/households/"


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
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PREFIX):
            await self.hub(scope, receive, send)
            return
        household, _, rest = path[len(PREFIX):].partition("/")
        app = await self._app_of(household)
        if app is None:
            await _not_found(send)
            return
        inner = dict(scope)
        inner["path"] = "/" + rest
        inner["raw_path"] = inner["path"].encode()
        inner["root_path"] = scope.get("root_path", "") + PREFIX + household
        self._active[household] = self._active.get(household, 0) + 1
        try:
            await app(inner, receive, send)
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
