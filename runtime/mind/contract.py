"""What a background cognition job is given, and what it answers.

A job is a plain function ``JobFn = Callable[[JobContext], JobResult]`` in
``runtime/``, testable without Ray. It reads memory straight from the store
(its own connection) and writes only through ``ctx.writer``: in the actor
runtime the writer forwards to the actors that own each table (Episodes,
Graph, Transcript), in-process it is :class:`runtime.memory.Memory`; deletes
too (the janitor's purge, pruning and write-log expiry). In the actor
runtime the job's own connection may write nothing but ``job_state`` (its
bookkeeping, ``runtime.store.job_state``): ``actors.job_actor`` refuses the rest. A job
that embeds text uses ``ctx.embedder``: in the actor runtime the Recall
actor's model (:class:`actors.embedder.RemoteEmbedder`), in-process the
memory's own; only when it is None does a job load a model of its own. A job is
idempotent and resumable: it commits batch by batch, stops when
``ctx.out_of_time()`` says so, and picks up where it left off on the next run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import FallbackChain
from runtime.memories.digests import DigestBatch
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.mood import MoodIn
from runtime.memories.portrait import PortraitIn
from runtime.memories.refs import Action, Ref
from runtime.memories.threads import ThreadChange
from runtime.memories.user_profile import ProfileOp
from runtime.store.database import Store
from runtime.time.clock import Clock


class MemoryWriter(Protocol):
    """The writes a job may make; each goes to the owner of its table."""

    def add_episode(self, episode: EpisodeIn, writer: str) -> int:
        """Store an episode (its citations; the children it rolls up are tombstoned)."""
        ...

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        """Write a fact through contradiction resolution; return the id now
        current and what happened (inserted, reinforced, superseded, kept)."""
        ...

    def compact(self, channel: str, summary: str, watermark: int, writer: str,
                refs: Sequence[str] = ()) -> int:
        """Record a continuity summary of ``channel`` up to transcript row ``watermark``;
        ``refs``: the episode of each of its gists (``runtime.memories.transcript``)."""
        ...

    def change(self, ref: Ref, action: Action, writer: str) -> None:
        """Disable, enable (or delete, pin, unpin) one memory, as its owner does
        for a user: the patterns job retires a faded pattern by disabling it."""
        ...

    def add_portrait(self, portrait: PortraitIn, writer: str) -> int:
        """Store a new version of the portrait (``runtime.memories.portrait``); return its id."""
        ...

    def write_digests(self, batch: DigestBatch, writer: str) -> list[int]:
        """Add digests, prune expired ones (``runtime.memories.digests``); the ids
        of those added."""
        ...

    def update_profile(self, ops: Sequence[ProfileOp], source: str, writer: str) -> list[str]:
        """Apply profile operations all or nothing (``runtime.memories.user_profile``);
        ValueError (nothing written) for one that changes nothing."""
        ...

    def update_thread(self, change: ThreadChange, writer: str) -> None:
        """Resolve or escalate an episode's open thread (``runtime.memories.threads``)."""
        ...

    def add_mood(self, mood: MoodIn, writer: str) -> int:
        """Store a new reading of the mood (``runtime.memories.mood``); return its id."""
        ...

    # -- the janitor's deletes (the decay job, ``runtime.mind.janitor``) ------------

    def purge_tombstones(self, now: float, writer: str) -> int:
        """Hard-delete the episodes tombstoned 30 days or more before ``now``
        (the job's clock, not the owner's), never a disabled one; return how
        many went."""
        ...

    def prune_transcript(self, channel: str, writer: str) -> int:
        """Delete ``channel``'s rows at or below its compaction watermark that
        no live episode cites and that are not disabled (disabling is
        reversible); return how many went."""
        ...

    def expire_write_log(self, now: float) -> int:
        """Drop the write-log history of the transcript rows and episodes
        deleted at least the retention period before ``now``, each owner its
        own tables' (``runtime.memories.retention``); return how many
        log rows went."""
        ...


@dataclass
class JobContext:
    store: Store  # reads only; writes go through ``writer``
    writer: MemoryWriter
    llm: FallbackChain  # configured providers, then the offline one
    clock: Clock  # the household's injected clock: every timestamp comes from it
    settings: Settings
    budget_s: float = 600.0  # wall-clock time budget of one run
    embedder: Embedder | None = None  # the shared model; None: a job loads its own
    started: float = field(default_factory=time.monotonic)

    def out_of_time(self) -> bool:
        """Whether the run has used its time budget (stop after the current batch)."""
        return time.monotonic() - self.started >= self.budget_s


@dataclass(frozen=True)
class JobResult:
    items: int  # what the run did: episodes written, facts extracted, rows deleted...
    detail: str = ""  # one line for `reverie jobs`; never memory content
    more: bool = False  # stopped on its budget with work left: run again soon


JobFn = Callable[[JobContext], JobResult]
