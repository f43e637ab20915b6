"""The public runtime API over one store: write memory, recall it.

:class:`Memory` wires the services of ``runtime/`` together for one data
directory, in one process: the SQLite store, the transcript, episodes, the
fact graph, the embedder, the vector indexes and recall. The actor runtime
(``actors/``) holds the same services one per actor; benchmarks, importers and
tests use :class:`Memory` directly, and run background jobs on it with
:meth:`Memory.job_context` (the memory is the jobs' writer and lends them its
embedder).

Writes commit their rows first, then :class:`runtime.recall.indexing.Indexer`
embeds and indexes what is new. A crash in between loses nothing: the rows
are durable and the next sync (at the latest on the next open) embeds them.
:meth:`Memory.change` disables, enables or forgets an item, keeping the vector
index in step.

:meth:`Memory.turn` answers a conversation turn in process: the turn's core
(:mod:`runtime.turn`, the same flow the Turns actor runs) over this memory's
services.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

from runtime.config import Settings
from runtime.llm.embedder import Embedder, make_embedder
from runtime.llm.persona import PersonaLoader
from runtime.llm.providers import FallbackChain, make_llm
from runtime.memories import retention as write_log_retention
from runtime.memories.digests import DigestBatch, DigestService
from runtime.memories.duplicates import DuplicateCheck, IndexFinder, NearDuplicate
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService, Resolution
from runtime.memories.mood import MoodIn, MoodService
from runtime.memories.portrait import PortraitIn, PortraitReader, PortraitService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Action, Match, Ref, Services, change, find_matching
from runtime.memories.threads import ThreadChange, ThreadService
from runtime.memories.transcript import ToolCallIn, TranscriptService, TurnIn
from runtime.memories.user_profile import ProfileOp, ProfileService
from runtime.mind import janitor
from runtime.mind.contract import JobContext
from runtime.recall import passages
from runtime.recall.hybrid import Recaller
from runtime.recall.indexing import Indexer, Progress
from runtime.recall.reader import StoreReader
from runtime.recall.results import RecallItem, RecallResult
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.vector_index import VectorIndex
from runtime.time.clock import Clock, SystemClock, household_zone
from runtime.turn import WRITER as TURN_WRITER
from runtime.turn import Asked, Replied, Wiring, new_request_id, recent_turns, remember, run

log = logging.getLogger(__name__)


class Memory:
    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.kinds = FactKinds.load(settings.memory.fact_kinds_file)
        self.profiles = MemoryProfiles.load(settings.memory.profiles_file)
        self.store = Store(settings.store.path, self.kinds,
                           settings.store.busy_timeout_ms, self.clock,
                           settings.store.synchronous, replicated=settings.replica.enabled)
        self.embedder: Embedder = embedder or make_embedder(settings.embedder)
        self.index = VectorIndex(self.store, self.index_dir, self.embedder.name,
                                 self.embedder.dim)
        self.indexer = Indexer(self.store, self.index, self.embedder,
                               batch=settings.embedder.batch_size,
                               cut=passages.configured(settings.recall))
        self.transcript = TranscriptService(self.store, self.profiles)
        duplicates = DuplicateCheck(self.store,
                                    IndexFinder(self.store, self.index, self.embedder),
                                    settings.memory.duplicate_similarity)
        self.episodes = EpisodeService(self.store, self.profiles, duplicates)
        self.graph = GraphService(self.store, self.kinds, self.profiles, duplicates)
        self.portraits = PortraitService(self.store)
        self.digests = DigestService(self.store)
        self.profile = ProfileService(self.store)
        self.services = Services(self.transcript, self.episodes, self.graph)
        self.recaller = Recaller(self.store, self.index, self.embedder, self.kinds,
                                 settings.recall, self.clock,
                                 household_zone(settings.household.timezone))
        self.indexer.drop_stale_models()
        self.indexer.sync(progress)

    @property
    def data_dir(self) -> Path:
        return self.settings.store.resolved_dir

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "index"

    def close(self) -> None:
        self.index.save()
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def job_context(self, llm: FallbackChain | None = None, settings: Settings | None = None,
                    budget_s: float | None = None) -> JobContext:
        """A background job's context in this process: this memory's store (reads),
        itself as the writer, this memory's embedder (a job that embeds loads no
        model of its own), its clock; ``llm`` (default: the configured chain),
        ``settings`` (default: this memory's) and ``budget_s`` (default:
        ``jobs.budget_s``) as given."""
        settings = settings or self.settings
        return JobContext(store=self.store, writer=self, llm=llm or make_llm(settings.llm),
                          clock=self.clock, settings=settings,
                          budget_s=settings.jobs.budget_s if budget_s is None else budget_s,
                          embedder=self.embedder)

    # -- writes -----------------------------------------------------------

    def add_turns(self, turns: Sequence[TurnIn], writer: str = "transcript") -> list[int]:
        """Append turns (all or nothing); those whose source is memory get indexed."""
        with self.store.write_transaction():
            ids = [self.transcript.append(t, writer) for t in turns]
        self.indexer.sync()
        return ids

    def add_turn(self, turn: TurnIn, writer: str = "transcript") -> int:
        return self.add_turns([turn], writer)[0]

    def add_episode(self, episode: EpisodeIn, writer: str = "episodes") -> int:
        """Write an episode; a near-duplicate of a live one is refused and that
        one's id returned (``runtime.memories.duplicates``)."""
        try:
            episode_id = self.episodes.add(episode, writer)
        except NearDuplicate as refused:
            return refused.item_id
        for child in episode.children:
            self.indexer.drop("episode", child)
        self.indexer.sync()
        return episode_id

    def add_fact(self, fact: FactIn, writer: str = "graph") -> tuple[int, Resolution]:
        """Write a fact; a source whose profile does not feed facts raises MutedSource."""
        fact_id, decision = self.graph.add(fact, writer)
        self.indexer.sync()
        return fact_id, decision

    def add_portrait(self, portrait: PortraitIn, writer: str = "synthesis") -> int:
        """Store a new version of the household's portrait (``runtime.memories.portrait``)."""
        return self.portraits.add(portrait, writer)

    def write_digests(self, batch: DigestBatch, writer: str = "synthesis") -> list[int]:
        """Add digests and prune expired ones (``runtime.memories.digests``)."""
        return self.digests.write(batch, writer)

    def update_profile(self, ops: Sequence[ProfileOp], source: str = "user",
                       writer: str = "graph") -> list[str]:
        """Apply profile operations, all or nothing (``runtime.memories.user_profile``)."""
        return self.profile.apply(ops, source, writer)

    def update_thread(self, change: ThreadChange, writer: str = "consolidate") -> None:
        """Resolve or escalate an episode's open thread (``runtime.memories.threads``)."""
        ThreadService(self.store).apply(change, writer)

    def add_mood(self, mood: MoodIn, writer: str = "consolidate") -> int:
        """Store a new reading of the mood (``runtime.memories.mood``)."""
        return MoodService(self.store).add(mood, writer)

    def purge_tombstones(self, now: float, writer: str = janitor.WRITER) -> int:
        """Hard-delete episodes tombstoned 30 days or more before ``now``."""
        return self.episodes.purge_tombstones(writer, now)

    def prune_transcript(self, channel: str, writer: str = janitor.WRITER) -> int:
        """Delete ``channel``'s compacted rows that no live episode cites."""
        return self.transcript.prune(channel, writer)

    def expire_write_log(self, now: float) -> int:
        """Drop the write-log history of pruned and purged rows past retention."""
        return write_log_retention.expire_write_log(self.store, now)

    def change(self, ref: Ref, action: Action, writer: str = "user") -> None:
        """Disable, enable, delete (forget), pin or unpin a memory item; its vector
        follows (pinning changes only the level, marking sensitive only the mark)."""
        if action in ("pin", "unpin", "sensitive", "not_sensitive"):
            change(self.services.owner(ref.kind), ref, action, writer)
            return
        if action != "enable":  # out of the index first: the delete takes the row
            self.indexer.drop(ref.kind, ref.id)
        try:
            change(self.services.owner(ref.kind), ref, action, writer)
        except BaseException:
            self.indexer.recheck(ref.kind, ref.id)  # unchanged: the next sync re-embeds it
            raise
        if action == "enable":
            self.indexer.recheck(ref.kind, ref.id)
            self.indexer.sync()

    def find_matching(self, text: str, limit: int = 20) -> list[Match]:
        return find_matching(self.store, text, limit)

    def compact(self, channel: str, summary: str, watermark: int,
                writer: str = "transcript", refs: Sequence[str] = ()) -> int:
        return self.transcript.compact(channel, summary, watermark, writer, refs)

    # -- reads ------------------------------------------------------------

    def recall(self, query: str, now: float | None = None, max_items: int | None = None,
               max_tokens: int | None = None, exclude: Iterable[str] = (),
               person: str | None = None,
               context: Iterable[str] | None = None) -> RecallResult:
        return self.recaller.recall(query, now=now, max_items=max_items, max_tokens=max_tokens,
                                    exclude=exclude, person=person, context=context)

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    # -- a conversation turn ----------------------------------------------

    def turn(self, text: str, channel: str = "chat", speaker: str | None = None,
             temporary: bool = False, llm: FallbackChain | None = None) -> Replied:
        """Answer a user's ``text`` on ``channel`` (one of ``settings.channels``)
        from ``speaker``, as the Turns actor does (:func:`runtime.turn.run`): the
        turn and its reply written with the reply's citations (nothing when
        ``temporary``), turn-zero recall through this memory's recaller, what the
        turn asks to remember stored, the prompt's parts read from this store.
        ``llm``: default the configured chain (with no provider configured, the
        offline one). ValueError for an unknown channel."""
        settings = self.settings.channels.get(channel)
        if settings is None:
            known = ", ".join(sorted(self.settings.channels))
            raise ValueError(f"unknown channel {channel!r}; configured channels: {known}")
        asked = Asked(TurnIn(channel=channel, source="user", role="user", content=text,
                             speaker=speaker, request_id=new_request_id()),
                      settings, temporary)
        wiring: Wiring[RecallItem] = Wiring(
            append=self._append_turn,
            remember=lambda turn, turn_id: remember(
                turn, turn_id, self.profiles, self.clock,
                partial(self.add_fact, writer=TURN_WRITER)),
            recent=partial(recent_turns, self.transcript),
            recall=lambda query, limit, exclude: self.recaller.recall(
                query, max_items=limit, exclude=exclude),
            recalled=self.indexer.sync,
            touch=lambda ids: self.episodes.touch(ids, self.clock.now(), TURN_WRITER),
            persona=PersonaLoader.from_settings(self.settings.persona).load,
            portrait=PortraitReader(lambda: self.store).lines,
            read=StoreReader(lambda: self.store).read)
        chain = llm or make_llm(self.settings.llm)
        return run(asked, self.settings, wiring, self.clock,
                   household_zone(self.settings.household.timezone), chain.complete)

    def _append_turn(self, turn: TurnIn, /, *, citations: list[str] | None = None,
                     tool_calls: Sequence[ToolCallIn] = (), index_now: bool = True) -> int:
        """One turn with its citations and tool calls, in one transaction (as
        the Transcript actor appends); indexed now or, for a turn about to be
        recalled for, once its turn-zero recall is done."""
        with self.store.write_transaction():
            turn_id = self.transcript.append(turn)
            if citations:
                self.transcript.set_citations(turn_id, citations)
            if tool_calls:
                self.transcript.add_tool_calls(turn_id, list(tool_calls))
        if index_now:
            self.indexer.sync()
        return turn_id
