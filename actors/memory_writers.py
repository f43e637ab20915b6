"""The Episodes and Graph actors: the only writers of episodes and of facts."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from actors.common import (
    RECALL,
    BadRequest,
    Notifier,
    actor,
    bad_request,
    load_profiles,
    open_store,
    setup_logging,
)
from actors.messages import (
    Ack,
    AddEpisode,
    AddFact,
    ChangeFact,
    DropFromIndex,
    EpisodeWritten,
    FactWritten,
)
from runtime.config import Settings
from runtime.episodes import EpisodeService
from runtime.fact_kinds import FactKinds
from runtime.facts import GraphService

log = logging.getLogger(__name__)


class EpisodesActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "episodes")
        self.namespace = settings.runtime.namespace
        self.store = open_store(settings)
        self.episodes = EpisodeService(self.store, load_profiles(settings))
        self.notify_recall = Notifier(self.namespace, RECALL, "sync_some")

    def add(self, msg: AddEpisode) -> EpisodeWritten:
        try:
            episode_id = self.episodes.add(msg.episode, msg.writer)
        except (ValidationError, ValueError) as exc:
            raise bad_request(exc) from None
        recall = actor(RECALL, self.namespace)
        for child in msg.episode.children:  # tombstoned: out of the index
            recall.drop.remote(DropFromIndex(kind="episode", item_id=child))
        self.notify_recall()
        return EpisodeWritten(episode_id=episode_id)

    def ping(self) -> str:
        return "ok"


class GraphActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "graph")
        self.store = open_store(settings)
        self.profiles = load_profiles(settings)
        self.graph = GraphService(self.store, FactKinds.load(settings.memory.fact_kinds_file))
        self.notify_recall = Notifier(settings.runtime.namespace, RECALL, "sync_some")

    def add(self, msg: AddFact) -> FactWritten:
        """Write a fact; an unknown kind or a source that may not feed facts is refused."""
        if not self.profiles.for_source(msg.fact.source).facts:
            raise BadRequest(f"source {msg.fact.source!r} does not feed facts")
        try:
            fact_id, decision = self.graph.add(msg.fact, msg.writer)
        except (ValidationError, ValueError) as exc:  # UnknownFactKind is a ValueError
            raise bad_request(exc) from None
        self.notify_recall()
        return FactWritten(fact_id=fact_id, action=decision.action)

    def change(self, msg: ChangeFact) -> Ack:
        if self.graph.get(msg.fact_id) is None:
            raise BadRequest(f"no fact {msg.fact_id}")
        if msg.change == "disable":
            self.graph.disable(msg.fact_id, msg.writer)
        elif msg.change == "enable":
            self.graph.enable(msg.fact_id, msg.writer)
        else:
            self.graph.delete(msg.fact_id, msg.writer)
        return Ack(detail=f"fact {msg.fact_id} {msg.change}d")

    def ping(self) -> str:
        return "ok"
