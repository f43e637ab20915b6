"""The Episodes and Graph actors: the only writers of episodes and of facts (and of
the household's portrait, a summary of the facts; of the digests; and of the user
profile)."""

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
from actors.duplicate_finder import duplicate_check
from actors.handles import RecallClient, change_memory, edit_memory
from actors.households import serving
from actors.messages import (
    Ack,
    AddEpisode,
    AddFact,
    AddMood,
    AddPortrait,
    ChangeMemory,
    DigestsWritten,
    DropFromIndex,
    EditMemory,
    EpisodeWritten,
    ExpireWriteLog,
    FactWritten,
    MoodWritten,
    PortraitWritten,
    ProfileUpdated,
    PurgeTombstones,
    TombstonesPurged,
    TouchEpisodes,
    UpdateProfile,
    UpdateThread,
    WriteDigests,
    WriteLogExpired,
)
from runtime.config import Settings
from runtime.memories.cited import StaleCitation
from runtime.memories.digests import DigestService
from runtime.memories.duplicates import NearDuplicate
from runtime.memories.episodes import EpisodeService
from runtime.memories.facts import GraphService
from runtime.memories.mood import MoodService
from runtime.memories.portrait import PortraitService
from runtime.memories.retention import EPISODE_HISTORY, expire_write_log
from runtime.memories.threads import ThreadService
from runtime.memories.user_profile import ProfileService
from runtime.store.fact_kinds import FactKinds

log = logging.getLogger(__name__)


class HouseholdEpisodes:
    """The Episodes actor's work for one household (``actors/households.py``)."""

    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "episodes")
        self.store = open_store(settings)
        self.recall = RecallClient(settings.runtime.namespace, household=settings.household.id)
        self.episodes = EpisodeService(self.store, load_profiles(settings),
                                       duplicate_check(self.store, self.recall, settings))
        self.notify_recall = Notifier(self.recall.sync_some_async, "recall.sync_some")
        self.threads = ThreadService(self.store)
        self.moods = MoodService(self.store)

    def add(self, msg: AddEpisode) -> EpisodeWritten:
        """Write an episode; a source that may not become episodes is refused
        (the service's decision: ``MutedSource``), and so is one citing a memory
        forgotten since the job read it (``CitesForgotten``, a BadRequest naming
        the refs: ``runtime.memories.cited``)."""
        msg = accept(AddEpisode, msg)
        try:
            episode_id = self.episodes.add(msg.episode, msg.writer)
        except NearDuplicate as refused:  # logged by the check, with its ref
            return EpisodeWritten(episode_id=refused.item_id, duplicate=True)
        except (ValidationError, ValueError) as exc:  # MutedSource is a ValueError
            raise bad_request(exc) from None
        for child in msg.episode.children:  # tombstoned: out of the index
            self.recall.drop_async(DropFromIndex(kind="episode", item_id=child))
        self.notify_recall()
        return EpisodeWritten(episode_id=episode_id)

    def update_thread(self, msg: UpdateThread) -> Ack:
        """Resolve or escalate an episode's open thread (``runtime.memories.threads``
        decides what changes); no open thread there is a ``BadRequest``."""
        msg = accept(UpdateThread, msg)
        try:
            row = self.threads.apply(msg.change, msg.writer)
        except ValueError as exc:
            raise bad_request(exc) from None
        return Ack(detail="unchanged" if row is None else f"episode:{row['id']}")

    def add_mood(self, msg: AddMood) -> MoodWritten:
        """Append a reading of the mood (``runtime.memories.mood``), with the write log."""
        msg = accept(AddMood, msg)
        return MoodWritten(mood_id=self.moods.add(msg.mood, msg.writer))

    def purge_tombstones(self, msg: PurgeTombstones) -> TombstonesPurged:
        """Hard-delete the episodes tombstoned 30 days or more before the
        message's ``now`` (the decay job's; None: this actor's clock). Their
        citations go by cascade; their index entries are left to recall, which
        joins every hit against the rows."""
        msg = accept(PurgeTombstones, msg)
        purged = self.episodes.purge_tombstones(msg.writer, msg.now)
        if purged:
            log.info("purged %d tombstoned episodes", purged)
        return TombstonesPurged(purged=purged)

    def expire_write_log(self, msg: ExpireWriteLog) -> WriteLogExpired:
        """Drop the write-log history of purged episodes past retention."""
        msg = accept(ExpireWriteLog, msg)
        return WriteLogExpired(dropped=expire_write_log(self.store, msg.now, EPISODE_HISTORY))

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

    def close(self) -> None:
        self.notify_recall.close()
        self.store.close()

    def ping(self) -> str:
        return "ok"


class HouseholdGraph:
    """The Graph actor's work for one household (``actors/households.py``)."""

    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "graph")
        self.store = open_store(settings)
        self.recall = RecallClient(settings.runtime.namespace, household=settings.household.id)
        self.graph = GraphService(self.store, FactKinds.load(settings.memory.fact_kinds_file),
                                  load_profiles(settings),
                                  duplicate_check(self.store, self.recall, settings))
        self.portraits = PortraitService(self.store)
        self.digests = DigestService(self.store)
        self.profile = ProfileService(self.store)
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
        return FactWritten(fact_id=fact_id, action=decision.action,
                           existing_id=decision.existing_id, claim_id=decision.claim_id)

    def add_portrait(self, msg: AddPortrait) -> PortraitWritten:
        """Append a version of the portrait (``runtime.memories.portrait``), with the
        write log; one citing a memory forgotten since the job read it is a
        ``CitesForgotten`` (``runtime.memories.cited``), as for episodes, facts and
        digests."""
        msg = accept(AddPortrait, msg)
        try:
            return PortraitWritten(portrait_id=self.portraits.add(msg.portrait, msg.writer))
        except StaleCitation as exc:  # cites a memory forgotten since it was read
            raise bad_request(exc) from None

    def write_digests(self, msg: WriteDigests) -> DigestsWritten:
        """Add digests and prune expired ones (``runtime.memories.digests``), with the write log."""
        msg = accept(WriteDigests, msg)
        try:
            return DigestsWritten(digest_ids=self.digests.write(msg.batch, msg.writer))
        except ValueError as exc:  # a monthly to prune, an unknown id, a stale citation
            raise bad_request(exc) from None

    def update_profile(self, msg: UpdateProfile) -> ProfileUpdated:
        """Apply profile operations all or nothing (``runtime.memories.user_profile``)."""
        msg = accept(UpdateProfile, msg)
        try:
            return ProfileUpdated(changes=self.profile.apply(msg.ops, msg.source, msg.writer))
        except ValueError as exc:  # an operation on nothing, a bad tag: nothing written
            raise bad_request(exc) from None

    def change(self, msg: ChangeMemory) -> Ack:
        """Disable, enable or forget one fact; then bring the index in step."""
        return change_memory(self.recall, self.graph, accept(ChangeMemory, msg), "fact")

    def edit(self, msg: EditMemory) -> Ack:
        """Correct one fact: a new user-managed claim supersedes it (history
        kept) and is indexed at once. The ack's detail is the new fact's ref."""
        return edit_memory(self.recall, self.graph, accept(EditMemory, msg), "fact")

    def ping(self) -> str:
        return "ok"

    def close(self) -> None:
        self.notify_recall.close()
        self.store.close()


# The actors: the households each serves (actors/households.py).
EpisodesActor = serving(HouseholdEpisodes, "EpisodesActor")
GraphActor = serving(HouseholdGraph, "GraphActor")
