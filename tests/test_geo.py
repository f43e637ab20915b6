"""The geo job: places and habits from the location history.

Pure functions (runtime.mind.geo) on hand-made coordinates; the job end to end on a
real store, with rows written through the services (runtime.memories.location for
fixes, the transcript for GPS-tagged turns) and simulated weeks in a non-UTC
zone; the gazetteer offline; ``reverie place list|name`` and ``reverie jobs run
geo`` against a real runtime (one for the module)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import apsw
import pytest

from device.records import LocationRecord
from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.llm.providers import make_llm
from runtime.memories.facts import FactIn, Resolution
from runtime.memories.location import store_fixes
from runtime.memories.transcript import Location, TurnIn
from runtime.memory import Memory
from runtime.mind import geo, geo_job
from runtime.mind.contract import JobContext
from runtime.mind.geo import Observation, Params
from runtime.time.clock import ManualClock
from tests.reverie_process import reverie as run_reverie
from tests.reverie_process import start_runtime

TOKYO = ZoneInfo("Asia/Tokyo")
NEW_YORK = ZoneInfo("America/New_York")

# Real places (the gazetteer names them): home in Porto, work in Matosinhos
# (8 km away), grandma's in Vila Nova de Gaia (3 km), and a cafe in Porto.
HOME = (41.1496, -8.6110)
WORK = (41.1844, -8.6963)
GRANDMA = (41.1239, -8.6118)
CAFE = (41.1579, -8.6291)
LISBON = (38.7223, -9.1393)


def moved(point: tuple[float, float], north_m: float, east_m: float) -> tuple[float, float]:
    """``point`` moved by metres north and east."""
    lat, lon = point
    return (lat + north_m / 111_195.0,
            lon + east_m / (111_195.0 * math.cos(math.radians(lat))))


def jitter(point: tuple[float, float], i: int) -> tuple[float, float]:
    """GPS noise of up to ~25 m, deterministic."""
    return moved(point, ((i * 7) % 11 - 5) * 5.0, ((i * 5) % 9 - 4) * 6.0)


def local(zone: tzinfo, day: date, hour: int, minute: int = 0) -> float:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone).timestamp()


def every(zone: tzinfo, day: date, start: tuple[int, int], end: tuple[int, int],
          step_min: int) -> Iterator[float]:
    """Times on ``day`` from ``start`` to ``end`` (local, inclusive) every ``step_min``."""
    at, stop = local(zone, day, *start), local(zone, day, *end)
    while at <= stop:
        yield at
        at += step_min * 60


def weeks_of_life(zone: tzinfo, monday: date, weeks: int, grandma: bool = True
                  ) -> tuple[list[tuple[float, float, float]], list[float]]:
    """Ana's phone fixes (at, lat, lon) over ``weeks`` weeks read in ``zone``: nights
    and weekends at HOME, weekday daytimes (09:00-17:30) at WORK with a drive in
    between, and, with ``grandma``, Sunday afternoons (14:00-17:00) away from
    home, when the phone sends no fixes: the times of her turns at GRANDMA."""
    fixes: list[tuple[float, float, float]] = []
    visits: list[float] = []

    def at(point: tuple[float, float], times: Iterator[float]) -> None:
        for t in times:
            fixes.append((t, *jitter(point, len(fixes))))

    for d in range(weeks * 7):
        day = monday + timedelta(days=d)
        if day.weekday() < 5:
            at(HOME, every(zone, day, (0, 0), (8, 30), 30))
            for k, t in enumerate(every(zone, day, (8, 35), (8, 55), 10)):  # the drive
                fixes.append((t, HOME[0] + (WORK[0] - HOME[0]) * (k + 1) / 4,
                              HOME[1] + (WORK[1] - HOME[1]) * (k + 1) / 4))
            at(WORK, every(zone, day, (9, 0), (17, 30), 30))
            for k, t in enumerate(every(zone, day, (17, 35), (17, 55), 10)):
                fixes.append((t, WORK[0] + (HOME[0] - WORK[0]) * (k + 1) / 4,
                              WORK[1] + (HOME[1] - WORK[1]) * (k + 1) / 4))
            at(HOME, every(zone, day, (18, 0), (23, 30), 30))
        elif day.weekday() == 6 and grandma:
            at(HOME, every(zone, day, (0, 0), (13, 30), 30))
            visits.extend(every(zone, day, (14, 0), (17, 0), 20))
            at(HOME, every(zone, day, (17, 15), (23, 30), 30))
        else:
            at(HOME, every(zone, day, (0, 0), (23, 30), 30))
    return fixes, visits


def observations(fixes: list[tuple[float, float, float]], visits: list[float],
                 person: str = "ana") -> list[Observation]:
    return ([Observation(person, t, lat, lon) for t, lat, lon in fixes]
            + [Observation(person, t, *jitter(GRANDMA, i)) for i, t in enumerate(visits)])


# -- pure functions ---------------------------------------------------------------------


def test_haversine_sanity() -> None:
    assert geo.haversine_m(*HOME, *HOME) == 0.0
    porto_lisbon = geo.haversine_m(*HOME, *LISBON)
    assert 270_000 < porto_lisbon < 278_000  # 274 km as the crow flies
    assert porto_lisbon == pytest.approx(geo.haversine_m(*LISBON, *HOME))
    assert geo.haversine_m(0, 0, 1, 0) == pytest.approx(111_195, rel=1e-3)  # a degree
    # across the antimeridian: 0.002 degrees of longitude at the equator, not 360
    assert geo.haversine_m(0, 179.999, 0, -179.999) == pytest.approx(222.4, rel=1e-2)
    assert geo.haversine_m(*moved(HOME, 100, 0), *HOME) == pytest.approx(100, rel=1e-3)
    lat, lon = geo.centre([(0, 179.9), (0, -179.9)])
    assert lat == pytest.approx(0, abs=1e-9) and abs(lon) == pytest.approx(180, abs=1e-6)


def test_two_clusters_a_few_km_apart_and_noise_are_two_places() -> None:
    near_home = [jitter(HOME, i) for i in range(6)]
    near_work = [jitter(WORK, i) for i in range(5)]
    noise = [CAFE, LISBON, moved(HOME, 1500, 0)]
    points = [near_home[0], noise[0], *near_work[:2], *near_home[1:], noise[1], *near_work[2:],
              noise[2]]
    labels = geo.cluster(points, radius_m=150, min_points=3)
    home_labels = {labels[points.index(p)] for p in near_home}
    work_labels = {labels[points.index(p)] for p in near_work}
    assert len(home_labels) == 1 and len(work_labels) == 1
    assert home_labels != work_labels and geo.NOISE not in home_labels | work_labels
    assert [labels[points.index(p)] for p in noise] == [geo.NOISE] * 3
    assert sorted(set(labels)) == [geo.NOISE, 0, 1]
    assert geo.cluster(points, 150, 3) == labels  # deterministic


def test_points_100_m_apart_are_one_place_and_200_m_apart_are_not() -> None:
    chain = [moved(HOME, 100 * k, 0) for k in range(5)]  # 400 m end to end
    assert geo.cluster(chain, radius_m=150, min_points=2) == [0] * 5
    pair = [HOME, moved(HOME, 0, 100)]
    assert geo.cluster(pair, radius_m=150, min_points=2) == [0, 0]
    apart = [HOME, moved(HOME, 0, 200)]
    assert geo.cluster(apart, radius_m=150, min_points=2) == [geo.NOISE, geo.NOISE]
    assert geo.cluster([], 150, 2) == []


def test_stays_ignore_a_drive_and_last_until_seen_elsewhere() -> None:
    t = 1_700_000_000.0
    drive = [Observation("ana", t + 30 * k, *moved(HOME, 400 * k, 0)) for k in range(20)]
    assert geo.find_stays(drive) == []
    # sparse fixes of a slow drive (2 km every 10 minutes): no time left to stay
    slow = [Observation("ana", t + 600 * k, *moved(HOME, 2000 * k, 0)) for k in range(6)]
    assert geo.find_stays(slow) == []
    # a phone in "significant changes" mode: one fix at home in the evening, the
    # next one at work in the morning: home until Ana must have left, on foot
    night = [Observation("ana", t, *HOME), Observation("ana", t + 9.5 * 3600, *WORK),
             Observation("ana", t + 10 * 3600, *WORK)]
    walk = geo.haversine_m(*HOME, *WORK) / 1.4
    stays = geo.find_stays(night)
    assert [(s.start, s.end) for s in stays] == [(t, pytest.approx(t + 9.5 * 3600 - walk)),
                                                 (t + 9.5 * 3600, t + 10 * 3600)]
    # too long without a word: the stay ends at its last observation
    lost = [Observation("ana", t, *HOME), Observation("ana", t + 20 * 60, *HOME),
            Observation("ana", t + 3 * 86400, *WORK)]
    assert [(s.start, s.end) for s in geo.find_stays(lost)] == [(t, t + 20 * 60)]


def test_a_place_needs_visits_on_several_days() -> None:
    def stay(day: date, hour: int) -> geo.Stay:
        start = local(TOKYO, day, hour)
        return geo.Stay("ana", start, start + 1800, *jitter(CAFE, hour), points=4)

    monday = date(2023, 10, 2)
    one_day = [stay(monday, h) for h in (8, 12, 18)]
    assert geo.cluster([(s.lat, s.lon) for s in one_day], 150, 3) == [0, 0, 0]
    assert geo.find_places(one_day, TOKYO) == []
    three_days = [stay(monday + timedelta(days=d), 12) for d in range(3)]
    [place] = geo.find_places(three_days, TOKYO)
    assert (place.days, place.stays) == (3, (0, 1, 2))
    assert geo.haversine_m(place.lat, place.lon, *CAFE) < 30


def test_habits_by_time_of_week_in_the_households_zone() -> None:
    """Four weeks in Tokyo (UTC+9: a night there is an afternoon in UTC)."""
    fixes, visits = weeks_of_life(TOKYO, date(2023, 10, 2), weeks=4)
    stays = geo.find_stays(observations(fixes, visits))
    places = geo.find_places(stays, TOKYO)
    assert len(places) == 3
    where: dict[int, tuple[float, float]] = {}
    for index, place in enumerate(places):
        off = {p: geo.haversine_m(p[0], p[1], place.lat, place.lon)
               for p in (HOME, WORK, GRANDMA)}
        where[index] = min(off, key=lambda p: off[p])
        assert off[where[index]] < 40
    assert [where[i] for i in range(3)] == [HOME, WORK, GRANDMA]  # most days first
    assert places[0].days == 28 and places[1].days == 20 and places[2].days == 4
    visits_at = [(stays[i], pid) for pid, place in enumerate(places) for i in place.stays]
    habits = geo.find_habits(visits_at, TOKYO)
    assert [(h.kind, where[h.place], h.weekday, h.part, h.support) for h in habits] == [
        ("home", HOME, None, None, 28),
        ("work", WORK, None, None, 20),
        ("regular", GRANDMA, 6, "afternoon", 4)]
    assert [h.when for h in habits] == ["most nights", "weekday daytimes", "Sunday afternoons"]
    assert all(0.5 < h.confidence <= 0.95 for h in habits)
    # read in UTC the same weeks are another life: Tokyo's nights are UTC's afternoons
    utc = geo.find_habits(visits_at, ZoneInfo("UTC"))
    assert [(h.kind, where[h.place]) for h in utc][:2] == [("home", WORK), ("work", HOME)]


def test_too_few_nights_make_no_home_and_confidence_grows_with_support() -> None:
    fixes, _ = weeks_of_life(TOKYO, date(2023, 10, 2), weeks=1, grandma=False)
    stays = geo.find_stays(observations(fixes[:100], []))  # Monday to Wednesday morning
    places = geo.find_places(stays, TOKYO, Params(min_visits=2))
    habits = geo.find_habits([(stays[i], pid) for pid, p in enumerate(places)
                              for i in p.stays], TOKYO, Params(min_nights=4))
    assert "home" not in {h.kind for h in habits}
    assert geo.confidence(1.0, 3) < geo.confidence(1.0, 10) < geo.confidence(1.0, 100) <= 0.95
    assert geo.confidence(0.5, 10) < geo.confidence(1.0, 10)


def test_ids_stay_with_their_place_across_runs() -> None:
    def found(*points: tuple[float, float]) -> list[geo.FoundPlace]:
        return [geo.FoundPlace(lat, lon, (), 3, 0.0, 0.0) for lat, lon in points]

    ids, nxt = geo.assign_ids([], found(HOME, WORK), 150, 1)
    assert (ids, nxt) == ([1, 2], 3)
    known = [(1, *HOME), (2, *WORK)]
    # the centres drifted a little, the order changed, and a new place appeared
    ids, nxt = geo.assign_ids(known, found(moved(WORK, 40, 0), GRANDMA, moved(HOME, 0, -60)),
                              150, 3)
    assert (ids, nxt) == ([2, 3, 1], 4)


def test_the_gazetteer_names_real_places_offline() -> None:
    book = geo.gazetteer()
    assert len(book) > 100_000  # GeoNames cities of 1000 people or more
    porto = book.nearest(*HOME)
    assert (porto.label, porto.distance_m < 100) == ("near Porto, Porto, PT", True)
    assert book.nearest(*LISBON).label == "near Lisbon, Lisbon, PT"
    assert book.nearest(*WORK).label == "near Matosinhos, Porto, PT"
    assert book.nearest(-33.8688, 151.2093).cc == "AU"  # Sydney
    assert geo.gazetteer() is book  # loaded once per process


def test_a_broken_gazetteer_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "cities.csv"
    bad.write_text("not,a,gazetteer\n1,2,3\n")
    with pytest.raises(geo.GazetteerUnavailable, match="not a GeoNames cities file"):
        geo.Gazetteer.load(bad)
    small = tmp_path / "small.csv"
    small.write_text("lat,lon,name,admin1,admin2,cc\n41.15,-8.61,Porto,Porto,,PT\n"
                     "38.72,-9.14,Lisbon,Lisbon,,PT\nbroken,row\n")
    assert geo.Gazetteer.load(small).nearest(39.0, -9.0).name == "Lisbon"


# -- the job on a real store --------------------------------------------------------------

MONDAY = date(2023, 10, 23)  # four weeks across the end of US daylight saving time (Nov 5)


class World:
    """A real store with Ana's weeks written through the services."""

    def __init__(self, settings: Settings, embedder: Embedder) -> None:
        self.clock = ManualClock(local(NEW_YORK, MONDAY + timedelta(weeks=6), 12))
        self.memory = Memory(settings, clock=self.clock, embedder=embedder)
        self.settings = settings
        self.weeks = 0

    def add_weeks(self, weeks: int) -> None:
        """Ana's next weeks: fixes from her phone (OwnTracks), her turns at grandma's
        (source user, GPS-tagged), and an agent's turns at a cafe every Saturday
        (a source without geo: never a place)."""
        start = MONDAY + timedelta(weeks=self.weeks)
        fixes, visits = weeks_of_life(NEW_YORK, start, weeks)
        records = [LocationRecord("ana", lat, lon, t, "owntracks", 12.0) for t, lat, lon in fixes]
        # fixes too coarse to place anyone (500 m off, 3 km uncertain): ignored
        records += [LocationRecord("ana", *moved(HOME, 500, 0), t + 60, "owntracks", 3000.0)
                    for t, _, _ in fixes[::7]]
        store_fixes(self.memory.store, records, self.memory.profiles)
        turns = [TurnIn(channel="phone", source="user", speaker="Ana", content="I'm at grandma's",
                        created_at=t, location=Location(lat=lat, lon=lon, accuracy_m=8))
                 for i, t in enumerate(visits) for lat, lon in [jitter(GRANDMA, i)]]
        saturdays = [start + timedelta(days=5 + 7 * w) for w in range(weeks)]
        turns += [TurnIn(channel="agent", source="external-agent:helper", speaker="helper",
                         content="Ana is at the cafe", created_at=t,
                         location=Location(lat=CAFE[0], lon=CAFE[1], accuracy_m=5))
                  for day in saturdays for t in every(NEW_YORK, day, (10, 0), (14, 0), 20)]
        self.memory.add_turns(turns)
        self.weeks += weeks
        self.clock.advance(weeks * 7 * 86400)  # the job runs when they are over

    def ctx(self, writer: Any = None) -> JobContext:
        return JobContext(store=self.memory.store, writer=writer or self.memory,
                          llm=make_llm(self.settings.llm), clock=self.clock,
                          settings=self.settings)

    def counts(self) -> tuple[int, int]:
        s = self.memory.store
        return (int(s.scalar("SELECT count(*) FROM facts")),
                int(s.scalar("SELECT count(*) FROM write_log")))

    def current(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["subject"], r["key"]): r for r in self.memory.store.rows(
            "SELECT * FROM facts WHERE valid_to IS NULL")}

    def values(self) -> dict[tuple[str, str], str]:
        return {k: r["value"] for k, r in self.current().items()}


