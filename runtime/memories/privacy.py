"""Privacy in a shared home: the sensitive tier, and whose memory each one is.

A memory (a turn, an episode, a fact) is **sensitive** (column ``sensitive``
= 1: codes, PINs, passwords, health, money) when

- the user says so: ``reverie remember "…" --sensitive``, or ``reverie
  sensitive REF`` (``--off`` to take it back), ``POST
  /v1/memories/{ref}/sensitive`` (``/not-sensitive``): :func:`mark`, through
  the actor that owns the ref and the store's logged writes;
- extraction proposes it: a fact of a kind configured ``sensitive = true``
  (``configs/fact_kinds.toml``: ``health``, ``finance``, ``credential``), or
  one whose words the facts job's rules read as a code, a password, health or
  money (:func:`proposed`);
- it comes from a sensitive memory: an episode citing a sensitive turn, or
  rolling up a sensitive episode, and a fact whose provenance names a sensitive
  turn are sensitive too (:func:`episode_marks`, :func:`fact_marks`); a reply
  that was given a sensitive memory is sensitive (the Turns actor): in a
  channel's history it is its asker's; recall never hands it out
  (:func:`recallable`: the transcript keeps no owner for a reply).

``person`` is whose memory it is: an episode's is the one speaker of the
people's turns it cites (none when they are several or some have no speaker);
a fact's is the one speaker of the turns its provenance names, or ``reverie
remember --person NAME``; a turn's is its speaker when the user said it.
None is the household's. Names compare case-insensitively.

The rules:

- **Scoping** (``reverie recall --person NAME``, ``Recall(person=...)``): a
  person's memories plus the household's (person None); other people's are
  left out (:func:`in_scope`).
- **Who may be given a sensitive memory** (:func:`may_use`): a known speaker
  (one of ``household.people``, or a person ``[mqtt.people]`` maps a sensor
  onto) gets their own sensitive memories and the household's; nobody gets
  another person's. With no speaker at all, a typed channel (``spoken =
  false``) counts as the household's own device: it gets the household's
  sensitive memories, never a person's. On a spoken channel (``spoken =
  true``: ``voice``) an unknown speaker (none, or a name that is not one of
  the household's people) gets no sensitive memory at all: they are never
  read aloud to a stranger.
- **Every way out** answers an audience, not only a turn: the HTTP server's
  REST routes, chat routes and MCP tools give a caller bound to an audience
  (a token of ``[http.tokens]``, an OAuth client) only what :func:`may_use`
  and :func:`recallable` allow it (``actors/http/audience.py``); the admin
  token and the ``reverie`` commands are the household's administrator.
- **Rollback** never loosens a mark (``runtime/store/rollback.py``): a
  ``sensitive`` mark or an owner set since is kept.
- **Generated artefacts** (the portrait, digests, the dmn pass, patterns,
  the research job's web queries, a channel's continuity summary) read only
  rows with :data:`SHAREABLE`.
- The offline provider never quotes a sensitive memory
  (``runtime.llm.providers.LLMRequest.sensitive``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from runtime.config import ChannelSettings, Settings
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

TABLES: dict[str, str] = {"turn": "transcript", "episode": "episodes", "fact": "facts"}
# SQL: the rows a generated artefact (portrait, digest, dmn, patterns) may read
SHAREABLE = "sensitive = 0"
# ChangeMemory's changes that set and clear the mark
MARK = "sensitive"
UNMARK = "not_sensitive"


def person_key(name: str | None) -> str | None:
    """A person's name as compared: case-folded, single spaces; None when empty."""
    if name is None:
        return None
    key = " ".join(name.split()).casefold()
    return key or None


def clean_person(name: str | None) -> str | None:
    """A person's name as stored: single spaces, None when empty."""
    if name is None:
        return None
    return " ".join(name.split()) or None


# -- who is listening ------------------------------------------------------------


@dataclass(frozen=True)
class Audience:
    """Who a turn's answer goes to: the speaker (None: not said), whether they
    are one of the household's known people, whether the channel speaks aloud."""

    speaker: str | None
    known: bool
    spoken: bool


def known_people(settings: Settings) -> set[str]:
    """The household's people (compared keys): ``household.people`` and the
    people ``[mqtt.people]`` maps sensors onto."""
    names = [*settings.household.people, *settings.mqtt.people.values()]
    return {k for k in (person_key(n) for n in names) if k}


