"""The Wyoming handle service: Home Assistant and Wyoming satellites reach Reverie
as a conversation agent (``describe`` → ``info``; ``transcript`` → ``handled`` or
``not-handled``).

It runs in the HTTP actor (no process of its own): an asyncio loop in a thread
beside uvicorn's, its socket bound in the actor's constructor like the HTTP
socket. A ``transcript`` is one turn on the ``voice`` channel through the Turns
actor, the same :class:`UserTurn` path as ``POST /v1/turns`` (the
:class:`~actors.http.backend.Backend`); the turn runs in a worker thread, so one
slow turn holds up no other connection.

Wyoming has no authentication. The service is off by default
(``[wyoming] enabled``); a host outside loopback needs ``allowed_peers``, or
the service refuses to start (:func:`refusal`); a peer not allowed is closed at
once, before anything is read (:func:`peer_allowed`). The transcript's
``context`` carries the satellite or device id, which ``[wyoming.satellites]``
maps to a room and a person: the person is the turn's speaker, so the privacy
tier's speaker rules apply (an unmapped satellite is an unknown speaker).

With ``[wyoming] zeroconf`` the service is announced over mDNS as
``_wyoming._tcp`` (the ``zeroconf`` package, imported only then), on the
address it listens on (for a wildcard host, the one this machine reaches the
mDNS group from), so Home Assistant discovers it; a loopback host is not
announced. The announcement is withdrawn when the service stops.

Events are read with bounds (:data:`MAX_HEADER_BYTES`, :data:`MAX_DATA_BYTES`,
no payload): the package's own reader reads whatever length a peer announces.
Nothing a person said, nor a reply, reaches a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from wyoming.asr import Transcript
from wyoming.event import Event, async_write_event
from wyoming.handle import Handled, NotHandled
from wyoming.info import Attribution, Describe, HandleModel, HandleProgram, Info

from actors.discovery import is_loopback
from actors.http.backend import Backend
from actors.messages import UserTurn
from runtime.config import WyomingSettings

log = logging.getLogger(__name__)

CHANNEL = "voice"
PROGRAM = "reverie"
DESCRIPTION = "Reverie: a conversation agent with long-term memory"
ATTRIBUTION = Attribution(name="Reverie", url="")  # no public home page to name
# An event's header line and its data (JSON) may be this long; a transcript of
# MAX_TURN_CHARS characters fits. Audio payloads are not for a handle service.
MAX_HEADER_BYTES = 64 * 1024
MAX_DATA_BYTES = 256 * 1024
STOP_TIMEOUT_S = 10.0
# The context keys that name where a transcript came from (Home Assistant's
# wyoming conversation agent sends both when it knows them), the first found wins.
SOURCE_KEYS = ("satellite_id", "device_id")

SERVICE_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class BadEvent(ValueError):
    """An event that is not Wyoming's, or longer than the bounds."""


def refusal(settings: WyomingSettings) -> str:
    """Why the service must not start as configured; empty when it may."""
    if not is_loopback(settings.host) and not settings.allowed_peers:
        return (f"[wyoming] host {settings.host} is not loopback and [wyoming] allowed_peers"
                " is empty: Wyoming has no authentication, so name the peers allowed")
    return ""


def announced_ip(host: str) -> str:
    """The address announced over mDNS for a service on ``host``: ``host`` itself,
    or, for a wildcard host, the address this machine reaches the mDNS group
    from. ValueError for a loopback host (no other machine could use it)."""
    if is_loopback(host):
        raise ValueError(f"host {host} is loopback: no other machine could reach it")
    if host not in ("0.0.0.0", "::", ""):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 5353))  # UDP: nothing is sent
        return str(probe.getsockname()[0])


def allowed_networks(settings: WyomingSettings) -> list[Network]:
    return [ipaddress.ip_network(peer, strict=False) for peer in settings.allowed_peers]


