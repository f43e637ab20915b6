"""What synced items become: facts, rendered deterministically.

Every item is one fact (:class:`Item`) of source ``sync:<connector>``:

- a calendar event occurrence: kind ``calendar_event``, subject
  ``"<connector> calendar"``, key ``event <connector> <uid>`` (a recurring
  event's occurrences add their recurrence id), value ``"Dentist: Tuesday 21
  November 2023, 10:00 to 11:00, at Clinic."``;
- a contact card: kind ``contact``, subject the contact's name, key ``contact
  <connector> <uid>``;
- a mail: kind ``mail``, subject ``"<connector> mail"``, key ``mail <connector>
  <Message-ID>`` (so one mail in two folders is one fact).

The key names the item, not its content, so a re-sync of a changed item
supersedes its fact instead of adding another. Times are shown in the
household's zone.

Outside text (summaries, notes, mail text, names) is data, never instructions:
control and bidirectional-override characters are dropped, whitespace is
collapsed, every field is cut to a bound, and free text (mail bodies, event
notes) is quoted between « and », which are removed from the text itself so
the quote cannot be closed early. No language model reads any of it here.

A document that cannot be read at all raises :class:`Malformed`; an item that
cannot be used raises :class:`Skip` with the reason it is counted under.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import getaddresses, parsedate_to_datetime
from typing import Any

KIND_EVENT = "calendar_event"
KIND_CONTACT = "contact"
KIND_MAIL = "mail"
MAX_FIELD = 200  # characters of a summary, a name, a subject line...
MAX_VALUE = 3800  # a fact's value (the graph takes 4000)
MAX_IDENT = 120  # longer item ids (UIDs, Message-IDs) are hashed in keys
MAX_OCCURRENCES = 100  # of one recurring event within the window
MAX_LISTED = 5  # phone numbers, addresses, recipients shown
BINARY_VCARD = ("PHOTO", "LOGO", "SOUND", "KEY")

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")

# C0/C1 controls (tab and newline are whitespace), zero-width and bidirectional
# formatting characters: nothing that could hide or reorder text.
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                        r"\u2066-\u2069\ufeff]")


class Malformed(Exception):
    """A whole document (a calendar) could not be read."""


class Skip(Exception):
    """One item was left out; ``reason`` is what it is counted under."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Item:
    """One synced item as the fact it becomes."""

    kind: str
    subject: str
    key: str
    value: str
    start: float | None = None  # an event occurrence's start (epoch seconds)

    @property
    def digest(self) -> str:
        """A short hash of what the fact says (kind, subject, value)."""
        text = "\x1f".join((self.kind, self.subject, self.value))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Tally:
    """What one connector did: facts written by action, removed, unchanged,
    items skipped by reason, items truncated."""

    written: Counter[str] = field(default_factory=Counter)
    removed: int = 0
    unchanged: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    truncated: int = 0

    @property
    def items(self) -> int:
        return sum(self.written.values()) + self.removed

    def summary(self) -> str:
        parts = [f"{sum(self.written.values())} written"]
        if self.written:
            parts[0] += " (" + ", ".join(f"{k} {v}" for k, v in sorted(self.written.items())) + ")"
        parts.append(f"{self.removed} removed")
        parts.append(f"{self.unchanged} unchanged")
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{k} {v}"
                                                for k, v in sorted(self.skipped.items())))
        if self.truncated:
            parts.append(f"{self.truncated} truncated")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"written": dict(self.written), "removed": self.removed,
                "unchanged": self.unchanged, "skipped": dict(self.skipped),
                "truncated": self.truncated}


@dataclass(frozen=True)
class Window:
    """The span calendar events are expanded in, and the household's zone."""

    start: datetime
    end: datetime
    zone: tzinfo
    day: str  # the household's date of "now": the window moves once a day

    @classmethod
    def around(cls, now: float, zone: tzinfo, days_back: int, days_ahead: int) -> Window:
        at = datetime.fromtimestamp(now, UTC)
        return cls(start=at - timedelta(days=days_back), end=at + timedelta(days=days_ahead),
                   zone=zone, day=at.astimezone(zone).date().isoformat())

    @property
    def start_ts(self) -> float:
        return self.start.timestamp()


