"""Waiting for a condition in tests, with a deadline only for a broken run."""

from __future__ import annotations

import threading
from collections.abc import Callable

FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 0.5


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds; False if ``timeout`` seconds pass first.
    Not a timing threshold: the timeout only stops a run that is broken.

    The pause between polls starts at 50 ms and grows by half each time, up to
    0.5 s: a condition that holds at once is seen at once, and one that takes
    seconds (an index catching up, a replica syncing) is not asked about twenty
    times a second, each time a recall through the actors or an HTTP call that
    takes the CPU from the runtime being waited for."""
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    pause = FIRST_PAUSE_S
    try:
        while not done.is_set():
            if predicate():
                return True
            done.wait(pause)
            pause = min(pause * 1.5, LONGEST_PAUSE_S)
        return predicate()
    finally:
        deadline.cancel()
