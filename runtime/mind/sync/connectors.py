"""The connector interface and its four kinds: CalDAV, iCalendar over HTTP(S),
IMAP and CardDAV.

A connector is given a :class:`ConnectorRun` (its settings, the password read
from the environment, its own state from ``job_state``, the calendar window
and a :class:`Sink` for the facts) and syncs what changed since its state:

- **caldav** (the ``caldav`` library): the principal's calendars (or those
  named in ``collections``), each read with a sync-collection REPORT from its
  sync token (RFC 6578; an expired token falls back to a full listing, a
  server without sync-collection is listed by ETag with PROPFIND), the
  changed objects fetched with calendar-multiget, deleted ones retired;
- **ical**: one iCalendar document over HTTP(S), fetched with a conditional
  GET (``If-None-Match``/``If-Modified-Since``: a 304 costs nothing);
- **imap** (``imaplib``, TLS, or STARTTLS, or plain on loopback only): each
  configured folder opened read-only (nothing is marked seen), the mails
  after the last UID seen fetched in batches, at most ``max_item_bytes`` of
  each; a new UIDVALIDITY starts the folder over;
- **carddav** (plain WebDAV over ``httpx``, vCards parsed by ``vobject``): the
  address books found from the URL (or those named in ``collections``), read
  with sync-collection (or PROPFIND) and addressbook-multiget like calendars.

Calendar windows move: a recurring event, or one beyond the window, is fetched
again once a day (when the household's date changes) so that its new
occurrences arrive; an unchanged occurrence writes nothing (its digest is in
the state). An item deleted at the source, or an occurrence gone from a
changed event, is retired: its fact is superseded by one saying it was
removed (history is kept). Occurrences that merely fell out of the window are
left as they are.

A password never goes in clear to a host that is not loopback: an ``http://``
URL with credentials, or an IMAP server without STARTTLS, is refused
(:class:`PlaintextRefused`, before anything is sent) unless the connector has
``allow_plaintext = true``.

Every network call has a timeout (``timeout_s``; a response that trickles in
is cut after :data:`DEADLINE_FACTOR` times that), and every download is
bounded (``max_download_bytes``). A failure is raised as a :class:`SyncError`
whose message is written here, never taken from a server or a library (so it
can hold neither content nor credentials): :func:`describe` turns anything
raised into one.
"""

from __future__ import annotations

import base64
import imaplib
import ipaddress
import logging
import re
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit
from xml.sax.saxutils import escape

import httpx

from runtime.config import ConnectorSettings
from runtime.mind.sync.items import (
    KIND_CONTACT,
    KIND_EVENT,
    KIND_MAIL,
    Item,
    Malformed,
    Resource,
    Skip,
    Tally,
    Window,
    calendar_resources,
    clean,
    contact_item,
    ident,
    mail_item,
)

log = logging.getLogger(__name__)

DEADLINE_FACTOR = 4  # a whole response must arrive within this many timeouts
BATCH = 50  # objects per multiget, mails per FETCH
MAX_ERROR = 240
USER_AGENT = "reverie-sync"


# -- failures ------------------------------------------------------------------


class SyncError(Exception):
    """A connector's failure. Its message is written by this module: safe to
    record (never content, never credentials)."""


class Unreachable(SyncError):
    pass


class TimedOut(SyncError):
    pass


class TLSFailed(SyncError):
    pass


