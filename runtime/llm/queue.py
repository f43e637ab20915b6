"""LLM work that survives outages: a durable queue of failed segments, and the
language model's health (the notice after two consecutive failures).

:class:`PendingQueue` keeps, in a directory of the data dir, one JSON file per
segment of work a language model could not do (its output was invalid twice,
or no provider answered). A segment holds references (a channel, transcript
row ids), never memory content: what a user forgets meanwhile is not brought
back by a retry. Each file is written atomically and owner-only
(:func:`runtime.store.files.write_private`) and named by a sequence number, so the
queue is read oldest first, across restarts. Beyond the cap the oldest entries
are dropped and handed back to the caller (who can do the work another way);
an entry that cannot be read (not JSON, wrong shape) is deleted, and both
are counted in ``counters.json``. One writer at a time: the job that owns it.

:class:`LLMHealth` is the failure count behind
:attr:`runtime.llm.providers.FallbackChain.notice`, kept in a small owner-only file of
the data dir under a file lock, so that every process (the Turns actor, the
job actors, ``reverie status``) sees one count: the notice survives a restart
and clears on the first success of a real provider, wherever it happens.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.llm.providers import NOTICE_AFTER_FAILURES, format_notice
from runtime.store.files import create_private, private_dir, write_private
from runtime.time.clock import Clock, SystemClock

log = logging.getLogger(__name__)

QUEUE_DIR = "llm_queue"
HEALTH_FILE = "llm_health.json"
DEFAULT_CAP = 200
_ENTRY_NAME = re.compile(r"^(\d{12})\.json$")
_COUNTERS = "counters.json"


class PendingEntry(BaseModel):
    """One segment of LLM work to retry. ``key`` identifies the segment (a push
    with a key already queued is a no-op); ``payload`` holds references only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, max_length=300)
    kind: str = Field(min_length=1, max_length=50)
    payload: dict[str, Any]
    attempts: int = Field(default=0, ge=0)
    enqueued_at: float
    last_error: str | None = Field(default=None, max_length=200)  # a kind, never content


@dataclass(frozen=True)
class Pending:
    seq: int
    entry: PendingEntry


