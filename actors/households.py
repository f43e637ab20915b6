"""Owner actors that serve a set of households (issue 26, item 3).

An owner actor (Transcript, Recall, Episodes, Graph, Turns, Cron) is a thin
router: :func:`serving` makes its class from the class that serves one
household (``HouseholdTranscript``, ...: what the actor was when there was one
household). Every request names its household (:class:`actors.messages.Request`);
the router checks the id, refuses a household it does not serve
(:class:`actors.common.BadRequest`: never served from another's store), and
hands the request to that household's instance, built on first use from the
household's own settings (:meth:`runtime.store.households.Households.settings_for`:
its own store, token, index). At most ``households.max_open`` instances are
open per actor; past that the least recently used one that is not busy is
closed (its ``close``: the store closed, Recall's index saved first).

With ``households.enabled`` false, the one household is the hub's (``home``),
opened in the constructor as before: nothing else changes, and what the
actor's constructor did (Recall loading its model and index) it still does at
start. Ray's namespaces are no boundary between households: this is.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from actors.common import BadRequest
from runtime.config import HUB_HOUSEHOLD, Settings
from runtime.store.households import Households, check_id

log = logging.getLogger(__name__)

# Methods every open household answers (the router returns the hub's answer).
BROADCAST = ("save", "flush")


def household_of(msg: object) -> str:
    """The household a request is for (``home`` when it names none, or is none:
    the single-household callers); BadRequest when it is not an id."""
    if msg is None:
        return HUB_HOUSEHOLD
    if isinstance(msg, dict):
        found = msg.get("household", HUB_HOUSEHOLD)
    else:
        found = getattr(msg, "household", HUB_HOUSEHOLD)
    try:
        return check_id(found)
    except ValueError as exc:
        raise BadRequest(f"household: {exc}") from None


class Served:
    """The households an owner serves: one instance each, opened on demand,
    at most ``max_open`` open (least recently used closed first, never one
    in use). ``hub_only``: this owner serves the hub's household only."""

    def __init__(self, settings: Settings, open_one: Callable[[Settings], Any],
                 what: str, hub_only: bool = False) -> None:
        self.registry = Households(settings)
        self.open_one = open_one
        self.what = what
        self.hub_only = hub_only or not self.registry.enabled
        self.max_open = settings.households.max_open if not self.hub_only else 1
        self._open: OrderedDict[str, Any] = OrderedDict()
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()
        self.opened = 0  # instances opened so far (the LRU test, status)
        self.closed = 0

    def _instance(self, household: str) -> Any:
        """Under the lock: the open instance, opened (and others closed) if need be."""
        found = self._open.get(household)
        if found is not None:
            self._open.move_to_end(household)
            return found
        if household != HUB_HOUSEHOLD and (self.hub_only or not self.registry.known(household)):
            raise BadRequest(f"household {household!r} is not served by the {self.what} actor")
        found = self.open_one(self.registry.settings_for(household))
        self.opened += 1
        self._open[household] = found
        self._evict()
        return found

    def _evict(self) -> None:
        for household in list(self._open):
            if len(self._open) <= self.max_open:
                return
            if self._busy.get(household) or _is_busy(self._open[household]):
                continue
            gone = self._open.pop(household)
            self.closed += 1
            close = getattr(gone, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # closing is best effort; SQLite is the truth
                    log.warning("%s: closing household %s failed: %s", self.what,
                                household, type(exc).__name__)

    @contextmanager
    def lease(self, household: str) -> Iterator[Any]:
        """The household's instance, kept open while the block runs."""
        with self._lock:
            found = self._instance(household)
            self._busy[household] = self._busy.get(household, 0) + 1
        try:
            yield found
        finally:
            with self._lock:
                self._busy[household] -= 1
                if not self._busy[household]:
                    del self._busy[household]
                self._evict()

    def close(self, household: str) -> bool:
        """Close ``household`` now if it is open (``reverie household stop``);
        BadRequest while a request or a job run is under way in it."""
        with self._lock:
            found = self._open.get(household)
            if found is None:
                return False
            if self._busy.get(household) or _is_busy(found):
                raise BadRequest(f"household {household!r} is busy; try again")
            del self._open[household]
            self.closed += 1
        close = getattr(found, "close", None)
        if close is not None:
            close()
        return True

    def hub(self) -> Any:
        with self._lock:
            return self._instance(HUB_HOUSEHOLD)

    def all_open(self) -> list[Any]:
        with self._lock:
            return list(self._open.values())

    def open_items(self) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self._open.items())

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._open)


def _is_busy(instance: Any) -> bool:
    """Whether an instance has work of its own under way (Cron: a job run)."""
    busy = getattr(instance, "busy", None)
    try:
        return bool(busy()) if busy is not None else False
    except Exception:
        return False


