"""The hub's own position, read from gpsd.

:class:`GpsReader` asks gpsd for its current TPV report (``?POLL;``) and turns
a new fix into a :class:`~device.records.LocationRecord` (``source="gpsd"``,
``device="gpsd"``, ``person`` from ``gps.person``). A fix is new when gpsd's
mode reaches ``gps.min_mode`` and its time differs from the last fix returned;
no-fix reports, reports without a time or a position yet, stale repeats and
fixes with bad coordinates (or a garbled time) give ``None``, the last counted
in :attr:`GpsReader.rejected`. A lost connection is
counted in :attr:`GpsReader.errors` and reopened on a later :meth:`read`,
with back-off. :meth:`GpsReader.run` polls every ``gps.poll_s`` until told to
stop; the Ray actor around it is in ``actors/edge.py``.

The connection is made by the gpsd-py3 package (``gpsd.connect``), which keeps
it in module globals: one connection, so one connected reader, per process. A
second reader's :meth:`GpsReader.connect` raises :class:`RuntimeError` instead
of silently taking the first one's socket. Its ``connect`` has no timeout of
its own; the reader gives the socket one (see :class:`_TimeoutSockets`). Its
``get_current`` is not used: it drops the TPV's ``eph``, fills absent
``lat``/``lon``/``epx``/``epy`` with 0 (a missing position would read as 0°N 0°E
with 0 m error), and raises when no receiver is attached. The reader sends the
same ``?POLL;`` itself and reads the raw report.

Coordinates are the household's location: nothing here logs them.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import gpsd

from device.records import LocationRecord, Reason, Rejected
from runtime.config import GpsSettings

log = logging.getLogger(__name__)

SOURCE = "gpsd"
DEVICE = "gpsd"

#: Lines read while waiting for the answer to ``?POLL;`` before giving up on the
#: connection (gpsd may interleave other reports, e.g. a DEVICE notice).
_MAX_LINES_PER_POLL = 20

# gpsd-py3 holds a single connection in module globals: who has it.
_owner_lock = threading.Lock()
_owner: GpsReader | None = None


class _TimeoutSockets:
    """Stands in for the ``socket`` module inside gpsd-py3 during ``gpsd.connect``.

    gpsd-py3 opens its socket with ``socket.socket(socket.AF_INET,
    socket.SOCK_STREAM)`` and never sets a timeout, so an unreachable host or a
    wedged gpsd would block the reader (and the actor's stop) forever. This
    object is put in place of that module name only for the duration of one
    ``gpsd.connect`` call (under ``_owner_lock``) and gives the socket a timeout,
    which then also bounds every later read on that connection."""

    AF_INET = socket.AF_INET
    SOCK_STREAM = socket.SOCK_STREAM

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def socket(self, family: int, kind: int) -> socket.socket:
        sock = socket.socket(family, kind)
        sock.settimeout(self.timeout_s)
        return sock


class GpsReader:
    """Fixes from one gpsd, one call to :meth:`read` at a time.

    Counters for status: :attr:`fixes` (records returned), :attr:`rejected`
    (fixes refused, by reason in :attr:`rejected_by_reason`), :attr:`errors`
    (failed connects and lost connections). :attr:`last_mode` and
    :attr:`last_time` describe gpsd's latest report whatever its mode (0 and
    ``None`` before the first), to tell "no receiver" from "no fix"."""

    def __init__(self, settings: GpsSettings, *, timeout_s: float = 5.0,
                 backoff_min_s: float = 1.0, backoff_max_s: float = 60.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.connected = False
        self.fixes = 0
        self.errors = 0
        self.rejected = 0
        self.rejected_by_reason: dict[str, int] = {}
        self.last_mode = 0
        self.last_time: float | None = None
        self._lock = threading.Lock()
        self._last_at: float | None = None      # time of the last fix returned
        self._last_refused: tuple[Any, ...] | None = None  # so one bad TPV counts once
        self._backoff_s = backoff_min_s
        self._retry_at = 0.0                    # monotonic time of the next connect attempt
        self._failing = False                   # log only the first of a run of failures

    # -- connection -----------------------------------------------------------

    def connect(self) -> bool:
        """Open the connection to gpsd now (ignoring any back-off); True when open.

        Failing to reach gpsd is counted, not raised. :class:`RuntimeError` if
        another reader in this process holds gpsd-py3's connection."""
        with self._lock:
            self._claim()
            return self._connect()

    def close(self) -> None:
        """Close the connection and give gpsd-py3 back; the reader may connect again."""
        global _owner
        with self._lock:
            with _owner_lock:
                if _owner is self:
                    _close_module_connection()
                    _owner = None
            self.connected = False

    def _claim(self) -> None:
        global _owner
        with _owner_lock:
            if _owner is not None and _owner is not self:
                raise RuntimeError("gpsd-py3 keeps one connection per process and "
                                   "another GpsReader holds it")
            _owner = self

    def _connect(self) -> bool:
        host, port = self.settings.host, self.settings.port
        with _owner_lock:
            _close_module_connection()
            saved = getattr(gpsd, "socket", socket)
            gpsd.socket = _TimeoutSockets(self.timeout_s)
            try:
                gpsd.connect(host=host, port=port)
            except Exception as exc:
                _close_module_connection()
                self._failed("cannot connect to gpsd", exc)
                return False
            finally:
                gpsd.socket = saved
        self.connected = True
        self._backoff_s = self.backoff_min_s
        self._failing = False
        log.info("gps: connected to gpsd at %s:%d", host, port)
        return True

    def _failed(self, what: str, exc: BaseException, *, retry_now: bool = False) -> None:
        """Count a failure, mark the connection down, schedule the next attempt:
        at once after losing an open connection, else after the back-off, which
        doubles with each failed attempt up to ``backoff_max_s``."""
        self.errors += 1
        self.connected = False
        delay = 0.0 if retry_now else self._backoff_s
        self._retry_at = time.monotonic() + delay
        if not retry_now:
            self._backoff_s = min(self._backoff_s * 2, self.backoff_max_s)
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "gps: %s at %s:%d (%s); next try in %.1f s", what,
                self.settings.host, self.settings.port, type(exc).__name__, delay)
        self._failing = True

    # -- reading --------------------------------------------------------------

    def read(self) -> LocationRecord | None:
        """The current fix if it is new and good enough, else None. Never raises."""
        with self._lock:
            if not self.connected:
                if time.monotonic() < self._retry_at:
                    return None
                try:
                    self._claim()
                except RuntimeError as exc:
                    self._failed("gpsd-py3 is in use", exc)
                    return None
                if not self._connect():
                    return None
            try:
                report = _poll()
            except Exception as exc:
                with _owner_lock:
                    _close_module_connection()
                self._failed("lost the connection to gpsd", exc, retry_now=True)
                return None
            try:
                return self._record(report)
            except Exception as exc:  # a report shaped like nothing expected: skip it
                self.errors += 1
                log.error("gps: could not read gpsd's report (%s)", type(exc).__name__)
                return None

    def _record(self, report: dict[str, Any]) -> LocationRecord | None:
        tpv = _best_tpv(report)
        if tpv is None:
            self.last_mode, self.last_time = 0, None
            return None
        mode = _mode(tpv)
        at = _epoch(tpv.get("time"))
        self.last_mode, self.last_time = mode, at
        if mode < self.settings.min_mode or (at is not None and at == self._last_at):
            return None
        lat, lon = tpv.get("lat"), tpv.get("lon")
        if tpv.get("time") is None or lat is None or lon is None:
            # Not a whole fix yet: gpsd 3.22 reports mode 3 from a GGA or GSA
            # that came before any RMC, without a time (no date yet) and at
            # first without a position. Not counted: nothing in it is wrong.
            return None
        key = tuple(tpv.get(name) for name in ("mode", "time", "lat", "lon", "eph", "epx", "epy"))
        try:
            if at is None:
                raise Rejected("bad-timestamp", "the fix's time is not a UTC time")
            record = LocationRecord(person=self.settings.person, lat=lat, lon=lon, at=at,
                                    source=SOURCE, device=DEVICE,
                                    accuracy_m=_horizontal_error(tpv))
        except Rejected as exc:
            if key != self._last_refused:
                self._last_refused = key
                self._refuse(exc.reason)
            return None
        self._last_at = at
        self.fixes += 1
        return record

    def _refuse(self, reason: Reason) -> None:
        self.rejected += 1
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + 1
        log.debug("gps: fix refused (%s)", reason)

    # -- the loop -------------------------------------------------------------

    def run(self, stop: threading.Event, emit: Callable[[LocationRecord], None]) -> None:
        """Read every ``poll_s`` seconds and pass each new fix to ``emit`` until
        ``stop`` is set. An exception from ``emit`` is logged and the loop goes
        on. Connects on its own; does not close (call :meth:`close` after)."""
        while not stop.is_set():
            record = self.read()
            if record is not None:
                try:
                    emit(record)
                except Exception as exc:
                    log.error("gps: passing on a fix failed (%s)", type(exc).__name__)
            stop.wait(self.settings.poll_s)


