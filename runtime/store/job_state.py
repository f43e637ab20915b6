"""A job's own bookkeeping: small values it keeps between runs (``job_state``).

How far consolidation got on a channel, which episodes fact extraction has
already read: each job owns its keys. This is job state, not memory, so it
does not go through the memory write log; values are JSON.

A job that runs off the hub, on a snapshot of the store (``actors.job_snapshot``),
keeps its bookkeeping on the hub instead: :func:`route` gives its store a
:class:`RoutedState`, seeded with the hub's rows at the run's start, and every
:func:`set_state` on that store goes to the hub's owner through its ``send``
(a message to the Cron actor); :func:`get_state` reads the seeded rows and the
run's own writes, never the snapshot's copy (which may lag the hub).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.store.database import Store

log = logging.getLogger(__name__)

#: ``send(job, key, value_json, at)``: write one row on the hub, or raise.
Send = Callable[[str, str, str, float], None]


@dataclass
class RoutedState:
    """The job state of a run off the hub: the hub's rows (JSON text by
    ``(job, key)``) and where a write goes."""

    send: Send
    rows: dict[tuple[str, str], str] = field(default_factory=dict)


_ROUTED: weakref.WeakKeyDictionary[Store, RoutedState] = weakref.WeakKeyDictionary()


def route(store: Store, send: Send, rows: Mapping[tuple[str, str], str]) -> RoutedState:
    """From now on, ``store``'s job state is ``rows`` and its writes go to ``send``."""
    routed = _ROUTED[store] = RoutedState(send, dict(rows))
    return routed


def all_rows(store: Store) -> dict[tuple[str, str], str]:
    """Every row of ``store``'s ``job_state``, JSON text by ``(job, key)``."""
    return {(str(job), str(key)): str(value) for job, key, value in
            store.conn.execute("SELECT job, key, value FROM job_state")}


def get_state(store: Store, job: str, key: str, default: Any = None) -> Any:
    """The value ``job`` stored under ``key``, or ``default``."""
    routed = _ROUTED.get(store)
    if routed is not None:
        raw = routed.rows.get((job, key))
    else:
        raw = store.scalar("SELECT value FROM job_state WHERE job = ? AND key = ?", (job, key))
    return default if raw is None else json.loads(raw)


def set_state(store: Store, job: str, key: str, value: Any) -> None:
    """Store ``value`` (JSON-serialisable) under ``key`` for ``job``; commits at
    once, or with the caller's transaction when one is open. On a routed store
    (a run off the hub) it is sent to the hub at once, and kept for this run's
    :func:`get_state`."""
    text = json.dumps(value)
    routed = _ROUTED.get(store)
    if routed is not None:
        routed.send(job, key, text, store.clock.now())
        routed.rows[(job, key)] = text
        return
    write(store, job, key, text, store.clock.now())


def write(store: Store, job: str, key: str, text: str, at: float) -> None:
    """Write one row, ``text`` being the value's JSON (what the hub's owner does)."""
    json.loads(text)  # refuse what is not JSON
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO job_state (job, key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (job, key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            (job, key, text, at))