@pytest.fixture
def world(make_settings: Callable[..., Settings], embedder: Embedder) -> Iterator[World]:
    w = World(make_settings(household={"timezone": "America/New_York"}), embedder)
    w.add_weeks(4)
    yield w
    w.memory.close()


def test_with_no_locations_the_job_ends_ok_with_nothing(
        make_settings: Callable[..., Settings], embedder: Embedder) -> None:
    w = World(make_settings(), embedder)
    try:
        w.memory.add_turns([TurnIn(channel="chat", source="user", content="hello")])
        result = geo_job.run(w.ctx())
        assert (result.items, result.more) == (0, False)
        assert result.detail == "0 places, 0 habits; 0 facts (none)"
        assert geo_job.list_places(w.memory.store) == {"places": [], "habits": []}
        assert geo_job.run(w.ctx()).detail == "no new locations"
    finally:
        w.memory.close()


EXPECTED = {
    ("household", "place_1"): "home, near Porto, Porto, PT",
    ("household", "place_2"): "work, near Matosinhos, Porto, PT",
    ("household", "place_3"): "regular visits, near Vila Nova de Gaia, Porto, PT",
    ("Ana", "home_place_1"): "near Porto, Porto, PT, most nights",
    ("Ana", "work_place_2"): "near Matosinhos, Porto, PT, weekday daytimes",
    ("Ana", "visits_place_3_sunday_afternoon"):
        "near Vila Nova de Gaia, Porto, PT, Sunday afternoons",
}


