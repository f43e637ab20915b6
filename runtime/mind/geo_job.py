"""The ``geo`` job: places and habits from where the household has been.

**Reads** (the job's own store connection): the location history
(``location_fixes``: every fix from the edge, at most ``max_accuracy_m``
uncertain, one a minute per person) and the GPS-tagged transcript rows of
sources whose profile has the ``geo`` switch (their speaker, or ``user``, is
the person). Only the last ``window_days`` of data count, up to the newest
observation (never one more than a day after the clock: a device with a wrong
clock does not move the window). :mod:`runtime.mind.geo` turns them into stays,
places and habits (home, work, regular visits in the household's time zone).
The hub's own fixes (``gps.person``) make places, not habits.

**Writes** (through ``ctx.writer``, so the Graph actor in the runtime; writer
and source ``geo``, a source whose profile feeds facts and nothing else):

- a ``place`` fact per place: subject ``household``, key ``place_<id>``, the
  value its role and name (``home, near Porto, Porto, PT``; ``regular visits,
  grandma's house (near Porto, Porto, PT)``);
- a ``behavioral_pattern`` fact per habit: subject the person, key
  ``home_place_<id>``, ``work_place_<id>`` or
  ``visits_place_<id>_<weekday>_<part>``, the value the place and when
  (``grandma's house, Sunday afternoons``), its confidence from the support
  (:func:`runtime.mind.geo.confidence`).

Keys are per place (and weekday and part of the day), so facts of the job
never contradict each other: a habit that stops is not reinforced any more
and fades with its kind's half-life; a new home is a new fact.

**Names.** A place is named by the gazetteer when it is first found (kept in
the registry below, named again only if it moves a kilometre), or by the user:
``reverie place name 3 "grandma's house"`` writes a user-managed ``place``
fact (subject ``household``, key ``place_3_name``, source ``user``) through
the Graph actor, like ``reverie remember``: one write path, and one the job
never writes, so the user's name survives every run and wins over the
gazetteer in the job's values. The job never writes over a user-managed or
seared fact either (a user's correction of a habit stands).

**Bookkeeping** (``job_state``, job ``geo``; not memory): ``places``, the
registry (id, centre, gazetteer name, days, role), which keeps ids stable from
run to run (:func:`runtime.mind.geo.assign_ids`); ``written``, for each fact key,
the latest evidence already written; ``habits``, what ``reverie place list``
shows; ``last_run``, what the last complete run read, and when.

**Idempotent.** A run whose inputs (newest fix, located turns, users' names)
are those of the last complete run writes nothing; so does one with only new
data within an hour of it (:data:`MIN_INTERVAL_S`: a hub's receiver adds a
fix every few seconds, and a run re-reads weeks). Otherwise it recomputes
everything and writes only what changed: a new fact, a new value (a new role,
a new name: it supersedes, with at least the current confidence, since the
evidence did not change), or new evidence (a later stay: a reinforcement).
A fact the user forgot is not brought back. ``written`` is saved after each
fact, so a re-run after a crash writes nothing twice (the one exception: a
crash between a write and its bookkeeping reinforces that fact once more,
never adding a row).

Nothing here logs a position or a place's name.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.geo import (
    DAY_NAMES,
    Gazetteer,
    GazetteerUnavailable,
    Habit,
    Observation,
    Params,
    assign_ids,
    confidence,
    find_habits,
    find_places,
    find_stays,
    gazetteer,
    haversine_m,
)
from runtime.store.database import Store
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import DAY, household_zone

log = logging.getLogger(__name__)

JOB = "geo"
WRITER = "geo"
SOURCE = "geo"
SUBJECT = "household"  # the subject of place facts
USER = "user"          # the person of a located turn without a speaker
PARAMS = Params()
RENAME_M = 1000.0      # a place whose centre moved this far is named again
MAX_NAME = 100
MINUTE = 60
# New fixes alone bring a full re-read (weeks of data) at most this often; a
# user's name for a place is taken at the next run.
MIN_INTERVAL_S = 3600.0

ROLE_ORDER = ("home", "work", "regular", "visited")
ROLE_WORDS = {"home": "home", "work": "work", "regular": "regular visits", "visited": "visited"}
_NAME_KEY = re.compile(r"^place_(\d+)_name$")


def place_key(place: int) -> str:
    return f"place_{place}"


def name_key(place: int) -> str:
    return f"place_{place}_name"


def habit_key(habit: Habit) -> str:
    if habit.kind == "regular":
        assert habit.weekday is not None and habit.part is not None
        day = DAY_NAMES[habit.weekday].lower()
        return f"visits_place_{habit.place}_{day}_{habit.part}"
    return f"{habit.kind}_place_{habit.place}"


def naming_fact(place: int, name: str) -> FactIn:
    """The user's name for a place: user-managed, written through the Graph actor."""
    name = " ".join(name.split())
    if not name:
        raise ValueError("a place's name cannot be empty")
    if len(name) > MAX_NAME:
        raise ValueError(f"a place's name has at most {MAX_NAME} characters")
    return FactIn(kind="place", subject=SUBJECT, key=name_key(place), value=name,
                  confidence=1.0, source="user", user_managed=True,
                  provenance=[f"geo:place:{place}"])


