"""A job's own bookkeeping: small values it keeps between runs (``job_state``).

How far consolidation got on a channel, which episodes fact extraction has
already read: each job owns its keys. This is job state, not memory, so it
does not go through the memory write log; values are JSON.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from runtime.store.database import Store

log = logging.getLogger(__name__)


def get_state(store: Store, job: str, key: str, default: Any = None) -> Any:
    """The value ``job`` stored under ``key``, or ``default``."""
    raw = store.scalar("SELECT value FROM job_state WHERE job = ? AND key = ?", (job, key))
    return default if raw is None else json.loads(raw)


def set_state(store: Store, job: str, key: str, value: Any) -> None:
    """Store ``value`` (JSON-serialisable) under ``key`` for ``job``; commits at
    once, or with the caller's transaction when one is open."""
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO job_state (job, key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (job, key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            (job, key, json.dumps(value), store.clock.now()))