class ServerError(SyncError):
    """The server answered with an error (``status``: the HTTP status, if any)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthFailed(ServerError):
    pass


class TooLarge(SyncError):
    pass


class MalformedSource(SyncError):
    pass


class ProtocolError(SyncError):
    pass


class MissingSecret(SyncError):
    pass


class ConfigProblem(SyncError):
    pass


class PlaintextRefused(SyncError):
    """The password would go in clear (plain http, or IMAP without TLS) to a host
    that is not loopback, and the connector's settings do not allow it
    (``allow_plaintext``). Raised before the password is sent."""


def classify(exc: BaseException) -> SyncError:
    """Anything a connector raised, as a :class:`SyncError` with a message of
    ours (the original's message is dropped: it may quote a server, a URL or
    the data)."""
    if isinstance(exc, SyncError):
        return exc
    if isinstance(exc, Malformed):
        return MalformedSource("the calendar is not iCalendar")
    import requests  # the caldav library's transport
    from caldav.lib import error as dav_error

    if isinstance(exc, TimeoutError | httpx.TimeoutException | requests.Timeout):
        return TimedOut("no answer in time")
    if isinstance(exc, ssl.SSLError | requests.exceptions.SSLError):
        return TLSFailed("the TLS handshake or the certificate check failed")
    if isinstance(exc, httpx.ConnectError) and _caused_by(exc, ssl.SSLError):
        return TLSFailed("the TLS handshake or the certificate check failed")
    if isinstance(exc, OSError | httpx.NetworkError | requests.ConnectionError):
        return Unreachable("could not reach the server")
    if isinstance(exc, dav_error.AuthorizationError):
        return AuthFailed("the server refused the credentials or the access")
    if isinstance(exc, dav_error.NotFoundError):
        return ServerError("the server has no such collection", 404)
    if isinstance(exc, dav_error.DAVError):
        return ProtocolError("the server's DAV answer was not usable")
    if isinstance(exc, imaplib.IMAP4.error):  # abort and readonly too
        return ProtocolError("the IMAP session failed")
    if isinstance(exc, httpx.HTTPError | requests.RequestException):
        return ProtocolError("the HTTP exchange failed")
    return SyncError("unexpected failure")


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is in the chain of causes below ``exc`` (httpx wraps
    httpcore's error, which wraps the ssl module's)."""
    seen: set[int] = set()
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def describe(exc: BaseException, secrets: Sequence[str | None] = ()) -> str:
    """One line for the record: ``Type: message``, the library's exception type
    in parentheses; any secret that might still be in it is masked."""
    err = classify(exc)
    text = f"{type(err).__name__}: {err}"
    if err is not exc:
        text += f" ({type(exc).__name__})"
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text[:MAX_ERROR]


# -- the interface ---------------------------------------------------------------


class Sink(Protocol):
    """Where a connector's items go (the job writes them as facts)."""

    tally: Tally

    def put(self, item: Item) -> None:
        """Write the item's fact unless the same fact is current already."""
        ...

    def retire(self, subject: str, key: str, where: str) -> None:
        """Supersede the item's current fact with one saying it was removed
        from ``where`` (the calendar, the address book)."""
        ...


@dataclass
class ConnectorRun:
    """What a connector is given for one run."""

    settings: ConnectorSettings
    password: str | None
    state: dict[str, Any]  # its own, JSON; persisted by ``save``
    window: Window
    sink: Sink
    save: Callable[[], None]
    out_of_time: Callable[[], bool]
    more: bool = False  # stopped on the budget with work left
    notes: list[str] = field(default_factory=list)  # for the detail line: no content

    @property
    def tally(self) -> Tally:
        return self.sink.tally

    @property
    def deadline(self) -> float:
        return time.monotonic() + DEADLINE_FACTOR * self.settings.timeout_s


class Connector(Protocol):
    kinds: ClassVar[tuple[str, ...]]  # the fact kinds it writes

    def sync(self, run: ConnectorRun) -> None: ...


class Resources:
    """The items each resource (a calendar object, a vCard, an iCalendar UID)
    last produced, in a connector's state: ``{rid: {"etag", "pending",
    "keys": [[subject, key, start, digest], ...]}}``."""

    def __init__(self, table: dict[str, Any], run: ConnectorRun, where: str) -> None:
        self.table = table
        self.run = run
        self.where = where

    def ids(self) -> set[str]:
        return set(self.table)

    def etag(self, rid: str) -> str | None:
        entry = self.table.get(rid)
        return None if entry is None else entry.get("etag")

    def pending(self) -> list[str]:
        return [rid for rid, entry in self.table.items() if entry.get("pending")]

    def update(self, rid: str, items: list[Item] | None, etag: str | None,
               pending: bool) -> None:
        """Record what ``rid`` holds now: new and changed items are written,
        unchanged ones skipped, and the ones it no longer holds retired (unless
        they merely fell out of the window). ``items`` None: it could not be
        read this time; what it held is kept."""
        old = self.table.get(rid) or {"keys": [], "pending": False}
        if items is None:
            self.table[rid] = {**old, "etag": etag}
            return
        before = {(s, k): (start, digest) for s, k, start, digest in old["keys"]}
        now: dict[tuple[str, str], Item] = {(i.subject, i.key): i for i in items}
        for pair, item in now.items():
            if pair in before and before[pair][1] == item.digest:
                self.run.tally.unchanged += 1
            else:
                self.run.sink.put(item)
        self._retire([(pair, before[pair][0]) for pair in before if pair not in now])
        self.table[rid] = {"etag": etag, "pending": pending,
                           "keys": [[i.subject, i.key, i.start, i.digest] for i in now.values()]}

    def remove(self, rid: str) -> None:
        """The resource was deleted at the source: retire what it held."""
        old = self.table.pop(rid, None)
        if old is not None:
            self._retire([((s, k), start) for s, k, start, _ in old["keys"]])

    def _retire(self, gone: list[tuple[tuple[str, str], float | None]]) -> None:
        floor = self.run.window.start_ts
        for (subject, key), start in gone:
            if start is None or start >= floor:
                self.run.sink.retire(subject, key, self.where)