# -- the registry of places (job_state) -------------------------------------------------


@dataclass
class KnownPlace:
    id: int
    lat: float
    lon: float
    town: str | None = None        # the gazetteer's name ("near Porto, Porto, PT")
    town_lat: float | None = None  # where it was named
    town_lon: float | None = None
    days: int = 0
    stays: int = 0
    first: float | None = None
    last: float | None = None
    role: str = "visited"


@dataclass
class Registry:
    next_id: int = 1
    places: dict[int, KnownPlace] = field(default_factory=dict)

    @classmethod
    def load(cls, store: Store) -> Registry:
        raw = get_state(store, JOB, "places", None) or {}
        places = {int(p["id"]): KnownPlace(**p) for p in raw.get("places", [])}
        return cls(int(raw.get("next_id", 1)), places)

    def save(self, store: Store) -> None:
        set_state(store, JOB, "places", {
            "next_id": self.next_id,
            "places": [asdict(self.places[i]) for i in sorted(self.places)]})


def known_place_ids(store: Store) -> set[int]:
    return set(Registry.load(store).places)


def user_names(store: Store) -> dict[int, tuple[int, str]]:
    """The users' names of places: place id -> (fact id, name), current and enabled."""
    out: dict[int, tuple[int, str]] = {}
    for row in store.rows(
            "SELECT id, key, value FROM facts WHERE subject = ? AND kind = 'place'"
            " AND key LIKE 'place\\_%\\_name' ESCAPE '\\' AND valid_to IS NULL"
            " AND disabled = 0 ORDER BY id", (SUBJECT,)):
        match = _NAME_KEY.match(row["key"])
        if match:
            out[int(match.group(1))] = (int(row["id"]), str(row["value"]))
    return out


# -- reading ------------------------------------------------------------------------------


@dataclass
class Observed:
    observations: list[Observation]
    spelling: dict[str, str]  # person (lower case) -> how to write them


