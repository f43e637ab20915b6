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
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from actors.common import BadRequest, HouseholdElsewhere, HouseholdMoving
from actors.household_routing import node_settings, publish, route
from runtime.config import HUB_HOUSEHOLD, Settings
from runtime.store.household_routes import HUB_NODE, save_route
from runtime.store.households import Households, check_id, store_marks
from runtime.time.clock import Clock, SystemClock

if TYPE_CHECKING:
    from device.household_replicator import HouseholdReplicator

log = logging.getLogger(__name__)

# Methods every open household answers (the router returns the hub's answer).
BROADCAST = ("save", "flush")
# How long a move waits for the requests and job runs under way in a household.
MOVE_DRAIN_S = 120.0
# A move holds a household in its owners for this long unless the mover renews
# it (every third of it): a mover that dies (kill -9, a lost connection) leaves
# the household refused for at most this long, then served where its route says.
MOVE_LEASE_S = 30.0
# The sweep's owner (Cron) fires each household's reminders when due; these
# change when one is due, so the due time is read again after them.
REMINDER_CHANGES = ("remind", "cancel_reminder")
# How long the sweep thread waits before it fires an overdue reminder again
# (its firing failed, or a scheduled prompt is being answered), and at most.
REMINDER_RETRY_S = 30.0
MAX_WAKE_S = 3600.0


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
                 what: str, hub_only: bool = False, node: str = HUB_NODE) -> None:
        self.registry = Households(settings)
        self.open_one = open_one
        self.what = what
        self.node = node
        self.hub_only = hub_only or not self.registry.enabled
        self.max_open = settings.households.max_open if not self.hub_only else 1
        self._open: OrderedDict[str, Any] = OrderedDict()
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a lease ended
        # refused until the move ends (HouseholdMoving) or its lease runs out
        self._moving: dict[str, float] = {}  # household -> lease end (monotonic)
        self.opened = 0  # instances opened so far (the LRU test, status)
        self.closed = 0
        # which node serves a household, asked when one is opened (households on)
        self.route: Callable[[str], str] | None = None
        # told when a household is opened / closed here (the replication host)
        self.on_open: Callable[[str, Settings], None] | None = None
        self.on_close: Callable[[str], None] | None = None

    def _instance(self, household: str) -> Any:
        """Under the lock: the open instance, opened (and others closed) if need be."""
        if self._held(household):
            raise HouseholdMoving(f"household {household!r} is being moved; try again")
        if household == HUB_HOUSEHOLD and self.node != HUB_NODE:
            raise HouseholdElsewhere("the hub's own household is served by the hub")
        found = self._open.get(household)
        if found is not None:
            self._open.move_to_end(household)
            return found
        if household != HUB_HOUSEHOLD and self.route is not None and not self.hub_only:
            serving = self.route(household)
            if serving != self.node:
                raise HouseholdElsewhere(f"household {household!r} is served by node "
                                         f"{serving!r}, not {self.node!r}")
        if household != HUB_HOUSEHOLD and (self.hub_only or not self.registry.known(household)):
            raise BadRequest(f"household {household!r} is not served by the {self.what} actor")
        own = self.registry.settings_for(household)
        found = self.open_one(own)
        self.opened += 1
        self._open[household] = found
        if self.on_open is not None and household != HUB_HOUSEHOLD:
            self.on_open(household, own)
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
            if self.on_close is not None:
                self.on_close(household)

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
                self._idle.notify_all()

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
        self._closed(household, found)
        return True

    def _held(self, household: str) -> bool:
        """Under the lock: whether a move holds ``household``. A lease that ran
        out (the mover stopped renewing it: killed, or lost) is dropped here,
        and the household is served again if its route still says this node."""
        until = self._moving.get(household)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._moving[household]
        log.warning("%s: the move of household %s stopped renewing its lease; serving "
                    "it again where its route says", self.what, household)
        return False

    def begin_move(self, household: str, wait_s: float, lease_s: float) -> bool:
        """Refuse ``household`` from now on (:class:`HouseholdMoving`) for
        ``lease_s`` (renewed by :meth:`renew_move` while the move goes on), wait
        (at most ``wait_s``) for the requests and job runs under way in it to
        end, then close it. Whether it was open; TimeoutError (and no longer
        refused) when it stayed busy."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._moving[household] = time.monotonic() + max(lease_s, wait_s)
            while True:
                found = self._open.get(household)
                if not self._busy.get(household) and (found is None or not _is_busy(found)):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    self._moving.pop(household, None)
                    raise TimeoutError(f"household {household!r} stayed busy in the "
                                       f"{self.what} actor for {wait_s:.0f} s")
                self._idle.wait(min(left, 0.5))  # a job run ends without a lease
            self._moving[household] = time.monotonic() + lease_s
            if found is None:
                return False
            del self._open[household]
            self.closed += 1
        self._closed(household, found)
        return True

    def renew_move(self, household: str, lease_s: float) -> bool:
        """The move of ``household`` goes on: refused for ``lease_s`` more.
        False when no move holds it any longer (its lease ran out, or it
        ended): the mover must then give up, as the household may have been
        served again here since."""
        with self._lock:
            if not self._held(household):
                return False
            self._moving[household] = time.monotonic() + lease_s
            return True

    def _closed(self, household: str, found: Any) -> None:
        """After ``found`` (``household``'s instance) left the open set: closed, and
        the closing told (``on_close``: its replication released)."""
        close = getattr(found, "close", None)
        if close is not None:
            close()
        if self.on_close is not None:
            self.on_close(household)

    def end_move(self, household: str) -> None:
        """Serve ``household`` again (if it is still served here: the route says)."""
        with self._lock:
            self._moving.pop(household, None)

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
    _replication: HouseholdReplicator | None
    _replicating: ThreadPoolExecutor
    _sweeping: threading.Event
    _due: dict[str, float]
    _due_lock: threading.Lock
    _due_changed: threading.Event
    _clock: Clock

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

    def begin_move(self, msg: object = None, lease_s: float = MOVE_LEASE_S) -> bool:
        """A move of the household ``msg`` names begins: refused here from now
        on (retryable) for ``lease_s`` unless renewed (:meth:`renew_move`),
        closed once what is under way in it ended. Whether it was open here."""
        household = household_of(msg)
        if household == HUB_HOUSEHOLD:
            raise BadRequest("the hub's own household does not move")
        return self.served.begin_move(household, MOVE_DRAIN_S, lease_s)

    def renew_move(self, msg: object = None, lease_s: float = MOVE_LEASE_S) -> bool:
        """The mover is alive: the household ``msg`` names stays refused for
        ``lease_s`` more. False when its lease had already run out."""
        return self.served.renew_move(household_of(msg), lease_s)

    def end_move(self, msg: object = None) -> None:
        """The move ended (done or given up): requests are no longer refused as
        moving (a household that left is then refused as served elsewhere)."""
        self.served.end_move(household_of(msg))

    def where(self, msg: object = None) -> dict[str, Any]:
        """This owner's node: its name, its Ray node id, its households' root."""
        import ray

        return {"node": self.served.node, "node_id": ray.get_runtime_context().get_node_id(),
                "root": str(self.served.registry.root)}

    def final_sync(self, msg: object = None) -> dict[str, Any]:
        """Every write of the household ``msg`` names into its replica now (the
        replication host, the Transcript owner; the household closed in every
        owner here first: :meth:`begin_move`). Its ``txid`` then, what its
        store holds (``write_log_id``, ``turns``), and the files of its language
        model's retry queue (``llm_queue``: references, never memory content),
        which travel with it."""
        from actors.job_snapshot import read_queue
        from runtime.llm.queue import QUEUE_DIR

        household = household_of(msg)
        replication = self._replication
        if replication is None:
            raise BadRequest("no replica configured (replica.url): a household moves "
                             "through its replica")
        if household == HUB_HOUSEHOLD or household in self.served.open_ids():
            raise BadRequest(f"household {household!r} is open here; begin the move first")
        own = self.served.registry.settings_for_new(household)
        if not own.store.path.is_file():
            raise BadRequest(f"household {household!r} has no store on this node")
        txid = self._replicating.submit(replication.final_sync, own.store.path,
                                        own.replica.url).result(timeout=300)
        queue = read_queue(own.store.resolved_dir / QUEUE_DIR)
        return {"txid": txid, **store_marks(own.store.path),
                "llm_queue": [f.model_dump() for f in queue]}

    def set_route(self, msg: object = None, node: str = HUB_NODE) -> dict[str, str]:
        """The household ``msg`` names is served by ``node`` from now on: the
        durable table (``<hub root>/routes.json``), then the running runtime's
        copy, in one call of the hub's owner (a mover that dies never leaves
        the two apart). The table after it."""
        household = household_of(msg)
        if self.served.node != HUB_NODE or self.served.hub_only:
            raise BadRequest("routes are kept by the hub's owners")
        if household == HUB_HOUSEHOLD:
            raise BadRequest("the hub's own household is not routed")
        routes = save_route(self.served.registry.root, household, node)
        publish(self._namespace, household, node)
        return routes

    def retire(self, msg: object = None) -> list[str]:
        """After the household ``msg`` names moved away (its route no longer
        says this node): marked moved here, its store removed. The names removed."""
        household = household_of(msg)
        now = self.served.route(household) if self.served.route is not None else HUB_NODE
        if now == self.served.node:
            raise BadRequest(f"household {household!r} is still routed to this node")
        if household in self.served.open_ids():
            raise BadRequest(f"household {household!r} is open here")
        return self.served.registry.retire(household, now)

    def stop_replication(self, msg: object = None) -> None:
        """Stop the households' Litestream here (it uploads what it has read)."""
        if self._replication is not None:
            self._replicating.shutdown(wait=True)
            self._replication.stop()
            self._replication = None

    def households(self, msg: object = None) -> dict[str, Any]:
        """Which households are open here, and how many were opened and closed."""
        return {"open": self.served.open_ids(), "opened": self.served.opened,
                "closed": self.served.closed, "max_open": self.served.max_open}

    def __getattr__(self, name: str) -> Any:
        # in process (tests), the hub's instance's attributes read through
        if name in ("served", "_sweeping", "_replication", "_replicating", "_namespace",
                    "_due", "_due_lock", "_due_changed", "_clock") or name.startswith("__"):
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
                    self._note_due(household, one)
                ticked.append(household)
            except Exception as exc:  # one household's failure never stops the others
                log.warning("cron sweep: household %s: %s", household, type(exc).__name__)
        return ticked

    # -- reminders on time in the households the sweep ticks --------------------------

    def _note_due(self, household: str, one: Any) -> None:
        """Keep when ``household``'s next reminder is due (``one``: its open instance)."""
        if household == HUB_HOUSEHOLD:  # the hub's own ticks itself, reminders too
            return
        read = getattr(one, "next_reminder", None)
        due = read() if read is not None else None
        with self._due_lock:
            if due is None:
                self._due.pop(household, None)
            else:
                self._due[household] = due
        self._due_changed.set()

    def note_reminders(self, msg: object = None) -> float | None:
        """Read again when the household ``msg`` names has its next reminder due
        (a household that moved here: the mover asks). That time, if any."""
        household = household_of(msg)
        with self.served.lease(household) as one:
            self._note_due(household, one)
        with self._due_lock:
            return self._due.get(household)

    def _scan_due(self) -> None:
        for household in self.served.registry.ids():
            if household == HUB_HOUSEHOLD or self._sweeping.is_set():
                continue
            try:
                self.note_reminders({"household": household})
            except Exception as exc:  # served elsewhere, or not readable: the sweep says
                log.warning("cron: reminders of household %s: %s", household,
                            type(exc).__name__)

    def fire_due_reminders(self) -> list[str]:
        """Fire the reminders now due in the households the sweep ticks; those
        households."""
        now = self._clock.now()
        with self._due_lock:
            ready = [h for h, due in self._due.items() if due <= now]
        for household in ready:
            try:
                with self.served.lease(household) as one:
                    one.fire_due()
                    self._note_due(household, one)
            except (HouseholdElsewhere, BadRequest):  # moved away, stopped: not ours
                with self._due_lock:
                    self._due.pop(household, None)
                continue
            except Exception as exc:
                log.warning("cron: reminders of household %s: %s", household,
                            type(exc).__name__)
            with self._due_lock:
                if self._due.get(household, now + 1) <= now:  # not fired: failed, or asking
                    self._due[household] = now + REMINDER_RETRY_S
        return ready

    def _sweep_loop(self, every: float) -> None:
        """The sweep every ``every`` s (the first after a full interval); in
        between, each household's reminders when they fall due, as the hub's
        own Cron does for the hub (read at start, after each tick of a
        household, and after a reminder is set or cancelled)."""
        self._scan_due()
        next_sweep = time.monotonic() + every
        while not self._sweeping.is_set():
            wait = next_sweep - time.monotonic()
            with self._due_lock:
                soonest = min(self._due.values(), default=None)
            if soonest is not None:
                wait = min(wait, soonest - self._clock.now())
            if self._due_changed.wait(max(0.0, min(wait, MAX_WAKE_S))):
                self._due_changed.clear()  # a due time changed, or stop: look again
                continue
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + every
                    self.sweep()
                else:
                    self.fire_due_reminders()
            except Exception:  # the loop never ends on one failure
                log.exception("cron: the household sweep failed")

    def stop(self, msg: object = None) -> None:
        """End the sweep and every open household's own threads."""
        self._sweeping.set()
        self._due_changed.set()
        self.stop_replication()
        for one in self.served.all_open():
            stop = getattr(one, "stop", None)
            if stop is not None:
                stop()


