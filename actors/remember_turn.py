"""A "remember: ..." in a user turn, stored during the turn (expert-memory).

The Turns actor calls :meth:`TurnRemembering.store` once the user's turn is in
the transcript: what it asks to remember (:func:`runtime.mind.remember.turn_facts`,
the facts the ``facts`` job would write from it) goes to the Graph actor at
once, user-managed (no quality gating), and Recall is told. The texts stored
come back; :func:`with_acknowledgement` adds them to the prompt so the
language model acknowledges them (the offline provider reads
``LLMRequest.remembered``). A temporary turn, or a source that does not feed
facts, stores nothing. When the Graph actor cannot be reached the turn goes
on: the ``facts`` job stores it later (it skips only turns whose facts exist).
"""

from __future__ import annotations

import logging

from actors.handles import GraphClient, RecallClient
from actors.messages import AddFact
from runtime.llm.providers import ChatMessage
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TurnIn
from runtime.mind.remember import acknowledgement, turn_facts
from runtime.time.clock import Clock

log = logging.getLogger(__name__)

WRITER = "turns"


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
        facts = turn_facts({"id": turn_id, "content": turn.content, "source": turn.source,
                            "speaker": turn.speaker, "created_at": self.clock.now()},
                           self.profiles)
        stored: list[str] = []
        for fact in facts:
            try:
                written = self.graph.add(AddFact(fact=fact, writer=WRITER))
            except Exception as exc:  # the facts job stores it later
                log.warning("remember in turn %d not stored now (%s)", turn_id,
                            type(exc).__name__)
                continue
            log.info("remembered in turn", extra={"turn": f"turn:{turn_id}",
                                                  "ref": f"fact:{written.fact_id}",
                                                  "action": written.action})
            stored.append(fact.value)
        if stored:
            try:
                self.recall.sync_some_async()
            except Exception as exc:  # the next write's notification catches up
                log.debug("cannot tell recall about the remembered fact: %s",
                          type(exc).__name__)
        return stored


def with_acknowledgement(messages: list[ChatMessage], stored: list[str]) -> list[ChatMessage]:
    """``messages`` with the system message telling the model what was stored."""
    if not stored or not messages or messages[0].role != "system":
        return messages
    first = messages[0].model_copy(
        update={"content": messages[0].content + "\n\n" + acknowledgement(stored)})
    return [first, *messages[1:]]