def audience(settings: Settings, channel: ChannelSettings, speaker: str | None) -> Audience:
    key = person_key(speaker)
    return Audience(speaker=key, known=key is not None and key in known_people(settings),
                    spoken=channel.spoken)


def may_use(who: Audience, sensitive: bool, person: str | None) -> bool:
    """Whether a memory may be given to the model answering ``who`` (see the
    module docstring)."""
    if not sensitive:
        return True
    owner = person_key(person)
    if who.known:
        return owner is None or owner == who.speaker
    if who.speaker is None and not who.spoken:
        return owner is None  # the household's own typed channel
    return False


class Marked(Protocol):
    """A recalled memory: its sensitivity and owner."""

    @property
    def sensitive(self) -> bool: ...
    @property
    def person(self) -> str | None: ...


M = TypeVar("M", bound=Marked)


def for_audience(items: Sequence[M], who: Audience) -> list[M]:
    """The memories of ``items`` that may be given to the model answering ``who``."""
    kept = [m for m in items if may_use(who, m.sensitive, m.person)]
    if len(kept) < len(items):
        log.info("privacy: %d sensitive memories withheld (speaker known: %s, spoken: %s)",
                 len(items) - len(kept), who.known, who.spoken)
    return kept


def in_scope(scope: str | None, person: str | None) -> bool:
    """Whether a memory of ``person`` belongs to a recall scoped to ``scope``:
    that person's own and the household's (None). No scope: everything."""
    if scope is None:
        return True
    owner = person_key(person)
    return owner is None or owner == person_key(scope)


def row_person(kind: str, row: Row) -> str | None:
    """Whose memory a stored row is: a person's turn is its speaker's (the
    assistant's are the household's); episodes and facts carry ``person``."""
    if kind == "turn":
        return row.get("speaker") if row.get("role") == "user" else None
    return row.get("person")


# -- marking ---------------------------------------------------------------------


def mark(store: Store, kind: str, item_id: int, sensitive: bool, writer: str) -> Row:
    """Set or clear the sensitive mark of one memory (a logged write)."""
    table = TABLES.get(kind)
    if table is None:
        raise ValueError(f"unknown memory kind {kind!r}: expected turn, episode or fact")
    row = store.update(writer, table, item_id, {"sensitive": int(sensitive)})
    log.info("memory %s:%d marked %s", kind, item_id,
             "sensitive" if sensitive else "not sensitive")
    return row


def _turns(store: Store, ids: Sequence[int]) -> list[Row]:
    out: list[Row] = []
    for start in range(0, len(ids), 500):
        part = list(ids[start:start + 500])
        marks = ",".join("?" for _ in part)
        out.extend(store.rows(f"SELECT id, role, speaker, sensitive FROM transcript"
                              f" WHERE id IN ({marks})", part))
    return out


def _one_speaker(turns: Iterable[Row]) -> str | None:
    """The one speaker of the people's turns, or None (several, or one unnamed)."""
    people = [t for t in turns if t["role"] == "user"]
    names = {person_key(t["speaker"]) for t in people}
    if len(names) != 1 or None in names:
        return None
    return clean_person(people[0]["speaker"])


def episode_marks(store: Store, cites: Sequence[int], children: Sequence[int],
                  sensitive: bool, person: str | None) -> tuple[bool, str | None]:
    """An episode's sensitivity and owner: sensitive when it says so, or cites a
    sensitive turn, or rolls up a sensitive episode; its person as given, else
    the one speaker of the turns it cites, else the one person of its children."""
    turns = _turns(store, sorted(set(cites)))
    kids: list[Row] = []
    if children:
        marks = ",".join("?" for _ in children)
        kids = store.rows(f"SELECT sensitive, person FROM episodes WHERE id IN ({marks})",
                          list(children))
    sensitive = (sensitive or any(t["sensitive"] for t in turns)
                 or any(k["sensitive"] for k in kids))
    if person is None and turns:
        person = _one_speaker(turns)
    if person is None and kids:
        owners = {person_key(k["person"]) for k in kids}
        if len(owners) == 1 and None not in owners:
            person = clean_person(kids[0]["person"])
    return sensitive, clean_person(person)


