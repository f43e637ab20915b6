"""Clocks: the one seam through which memory logic reads the time."""

from __future__ import annotations

import time
from typing import Protocol

DAY = 86400.0


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
