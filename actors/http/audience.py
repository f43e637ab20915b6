"""Who is asking: every way out of the HTTP server answers an audience.

The privacy rules (:mod:`runtime.memories.privacy`) apply to whoever asks, on
every way out, not only in the turn path. Who asks is told by how the request
got in (:class:`actors.http.app.Guard`):

- the **admin token** (``<data dir>/http-token``) and the memory page's login
  (derived from it) are the household's administrator: everything, as before
  (:data:`ADMIN`);
- a **bound token** (``[http.tokens.<name>]``: its token in
  ``<data dir>/http-tokens/<name>``, generated on first run, 0600) is bound to
  the audience its table names: ``person`` (one of the household's people, or
  none: the household as a whole) on ``channel`` (its ``spoken`` flag: a
  spoken channel gets no sensitive memory without a known person);
- an **OAuth client** of ``/mcp`` is bound to the audience its approver chose
  (:mod:`actors.http.oauth`).

The Guard leaves the caller's audience in a context variable for the length of
the request (:func:`entered`); :class:`AudienceBackend`, the backend every
REST, chat and page route is given, reads it on each call. ``/mcp`` reads the
request's scope instead (the SDK runs its handlers outside the request's
context) and filters in its tools (:mod:`actors.http.mcp`). A call outside any
request, where the variable was never set, is treated as the most restricted
caller (no sensitive memory at all): never as the administrator.

What a bound caller is told (:func:`visible`): the memories
:func:`runtime.memories.privacy.may_use` gives its audience, never a reply
that was given a sensitive memory (:func:`runtime.memories.privacy.recallable`).
A memory it may not be told answers as one that does not exist (404: reading,
editing, marking, forgetting it), and listings leave it out of the items and
of ``total``. Its turns (``/v1/turns``, the OpenAI-, Ollama- and
Responses-compatible chat) are spoken by its person: a turn naming no speaker
gets the token's person; naming another of the household's people, or going to
a typed channel from a token bound to a spoken one, is refused (403), since
either would be told more than the token may.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from actors.http.backend import Backend
from actors.messages import (
    BrowseMemories,
    MemoryPage,
    MemoryView,
    Recall,
    Recalled,
    Status,
    TurnDelta,
    TurnReply,
    UserTurn,
)
from runtime.config import Settings
from runtime.memories import privacy
from runtime.memories.privacy import Audience
from runtime.memories.refs import NoSuchItem, parse_ref
from runtime.store.files import write_private

log = logging.getLogger(__name__)

TOKENS_DIR = "http-tokens"
BROWSE_CHUNK = 500           # items a bound listing reads from the runtime at a time


class Admin:
    """The administrator: the admin token, the memory page's login."""

    def __repr__(self) -> str:
        return "ADMIN"


ADMIN = Admin()
# A caller nothing is known of: a spoken channel, no speaker (no sensitive memory).
STRANGER = Audience(speaker=None, known=False, spoken=True)
Caller = Audience | Admin

_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("reverie_http_caller")


class Refused(PermissionError):
    """A bound caller asked for more than its audience may have (answered 403)."""


@contextmanager
def entered(who: Caller) -> Iterator[None]:
    """``who`` is the caller for the length of the block (one request)."""
    reset = _CALLER.set(who)
    try:
        yield
    finally:
        _CALLER.reset(reset)


def caller() -> Caller:
    """The current request's caller (:data:`STRANGER` outside any request)."""
    return _CALLER.get(STRANGER)


# -- bound tokens -------------------------------------------------------------------

def tokens_dir(settings: Settings) -> Path:
    return settings.store.resolved_dir / TOKENS_DIR


def bound_audience(settings: Settings, name: str) -> Audience:
    """The audience ``[http.tokens.<name>]`` names."""
    bound = settings.http.tokens[name]
    channel = settings.channels[bound.channel]
    return privacy.audience(settings, channel, bound.person)


def token_at(path: Path) -> tuple[str, bool]:
    """The bearer token in ``path``, written there (0600, its directory 0700)
    when missing or empty; and whether it was written now. Never logged."""
    import secrets

    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token, False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    write_private(path, token + "\n")
    return token, True


def load_bound_tokens(settings: Settings) -> dict[str, Audience]:
    """Each bound token (``[http.tokens.<name>]``) and its audience; a token is
    read from ``<data dir>/http-tokens/<name>``, written there (0600) when
    missing (:func:`token_at`)."""
    out: dict[str, Audience] = {}
    for name in sorted(settings.http.tokens):
        path = tokens_dir(settings) / name
        token, made = token_at(path)
        if made:
            log.info("http: bound token %r written to %s", name, path)
        out[token] = bound_audience(settings, name)
    return out