def test_the_job_writes_places_and_habits_and_a_rerun_writes_nothing(world: World) -> None:
    first = geo_job.run(world.ctx())
    assert first.items == 6 and not first.more, first.detail
    assert world.values() == EXPECTED
    facts = world.current()
    assert {r["source"] for r in facts.values()} == {"geo"}
    assert facts[("household", "place_1")]["kind"] == "place"
    assert facts[("Ana", "home_place_1")]["kind"] == "behavioral_pattern"
    assert 0.9 < facts[("Ana", "home_place_1")]["confidence"] <= 0.95
    # valid since the first evidence, not since the run
    assert facts[("household", "place_3")]["valid_from"] == pytest.approx(
        local(NEW_YORK, MONDAY + timedelta(days=6), 14))
    listed = geo_job.list_places(world.memory.store)
    assert [(p["id"], p["role"], p["days"]) for p in listed["places"]] == [
        (1, "home", 28), (2, "work", 20), (3, "regular", 4)]
    assert {(h["person"], h["habit"], h["place"], h["support"]) for h in listed["habits"]} == {
        ("Ana", "home", 1, 28), ("Ana", "work", 2, 20), ("Ana", "regular", 3, 4)}

    before = world.counts()
    again = geo_job.run(world.ctx())
    assert (again.items, again.detail) == (0, "no new locations")
    assert world.counts() == before
    # new input that changes nothing (a lone fix far away), read an hour later:
    # recomputed, nothing written
    store_fixes(world.memory.store, [LocationRecord("ana", *LISBON, world.clock.now() - 86400,
                                                    "owntracks", 10.0)], world.memory.profiles)
    soon = geo_job.run(world.ctx())
    assert (soon.items, soon.detail) == (0, "new locations are read at most once an hour")
    world.clock.advance(3600)
    third = geo_job.run(world.ctx())
    assert third.items == 0 and third.detail.startswith("3 places, 3 habits; 0 facts")
    assert world.counts() == before


