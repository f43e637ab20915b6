"""Roll-up: clusters of apex episodes become a parent one level up.

Count triggers, per channel: 50 or more apex leaves (level 0, no parent, not
tombstoned) start a leaf round; 25 or more level-1 apexes start an era round
(level 2). A round reads the apexes' vectors from the ``vectors`` table,
clusters them (:func:`runtime.mind.clustering.cluster`: UMAP to 10 dimensions,
HDBSCAN, noise never force-assigned) and writes, for each cluster, a parent
through ``ctx.writer.add_episode`` with the cluster as ``children`` (the
episode service tombstones them in the same transaction). Noise stays an
apex, eligible for the next round.

What a parent holds: a summary of its children (offline: an extractive
summary of their gists, deterministic; with a real language model: a summary
call with at most :data:`MAX_EVIDENCE` gists per call, combined by a final
call when there are more), the union of its children's cited turns, the
highest salience among them, their most common emotion, and their time span.

What is never rolled up: user-managed episodes, i.e. any whose
``memory_level`` the user changed from ``normal`` (``seared``, ``vivid``,
``faint``), and disabled (hidden) episodes. They neither count towards a
trigger nor join a cluster.

An apex with no vector yet (the indexer has not embedded it) sits the round
out; the job has no embedder of its own, and the next round takes it.

Resumable: a round first records its plan (the clusters, as lists of episode
ids) in ``job_state``, then commits one parent at a time. A crash or the time
budget (``ctx.out_of_time()``, checked after every parent) leaves the plan
unfinished, and the next run resumes it without clustering again: a cluster
already written has tombstoned members, no longer eligible apexes, so it is
skipped and can never get a second parent. (Re-clustering the remainder
instead could lose its last cluster: HDBSCAN does not report a lone cluster.)
When a round finishes, the job records the newest apex id it saw, and does not
cluster the same channel and level again until a newer apex arrives.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.config import Settings
from runtime.llm.providers import ChatMessage, LLMError, LLMRequest
from runtime.memories.cited import StaleCitation
from runtime.memories.episodes import EpisodeIn
from runtime.memories.threads import carried as carried_thread
from runtime.mind import clustering
from runtime.mind.contract import JobContext, JobResult
from runtime.store.database import Row, Store
from runtime.store.job_state import get_state, set_state

log = logging.getLogger(__name__)

JOB = "consolidate"
WRITER = "consolidate"
LEAF_TRIGGER = 50  # apex leaves on a channel that start a leaf round
ERA_TRIGGER = 25  # level-1 apexes on a channel that start an era round
TRIGGERS: dict[int, int] = {0: LEAF_TRIGGER, 1: ERA_TRIGGER}  # child level -> count
MAX_EVIDENCE = 12  # gists handed to the language model in one call
SUMMARY_SENTENCES = 4  # sentences in an extractive summary
MAX_GIST_CHARS = 1200
CACHE_DIRNAME = "numba-cache"



def numba_cache_dir(settings: Settings) -> Path:
    """Where the compiled clustering code is cached: in the data dir, unless
    numba's own ``NUMBA_CACHE_DIR`` is set in the environment (then there: one
    cache for several data dirs, as the test suite has). The runtime may fill
    it once with ``clustering.warm_up(numba_cache_dir(settings))``."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    return Path(given) if given else settings.store.resolved_dir / CACHE_DIRNAME


_SENTENCE = re.compile(r"(?<=[.!?…])\s+")

SUMMARY_PROMPT = (
    "You consolidate a household assistant's memories. Below are related memories "
    "(episode summaries), most central first. Write one short paragraph (at most four "
    "sentences) that summarises what they have in common and the key specifics "
    "(names, places, dates). Use only what the memories say. Reply with the paragraph "
    "only."
)


# -- what is eligible ----------------------------------------------------------


_ELIGIBLE = ("parent_id IS NULL AND tombstoned_at IS NULL AND disabled = 0"
             " AND memory_level = 'normal'")


def eligible_apexes(store: Store, channel: str, level: int) -> list[Row]:
    """Apexes of ``channel`` at ``level`` that roll-up may touch, oldest first."""
    return store.rows(
        f"SELECT * FROM episodes WHERE channel = ? AND level = ? AND {_ELIGIBLE}"
        " ORDER BY id", (channel, level))


def due_rounds(store: Store) -> list[tuple[str, int]]:
    """(channel, child level) pairs whose count trigger is met right now, or whose
    round was cut short (a crash, the time budget) and must be finished."""
    rows = store.rows(
        f"SELECT channel, level, count(*) AS n FROM episodes WHERE level IN (0, 1)"
        f" AND {_ELIGIBLE} GROUP BY channel, level ORDER BY channel, level")
    return [(r["channel"], r["level"]) for r in rows
            if r["n"] >= TRIGGERS[r["level"]] or _unfinished(store, r["channel"], r["level"])]


