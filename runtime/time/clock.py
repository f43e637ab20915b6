"""Clocks: the one seam through which memory logic reads the time.

Memory logic reads seconds since the epoch from a :class:`Clock`. What a
person reads (the prompt's date and time, the dates on recalled memories) is
that instant in the household's time zone: :func:`household_zone` turns the
configured name (``household.timezone``; empty: the system's zone) into a
``tzinfo``, and :func:`local_datetime` reads a clock in it.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

log = logging.getLogger(__name__)

DAY = 86400.0
LOCALTIME = Path("/etc/localtime")
_EPOCH = datetime(1970, 1, 1)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (tests, imports of old history)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def set(self, when: float) -> None:
        self._now = float(when)

    def advance(self, seconds: float) -> None:
        self._now += seconds


# -- time zones -------------------------------------------------------------


def household_zone(name: str = "") -> tzinfo:
    """The zone named ``name`` (an IANA name such as ``"Europe/Lisbon"``), or the
    system's zone when ``name`` is empty. Raises ValueError for an unknown name."""
    if not name.strip():
        return system_zone()
    zone = _zoneinfo(name)
    if zone is None:
        raise ValueError(f"unknown time zone {name!r} (expected an IANA name such as "
                         f"'Europe/Lisbon', or empty for the system's zone)")
    return zone


def system_zone() -> tzinfo:
    """The system's local zone: ``$TZ`` if set, else ``/etc/localtime``, as the C
    library reads them. A zone of the system's zoneinfo tree is returned by its
    name; anything else (a POSIX rule such as ``"XYZ-5:30"``, a zone file copied
    out of the tree) is followed through the C library."""
    tz = os.environ.get("TZ")
    if tz is None:
        return _zoneinfo_link(LOCALTIME) or _libc_local()
    key = tz.removeprefix(":")
    if not key:
        return UTC  # POSIX: an empty TZ is UTC
    return _zoneinfo(key) or _zoneinfo_link(Path(key)) or _libc_local()


def local_datetime(clock: Clock, zone: tzinfo) -> datetime:
    """The clock's current instant as an aware datetime in ``zone``."""
    return datetime.fromtimestamp(clock.now(), tz=zone)


def _libc_local() -> tzinfo:
    log.debug("the system time zone has no zoneinfo name; following the C library")
    return _LibcLocal()


def _zoneinfo(key: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _zoneinfo_link(path: Path) -> ZoneInfo | None:
    """The named zone a zone file links to (``.../zoneinfo/Europe/Lisbon``), if any."""
    if not path.is_absolute():
        return None
    try:
        target = str(path.resolve(strict=True))
    except OSError:
        return None
    marker = "/zoneinfo/"
    return _zoneinfo(target.rsplit(marker, 1)[1]) if marker in target else None


class _LibcLocal(tzinfo):
    """The C library's local time, for a system zone zoneinfo cannot name."""

    def _at(self, dt: datetime) -> time.struct_time:
        stamp = time.mktime((dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second,
                             dt.weekday(), 0, -1))
        return time.localtime(stamp)

    def utcoffset(self, dt: datetime | None) -> timedelta:
        when = time.localtime() if dt is None else self._at(dt)
        return timedelta(seconds=when.tm_gmtoff)

    def dst(self, dt: datetime | None) -> timedelta:
        when = time.localtime() if dt is None else self._at(dt)
        if when.tm_isdst <= 0:
            return timedelta(0)
        return timedelta(seconds=when.tm_gmtoff + time.timezone)

    def tzname(self, dt: datetime | None) -> str:
        when = time.localtime() if dt is None else self._at(dt)
        return when.tm_zone

    def fromutc(self, dt: datetime) -> datetime:
        when = time.localtime((dt.replace(tzinfo=None) - _EPOCH).total_seconds())
        return dt + timedelta(seconds=when.tm_gmtoff)

    def __repr__(self) -> str:
        return "_LibcLocal()"
