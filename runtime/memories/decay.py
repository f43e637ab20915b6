"""Decay math: pure functions of ages and policies, no storage.

Episode retrieval weight decays exponentially from when the episode was last
relevant, with a time constant by level (leaf 14 d, level 1 90 d, level 2
365 d, tombstoned 7 d). Facts decay by a half-life per kind; a superseded fact
decays at its kind's fast rate from the moment its validity window closed.
Memory levels (clanka) shape both: ``seared`` never fades, ``vivid`` never
falls below a floor, ``faint`` fades twice as fast.
"""

from __future__ import annotations

import math
from typing import Literal

from runtime.store.fact_kinds import FactKindPolicy
from runtime.time.clock import DAY

EPISODE_TAU_DAYS: dict[int, float] = {0: 14.0, 1: 90.0, 2: 365.0}
TOMBSTONE_TAU_DAYS = 7.0
TOMBSTONE_HARD_DELETE_DAYS = 30.0
VIVID_FLOOR = 0.5
SUPERSEDED_FACTOR = 0.25  # a replaced fact loses this much weight at once, then decays fast
FAINT_SPEED = 2.0

MemoryLevel = Literal["faint", "normal", "vivid", "seared"]
MEMORY_LEVELS: tuple[MemoryLevel, ...] = ("faint", "normal", "vivid", "seared")


def _age_days(since: float, now: float) -> float:
    return max(0.0, (now - since) / DAY)


def _apply_level(weight: float, level: MemoryLevel) -> float:
    if level == "seared":
        return 1.0
    if level == "vivid":
        return max(weight, VIVID_FLOOR)
    return weight


def episode_tau_days(level: int, tombstoned: bool = False) -> float:
    if tombstoned:
        return TOMBSTONE_TAU_DAYS
    try:
        return EPISODE_TAU_DAYS[level]
    except KeyError:
        raise ValueError(f"episode level must be 0, 1 or 2, not {level!r}") from None


def episode_weight(
    level: int,
    last_relevant_at: float,
    now: float,
    tombstoned: bool = False,
    memory_level: MemoryLevel = "normal",
) -> float:
    """exp(-age / tau) with tau chosen by episode level (or tombstone)."""
    tau = episode_tau_days(level, tombstoned)
    if memory_level == "faint":
        tau /= FAINT_SPEED
    weight = math.exp(-_age_days(last_relevant_at, now) / tau)
    if tombstoned:
        return weight
    return _apply_level(weight, memory_level)


def tombstone_expired(tombstoned_at: float, now: float) -> bool:
    """Tombstoned rows are hard-deleted after 30 days."""
    return _age_days(tombstoned_at, now) >= TOMBSTONE_HARD_DELETE_DAYS


def half_life_weight(age_days: float, half_life_days: float | None) -> float:
    if half_life_days is None:
        return 1.0
    return 0.5 ** (max(0.0, age_days) / half_life_days)


def fact_weight(
    policy: FactKindPolicy,
    confirmed_at: float,
    now: float,
    valid_to: float | None = None,
    memory_level: MemoryLevel = "normal",
) -> float:
    """Retrieval weight of a fact under its kind's policy.

    A fact whose validity window has closed (superseded) decays at the kind's
    fast rate from the close; a current fact at the kind's normal rate from when
    it was last confirmed."""
    if memory_level == "seared":
        return 1.0
    if valid_to is not None and valid_to <= now:
        base = half_life_weight(_age_days(confirmed_at, valid_to), policy.half_life_days)
        return SUPERSEDED_FACTOR * base * half_life_weight(
            _age_days(valid_to, now), policy.superseded_half_life_days)
    half_life = policy.half_life_days
    if half_life is not None and memory_level == "faint":
        half_life /= FAINT_SPEED
    return _apply_level(half_life_weight(_age_days(confirmed_at, now), half_life), memory_level)


def recency_weight(created_at: float, now: float, tau_days: float = 30.0) -> float:
    """Recency of a raw transcript row, for ranking only."""
    return math.exp(-_age_days(created_at, now) / tau_days)


# -- the write log's retention rule (``runtime/memories/retention.py``) -------

WRITE_LOG_RETENTION_DAYS = 90.0


def write_log_expired(deleted_at: float, now: float) -> bool:
    """The write-log history of a pruned transcript row or a purged tombstone is
    dropped this long after the delete. Facts' history is never dropped."""
    return _age_days(deleted_at, now) >= WRITE_LOG_RETENTION_DAYS
