"""Reminders and scheduled prompts: when to say (or ask) something, and what became of it.

``reverie remind "take the bins out" --at "tomorrow 8:00"``: the time is read
in the household's zone (:func:`parse_when`), the reminder is stored
(``reminders``, migrations 0009 and 0013), and the Cron actor fires it when
due, idle or not. Two kinds:

- ``say`` (the default): the text is appended to the transcript of its channel
  with source ``scheduled`` (muted by the profiles: it never becomes memory);
- ``ask`` (``--ask``): a scheduled *prompt*. The text is sent through the
  Turns actor as a turn of source ``scheduled`` on its channel, so the
  assistant answers it (turn-zero recall, the configured model) and the answer
  is stored as its reply; the prompt itself stays muted.

Each firing has a transcript request id derived from the reminder's id and
its occurrence (:attr:`Reminder.request_id`), so a crash between the append
(or the answer) and marking it fired never says or answers it twice: the
append is a no-op the second time, and an answered prompt is found by its
reply's request id (:func:`answered`).

A reminder may repeat (``--every week``; :func:`parse_repeat`): ``day``,
``week``, ``weekday`` (Monday to Friday), ``N days``, ``N weeks`` or
``N hours``. Day-based rules keep the local wall time of the first occurrence
(the anchor) in the household's zone, so a daily 8:00 stays 8:00 across a
daylight-saving change; ``N hours`` steps in elapsed time. The row stays
pending: each firing moves its ``due_at`` to the first occurrence after the
firing, so occurrences missed while the runtime was down fire once, not once
each (:func:`next_occurrence`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Literal

from runtime.store.database import Row, Store

SOURCE = "scheduled"
MAX_TEXT = 2000
Kind = Literal["say", "ask"]
KINDS: tuple[Kind, ...] = ("say", "ask")
# what became of the last firing
Outcome = Literal["said", "answered", "unanswered", "refused"]

_UNITS = {"minute": 60, "min": 60, "hour": 3600, "h": 3600, "day": 86400, "week": 604800}
_IN = re.compile(r"^in\s+(\d{1,4})\s*(minutes?|mins?|hours?|h|days?|weeks?)$")
_CLOCK = r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?"
_DAY = re.compile(rf"^(today|tomorrow)(?:\s+at)?\s+{_CLOCK}$")
_DATE = re.compile(rf"^(\d{{4}})-(\d{{2}})-(\d{{2}})(?:[ t]|\s+at\s+){_CLOCK}$")
_TIME = re.compile(rf"^(?:at\s+)?{_CLOCK}$")
_WEEKDAY = re.compile(
    r"^(?:on\s+)?(mon(?:day)?|tue(?:s(?:day)?)?|wed(?:nesday)?|thu(?:r(?:s(?:day)?)?)?"
    rf"|fri(?:day)?|sat(?:urday)?|sun(?:day)?)(?:\s+at)?\s+{_CLOCK}$")
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


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
    """The instant of a local wall time (a time skipped by a DST change reads with
    the offset before it, i.e. as much later as the change skipped)."""
    return datetime.combine(day, when).replace(tzinfo=zone).timestamp()


def parse_when(text: str, now: float, zone: tzinfo) -> float:
    """The instant ``text`` names, read at ``now`` in ``zone``; it must be in the future.

    Accepted: ``in 2 hours`` (minutes, hours, days, weeks), ``today 21:30``,
    ``tomorrow 8:00`` (also ``tomorrow at 8am``), ``2026-12-24 18:00``, a
    weekday, ``tuesday 19:00`` (also ``monday at 8am``, ``tue 19:00``: its
    next occurrence, today's if still ahead), and a bare time, ``8:00`` or
    ``8pm``: its next occurrence. Raises ValueError."""
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
    elif m := _WEEKDAY.match(spec):
        when = _clock(*m.group(2, 3, 4))
        ahead = (_WEEKDAYS.index(m.group(1)[:3]) - local.weekday()) % 7
        due = _at(local.date() + timedelta(days=ahead), when, zone)
        if due <= now:
            due = _at(local.date() + timedelta(days=ahead + 7), when, zone)
    elif m := _TIME.match(spec):
        when = _clock(*m.group(1, 2, 3))
        due = _at(local.date(), when, zone)
        if due <= now:
            due = _at(local.date() + timedelta(days=1), when, zone)
    else:
        raise ValueError(f"cannot read the time {text!r}; say 'in 2 hours', 'today 21:30', "
                         "'tomorrow 8:00', 'tuesday 19:00', '2026-12-24 18:00' or '8:00'")
    if due <= now:
        raise ValueError(f"{text!r} is in the past")
    return due


# -- repeating -------------------------------------------------------------------

_EVERY = re.compile(r"^(?:every\s+)?(?:(\d{1,4})\s+)?"
                    r"(days?|daily|weeks?|weekly|weekdays?|hours?|hourly)$")
MAX_DAYS = 366
MAX_HOURS = 24 * 7


@dataclass(frozen=True)
class Repeat:
    """How a reminder repeats: every ``every`` days (local wall time kept), every
    weekday (Monday to Friday, local), or every ``every`` hours (elapsed)."""

    unit: Literal["day", "weekday", "hour"]
    every: int = 1

    @property
    def rule(self) -> str:
        """The rule as stored and shown; :func:`parse_repeat` reads it back."""
        if self.unit == "weekday":
            return "weekday"
        if self.unit == "hour":
            return "hour" if self.every == 1 else f"{self.every} hours"
        if self.every == 1:
            return "day"
        if self.every == 7:
            return "week"
        if self.every % 7 == 0:
            return f"{self.every // 7} weeks"
        return f"{self.every} days"


def parse_repeat(text: str) -> Repeat:
    """``day`` (``daily``), ``week`` (``weekly``), ``weekday``, ``N days``,
    ``N weeks``, ``N hours`` (``hourly``). Raises ValueError."""
    spec = " ".join(text.strip().lower().split())
    m = _EVERY.match(spec)
    if m is None:
        raise ValueError(f"cannot read the repeat {text!r}; say 'day', 'week', 'weekday', "
                         "'3 days' or '6 hours'")
    count, word = m.group(1), m.group(2)
    n = 1 if count is None else int(count)
    if word.startswith("weekday"):
        if count is not None:
            raise ValueError(f"{text!r}: 'weekday' takes no number")
        return Repeat("weekday")
    if word in ("hourly", "hour", "hours"):
        if not 1 <= n <= MAX_HOURS:
            raise ValueError(f"{text!r}: every 1 to {MAX_HOURS} hours")
        return Repeat("hour", n)
    days = n * (7 if word.startswith("week") else 1)
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"{text!r}: every 1 to {MAX_DAYS} days")
    return Repeat("day", days)


def first_occurrence(due_at: float, repeat: Repeat, zone: tzinfo) -> float:
    """The first occurrence at or after ``due_at`` the rule allows (a weekday
    rule starting on a weekend starts on Monday, at the same wall time)."""
    if repeat.unit != "weekday":
        return due_at
    local = datetime.fromtimestamp(due_at, tz=zone)
    day = local.date()
    if day.weekday() < 5:
        return due_at
    return _at(day + timedelta(days=7 - day.weekday()), local.time(), zone)


def next_occurrence(anchor: float, repeat: Repeat, after: float, zone: tzinfo) -> float:
    """The first occurrence strictly after ``after`` of a schedule whose first
    occurrence is ``anchor``: day-based rules at the anchor's local wall time
    (through DST changes), hours in elapsed time."""
    if anchor > after:
        return anchor
    if repeat.unit == "hour":
        step = repeat.every * 3600.0
        return anchor + (math.floor((after - anchor) / step) + 1) * step
    start = datetime.fromtimestamp(anchor, tz=zone)
    wall, first = start.time(), start.date()
    step = repeat.every if repeat.unit == "day" else 1
    behind = (datetime.fromtimestamp(after, tz=zone).date() - first).days
    k = max(0, behind // step - 1)
    while True:
        day = first + timedelta(days=k * step)
        k += 1
        if repeat.unit == "weekday" and day.weekday() >= 5:
            continue
        due = _at(day, wall, zone)
        if due > after:
            return due


# -- the table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Reminder:
    id: int
    text: str
    channel: str
    due_at: float
    fired_at: float | None = None
    turn_id: int | None = None
    kind: Kind = "say"
    repeat: str | None = None  # the rule (Repeat.rule); None: once
    anchor_at: float | None = None
    occurrence: int = 0  # occurrences fired so far (the next one's number)
    last_fired_at: float | None = None
    outcome: str | None = None
    error: str | None = None
    cancelled_at: float | None = None

    @property
    def request_id(self) -> str:
        """The transcript request id of this occurrence's firing: the same on every
        retry of it (the first occurrence's is the id of reminders before 0013)."""
        if self.occurrence == 0:
            return f"reminder-{self.id}"
        return f"reminder-{self.id}-{self.occurrence}"

    @classmethod
    def of(cls, row: Row) -> Reminder:
        return cls(id=row["id"], text=row["text"], channel=row["channel"],
                   due_at=row["due_at"], fired_at=row["fired_at"], turn_id=row["turn_id"],
                   kind=row["kind"], repeat=row["repeat"], anchor_at=row["anchor_at"],
                   occurrence=row["occurrence"], last_fired_at=row["last_fired_at"],
                   outcome=row["outcome"], error=row["error"],
                   cancelled_at=row["cancelled_at"])


def reply_request_id(request_id: str) -> str:
    """The request id the Turns actor gives its reply to the turn ``request_id``
    (``actors.turns``): how an answered prompt is found again."""
    return f"reply-{request_id}"


def add(store: Store, text: str, channel: str, due_at: float, kind: Kind = "say",
        repeat: Repeat | None = None, zone: tzinfo = UTC) -> Reminder:
    """Store a reminder due at ``due_at`` (with ``repeat``: its first occurrence
    the rule allows, read in ``zone``)."""
    text = text.strip()
    if not text:
        raise ValueError("the reminder's text is empty")
    if len(text) > MAX_TEXT:
        raise ValueError(f"a reminder is at most {MAX_TEXT} characters")
    if kind not in KINDS:
        raise ValueError(f"a reminder's kind is 'say' or 'ask', not {kind!r}")
    anchor = None
    if repeat is not None:
        due_at = anchor = first_occurrence(due_at, repeat, zone)
    rule = None if repeat is None else repeat.rule
    with store.write_transaction():
        store.conn.execute(
            "INSERT INTO reminders (text, channel, due_at, created_at, kind, repeat, anchor_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (text, channel, due_at, store.clock.now(), kind, rule, anchor))
        rid = store.conn.last_insert_rowid()
    return Reminder(rid, text, channel, due_at, kind=kind, repeat=rule, anchor_at=anchor)


_PENDING = "fired_at IS NULL AND cancelled_at IS NULL"


def due(store: Store, now: float, limit: int = 100) -> list[Reminder]:
    """Pending reminders due at ``now``, oldest first."""
    return [Reminder.of(r) for r in store.rows(
        f"SELECT * FROM reminders WHERE {_PENDING} AND due_at <= ?"
        " ORDER BY due_at, id LIMIT ?", (now, limit))]


def pending(store: Store, limit: int = 1000) -> list[Reminder]:
    """Every reminder still to fire (a repeating one until it is cancelled), by due time."""
    return [Reminder.of(r) for r in store.rows(
        f"SELECT * FROM reminders WHERE {_PENDING} ORDER BY due_at, id LIMIT ?", (limit,))]


def next_due(store: Store) -> float | None:
    """When the next pending reminder is due, if any."""
    value = store.scalar(f"SELECT min(due_at) FROM reminders WHERE {_PENDING}")
    return None if value is None else float(value)


def mark_fired(store: Store, reminder_id: int, turn_id: int | None, now: float,
               outcome: Outcome = "said", zone: tzinfo = UTC,
               occurrence: int | None = None) -> bool:
    """Record that a reminder's occurrence fired (``occurrence``: only if it is
    still that one); once: a second call changes nothing. A one-off reminder is
    done; a repeating one is due again at its next occurrence after ``now``
    (read in ``zone``). A cancelled one stays cancelled. True if it changed."""
    with store.write_transaction():
        row = store.row("SELECT * FROM reminders WHERE id = ?", (reminder_id,))
        if row is None:
            return False
        reminder = Reminder.of(row)
        if reminder.fired_at is not None or reminder.cancelled_at is not None:
            return False
        if occurrence is not None and reminder.occurrence != occurrence:
            return False
        if reminder.repeat is None:
            fired_at, due_at = now, reminder.due_at
        else:
            anchor = reminder.due_at if reminder.anchor_at is None else reminder.anchor_at
            fired_at = None
            due_at = next_occurrence(anchor, parse_repeat(reminder.repeat),
                                     max(now, reminder.due_at), zone)
        store.conn.execute(
            "UPDATE reminders SET fired_at = ?, due_at = ?, turn_id = ?, last_fired_at = ?,"
            " outcome = ?, error = NULL, occurrence = occurrence + 1 WHERE id = ?",
            (fired_at, due_at, turn_id, now, outcome, reminder_id))
    return True


def record_error(store: Store, reminder_id: int, error: str) -> None:
    """A firing failed and is left for the next check: say why (``reverie remind --list``)."""
    with store.write_transaction():
        store.conn.execute("UPDATE reminders SET error = ? WHERE id = ?",
                           (error[:500], reminder_id))


def cancel(store: Store, reminder_id: int, now: float) -> bool:
    """Cancel a pending reminder: it never fires again. False if it was cancelled
    already; ValueError if there is none, or it fired and is done."""
    with store.write_transaction():
        row = store.row("SELECT fired_at, cancelled_at FROM reminders WHERE id = ?",
                        (reminder_id,))
        if row is None:
            raise ValueError(f"no reminder {reminder_id}")
        if row["cancelled_at"] is not None:
            return False
        if row["fired_at"] is not None:
            raise ValueError(f"reminder {reminder_id} has fired already; nothing to cancel")
        store.conn.execute("UPDATE reminders SET cancelled_at = ? WHERE id = ?",
                           (now, reminder_id))
    return True


def get(store: Store, reminder_id: int) -> Reminder | None:
    row = store.row("SELECT * FROM reminders WHERE id = ?", (reminder_id,))
    return None if row is None else Reminder.of(row)


def answered(store: Store, reminder: Reminder) -> int | None:
    """The reply already stored to this occurrence of a prompt (a crash after the
    answer, before it was marked fired), if any: its transcript row id."""
    value = store.scalar("SELECT id FROM transcript WHERE request_id = ?",
                         (reply_request_id(reminder.request_id),))
    return None if value is None else int(value)


def content(reminder: Reminder) -> str:
    """What the transcript says when a ``say`` reminder fires."""
    return f"Reminder: {reminder.text}"
