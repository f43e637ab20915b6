"""The data graph: typed, durable facts with validity windows.

Facts carry two timelines: ``valid_from``/``valid_to`` (when it was true in the
world) and ``recorded_at`` (when we learned it). A write with a kind outside
the closed set is rejected. A contradiction (same subject and key, another
value) closes the old fact's validity window and opens a new one; history is
never deleted by this path. Resolution is a pure function (:func:`resolve`),
testable without storage or an LLM.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.decay import MemoryLevel
from runtime.fact_kinds import FactKinds
from runtime.store import Row, Store

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


@dataclass(frozen=True)
class Resolution:
    action: Literal["insert", "reinforce", "supersede", "keep"]
    existing_id: int | None = None


def _same_value(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def resolve(current: Row | None, new: FactIn) -> Resolution:
    """Decide what a new fact does to the current fact for the same subject/key.

    - nothing current: insert;
    - same value: reinforce the current one (no new row);
    - a seared or user-managed current fact is never replaced by a weaker,
      non-user write: keep it (the new claim is dropped);
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
    def __init__(self, store: Store, kinds: FactKinds) -> None:
        self.store = store
        self.kinds = kinds

    def current(self, subject: str, key: str) -> Row | None:
        return self.store.row(
            "SELECT * FROM facts WHERE subject = ? AND key = ? AND valid_to IS NULL"
            " AND disabled = 0 ORDER BY id DESC LIMIT 1", (subject, key))

    def add(self, fact: FactIn, writer: str = WRITER) -> tuple[int, Resolution]:
        """Write a fact; returns the id of the fact now current and what happened.

        Raises :class:`runtime.fact_kinds.UnknownFactKind` for a kind outside the set."""
        self.kinds.policy(fact.kind)  # raises UnknownFactKind
        now = self.store.clock.now()
        valid_from = now if fact.valid_from is None else fact.valid_from
        with self.store.transaction():
            current = self.current(fact.subject, fact.key)
            decision = resolve(current, fact)
            if decision.action in ("reinforce", "keep"):
                assert current is not None
                if decision.action == "reinforce":
                    self.store.update(writer, "facts", current["id"], {
                        "confirmed_at": now,
                        "confidence": max(current["confidence"], fact.confidence),
                    })
                return current["id"], decision
            new_id = self.store.insert(writer, "facts", {
                "kind": fact.kind, "subject": fact.subject, "key": fact.key,
                "value": fact.value, "confidence": fact.confidence, "source": fact.source,
                "provenance": json.dumps(fact.provenance), "valid_from": valid_from,
                "recorded_at": now, "confirmed_at": now,
                "memory_level": fact.memory_level, "user_managed": int(fact.user_managed),
            })
            if decision.action == "supersede":
                assert current is not None
                self.store.update(writer, "facts", current["id"], {
                    "valid_to": max(valid_from, current["valid_from"]),
                    "superseded_by": new_id,
                })
        return new_id, decision

    def get(self, fact_id: int) -> Row | None:
        return self.store.get("facts", fact_id)

    def history(self, subject: str, key: str) -> list[Row]:
        return self.store.rows(
            "SELECT * FROM facts WHERE subject = ? AND key = ? ORDER BY valid_from, id",
            (subject, key))

    def disable(self, fact_id: int, writer: str = WRITER) -> Row:
        """Hide a fact from recall without deleting it (reversible)."""
        return self.store.update(writer, "facts", fact_id, {"disabled": 1})

    def enable(self, fact_id: int, writer: str = WRITER) -> Row:
        return self.store.update(writer, "facts", fact_id, {"disabled": 0})

    def delete(self, fact_id: int, writer: str = WRITER) -> Row | None:
        """Remove a fact for good (explicit user delete; the write log keeps the before)."""
        with self.store.transaction():
            self.store.conn.execute(
                "UPDATE facts SET superseded_by = NULL WHERE superseded_by = ?", (fact_id,))
            return self.store.delete(writer, "facts", fact_id)
