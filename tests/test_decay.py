import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.config import CONFIG_DIR
from runtime.memories.decay import (
    VIVID_FLOOR,
    episode_weight,
    fact_weight,
    tombstone_expired,
)
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
T0 = 1_700_000_000.0


@pytest.mark.parametrize(("level", "tau"), [(0, 14), (1, 90), (2, 365)])
def test_one_time_constant_leaves_1_over_e(level: int, tau: int) -> None:
    assert episode_weight(level, T0, T0 + tau * DAY) == pytest.approx(math.exp(-1))


def test_tombstoned_decays_on_seven_days_and_expires_at_thirty() -> None:
    assert episode_weight(2, T0, T0 + 7 * DAY, tombstoned=True) == pytest.approx(math.exp(-1))
    assert not tombstone_expired(T0, T0 + 29.9 * DAY)
    assert tombstone_expired(T0, T0 + 30 * DAY)


def test_bad_level_is_refused() -> None:
    with pytest.raises(ValueError):
        episode_weight(3, T0, T0)


ages = st.floats(min_value=0, max_value=5000)


@given(level=st.sampled_from([0, 1, 2]), a=ages, b=ages)
def test_episode_weight_is_bounded_and_non_increasing(level: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    w_lo = episode_weight(level, T0, T0 + lo * DAY)
    w_hi = episode_weight(level, T0, T0 + hi * DAY)
    assert 0.0 <= w_hi <= w_lo <= 1.0


@given(age=ages)
def test_higher_levels_fade_slower(age: float) -> None:
    now = T0 + age * DAY
    assert episode_weight(0, T0, now) <= episode_weight(1, T0, now) <= episode_weight(2, T0, now)


@given(age=ages)
def test_memory_levels(age: float) -> None:
    now = T0 + age * DAY
    assert episode_weight(0, T0, now, memory_level="seared") == 1.0
    assert episode_weight(0, T0, now, memory_level="vivid") >= VIVID_FLOOR
    assert episode_weight(0, T0, now, memory_level="faint") <= episode_weight(0, T0, now)


def test_discovery_fades_in_about_two_weeks_user_facts_do_not() -> None:
    discovery, user = KINDS.policy("discovery"), KINDS.policy("user_specific")
    assert fact_weight(discovery, T0, T0 + 14 * DAY) < 0.2
    assert fact_weight(user, T0, T0 + 14 * DAY) > 0.95


def test_superseded_fact_decays_fast_from_close() -> None:
    user = KINDS.policy("user_specific")
    closed = T0 + 10 * DAY
    live = fact_weight(user, T0, T0 + 40 * DAY)
    gone = fact_weight(user, T0, T0 + 40 * DAY, valid_to=closed)
    assert gone < 0.1 < 0.9 < live
    # before the close takes effect it is still weighted as current
    assert fact_weight(user, T0, T0 + 5 * DAY, valid_to=closed) == pytest.approx(
        fact_weight(user, T0, T0 + 5 * DAY))


def test_capability_kind_never_decays_while_current() -> None:
    assert fact_weight(KINDS.policy("capability"), T0, T0 + 3650 * DAY) == 1.0
