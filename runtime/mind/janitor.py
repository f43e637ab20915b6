"""The ``decay`` job: the janitor. Deletes what the decay rules say is gone.

- **Disabled rows stay.** Disabling is reversible: a disabled turn or episode
  is never deleted, whatever the rules below say (consolidation skips a
  disabled turn, so once the watermark has passed it nothing cites it; it
  waits for ``enable``). A turn enabled again after a compaction passed it is
  kept too: consolidation does not go back for it, it stays a turn
  (:meth:`runtime.memories.transcript.TranscriptService.prunable`).
- **Tombstones**: episodes tombstoned 30 days ago or more are hard-deleted
  (:meth:`runtime.memories.episodes.EpisodeService.purge_tombstones`); their citations
  go with them (schema cascade), the episodes they rolled up lose their parent.
- **Transcript**: on each channel with a compaction watermark, raw rows at or
  below it that no live (untombstoned) episode cites are deleted
  (:meth:`runtime.memories.transcript.TranscriptService.prune`); their tool-call rows go
  with them (schema cascade). Compaction summaries persist. No age cutoff.
- **Facts** decay by kind, but nothing is deleted: their weight is computed at
  recall (:func:`runtime.memories.decay.fact_weight` with the kind's policy from
  ``configs/fact_kinds.toml``), and that file defines no floor below which a
  fact would be retired ("history is kept"), so the janitor leaves facts alone.
- **Open threads** left open ``threads.escalate_after_days`` are escalated, one
  level step at a time and never past vivid
  (:func:`escalate_due`, through ``ctx.writer``).
- **Write log**: the history of a row this job pruned or purged (its insert,
  updates, delete, and the rows that went with it by cascade: an episode's
  citations, a turn's tool calls) is dropped once the delete is
  :data:`runtime.memories.decay.WRITE_LOG_RETENTION_DAYS` old. The history of facts and
  compactions is kept, and so is the content-free trace of a row the user
  forgot (:meth:`runtime.store.database.Store.forget` promises it). The rule lives in
  :mod:`runtime.memories.retention`, where the owners apply it.

Where the deletes go. The janitor reads from ``ctx.store`` (which channels
have a compaction) and deletes only through ``ctx.writer``
(:class:`runtime.mind.contract.MemoryWriter`), as writer ``janitor``: in the
actor runtime the purge and the write-log expiry of episodes go to the
Episodes actor, the pruning and the write-log expiry of the transcript to the
Transcript actor (``actors.remote_writer.RemoteWriter``), so each table keeps
one writer; in-process :class:`runtime.memory.Memory` does them. The job's
``now`` travels with the purge and the expiry: a run started by a tick that
names its instant selects by that instant, not by the owner's clock (the
owner stamps the write log with its own clock, as it does every write of a
job). A stale vector left in an in-memory index by these deletes is harmless:
recall joins every hit against the database.
"""

from __future__ import annotations

import logging

from runtime.memories.levels import raise_level

# The write log's retention rule (the owners apply it; migration 0011 names it here).
from runtime.memories.retention import expire_write_log as expire_write_log
from runtime.memories.threads import ThreadChange, ThreadService
from runtime.mind.contract import JobContext, JobResult
from runtime.time.clock import DAY

log = logging.getLogger(__name__)

JOB = "decay"
WRITER = "janitor"
ESCALATE_WRITER = "decay"


def run(ctx: JobContext) -> JobResult:
    """Purge expired tombstones, prune the transcript, expire the write log."""
    now = ctx.clock.now()
    purged = ctx.writer.purge_tombstones(now, WRITER)
    pruned = 0
    channels = [r[0] for r in ctx.store.conn.execute(
        "SELECT DISTINCT channel FROM compactions ORDER BY channel")]
    for channel in channels:
        if ctx.out_of_time():
            return JobResult(purged + pruned, _detail(purged, pruned, None), more=True)
        pruned += ctx.writer.prune_transcript(channel, WRITER)
    dropped = ctx.writer.expire_write_log(now)
    raised = escalate_due(ctx)  # open threads left too long (runtime.memories.threads)
    return JobResult(purged + pruned + raised,
                     f"{_detail(purged, pruned, dropped)}, {raised} open threads escalated")


def _detail(purged: int, pruned: int, dropped: int | None) -> str:
    tail = "" if dropped is None else f", {dropped} write-log rows expired"
    return f"{purged} tombstones purged, {pruned} transcript rows pruned{tail}"


# -- open threads (runtime.memories.threads) ---------------------------------


def escalate_due(ctx: JobContext) -> int:
    """Raise every open thread left ``threads.escalate_after_days`` since it
    opened or was last raised; return how many were raised."""
    after = ctx.settings.threads.escalate_after_days * DAY
    now = ctx.clock.now()
    raised = 0
    for row in ThreadService(ctx.store).open_threads():
        since = row["thread_escalated_at"] or row["thread_opened_at"] or row["created_at"]
        if now - float(since) < after or row["memory_level"] == "seared":
            continue
        if row["thread"] == "hot" and raise_level(row["memory_level"]) == row["memory_level"]:
            continue  # already as far as an escalation goes
        ctx.writer.update_thread(ThreadChange(episode_id=row["id"], change="escalate",
                                              at=now), ESCALATE_WRITER)
        raised += 1
    if raised:
        log.info("threads: %d open threads escalated", raised)
    return raised