def test_new_weeks_reinforce_without_new_rows(world: World) -> None:
    geo_job.run(world.ctx())
    rows, _ = world.counts()
    world.add_weeks(1)
    result = geo_job.run(world.ctx())
    assert result.items == 6 and "reinforce 6" in result.detail, result.detail
    assert world.counts()[0] == rows
    assert world.values() == EXPECTED
    assert {r["claims"] for r in world.current().values()} == {2}


def test_a_users_name_wins_and_survives_later_runs(world: World) -> None:
    geo_job.run(world.ctx())
    # what `reverie place name 3 "grandma's house"` sends to the Graph actor
    fact_id, _ = world.memory.add_fact(geo_job.naming_fact(3, "  grandma's   house "), "cli")
    renamed = geo_job.run(world.ctx())
    assert renamed.items == 2 and "supersede 2" in renamed.detail, renamed.detail
    values = world.values()
    assert values[("household", "place_3")] == (
        "regular visits, grandma's house (near Vila Nova de Gaia, Porto, PT)")
    assert values[("Ana", "visits_place_3_sunday_afternoon")] == (
        "grandma's house, Sunday afternoons")
    assert values[("household", "place_3_name")] == "grandma's house"
    world.add_weeks(1)
    geo_job.run(world.ctx())
    facts = world.current()
    name = facts[("household", "place_3_name")]
    assert (name["id"], name["user_managed"], name["source"]) == (fact_id, 1, "user")
    assert facts[("Ana", "visits_place_3_sunday_afternoon")]["value"] == (
        "grandma's house, Sunday afternoons")
    assert geo_job.list_places(world.memory.store)["places"][2]["name"] == "grandma's house"


