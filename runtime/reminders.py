"""Reminders: when to say something, and what became of it.

``reverie remind "take the bins out" --at "tomorrow 8:00"``: the time is read
in the household's zone (:func:`parse_when`), the reminder is stored
(``reminders``, migration 0009), and the Cron actor fires it when due, idle or
not: the text is appended to the transcript of its channel with source
``scheduled`` (muted by the profiles: it never becomes memory), with a
request id derived from the reminder's id, so a crash between the append and
marking it fired never says it twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo

from runtime.store import Row, Store

SOURCE = "scheduled"
MAX_TEXT = 2000

_UNITS = {"minute": 60, "min": 60, "hour": 3600, "h": 3600, "day": 86400, "week": 604800}
_IN = re.compile(r"^in\s+(\d{1,4})\s*(minutes?|mins?|hours?|h|days?|weeks?)$")
_CLOCK = r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?"
_DAY = re.compile(rf"^(today|tomorrow)(?:\s+at)?\s+{_CLOCK}$")
_DATE = re.compile(rf"^(\d{{4}})-(\d{{2}})-(\d{{2}})(?:[ t]|\s+at\s+){_CLOCK}$")
_TIME = re.compile(rf"^(?:at\s+)?{_CLOCK}$")


def _clock(hour: str, minute: str | None, ampm: str | None) -> time:
    h, m = int(hour), int(minute or 0)
    if ampm is not None:
        if not 1 <= h <= 12:
            raise ValueError(f"{h}{ampm} is not a time")
        h = h % 12 + (12 if ampm == "pm" else 0)
    elif minute is None:
        raise ValueError("a time needs minutes (8:00) or am/pm (8am)")
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError(f"{hour}:{minute or '00'} is not a time")
    return time(h, m)


def _at(day: date, when: time, zone: tzinfo) -> float:
    return datetime.combine(day, when).replace(tzinfo=zone).timestamp()


def parse_when(text: str, now: float, zone: tzinfo) -> float:
    """The instant ``text`` names, read at ``now`` in ``zone``; it must be in the future.

    Accepted: ``in 2 hours`` (minutes, hours, days, weeks), ``today 21:30``,
    ``tomorrow 8:00`` (also ``tomorrow at 8am``), ``2026-12-24 18:00``, and a
    bare time, ``8:00`` or ``8pm``: its next occurrence. Raises ValueError."""
    spec = " ".join(text.strip().lower().split())
    local = datetime.fromtimestamp(now, tz=zone)
    if m := _IN.match(spec):
        due = now + int(m.group(1)) * _UNITS[m.group(2).rstrip("s")]
    elif m := _DAY.match(spec):
        day = local.date() + timedelta(days=1 if m.group(1) == "tomorrow" else 0)
        due = _at(day, _clock(*m.group(2, 3, 4)), zone)
    elif m := _DATE.match(spec):
        try:
            day = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        due = _at(day, _clock(*m.group(4, 5, 6)), zone)
    elif m := _TIME.match(spec):
        when = _clock(*m.group(1, 2, 3))
        due = _at(local.date(), when, zone)
        if due <= now:
            due = _at(local.date() + timedelta(days=1), when, zone)
    else:
        raise ValueError(f"cannot read the time {text!r}; say 'in 2 hours', 'today 21:30', "
                         "'tomorrow 8:00', '2026-12-24 18:00' or '8:00'")
    if due <= now:
        raise ValueError(f"{text!r} is in the past")
    return due


@dataclass(frozen=True)
class Reminder:
    id: int
    text: str
    channel: str
    due_at: float
    fired_at: float | None = None
    turn_id: int | None = None

    @property
    def request_id(self) -> str:
        """The transcript request id of its firing: the same on every retry."""
        return f"reminder-{self.id}"

    @classmethod
    def of(cls, row: Row) -> Reminder:
        return cls(id=row["id"], text=row["text"], channel=row["channel"],
                   due_at=row["due_at"], fired_at=row["fired_at"], turn_id=row["turn_id"])


def add(store: Store, text: str, channel: str, due_at: float) -> Reminder:
    text = text.strip()
    if not text:
        raise ValueError("the reminder's text is empty")
    if len(text) > MAX_TEXT:
        raise ValueError(f"a reminder is at most {MAX_TEXT} characters")
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO reminders (text, channel, due_at, created_at) VALUES (?, ?, ?, ?)",
            (text, channel, due_at, store.clock.now()))
        rid = store.conn.last_insert_rowid()
    return Reminder(rid, text, channel, due_at)


def due(store: Store, now: float, limit: int = 100) -> list[Reminder]:
    """Unfired reminders due at ``now``, oldest first."""
    return [Reminder.of(r) for r in store.rows(
        "SELECT * FROM reminders WHERE fired_at IS NULL AND due_at <= ?"
        " ORDER BY due_at, id LIMIT ?", (now, limit))]


def next_due(store: Store) -> float | None:
    """When the next unfired reminder is due, if any."""
    value = store.scalar("SELECT min(due_at) FROM reminders WHERE fired_at IS NULL")
    return None if value is None else float(value)


def mark_fired(store: Store, reminder_id: int, turn_id: int, now: float) -> None:
    """Record that a reminder was said (once: a second call changes nothing)."""
    with store.write_transaction():
        store.conn.execute(
            "UPDATE reminders SET fired_at = ?, turn_id = ? WHERE id = ? AND fired_at IS NULL",
            (now, turn_id, reminder_id))


def get(store: Store, reminder_id: int) -> Reminder | None:
    row = store.row("SELECT * FROM reminders WHERE id = ?", (reminder_id,))
    return None if row is None else Reminder.of(row)


def content(reminder: Reminder) -> str:
    """What the transcript says when it fires."""
    return f"Reminder: {reminder.text}"
