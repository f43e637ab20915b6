from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import CONFIG_DIR
from runtime.memories.decay import episode_weight
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.profiles import MemoryProfiles
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import DAY, ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")


@pytest.fixture
def episodes(tmp_path: Path) -> Iterator[EpisodeService]:
    store = Store(tmp_path / "e.db", KINDS, clock=ManualClock(1000.0))
    yield EpisodeService(store, PROFILES)
    store.close()


def test_touch_restarts_decay_of_used_episodes_only(episodes: EpisodeService) -> None:
    used = episodes.add(EpisodeIn(channel="chat", source="user", gist="The kite festival."))
    unused = episodes.add(EpisodeIn(channel="chat", source="user", gist="The bake sale."))
    later = 1000.0 + 20 * DAY
    before = episode_weight(0, 1000.0, later)
    assert episodes.touch([used, used, 999], later, "turns") == 1  # unknown id skipped
    row, other = episodes.get(used), episodes.get(unused)
    assert row is not None and other is not None
    assert row["last_relevant_at"] == later and other["last_relevant_at"] == 1000.0
    assert episode_weight(0, row["last_relevant_at"], later) > before
    assert episodes.touch([used], later - DAY, "turns") == 0  # never moves back
    assert episodes.get(used)["last_relevant_at"] == later  # type: ignore[index]
    logged = episodes.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'episodes' AND op = 'update'"
        " AND writer = 'turns'")
    assert logged == 1


def test_touch_skips_tombstoned_episodes(episodes: EpisodeService) -> None:
    child = episodes.add(EpisodeIn(channel="chat", source="user", gist="Leaf one."))
    episodes.add(EpisodeIn(channel="chat", source="user", gist="Parent.", level=1,
                           children=[child]))
    assert episodes.touch([child], 5000.0) == 0
