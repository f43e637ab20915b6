"""A "remember: ..." in a user turn, stored during the turn (expert-memory).

The turn's core (:func:`runtime.turn.prepare`) calls :meth:`TurnRemembering.store`
once the user's turn is in the transcript: what it asks to remember
(:func:`runtime.turn.remember`: :func:`runtime.mind.remember.turn_facts`, the
facts the ``facts`` job would write from it) goes to the Graph actor at once,
user-managed (no quality gating), and Recall is told. The texts stored come
back; :func:`runtime.turn.with_acknowledgement` adds them to the prompt so the
language model acknowledges them (the offline provider reads
``LLMRequest.remembered``). A temporary turn, or a source that does not feed
facts, stores nothing. When the Graph actor cannot be reached the turn goes
on: the ``facts`` job stores it later (it skips only turns whose facts exist).
"""

from __future__ import annotations

import logging
from functools import partial

from actors.handles import GraphClient, RecallClient
from actors.messages import AddFact
from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TurnIn
from runtime.time.clock import Clock
from runtime.turn import WRITER, remember

log = logging.getLogger(__name__)


class TurnRemembering:
    def __init__(self, graph: GraphClient, recall: RecallClient, profiles: MemoryProfiles,
                 clock: Clock) -> None:
        self.graph = graph
        self.recall = recall
        self.profiles = profiles
        self.clock = clock

    def store(self, turn: TurnIn, turn_id: int | None) -> list[str]:
        """Store what ``turn`` (written as ``turn_id``) asks to remember; return
        the texts stored (empty when it asks nothing)."""
        if turn_id is None:  # a temporary turn writes nothing
            return []
        stored = remember(turn, turn_id, self.profiles, self.clock,
                          partial(self._add, turn_id))
        if stored:
            try:
                self.recall.sync_some_async()
            except Exception as exc:  # the next write's notification catches up
                log.debug("cannot tell recall about the remembered fact: %s",
                          type(exc).__name__)
        return stored

    def _add(self, turn_id: int, fact: FactIn) -> None:
        """One fact to the Graph actor (its errors go back to runtime.turn.remember)."""
        written = self.graph.add(AddFact(fact=fact, writer=WRITER))
        log.info("remembered in turn", extra={"turn": f"turn:{turn_id}",
                                              "ref": f"fact:{written.fact_id}",
                                              "action": written.action})