# -- shared helpers -----------------------------------------------------------------


def _ssl_context(settings: ConnectorSettings) -> ssl.SSLContext:
    cafile = str(settings.ca_file.expanduser()) if settings.ca_file else None
    return ssl.create_default_context(cafile=cafile)


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_plaintext(settings: ConnectorSettings, host: str, refusal: str) -> None:
    """The password is about to go in clear to ``host``: refused with
    ``refusal`` unless the host is loopback or the connector allows it."""
    if is_loopback(host):
        return
    if not settings.allow_plaintext:
        raise PlaintextRefused(f"{refusal}, or set allow_plaintext = true for this connector")
    log.warning("sync %s: its password goes in clear to another host (allow_plaintext)",
                settings.name)


def _refuse_plain_http(run: ConnectorRun) -> None:
    """Credentials over an http:// URL (Basic auth: the password in clear) to a
    host that is not loopback: refused, unless the connector allows it."""
    s = run.settings
    parts = urlsplit(s.url)
    if parts.scheme == "http" and (s.username or run.password):
        refuse_plaintext(s, parts.hostname or "",
                         "the password would go in clear over http to another host; use https")


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "webcal":
        return urlunsplit(("https", *parts[1:]))
    return url


def _http_client(run: ConnectorRun) -> httpx.Client:
    s = run.settings
    auth = httpx.BasicAuth(s.username, run.password or "") if s.username else None
    return httpx.Client(auth=auth, timeout=httpx.Timeout(s.timeout_s), verify=_ssl_context(s),
                        follow_redirects=True, max_redirects=5,
                        headers={"User-Agent": USER_AGENT})


def _read_capped(response: httpx.Response, cap: int, deadline: float) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise TooLarge(f"the answer is larger than {cap} bytes")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > cap:
            raise TooLarge(f"the answer is larger than {cap} bytes")
        if time.monotonic() > deadline:
            raise TimedOut("the answer did not arrive in time")
    return bytes(body)


def _check_http(status: int) -> None:
    if status == 401:
        raise AuthFailed("the server refused the credentials (HTTP 401)", status)
    if status == 403:
        raise AuthFailed("the server refused access (HTTP 403)", status)
    if status >= 400:
        raise ServerError(f"HTTP {status}", status)


def _wanted(url: str, display: str | None, wanted: Sequence[str]) -> bool:
    """Whether a collection is one the settings name (all when they name none)."""
    if not wanted:
        return True
    last = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]).casefold()
    names = {last, (display or "").strip().casefold()}
    return any(w.strip().casefold() in names for w in wanted)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for at in range(0, len(items), size):
        yield items[at:at + size]


def _merge(resources: list[Resource]) -> tuple[list[Item] | None, bool]:
    """One calendar object's events (usually one UID): its items, None when
    none of its events could be read."""
    good = [r for r in resources if r.items is not None]
    if resources and not good:
        return None, any(r.pending for r in resources)
    return [i for r in good for i in r.items or []], any(r.pending for r in resources)


# -- caldav --------------------------------------------------------------------------


#: Libraries' loggers held at a level where they log neither content nor URLs:
#: caldav logs whole request and response bodies at DEBUG, httpx every request's
#: URL at INFO, urllib3 (under caldav) every path at DEBUG; an iCalendar URL can
#: be a secret ("private address") and a path can name a person.
QUIET_LOGGERS = {"caldav": logging.INFO, "httpx": logging.WARNING, "httpcore": logging.INFO,
                 "urllib3": logging.INFO}


def quiet_libraries() -> None:
    for name, level in QUIET_LOGGERS.items():
        lib = logging.getLogger(name)
        if lib.getEffectiveLevel() < level:
            lib.setLevel(level)


