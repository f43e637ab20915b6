"""The ``consolidate`` job: distil transcript windows into leaf episodes
(:mod:`runtime.mind.distil`, which also opens and resolves threads), take the next
reading of the mood (:mod:`runtime.memories.mood`), then roll episodes up into topics
and eras (:mod:`runtime.mind.rollup`).

Both parts commit batch by batch and resume where they stopped; the roll-up
runs only when distillation finished within the time budget.
"""

from __future__ import annotations

import logging

from runtime.memories.mood import update_mood
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
