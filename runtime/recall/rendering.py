"""A memory as one line of text for the prompt, dated in the household's
time zone (:func:`render`)."""

from __future__ import annotations

from datetime import datetime, tzinfo

from runtime.store.database import Row
from runtime.time.clock import household_zone


def _date(ts: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(ts, tz=zone).strftime("%Y-%m-%d")


# A fact whose value is a sentence of at least this many words reads on its own.
SENTENCE_WORDS = 3
_SENTENCE_END = (".", "!", "?", "…", '."', '!"', '?"', ".)", "!)", "?)")
# The subject of facts about the person Reverie serves (``reverie remember``'s default).
USER_SUBJECT = "user"


def render(kind: str, row: Row, zone: tzinfo | None = None) -> str:
    """The text of a memory as it is injected into a prompt, dated in ``zone``
    (default: the system's zone)."""
    zone = household_zone() if zone is None else zone
    if kind == "turn":
        who = row.get("speaker") or row["role"]
        return f"[{_date(row['created_at'], zone)}] {who}: {row['content']}"
    if kind == "episode":
        return f"[{_date(row['started_at'] or row['created_at'], zone)}] {row['gist']}"
    return render_fact(row, zone)


def render_fact(row: Row, zone: tzinfo) -> str:
    """A fact from its kind and fields.

    A fact whose value reads on its own (a sentence: a user-managed note of a
    few words, or any value ending like a sentence) is that sentence, behind
    its subject unless the subject is the user: ``The locker code is 4471.
    (noted 2026-03-06)``. Any other fact is ``subject key: value`` with the
    key's underscores as spaces: ``Ana lives in: Lisbon (since 2026-03-06)``.
    A user-managed fact is dated by when it was noted; any other by its
    validity window (a discovery: when it was found).
    """
    subject = str(row["subject"]).strip()
    value = str(row["value"]).strip()
    if _reads_alone(value, bool(row.get("user_managed"))):
        text = value if subject.casefold() == USER_SUBJECT else f"{subject}: {value}"
    else:
        key = " ".join(str(row["key"]).replace("_", " ").split())
        text = f"{subject} {key}: {value}"
    if row.get("user_managed"):
        return f"{text} (noted {_date(row['recorded_at'], zone)})"
    since = _date(row["valid_from"], zone)
    if row.get("valid_to") is not None:
        return f"{text} ({since} to {_date(row['valid_to'], zone)})"
    if row["kind"] == "discovery":
        return f"{text} (found {since})"
    return f"{text} (since {since})"


def _reads_alone(value: str, user_managed: bool) -> bool:
    if len(value.split()) < SENTENCE_WORDS:
        return False
    return user_managed or value.endswith(_SENTENCE_END)