class HouseholdRouter:
    """The base of every owner actor made by :func:`serving`."""

    served: Served

    def ping(self, msg: object = None) -> str:
        return "ok"

    def close_household(self, msg: object = None) -> bool:
        """Close the household ``msg`` names if open here (``reverie household
        stop`` / ``delete``: the registry says it is stopped first, so it is
        not opened again); the hub's own is never closed."""
        household = household_of(msg)
        if household == HUB_HOUSEHOLD:
            raise BadRequest("the hub's own household is not closed")
        return self.served.close(household)

    def households(self, msg: object = None) -> dict[str, Any]:
        """Which households are open here, and how many were opened and closed."""
        return {"open": self.served.open_ids(), "opened": self.served.opened,
                "closed": self.served.closed, "max_open": self.served.max_open}

    def __getattr__(self, name: str) -> Any:
        # in process (tests), the hub's instance's attributes read through
        if name in ("served", "_sweeping") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.served.hub(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "served" or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # in process (tests): the hub's instance's
            setattr(self.served.hub(), name, value)

    def sweep(self, msg: object = None) -> list[str]:
        """Tick every household but the hub's (which ticks itself), one at a
        time, each waiting for its runs to end: jobs per household, each behind
        its own idle gate. Answers the households ticked."""
        from actors.messages import Tick

        ticked = []
        for household in self.served.registry.ids():
            if household == HUB_HOUSEHOLD or self._sweeping.is_set():
                continue
            try:
                with self.served.lease(household) as one:
                    one.tick(Tick(household=household, wait=True))
                ticked.append(household)
            except Exception as exc:  # one household's failure never stops the others
                log.warning("cron sweep: household %s: %s", household, type(exc).__name__)
        return ticked

    def _sweep_loop(self, every: float) -> None:
        while not self._sweeping.wait(every):
            self.sweep()

    def stop(self, msg: object = None) -> None:
        """End the sweep and every open household's own threads."""
        self._sweeping.set()
        for one in self.served.all_open():
            stop = getattr(one, "stop", None)
            if stop is not None:
                stop()


def _takes_message(fn: Callable[..., Any]) -> bool:
    return len(inspect.signature(fn).parameters) > 1  # self, then the message


def _forward(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    takes = _takes_message(fn)
    if inspect.isgeneratorfunction(fn):
        def stream(self: HouseholdRouter, msg: object = None, *args: Any) -> Iterator[Any]:
            with self.served.lease(household_of(msg)) as one:
                call = getattr(one, name)
                yield from (call(msg, *args) if takes else call(*args))
        stream.__name__ = name
        stream.__doc__ = fn.__doc__
        return stream

    def method(self: HouseholdRouter, msg: object = None, *args: Any) -> Any:
        with self.served.lease(household_of(msg)) as one:
            call = getattr(one, name)
            return call(msg, *args) if takes else call(*args)
    method.__name__ = name
    method.__doc__ = fn.__doc__
    return method


def _broadcast(name: str) -> Callable[..., Any]:
    def method(self: HouseholdRouter, msg: object = None, *args: Any) -> Any:
        answers = {household: getattr(one, name)() for household, one in self.served.open_items()}
        # the hub's answer (another's when the hub's instance was closed meanwhile)
        return answers.get(HUB_HOUSEHOLD, next(iter(answers.values()), None))
    method.__name__ = name
    return method


def serving(one: type, name: str, hub_only: bool = False,
            shared: Callable[[Settings], dict[str, Any]] | None = None,
            sweep: bool = False) -> type:
    """The actor class ``name`` serving households, each an instance of ``one``
    built with that household's settings (and the constructor's other
    arguments; ``shared``: keyword arguments made once per actor, such as
    Recall's model, and given to every household's instance). ``sweep``
    (Cron): with households on, a thread ticks every household but the hub's
    every ``jobs.check_every_s`` (:meth:`HouseholdRouter.sweep`)."""

    def __init__(self: HouseholdRouter, settings: Settings, *args: Any, **kwargs: Any) -> None:
        extra: dict[str, Any] = {}
        made = False

        def open_one(own: Settings) -> Any:
            nonlocal made
            if shared is not None and not made:
                extra.update(shared(settings))
                made = True
            return one(own, *args, **kwargs, **extra)

        self.served = Served(settings, open_one, name, hub_only)
        self._sweeping = threading.Event()
        self.served.hub()  # the hub's household opens at start, as before
        if sweep and not self.served.hub_only and kwargs.get("background", True):
            threading.Thread(target=self._sweep_loop, args=(settings.jobs.check_every_s,),
                             name="household-sweep", daemon=True).start()

    attrs: dict[str, Any] = {"__init__": __init__, "__doc__": one.__doc__,
                             "__module__": one.__module__, "__qualname__": name}
    for attr, fn in inspect.getmembers(one, inspect.isfunction):
        if attr.startswith("_") or attr in ("ping", "close", "households", "busy", "sweep",
                                                   "close_household",
                                                   "stop"):
            continue
        attrs[attr] = _broadcast(attr) if attr in BROADCAST else _forward(attr, fn)
    return type(name, (HouseholdRouter,), attrs)