class CalDAVConnector:
    kinds: ClassVar[tuple[str, ...]] = (KIND_EVENT,)
    where = "the calendar"

    def sync(self, run: ConnectorRun) -> None:
        import caldav

        s = run.settings
        _refuse_plain_http(run)
        verify: bool | str = str(s.ca_file.expanduser()) if s.ca_file else True
        client = caldav.DAVClient(url=_http_url(s.url), username=s.username,
                                  password=run.password, timeout=s.timeout_s,  # type: ignore[arg-type]
                                  ssl_verify_cert=verify)
        with client:
            calendars = client.principal().calendars()
            tables: dict[str, Any] = run.state.setdefault("calendars", {})
            for calendar in calendars:
                url = str(calendar.url)
                if s.collections and not _wanted(url, calendar.get_display_name(),
                                                 s.collections):
                    continue
                if run.out_of_time():
                    run.more = True
                    return
                table = tables.setdefault(url, {"token": None, "resources": {}})
                self._calendar(run, calendar, table)
                run.save()

    def _calendar(self, run: ConnectorRun, calendar: Any, table: dict[str, Any]) -> None:
        resources = Resources(table["resources"], run, self.where)
        listing, token, full = self._changes(run, calendar, table.get("token"))
        seen: set[str] = set()
        todo: dict[str, str | None] = {}
        for href, etag in listing:
            seen.add(href)
            if etag is None:  # deleted since the token
                resources.remove(href)
            elif resources.etag(href) != etag:
                todo[href] = etag
        if full:
            for href in resources.ids() - seen:
                resources.remove(href)
        if table.get("window_day") != run.window.day:  # the window moved: new occurrences
            for href in resources.pending():
                todo.setdefault(href, resources.etag(href))
        for batch in _chunks(list(todo), BATCH):
            for href, text in self._load(calendar, batch).items():
                if text is None:
                    resources.remove(href)
                    continue
                if len(text.encode("utf-8", "replace")) > run.settings.max_item_bytes:
                    run.tally.skipped["too-large"] += 1
                    resources.update(href, None, todo[href], False)
                    continue
                try:
                    parsed = calendar_resources(text, run.settings.name, run.window,
                                                run.settings.max_excerpt_chars, run.tally)
                except Malformed:
                    run.tally.skipped["malformed-calendar"] += 1
                    resources.update(href, None, todo[href], False)
                    continue
                items, pending = _merge(parsed)
                resources.update(href, items, todo[href], pending)
        table["token"] = token
        table["window_day"] = run.window.day

    def _changes(self, run: ConnectorRun, calendar: Any, token: str | None
                 ) -> tuple[list[tuple[str, str | None]], str | None, bool]:
        """What changed since ``token``: (href, ETag) pairs, None for an object
        deleted since; the new token; and whether this is a full listing. An
        expired token starts over; a server without sync-collection (RFC 6578)
        is listed by ETag with PROPFIND."""
        from caldav.elements import dav
        from caldav.lib.error import DAVError

        try:
            found = calendar.objects_by_sync_token(token, load_objects=False)
        except DAVError:
            if token is not None:
                log.info("sync %s: the calendar's sync token is no longer valid; reading"
                         " it all", run.settings.name)
                return self._changes(run, calendar, None)
            log.info("sync %s: the server has no sync-collection; listing the calendar by"
                     " ETag", run.settings.name)
            return self._etags(calendar), None, True
        listing = [(_canon(obj.url), obj.props.get(dav.GetEtag.tag)) for obj in found]
        return listing, found.sync_token, token is None

    def _etags(self, calendar: Any) -> list[tuple[str, str | None]]:
        """Every object of the calendar with its ETag, from a Depth 1 PROPFIND
        (an object the server gives no ETag is read every time)."""
        from caldav.elements import dav

        response = calendar.get_properties([dav.GetEtag()], depth=1, parse_response_xml=False)
        own = _canon(calendar.url)
        out: list[tuple[str, str | None]] = []
        for href, props in response.expand_simple_props([dav.GetEtag()]).items():
            url = _canon(calendar.url.join(href))
            if url != own and not url.endswith("/"):  # not the calendar, nor a collection
                out.append((url, props.get(dav.GetEtag.tag) or ""))
        return out

    def _load(self, calendar: Any, hrefs: Sequence[str]) -> dict[str, str | None]:
        """The objects' iCalendar texts (None: gone), by calendar-multiget, or one
        by one when the server's multiget answer cannot be used."""
        import caldav
        from caldav.lib.error import DAVError, NotFoundError
        from caldav.lib.url import URL

        out: dict[str, str | None] = {}
        try:
            for obj in calendar.multiget([URL.objectify(h) for h in hrefs]):
                if isinstance(obj.data, str):
                    out[_canon(obj.url)] = obj.data
        except (DAVError, ValueError):
            out = {}
        for href in hrefs:
            if href in out:
                continue
            one = caldav.CalendarObjectResource(client=calendar.client, url=href, parent=calendar)
            try:
                one.load()
                out[href] = one.data if isinstance(one.data, str) else None
            except NotFoundError:
                out[href] = None
        return {h: out[h] for h in hrefs}


