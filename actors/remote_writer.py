"""A job's writes in the actor runtime: each goes to the actor that owns its table.

:class:`RemoteWriter` satisfies ``runtime.mind.contract.MemoryWriter`` (as
:class:`runtime.memory.Memory` does in-process): ``add_episode``,
``update_thread``, ``add_mood`` and ``purge_tombstones`` go to the Episodes
actor, ``add_fact``, ``add_portrait``, ``write_digests`` and
``update_profile`` to Graph, ``compact`` and ``prune_transcript`` to
Transcript, ``expire_write_log`` to both (each drops the history of its own
tables: Transcript that of pruned turns, Episodes that of purged episodes),
``change`` to the owner of the ref's kind (``actors.common.OWNERS``, as
``reverie forget`` does), through the typed clients, so the single-writer rule
holds for jobs too: the janitor (the decay job) deletes through here, never on
its own connection. A refused write raises ``BadRequest`` (a muted source, an
unknown kind), as it would in-process.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.handles import CALL_TIMEOUT_S, EpisodesClient, GraphClient, TranscriptClient
from actors.messages import (
    AddEpisode,
    AddFact,
    AddMood,
    AddPortrait,
    ChangeMemory,
    Compact,
    ExpireWriteLog,
    PruneTranscript,
    PurgeTombstones,
    UpdateProfile,
    UpdateThread,
    WriteDigests,
)
from runtime.config import HUB_HOUSEHOLD
from runtime.memories.digests import DigestBatch
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.mood import MoodIn
from runtime.memories.portrait import PortraitIn
from runtime.memories.refs import Action, Ref
from runtime.memories.threads import ThreadChange
from runtime.memories.user_profile import ProfileOp


class RemoteWriter:
    def __init__(self, namespace: str, timeout_s: float = CALL_TIMEOUT_S,
                 household: str = HUB_HOUSEHOLD) -> None:
        self.episodes = EpisodesClient(namespace, timeout_s, household=household)
        self.graph = GraphClient(namespace, timeout_s, household=household)
        self.transcript = TranscriptClient(namespace, timeout_s, household=household)

    def add_episode(self, episode: EpisodeIn, writer: str) -> int:
        return self.episodes.add(AddEpisode(episode=episode, writer=writer)).episode_id

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        """Write a fact through contradiction resolution: the id now current and
        the Graph actor's whole resolution (the fact met, and for a ``keep``
        the history row of the claim that lost)."""
        written = self.graph.add(AddFact(fact=fact, writer=writer))
        return written.fact_id, Resolution(written.action, written.existing_id,
                                           written.claim_id)

    def compact(self, channel: str, summary: str, watermark: int, writer: str,
                refs: Sequence[str] = ()) -> int:
        return self.transcript.compact(Compact(channel=channel, summary=summary,
                                               watermark=watermark, writer=writer,
                                               refs=list(refs))).compaction_id

    def change(self, ref: Ref, action: Action, writer: str) -> None:
        msg = ChangeMemory(ref=str(ref), change=action, writer=writer)
        if ref.kind == "fact":
            self.graph.change(msg)
        elif ref.kind == "episode":
            self.episodes.change(msg)
        else:
            self.transcript.change(msg)

    def add_portrait(self, portrait: PortraitIn, writer: str) -> int:
        return self.graph.add_portrait(AddPortrait(portrait=portrait,
                                                   writer=writer)).portrait_id

    def write_digests(self, batch: DigestBatch, writer: str) -> list[int]:
        return self.graph.write_digests(WriteDigests(batch=batch, writer=writer)).digest_ids

    def update_profile(self, ops: Sequence[ProfileOp], source: str, writer: str) -> list[str]:
        return self.graph.update_profile(UpdateProfile(ops=list(ops), source=source,
                                                       writer=writer)).changes

    def update_thread(self, change: ThreadChange, writer: str) -> None:
        self.episodes.update_thread(UpdateThread(change=change, writer=writer))

    def add_mood(self, mood: MoodIn, writer: str) -> int:
        return self.episodes.add_mood(AddMood(mood=mood, writer=writer)).mood_id

    def purge_tombstones(self, now: float, writer: str) -> int:
        return self.episodes.purge_tombstones(PurgeTombstones(now=now, writer=writer)).purged

    def prune_transcript(self, channel: str, writer: str) -> int:
        return self.transcript.prune(PruneTranscript(channel=channel, writer=writer)).pruned

    def expire_write_log(self, now: float) -> int:
        msg = ExpireWriteLog(now=now)
        return (self.transcript.expire_write_log(msg).dropped
                + self.episodes.expire_write_log(msg).dropped)