def load_observations(store: Store, profiles: MemoryProfiles, now: float,
                      params: Params = PARAMS) -> Observed:
    """The window's observations: fixes (one a minute per person) and the located
    turns of sources with the ``geo`` switch."""
    horizon = now + DAY
    newest = max((t for t in (
        store.scalar("SELECT max(at) FROM location_fixes WHERE at <= ?", (horizon,)),
        store.scalar("SELECT max(created_at) FROM transcript WHERE lat IS NOT NULL"
                     " AND created_at <= ?", (horizon,))) if t is not None), default=None)
    if newest is None:
        return Observed([], {})
    since = float(newest) - params.window_days * DAY
    out: list[Observation] = []
    speakers: dict[str, set[str]] = {}
    people: dict[str, set[str]] = {}
    # SQLite: the bare columns come from the row with min(at)
    for row in store.rows(
            "SELECT person, lat, lon, min(at) AS at FROM location_fixes"
            " WHERE at BETWEEN ? AND ? AND (accuracy_m IS NULL OR accuracy_m <= ?)"
            f" GROUP BY lower(person), CAST(at / {MINUTE} AS INTEGER)",
            (since, newest, params.max_accuracy_m)):
        who = str(row["person"])
        people.setdefault(who.lower(), set()).add(who)
        out.append(Observation(who.lower(), float(row["at"]), float(row["lat"]),
                               float(row["lon"])))
    geo: dict[str, bool] = {}
    for row in store.rows(
            "SELECT source, speaker, lat, lon, created_at FROM transcript"
            " WHERE lat IS NOT NULL AND lon IS NOT NULL AND disabled = 0"
            " AND created_at BETWEEN ? AND ? AND (accuracy_m IS NULL OR accuracy_m <= ?)",
            (since, newest, params.max_accuracy_m)):
        source = str(row["source"])
        if source not in geo:
            geo[source] = profiles.for_source(source).geo
        if not geo[source]:
            continue
        who = " ".join(str(row["speaker"] or USER).split()) or USER
        speakers.setdefault(who.lower(), set()).add(who)
        out.append(Observation(who.lower(), float(row["created_at"]), float(row["lat"]),
                               float(row["lon"])))
    spelling = {key: min(names) for key, names in people.items()}
    spelling.update({key: min(names) for key, names in speakers.items()})  # as they speak
    return Observed(out, spelling)


def _inputs(store: Store, ctx: JobContext) -> dict[str, Any]:
    """What a run reads, in short: equal to the last complete run's, nothing to do."""
    turns = store.row("SELECT count(*) AS n, coalesce(max(id), 0) AS last FROM transcript"
                      " WHERE lat IS NOT NULL")
    assert turns is not None
    return {"data": [int(store.scalar("SELECT coalesce(max(id), 0) FROM location_fixes")),
                     int(turns["n"]), int(turns["last"])],
            "names": sorted(fid for fid, _ in user_names(store).values()),
            "settings": [ctx.settings.household.timezone, ctx.settings.gps.person]}


def _skip(last: dict[str, Any] | None, inputs: dict[str, Any], now: float) -> str | None:
    """Why this run has nothing to do, if it has not: its inputs are the last
    complete run's, or only new data came, within :data:`MIN_INTERVAL_S`."""
    if not last:
        return None
    if last.get("inputs") == inputs:
        return "no new locations"
    same = all(last["inputs"].get(k) == inputs[k] for k in ("names", "settings"))
    if same and now - float(last.get("at", -math.inf)) < MIN_INTERVAL_S:
        return "new locations are read at most once an hour"
    return None


# -- the run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    fact: FactIn
    last: float  # the latest evidence behind it


@dataclass
class Tally:
    places: int = 0
    habits: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    unnamed: int = 0

    @property
    def written(self) -> int:
        return sum(self.actions.values())

    def detail(self) -> str:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(self.actions.items())) or "none"
        text = f"{self.places} places, {self.habits} habits; {self.written} facts ({acts})"
        if self.skipped:
            text += "; left alone: " + ", ".join(f"{k} {v}"
                                                 for k, v in sorted(self.skipped.items()))
        if self.unnamed:
            text += f"; {self.unnamed} places without a gazetteer name"
        return text


