"""The idle gate (runtime.mind.idle): a pure rule of last activity, presence and now."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.mind.idle import Presence, idle_state

T0 = 1_700_000_000.0
WINDOW = 1800.0

times = st.floats(min_value=T0 - 86400 * 30, max_value=T0 + 86400 * 30)
people = st.dictionaries(st.sampled_from(["ana", "ben", "cal"]),
                         st.builds(Presence, st.sampled_from(["home", "away"]), times),
                         max_size=3)


def test_nothing_recorded_is_idle() -> None:
    gate = idle_state(None, {}, T0, WINDOW)
    assert gate.idle and gate.idle_since is None and gate.eligible_at is None


def test_active_until_the_window_has_passed() -> None:
    assert not idle_state(T0, {}, T0 + WINDOW - 1, WINDOW).idle
    gate = idle_state(T0, {}, T0 + WINDOW, WINDOW)
    assert gate.idle and gate.idle_since == T0 and gate.eligible_at == T0 + WINDOW
    assert gate.reason == "quiet"
    active = idle_state(T0, {}, T0 + 10, WINDOW)
    assert active.reason == "active" and active.eligible_at == T0 + WINDOW


def test_everyone_away_is_idle_at_once() -> None:
    away = {"ana": Presence("away", T0 + 5), "ben": Presence("away", T0 + 10)}
    gate = idle_state(T0, away, T0 + 11, WINDOW)
    assert gate.idle and gate.reason == "everyone-away" and gate.idle_since == T0 + 10
    one_home = {**away, "ben": Presence("home", T0 + 10)}
    assert not idle_state(T0, one_home, T0 + 11, WINDOW).idle


def test_a_presence_event_resets_idleness() -> None:
    home = {"ana": Presence("home", T0 + 1000)}
    assert not idle_state(T0, home, T0 + WINDOW + 10, WINDOW).idle
    assert idle_state(T0, home, T0 + 1000 + WINDOW, WINDOW).idle


def test_talking_after_everyone_left_is_activity() -> None:
    away = {"ana": Presence("away", T0)}
    gate = idle_state(T0 + 60, away, T0 + 120, WINDOW)
    assert not gate.idle and gate.eligible_at == T0 + 60 + WINDOW


def test_negative_window_is_refused() -> None:
    with pytest.raises(ValueError):
        idle_state(T0, {}, T0, -1)


@given(last=st.none() | times, presence=people, now=times,
       window=st.floats(min_value=0, max_value=86400))
def test_the_rule(last: float | None, presence: dict[str, Presence], now: float,
                  window: float) -> None:
    gate = idle_state(last, presence, now, window)
    events = [t for t in (last, *(p.at for p in presence.values())) if t is not None]
    if not events:
        assert gate.idle
        return
    all_away = all(p.state == "away" for p in presence.values()) and bool(presence)
    if gate.idle:
        assert gate.eligible_at is not None and gate.eligible_at <= now
    else:
        assert gate.eligible_at is not None and gate.eligible_at > now
    # quiet for the whole window after every event: always idle
    if now >= max(events) + window:
        assert gate.idle
    # an event within the window blocks the gate, unless everyone left since
    if now < max(events) + window and not all_away:
        assert not gate.idle
    # everyone away, nobody spoke since, and now is after they left: idle
    if all_away:
        left = max(p.at for p in presence.values())
        if (last is None or last <= left) and now >= left:
            assert gate.idle and gate.idle_since == left