def test_the_job_leaves_user_corrections_and_forgotten_facts_alone(world: World) -> None:
    geo_job.run(world.ctx())
    facts = world.current()
    world.memory.graph.edit(facts[("Ana", "work_place_2")]["id"], "the office")
    world.memory.graph.forget(facts[("household", "place_2")]["id"])
    world.add_weeks(1)
    result = geo_job.run(world.ctx())
    assert "user's 1" in result.detail and "forgotten 1" in result.detail, result.detail
    values = world.values()
    assert values[("Ana", "work_place_2")] == "the office"
    assert ("household", "place_2") not in values


class CrashingWriter:
    """Writes through the real graph, then dies after ``limit`` facts."""

    def __init__(self, memory: Memory, limit: int) -> None:
        self.memory, self.limit = memory, limit

    def add_fact(self, fact: FactIn, writer: str) -> tuple[int, Resolution]:
        if self.limit == 0:
            raise RuntimeError("the actor died")
        self.limit -= 1
        return self.memory.add_fact(fact, writer)


def test_a_rerun_after_a_crash_writes_each_fact_once(world: World) -> None:
    with pytest.raises(RuntimeError):
        geo_job.run(world.ctx(CrashingWriter(world.memory, 2)))
    assert len(world.current()) == 2
    resumed = geo_job.run(world.ctx())
    assert resumed.items == 4, resumed.detail
    assert world.values() == EXPECTED
    inserts = world.memory.store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'facts' AND op = 'insert'")
    assert inserts == 6 and world.counts()[0] == 6
    assert geo_job.run(world.ctx()).items == 0


