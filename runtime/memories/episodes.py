"""Episodes: narrative snapshots of transcript windows, in three levels.

Leaf (0) episodes are distilled from transcript windows; topic super-episodes
(1) and era digests (2) roll them up. Rolled-up children are tombstoned, kept
briefly for provenance and hard-deleted after 30 days. This module holds the
storage rules; distillation and clustering are jobs built on it.

A user can pin an episode (``seared``: it never fades) or unpin it, correct
its gist, disable it (hidden from recall and the index, reversibly)
or forget it: the row, its citations, FTS terms and vector go, and the write
log keeps only that it existed (:meth:`runtime.store.database.Store.forget`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from runtime.memories import derived, levels, privacy
from runtime.memories.cited import refuse_stale, stale
from runtime.memories.decay import MemoryLevel, tombstone_expired
from runtime.memories.duplicates import DuplicateCheck, NearDuplicate
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.threads import THREAD_WHAT_CHARS, ThreadState, thread_columns
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

WRITER = "episodes"
MAX_GIST_CHARS = 8000
MemoryRef = Annotated[str, Field(pattern=r"^(turn|episode|fact):[1-9][0-9]{0,17}$",
                                 max_length=40)]


class MutedSource(ValueError):
    """The source's memory profile does not allow this kind of memory."""


class EpisodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str = Field(min_length=1)
    source: str = Field(min_length=1)
    gist: str = Field(min_length=1, max_length=MAX_GIST_CHARS)
    level: int = Field(default=0, ge=0, le=2)
    salience: int = Field(default=5, ge=1, le=10)
    emotion: str | None = None
    memory_level: MemoryLevel = "normal"
    cites: list[int] = Field(default_factory=list)
    children: list[int] = Field(default_factory=list)
    # the other memories it is made from (runtime.memories.cited, derived): the reflection's
    # episode names the findings it tells (``fact:N``); forgetting one forgets it
    provenance: list[MemoryRef] = Field(default_factory=list, max_length=200)
    started_at: float | None = Field(default=None, allow_inf_nan=False)
    ended_at: float | None = Field(default=None, allow_inf_nan=False)
    # an open thread it holds (runtime.memories.threads): its state and the words that opened it
    thread: ThreadState | None = None
    thread_what: str | None = Field(default=None, min_length=1, max_length=THREAD_WHAT_CHARS)
    # privacy (runtime.memories.privacy): sensitive also when it cites a sensitive turn or
    # rolls up a sensitive episode; person: whose it is (None: from its turns)
    sensitive: bool = False
    person: str | None = Field(default=None, max_length=200)


def _cited(episode: EpisodeIn) -> list[str]:
    """The memories an episode is made from: its turns, the episodes it rolls up
    and its provenance."""
    return [*(f"turn:{t}" for t in episode.cites), *(f"episode:{c}" for c in episode.children),
            *episode.provenance]


