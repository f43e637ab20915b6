"""The earlier conversation the present one continues (issue 25,
``recall.continuation_slots``).

A follow-up names nothing ("what's next?"), and the memory it needs shares no
word with it: the session that paused the plan it follows up. What does point
there is the whole conversation so far. Its vector, the mean of the message's
and the present conversation's turn vectors, is searched for among the stored
turns; the best hits outside the present conversation are this module's
answer, best first. :class:`runtime.recall.hybrid.Recaller` gives the first of
them that comes from a conversation not yet represented a place in the budget
right after the best item.

The present conversation is the query's channel back from ``now`` while no
two turns are further apart than ``recall.diversity_gap_s`` (the same
conversation the diversity term knows); its channel is the one of the latest
turn the caller excludes (the prompt's history). With none excluded the
conversation is the message alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

from runtime.memories.refs import turn_ids
from runtime.store.database import Store
from runtime.store.vector_index import VectorIndex

# Turns of the present conversation read at most (its vector's reach).
CONVERSATION_REACH = 200
# Turns asked of the vector index for the conversation's vector.
HITS = 20


def present_conversation(store: Store, refs: Iterable[str], now: float,
                         gap_s: float) -> list[int]:
    """Ids of the conversation the query is part of, newest first: the channel
    of the latest turn among ``refs``, back from ``now`` while no gap exceeds
    ``gap_s``. Empty when ``refs`` names no turn or that conversation ended
    more than ``gap_s`` ago."""
    ids = turn_ids(refs)
    if not ids:
        return []
    latest = store.row("SELECT channel FROM transcript WHERE id = ?", (max(ids),))
    if latest is None:
        return []
    rows = store.rows(
        "SELECT id, created_at FROM transcript WHERE channel = ? AND created_at <= ?"
        " ORDER BY created_at DESC, id DESC LIMIT ?",
        (latest["channel"], now, CONVERSATION_REACH))
    out: list[int] = []
    last = now
    for row in rows:
        if last - float(row["created_at"]) > gap_s:
            break
        out.append(int(row["id"]))
        last = float(row["created_at"])
    return out


def conversation_vector(store: Store, qvec: np.ndarray, present: list[int]) -> np.ndarray:
    """The mean of the message's vector and the present conversation's stored
    turn vectors (a turn not indexed yet counts no vector), normalised."""
    total = np.asarray(qvec, dtype=np.float32).copy()
    if present:
        marks = ",".join("?" * len(present))
        for (blob,) in store.conn.execute(
                f"SELECT vec FROM vectors WHERE kind = 'turn' AND item_id IN ({marks})",
                present):
            vec = np.frombuffer(blob, dtype=np.float32)
            if vec.shape == total.shape:  # (not one of another model's, mid re-embedding)
                total += vec
    norm = float(np.linalg.norm(total))
    return total / norm if norm > 0 else np.asarray(qvec, dtype=np.float32)


def continuation_hits(store: Store, index: VectorIndex, qvec: np.ndarray,
                      refs: Iterable[str], now: float, gap_s: float) -> list[int]:
    """Turn ids nearest the conversation's vector, best first, none of the
    present conversation nor among ``refs``."""
    refs = list(refs)
    present = present_conversation(store, refs, now, gap_s)
    vec = conversation_vector(store, qvec, present)
    labels, _ = index.search("turn", vec, HITS)
    if len(labels) == 0:
        return []
    order = {int(label): i for i, label in enumerate(labels)}
    marks = ",".join("?" * len(order))
    found = sorted(cast(list[tuple[int, int]], store.conn.execute(
        f"SELECT id, item_id FROM vectors WHERE id IN ({marks})",  # the labels: rowids
        list(order)).fetchall()), key=lambda r: order[r[0]])
    skip = {*present, *turn_ids(refs)}
    return [item_id for _, item_id in found if item_id not in skip]
