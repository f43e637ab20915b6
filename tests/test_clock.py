"""The household's time zone: from its name, or the system's when it has none.

The system's zone is driven by real means: ``$TZ`` (re-read by the C library
through ``time.tzset``), which is what a household's service manager sets.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from runtime.config import ConfigError, load_settings
from runtime.time.clock import ManualClock, household_zone, local_datetime

SetTZ = Callable[[str | None], None]

# Friday 2026-03-06 23:30 UTC: already Saturday in Auckland.
LATE_EVENING_UTC = datetime(2026, 3, 6, 23, 30, tzinfo=UTC).timestamp()
# Saturday 2026-03-07 03:30 UTC: still Friday in Los Angeles.
SMALL_HOURS_UTC = datetime(2026, 3, 7, 3, 30, tzinfo=UTC).timestamp()
JANUARY = datetime(2026, 1, 15, 12, 0, tzinfo=UTC).timestamp()
JULY = datetime(2026, 7, 15, 12, 0, tzinfo=UTC).timestamp()


@pytest.fixture
def set_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[SetTZ]:
    def set_(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("TZ", raising=False)
        else:
            monkeypatch.setenv("TZ", value)
        time.tzset()

    yield set_
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(("zone", "when", "local"), [
    ("Pacific/Auckland", LATE_EVENING_UTC, "Saturday 2026-03-07 12:30 +1300 NZDT"),
    ("America/Los_Angeles", SMALL_HOURS_UTC, "Friday 2026-03-06 19:30 -0800 PST"),
    ("Europe/Lisbon", JULY, "Wednesday 2026-07-15 13:00 +0100 WEST"),
    ("UTC", LATE_EVENING_UTC, "Friday 2026-03-06 23:30 +0000 UTC"),
])
def test_local_datetime_reads_the_clock_in_the_zone(zone: str, when: float, local: str) -> None:
    now = local_datetime(ManualClock(when), household_zone(zone))
    assert now.strftime("%A %Y-%m-%d %H:%M %z %Z") == local
    assert now.timestamp() == when


def test_local_datetime_follows_the_clock() -> None:
    clock = ManualClock(LATE_EVENING_UTC)
    zone = household_zone("Pacific/Auckland")
    before = local_datetime(clock, zone)
    clock.advance(12 * 3600)
    assert local_datetime(clock, zone) - before == timedelta(hours=12)
    assert local_datetime(clock, zone).date().isoformat() == "2026-03-08"


@pytest.mark.parametrize("name", ["Mars/Olympus", "America", "../etc/passwd", "/etc/localtime",
                                  "Europe/Lisbon/Old"])
def test_unknown_zone_is_an_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        household_zone(name)


@pytest.mark.parametrize(("tz", "key"), [
    ("Pacific/Auckland", "Pacific/Auckland"),
    (":Asia/Tokyo", "Asia/Tokyo"),
    ("/usr/share/zoneinfo/America/New_York", "America/New_York"),
])
def test_empty_name_is_the_system_zone_from_tz(set_tz: SetTZ, tz: str, key: str) -> None:
    if not Path("/usr/share/zoneinfo", key).exists():
        pytest.skip("no system zoneinfo tree")
    set_tz(tz)
    zone = household_zone("")
    assert isinstance(zone, ZoneInfo) and zone.key == key
    assert household_zone("  ") == zone


def test_tz_naming_a_zone_file_outside_the_zoneinfo_tree(set_tz: SetTZ, tmp_path: Path) -> None:
    source = Path("/usr/share/zoneinfo/Pacific/Auckland")
    if not source.exists():
        pytest.skip("no system zoneinfo tree")
    copy = tmp_path / "household-zone"
    shutil.copyfile(source, copy)
    set_tz(str(copy))
    now = local_datetime(ManualClock(LATE_EVENING_UTC), household_zone(""))
    assert now.strftime("%Y-%m-%d %H:%M %z %Z") == "2026-03-07 12:30 +1300 NZDT"


@pytest.mark.parametrize(("when", "local"), [
    (JANUARY, "2026-01-15 13:00 +0100 STD"),
    (JULY, "2026-07-15 14:00 +0200 DST"),
])
def test_tz_rule_that_zoneinfo_cannot_read_follows_the_c_library(set_tz: SetTZ, when: float,
                                                                 local: str) -> None:
    """A POSIX rule (central European shape, made-up names): its daylight-saving
    switch must follow the date, not the moment the zone was looked up."""
    set_tz("STD-1DST,M3.5.0,M10.5.0/3")
    zone = household_zone("")
    now = local_datetime(ManualClock(when), zone)
    assert now.strftime("%Y-%m-%d %H:%M %z %Z") == local
    assert now.timestamp() == when
    assert now.dst() == (timedelta(hours=1) if when == JULY else timedelta(0))


def test_system_zone_agrees_with_the_c_library(set_tz: SetTZ) -> None:
    """Without $TZ the zone comes from /etc/localtime, as the C library's does."""
    set_tz(None)
    zone = household_zone("")
    for when in (JANUARY, JULY, LATE_EVENING_UTC):
        offset = local_datetime(ManualClock(when), zone).utcoffset()
        assert offset == timedelta(seconds=time.localtime(when).tm_gmtoff)


# -- configuration ----------------------------------------------------------------

def test_household_timezone_setting() -> None:
    assert load_settings(env={}).household.timezone == ""
    settings = load_settings(env={"REVERIE_HOUSEHOLD__TIMEZONE": "Pacific/Auckland"})
    assert settings.household.timezone == "Pacific/Auckland"
    assert household_zone(settings.household.timezone) == ZoneInfo("Pacific/Auckland")


def test_unknown_household_timezone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"household\.timezone: .*unknown time zone "
                                          r"'Mars/Olympus'"):
        load_settings(env={}, overrides={"household": {"timezone": "Mars/Olympus"}})
