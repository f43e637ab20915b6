"""actors.common.Notifier: a notification held back while one is in flight
goes out when that one returns, without a later write or a flush (issue 24,
item 9), and a burst still sends at most one at a time."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import ray

from actors.common import Notifier


@ray.remote(max_concurrency=4)
class Gate:
    """A stand-in for Recall's ``sync_some``: the first call waits at the gate
    until the test opens it; every call is counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.open = threading.Event()
        self.arrived = threading.Event()

    def sync_some(self) -> int:
        self.calls += 1
        self.arrived.set()
        self.open.wait(60)
        return self.calls

    def wait_arrived(self, timeout: float) -> bool:
        return self.arrived.wait(timeout)

    def release(self) -> None:
        self.open.set()

    def count(self) -> int:
        return self.calls


def _wait_for(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_held_back_notification_goes_out_when_the_one_in_flight_returns(
        ray_instance: str) -> None:
    gate = Gate.remote()  # type: ignore[attr-defined]
    notify = Notifier(lambda: gate.sync_some.remote(), "test")
    notify()  # in flight, held at the gate
    assert ray.get(gate.wait_arrived.remote(60))
    for _ in range(50):  # a burst while it is in flight: coalesced into one
        notify()
    assert ray.get(gate.count.remote()) == 1
    ray.get(gate.release.remote())
    # No later write and no flush: the held-back one is sent on its own.
    _wait_for(lambda: ray.get(gate.count.remote()) >= 2, "the held-back notification")
    notify.flush(timeout=60)
    assert ray.get(gate.count.remote()) == 2  # the burst of 50 was one notification
    ray.kill(gate)


def test_a_failed_notification_does_not_stop_the_next(ray_instance: str) -> None:
    sent: list[int] = []

    def send() -> Any:
        sent.append(1)
        if len(sent) == 1:
            raise RuntimeError("recall is not up")
        return None

    notify = Notifier(send, "test")
    notify()
    notify.flush(timeout=60)
    notify()
    notify.flush(timeout=60)
    assert len(sent) == 2