def cites_sensitive(store: Store, turn_ids: Sequence[int]) -> bool:
    """Whether any of these transcript rows is sensitive."""
    return any(t["sensitive"] for t in _turns(store, sorted(set(turn_ids))))


def provenance_turns(provenance: Iterable[str]) -> list[int]:
    return sorted({int(r[5:]) for r in provenance
                   if r.startswith("turn:") and r[5:].isascii() and r[5:].isdigit()})


def fact_marks(store: Store, provenance: Sequence[str], sensitive: bool,
               person: str | None, kind_sensitive: bool) -> tuple[bool, str | None]:
    """A fact's sensitivity and owner: sensitive when it says so, when its kind
    is configured sensitive, or when a turn of its provenance is; its person as
    given, else the one speaker of those turns."""
    turns = _turns(store, provenance_turns(provenance))
    sensitive = sensitive or kind_sensitive or any(t["sensitive"] for t in turns)
    if person is None and turns:
        person = _one_speaker(turns)
    return sensitive, clean_person(person)


# -- what extraction proposes -----------------------------------------------------

Category = Literal["credential", "health", "money"]

_PATTERNS: tuple[tuple[Category, re.Pattern[str]], ...] = (
    ("credential", re.compile(
        r"\b(?:pin|pins|passcode|password|passwords|passphrase|pass word|combination|"
        r"(?:alarm|door|gate|garage|safe|lock|wifi|wi-fi|access|security|entry|locker|"
        r"bank|card)\s+codes?|code\s+(?:for|to)\s+the|social security|ssn|"
        r"passport number|account number|iban|sort code|routing number)\b", re.I)),
    ("health", re.compile(
        r"\b(?:diagnos\w*|medication|medicine|meds|prescription|prescribed|dose|dosage|"
        r"allerg\w*|diabet\w*|asthma|cancer|tumou?r|chemo\w*|blood pressure|cholesterol|"
        r"insulin|therapy|therapist|psychiatr\w*|depression|anxiety|pregnan\w*|"
        r"surgery|disease|illness|symptoms?|hospitali[sz]ed|blood test|hiv|std|sti|ivf|"
        r"miscarriage|(?:doctor'?s?|gp|hospital|clinic|dentist'?s?) appointment)\b", re.I)),
    ("money", re.compile(
        r"\b(?:salary|salaries|income|wage|wages|paycheck|payslip|debt|debts|loan|loans|"
        r"mortgage|overdraft|credit card|credit score|bank balance|savings|pension|"
        r"tax return|taxes|bankrupt\w*|owe|owes|owed|investments|net worth|rent is)\b",
        re.I)),
)


def proposed(*texts: str) -> Category | None:
    """What extraction reads a fact's words as, when sensitive: a code or
    password, health, or money; None otherwise. Deterministic word rules (key
    words in the fact's key or value), honest about missing paraphrases."""
    words = " ".join(t.replace("_", " ") for t in texts)
    for category, pattern in _PATTERNS:
        if pattern.search(words):
            return category
    return None


class SaidTurn(Protocol):
    """A turn of the recent history (``actors.messages.TurnRow``)."""

    @property
    def role(self) -> str: ...
    @property
    def speaker(self) -> str | None: ...
    @property
    def sensitive(self) -> bool: ...


T = TypeVar("T", bound=SaidTurn)


def history_for_audience(turns: Sequence[T], who: Audience) -> list[T]:
    """The turns of a channel's recent history (oldest first) that may go into
    the prompt answering ``who``: a sensitive turn only under :func:`may_use`.
    A sensitive reply is owned by the speaker of the turn it answered (the
    last user turn before it); with none in the history it is left out."""
    kept: list[T] = []
    asker: str | None = None
    asked = False
    for t in turns:
        if t.role == "user":
            asker, asked = t.speaker, True
            owner = t.speaker
        else:
            owner = asker
            if t.sensitive and not asked:
                continue  # whose it is is not known
        if may_use(who, t.sensitive, owner):
            kept.append(t)
    return kept


def recallable(kind: str, row: Row) -> bool:
    """Whether recall may hand a row out at all: a reply that was given a
    sensitive memory is not (the transcript keeps no owner for a reply; the
    memory it quoted is recalled on its own, under :func:`may_use`)."""
    return not (kind == "turn" and row.get("role") == "assistant"
                and bool(row.get("sensitive")))
