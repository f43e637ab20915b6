"""Waiting for a condition in tests, with a deadline only for a broken run."""

from __future__ import annotations

import threading
from collections.abc import Callable


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds; False if ``timeout`` seconds pass first.
    Not a timing threshold: the timeout only stops a run that is broken."""
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not done.is_set():
            if predicate():
                return True
            done.wait(0.05)
        return predicate()
    finally:
        deadline.cancel()