# -- text ---------------------------------------------------------------------


def clean(text: str, limit: int) -> tuple[str, bool]:
    """One line of outside text, made safe to store: invisible characters out,
    whitespace collapsed, the quote marks « » replaced, cut to ``limit``
    characters (on a word boundary when there is one) with an ellipsis.
    Returns the text and whether it was cut."""
    text = _INVISIBLE.sub("", text)
    text = " ".join(text.replace("«", '"').replace("»", '"').split())
    if len(text) <= limit:
        return text, False
    if limit <= 1:
        return "…"[:limit], True
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…", True


def ident(raw: str) -> str:
    """An item id fit for a fact key: as it is when short and printable, else
    a hash."""
    text = " ".join(_INVISIBLE.sub("", raw).split())
    if text and len(text) <= MAX_IDENT and text == raw.strip():
        return text
    return "h" + hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()[:32]


def day_text(d: date) -> str:
    return f"{WEEKDAYS[d.weekday()]} {d.day} {MONTHS[d.month - 1]} {d.year}"


def _cap_value(value: str) -> str:
    return value if len(value) <= MAX_VALUE else value[:MAX_VALUE - 2].rstrip() + "…."


# -- calendars -----------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """The events of one UID in a calendar: ``items`` None when it was skipped
    (its reason counted); ``pending`` when the window moving on may bring it
    new occurrences (it recurs, or it starts after the window)."""

    rid: str
    items: list[Item] | None
    pending: bool


def _aware(value: date, zone: tzinfo) -> datetime:
    """A DTSTART/DTEND value as an aware datetime (dates and floating times in
    the household's zone)."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=zone)
    return datetime(value.year, value.month, value.day, tzinfo=zone)


def _when(start: date, end: date | None, zone: tzinfo) -> str:
    if not isinstance(start, datetime):
        last = start
        if end is not None and not isinstance(end, datetime) and end > start + timedelta(days=1):
            last = end - timedelta(days=1)
        if last == start:
            return f"{day_text(start)} (all day)"
        return f"{day_text(start)} to {day_text(last)} (all day)"
    s = _aware(start, zone).astimezone(zone)
    e = _aware(end, zone).astimezone(zone) if isinstance(end, datetime) else None
    if e is None or e <= s:
        return f"{day_text(s)}, {s:%H:%M}"
    if e.date() == s.date():
        return f"{day_text(s)}, {s:%H:%M} to {e:%H:%M}"
    return f"{day_text(s)} {s:%H:%M} to {day_text(e)} {e:%H:%M}"


def _text_prop(component: Any, name: str) -> str:
    value = component.get(name)
    if value is None:
        return ""
    if isinstance(value, list):  # a property given twice
        value = value[0]
    return str(value)


def _occurrence_id(occ: Any, zone: tzinfo) -> str:
    rid = occ.get("RECURRENCE-ID") or occ.get("DTSTART")
    value = rid.dt
    if isinstance(value, datetime):
        return _aware(value, zone).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return str(value.isoformat())


def _event_item(occ: Any, uid: str, recurring: bool, connector: str, window: Window,
                max_excerpt: int, tally: Tally) -> Item:
    start = occ.get("DTSTART").dt
    end: date | None = None
    if occ.get("DTEND") is not None:
        end = occ.get("DTEND").dt
    elif occ.get("DURATION") is not None:
        end = start + occ.get("DURATION").dt
    summary, cut1 = clean(_text_prop(occ, "SUMMARY"), MAX_FIELD)
    location, cut2 = clean(_text_prop(occ, "LOCATION"), MAX_FIELD)
    notes, cut3 = clean(_text_prop(occ, "DESCRIPTION"), max_excerpt)
    if cut1 or cut2 or cut3:
        tally.truncated += 1
    value = f"{summary or 'Untitled event'}: {_when(start, end, window.zone)}"
    if location:
        value += f", at {location}"
    if _text_prop(occ, "STATUS").upper() == "CANCELLED":
        value = "Cancelled: " + value
    value += "."
    if notes:
        value += f" Notes: «{notes}»."
    key = f"event {connector} {ident(uid)}"
    if recurring:
        key += f" {_occurrence_id(occ, window.zone)}"
    return Item(KIND_EVENT, f"{connector} calendar", key, _cap_value(value),
                _aware(start, window.zone).timestamp())


def calendar_resources(text: str, connector: str, window: Window, max_excerpt: int,
                       tally: Tally) -> list[Resource]:
    """The events of an iCalendar document, one :class:`Resource` per UID,
    expanded within ``window``. A broken event (a property that does not parse,
    no UID, a recurrence that cannot be expanded) is skipped and counted, the
    others are kept; a document that is not iCalendar raises :class:`Malformed`."""
    import icalendar

    try:
        calendar = icalendar.Calendar.from_ical(text)
    except Exception:  # the parser raises ValueError, IndexError, KeyError... on junk
        raise Malformed("not an iCalendar document") from None
    if not isinstance(calendar, icalendar.Calendar) or calendar.name != "VCALENDAR":
        raise Malformed("not an iCalendar document")
    zones = list(calendar.walk("VTIMEZONE"))
    groups: dict[str, list[Any]] = {}
    for event in calendar.walk("VEVENT"):
        uid = _text_prop(event, "UID").strip()
        if not uid:
            tally.skipped["no-uid"] += 1
            continue
        groups.setdefault(uid, []).append(event)
    out = []
    for uid, events in groups.items():
        out.append(_expand(uid, events, zones, connector, window, max_excerpt, tally))
    return out


def _expand(uid: str, events: list[Any], zones: list[Any], connector: str, window: Window,
            max_excerpt: int, tally: Tally) -> Resource:
    import icalendar
    import recurring_ical_events

    recurring = len(events) > 1 or any("RRULE" in e or "RDATE" in e for e in events)
    if any(getattr(e, "errors", None) for e in events):
        tally.skipped["bad-event"] += 1
        return Resource(uid, None, recurring)
    rules = " ".join(str(e.get("RRULE").to_ical(), "utf-8", "replace").upper()
                     for e in events if "RRULE" in e and hasattr(e.get("RRULE"), "to_ical"))
    if "FREQ=SECONDLY" in rules or "FREQ=MINUTELY" in rules:
        tally.skipped["unsupported-rule"] += 1  # expanding it could take ages
        return Resource(uid, None, False)
    single = icalendar.Calendar()
    for component in (*zones, *events):
        single.add_component(component)
    try:
        occurrences = list(recurring_ical_events.of(single).between(window.start, window.end))
        occurrences.sort(key=lambda o: _aware(o.get("DTSTART").dt, window.zone))
        if len(occurrences) > MAX_OCCURRENCES:
            tally.truncated += 1
            occurrences = occurrences[:MAX_OCCURRENCES]
        items = [_event_item(o, uid, recurring, connector, window, max_excerpt, tally)
                 for o in occurrences]
        later = any(_aware(e.get("DTSTART").dt, window.zone) > window.end for e in events)
    except Exception:  # a broken date, rule or time zone: this event only
        tally.skipped["bad-event"] += 1
        return Resource(uid, None, recurring)
    return Resource(uid, items, recurring or later)


# -- contacts ------------------------------------------------------------------


def _strip_binary(text: str) -> str:
    """A vCard without its photos, logos, sounds and keys (base64 blobs that
    only make it large), unfolded."""
    unfolded = re.sub(r"\r?\n[ \t]", "", text)
    kept = []
    for line in unfolded.splitlines():
        name = line.split(":", 1)[0].split(";", 1)[0].rsplit(".", 1)[-1].strip().upper()
        if name not in BINARY_VCARD:
            kept.append(line)
    return "\r\n".join(kept) + "\r\n"


def _vc_values(card: Any, name: str) -> list[Any]:
    return list(card.contents.get(name, []))


def _vc_text(card: Any, name: str) -> str:
    values = _vc_values(card, name)
    if not values:
        return ""
    value = values[0].value
    if isinstance(value, list):
        value = " ".join(str(v) for v in value if str(v).strip())
    return str(value)


def _birthday(raw: str) -> str:
    m = re.fullmatch(r"(\d{4}|--)-?(\d{2})-?(\d{2})(?:T.*)?", raw.strip())
    if m:
        month, day = int(m.group(2)), int(m.group(3))
        if 1 <= month <= 12 and 1 <= day <= 31:
            year = "" if m.group(1) == "--" else f" {m.group(1)}"
            return f"{day} {MONTHS[month - 1]}{year}"
    return clean(raw, 40)[0]


def _labelled(entries: Iterable[Any], noun: str) -> list[str]:
    out = []
    for entry in list(entries)[:MAX_LISTED]:
        value = clean(str(entry.value), 100)[0]
        if not value:
            continue
        types = {str(t).lower() for t in entry.params.get("TYPE", [])}
        label = noun
        if "cell" in types:
            label = "mobile"
        elif "work" in types:
            label = f"work {noun}"
        elif "home" in types:
            label = f"home {noun}"
        out.append(f"{label} {value}")
    return out


def contact_item(text: str, connector: str, fallback_id: str, max_excerpt: int,
                 tally: Tally, max_bytes: int = 1_048_576) -> Item:
    """A vCard as a ``contact`` fact about the person it names. Raises
    :class:`Skip` (``malformed-vcard``, ``no-name``, ``too-large``: more than
    ``max_bytes`` without its photos) for a card it cannot use."""
    import vobject

    text = _strip_binary(text)
    if len(text.encode("utf-8", "replace")) > max_bytes:
        raise Skip("too-large")
    try:
        card = vobject.readOne(text)
    except Exception:  # vobject raises ParseError, and worse on junk
        raise Skip("malformed-vcard") from None
    if getattr(card, "name", "") != "VCARD":
        raise Skip("malformed-vcard")
    name = _vc_text(card, "fn")
    if not name.strip() and _vc_values(card, "n"):
        n = _vc_values(card, "n")[0].value
        name = " ".join(str(p) for p in (getattr(n, "given", ""), getattr(n, "family", ""))
                        if str(p).strip())
    name = clean(name or _vc_text(card, "org"), MAX_FIELD)[0]
    if not name:
        raise Skip("no-name")
    parts = _labelled(_vc_values(card, "tel"), "phone")
    parts += [f"email {clean(str(e.value), 100)[0]}"
              for e in _vc_values(card, "email")[:MAX_LISTED] if str(e.value).strip()]
    if _vc_text(card, "bday").strip():
        parts.append(f"birthday {_birthday(_vc_text(card, 'bday'))}")
    for prop, label in (("org", "organisation"), ("title", "title")):
        value = clean(_vc_text(card, prop), MAX_FIELD)[0]
        if value:
            parts.append(f"{label} {value}")
    for adr in _vc_values(card, "adr")[:2]:
        where = ", ".join(clean(str(getattr(adr.value, a, "")), 80)[0]
                          for a in ("city", "country") if str(getattr(adr.value, a, "")).strip())
        if where:
            parts.append(f"lives in {where}" if "home" in {
                str(t).lower() for t in adr.params.get("TYPE", [])} else f"address in {where}")
    notes, cut = clean(_vc_text(card, "note"), max_excerpt)
    if cut:
        tally.truncated += 1
    value = f"Contact in the {connector} address book"
    value += (": " + "; ".join(parts) + ".") if parts else "."
    if notes:
        value += f" Notes: «{notes}»."
    uid = _vc_text(card, "uid").strip() or fallback_id
    return Item(KIND_CONTACT, name, f"contact {connector} {ident(uid)}", _cap_value(value))


# -- mail ----------------------------------------------------------------------


def _header(message: EmailMessage, name: str) -> str:
    try:
        value = message.get(name)
        return "" if value is None else str(value)
    except Exception:  # a header the parser cannot decode: its raw text
        for key, raw in message.raw_items():
            if key.lower() == name.lower():
                return str(raw)
        return ""


def _addresses(raw: str, limit: int) -> str:
    try:
        pairs = [(n, a) for n, a in getaddresses([raw]) if n or a]
    except Exception:
        pairs = []
    if not pairs:
        return clean(raw, MAX_FIELD)[0]
    shown = []
    for name, addr in pairs[:limit]:
        name, addr = clean(name, 80)[0], clean(addr, 120)[0]
        shown.append(f"{name} <{addr}>" if name and addr else name or addr)
    more = len(pairs) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _plain_body(message: EmailMessage) -> str:
    try:
        part = message.get_body(preferencelist=("plain",))
    except Exception:
        return ""
    if part is None:
        return ""
    try:
        text = part.get_content()
    except Exception:  # an unknown charset, a broken transfer encoding
        payload = part.get_payload(decode=True)
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if not isinstance(text, str):
        return ""
    lines = []
    for line in text.splitlines():
        if line.rstrip() == "--":  # the signature starts
            break
        if not line.lstrip().startswith(">"):  # quoted replies are older mail
            lines.append(line)
    return "\n".join(lines)


def mail_item(raw: bytes, size: int, connector: str, fallback_id: str, zone: tzinfo,
              max_excerpt: int, tally: Tally) -> Item:
    """A mail (``raw``: at most its first bytes, ``size``: its full size) as a
    ``mail`` fact: sender, recipients, subject, date and a quoted excerpt of
    the plain-text body. Raises :class:`Skip` (``malformed-mail``) for a mail
    with no usable header."""
    try:
        message = BytesParser(policy=policy.default).parsebytes(raw)
    except Exception:
        raise Skip("malformed-mail") from None
    if not isinstance(message, EmailMessage):
        raise Skip("malformed-mail")
    heads = {h: _header(message, h) for h in ("From", "To", "Cc", "Subject", "Date",
                                               "Message-ID")}
    if not (heads["From"].strip() or heads["Date"].strip()):
        raise Skip("malformed-mail")
    cut = size > len(raw)
    sender = _addresses(heads["From"], 1) or "an unknown sender"
    recipients = _addresses(", ".join(h for h in (heads["To"], heads["Cc"]) if h.strip()),
                            MAX_LISTED)
    subject, cut_subject = clean(heads["Subject"], MAX_FIELD)
    when = "on an unknown date"
    try:
        sent = parsedate_to_datetime(heads["Date"])
        if sent.tzinfo is None:
            sent = sent.replace(tzinfo=UTC)
        local = sent.astimezone(zone)
        when = f"on {day_text(local)} at {local:%H:%M}"
    except (TypeError, ValueError, IndexError, OverflowError):
        pass
    excerpt, cut_text = clean(_plain_body(message), max_excerpt)
    if cut or cut_subject or cut_text:
        tally.truncated += 1
    value = f"Mail from {sender}"
    if recipients:
        value += f" to {recipients}"
    value += f", subject «{subject}», sent {when}." if subject else f", sent {when}."
    value += f" Text: «{excerpt}»." if excerpt else " No plain-text body."
    message_id = heads["Message-ID"].strip().strip("<>").strip()
    key = f"mail {connector} {ident(message_id) if message_id else fallback_id}"
    return Item(KIND_MAIL, f"{connector} mail", key, _cap_value(value))
