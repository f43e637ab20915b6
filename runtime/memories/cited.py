"""A derived memory is never written from a memory forgotten since it was read.

A background job (consolidate, rollup, facts, patterns, the reflection, the
synthesis job's portrait and digests) reads turns, episodes and facts, works
for a while (a language model call, a run on a helper reading a snapshot),
then writes what it made, citing what it read. The user may forget one of
those memories in between; the forget cascade
(:mod:`runtime.memories.derived`) cannot reach a row not written yet. So the
owners' services check a new derived memory's citations inside the write
transaction that stores it (no gap between the check and the write: the
transaction is ``BEGIN IMMEDIATE``, so SQLite serialises it with the forget's,
which commits either before, and the write is refused, or after, and its
cascade takes the new row):

- an episode (:class:`runtime.memories.episodes.EpisodeService`): its cited
  turns (``cites``), the episodes it rolls up (``children``) and the other
  memories it was made from (``provenance``: the reflection's episode names the
  findings it tells);
- a fact (:class:`runtime.memories.facts.GraphService`): the ``turn:N``,
  ``episode:N`` and ``fact:N`` of its provenance (other entries, ``rule:...``,
  ``geo:place:N``, a feed, name no memory and are not checked);
- a portrait version (:class:`runtime.memories.portrait.PortraitService`): the
  refs of every line;
- a digest (:class:`runtime.memories.digests.DigestService`): its episodes,
  and for a language model's digest the turns whose lines it was given and the
  digests it was given as colour (``digest:N``);
- a compaction (:class:`runtime.memories.transcript.TranscriptService`): the
  episodes whose gists its summary copies (``refs``).

A citation is stale when the memory it names is not stored: forgotten, or
deleted otherwise (a turn pruned, an episode purged), which a job that has
just read it never meets but for a forget. The whole row is refused, never
stored with the stale citations dropped: its text may quote the forgotten
memory, and forgetting is forget-whole for derived rows. Nothing is written,
so no write-log entry holds the text. The refusal is :class:`StaleCitation`
(a ``ValueError`` naming the stale refs, never content); the actors answer it
as a ``BadRequest`` that is also a ``StaleCitation``
(:class:`actors.common.CitesForgotten`), and a job takes it as "skip this
item", not as a failed run.

A disabled memory is still stored (disabling is reversible: README, "Forget
and disable"), so citing one is not stale: the derived row is written, and
the read-time filters hide it while its source is disabled, as they do for
one written before the disable.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

from runtime.store.database import Store

log = logging.getLogger(__name__)

#: A citation naming a memory, or a digest: ``turn:12``, ``episode:3``, ``fact:7``,
#: ``digest:4`` (a digest a language model was given as colour).
MEMORY_REF = re.compile(r"^(turn|episode|fact|digest):([1-9][0-9]{0,17})$")
_TABLES = {"turn": "transcript", "episode": "episodes", "fact": "facts", "digest": "digests"}


class StaleCitation(ValueError):
    """A derived memory (``what``: episode, fact, portrait, digest, compaction) was refused:
    it cites ``refs``, memories forgotten (or gone) since the job read them."""

    def __init__(self, what: str, refs: Sequence[str]) -> None:
        self.what = what
        self.refs = tuple(refs)
        super().__init__(f"{what} refused: it cites {', '.join(self.refs)}, forgotten since"
                         " it was read")

    def __reduce__(self) -> tuple[type[StaleCitation], tuple[str, tuple[str, ...]]]:
        return type(self), (self.what, self.refs)  # pickled across Ray by its fields


def stale(store: Store, refs: Iterable[str]) -> list[str]:
    """The refs of ``refs`` naming a turn, episode, fact or digest that is not stored,
    in kind then id order. Refs that name no memory are never stale."""
    wanted: dict[str, set[int]] = {}
    for ref in refs:
        match = MEMORY_REF.match(ref)
        if match:
            wanted.setdefault(match[1], set()).add(int(match[2]))
    gone: list[str] = []
    for kind in sorted(wanted):
        ids = sorted(wanted[kind])
        found: set[int] = set()
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" for _ in part)
            found.update(int(r[0]) for r in store.conn.execute(
                f"SELECT id FROM {_TABLES[kind]} WHERE id IN ({marks})", part))
        gone.extend(f"{kind}:{i}" for i in ids if i not in found)
    return gone


def refuse_stale(store: Store, what: str, refs: Iterable[str]) -> None:
    """Raise :class:`StaleCitation` when one of ``refs`` is stale. Call it inside
    the write transaction that stores the row."""
    gone = stale(store, refs)
    if gone:
        log.info("%s refused: it cites %d memories forgotten since they were read", what,
                 len(gone), extra={"refs": gone})
        raise StaleCitation(what, gone)
