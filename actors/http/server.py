"""The HTTP server's actor: uvicorn serving :mod:`actors.http.app` in a thread.

Thin, like the edge's actor: the app calls the other actors through their
typed clients. One actor for the whole server (a Ray worker costs ≈ 62 MiB
PSS here). The socket is bound in the constructor. A taken port does not
stop the runtime (memory keeps working for every other way in): the actor
stays up, says why in its ping (``reverie status``) and its address is empty
(``runtime.json`` then has ``"http": null``). ``http.port = 0`` takes a free
port, and :meth:`HttpActor.address` tells which (``reverie run`` writes it to
``runtime.json`` as ``"http"``).

The access log is off and uvicorn logs at ``warning``: no request line, body
or token reaches a log.

The same actor hosts the Wyoming handle service when ``[wyoming] enabled``
(:mod:`actors.http.wyoming`: its own asyncio loop in a thread beside uvicorn's,
its socket bound here too). A taken port, or a host outside loopback without
``allowed_peers``, stops only that service: the HTTP API keeps running and the
ping says why (``ok; wyoming down: ...``); :meth:`HttpActor.wyoming_address`
is then empty (``runtime.json`` has ``"wyoming": null``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

from actors.common import HTTP, setup_logging
from actors.messages import Ack
from runtime.config import Settings

if TYPE_CHECKING:
    from actors.http.backend import Backend
    from actors.http.wyoming import WyomingService

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
# A request's head (request line and headers) may be this long: the longest
# legal GET (a search text of MAX_QUERY_CHARS characters, 12 bytes each when
# percent-encoded, and the other parameters) fits with room to spare. A longer
# head is refused by h11 with 400 and the connection closed (h11's 16 KiB
# default was shorter than a query the API allowed: the fuzz test got a reset).
MAX_HEAD_BYTES = 64 * 1024
# How often the server's loop wakes when nothing happens: uvicorn's own loop
# wakes every 0.1 s (the HTTP actor was the costliest idle actor, ≈ 0.9 % of a
# core against ≈ 0.75 % for the others); once a second still refreshes the Date
# header on time and a stop is seen within a second.
TICK_S = 1.0
# uvicorn refreshes its Date header on every tenth tick of its own loop
_TICKS_PER_REFRESH = 10


def _quiet_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server whose main loop wakes every :data:`TICK_S` seconds."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        ticks = 0  # main-loop wake-ups (tests)

        async def main_loop(self) -> None:
            counter = 0  # a multiple of ten: every tick refreshes the Date header
            while not await self.on_tick(counter):
                self.ticks += 1
                await asyncio.sleep(TICK_S)
                counter = (counter + _TICKS_PER_REFRESH) % 864000

    return QuietServer(config)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for
    # TCP sockets it recognises as such; without it every answer of two writes
    # waited ≈ 40 ms on the client's delayed ACK (tools/bench/http.py).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class HttpActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, HTTP)
        import uvicorn

        from actors.http.app import load_or_create_token, make_app
        from actors.http.backend import ActorBackend

        http = settings.http
        backend = ActorBackend(settings)
        app = make_app(settings, load_or_create_token(settings), backend)
        if settings.households.enabled:  # /households/ID/: that household's own app
            from actors.http.households import HouseholdsApp

            app = HouseholdsApp(app, settings, lambda own: make_app(
                own, load_or_create_token(own), ActorBackend(own)))
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._address = ""
        self._error = ""
        self._wyoming: WyomingService | None = None
        self._wyoming_error = ""
        if settings.wyoming.enabled:
            self._start_wyoming(settings, backend)
        try:
            self._sock = _bind(http.host, http.port)
        except OSError as exc:
            self._error = f"cannot listen on {http.host}:{http.port}: {exc.strerror or exc}"
            log.error("http: %s; the HTTP API is off", self._error)
            return
        port = self._sock.getsockname()[1]
        host = f"[{http.host}]" if ":" in http.host else http.host
        self._address = f"http://{host}:{port}"
        # asyncio and h11 whatever else is installed: the stack measured and tested
        config = uvicorn.Config(app, log_level="warning", access_log=False,
                                server_header=False, timeout_graceful_shutdown=5,
                                loop="asyncio", http="h11", ws="none", lifespan="on",
                                h11_max_incomplete_event_size=MAX_HEAD_BYTES)
        self._server = _quiet_server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]},
                                        name="http-server", daemon=True)
        self._thread.start()
        log.info("http: listening on %s", self._address)

    def _start_wyoming(self, settings: Settings, backend: Backend) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from actors.http.wyoming import WyomingService, refusal

        wy = settings.wyoming
        if why := refusal(wy):
            self._wyoming_error = f"refusing to start: {why}"
            log.error("wyoming: %s", self._wyoming_error)
            return
        try:
            release = version("reverie")
        except PackageNotFoundError:
            release = "0"
        service = WyomingService(wy, backend, release)
        try:
            service.bind(_bind(wy.host, wy.port))
        except OSError as exc:
            self._wyoming_error = f"cannot listen on {wy.host}:{wy.port}: {exc.strerror or exc}"
            log.error("wyoming: %s; the Wyoming service is off", self._wyoming_error)
            return
        service.start()
        self._wyoming = service
        log.info("wyoming: listening on %s", service.address)

    def wyoming_address(self) -> str:
        """The Wyoming service's address (``tcp://127.0.0.1:PORT``); empty when it
        is off or could not start."""
        return self._wyoming.address if self._wyoming is not None else ""

    def address(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``); empty when it could not listen."""
        return self._address

    def stop(self) -> Ack:
        """Stop taking requests; let those running finish (a few seconds at most)."""
        if self._wyoming is not None:
            self._wyoming.stop()
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()
        return Ack(detail="http stopped")

    def ticks(self) -> int:
        """How many times the server's main loop has woken (tests)."""
        return int(getattr(self._server, "ticks", 0)) if self._thread is not None else 0

    def ping(self) -> str:
        if self._error:
            return f"down: {self._error}" + self._wyoming_state()
        if self._thread is None or not self._thread.is_alive():
            return "down: the HTTP server stopped" + self._wyoming_state()
        return "ok" + self._wyoming_state()

    def _wyoming_state(self) -> str:
        """The Wyoming service's part of the ping: nothing when it is off."""
        if self._wyoming_error:
            return f"; wyoming down: {self._wyoming_error}"
        if self._wyoming is None:
            return ""
        if not self._wyoming.running():
            return "; wyoming down: the Wyoming server stopped"
        state = f"; wyoming {self._wyoming.address}"
        if self._wyoming.announced:
            return f"{state} (announced as {self._wyoming.announced})"
        if self._wyoming.announce_error:
            return f"{state} (zeroconf {self._wyoming.announce_error})"
        return state
