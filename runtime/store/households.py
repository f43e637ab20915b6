"""The households one runtime serves (issue 26, many households on one cluster).

A household is an id (:data:`runtime.config.HOUSEHOLD_ID`: lower-case letters,
digits and dashes, 63 at most, starting with a letter or digit). The hub's own
household, ``home`` (:data:`runtime.config.HUB_HOUSEHOLD`), is the configured
store, as it always was. Any other lives in ``<root>/<id>/`` (``root``:
``households.root``, by default ``<data dir>/households``; both 0700), a path
built from the id and nothing else: in it are the household's store, its HTTP
bearer token (``http-token``), its vector index and everything else the runtime
keeps beside a store, because its settings (:meth:`Households.settings_for`) are
the hub's with that directory as their data directory. Its replica is the
hub's replica URL with ``/households/<id>`` appended.

A household other than ``home`` exists when its directory holds the marker
file :data:`MARKER` (written by :meth:`Households.add`); with ``households.enabled``
false, ``home`` is the only household there is, whatever is on disk.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from runtime.config import HOUSEHOLD_ID, HUB_HOUSEHOLD, Settings
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.files import private_dir, write_private

MARKER = "household.json"
STOPPED = "stopped"  # beside the marker: registered, not served (``reverie household stop``)
# beside the marker on a node a household moved away from: where it went; its
# store is gone from here (``reverie household move``)
MOVED = "moved.json"
# What stays in a household's directory when it moves away: who it is and
# the hub's HTTP credentials for it (the HTTP server runs on the hub); every
# other file there is its store or made from it.
IDENTITY = frozenset({MARKER, STOPPED, MOVED, "http-token", "http-tokens", "mcp-oauth.json"})
HOUSEHOLDS_DIR = "households"
_ID = re.compile(HOUSEHOLD_ID)


class UnknownHousehold(ValueError):
    """No such household is served here."""


def check_id(household: object) -> str:
    """``household`` when it is a well-formed household id, else ValueError
    (the id never reaches a path unchecked)."""
    if not isinstance(household, str) or not _ID.fullmatch(household):
        raise ValueError(f"not a household id (lower-case letters, digits and dashes, "
                         f"63 at most): {str(household)[:80]!r}")
    return household


class Households:
    """The households of these settings: which exist, where each lives, and
    the settings each is served with."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.enabled = settings.households.enabled
        configured = settings.households.root
        self.root = (configured.expanduser() if configured is not None
                     else settings.store.resolved_dir / HOUSEHOLDS_DIR)

    def dir_of(self, household: str) -> Path:
        """``<root>/<id>``: from the id alone (checked), never from any other input."""
        check_id(household)
        if household == HUB_HOUSEHOLD:
            return self.settings.store.resolved_dir
        return self.root / household

    def known(self, household: str) -> bool:
        """Whether ``household`` is served here (ValueError: not an id)."""
        check_id(household)
        if household == HUB_HOUSEHOLD:
            return True
        where = self.root / household
        return (self.enabled and (where / MARKER).is_file()
                and not (where / STOPPED).exists() and not (where / MOVED).exists())

    def ids(self) -> list[str]:
        """Every household served here, ``home`` first."""
        others: list[str] = []
        if self.enabled and self.root.is_dir():
            others = sorted(p.name for p in self.root.iterdir()
                            if _ID.fullmatch(p.name) and (p / MARKER).is_file()
                            and not (p / STOPPED).exists() and not (p / MOVED).exists())
        return [HUB_HOUSEHOLD, *(h for h in others if h != HUB_HOUSEHOLD)]

    def replica_url(self, household: str) -> str:
        """The household's own replica (empty when the hub has none)."""
        base = self.settings.replica.url.rstrip("/")
        if not base or household == HUB_HOUSEHOLD:
            return self.settings.replica.url
        return f"{base}/{HOUSEHOLDS_DIR}/{check_id(household)}"

    def settings_for(self, household: str) -> Settings:
        """The settings ``household`` is served with: the hub's, with its own
        data directory, id and replica URL. UnknownHousehold when it is not served."""
        if not self.known(household):
            raise UnknownHousehold(f"no household {household!r} here")
        if household == HUB_HOUSEHOLD:
            return self.settings
        return self.settings_for_new(household)

    def settings_for_new(self, household: str) -> Settings:
        """:meth:`settings_for`, whether or not the household is registered yet."""
        s = self.settings
        return s.model_copy(update={
            "store": s.store.model_copy(update={"data_dir": self.dir_of(household)}),
            "household": s.household.model_copy(update={"id": household}),
            "replica": s.replica.model_copy(update={"url": self.replica_url(household)}),
        })

    def add(self, household: str, now: float | None = None) -> Path:
        """Register ``household``: its directory (0700) and marker (0600). Adding
        one that exists changes nothing but to serve it again when it was
        stopped; ``home`` is the hub's and is not added."""
        check_id(household)
        if household == HUB_HOUSEHOLD:
            raise ValueError(f"{HUB_HOUSEHOLD!r} is the hub's own household")
        if not self.enabled:
            raise ValueError("households.enabled is false: this runtime serves one household")
        private_dir(self.root)
        where = private_dir(self.dir_of(household))
        marker = where / MARKER
        if not marker.is_file():
            # the store made and migrated once, here, before any owner opens it
            # (as the Supervisor does for the hub's): owners opening a new
            # store side by side would each run the migrations
            own = self.settings_for_new(household)
            Store(own.store.path, FactKinds.load(own.memory.fact_kinds_file),
                  own.store.busy_timeout_ms, synchronous=own.store.synchronous).close()
            write_private(marker, json.dumps({"id": household,
                                              "created_at": time.time() if now is None
                                              else now}) + "\n")
        (where / STOPPED).unlink(missing_ok=True)
        return where

    def served_somewhere(self, household: str) -> bool:
        """Registered here and not stopped, whichever node serves it now (the
        hub's HTTP server serves a household that moved to another node)."""
        check_id(household)
        where = self.root / household
        return (household == HUB_HOUSEHOLD
                or (self.enabled and (where / MARKER).is_file()
                    and not (where / STOPPED).exists()))

    def moved_to(self, household: str) -> str | None:
        """The node ``household`` moved to from here, if it did."""
        try:
            return str(json.loads((self.dir_of(household) / MOVED).read_text())["to"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def retire(self, household: str, to: str, now: float | None = None) -> list[str]:
        """After ``household`` moved to node ``to``: :data:`MOVED` written, then
        every file of its directory but :data:`IDENTITY` removed (its store,
        its index, what was made from them). The names removed."""
        where = self.dir_of(household)
        if household == HUB_HOUSEHOLD or not (where / MARKER).is_file():
            raise UnknownHousehold(f"no household {household!r} here")
        write_private(where / MOVED, json.dumps({"to": to, "at": time.time() if now is None
                                                 else now}) + "\n")
        gone = []
        for entry in sorted(where.iterdir()):
            if entry.name in IDENTITY:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            gone.append(entry.name)
        return gone

    def receive(self, household: str, marker: str) -> Path:
        """Make ``household``'s directory ready for a restored store (a move to
        this node): 0700, the marker (its content from the hub's), nothing else
        but its identity. The store path to restore into.

        The mover calls this only while the routing names another node, where
        the one live store is; so whatever else is here is what an earlier stay
        left, and is removed: a copy retired after a move away, a store a move
        killed after its flip never retired, a copy a move given up after its
        restore left. Each holds nothing the live store lacks (a move's final
        sync carried all of it), and nothing of it may outlive a forget there."""
        where = private_dir(self.dir_of(household))
        own = self.settings_for_new(household)
        for entry in where.iterdir():
            if entry.name not in IDENTITY:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if not (where / MARKER).is_file():
            write_private(where / MARKER, marker)
        return own.store.path

    def arrived(self, household: str) -> None:
        """The restored store is in place: served here (no :data:`MOVED` left)."""
        (self.dir_of(household) / MOVED).unlink(missing_ok=True)

    def marker(self, household: str) -> str:
        return (self.dir_of(household) / MARKER).read_text(encoding="utf-8")

    def registered(self, household: str) -> bool:
        """Whether ``household`` was added here (stopped or not)."""
        check_id(household)
        return household != HUB_HOUSEHOLD and (self.root / household / MARKER).is_file()

    def stop(self, household: str) -> None:
        """No longer serve ``household`` (its data stays; :meth:`add` serves it again)."""
        if household == HUB_HOUSEHOLD:
            raise ValueError(f"{HUB_HOUSEHOLD!r} is the hub's own household")
        if not self.registered(household):
            raise UnknownHousehold(f"no household {household!r} here")
        write_private(self.dir_of(household) / STOPPED, "")

    def delete(self, household: str) -> None:
        """Remove ``household`` for good: its directory and everything in it.
        The owners must have closed it first (``reverie household delete``)."""
        if household == HUB_HOUSEHOLD:
            raise ValueError(f"{HUB_HOUSEHOLD!r} is the hub's own household")
        if not self.registered(household):
            raise UnknownHousehold(f"no household {household!r} here")
        shutil.rmtree(self.dir_of(household))


def store_marks(path: Path) -> dict[str, int]:
    """What a store holds, to compare a restored copy with its source: the
    newest write-log id and the number of transcript rows."""
    import apsw

    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        conn.setbusytimeout(5000)
        newest: Any = conn.execute("SELECT coalesce(max(id), 0) FROM write_log").fetchall()[0][0]
        turns: Any = conn.execute("SELECT count(*) FROM transcript").fetchall()[0][0]
    finally:
        conn.close()
    return {"write_log_id": int(newest), "turns": int(turns)}
