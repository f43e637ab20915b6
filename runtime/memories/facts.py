"""The data graph: typed, durable facts with validity windows.

Facts carry two timelines: ``valid_from``/``valid_to`` (when it was true in the
world) and ``recorded_at`` (when we learned it). A write with a kind outside
the closed set, or from a source whose profile does not feed facts, is
refused. Resolution is a pure function (:func:`resolve`), testable without
storage or an LLM; :meth:`GraphService.add` applies it. The rules the graph
keeps, whatever the sequence of writes, disables and deletes:

- **One current fact per subject and key.** The current fact is the one with an
  open window, disabled or not: disabling hides a fact from recall, it does not
  take it out of resolution, so a later write reinforces or supersedes it.
- **Windows never overlap.** A new window starts no earlier than the subject
  and key's recorded history ends; a contradiction closes the old window where
  the new one starts.
- **History never drops a claim.** A contradiction that wins closes the old
  window. One that loses (lower confidence, or against a seared or
  user-managed fact) is still recorded: an empty window (``valid_to =
  valid_from``: never in force) with ``superseded_by`` naming the fact that
  beat it. Only an explicit :meth:`GraphService.delete` removes history.
- **Confidence is the mean of the claims.** Restating a fact counts one more
  claim (``claims``) and moves its confidence to the mean confidence of every
  claim that asserted it. A single strong claim therefore never pins a fact
  at its confidence: weaker restatements pull it down, and a later
  contradiction is weighed against what the evidence as a whole supports
  (the old ``max`` ratchet let one 0.9 claim silently drop every later
  contradiction below 0.9).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.memories import derived, levels, privacy
from runtime.memories.cited import refuse_stale
from runtime.memories.decay import MemoryLevel
from runtime.memories.duplicates import DuplicateCheck
from runtime.memories.episodes import MutedSource
from runtime.memories.profiles import MemoryProfiles
from runtime.store.database import Row, Store
from runtime.store.fact_kinds import FactKinds

log = logging.getLogger(__name__)

WRITER = "graph"


class FactIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(min_length=1)
    subject: str = Field(min_length=1, max_length=500)
    key: str = Field(min_length=1, max_length=200)
    value: str = Field(min_length=1, max_length=4000)
    confidence: float = Field(default=0.7, ge=0.0, le=1.0)
    source: str = Field(default="user", min_length=1)
    provenance: list[str] = Field(default_factory=list)
    valid_from: float | None = Field(default=None, allow_inf_nan=False)
    memory_level: MemoryLevel = "normal"
    user_managed: bool = False
    # privacy (runtime.memories.privacy): sensitive also for a sensitive kind or turn of
    # its provenance; person: whose it is (None: from its provenance's speaker)
    sensitive: bool = False
    person: str | None = Field(default=None, max_length=200)


@dataclass(frozen=True)
class Resolution:
    # duplicate: refused as a near-duplicate of existing_id (runtime.memories.duplicates)
    action: Literal["insert", "reinforce", "supersede", "keep", "duplicate"]
    existing_id: int | None = None
    # For "keep": the history row that records the claim that lost.
    claim_id: int | None = None


def _same_value(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def resolve(current: Row | None, new: FactIn) -> Resolution:
    """Decide what a new fact does to the current fact for the same subject/key.

    - nothing current (disabled counts as current): insert;
    - same value: reinforce the current one (no new row);
    - a seared or user-managed current fact is never replaced by a non-user
      write, nor any fact by a non-user claim of lower confidence: keep it
      (the claim that lost is recorded as history, see the module docstring);
    - otherwise a different value supersedes: the old window closes."""
    if current is None:
        return Resolution("insert")
    if _same_value(current["value"], new.value):
        return Resolution("reinforce", current["id"])
    protected = current["memory_level"] == "seared" or bool(current["user_managed"])
    if protected and not new.user_managed:
        return Resolution("keep", current["id"])
    if new.confidence < current["confidence"] and not new.user_managed:
        return Resolution("keep", current["id"])
    return Resolution("supersede", current["id"])


class GraphService:
    def __init__(self, store: Store, kinds: FactKinds, profiles: MemoryProfiles,
                 duplicates: DuplicateCheck | None = None) -> None:
        self.store = store
        self.kinds = kinds
        self.profiles = profiles
        self.duplicates = duplicates  # None: no near-duplicate check

    def current(self, subject: str, key: str) -> Row | None:
        """The fact with an open window for this subject and key, disabled or not."""
        return self.store.row(
            "SELECT * FROM facts WHERE subject = ? AND key = ? AND valid_to IS NULL"
            " ORDER BY id DESC LIMIT 1", (subject, key))

    def _start(self, fact: FactIn, now: float) -> float:
        """Where the new claim's window starts: when it says, but never inside
        the subject and key's recorded history."""
        wanted = now if fact.valid_from is None else fact.valid_from
        history_end = self.store.scalar(
            "SELECT max(coalesce(valid_to, valid_from)) FROM facts"
            " WHERE subject = ? AND key = ?", (fact.subject, fact.key))
        return wanted if history_end is None else max(wanted, float(history_end))

    def add(self, fact: FactIn, writer: str = WRITER) -> tuple[int, Resolution]:
        """Write a fact; returns the id of the fact now current and what happened.

        Raises :class:`runtime.store.fact_kinds.UnknownFactKind` for a kind outside the
        set and :class:`runtime.memories.episodes.MutedSource` for a source whose profile
        does not feed facts (both are ValueErrors); and
        :class:`runtime.memories.cited.StaleCitation` (a ValueError too) for one
        whose provenance names a turn, episode or fact no longer stored
        (forgotten since the job read it), checked inside the write
        transaction: nothing is written, no claim counted."""
        policy = self.kinds.policy(fact.kind)  # raises UnknownFactKind
        if not self.profiles.for_source(fact.source).facts:
            raise MutedSource(f"source {fact.source!r} does not feed facts")
        if self.duplicates is not None and self.current(fact.subject, fact.key) is None:
            duplicate = self.duplicates.fact(fact.subject, fact.key, fact.value)
            if duplicate is not None:
                return duplicate, self._duplicate(duplicate, fact, writer)
        now = self.store.clock.now()
        with self.store.write_transaction():
            refuse_stale(self.store, "fact", fact.provenance)  # no gap: in the write
            current = self.current(fact.subject, fact.key)
            decision = resolve(current, fact)
            if decision.action == "reinforce":
                assert current is not None
                self._reinforce(current, fact, now, writer)
                return current["id"], decision
            start = self._start(fact, now)
            values: dict[str, object] = {
                "kind": fact.kind, "subject": fact.subject, "key": fact.key,
                "value": fact.value, "confidence": fact.confidence, "source": fact.source,
                "provenance": json.dumps(fact.provenance), "valid_from": start,
                "recorded_at": now, "confirmed_at": now,
                "memory_level": fact.memory_level, "user_managed": int(fact.user_managed),
            }
            sensitive, values["person"] = privacy.fact_marks(
                self.store, fact.provenance, fact.sensitive, fact.person, policy.sensitive)
            values["sensitive"] = int(sensitive)
            if decision.action == "supersede" and not levels.is_user(writer):
                assert current is not None  # the system never lowers the level it replaces
                values["memory_level"] = levels.higher(current["memory_level"], fact.memory_level)
            if decision.action == "keep":  # the claim lost: history, never in force
                assert current is not None
                claim_id = self.store.insert(writer, "facts", {
                    **values, "valid_to": start, "superseded_by": current["id"]})
                return current["id"], Resolution("keep", current["id"], claim_id)
            new_id = self.store.insert(writer, "facts", values)
            if decision.action == "supersede":
                assert current is not None
                self.store.update(writer, "facts", current["id"],
                                  {"valid_to": start, "superseded_by": new_id})
        return new_id, decision

    def _reinforce(self, current: Row, fact: FactIn, now: float, writer: str) -> None:
        claims = int(current["claims"])
        mean = (current["confidence"] * claims + fact.confidence) / (claims + 1)
        self.store.update(writer, "facts", current["id"], {
            "confirmed_at": now, "claims": claims + 1,
            "confidence": min(1.0, max(0.0, mean)),
            # a sensitive restatement makes it sensitive; never the other way
            "sensitive": int(bool(current["sensitive"]) or fact.sensitive
                             or self.kinds.policy(fact.kind).sensitive),
        })

    def get(self, fact_id: int) -> Row | None:
        return self.store.get("facts", fact_id)

    def history(self, subject: str, key: str) -> list[Row]:
        return self.store.rows(
            "SELECT * FROM facts WHERE subject = ? AND key = ? ORDER BY valid_from, id",
            (subject, key))

    def set_disabled(self, fact_id: int, disabled: bool, writer: str = WRITER) -> Row:
        """Hide a fact from recall without deleting it, or bring it back
        (reversible). It stays in resolution: a disabled current fact is still
        the current fact."""
        return self.store.update(writer, "facts", fact_id, {"disabled": int(disabled)})

    def disable(self, fact_id: int, writer: str = WRITER) -> Row:
        return self.set_disabled(fact_id, True, writer)

    def enable(self, fact_id: int, writer: str = WRITER) -> Row:
        return self.set_disabled(fact_id, False, writer)

    def _duplicate(self, fact_id: int, fact: FactIn, writer: str) -> Resolution:
        """A near-duplicate is refused (nothing new is written); only a higher
        level it asks for is taken by the fact it duplicates (levels only rise)."""
        row = self.get(fact_id)
        if row is not None and levels.rank(fact.memory_level) > levels.rank(row["memory_level"]):
            self.set_level(fact_id, fact.memory_level, writer)
        return Resolution("duplicate", fact_id)

    def set_level(self, fact_id: int, level: MemoryLevel, writer: str = WRITER) -> Row:
        """Set a fact's memory level (``seared``: pinned, never fades, and never
        replaced by a non-user write). Only the user lowers a level
        (:mod:`runtime.memories.levels`: ``LevelLowered``)."""
        with self.store.write_transaction():
            row = self.get(fact_id)
            current = "normal" if row is None else str(row["memory_level"])
            level = levels.allowed(current, level, writer)
            return self.store.update(writer, "facts", fact_id, {"memory_level": level})

    def edit(self, fact_id: int, value: str, writer: str = WRITER) -> tuple[int, Resolution]:
        """A user's correction of the current fact ``fact_id``: a new user-managed
        claim (source ``user``, confidence 1) for the same kind, subject and key,
        keeping its memory level. It supersedes the fact (whose window closes:
        history kept), or reinforces it when the value is the same. Returns what
        :meth:`add` returns: the id of the fact now current and the decision.

        A fact that is history already (its window closed) is refused: editing
        it would supersede another claim than the one shown."""
        value = value.strip()
        if not value:
            raise ValueError("a fact's value cannot be empty")
        with self.store.write_transaction():
            row = self.get(fact_id)
            if row is None:
                raise ValueError(f"no fact {fact_id}")
            if row["valid_to"] is not None:
                later = row["superseded_by"]
                raise ValueError(
                    f"fact {fact_id} is history, no longer current"
                    + (f" (superseded by fact:{later}); edit that one" if later else ""))
            return self.add(FactIn(kind=row["kind"], subject=row["subject"], key=row["key"],
                                   value=value, confidence=1.0, source="user",
                                   memory_level=row["memory_level"], user_managed=True,
                                   sensitive=bool(row["sensitive"]), person=row["person"]),
                            writer)

    def forget(self, fact_id: int, writer: str = WRITER) -> Row | None:
        """Remove a fact for good (explicit user delete): the row goes, and the
        write log keeps only that it existed (:meth:`Store.forget`). Facts it
        superseded keep their closed windows; none is reopened, since deleting a
        claim does not make an older one true again. The portrait versions citing
        it are forgotten with it, and its lines leave the stored tool results
        (:mod:`runtime.memories.derived`)."""
        with self.store.write_transaction():
            for row in self.store.rows(
                    "SELECT id FROM facts WHERE superseded_by = ?", (fact_id,)):
                self.store.update(writer, "facts", row["id"], {"superseded_by": None})
            gone = self.store.forget(writer, "facts", fact_id)
            if gone is not None:  # the portrait versions made from it go too
                derived.forget_citing(self.store, f"fact:{fact_id}", writer,
                                      str(gone["value"]))
            return gone

    delete = forget
