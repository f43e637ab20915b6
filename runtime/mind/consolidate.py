"""The ``consolidate`` job: distil transcript windows into leaf episodes
(:mod:`runtime.mind.distil`, which also opens and resolves threads), take the next
reading of the mood (:func:`update_mood`, by the rules of :mod:`runtime.memories.mood`),
then roll episodes up into topics and eras (:mod:`runtime.mind.rollup`).

Both parts commit batch by batch and resume where they stopped; the roll-up
runs only when distillation finished within the time budget.
"""

from __future__ import annotations

import logging

from runtime.memories.mood import MAX_TURNS, WRITER, MoodService, current, next_mood, read_turns
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.distil import distil

log = logging.getLogger(__name__)

NAME = "consolidate"


def run(ctx: JobContext) -> JobResult:
    from runtime.mind.rollup import roll_up  # UMAP and HDBSCAN load only when the job runs

    first = distil(ctx)
    moods, mood_detail = update_mood(ctx)  # from the turns distilled or not: cheap
    first = JobResult(items=first.items + moods, detail=f"{first.detail}; {mood_detail}",
                      more=first.more)
    if first.more or ctx.out_of_time():
        return first
    second = roll_up(ctx)
    return JobResult(items=first.items + second.items,
                     detail="; ".join(d for d in (first.detail, second.detail) if d),
                     more=second.more)


def update_mood(ctx: JobContext) -> tuple[int, str]:
    """Read the people's turns since the last reading and write the next mood
    through the job writer; returns (readings written, a detail line)."""
    latest = MoodService(ctx.store).latest()
    since = 0 if latest is None else latest.through_turn
    rows = ctx.store.rows(
        "SELECT id, content FROM transcript WHERE id > ? AND role = 'user' AND memory = 1"
        " AND disabled = 0 ORDER BY id LIMIT ?", (since, MAX_TURNS))
    if not rows:
        return 0, "mood: no new turns"
    reading = read_turns([r["content"] for r in rows])
    mood = next_mood(current(latest, ctx.clock.now()), reading, len(rows),
                     int(rows[-1]["id"]))
    ctx.writer.add_mood(mood, WRITER)
    return 1, f"mood: updated from {len(rows)} turns"