def _canon(url: Any) -> str:
    from caldav.lib.url import URL

    return str(URL.objectify(url).canonical())


# -- ical ----------------------------------------------------------------------------


class ICalConnector:
    kinds: ClassVar[tuple[str, ...]] = (KIND_EVENT,)
    where = "the calendar"

    def sync(self, run: ConnectorRun) -> None:
        s = run.settings
        _refuse_plain_http(run)
        state = run.state
        resources = Resources(state.setdefault("resources", {}), run, self.where)
        headers = {}
        # When the window moved and some event may have new occurrences, read it
        # all again (an unchanged document still answers 304 to a conditional GET).
        if state.get("window_day") == run.window.day or not resources.pending():
            if state.get("etag"):
                headers["If-None-Match"] = state["etag"]
            if state.get("last_modified"):
                headers["If-Modified-Since"] = state["last_modified"]
        with _http_client(run) as client, client.stream("GET", _http_url(s.url),
                                                        headers=headers) as response:
            if response.status_code == 304:
                state["window_day"] = run.window.day
                return
            _check_http(response.status_code)
            if response.status_code != 200:
                raise ServerError(f"HTTP {response.status_code}", response.status_code)
            body = _read_capped(response, s.max_download_bytes, run.deadline)
            etag = response.headers.get("etag")
            modified = response.headers.get("last-modified")
        parsed = calendar_resources(body.decode("utf-8", "replace"), s.name, run.window,
                                    s.max_excerpt_chars, run.tally)
        seen = set()
        for resource in parsed:
            seen.add(resource.rid)
            resources.update(resource.rid, resource.items, None, resource.pending)
        for rid in resources.ids() - seen:
            resources.remove(rid)
        state.update(etag=etag, last_modified=modified, window_day=run.window.day)


# -- carddav -------------------------------------------------------------------------

DAV_NS = "DAV:"
CARD_NS = "urn:ietf:params:xml:ns:carddav"
_XML_HEAD = '<?xml version="1.0" encoding="utf-8"?>'
PROPFIND_BOOKS = (
    _XML_HEAD + '<D:propfind xmlns:D="DAV:" xmlns:C="urn:ietf:params:xml:ns:carddav"><D:prop>'
    "<D:resourcetype/><D:displayname/><D:current-user-principal/><C:addressbook-home-set/>"
    "</D:prop></D:propfind>")
PROPFIND_ETAGS = (_XML_HEAD + '<D:propfind xmlns:D="DAV:"><D:prop><D:resourcetype/><D:getetag/>'
                  "</D:prop></D:propfind>")


def _tag(ns: str, name: str) -> str:
    return f"{{{ns}}}{name}"


@dataclass
class DavResponse:
    href: str  # as the server wrote it
    status: int | None  # the response's own status (404: gone), if it has one
    props: dict[str, Any]  # tag -> element, from the propstats with status 200


def _status_code(text: str | None) -> int | None:
    m = re.match(r"\s*HTTP/\d(?:\.\d)?\s+(\d{3})", text or "")
    return int(m.group(1)) if m else None


class _Dav:
    """Plain WebDAV over one httpx client: bounded, with a deadline per call."""

    def __init__(self, client: httpx.Client, run: ConnectorRun) -> None:
        self.client = client
        self.run = run

    def multistatus(self, method: str, url: str, body: str,
                    depth: str) -> tuple[list[DavResponse], str | None]:
        from lxml import etree

        with self.client.stream(method, url, content=body.encode(), headers={
                "Depth": depth, "Content-Type": "application/xml; charset=utf-8"}) as response:
            _check_http(response.status_code)
            if response.status_code != 207:
                raise ServerError(f"HTTP {response.status_code} to {method}",
                                  response.status_code)
            data = _read_capped(response, self.run.settings.max_download_bytes,
                                self.run.deadline)
        parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                                 huge_tree=False)
        try:
            root = etree.fromstring(data, parser)
        except etree.XMLSyntaxError:
            raise ProtocolError("the server's DAV answer is not XML") from None
        out = []
        for response_el in root.iter(_tag(DAV_NS, "response")):
            href = response_el.findtext(_tag(DAV_NS, "href")) or ""
            status = _status_code(response_el.findtext(_tag(DAV_NS, "status")))
            props: dict[str, Any] = {}
            for propstat in response_el.iter(_tag(DAV_NS, "propstat")):
                code = _status_code(propstat.findtext(_tag(DAV_NS, "status")))
                prop = propstat.find(_tag(DAV_NS, "prop"))
                if code == 200 and prop is not None:
                    for child in prop:
                        props[child.tag] = child
            out.append(DavResponse(href.strip(), status, props))
        token = root.findtext(_tag(DAV_NS, "sync-token"))
        return out, (token.strip() if token else None)