def peer_allowed(peer: str, allowed: Sequence[Network]) -> bool:
    """Whether a peer at address ``peer`` may talk: one of ``allowed``, or, when
    none is named, a loopback peer."""
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not allowed:
        return ip.is_loopback
    return any(ip.version == net.version and ip in net for net in allowed)


def info(settings: WyomingSettings, version: str) -> Info:
    """The answer to ``describe``: one handle program, with its languages."""
    model = HandleModel(name=PROGRAM, description=DESCRIPTION, attribution=ATTRIBUTION,
                        installed=True, version=version, languages=list(settings.languages))
    return Info(handle=[HandleProgram(name=PROGRAM, description=DESCRIPTION,
                                      attribution=ATTRIBUTION, installed=True,
                                      version=version, models=[model])])


def turn_for(transcript: Transcript, settings: WyomingSettings) -> UserTurn:
    """The turn a transcript asks for: on the voice channel, spoken by the person
    its satellite (or device) is mapped to, if any, in that satellite's room
    (the prompt says where). ValidationError when the text is no turn (too long)."""
    context = transcript.context if isinstance(transcript.context, dict) else {}
    speaker = room = None
    for key in SOURCE_KEYS:
        source = context.get(key)
        if isinstance(source, str) and source in settings.satellites:
            speaker = settings.satellites[source].person
            room = settings.satellites[source].room or None
            break
    return UserTurn(channel=CHANNEL, text=transcript.text, speaker=speaker, room=room)


