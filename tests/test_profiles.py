from pathlib import Path

import pytest

from runtime.config import CONFIG_DIR, ConfigError
from runtime.memories.profiles import MemoryProfiles


@pytest.fixture
def profiles() -> MemoryProfiles:
    return MemoryProfiles.load(CONFIG_DIR / "profiles.toml")


def test_user_has_all_five(profiles: MemoryProfiles) -> None:
    p = profiles.for_source("user")
    assert (p.episodes, p.facts, p.geo, p.patterns, p.location) == (True,) * 5


def test_dmn_is_memory_but_not_geo(profiles: MemoryProfiles) -> None:
    p = profiles.for_source("dmn")
    assert p.episodes and p.facts
    assert not (p.geo or p.patterns or p.location)


def test_external_agent_is_first_class_and_tagged(profiles: MemoryProfiles) -> None:
    r = profiles.resolve("external-agent:weather-bot")
    assert r.profile.episodes and r.profile.facts and r.tag == "weather-bot"


@pytest.mark.parametrize("source", ["delegate:search", "scheduled", "brand-new-channel",
                                    "external-agent:", "USER"])
def test_muted_and_unknown_sources(profiles: MemoryProfiles, source: str) -> None:
    assert profiles.for_source(source).muted


def test_broken_profile_names_the_field(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text('[sources.user]\nepisodes = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"sources\.user\.episodes"):
        MemoryProfiles.load(f)
    f.write_text('[sources.user]\nepisodez = true\n')
    with pytest.raises(ConfigError, match=r"sources\.user\.episodez"):
        MemoryProfiles.load(f)