def _start_replication(self: HouseholdRouter, settings: Settings) -> None:
    """This node's households' Litestream, hooked to the LRU (register on open,
    final sync and release on close), its calls in order on one thread."""
    from device.household_replicator import HouseholdReplicator

    replication = HouseholdReplicator(settings, self.served.registry.root)
    try:
        replication.start()
    except Exception as exc:  # the households are served; moves refuse (no replication)
        log.error("households' litestream did not start: %s", exc)
        return
    self._replication = replication
    self._replicating = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replicate")
    registry = self.served.registry

    def opened(household: str, own: Settings) -> None:
        self._replicating.submit(_quietly, "register", replication.register,
                                 own.store.path, own.replica.url)

    def closed(household: str) -> None:
        path = registry.settings_for_new(household).store.path
        self._replicating.submit(_quietly, "release", replication.release, path)

    self.served.on_open = opened
    self.served.on_close = closed


def _quietly(what: str, fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # Litestream catches up at the next registration
        log.warning("households' litestream: %s failed: %s", what, exc)


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


def _noting_due(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (one that changes a household's reminders), then the
    household's next due time read again for the sweep thread."""
    def noted(self: HouseholdRouter, msg: object = None, *args: Any) -> Any:
        answer = method(self, msg, *args)
        household = household_of(msg)
        if household != HUB_HOUSEHOLD:
            with self.served.lease(household) as one:
                self._note_due(household, one)
        return answer
    noted.__name__ = method.__name__
    noted.__doc__ = method.__doc__
    return noted


def _broadcast(name: str) -> Callable[..., Any]:
    def method(self: HouseholdRouter, msg: object = None, *args: Any) -> Any:
        answers = {household: getattr(one, name)() for household, one in self.served.open_items()}
        # the hub's answer (another's when the hub's instance was closed meanwhile)
        return answers.get(HUB_HOUSEHOLD, next(iter(answers.values()), None))
    method.__name__ = name
    return method


def serving(one: type, name: str, hub_only: bool = False,
            shared: Callable[[Settings], dict[str, Any]] | None = None,
            sweep: bool = False, replicates: bool = False) -> type:
    """The actor class ``name`` serving households, each an instance of ``one``
    built with that household's settings (and the constructor's other
    arguments; ``shared``: keyword arguments made once per actor, such as
    Recall's model, and given to every household's instance). ``sweep``
    (Cron): with households on, a thread ticks every household but the hub's
    every ``jobs.check_every_s`` (:meth:`HouseholdRouter.sweep`).
    ``replicates`` (Transcript): with households and a replica on, this owner
    runs its node's households' Litestream (:mod:`device.household_replicator`)
    and registers each household it opens, releasing each it closes.

    The keyword argument ``node`` (a node's name, ``actors/household_routing.py``)
    makes an owner of that node: it serves the households routed there, from
    that node's root, and not the hub's own."""

    def __init__(self: HouseholdRouter, settings: Settings, *args: Any, **kwargs: Any) -> None:
        node = kwargs.pop("node", HUB_NODE)
        settings = node_settings(settings, node)
        extra: dict[str, Any] = {}
        made = False

        def open_one(own: Settings) -> Any:
            nonlocal made
            if shared is not None and not made:
                extra.update(shared(settings))
                made = True
            return one(own, *args, **kwargs, **extra)

        self.served = Served(settings, open_one, name, hub_only, node)
        self._sweeping = threading.Event()
        self._due = {}  # household: when its next reminder is due (sweep owners)
        self._due_lock = threading.Lock()
        self._due_changed = threading.Event()
        self._clock = kwargs.get("clock") or SystemClock()
        self._replication = None
        self._namespace = settings.runtime.namespace
        if not self.served.hub_only:
            namespace = self._namespace
            self.served.route = lambda household: route(namespace, household)
            if replicates and settings.replica.enabled:
                self._start_replication(settings)
        if node == HUB_NODE:
            self.served.hub()  # the hub's household opens at start, as before
        if sweep and not self.served.hub_only and kwargs.get("background", True):
            threading.Thread(target=self._sweep_loop, args=(settings.jobs.check_every_s,),
                             name="household-sweep", daemon=True).start()

    attrs: dict[str, Any] = {"__init__": __init__, "_start_replication": _start_replication,
                             "__doc__": one.__doc__, "__module__": one.__module__,
                             "__qualname__": name}
    for attr, fn in inspect.getmembers(one, inspect.isfunction):
        if attr.startswith("_") or attr in ("ping", "close", "households", "busy", "sweep",
                                                   "close_household", "begin_move",
                                                   "end_move", "where", "final_sync",
                                                   "retire", "stop_replication",
                                                   "stop"):
            continue
        attrs[attr] = _broadcast(attr) if attr in BROADCAST else _forward(attr, fn)
        if sweep and attr in REMINDER_CHANGES:
            attrs[attr] = _noting_due(attrs[attr])
    return type(name, (HouseholdRouter,), attrs)