def _href_of(response: DavResponse, prop: str) -> str | None:
    element = response.props.get(prop)
    if element is None:
        return None
    found = element.findtext(_tag(DAV_NS, "href"))
    return found.strip() if found else None


def _is_book(response: DavResponse) -> bool:
    kind = response.props.get(_tag(DAV_NS, "resourcetype"))
    return kind is not None and kind.find(_tag(CARD_NS, "addressbook")) is not None


def _norm(base: str, href: str) -> str:
    """A resource's path, decoded: the same whichever way the server spelled it."""
    return unquote(urlsplit(urljoin(base, href)).path)


class CardDAVConnector:
    kinds: ClassVar[tuple[str, ...]] = (KIND_CONTACT,)
    where = "the address book"

    def sync(self, run: ConnectorRun) -> None:
        s = run.settings
        _refuse_plain_http(run)
        with _http_client(run) as client:
            dav = _Dav(client, run)
            tables: dict[str, Any] = run.state.setdefault("books", {})
            for url, name in self._books(dav, _http_url(s.url)):
                if not _wanted(url, name, s.collections):
                    continue
                if run.out_of_time():
                    run.more = True
                    return
                table = tables.setdefault(url, {"token": None, "resources": {}})
                self._book(run, dav, url, table)
                run.save()

    def _books(self, dav: _Dav, url: str) -> list[tuple[str, str | None]]:
        """The address books at ``url``: itself, or those under its owner's
        address-book home (found through the current user's principal)."""
        responses, _ = dav.multistatus("PROPFIND", url, PROPFIND_BOOKS, "0")
        if not responses:
            raise ProtocolError("the server described nothing at the url")
        here = responses[0]
        if _is_book(here):
            return [(url, _display(here))]
        home = _href_of(here, _tag(CARD_NS, "addressbook-home-set"))
        principal = _href_of(here, _tag(DAV_NS, "current-user-principal"))
        if home is None and principal is not None:
            found, _ = dav.multistatus("PROPFIND", urljoin(url, principal), PROPFIND_BOOKS, "0")
            home = _href_of(found[0], _tag(CARD_NS, "addressbook-home-set")) if found else None
            home = home or principal
        base = urljoin(url, home) if home else url
        listing, _ = dav.multistatus("PROPFIND", base, PROPFIND_BOOKS, "1")
        return [(urljoin(base, r.href), _display(r)) for r in listing if _is_book(r)]

    def _changes(self, dav: _Dav, book: str, token: str | None
                 ) -> tuple[dict[str, tuple[str, str]], set[str], str | None, bool]:
        """What changed since ``token``: {path: (href, etag)}, the deleted paths,
        the new token, and whether this is a full listing. An expired token
        starts over; a server without sync-collection is listed by ETag."""
        body = (_XML_HEAD + '<D:sync-collection xmlns:D="DAV:"><D:sync-token>'
                f"{escape(token or '')}</D:sync-token><D:sync-level>1</D:sync-level>"
                "<D:prop><D:getetag/></D:prop></D:sync-collection>")
        try:
            responses, new_token = dav.multistatus("REPORT", book, body, "0")
        except ServerError as exc:  # AuthFailed too: an old token is refused with 403
            if token is not None and exc.status in (400, 403, 409, 412):
                log.info("sync %s: the address book's sync token is no longer valid; "
                         "reading it all", dav.run.settings.name)
                return self._changes(dav, book, None)
            if token is None and exc.status in (400, 403, 405, 415, 501):
                responses, _ = dav.multistatus("PROPFIND", book, PROPFIND_ETAGS, "1")
                changed, _ = self._split(book, responses)
                return changed, set(), None, True
            raise
        changed, deleted = self._split(book, responses)
        return changed, deleted, new_token, token is None

    def _split(self, book: str, responses: list[DavResponse]
               ) -> tuple[dict[str, tuple[str, str]], set[str]]:
        changed: dict[str, tuple[str, str]] = {}
        deleted: set[str] = set()
        own = _norm(book, book)
        for r in responses:
            path = _norm(book, r.href)
            if path == own or path.endswith("/"):  # the collection itself, sub-collections
                continue
            if r.status == 404:
                deleted.add(path)
                continue
            etag = r.props.get(_tag(DAV_NS, "getetag"))
            if etag is not None and etag.text:
                changed[path] = (r.href, etag.text.strip())
        return changed, deleted

    def _book(self, run: ConnectorRun, dav: _Dav, book: str, table: dict[str, Any]) -> None:
        resources = Resources(table["resources"], run, self.where)
        changed, deleted, token, full = self._changes(dav, book, table.get("token"))
        for path in deleted:
            resources.remove(path)
        if full:
            for path in resources.ids() - set(changed):
                resources.remove(path)
        todo = [(path, href, etag) for path, (href, etag) in changed.items()
                if resources.etag(path) != etag]
        for batch in _chunks(todo, BATCH):
            got, too_large = self._fetch(dav, book, batch)
            for path, _, etag in batch:
                if path in too_large:
                    run.tally.skipped["too-large"] += 1
                    resources.update(path, None, etag, False)
                    continue
                if path not in got:
                    continue  # changed again meanwhile: the next run sees it
                text = got[path]
                if text is None:
                    resources.remove(path)
                    continue
                try:
                    item = contact_item(text, run.settings.name, ident(path),
                                        run.settings.max_excerpt_chars, run.tally,
                                        run.settings.max_item_bytes)
                except Skip as skip:
                    run.tally.skipped[skip.reason] += 1
                    resources.update(path, None, etag, False)
                    continue
                resources.update(path, [item], etag, False)
        table["token"] = token

    def _fetch(self, dav: _Dav, book: str, batch: Sequence[tuple[str, str, str]]
               ) -> tuple[dict[str, str | None], set[str]]:
        """The cards of ``batch`` ((path, href, etag)s): their texts (None: gone),
        and the paths of those too large to download even alone (a batch whose
        answer is too large is split in two)."""
        try:
            return self._multiget(dav, book, [href for _, href, _ in batch]), set()
        except TooLarge:
            if len(batch) == 1:
                return {}, {batch[0][0]}
        half = len(batch) // 2
        got, large = self._fetch(dav, book, batch[:half])
        more, larger = self._fetch(dav, book, batch[half:])
        return {**got, **more}, large | larger

    def _multiget(self, dav: _Dav, book: str, hrefs: Sequence[str]) -> dict[str, str | None]:
        body = (_XML_HEAD + '<C:addressbook-multiget xmlns:D="DAV:" '
                'xmlns:C="urn:ietf:params:xml:ns:carddav"><D:prop><D:getetag/>'
                "<C:address-data/></D:prop>"
                + "".join(f"<D:href>{escape(h)}</D:href>" for h in hrefs)
                + "</C:addressbook-multiget>")
        responses, _ = dav.multistatus("REPORT", book, body, "1")
        out: dict[str, str | None] = {}
        for r in responses:
            path = _norm(book, r.href)
            data = r.props.get(_tag(CARD_NS, "address-data"))
            if r.status == 404:
                out[path] = None
            elif data is not None:
                out[path] = data.text or ""
        return out