def _unfinished(store: Store, channel: str, level: int) -> bool:
    state = get_state(store, JOB, _round_key(channel, level))
    return state is not None and not state.get("finished", True) and "plan" in state


def apex_vectors(store: Store, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """The stored vector of each episode in ``ids`` that has one."""
    out: dict[int, np.ndarray] = {}
    wanted = list(ids)
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        marks = ", ".join("?" for _ in chunk)
        for item_id, blob in store.conn.execute(
                f"SELECT item_id, vec FROM vectors WHERE kind = 'episode'"
                f" AND item_id IN ({marks})", chunk):
            out[int(item_id)] = np.frombuffer(blob, dtype=np.float32)
    return out


def citations(store: Store, ids: Sequence[int]) -> list[int]:
    """The union of the turns the episodes in ``ids`` cite, ascending."""
    found: set[int] = set()
    wanted = list(ids)
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        marks = ", ".join("?" for _ in chunk)
        found.update(r[0] for r in store.conn.execute(
            f"SELECT transcript_id FROM episode_citations WHERE episode_id IN ({marks})",
            chunk))
    return sorted(found)


# -- summaries -----------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]


def extractive_summary(gists: Sequence[str], limit: int = SUMMARY_SENTENCES) -> str:
    """The first sentence of each gist, in the given order (most central first),
    duplicates skipped, up to ``limit`` sentences and :data:`MAX_GIST_CHARS`."""
    picked: list[str] = []
    seen: set[str] = set()
    for gist in gists:
        sentences = _sentences(gist)
        if not sentences:
            continue
        first = sentences[0]
        key = first.lower()
        if key in seen:
            continue
        seen.add(key)
        if picked and len(" ".join([*picked, first])) > MAX_GIST_CHARS:
            break
        picked.append(first)
        if len(picked) == limit:
            break
    return " ".join(picked)[:MAX_GIST_CHARS].strip()


def _real_llm(ctx: JobContext) -> bool:
    return any(not getattr(p, "last_resort", False) for p in ctx.llm.providers)


def _llm_summary(ctx: JobContext, gists: Sequence[str]) -> str | None:
    """One summary call over at most MAX_EVIDENCE gists; None unless a real model answered."""
    evidence = "\n".join(f"{i + 1}. {' '.join(g.split())}"
                         for i, g in enumerate(gists[:MAX_EVIDENCE]))
    request = LLMRequest(messages=[ChatMessage(role="system", content=SUMMARY_PROMPT),
                                   ChatMessage(role="user", content=evidence)],
                         max_tokens=300, temperature=0.2)
    try:
        completion = ctx.llm.complete(request)
    except LLMError as exc:  # every provider failed: the extractive summary stands in
        log.warning("roll-up summary call failed (%s); using the extractive summary",
                    type(exc).__name__)
        return None
    provider = next((p for p in ctx.llm.providers if p.name == completion.provider), None)
    if provider is None or getattr(provider, "last_resort", False):
        return None
    text = " ".join(completion.text.split())
    return text[:MAX_GIST_CHARS].strip() or None


def summarise(ctx: JobContext, gists: Sequence[str]) -> tuple[str, str]:
    """A parent's gist from its children's gists (most central first), and how it was
    made ("llm" or "extractive"). More than MAX_EVIDENCE gists: summarised in groups
    of MAX_EVIDENCE, then the group summaries are summarised."""
    if _real_llm(ctx):
        layer = list(gists)
        while True:  # each pass shrinks the layer twelvefold
            parts: list[str] = []
            for start in range(0, len(layer), MAX_EVIDENCE):
                part = _llm_summary(ctx, layer[start:start + MAX_EVIDENCE])
                if part is None:
                    return extractive_summary(gists), "extractive"
                parts.append(part)
            if len(parts) == 1:
                return parts[0], "llm"
            layer = parts
    return extractive_summary(gists), "extractive"


# -- one round -----------------------------------------------------------------


def _most_common(values: Sequence[str]) -> str | None:
    counts = Counter(v for v in values if v)
    if not counts:
        return None
    best = max(counts.values())
    return min(v for v, n in counts.items() if n == best)


def parent_of(ctx: JobContext, children: Sequence[Row], centre: np.ndarray,
              vectors: dict[int, np.ndarray]) -> EpisodeIn:
    """The parent episode that rolls up ``children`` (rows of one level)."""
    order = sorted(children, key=lambda r: (-float(vectors[r["id"]] @ centre), r["id"]))
    gist, _how = summarise(ctx, [r["gist"] for r in order])
    starts = [r["started_at"] for r in children if r["started_at"] is not None]
    ends = [r["ended_at"] for r in children if r["ended_at"] is not None]
    ids = [r["id"] for r in children]
    thread = carried_thread(children)  # an open thread stays in recall (runtime.memories.threads)
    return EpisodeIn(
        channel=children[0]["channel"],
        source=_most_common([r["source"] for r in children]) or children[0]["source"],
        gist=gist or f"{len(children)} related memories.",
        level=int(children[0]["level"]) + 1,
        salience=max(int(r["salience"]) for r in children),
        emotion=_most_common([r["emotion"] for r in children]),
        cites=citations(ctx.store, ids),
        children=sorted(ids),
        started_at=min(starts) if starts else None,
        ended_at=max(ends) if ends else None,
        thread=None if thread is None else thread.state,
        thread_what=None if thread is None else thread.what,
    )


def _round_key(channel: str, level: int) -> str:
    return f"rollup:{channel}:{level}"


def run_round(ctx: JobContext, channel: str, level: int) -> tuple[int, bool]:
    """Cluster the eligible apexes of ``channel`` at ``level`` and write a parent per
    cluster; or, for a round that was cut short, write the parents its recorded
    plan still lacks. Returns (parents written, finished)."""
    key = _round_key(channel, level)
    state = get_state(ctx.store, JOB, key)
    if state is not None and not state.get("finished", True) and "plan" in state:
        return _write_plan(ctx, key, state)
    apexes = eligible_apexes(ctx.store, channel, level)
    if len(apexes) < TRIGGERS[level]:
        return 0, True
    newest = max(r["id"] for r in apexes)
    if state is not None and int(state.get("newest", 0)) >= newest:
        return 0, True  # nothing new since the last full round: its noise stays noise
    vectors = apex_vectors(ctx.store, [r["id"] for r in apexes])
    dims = Counter(len(v) for v in vectors.values())
    dim = dims.most_common(1)[0][0] if dims else 0
    usable = [r["id"] for r in apexes if dim and len(vectors.get(r["id"], ())) == dim]
    if len(usable) < len(apexes):
        log.info("roll-up: %d of %d apexes have no vector yet; they wait for the next round",
                 len(apexes) - len(usable), len(apexes))
    plan: list[list[int]] = []
    if len(usable) >= clustering.MIN_POINTS:
        clustering.configure_cache(numba_cache_dir(ctx.settings))
        labels = clustering.cluster(np.stack([vectors[i] for i in usable]))
        plan = [[usable[i] for i in np.flatnonzero(labels == label)]
                for label in sorted(set(labels.tolist()) - {-1})]
    # Apexes still without a vector are waited for: the round is not recorded
    # as seen up to ``newest`` until they can take part.
    seen = newest if len(usable) == len(apexes) else 0
    state = {"newest": seen, "finished": False, "plan": plan}
    set_state(ctx.store, JOB, key, state)
    return _write_plan(ctx, key, state)


def _write_plan(ctx: JobContext, key: str, state: dict[str, Any]) -> tuple[int, bool]:
    """Write a parent for each planned cluster whose members are all still eligible
    apexes; a cluster already written has tombstoned members and is skipped."""
    written = 0
    for ids in state["plan"]:
        members = _still_eligible(ctx.store, ids)
        if len(members) < 2:
            continue
        vectors = apex_vectors(ctx.store, [r["id"] for r in members])
        members = [r for r in members if r["id"] in vectors]
        if len(members) < 2:
            continue
        unit = {r["id"]: clustering.normalise(vectors[r["id"]][None, :])[0] for r in members}
        centre = clustering.normalise(np.mean(list(unit.values()), axis=0)[None, :])[0]
        try:
            ctx.writer.add_episode(parent_of(ctx, members, centre, unit), WRITER)
        except StaleCitation as refused:  # a member or turn forgotten since the read
            log.info("rollup: a cluster cites %d memories forgotten since it was read;"
                     " skipped", len(refused.refs))
            continue
        written += 1
        if ctx.out_of_time():
            return written, False
    set_state(ctx.store, JOB, key, {"newest": state["newest"], "finished": True})
    return written, True


def _still_eligible(store: Store, ids: Sequence[int]) -> list[Row]:
    """The episodes of ``ids`` that are still eligible apexes (not rolled up since
    the plan was made; not hidden, forgotten or made user-managed meanwhile)."""
    if not ids:
        return []
    marks = ", ".join("?" for _ in ids)
    return store.rows(
        f"SELECT * FROM episodes WHERE id IN ({marks}) AND {_ELIGIBLE} ORDER BY id", list(ids))


def roll_up(ctx: JobContext) -> JobResult:
    """Run every due round (leaf rounds first, then era rounds), within the budget."""
    written = 0
    rounds = 0
    for level in (0, 1):
        for channel, due_level in due_rounds(ctx.store):
            if due_level != level:
                continue
            if rounds and ctx.out_of_time():  # the first round always gets going
                return JobResult(written, f"{written} parents in {rounds} rounds; out of time",
                                 more=True)
            made, finished = run_round(ctx, channel, level)
            written += made
            rounds += 1
            if not finished:
                return JobResult(written, f"{written} parents in {rounds} rounds; out of time",
                                 more=True)
    return JobResult(written, f"{written} parents in {rounds} rounds")
