"""Explicit remembering: ``reverie remember``, ``POST /v1/memories`` and a
"remember: ..." said in a turn.

All three store user-managed facts at confidence 1.0, bypassing quality
gating, through the Graph actor (the one writer of facts):

- :func:`note_fact` is the fact the HTTP API writes (``reverie remember``
  builds the same one, with its options): the text as a ``user_specific``
  note about ``user`` (or the subject and kind given), keyed by a hash of the
  text, at the level asked for (``normal``, or ``vivid``/``seared``);
- :func:`turn_facts` is what a "remember: X" turn asks for, exactly what the
  ``facts`` job would have written from it (:func:`runtime.mind.extract.remember_facts`:
  the rules' facts in X, or X as a note keyed by its topic), citing the turn.
  The Turns actor stores them during the turn, so the job skips that turn
  later (:func:`runtime.mind.extract.stored_from_turn`);
- :func:`acknowledgement` is the line the prompt gets, so that the language
  model acknowledges what was stored (the offline provider says it itself:
  :class:`runtime.llm.providers.OfflineProvider`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from runtime.memories.decay import MemoryLevel
from runtime.memories.facts import FactIn
from runtime.memories.levels import check_level
from runtime.memories.profiles import MemoryProfiles
from runtime.mind.extract import remember_facts
from runtime.mind.extract_rules import remembered

log = logging.getLogger(__name__)

NOTE_KIND = "user_specific"
NOTE_SUBJECT = "user"
#: Levels a user may ask for when remembering (``faint`` is the system's, not asked for).
LEVELS: tuple[MemoryLevel, ...] = ("normal", "vivid", "seared")


def note_key(text: str) -> str:
    """The key of a remembered note: a hash of its words (the same note, the same key)."""
    return "note-" + hashlib.sha1(text.strip().lower().encode()).hexdigest()[:10]


def note_fact(text: str, level: str = "normal", kind: str = NOTE_KIND,
              subject: str = NOTE_SUBJECT, key: str | None = None, *,
              sensitive: bool = False, person: str | None = None) -> FactIn:
    """The user-managed fact that remembers ``text``; ValueError for an empty
    text or a level other than normal, vivid or seared. ``sensitive`` and
    ``person``: as ``reverie remember --sensitive --person`` (runtime.memories.privacy)."""
    text = text.strip()
    if not text:
        raise ValueError("nothing to remember: the text is empty")
    checked = check_level(level)
    if checked not in LEVELS:
        raise ValueError(f"remember at level normal, vivid or seared, not {level!r}")
    return FactIn(kind=kind, subject=subject, key=key or note_key(text), value=text,
                  confidence=1.0, source="user", user_managed=True, memory_level=checked,
                  sensitive=sensitive, person=person)


def turn_facts(turn: dict[str, Any], profiles: MemoryProfiles) -> list[FactIn]:
    """The facts a user turn (``id``, ``content``, ``source``, ``speaker``,
    ``created_at``) asks to remember; none when it asks nothing, or its source
    does not feed facts."""
    if remembered(str(turn["content"])) is None:
        return []
    return remember_facts(turn, profiles)


def acknowledgement(notes: list[str]) -> str:
    """The prompt's line about what was stored during this turn."""
    said = "; ".join(notes)
    return (f"## Stored just now\nThe user asked you to remember something, and it is "
            f"stored in memory now: {said}\nAcknowledge briefly that you will remember it.")
