"""Memory levels (clanka): faint < normal < vivid < seared, and who may move them.

The rules, kept by the services that own episodes and facts
(:meth:`runtime.memories.episodes.EpisodeService.set_level`,
:meth:`runtime.memories.facts.GraphService.set_level`), whoever calls them:

- **The system only raises a level, never lowers it.** A writer that is not the
  user (a job, the turn path, an import...) may move a memory up the order,
  never down; a lower level is refused with :class:`LevelLowered`.
- **Only the user lowers.** The writers that act for the user in person
  (:data:`USER_WRITERS`: ``reverie`` commands, the HTTP API and its memory
  page, :class:`runtime.memory.Memory`'s default) may set any level: unpinning
  a seared memory (back to ``vivid``) is theirs alone.
- **A correction keeps the level.** A claim a job writes that supersedes a
  fact takes the replaced fact's level when that is higher
  (:meth:`runtime.memories.facts.GraphService.add`): the subject and key's level does
  not drop because the system learned a new value.
- **Seared never changes** but by the user: it is the top of the order, so no
  other writer can move it at all.

:func:`raise_level` is the one way the system escalates (an open thread left
too long goes up one step at a time, but never past ``vivid``).
"""

from __future__ import annotations

import logging

from runtime.memories.decay import MEMORY_LEVELS, MemoryLevel

log = logging.getLogger(__name__)

#: Writers that act for the user in person: the only ones that may lower a level.
USER_WRITERS: frozenset[str] = frozenset({"user", "cli", "http"})
#: How far the system escalates by itself (only the user sears).
SYSTEM_CAP: MemoryLevel = "vivid"


class LevelLowered(ValueError):
    """A writer other than the user tried to lower a memory's level."""


def check_level(level: str) -> MemoryLevel:
    """``level`` as a :data:`MemoryLevel`; ValueError naming the levels otherwise."""
    if level not in MEMORY_LEVELS:
        raise ValueError(f"memory level must be one of {', '.join(MEMORY_LEVELS)}, "
                         f"not {level!r}")
    return level  # checked against MEMORY_LEVELS


def rank(level: str) -> int:
    """The level's place in the order: faint 0, normal 1, vivid 2, seared 3."""
    return MEMORY_LEVELS.index(check_level(level))


def raise_level(current: str, steps: int = 1, cap: str = SYSTEM_CAP) -> MemoryLevel:
    """``current`` raised by ``steps``, but never past ``cap``; a level already
    at or above ``cap`` stays as it is (raising never lowers)."""
    if steps < 0:
        raise ValueError(f"steps must be 0 or more, not {steps}")
    now, top = rank(current), rank(cap)
    if now >= top:
        return MEMORY_LEVELS[now]
    return MEMORY_LEVELS[min(now + steps, top)]


def higher(a: str, b: str) -> MemoryLevel:
    """The higher of two levels (a claim that supersedes a fact for the system
    keeps the level of the fact it replaces, if that is higher)."""
    return MEMORY_LEVELS[max(rank(a), rank(b))]


def is_user(writer: str) -> bool:
    return writer in USER_WRITERS


def allowed(current: str, new: str, writer: str) -> MemoryLevel:
    """``new`` if ``writer`` may move a memory from ``current`` to it; raises
    :class:`LevelLowered` when a writer other than the user would lower it,
    ValueError for an unknown level."""
    level = check_level(new)
    if rank(level) < rank(current) and not is_user(writer):
        log.info("level change refused", extra={"writer": writer, "from": current,
                                                "to": level})
        raise LevelLowered(f"only the user lowers a memory's level: writer {writer!r} "
                           f"cannot move it from {current} to {level}")
    return level
