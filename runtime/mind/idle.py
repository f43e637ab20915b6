"""The idle gate: whether the household is quiet enough for background jobs.

A pure rule, driven by the Cron actor. The household is idle once
``idle_after_s`` have passed without user activity: a user turn, or a
presence event (someone coming home or leaving). Everyone away (at least one
person known, and every known person away) counts as idle at once, from the
moment the last one left, unless the user spoke after that (talking from
afar is activity).

Nothing recorded at all (a fresh install, an import of old history) is idle:
there is nobody to disturb.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PresenceState = Literal["home", "away"]


@dataclass(frozen=True)
class Presence:
    state: PresenceState
    at: float  # when this person's state was last reported


@dataclass(frozen=True)
class IdleState:
    idle: bool
    # When the quiet began: the last activity or presence event (for everyone
    # away, the moment the last person left); None: nothing ever recorded.
    idle_since: float | None
    # When idle-gated jobs may fire: now or earlier when idle; None: always open.
    eligible_at: float | None
    reason: Literal["nothing-recorded", "everyone-away", "quiet", "active"]

    def as_dict(self) -> dict[str, object]:
        return {"idle": self.idle, "idle_since": self.idle_since,
                "eligible_at": self.eligible_at, "reason": self.reason}


def everyone_away(presence: Mapping[str, Presence]) -> float | None:
    """When the last known person left, if every known person is away; else None."""
    if not presence or any(p.state != "away" for p in presence.values()):
        return None
    return max(p.at for p in presence.values())


def idle_state(last_activity: float | None, presence: Mapping[str, Presence], now: float,
               idle_after_s: float) -> IdleState:
    """The idle gate at ``now``.

    ``last_activity``: the last user turn (None: none recorded); ``presence``:
    each person's last reported state. A presence event counts as activity
    at its time; everyone away opens the gate at once."""
    if idle_after_s < 0:
        raise ValueError("idle_after_s must be >= 0")
    events = [t for t in (last_activity, *(p.at for p in presence.values())) if t is not None]
    if not events:
        return IdleState(True, None, None, "nothing-recorded")
    left = everyone_away(presence)
    if left is not None and (last_activity is None or last_activity <= left):
        if now >= left:
            return IdleState(True, left, left, "everyone-away")
    last = max(events)
    opens = last + idle_after_s
    if now >= opens:
        return IdleState(True, last, opens, "quiet")
    return IdleState(False, last, opens, "active")
