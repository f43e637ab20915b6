"""Near-duplicate refusal: a new episode or fact that says what a live one of
its kind already says is not stored.

The rule (kept by :class:`runtime.memories.episodes.EpisodeService` and
:class:`runtime.memories.facts.GraphService`, so it holds for every writer: the
consolidate and roll-up jobs, the facts, dmn, geo, patterns and research
jobs, ``reverie remember``, the HTTP API and a "remember: ..." in a turn):

- the new memory's text (an episode's gist; a fact's subject, key in words
  and value: :func:`fact_text`) is embedded and compared with the live memories of
  its kind (an episode: not tombstoned, not disabled; a fact: current, not
  disabled, **about the same subject**);
- at a cosine similarity of at least ``memory.duplicate_similarity`` (0.92)
  the new memory is refused, unless the two texts differ in a detail the
  embedding blurs (a number, a weekday, a month, a negation: "the 14th" and
  "the 15th" embed at 0.99);
- the refusal is logged with the ref of the memory it duplicates (never the
  content) and the caller gets that memory's id back.

Which writes are checked: leaf episodes (a roll-up parent summarises its
children, which are live until the parent tombstones them, so it would
always look like one of them) and facts that would be *inserted*. A fact for
a subject and key that already has a current fact goes through contradiction
resolution instead (:func:`runtime.memories.facts.resolve`): the same value reinforces
it, a different one supersedes it, so corrections are never refused.

The threshold: measured with the real embedder (all-MiniLM-L6-v2, ONNX) on
paraphrase pairs ("The spare key is under the blue flower pot." / "... blue
plant pot.": 0.96; "Ana's birthday is on the 14th of May." / "Ana has her
birthday on May 14th.": 0.97; a hike retold: 0.95; looser rewordings: 0.85,
0.88) and on related but different memories (same topic, another detail:
0.89; another object or place: 0.42-0.78). 0.92 refuses the close
restatements and keeps every different memory measured.

Finding the nearest memory is a :class:`DuplicateFinder`: in one process
:class:`IndexFinder` (the embedder and the vector index, as
:class:`runtime.memory.Memory` and the Recall actor hold them); in the actor
runtime the Episodes and Graph actors ask the Recall actor
(``NearestMemory``). When the finder cannot answer (the index is off, Recall
is down) the memory is stored: a duplicate is cheaper than a lost memory.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # the services import this module: keep it light
    from runtime.llm.embedder import Embedder
    from runtime.store.database import Store
    from runtime.store.vector_index import VectorIndex

log = logging.getLogger(__name__)

Kind = Literal["episode", "fact"]
KINDS: tuple[Kind, ...] = ("episode", "fact")
CANDIDATES = 10  # nearest vectors looked at: the nearest live one is among them

# What makes a stored row of each kind live (a candidate to be duplicated).
_LIVE: dict[str, str] = {
    "episode": "tombstoned_at IS NULL AND disabled = 0",
    "fact": "valid_to IS NULL AND disabled = 0",
}

# Details an embedding blurs: two texts that differ in one are not duplicates.
_DETAIL_WORDS = frozenset(
    "not no never nobody nothing none nor without longer cannot can't don't doesn't "
    "isn't aren't wasn't weren't won't didn't "
    "monday tuesday wednesday thursday friday saturday sunday "
    "january february march april may june july august september october november "
    "december yesterday today tomorrow tonight morning afternoon evening night".split())
_WORD = re.compile(r"[\w']+")


class NearDuplicate(Exception):
    """A new episode was refused: it duplicates the live episode ``item_id``."""

    def __init__(self, kind: str, item_id: int) -> None:
        super().__init__(f"near-duplicate of {kind}:{item_id}")
        self.kind = kind
        self.item_id = item_id


@dataclass(frozen=True)
class Nearest:
    item_id: int
    similarity: float


class DuplicateFinder(Protocol):
    """The live memory of ``kind`` nearest to ``text`` (for a fact: about
    ``subject``), or None when there is none."""

    def nearest(self, kind: Kind, text: str, subject: str | None = None) -> Nearest | None: ...


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"kind must be episode or fact, not {kind!r}")
    return kind  # checked against KINDS


def episode_text(gist: str) -> str:
    """An episode as it is compared: its gist (what the index embeds)."""
    return gist


_NOTE_KEY = re.compile(r"^note-[0-9a-f]+$")


def fact_text(subject: str, key: str, value: str) -> str:
    """A fact as it is compared: its subject, its key in words (a remembered
    note's hashed key, ``note-3fa2...``, says nothing and is left out), its value."""
    words = "" if _NOTE_KEY.match(key) else " " + key.replace("_", " ").replace("-", " ")
    return f"{subject}{words}: {value}"


def _compared(kind: str, row: Mapping[str, Any]) -> str:
    if kind == "episode":
        return episode_text(str(row["gist"]))
    return fact_text(str(row["subject"]), str(row["key"]), str(row["value"]))


def details(text: str) -> frozenset[str]:
    """The words of ``text`` an embedding blurs: numbers, weekdays, months,
    times of day and negations."""
    words = (w.lower() for w in _WORD.findall(text))
    return frozenset(w for w in words if w in _DETAIL_WORDS or any(c.isdigit() for c in w))


class IndexFinder:
    """The nearest live memory by the embedder and the vector index (in-process)."""

    def __init__(self, store: Store, index: VectorIndex, embedder: Embedder,
                 candidates: int = CANDIDATES) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.candidates = candidates

    def nearest(self, kind: Kind, text: str, subject: str | None = None) -> Nearest | None:
        kind = check_kind(kind)
        if not text.strip():
            raise ValueError("text to compare is empty")
        vec = self.embedder.embed([text])[0]
        labels, sims = self.index.search(kind, vec, self.candidates)
        if not len(labels):
            return None
        sim_of = {int(label): float(sim) for label, sim in zip(labels, sims)}
        marks = ",".join("?" for _ in sim_of)
        where = _LIVE[kind]
        params: list[object] = [kind, *sim_of]
        if kind == "fact" and subject is not None:
            where += " AND c.subject = ? COLLATE NOCASE"
            params.append(subject)
        table = "episodes" if kind == "episode" else "facts"
        rows = self.store.rows(
            f"SELECT v.id AS label, c.id AS item_id FROM vectors v JOIN {table} c"
            f" ON c.id = v.item_id WHERE v.kind = ? AND v.id IN ({marks}) AND {where}",
            params)
        if not rows:
            return None
        if kind == "fact":  # the index embedded the raw key: compare as fact_text does
            facts = self.store.rows(
                f"SELECT id, subject, key, value FROM facts WHERE id IN"
                f" ({','.join('?' for _ in rows)}) ORDER BY id", [r["item_id"] for r in rows])
            vecs = self.embedder.embed([fact_text(f["subject"], f["key"], f["value"])
                                        for f in facts])
            exact = [float(vec @ v) for v in vecs]
            best_at = max(range(len(exact)), key=lambda i: (exact[i], -int(facts[i]["id"])))
            return Nearest(int(facts[best_at]["id"]), exact[best_at])
        best = max(rows, key=lambda r: (sim_of[int(r["label"])], -int(r["item_id"])))
        return Nearest(int(best["item_id"]), sim_of[int(best["label"])])


class DuplicateCheck:
    """The policy: refuse a near-duplicate, log the ref it duplicates."""

    def __init__(self, store: Store, finder: DuplicateFinder | None, threshold: float) -> None:
        self.store = store
        self.finder = finder
        self.threshold = threshold

    def episode(self, gist: str) -> int | None:
        """The id of the live episode a new one with ``gist`` duplicates, or None."""
        return self._check("episode", episode_text(gist), None)

    def fact(self, subject: str, key: str, value: str) -> int | None:
        """The id of the live fact about ``subject`` a new one duplicates, or None."""
        return self._check("fact", fact_text(subject, key, value), subject)

    def _check(self, kind: Kind, text: str, subject: str | None) -> int | None:
        if self.finder is None or self.threshold > 1.0:
            return None
        try:
            found = self.finder.nearest(kind, text, subject)
        except Exception as exc:  # no index, no Recall: store it rather than lose it
            log.warning("near-duplicate check unavailable (%s): %s stored unchecked",
                        type(exc).__name__, kind)
            return None
        if found is None or found.similarity < self.threshold:
            return None
        row = self.store.get("episodes" if kind == "episode" else "facts", found.item_id)
        if row is None or details(_compared(kind, row)) != details(text):
            return None
        log.info("near-duplicate refused: duplicates %s:%d (similarity %.3f)",
                 kind, found.item_id, found.similarity,
                 extra={"duplicate_of": f"{kind}:{found.item_id}"})
        return found.item_id