# -- what a bound caller may be told --------------------------------------------------

def visible(who: Caller, kind: str, sensitive: bool, person: str | None,
            role: str | None = None) -> bool:
    """Whether ``who`` may be told a memory (its kind, mark, owner and, for a
    turn, its role)."""
    if isinstance(who, Admin):
        return True
    if not privacy.recallable(kind, {"role": role, "sensitive": sensitive}):
        return False
    return privacy.may_use(who, sensitive, person)


def view_visible(who: Caller, view: MemoryView) -> bool:
    return visible(who, view.kind, view.sensitive, view.person, view.details.get("role"))


def browse_for(backend: Backend, msg: BrowseMemories, who: Caller) -> MemoryPage:
    """The page ``msg`` asks for, of the memories ``who`` may be told, and their
    total: every match is read (a chunk at a time) so that the pages and the
    total leave out exactly what is withheld."""
    if isinstance(who, Admin):
        return backend.browse(msg)
    first, end = msg.offset, msg.offset + msg.limit
    items: list[MemoryView] = []
    total = read = 0
    while True:
        page = backend.browse(msg.model_copy(update={"offset": read, "limit": BROWSE_CHUNK}))
        for view in page.items:
            if view_visible(who, view):
                if first <= total < end:
                    items.append(view)
                total += 1
        read += len(page.items)
        if not page.items or read >= page.total:
            return MemoryPage(items=items, total=total)


def recall_for(backend: Backend, msg: Recall, who: Caller) -> Recalled:
    """Recall for ``who``: more asked of the runtime, what it may not be told left out."""
    if isinstance(who, Admin):
        return backend.recall(msg)
    wanted = msg.max_items
    asked = msg if wanted is None else msg.model_copy(
        update={"max_items": min(200, 2 * wanted)})
    found = backend.recall(asked)
    kept = [i for i in found.items if visible(who, i.kind, i.sensitive, i.person)]
    withheld = len(found.items) - len(kept)
    if withheld:
        log.info("http: %d recalled memories withheld from a bound caller", withheld)
    return found.model_copy(update={"items": kept if wanted is None else kept[:wanted]})


class AudienceBackend:
    """The backend as the current request's caller may use it (see the module
    docstring); the administrator's calls go through unchanged."""

    def __init__(self, inner: Backend, settings: Settings) -> None:
        self.inner = inner
        self.settings = settings

    # -- turns: spoken by the caller's person ----------------------------------
    def _turn(self, msg: UserTurn) -> UserTurn:
        who = caller()
        if isinstance(who, Admin):
            return msg
        channel = self.settings.channels.get(msg.channel)
        if who.spoken and channel is not None and not channel.spoken:
            raise Refused("this token speaks on a spoken channel: a typed channel is "
                          "not its to use")
        named = privacy.person_key(msg.speaker)
        if named is None:
            return msg.model_copy(update={"speaker": self._name(who.speaker)}) \
                if who.speaker else msg
        if named != who.speaker and named in privacy.known_people(self.settings):
            raise Refused("this token may not speak as another of the household's people")
        return msg

    def _name(self, key: str) -> str:
        """A person's name as the settings spell it (``key``: compared form)."""
        names = [*self.settings.household.people, *self.settings.mqtt.people.values()]
        return next((privacy.clean_person(n) or key for n in names
                     if privacy.person_key(n) == key), key)

    def turn(self, msg: UserTurn) -> TurnReply:
        return self.inner.turn(self._turn(msg))

    def turn_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]:
        return self.inner.turn_stream(self._turn(msg))

    # -- reading --------------------------------------------------------------------
    def recall(self, msg: Recall) -> Recalled:
        return recall_for(self.inner, msg, caller())

    def browse(self, msg: BrowseMemories) -> MemoryPage:
        return browse_for(self.inner, msg, caller())

    def get(self, ref: str) -> MemoryView:
        view = self.inner.get(ref)
        if not view_visible(caller(), view):
            raise NoSuchItem(f"no {view.kind} {view.item_id}")  # as if it were not there
        return view

    # -- writing ----------------------------------------------------------------------
    def _may_touch(self, ref: str) -> None:
        if not isinstance(caller(), Admin):
            self.get(str(parse_ref(ref)))

    def remember(self, text: str, level: str = "normal", sensitive: bool = False,
                 person: str | None = None) -> tuple[str, str]:
        return self.inner.remember(text, level, sensitive, person)

    def change(self, ref: str, change: str) -> str:
        self._may_touch(ref)
        return self.inner.change(ref, change)

    def edit(self, ref: str, text: str) -> str:
        self._may_touch(ref)
        return self.inner.edit(ref, text)

    def status(self) -> Status:
        return self.inner.status()