def run(ctx: JobContext, params: Params = PARAMS) -> JobResult:
    """The ``geo`` job (a :data:`runtime.mind.contract.JobFn`)."""
    store = ctx.store
    inputs = _inputs(store, ctx)
    skip = _skip(get_state(store, JOB, "last_run"), inputs, ctx.clock.now())
    if skip:
        return JobResult(items=0, detail=skip)
    zone = household_zone(ctx.settings.household.timezone)
    profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
    observed = load_observations(store, profiles, ctx.clock.now(), params)
    stays = find_stays(observed.observations, params)
    found = find_places(stays, zone, params)

    registry = Registry.load(store)
    ids, registry.next_id = assign_ids(
        [(p.id, p.lat, p.lon) for p in registry.places.values()], found, params.radius_m,
        registry.next_id)
    place_of: dict[int, int] = {}
    for pid, place in zip(ids, found):
        known = registry.places.setdefault(pid, KnownPlace(pid, place.lat, place.lon))
        known.lat, known.lon = place.lat, place.lon
        known.days, known.stays = place.days, len(place.stays)
        known.first = place.first if known.first is None else min(known.first, place.first)
        known.last = place.last if known.last is None else max(known.last, place.last)
        place_of.update(dict.fromkeys(place.stays, pid))
    tally = Tally(places=len(found))
    tally.unnamed = _name_places(registry, ids)

    hub = ctx.settings.gps.person.lower()
    habits = find_habits([(stays[i], pid) for i, pid in sorted(place_of.items())
                          if stays[i].person != hub], zone, params)
    tally.habits = len(habits)
    for pid in ids:
        roles: list[str] = [h.kind for h in habits if h.place == pid] or ["visited"]
        registry.places[pid].role = min(roles, key=ROLE_ORDER.index)
    registry.save(store)

    names = {pid: name for pid, (_, name) in user_names(store).items()}
    subjects = {h.person: _subject(store, observed.spelling.get(h.person, h.person))
                for h in habits}
    planned = [_place_fact(registry.places[pid], place.first, place.last, names.get(pid))
               for pid, place in zip(ids, found)]
    planned += [_habit_fact(h, subjects[h.person], registry.places[h.place],
                            names.get(h.place)) for h in habits]
    set_state(store, JOB, "habits", [
        {"person": subjects[h.person], "habit": h.kind, "place": h.place, "when": h.when,
         "support": h.support, "confidence": h.confidence, "key": habit_key(h)}
        for h in habits])

    written: dict[str, float] = get_state(store, JOB, "written", {})
    for item in planned:
        if ctx.out_of_time():
            log.info("geo job: out of time; %s", tally.detail())
            return JobResult(items=tally.written, detail=tally.detail(), more=True)
        _write(ctx, item, written, tally)
    set_state(store, JOB, "last_run", {"inputs": inputs, "at": ctx.clock.now()})
    log.info("geo job: %s", tally.detail())
    return JobResult(items=tally.written, detail=tally.detail())


def _name_places(registry: Registry, ids: list[int]) -> int:
    """Name the places that have no gazetteer name yet (or moved); return how
    many are left without one (no gazetteer installed)."""
    todo = [registry.places[pid] for pid in ids if _needs_name(registry.places[pid])]
    if not todo:
        return 0
    try:
        book: Gazetteer = gazetteer()
    except (GazetteerUnavailable, OSError) as exc:
        log.warning("geo job: places left unnamed: %s", exc)
        return len(todo)
    for place in todo:
        place.town = book.nearest(place.lat, place.lon).label
        place.town_lat, place.town_lon = place.lat, place.lon
    return 0


def _needs_name(place: KnownPlace) -> bool:
    if place.town is None or place.town_lat is None or place.town_lon is None:
        return True
    return haversine_m(place.lat, place.lon, place.town_lat, place.town_lon) > RENAME_M


def _subject(store: Store, person: str) -> str:
    """The person as facts already spell them (case aside), else as given."""
    found = store.scalar("SELECT subject FROM facts WHERE subject = ? COLLATE NOCASE"
                         " ORDER BY id LIMIT 1", (person,))
    return str(found) if found is not None else person


def label(place: KnownPlace, user_name: str | None) -> str:
    """What a place is called: the user's name, else the gazetteer's, else its number."""
    return user_name or place.town or f"place {place.id}"


