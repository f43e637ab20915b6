"""The Episodes and Graph actors: the only writers of episodes and of facts (and of
the household's portrait, a summary of the facts)."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from actors.common import (
    Notifier,
    accept,
    bad_request,
    load_profiles,
    open_store,
    setup_logging,
)
from actors.handles import RecallClient, change_memory, edit_memory
from actors.messages import (
    Ack,
    AddEpisode,
    AddFact,
    AddPortrait,
    ChangeMemory,
    DropFromIndex,
    EditMemory,
    EpisodeWritten,
    FactWritten,
    PortraitWritten,
    TouchEpisodes,
)
from runtime.config import Settings
from runtime.episodes import EpisodeService
from runtime.fact_kinds import FactKinds
from runtime.facts import GraphService
from runtime.portrait import PortraitService

log = logging.getLogger(__name__)


class EpisodesActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "episodes")
        self.store = open_store(settings)
        self.episodes = EpisodeService(self.store, load_profiles(settings))
        self.recall = RecallClient(settings.runtime.namespace)
        self.notify_recall = Notifier(self.recall.sync_some_async, "recall.sync_some")

    def add(self, msg: AddEpisode) -> EpisodeWritten:
        """Write an episode; a source that may not become episodes is refused
        (the service's decision: ``MutedSource``)."""
        msg = accept(AddEpisode, msg)
        try:
            episode_id = self.episodes.add(msg.episode, msg.writer)
        except (ValidationError, ValueError) as exc:  # MutedSource is a ValueError
            raise bad_request(exc) from None
        for child in msg.episode.children:  # tombstoned: out of the index
            self.recall.drop_async(DropFromIndex(kind="episode", item_id=child))
        self.notify_recall()
        return EpisodeWritten(episode_id=episode_id)

    def touch(self, msg: TouchEpisodes) -> Ack:
        """Episodes used in an answer: their decay restarts."""
        msg = accept(TouchEpisodes, msg)
        moved = self.episodes.touch(msg.ids, self.store.clock.now() if msg.at is None
                                    else msg.at, "turns")
        return Ack(detail=f"{moved} episodes refreshed")

    def change(self, msg: ChangeMemory) -> Ack:
        """Disable, enable or forget one episode; then bring the index in step."""
        return change_memory(self.recall, self.episodes, accept(ChangeMemory, msg), "episode")

    def edit(self, msg: EditMemory) -> Ack:
        """Rewrite one episode's gist (write log, keyword index by trigger); its
        vector is dropped and the new gist embedded. The ack's detail is its ref."""
        return edit_memory(self.recall, self.episodes, accept(EditMemory, msg), "episode")

    def ping(self) -> str:
        return "ok"


class GraphActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "graph")
        self.store = open_store(settings)
        self.graph = GraphService(self.store, FactKinds.load(settings.memory.fact_kinds_file),
                                  load_profiles(settings))
        self.portraits = PortraitService(self.store)
        self.recall = RecallClient(settings.runtime.namespace)
        self.notify_recall = Notifier(self.recall.sync_some_async, "recall.sync_some")

    def add(self, msg: AddFact) -> FactWritten:
        """Write a fact; an unknown kind or a source that may not feed facts is
        refused (the service's decisions: ``UnknownFactKind``, ``MutedSource``)."""
        msg = accept(AddFact, msg)
        try:
            fact_id, decision = self.graph.add(msg.fact, msg.writer)
        except (ValidationError, ValueError) as exc:  # both are ValueErrors
            raise bad_request(exc) from None
        self.notify_recall()
        return FactWritten(fact_id=fact_id, action=decision.action)

    def add_portrait(self, msg: AddPortrait) -> PortraitWritten:
        """Append a version of the portrait (``runtime.portrait``), with the write log."""
        msg = accept(AddPortrait, msg)
        return PortraitWritten(portrait_id=self.portraits.add(msg.portrait, msg.writer))

    def change(self, msg: ChangeMemory) -> Ack:
        """Disable, enable or forget one fact; then bring the index in step."""
        return change_memory(self.recall, self.graph, accept(ChangeMemory, msg), "fact")

    def edit(self, msg: EditMemory) -> Ack:
        """Correct one fact: a new user-managed claim supersedes it (history
        kept) and is indexed at once. The ack's detail is the new fact's ref."""
        return edit_memory(self.recall, self.graph, accept(EditMemory, msg), "fact")

    def ping(self) -> str:
        return "ok"
