"""The word-for-word support check (seed: clanka's ``doctor check-facts``).

A fact extracted from conversation must be supported by the turns it cites:
its names, places and dates appear there word for word (case-insensitive,
whole words). What counts as "names, places and dates" is what can be told
without a model:

- capitalised words of the fact's subject and value ("Ana", "New York",
  "May"), minus a short list of capitalised function words ("The", "My"...)
  and the pronoun "I"; a possessive "'s" is dropped ("Ana's" -> "Ana");
- numbers, with what is glued to them ("5th", "2023", "7:30").

The key is not checked: keys are lower-case identifiers the extractor builds.
The speaker of a cited turn counts as part of it ("Caroline: I live in
Porto" supports a fact about Caroline). Lower-case words are not checked,
so a fact can paraphrase a verb ("loves") but never invent a name or a date.

:func:`missing_terms` is the check; :func:`unsupported_facts` runs it over the
stored facts that cite turns or episodes, for a ``doctor`` check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runtime.store.database import Store

# Capitalised words that are not names: sentence starts and function words.
_NOT_NAMES = frozenset("""
i i'm i've i'd i'll the a an my our your his her their its this that these those
he she it we they you me us them and but or so if then yes no oh ok okay
""".split())
_CAPITALISED = re.compile(r"\b[A-Z][\w'\u2019-]*")
_NUMBER = re.compile(r"\b\d[\w:./-]*")
_POSSESSIVE = re.compile(r"['\u2019]s$")


def salient_terms(*texts: str) -> list[str]:
    """The names, places and dates of ``texts``: capitalised words that are not
    function words, and numbers; in order of appearance, each once."""
    found: list[str] = []
    seen: set[str] = set()
    for text in texts:
        for match in _CAPITALISED.finditer(text):
            word = _POSSESSIVE.sub("", match.group(0)).rstrip("'\u2019-")
            if not word or word.lower() in _NOT_NAMES:
                continue
            if word.lower() not in seen:
                seen.add(word.lower())
                found.append(word)
        for match in _NUMBER.finditer(text):
            word = match.group(0).rstrip(".:/-")
            if word.lower() not in seen:
                seen.add(word.lower())
                found.append(word)
    return found


def appears(term: str, text: str) -> bool:
    """Whether ``term`` is in ``text`` as whole words, ignoring case."""
    pattern = r"(?<!\w)" + re.escape(term) + r"(?!\w)"
    return re.search(pattern, text, re.IGNORECASE) is not None


def turn_text(speaker: str | None, content: str) -> str:
    """A cited turn as the check reads it: its speaker, then what was said."""
    return f"{speaker}: {content}" if speaker else content


def missing_terms(subject: str, value: str, evidence: Iterable[str]) -> list[str]:
    """The names, places and dates of a fact (``subject``, ``value``) that do
    not appear word for word in any of the ``evidence`` texts; empty when the
    fact is supported."""
    texts = list(evidence)
    return [t for t in salient_terms(subject, value)
            if not any(appears(t, text) for text in texts)]


@dataclass(frozen=True)
class Unsupported:
    fact_id: int
    subject: str
    key: str
    missing: tuple[str, ...]  # the terms no cited turn contains


def _cited(store: Store, provenance: str) -> tuple[list[int], list[int]]:
    try:
        refs: Any = json.loads(provenance or "[]")
    except ValueError:
        return [], []
    turns: list[int] = []
    episodes: list[int] = []
    for ref in refs if isinstance(refs, list) else []:
        if not isinstance(ref, str):
            continue
        kind, _, number = ref.partition(":")
        if number.isascii() and number.isdigit():
            if kind == "turn":
                turns.append(int(number))
            elif kind == "episode":
                episodes.append(int(number))
    return turns, episodes


def unsupported_facts(store: Store) -> list[Unsupported]:
    """Stored facts whose names, places or dates are missing from the turns
    they cite (their ``turn:`` refs, or, with none, the turns their
    ``episode:`` refs cite).

    A fact that cites nothing (typed with ``reverie remember``) or whose cited
    turns are all gone (pruned, forgotten) cannot be checked and is not
    listed."""
    out: list[Unsupported] = []
    for fact in store.rows("SELECT id, subject, key, value, provenance FROM facts ORDER BY id"):
        turns, episodes = _cited(store, fact["provenance"])
        if not turns and episodes:
            marks = ",".join("?" * len(episodes))
            turns = [r["transcript_id"] for r in store.rows(
                f"SELECT transcript_id FROM episode_citations WHERE episode_id IN ({marks})",
                episodes)]
        if not turns:
            continue
        marks = ",".join("?" * len(turns))
        evidence = [turn_text(r["speaker"], r["content"]) for r in store.rows(
            f"SELECT speaker, content FROM transcript WHERE id IN ({marks})", turns)]
        if not evidence:
            continue
        missing = missing_terms(fact["subject"], fact["value"], evidence)
        if missing:
            out.append(Unsupported(fact["id"], fact["subject"], fact["key"], tuple(missing)))
    return out
