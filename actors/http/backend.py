"""What the HTTP server calls: the actors, through their typed clients.

:class:`Backend` is everything the HTTP parts (REST, OpenAI- and
Ollama-compatible chat, MCP, the memory page) may ask of the runtime;
:class:`ActorBackend` answers it with the same actor calls as the ``reverie``
command. The HTTP parts hold no state of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from actors.messages import (
    BrowseMemories,
    EditMemory,
    MemoryPage,
    MemoryView,
    Recall,
    Recalled,
    Status,
    TurnDelta,
    TurnReply,
    UserTurn,
)
from runtime.config import Settings

CALL_TIMEOUT_S = 120.0
# Each step of a status (the pings together, then counts, location, presence).
STATUS_TIMEOUT_S = 1.5


class Backend(Protocol):
    def turn(self, msg: UserTurn) -> TurnReply: ...
    def turn_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]: ...
    def recall(self, msg: Recall) -> Recalled: ...
    def remember(self, text: str, level: str = "normal", sensitive: bool = False,
                 person: str | None = None) -> tuple[str, str]: ...
    def change(self, ref: str, change: str) -> str: ...
    def edit(self, ref: str, text: str) -> str: ...
    def browse(self, msg: BrowseMemories) -> MemoryPage: ...
    def get(self, ref: str) -> MemoryView: ...
    def status(self) -> Status: ...


class ActorBackend:
    """The actors, through their typed clients (the same calls as ``reverie``'s commands)."""

    def __init__(self, settings: Settings, timeout_s: float = CALL_TIMEOUT_S) -> None:
        from actors.handles import GraphClient, RecallClient, TurnsClient

        ns = settings.runtime.namespace
        self.settings = settings
        self.namespace = ns
        self.timeout_s = timeout_s
        # every call is for this household: the settings' (its own store, token)
        self.household = settings.household.id
        self.turns = TurnsClient(ns, timeout_s, household=self.household)
        self.recall_client = RecallClient(ns, timeout_s, household=self.household)
        self.graph = GraphClient(ns, timeout_s, household=self.household)

    def turn(self, msg: UserTurn) -> TurnReply:
        return self.turns.process(msg)

    def turn_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]:
        """The reply as the language model writes it: text deltas, then the
        whole :class:`TurnReply` (ids, citations) once it is stored."""
        return self.turns.process_stream(msg)

    def recall(self, msg: Recall) -> Recalled:
        return self.recall_client.recall(msg)

    def remember(self, text: str, level: str = "normal", sensitive: bool = False,
                 person: str | None = None) -> tuple[str, str]:
        """An explicit "remember": a user-managed fact (as ``reverie remember``),
        at ``level`` (normal, vivid or seared; ValueError otherwise), sensitive
        or not, and whose (``person``; None: the household's)."""
        from actors.messages import AddFact
        from runtime.mind.remember import note_fact

        fact = note_fact(text, level, sensitive=sensitive, person=person)
        written = self.graph.add(AddFact(fact=fact, writer="http"))
        self.recall_client.sync()
        return f"fact:{written.fact_id}", written.action

    def change(self, ref: str, change: str) -> str:
        from actors.handles import owner
        from actors.messages import ChangeMemory
        from runtime.memories.refs import parse_ref

        parsed = str(parse_ref(ref))
        ack = owner(parsed, self.namespace, self.timeout_s, self.household).change(
            ChangeMemory(ref=parsed, change=change, writer="http"))  # type: ignore[arg-type]
        return str(ack.detail)

    def edit(self, ref: str, text: str) -> str:
        """Change what a memory says (an episode's gist; a fact, by a new claim
        that supersedes it); return the ref that now holds ``text``. A turn is
        refused (BadRequest); a ref naming nothing raises
        :class:`runtime.memories.refs.NoSuchItem`; a malformed one ValueError."""
        from actors.handles import owner
        from runtime.memories.refs import parse_ref

        parsed = str(parse_ref(ref))
        ack = owner(parsed, self.namespace, self.timeout_s, self.household).edit(
            EditMemory(ref=parsed, text=text, writer="http"))
        return str(ack.detail)

    def browse(self, msg: BrowseMemories) -> MemoryPage:
        """A page of memories (and the total) as ``msg`` asks."""
        return self.recall_client.browse(msg)

    def get(self, ref: str) -> MemoryView:
        """One memory by its ref; :class:`runtime.memories.refs.NoSuchItem` when none,
        ValueError for a malformed ref."""
        from actors.messages import ViewMemory
        from runtime.memories.refs import parse_ref

        return self.recall_client.view(ViewMemory(ref=str(parse_ref(ref))))

    def status(self) -> Status:
        from actors.status import gather_status

        # a hung actor must not hold an MCP client past Home Assistant's 10 s
        return gather_status(self.settings, timeout_s=STATUS_TIMEOUT_S)


__all__ = ["ActorBackend", "Backend", "EditMemory"]
