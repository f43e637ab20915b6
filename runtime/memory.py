"""The public runtime API over one store: write memory, recall it.

:class:`Memory` wires the services of ``runtime/`` together for one data
directory: the SQLite store, the transcript, episodes, the fact graph, the
embedder, the vector indexes and recall. Actors hold one of these services
each; benchmarks, importers and tests use :class:`Memory` directly.

Writes embed first, then commit rows and vectors in one transaction, then add
the vectors to the in-memory indexes. A crash after the commit loses nothing:
the indexes catch up from the ``vectors`` table on the next open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from runtime.clock import Clock, SystemClock
from runtime.config import Settings
from runtime.embedder import Embedder, make_embedder
from runtime.episodes import EpisodeIn, EpisodeService, MutedSource
from runtime.fact_kinds import FactKinds
from runtime.facts import FactIn, GraphService, Resolution
from runtime.profiles import MemoryProfiles
from runtime.recall import Recaller, RecallResult
from runtime.store import Store
from runtime.transcript import TranscriptService, TurnIn
from runtime.vector_index import VectorIndex

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


def turn_document(turn: TurnIn) -> str:
    """The text embedded for a transcript row: who said it, and what."""
    who = turn.speaker or turn.role
    return f"{who}: {turn.content}"


class Memory:
    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.kinds = FactKinds.load(settings.memory.fact_kinds_file)
        self.profiles = MemoryProfiles.load(settings.memory.profiles_file)
        self.store = Store(settings.store.path, self.kinds,
                           settings.store.busy_timeout_ms, self.clock)
        self.embedder: Embedder = embedder or make_embedder(settings.embedder)
        self.index = VectorIndex(self.store, self.index_dir, self.embedder.name,
                                 self.embedder.dim)
        self.transcript = TranscriptService(self.store)
        self.episodes = EpisodeService(self.store, self.profiles)
        self.graph = GraphService(self.store, self.kinds)
        self._replaced: list[tuple[str, int]] = []
        self.recaller = Recaller(self.store, self.index, self.embedder, self.kinds,
                                 settings.recall, self.clock)
        self.reembed_stale()

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

    # -- writes -----------------------------------------------------------

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.embedder.embed(texts) if texts else np.empty((0, self.embedder.dim))

    def _commit_vectors(self, kind: str, ids: list[int], vecs: np.ndarray) -> list[int]:
        """Write vectors (inside the caller's transaction); return their labels.

        Labels these replace are queued and dropped from the index by
        :meth:`_index`, after the commit."""
        labels = []
        for item_id, vec in zip(ids, vecs):
            label, old = self.store.put_vector(
                kind, item_id, self.embedder.name, vec.astype(np.float32).tobytes())
            labels.append(label)
            if old is not None:
                self._replaced.append((kind, old))
        return labels

    def _index(self, kind: str, labels: list[int], vecs: np.ndarray) -> None:
        """After a commit: add new vectors, drop the ones they replaced."""
        self.index.add(kind, labels, vecs)
        while self._replaced:
            old_kind, old = self._replaced.pop()
            self.index.remove(old_kind, old)

    def add_turns(self, turns: Sequence[TurnIn], writer: str = "transcript") -> list[int]:
        """Append turns; the ones whose source is memory are embedded and indexed.

        All or nothing: one bad row rolls back the whole batch."""
        remembered = [self.profiles.for_source(t.source).remembered for t in turns]
        vecs = self._embed([turn_document(t) for t, keep in zip(turns, remembered) if keep])
        ids: list[int] = []
        with self.store.transaction():
            ids = [self.transcript.append(t, writer, memory=keep)
                   for t, keep in zip(turns, remembered)]
            kept_ids = [i for i, keep in zip(ids, remembered) if keep]
            labels = self._commit_vectors("turn", kept_ids, vecs)
        self._index("turn", labels, vecs)
        return ids

    def add_turn(self, turn: TurnIn, writer: str = "transcript") -> int:
        return self.add_turns([turn], writer)[0]

    def add_episode(self, episode: EpisodeIn, writer: str = "episodes") -> int:
        vecs = self._embed([episode.gist])
        with self.store.transaction():
            episode_id = self.episodes.add(episode, writer)
            labels = self._commit_vectors("episode", [episode_id], vecs)
        self._index("episode", labels, vecs)
        for child in episode.children:
            self._unindex("episode", child)
        return episode_id

    def add_fact(self, fact: FactIn, writer: str = "graph") -> tuple[int, Resolution]:
        if not self.profiles.for_source(fact.source).facts:
            raise MutedSource(f"source {fact.source!r} does not feed facts")
        vecs = self._embed([f"{fact.subject} {fact.key}: {fact.value}"])
        with self.store.transaction():
            fact_id, decision = self.graph.add(fact, writer)
            labels: list[int] = []
            if decision.action in ("insert", "supersede"):
                labels = self._commit_vectors("fact", [fact_id], vecs)
        if labels:
            self._index("fact", labels, vecs)
        return fact_id, decision

    def _unindex(self, kind: str, item_id: int) -> None:
        label = self.store.scalar(
            "SELECT id FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
        if label is not None:
            self.index.remove(kind, int(label))

    # -- reads ------------------------------------------------------------

    def recall(self, query: str, now: float | None = None, max_items: int | None = None,
               max_tokens: int | None = None) -> RecallResult:
        return self.recaller.recall(query, now=now, max_items=max_items, max_tokens=max_tokens)

    def counts(self) -> dict[str, int]:
        return {
            "transcript": int(self.store.scalar("SELECT count(*) FROM transcript")),
            "episodes": int(self.store.scalar(
                "SELECT count(*) FROM episodes WHERE tombstoned_at IS NULL")),
            "facts": int(self.store.scalar(
                "SELECT count(*) FROM facts WHERE valid_to IS NULL AND disabled = 0")),
            "vectors": int(self.store.scalar("SELECT count(*) FROM vectors")),
        }

    # -- maintenance ------------------------------------------------------

    def reembed_stale(self, progress: Progress | None = None, batch: int = 256) -> int:
        """Re-embed vectors written by another embedder model (after a model change)."""
        stale = self.store.rows(
            "SELECT id, kind, item_id FROM vectors WHERE model != ? ORDER BY id",
            (self.embedder.name,))
        done = 0
        for start in range(0, len(stale), batch):
            chunk = stale[start:start + batch]
            texts = [self._document_of(r["kind"], r["item_id"]) for r in chunk]
            vecs = self._embed(texts)
            for kind in {r["kind"] for r in chunk}:
                rows = [(r, v) for r, v in zip(chunk, vecs) if r["kind"] == kind]
                with self.store.transaction():
                    labels = self._commit_vectors(
                        kind, [r["item_id"] for r, _ in rows], np.stack([v for _, v in rows]))
                self._index(kind, labels, np.stack([v for _, v in rows]))
            done += len(chunk)
            if progress:
                progress(done, len(stale))
        return done

    def _document_of(self, kind: str, item_id: int) -> str:
        if kind == "turn":
            row = self.store.get("transcript", item_id) or {}
            return f"{row.get('speaker') or row.get('role')}: {row.get('content', '')}"
        if kind == "episode":
            return str((self.store.get("episodes", item_id) or {}).get("gist", ""))
        row = self.store.get("facts", item_id) or {}
        return f"{row.get('subject')} {row.get('key')}: {row.get('value')}"