def _place_fact(place: KnownPlace, first: float, last: float,
                user_name: str | None) -> Planned:
    value = f"{ROLE_WORDS[place.role]}, {label(place, user_name)}"
    if user_name and place.town:
        value += f" ({place.town})"
    return Planned(FactIn(
        kind="place", subject=SUBJECT, key=place_key(place.id), value=value,
        confidence=confidence(1.0, place.days), source=SOURCE,
        provenance=[f"geo:place:{place.id}", "rule:geo:place"], valid_from=first), last)


def _habit_fact(habit: Habit, subject: str, place: KnownPlace,
                user_name: str | None) -> Planned:
    return Planned(FactIn(
        kind="behavioral_pattern", subject=subject, key=habit_key(habit),
        value=f"{label(place, user_name)}, {habit.when}", confidence=habit.confidence,
        source=SOURCE, provenance=[f"geo:place:{place.id}", f"rule:geo:{habit.kind}"],
        valid_from=habit.first), habit.last)


def _same(a: str, b: str) -> bool:  # as runtime.memories.facts compares values
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _write(ctx: JobContext, item: Planned, written: dict[str, float], tally: Tally) -> None:
    """Write one planned fact if it is new, says something new, or has new evidence."""
    fact = item.fact
    mark = f"{fact.subject}\x1f{fact.key}"
    current = ctx.store.row(
        "SELECT value, confidence, user_managed, memory_level FROM facts"
        " WHERE subject = ? AND key = ? AND valid_to IS NULL ORDER BY id DESC LIMIT 1",
        (fact.subject, fact.key))
    if current is None:
        if mark in written:  # written before and gone: the user forgot it
            tally.skipped["forgotten"] += 1
            return
    elif current["user_managed"] or current["memory_level"] == "seared":
        tally.skipped["user's"] += 1
        return
    elif _same(current["value"], fact.value):
        if item.last <= written.get(mark, -math.inf):
            return  # nothing new
    else:  # a new role or name: the same evidence, so at least the current confidence
        fact = fact.model_copy(update={
            "confidence": max(fact.confidence, float(current["confidence"])),
            "valid_from": None})
    try:
        _, decision = ctx.writer.add_fact(fact, WRITER)
    except ValueError as exc:  # a muted source (profiles.toml without geo), a bad kind
        tally.skipped["refused"] += 1
        log.warning("geo job: fact refused: %s", type(exc).__name__)
        return
    tally.actions[decision.action] += 1
    written[mark] = max(item.last, written.get(mark, -math.inf))
    set_state(ctx.store, JOB, "written", written)


# -- reading for `reverie place list` ---------------------------------------------------


def list_places(store: Store) -> dict[str, Any]:
    """The places (id, names, role, days, first and last seen, centre) and the
    habits of the last run, for ``reverie place list``."""
    registry = Registry.load(store)
    names = user_names(store)
    facts = {str(r["key"]): int(r["id"]) for r in store.rows(
        "SELECT id, key FROM facts WHERE subject = ? AND kind = 'place'"
        " AND key LIKE 'place\\_%' ESCAPE '\\' AND valid_to IS NULL", (SUBJECT,))}
    places = []
    for pid in sorted(registry.places):
        p = registry.places[pid]
        user = names.get(pid)
        places.append({
            "id": pid, "name": label(p, user[1] if user else None),
            "user_name": user[1] if user else None, "gazetteer": p.town, "role": p.role,
            "days": p.days, "stays": p.stays, "first_seen": p.first, "last_seen": p.last,
            "lat": round(p.lat, 5), "lon": round(p.lon, 5),
            "fact": f"fact:{facts[place_key(pid)]}" if place_key(pid) in facts else None,
            "name_fact": f"fact:{user[0]}" if user else None})
    return {"places": places, "habits": get_state(store, JOB, "habits", [])}