def failure_reason(exc: BaseException) -> str:
    """What ``not-handled`` says when a turn fails: the kind of failure, never the
    text (an error can echo what was said)."""
    if isinstance(exc, ValidationError):
        return "the transcript is not a turn Reverie takes (too long?)"
    if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
        return "the turn did not finish in time"
    return f"the turn failed ({type(exc).__name__})"


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """One event, or None at the end of the stream; :class:`BadEvent` when it is
    malformed or longer than the bounds."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise BadEvent("the stream ended inside an event") from None
    except asyncio.LimitOverrunError:
        raise BadEvent("an event header longer than allowed") from None
    try:
        header = json.loads(line)
        kind = header["type"]
        data = header.get("data") or {}
        data_length = int(header.get("data_length") or 0)
        payload_length = int(header.get("payload_length") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BadEvent("an event header that is not Wyoming's") from None
    if not isinstance(kind, str) or not isinstance(data, dict):
        raise BadEvent("an event header that is not Wyoming's")
    if not 0 <= data_length <= MAX_DATA_BYTES or payload_length != 0:
        raise BadEvent("an event longer than allowed, or with a payload")
    if data_length:
        try:
            extra = json.loads(await reader.readexactly(data_length))
        except asyncio.IncompleteReadError:
            raise BadEvent("the stream ended inside an event") from None
        except ValueError:
            raise BadEvent("event data that is not JSON") from None
        if not isinstance(extra, dict):
            raise BadEvent("event data that is not an object")
        data = {**data, **extra}
    return Event(type=kind, data=data)


class WyomingService:
    """The service on a socket bound by :meth:`bind`; :meth:`start` serves it from a
    thread of its own, :meth:`stop` closes it."""

    def __init__(self, settings: WyomingSettings, backend: Backend, version: str) -> None:
        self.settings = settings
        self.backend = backend
        self.version = version
        self.allowed = allowed_networks(settings)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._open: set[asyncio.StreamWriter] = set()  # the connections (the loop's thread)
        self._zeroconf: Any = None  # an AsyncZeroconf while announced
        self._announcing: asyncio.Task[None] | None = None
        self.address = ""
        self.announced = ""  # the mDNS name, once announced
        self.announce_error = ""

    def bind(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (bound and listening): records its address."""
        self._sock = sock
        host, port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        self.address = f"tcp://{host}:{port}"

    def start(self) -> None:
        if self._sock is None:
            raise RuntimeError("bind a socket first")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="wyoming-server", daemon=True)
        self._thread.start()
        self._ready.wait(STOP_TIMEOUT_S)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except Exception as exc:
            log.error("wyoming: the server stopped: %s", type(exc).__name__)
        finally:
            self._ready.set()
            self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self.connection, sock=self._sock,
                                                  limit=MAX_HEADER_BYTES)
        if self.settings.zeroconf:  # in the background: probing the name takes seconds
            self._announcing = asyncio.create_task(self._announce())
        self._ready.set()
        async with self._server:
            try:
                await self._server.serve_forever()
            except asyncio.CancelledError:
                pass

    async def _announce(self) -> None:
        from zeroconf import IPVersion
        from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

        port = self._sock.getsockname()[1] if self._sock is not None else 0
        try:
            ip = announced_ip(self.settings.host)
            packed = ipaddress.ip_address(ip).packed
            name = f"reverie-{socket.gethostname().split('.')[0]}"
            zc = AsyncZeroconf(interfaces=[ip], ip_version=IPVersion.V6Only if ":" in ip
                               else IPVersion.V4Only)
            self._zeroconf = zc
            registered = await zc.async_register_service(AsyncServiceInfo(
                SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", addresses=[packed], port=port,
                server=f"{name}.local."))
            await registered  # probed, then announced
        except Exception as exc:  # the service runs on, undiscovered
            self.announce_error = f"not announced: {exc or type(exc).__name__}"
            log.error("wyoming: zeroconf %s", self.announce_error)
            await self._withdraw()
            return
        self.announced = f"{name}.{SERVICE_TYPE}"
        log.info("wyoming: announced as %s on %s", self.announced, ip)

    async def _withdraw(self) -> None:
        zc, self._zeroconf = self._zeroconf, None
        if zc is not None:
            try:
                await zc.async_unregister_all_services()
            finally:
                await zc.async_close()

    async def _close(self) -> None:
        if self._announcing is not None and not self._announcing.done():
            self._announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._announcing
        await self._withdraw()
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()

    def stop(self) -> None:
        """Withdraw the announcement; stop taking connections; close those open."""
        loop = self._loop
        if loop is not None and self._server is not None and self.running():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), loop).result(STOP_TIMEOUT_S)
            except Exception as exc:
                log.warning("wyoming: did not stop cleanly: %s", type(exc).__name__)
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()

    async def connection(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        """One peer: refused at once unless allowed; then events until it leaves."""
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._open.add(writer)
        try:
            if not peer_allowed(address, self.allowed):
                log.warning("wyoming: refused a connection from %s (not in"
                            " [wyoming] allowed_peers)", address or "an unknown peer")
                return
            while (event := await read_event(reader)) is not None:
                answer = await self.answer(event)
                if answer is not None:
                    await async_write_event(answer, writer)
        except BadEvent as exc:
            log.warning("wyoming: closed a connection from %s: %s", address, exc)
        except ConnectionError:
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def answer(self, event: Event) -> Event | None:
        """The answer to one event (None: nothing to answer)."""
        if Describe.is_type(event.type):
            return info(self.settings, self.version).event()
        if Transcript.is_type(event.type):
            text = event.data.get("text")
            if not isinstance(text, str) or not text.strip():
                return NotHandled(text="nothing was said").event()
            transcript = Transcript(text=text, context=event.data.get("context"),
                                    language=event.data.get("language"))
            return await self.handle(transcript)
        return None  # ping, audio, ...: not for a handle service

    async def handle(self, transcript: Transcript) -> Event:
        """One turn on the voice channel: ``handled`` with the reply, or
        ``not-handled`` with the reason it failed."""
        context: dict[str, Any] = (transcript.context
                                   if isinstance(transcript.context, dict) else {})
        try:
            turn = turn_for(transcript, self.settings)
            reply = await asyncio.get_running_loop().run_in_executor(
                None, self.backend.turn, turn)
        except Exception as exc:
            log.warning("wyoming: a turn failed: %s", type(exc).__name__)
            return NotHandled(text=failure_reason(exc), context=context or None).event()
        return Handled(text=reply.text, context=context or None).event()
