"""One read connection for the parts of a prompt read from the store.

The Turns actor reads the user profile, the trajectory (digests), the mood and
a pull channel's memory index on every turn. They share one connection,
opened on first use and guarded by a lock (the actor answers turns of
several channels at once). A part that cannot be read is left out with a
warning naming it (never its content): a prompt part never costs a turn.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from runtime.store.database import Store

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreReader:
    def __init__(self, open_store: Callable[[], Store]) -> None:
        self._open = open_store
        self._store: Store | None = None
        self._lock = threading.Lock()

    def read(self, what: str, fn: Callable[[Store], T], default: T) -> T:
        """``fn(store)``, or ``default`` when the store cannot be opened or read."""
        with self._lock:
            try:
                if self._store is None:
                    self._store = self._open()
                return fn(self._store)
            except Exception as exc:
                log.warning("%s unavailable: %s", what, type(exc).__name__)
                return default

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