class EpisodeService:
    def __init__(self, store: Store, profiles: MemoryProfiles,
                 duplicates: DuplicateCheck | None = None) -> None:
        self.store = store
        self.profiles = profiles
        self.duplicates = duplicates  # None: no near-duplicate check

    def add(self, episode: EpisodeIn, writer: str = WRITER) -> int:
        """Store an episode and its citations; tombstone the children it rolls up.
        A leaf that duplicates a live episode raises
        :class:`runtime.memories.duplicates.NearDuplicate` naming it: nothing new is written,
        but its cited turns join the kept episode's citations.

        One citing a turn, rolling up an episode, or naming in its provenance a
        memory, that is no longer stored (forgotten since the job read it) raises
        :class:`runtime.memories.cited.StaleCitation` naming it: nothing is
        written, not even as a duplicate's citations. Checked before the
        duplicate check and again inside the write transaction."""
        if not self.profiles.for_source(episode.source).episodes:
            raise MutedSource(f"source {episode.source!r} does not become episodes")
        if episode.level == 0 and episode.children:
            raise ValueError("a leaf episode has no children")
        refuse_stale(self.store, "episode", _cited(episode))
        if episode.level == 0 and self.duplicates is not None:
            duplicate = self.duplicates.episode(episode.gist)
            if duplicate is not None:  # refused; a higher level it asks for is taken
                kept = self.get(duplicate)
                if kept is not None and levels.rank(episode.memory_level) > levels.rank(
                        kept["memory_level"]):
                    self.set_level(duplicate, episode.memory_level, writer)
                if kept is not None:
                    self._merge_cites(kept, episode, writer)
                raise NearDuplicate("episode", duplicate)
        now = self.store.clock.now()
        with self.store.write_transaction():
            refuse_stale(self.store, "episode", _cited(episode))  # no gap: in the write
            sensitive, person = privacy.episode_marks(
                self.store, episode.cites, episode.children, episode.sensitive, episode.person)
            episode_id = self.store.insert(writer, "episodes", {
                "sensitive": int(sensitive), "person": person,
                "channel": episode.channel, "source": episode.source,
                "level": episode.level, "gist": episode.gist,
                "salience": episode.salience, "emotion": episode.emotion,
                "memory_level": episode.memory_level,
                "started_at": episode.started_at, "ended_at": episode.ended_at,
                "last_relevant_at": now, "created_at": now,
                "provenance": json.dumps(episode.provenance),
                **thread_columns(episode.thread, episode.thread_what, episode.ended_at, now),
            })
            for turn_id in sorted(set(episode.cites)):
                self.store.insert(writer, "episode_citations",
                                  {"episode_id": episode_id, "transcript_id": turn_id})
            for child in episode.children:
                self.store.update(writer, "episodes", child,
                                  {"parent_id": episode_id, "tombstoned_at": now})
        return episode_id

    def _merge_cites(self, kept: Row, episode: EpisodeIn, writer: str) -> None:
        """A refused leaf's turns are cited by the episode it repeats: they stay
        evidence (never pruned as uncited), and a sensitive one marks it. A
        turn forgotten since the leaf was read is not cited."""
        with self.store.write_transaction():
            have = {r["transcript_id"] for r in self.store.rows(
                "SELECT transcript_id FROM episode_citations WHERE episode_id = ?",
                (kept["id"],))}
            gone = set(stale(self.store, (f"turn:{t}" for t in episode.cites)))
            new = sorted(t for t in set(episode.cites) - have if f"turn:{t}" not in gone)
            for turn_id in new:
                self.store.insert(writer, "episode_citations",
                                  {"episode_id": kept["id"], "transcript_id": turn_id})
            sensitive, _ = privacy.episode_marks(self.store, new, [], episode.sensitive,
                                                 episode.person)
            if sensitive and not kept["sensitive"]:
                self.store.update(writer, "episodes", kept["id"], {"sensitive": 1})

    def touch(self, episode_ids: Iterable[int], at: float, writer: str = WRITER) -> int:
        """Episodes recalled and used in an answer become relevant again: their
        ``last_relevant_at`` moves to ``at`` (never back), so their decay
        restarts. Tombstoned or unknown ids are skipped; returns how many moved."""
        moved = 0
        with self.store.write_transaction():
            for episode_id in sorted(set(episode_ids)):
                row = self.get(episode_id)
                if row is None or row["tombstoned_at"] is not None \
                        or row["last_relevant_at"] >= at:
                    continue
                self.store.update(writer, "episodes", episode_id, {"last_relevant_at": at})
                moved += 1
        return moved

    def get(self, episode_id: int) -> Row | None:
        return self.store.get("episodes", episode_id)

    def set_disabled(self, episode_id: int, disabled: bool, writer: str = WRITER) -> Row:
        """Hide an episode from recall and the index (or show it again); reversible."""
        return self.store.update(writer, "episodes", episode_id, {"disabled": int(disabled)})

    def set_level(self, episode_id: int, level: MemoryLevel, writer: str = WRITER) -> Row:
        """Set an episode's memory level (``seared``: pinned, never fades). Only
        the user lowers a level (:mod:`runtime.memories.levels`: ``LevelLowered``)."""
        with self.store.write_transaction():
            row = self.get(episode_id)
            current = "normal" if row is None else str(row["memory_level"])
            level = levels.allowed(current, level, writer)
            return self.store.update(writer, "episodes", episode_id, {"memory_level": level})

    def edit(self, episode_id: int, gist: str, writer: str = WRITER) -> Row:
        """Rewrite an episode's gist (a user's correction), through the write log;
        the keyword index follows by trigger. Its vector is the caller's: drop it
        and hand the episode back to the indexer."""
        gist = gist.strip()
        if not gist:
            raise ValueError("an episode's gist cannot be empty")
        if len(gist) > MAX_GIST_CHARS:
            raise ValueError(f"an episode's gist is at most {MAX_GIST_CHARS} characters")
        return self.store.update(writer, "episodes", episode_id, {"gist": gist})

    def forget(self, episode_id: int, writer: str = WRITER) -> Row | None:
        """Delete an episode for good, content scrubbed from the write log; return
        it, or None if there was none. Its citations go with it (they hold only
        ids); episodes it rolled up lose their parent and stay tombstoned; the
        roll-up above it, whose gist was written from its gist, is forgotten with
        it (and so on up). The
        portrait versions and digests citing it are forgotten with it, and its
        gist leaves the compaction summaries and its lines the stored tool
        results (:mod:`runtime.memories.derived`)."""
        with self.store.write_transaction():
            gone = self.store.forget(writer, "episodes", episode_id)
            if gone is not None:
                parent = gone["parent_id"]
                derived.forget_citing(self.store, f"episode:{episode_id}", writer,
                                      str(gone["gist"]), None if parent is None else int(parent))
            return gone

    def citations(self, episode_id: int) -> list[int]:
        return [r[0] for r in self.store.conn.execute(
            "SELECT transcript_id FROM episode_citations WHERE episode_id = ?"
            " ORDER BY transcript_id", (episode_id,))]

    def apexes(self, channel: str, level: int) -> list[Row]:
        return self.store.rows(
            "SELECT * FROM episodes WHERE channel = ? AND level = ? AND parent_id IS NULL"
            " AND tombstoned_at IS NULL ORDER BY id", (channel, level))

    def purge_tombstones(self, writer: str = WRITER, now: float | None = None) -> int:
        """Hard-delete episodes tombstoned 30 days or more before ``now`` (None:
        the store's clock; the decay job passes its own, which is the tick's).
        A disabled episode is never purged: disabling is reversible."""
        now = self.store.clock.now() if now is None else now
        with self.store.write_transaction():
            ids = [r["id"] for r in self.store.rows(
                "SELECT id, tombstoned_at FROM episodes WHERE tombstoned_at IS NOT NULL"
                " AND disabled = 0")
                if tombstone_expired(r["tombstoned_at"], now)]
            for episode_id in ids:
                self.store.delete(writer, "episodes", episode_id)
        return len(ids)