def _poll() -> dict[str, Any]:
    """Send ``?POLL;`` on gpsd-py3's connection and return gpsd's POLL report."""
    stream = gpsd.gpsd_stream
    if stream is None:
        raise ConnectionError("not connected")
    stream.write("?POLL;\n")
    stream.flush()
    for _ in range(_MAX_LINES_PER_POLL):
        line = stream.readline()
        if not line:
            raise ConnectionError("gpsd closed the connection")
        message = json.loads(line)
        if isinstance(message, dict) and message.get("class") == "POLL":
            return message
        if isinstance(message, dict) and message.get("class") == "ERROR":
            raise ConnectionError("gpsd refused the poll")
    raise ConnectionError("no answer to the poll")


def _close_module_connection() -> None:
    """Close gpsd-py3's module-level socket, if any (callers hold ``_owner_lock``)."""
    for name in ("gpsd_stream", "gpsd_socket"):
        handle = getattr(gpsd, name, None)
        if handle is not None:
            try:
                handle.close()
            except Exception:  # closing a broken stream may try to flush it
                pass
            setattr(gpsd, name, None)


def _best_tpv(report: dict[str, Any]) -> dict[str, Any] | None:
    """The TPV with the best mode among the attached receivers (the last on a tie)."""
    if not report.get("active"):
        return None
    best: dict[str, Any] | None = None
    best_mode = -1
    for tpv in report.get("tpv") or ():
        if isinstance(tpv, dict) and _mode(tpv) >= best_mode:
            best, best_mode = tpv, _mode(tpv)
    return best


def _mode(tpv: dict[str, Any]) -> int:
    mode = tpv.get("mode")
    return mode if isinstance(mode, int) and not isinstance(mode, bool) else 0


def _epoch(value: Any) -> float | None:
    """gpsd's ISO 8601 UTC time ("2024-05-01T10:00:03.000Z") as epoch seconds."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    at = when.timestamp()
    return at if math.isfinite(at) and at > 0 else None


def _horizontal_error(tpv: dict[str, Any]) -> float | None:
    """gpsd's horizontal error estimate in metres: ``eph``, else the larger of
    ``epx``/``epy`` (95 % confidence), else None. A value that is not a number
    comes back as NaN, for :func:`~device.records.check_coordinates` to refuse."""
    eph = tpv.get("eph")
    present = [eph] if eph is not None else [
        value for value in (tpv.get("epx"), tpv.get("epy")) if value is not None]
    if not present:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return math.nan
    return float(max(present))