class PendingQueue:
    """Failed segments on disk, oldest first (see the module docstring)."""

    def __init__(self, directory: Path, cap: int = DEFAULT_CAP) -> None:
        if cap < 1:
            raise ValueError("queue cap must be at least 1")
        self.dir = private_dir(Path(directory))
        self.cap = cap
        for stale in self.dir.glob(".*.tmp"):  # a write cut short by a crash
            stale.unlink(missing_ok=True)

    @classmethod
    def in_data_dir(cls, data_dir: Path, cap: int = DEFAULT_CAP) -> PendingQueue:
        return cls(Path(data_dir) / QUEUE_DIR, cap)

    # -- counters -----------------------------------------------------------

    @property
    def counters(self) -> dict[str, int]:
        """``dropped_cap`` and ``dropped_corrupt``: entries lost, all time."""
        base = {"dropped_cap": 0, "dropped_corrupt": 0}
        try:
            data = json.loads((self.dir / _COUNTERS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return base
        if isinstance(data, dict):
            for name in base:
                value = data.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    base[name] = value
        return base

    def _count(self, name: str, n: int = 1) -> None:
        counters = self.counters
        counters[name] += n
        write_private(self.dir / _COUNTERS, json.dumps(counters))

    # -- entries ------------------------------------------------------------

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.dir.iterdir():
            m = _ENTRY_NAME.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
        return sorted(found)

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}.json"

    def entries(self) -> list[Pending]:
        """Every readable entry, oldest first; unreadable ones are deleted and counted."""
        out: list[Pending] = []
        corrupt = 0
        for seq, path in self._files():
            try:
                entry = PendingEntry.model_validate_json(path.read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, ValueError, ValidationError):
                log.warning("llm queue: dropping unreadable entry %s", path.name)
                path.unlink(missing_ok=True)
                corrupt += 1
                continue
            out.append(Pending(seq, entry))
        if corrupt:
            self._count("dropped_corrupt", corrupt)
        return out

    def __len__(self) -> int:
        return len(self._files())

    def keys(self) -> set[str]:
        return {p.entry.key for p in self.entries()}

    def push(self, entry: PendingEntry) -> list[PendingEntry]:
        """Queue ``entry`` (unless its key is queued already); return the oldest
        entries dropped to keep the queue within its cap."""
        current = self.entries()
        if any(p.entry.key == entry.key for p in current):
            return []
        seq = max((s for s, _ in self._files()), default=0) + 1
        write_private(self._path(seq), entry.model_dump_json())
        current.append(Pending(seq, entry))
        dropped: list[PendingEntry] = []
        while len(current) > self.cap:
            oldest = current.pop(0)
            self._path(oldest.seq).unlink(missing_ok=True)
            dropped.append(oldest.entry)
        if dropped:
            log.warning("llm queue: cap %d reached, dropped the %d oldest entries",
                        self.cap, len(dropped))
            self._count("dropped_cap", len(dropped))
        return dropped

    def update(self, item: Pending, entry: PendingEntry) -> Pending:
        """Rewrite an entry in place (same position in the queue)."""
        write_private(self._path(item.seq), entry.model_dump_json())
        return Pending(item.seq, entry)

    def remove(self, item: Pending) -> None:
        self._path(item.seq).unlink(missing_ok=True)


# --------------------------------------------------------------------------- health


@dataclass(frozen=True)
class HealthState:
    failures: int = 0               # consecutive calls no real provider answered
    causes: tuple[str, ...] = ()    # "provider kind [status]" of the last failure
    answered_offline: bool = False  # the offline provider answered the last failure
    since: float | None = None      # when the first of these failures happened

    @property
    def notice(self) -> str | None:
        if self.failures < NOTICE_AFTER_FAILURES:
            return None
        return format_notice(self.failures, list(self.causes), self.answered_offline)


class LLMHealth:
    """The durable consecutive-failure count of the language model (implements
    :class:`runtime.llm.providers.ChainHealth`)."""

    def __init__(self, data_dir: Path, clock: Clock | None = None) -> None:
        self.dir = private_dir(Path(data_dir))
        self.path = self.dir / HEALTH_FILE
        self._lock_path = self.dir / f".{HEALTH_FILE}.lock"
        self.clock: Clock = clock or SystemClock()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        create_private(self._lock_path)
        fd = os.open(self._lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def state(self) -> HealthState:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return HealthState()
        except (OSError, ValueError):
            log.warning("llm health: %s is unreadable; starting from no failures",
                        self.path.name)
            return HealthState()
        try:
            failures = int(data["failures"])
            causes = tuple(str(c) for c in data.get("causes", []))
            since = data.get("since")
            return HealthState(max(0, failures), causes, bool(data.get("answered_offline")),
                               float(since) if since is not None else None)
        except (TypeError, ValueError, KeyError):
            return HealthState()

    def _write(self, state: HealthState) -> None:
        write_private(self.path, json.dumps({
            "failures": state.failures, "causes": list(state.causes),
            "answered_offline": state.answered_offline, "since": state.since}))

    def record_failure(self, causes: list[str], answered_offline: bool) -> int:
        """Count one more failed call; return the consecutive count."""
        with self._locked():
            old = self.state()
            new = HealthState(old.failures + 1, tuple(causes), answered_offline,
                              old.since if old.since is not None else self.clock.now())
            self._write(new)
        return new.failures

    def record_success(self) -> bool:
        """A real provider answered: clear the count. True if there was one."""
        if self.state().failures == 0:  # the common case: no lock, no write
            return False
        with self._locked():
            if self.state().failures == 0:
                return False
            self._write(HealthState())
        return True

    def notice(self) -> str | None:
        return self.state().notice


def read_notice(data_dir: Path) -> str | None:
    """The language-model notice for ``reverie status`` (None when healthy)."""
    path = Path(data_dir) / HEALTH_FILE
    if not path.exists():
        return None
    return LLMHealth(data_dir).notice()