# -- the CLI against a real runtime ---------------------------------------------------------

NS = "test-geo"


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_reverie(env, *args, timeout=300)  # in-process when joined here


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("geo-data")
    env = {**os.environ, "REVERIE_DATA_DIR": str(data), "REVERIE_RUNTIME__NAMESPACE": NS,
           "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_PERSONA__GLOBAL_DIR": str(data / "persona"), "REVERIE_HTTP__PORT": "0",
           "REVERIE_HOUSEHOLD__TIMEZONE": "America/New_York"}
    proc = start_runtime(env, "--address", ray_instance)
    yield env
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def _db(env: dict[str, str]) -> apsw.Connection:
    path = Path(env["REVERIE_DATA_DIR"]) / "reverie.db"
    return apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)


def test_place_commands_with_a_real_runtime(runtime: dict[str, str]) -> None:
    from actors.handles import TranscriptClient
    from actors.messages import Fix, RecordFixes

    empty = reverie(runtime, "place", "list")
    assert empty.returncode == 0 and "no places yet" in empty.stdout, empty.stderr
    fixes, _ = weeks_of_life(NEW_YORK, MONDAY, weeks=3, grandma=False)
    client = TranscriptClient(NS)
    for start in range(0, len(fixes), 500):  # through the Transcript actor, as the edge does
        client.record_fixes(RecordFixes(fixes=[
            Fix(person="ana", lat=lat, lon=lon, at=t, source="owntracks", accuracy_m=10)
            for t, lat, lon in fixes[start:start + 500]]))

    ran = reverie(runtime, "jobs", "run", "geo", "--wait")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("geo: ok, 4 items (2 places, 2 habits"), ran.stdout
    listed = reverie(runtime, "place", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    places = json.loads(listed.stdout)["places"]
    assert [(p["id"], p["name"], p["role"]) for p in places] == [
        (1, "near Porto, Porto, PT", "home"), (2, "near Matosinhos, Porto, PT", "work")]
    table = reverie(runtime, "place", "list")
    assert "near Matosinhos, Porto, PT" in table.stdout and "habits:" in table.stdout

    named = reverie(runtime, "place", "name", "2", "the office")
    assert named.returncode == 0, named.stderr
    assert "fact:" in named.stdout
    assert reverie(runtime, "jobs", "run", "geo", "--wait").returncode == 0
    places = json.loads(reverie(runtime, "place", "list", "--json").stdout)["places"]
    assert [(p["name"], p["user_name"], p["gazetteer"]) for p in places][1] == (
        "the office", "the office", "near Matosinhos, Porto, PT")
    with _db(runtime) as db:
        values = dict(db.execute(
            "SELECT key, value FROM facts WHERE valid_to IS NULL AND subject = 'household'"))
        writers = {w for (w,) in db.execute(
            "SELECT DISTINCT writer FROM write_log WHERE table_name = 'facts'")}
    assert values["place_2"] == "work, the office (near Matosinhos, Porto, PT)"
    assert values["place_2_name"] == "the office"
    assert writers == {"geo", "cli"}
    recalled = reverie(runtime, "recall", "the office")
    assert recalled.returncode == 0 and "the office" in recalled.stdout

    missing = reverie(runtime, "place", "name", "9", "the moon")
    assert missing.returncode == 2 and "no place 9" in missing.stderr
    blank = reverie(runtime, "place", "name", "1", "   ")
    assert blank.returncode == 2 and "cannot be empty" in blank.stderr
    bad = reverie(runtime, "place", "name", "one", "home")
    assert bad.returncode == 2