def _display(response: DavResponse) -> str | None:
    element = response.props.get(_tag(DAV_NS, "displayname"))
    return None if element is None or element.text is None else element.text.strip()


# -- imap ----------------------------------------------------------------------------


def _utf7(name: str) -> str:
    """A folder name in IMAP's modified UTF-7 (RFC 3501, 5.1.3)."""
    out: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            raw = "".join(pending).encode("utf-16-be")
            out.append("&" + base64.b64encode(raw).decode().rstrip("=").replace("/", ",") + "-")
            pending.clear()

    for ch in name:
        if 0x20 <= ord(ch) <= 0x7E:
            flush()
            out.append("&-" if ch == "&" else ch)
        else:
            pending.append(ch)
    flush()
    return "".join(out)


def _mailbox(name: str) -> str:
    encoded = _utf7(name)
    return '"' + encoded.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ImapConnector:
    kinds: ClassVar[tuple[str, ...]] = (KIND_MAIL,)

    def sync(self, run: ConnectorRun) -> None:
        s = run.settings
        parts = urlsplit(s.url)
        host = parts.hostname or ""
        tls = parts.scheme == "imaps"
        port = parts.port or (993 if tls else 143)
        context = _ssl_context(s)
        conn: imaplib.IMAP4
        if tls:
            conn = imaplib.IMAP4_SSL(host, port, ssl_context=context, timeout=s.timeout_s)
        else:
            conn = imaplib.IMAP4(host, port, timeout=s.timeout_s)
        try:
            if not tls and "STARTTLS" in conn.capabilities and not is_loopback(host):
                conn.starttls(context)
            elif not tls:
                refuse_plaintext(s, host, "the server offers no STARTTLS and the password "
                                 "would go in clear to another host; use imaps")
            try:
                conn.login(s.username or "", run.password or "")
            except imaplib.IMAP4.error:
                raise AuthFailed("the server refused the login") from None
            folders: dict[str, Any] = run.state.setdefault("folders", {})
            for folder in s.folders or ["INBOX"]:
                if run.out_of_time():
                    run.more = True
                    break
                self._folder(run, conn, folder, folders)
        finally:
            try:
                conn.logout()
            except Exception:  # the session is gone already
                log.debug("sync %s: logout failed", s.name)

    def _folder(self, run: ConnectorRun, conn: imaplib.IMAP4, folder: str,
                folders: dict[str, Any]) -> None:
        typ, _ = conn.select(_mailbox(folder), readonly=True)
        if typ != "OK":
            run.tally.skipped["missing-folder"] += 1
            run.notes.append(f"no folder {clean(folder, 60)[0]!r}")
            return
        _, answer = conn.response("UIDVALIDITY")
        try:
            validity = int(answer[0]) if answer and answer[0] is not None else 0
        except (TypeError, ValueError):
            validity = 0
        state = folders.get(folder) or {}
        if state.get("uidvalidity") != validity:
            state = {"uidvalidity": validity, "last_uid": 0}
        last = int(state["last_uid"])
        typ, data = conn.uid("SEARCH", "UID", f"{last + 1}:*")
        if typ != "OK":
            raise ServerError("IMAP: SEARCH refused")
        uids = sorted(u for u in (int(x) for x in (data[0] or b"").split()) if u > last)
        for batch in _chunks(uids, BATCH):
            fetched = self._fetch(conn, batch, run.settings.max_item_bytes)
            for uid in batch:
                if uid not in fetched:
                    continue  # expunged meanwhile
                raw, size = fetched[uid]
                fallback = ident(f"{folder} {validity}/{uid}")
                try:
                    item = mail_item(raw, size, run.settings.name, fallback, run.window.zone,
                                     run.settings.max_excerpt_chars, run.tally)
                except Skip as skip:
                    run.tally.skipped[skip.reason] += 1
                    continue
                run.sink.put(item)
            state["last_uid"] = int(batch[-1])
            folders[folder] = state
            run.save()
            if run.out_of_time():
                run.more = True
                return
        folders[folder] = state

    def _fetch(self, conn: imaplib.IMAP4, uids: Sequence[int],
               cap: int) -> dict[int, tuple[bytes, int]]:
        """Each mail's first ``cap`` bytes and its full size."""
        typ, data = conn.uid("FETCH", ",".join(str(u) for u in uids),
                             f"(UID RFC822.SIZE BODY.PEEK[]<0.{cap}>)")
        if typ != "OK":
            raise ServerError("IMAP: FETCH refused")
        out: dict[int, tuple[bytes, int]] = {}
        for at, entry in enumerate(data):
            if not isinstance(entry, tuple) or len(entry) < 2:
                continue
            head = entry[0].decode("ascii", "replace") if isinstance(entry[0], bytes) else ""
            tail = data[at + 1] if at + 1 < len(data) else b""
            around = head + " " + (tail.decode("ascii", "replace")
                                   if isinstance(tail, bytes) else "")
            uid = re.search(r"\bUID (\d+)", around)
            size = re.search(r"\bRFC822\.SIZE (\d+)", around)
            body = entry[1] if isinstance(entry[1], bytes) else b""
            if uid:
                out[int(uid.group(1))] = (body, int(size.group(1)) if size else len(body))
        return out


#: The connector of each kind.
CONNECTORS: dict[str, type[Connector]] = {
    "caldav": CalDAVConnector,
    "ical": ICalConnector,
    "imap": ImapConnector,
    "carddav": CardDAVConnector,
}


def make_connector(kind: str) -> Connector:
    try:
        return CONNECTORS[kind]()
    except KeyError:
        raise ConfigProblem(f"no connector of kind {kind!r}") from None
