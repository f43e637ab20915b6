"""The location history, and the live location back-filled onto user turns.

Fixes come from the edge (``device/``: OwnTracks and Home Assistant over MQTT,
gpsd on the hub) as :class:`device.records.LocationRecord`. The Transcript
actor is the only writer of ``location_fixes`` (migration 0010), because
storing a fix also back-fills the transcript: a user turn without a location,
whose source profile has the ``location`` switch, takes the fix of its
speaker, or of the hub itself (``gps.person``: wherever the hub is, every
spoken turn was spoken there), taken within :data:`WINDOW_S` of the turn. A
turn appended after a fix takes the latest one before it the same way
(:func:`live_location`). A row that has a location keeps it.

Fixes are sensor data, not memory: they are not in the write log (the rows
they back-fill are, like every transcript change). Nothing here logs a
position.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from device.records import LocationRecord
from runtime.memories.profiles import MemoryProfiles
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

#: How far apart a fix and a turn may be for the turn to take that fix.
WINDOW_S = 600.0
WRITER = "location"


@dataclass(frozen=True)
class Stored:
    fixes: int        # new rows (a fix already stored is not counted)
    backfilled: int   # transcript rows that took a location


def store_fixes(store: Store, fixes: Sequence[LocationRecord], profiles: MemoryProfiles,
                hub_person: str | None = None) -> Stored:
    """Store ``fixes`` and back-fill user turns, in one write transaction."""
    added = filled = 0
    with store.write_transaction():
        now = store.clock.now()  # once the write lock is held
        for fix in fixes:
            store.conn.execute(
                "INSERT OR IGNORE INTO location_fixes (person, lat, lon, accuracy_m, at,"
                " source, device, place, event, stored_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (fix.person, fix.lat, fix.lon, fix.accuracy_m, fix.at, fix.source,
                 fix.device or "", fix.place, fix.event, now))
            if store.conn.changes():
                added += 1
                filled += _backfill(store, fix, profiles, hub_person)
    return Stored(added, filled)


def _speakers_of(fix: LocationRecord, hub_person: str | None) -> str | None:
    """None: every speaker (a hub fix); else the person whose turns it fills."""
    return None if hub_person is not None and fix.person == hub_person else fix.person


def _backfill(store: Store, fix: LocationRecord, profiles: MemoryProfiles,
              hub_person: str | None) -> int:
    speaker = _speakers_of(fix, hub_person)
    sql = ("SELECT id, source FROM transcript WHERE role = 'user' AND lat IS NULL"
           " AND created_at BETWEEN ? AND ?")
    args: list[object] = [fix.at - WINDOW_S, fix.at + WINDOW_S]
    if speaker is not None:
        sql += " AND lower(speaker) = lower(?)"
        args.append(speaker)
    n = 0
    for row in store.rows(sql, args):
        if not profiles.for_source(row["source"]).location:
            continue
        store.update(WRITER, "transcript", row["id"], {
            "lat": fix.lat, "lon": fix.lon, "accuracy_m": fix.accuracy_m, "place": fix.place})
        n += 1
    return n


def live_location(store: Store, speaker: str | None, at: float,
                  hub_person: str | None = None) -> Row | None:
    """The latest fix at or before ``at`` (within :data:`WINDOW_S`) for a turn by
    ``speaker``: the speaker's own, or the hub's."""
    people: list[str] = [p for p in (speaker, hub_person) if p]
    if not people:
        return None
    marks = ", ".join("lower(?)" for _ in people)
    return store.row(
        "SELECT lat, lon, accuracy_m, place FROM location_fixes"
        f" WHERE lower(person) IN ({marks}) AND at BETWEEN ? AND ?"
        " ORDER BY at DESC, id DESC LIMIT 1", [*people, at - WINDOW_S, at])


def summary(store: Store) -> tuple[int, float | None]:
    """``location`` of ``reverie status --json``: how many fixes, and the last one's time."""
    row = store.row("SELECT count(*) AS n, max(at) AS last FROM location_fixes")
    assert row is not None
    return int(row["n"]), None if row["last"] is None else float(row["last"])


def recent(store: Store, person: str | None = None, limit: int = 100) -> list[Row]:
    sql = "SELECT * FROM location_fixes"
    args: Iterable[object] = ()
    if person:
        sql += " WHERE person = ?"
        args = (person,)
    return store.rows(sql + " ORDER BY at DESC, id DESC LIMIT ?", [*args, limit])
