"""What every actor shares: names, options, settings, errors, logging."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from pydantic import BaseModel, ValidationError

from runtime.config import Settings
from runtime.memories.cited import StaleCitation
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Ref, parse_ref
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import Clock, SystemClock

log = logging.getLogger(__name__)

TRANSCRIPT = "transcript"
RECALL = "recall"
EPISODES = "episodes"
GRAPH = "graph"
TURNS = "turns"
SUPERVISOR = "supervisor"
CRON = "cron"
EDGE = "edge"
HTTP = "http"
# Long-lived actors, in start order; Cron (the subconscious' runner) comes last.
ACTORS = (TRANSCRIPT, RECALL, EPISODES, GRAPH, TURNS, CRON)


def actors_for(settings: Settings) -> tuple[str, ...]:
    """The long-lived actors these settings run, in start order: the edge's
    actor (the MQTT bridge, the GPS reader) only when one of them is configured,
    the HTTP server's last, when ``http.enabled``."""
    edge = settings.mqtt.enabled or settings.gps.enabled
    return ACTORS + ((EDGE,) if edge else ()) + ((HTTP,) if settings.http.enabled else ())

# Which actor owns (and alone changes) each kind of memory, by ref prefix.
OWNERS: dict[str, str] = {"turn": TRANSCRIPT, "episode": EPISODES, "fact": GRAPH}

M = TypeVar("M", bound=BaseModel)


class BadRequest(ValueError):
    """The request itself is wrong (empty text, unknown channel, too large...).

    Raised inside an actor it reaches the caller as the cause of a
    ``ray.exceptions.RayTaskError``; :func:`unwrap` gets it back."""


class CitesForgotten(BadRequest, StaleCitation):
    """A derived memory refused because it cites a memory forgotten since the job
    read it (:mod:`runtime.memories.cited`): a ``BadRequest`` naming the refs,
    and a ``StaleCitation``, so a job skips the item the same way in the actor
    runtime as in-process."""


class HouseholdMoving(RuntimeError):
    """The household is being moved to another node (``reverie household move``):
    the request was refused before it was carried out, so sending it again is
    safe; the clients (``actors/handles.py``) do, until the move ends. Not a
    ValueError: over HTTP it is a 503 with ``Retry-After``, not a 400."""


class HouseholdElsewhere(RuntimeError):
    """The household is served from another node now (it moved): refused
    before it was carried out; a client looks its route up again and resends."""


def bad_request(exc: ValidationError | ValueError) -> BadRequest:
    if isinstance(exc, StaleCitation):
        return CitesForgotten(exc.what, exc.refs)
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "request"
            parts.append(f"{field}: {err['msg']}")
        return BadRequest("; ".join(parts))
    return BadRequest(str(exc))


def accept(cls: type[M], msg: object) -> M:
    """``msg`` as a valid ``cls``, checked again on arrival, or :class:`BadRequest`.

    A sender can skip pydantic (``model_construct``, a plain dict, another
    language): an actor never trusts that a message was validated where it was
    built."""
    data = msg.model_dump() if isinstance(msg, BaseModel) else msg
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None


def own_ref(ref: str, kind: str) -> Ref:
    """``ref`` parsed, when it names a ``kind`` (``turn:12``), else BadRequest."""

    try:
        parsed = parse_ref(ref)
    except ValueError as exc:
        raise bad_request(exc) from None
    if parsed.kind != kind:
        owner = OWNERS.get(parsed.kind, "?")
        raise BadRequest(f"{ref} is not a {kind}; send it to the {owner} actor")
    return parsed


def unwrap(exc: BaseException) -> BaseException:
    """The original exception behind a Ray task error, if there is one."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def setup_logging(settings: Settings, actor: str) -> None:
    logging.basicConfig(level=settings.log_level,
                        format=f"%(asctime)s %(levelname)s [{actor}] %(name)s: %(message)s")


def open_store(settings: Settings, clock: Clock | None = None) -> Store:
    kinds = FactKinds.load(settings.memory.fact_kinds_file)
    return Store(settings.store.path, kinds, settings.store.busy_timeout_ms,
                 clock or SystemClock(), settings.store.synchronous,
                 replicated=settings.replica.enabled)


def load_profiles(settings: Settings) -> MemoryProfiles:
    return MemoryProfiles.load(settings.memory.profiles_file)


def actor(name: str, namespace: str) -> Any:
    """A handle to a running named actor (for scripts and the CLI; actors hold
    typed clients from :mod:`actors.handles`)."""
    return ray.get_actor(name, namespace=namespace)


class Notifier:
    """Fire-and-forget notifications with at most one in flight.

    A writer tells Recall "there is something new to index" after each commit;
    while one notification is still pending, further ones are coalesced, so a
    burst of writes never piles thousands of calls on the Recall actor.
    ``send`` submits one notification and returns its object ref (for example
    :meth:`actors.handles.RecallClient.sync_some_async`).

    A notification held back while one was in flight goes out as soon as that
    one returns, from the notifier's own thread: the last write of a burst is
    indexed without waiting for a later write (or a :meth:`flush`). Calling the
    notifier never blocks; the thread starts with the first notification and
    sleeps on a condition between them. A notification still unanswered after
    ``wait_s`` (a Recall actor that hangs) counts as returned, so a held-back
    one is sent anyway: at most one call every ``wait_s`` to a stuck actor."""

    def __init__(self, send: Callable[[], Any], what: str, wait_s: float = 60.0) -> None:
        self.send = send
        self.what = what
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._wanted = False  # a notification is due and not sent yet
        self._busy = False  # one is being sent or is in flight
        self._closed = False  # closed: the thread ends (an owner closed a household)
        self._thread: threading.Thread | None = None

    def __call__(self) -> None:
        with self._cond:
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"notify-{self.what}")
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._wanted = False
                self._busy = True
            try:
                self._send_and_wait()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send_and_wait(self) -> None:
        try:
            pending = self.send()
        except Exception as exc:  # logged, never raised: the next sync catches up
            log.warning("cannot send %s: %s", self.what, type(exc).__name__)
            return
        if pending is None:
            return
        try:
            ready, _ = ray.wait([pending], timeout=self.wait_s)
            if not ready:
                log.warning("%s notification unanswered after %.0f s", self.what, self.wait_s)
                return
            ray.get(pending, timeout=0)
        except Exception as exc:  # logged, never raised: the next sync catches up
            log.warning("%s notification failed: %s", self.what, type(exc).__name__)

    def close(self) -> None:
        """End the notifier's thread (what is due is not sent: the next sync
        catches up)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait (at most ``timeout`` seconds) until every notification asked
        for has been sent and answered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._wanted or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)
