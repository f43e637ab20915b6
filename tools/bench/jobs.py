#!/usr/bin/env python3
"""Each background job's run time and peak memory on a store of 10,000 turns (issue 8).

Usage:
    tools/bench/jobs.py [--turns 10000] [--days 182] [--fix-days 91] [--new-turns 400]
                        [--interval 0.05] [--keep] [--json OUT.json]

The store. ``--turns`` synthetic household turns (the ``_common`` templates,
a fixed seed), user and assistant in turn (every user turn gets a reply a few
seconds later), over the ``--days`` before the run (the last one ends 3 hours
before it), household time zone Europe/Lisbon, in the actor runtime's way:
``AppendTurns`` of 500 to the Transcript actor, then the Recall actor left to
embed and index every turn. Sessions of one to six exchanges at random daytime
hours, 70 % on ``voice``, 20 % ``chat``, 10 % ``cli``, so consolidation sees
real windows. Six **weekly routines** (the school-run weather on weekday
mornings, the farmers' market list on Saturdays, Maya's piano on Wednesday
afternoons, Leo's football kit on Sunday evenings, Sofia at Sunday lunch, the
garage on weekday nights), each said on most of its days, so ``patterns`` has
something to find; about one statement in eight is personal (a relation, a
job, a preference, a worry) for ``facts``, ``synthesis`` and ``dmn``.
**Location**: a few thousand OwnTracks-style fixes of Ana over the last
``--fix-days`` (the geo job's window is 91 days) around three places (home at
night and on Sundays, work in weekday office hours, grandma's on Saturday
afternoons; hourly to every 20 minutes, every 2.4 minutes on the way to and
from work), ``RecordFixes`` to the Transcript actor, i.e.
``runtime.memories.location.store_fixes``, which also back-fills Ana's turns said
within 10 minutes of a fix. **Feeds and calendar**: a ``http.server`` thread
in this process serves two RSS feeds (15 items each, half about what the
household talks about) for ``[research] feeds`` and an ``.ics`` calendar
(three weekly events and 40 single ones within the sync window) for one
``ical`` connector of ``[[sync.connectors]]``, with ETags (a second fetch
would be a 304).

The runs. A private local Ray (``_common.local_ray``, dashboard off), the
actor runtime on the store (``actors.supervisor.start``; the HTTP actor off,
``jobs.check_every_s`` so long that Cron never ticks by itself), then every
job of ``runtime.mind.registry.JOBS`` in registry order, each with
``CronClient(ns).run(RunJob(name=..., wait=True))``, what ``reverie jobs run
NAME --wait`` does: the Cron actor starts a ``JobActor`` for the run, waits
for it and kills it. The shipped job budget (``jobs.budget_s``, 600 s) holds.
Between runs the Recall actor is left to index what the run wrote (timed:
``index s``), so that each run starts on a quiet runtime. ``consolidate`` runs
three times: (1) on the fresh store, with an empty numba cache in the data
directory; (2) again once the episodes run (1) wrote are all indexed (the
roll-up reads their vectors, so run (1) rolls up only those indexed while it
ran); after the other eight jobs, (3) on ``--new-turns`` new turns (an hour or
two old), with the cache filled by the earlier runs.

Figures per run: ``wall s``, the driver's time for the ``RunJob`` call;
``recorded s``, ``ended_at - started_at`` of its ``job_runs`` row (Cron's
clock: actor start, the job, actor kill); outcome, items, detail; and the job
actor's memory. The job actor is a process of its own, a Ray worker (a
descendant of this driver) titled ``ray::JobActor...`` in
``/proc/<pid>/cmdline`` once its actor exists; a thread in the driver follows
every worker that starts during the call from its first moment (a short job's
actor carries the title for only tens of milliseconds) and keeps the one so
titled: its ``Pss`` from ``/proc/<pid>/smaps_rollup`` every ``--interval``
seconds, the highest kept (``peak PSS``), and ``VmHWM`` from
``/proc/<pid>/status`` (the
kernel's exact peak of its RSS, an upper bound of PSS: shared libraries count
whole) and its CPU time at the last sample (the worker's start and imports
included). For consolidate, when it wrote its last leaf episode and its first
parent (the episodes' ``created_at``): the distil and roll-up phases. Machine
facts, the load average before and after, and the commit and the files of the
runtime then modified (before, after, and at every run: a job actor imports
the job's code when it starts) go to the JSON."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import _common as c

from actors import supervisor
from actors.common import RECALL, TRANSCRIPT
from actors.handles import CronClient
from actors.messages import AppendTurns, Fix, RecordFixes, RunJob
from runtime.config import Settings
from runtime.memories.transcript import TurnIn
from runtime.mind.registry import JOBS

ZONE = "Europe/Lisbon"
DAY = 86400.0
HOUR = 3600.0
BATCH = 500
LIMIT_PAD_S = 120.0  # on top of 3 x the job budget (Cron's hard limit) for the call

# -- the corpus ----------------------------------------------------------------------


@dataclass(frozen=True)
class Routine:
    """Something one person says on given weekdays around a given local hour."""

    speaker: str
    weekdays: tuple[int, ...]  # Monday 0
    hour: float                # local, the earliest
    spread_h: float            # said within this many hours after ``hour``
    share: float               # chance on each of its days
    texts: tuple[str, ...]
    replies: tuple[str, ...]


ROUTINES = (
    Routine("Ana", (0, 1, 2, 3, 4), 7.2, 0.6, 0.8,
            ("What's the weather forecast for the school run?",
             "Is it going to rain on the school run this morning?",
             "Do the kids need raincoats for the school run today?"),
            ("Dry and mild this morning, about 14 degrees.",
             "Light rain until nine; raincoats would be wise.")),
    Routine("Tom", (5,), 9.0, 1.5, 0.9,
            ("Add fresh bread and croissants to the list for the farmers market.",
             "What's on the list for the farmers market?"),
            ("Added. The list has eggs, bread and croissants.",
             "Fresh bread, croissants, eggs and lemons.")),
    Routine("Maya", (2,), 16.5, 0.8, 0.9,
            ("Did I practise my piano scales enough before the lesson?",
             "Where is my piano book for the lesson?"),
            ("You practised twenty minutes yesterday.", "It was on the shelf by the sofa.")),
    Routine("Leo", (6,), 19.0, 1.0, 0.85,
            ("Is my football kit clean for training tomorrow?",
             "Where are my football boots for training?"),
            ("The kit is in the dryer.", "Your boots are in the garage.")),
    Routine("Ana", (6,), 11.0, 1.0, 0.7,
            ("My sister Sofia is coming for lunch, what should we cook?",
             "Sofia is coming over for Sunday lunch again."),
            ("How about the mushroom risotto she liked?", "Noted, lunch for five then.")),
    Routine("Tom", (0, 1, 2, 3, 4), 22.0, 0.7, 0.6,
            ("Lock the garage and set the alarm for half past six.",
             "Did anyone lock the garage tonight?"),
            ("Garage locked, alarm at 6:30.", "The garage is locked.")),
)

PERSONAL = {
    "Ana": ["My sister Sofia lives in Lisbon.", "I work as a nurse at the children's hospital.",
            "I love gardening, especially the tomato plants.",
            "I'm really worried about Grandma Rosa's health.",
            "My best friend Priya is moving to {city} in {month}.",
            "I prefer green tea in the evenings."],
    "Tom": ["I work as an engineer at the port.", "My brother Marco is visiting in {month}.",
            "I love cycling along the river on Sunday mornings.",
            "My colleague Daniel recommended the {cuisine} place on {street} Street.",
            "I'm so sad that Uncle Pete is moving away.", "I hate the traffic on the bridge."],
    "Maya": ["My best friend Chloe has a new puppy.", "I love drawing horses.",
             "My teacher said my {subject} project was the best in class."],
    "Leo": ["My friend Jonas is coming to my football match.", "I love dinosaurs.",
            "I'm scared of the dentist on {day}."],
}
ACKS = ["Okay, noted.", "Got it.", "I'll remember that.", "Sure.", "Done.",
        "Thanks, I've saved that.", "Understood."]
CHANNELS = ["voice"] * 7 + ["chat"] * 2 + ["cli"]


def local_time(day: date, hours: float, zone: ZoneInfo) -> float:
    """The instant ``hours`` after local midnight of ``day``."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=zone)
    return (midnight + timedelta(hours=hours)).timestamp()


def statement(rng: random.Random, speaker: str) -> str:
    if rng.random() < 0.125:
        return c._fill(rng, rng.choice(PERSONAL[speaker]))
    prefix, body = rng.choice(c.PREFIXES), c._fill(rng, rng.choice(c.STATEMENTS))
    if prefix and body.split(" ", 1)[0] in c._LOWER_AFTER_PREFIX:
        body = body[0].lower() + body[1:]
    return prefix + body + rng.choice(c.SUFFIXES)


def reply(rng: random.Random) -> str:
    return c._fill(rng, rng.choice(c.ASSISTANT)) if rng.random() < 0.3 else rng.choice(ACKS)


def session(rng: random.Random, at: float, channel: str, speaker: str,
            said: list[tuple[str, str]]) -> Iterator[TurnIn]:
    """One exchange per (user text, reply): the reply 2-5 s after, the next 20-90 s later."""
    for text, answer in said:
        yield TurnIn(channel=channel, source="user", role="user", content=text,
                     speaker=speaker, created_at=at)
        at += rng.uniform(2, 5)
        yield TurnIn(channel=channel, source="assistant", role="assistant", content=answer,
                     created_at=at)
        at += rng.uniform(20, 90)


def build_corpus(n: int, start: float, end: float, seed: int = 7,
                 hours: tuple[float, float] = (7.0, 22.5)) -> list[TurnIn]:
    """``n`` turns between ``start`` and ``end``, oldest first: the routines on
    their days, then random sessions at daytime hours up to ``n``."""
    rng = random.Random(seed)
    zone = ZoneInfo(ZONE)
    turns: list[TurnIn] = []
    first = datetime.fromtimestamp(start, zone).date()
    last = datetime.fromtimestamp(end, zone).date()
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    if (end - start) >= 7 * DAY:  # routines only in a span of weeks
        for day in days:
            for r in ROUTINES:
                if day.weekday() in r.weekdays and rng.random() < r.share:
                    at = local_time(day, r.hour + rng.uniform(0, r.spread_h), zone)
                    if start <= at <= end - 600 and len(turns) + 2 <= n:
                        turns.extend(session(rng, at, "voice", r.speaker,
                                             [(rng.choice(r.texts), rng.choice(r.replies))]))
    while len(turns) + 2 <= n:
        size = min((n - len(turns)) // 2, rng.choice((1, 2, 2, 3, 3, 4, 5, 6)))
        if (end - start) >= DAY:
            at = local_time(rng.choice(days), rng.uniform(*hours), zone)
            if not start <= at <= end - 600:
                continue
        else:
            at = rng.uniform(start, end - 600)
        speaker = rng.choice(c.FAMILY)
        turns.extend(session(rng, at, rng.choice(CHANNELS), speaker,
                             [(statement(rng, speaker), reply(rng)) for _ in range(size)]))
    if len(turns) < n:
        speaker = rng.choice(c.FAMILY)
        turns.append(TurnIn(channel="voice", source="user", role="user",
                            content=statement(rng, speaker), speaker=speaker,
                            created_at=rng.uniform(start, end - 600)))
    turns.sort(key=lambda t: t.created_at or 0.0)
    return turns


# -- location fixes ---------------------------------------------------------------------

PLACES = {"home": (41.1579, -8.6291), "work": (41.1496, -8.6109),
          "grandma": (41.1780, -8.5960)}


def _day_plan(weekday: int) -> list[tuple[float, str, float]]:
    """(local hour, place, how far along the way from home to work) of one day's fixes.
    On the way a phone reports every two or three minutes, so no stay is made there."""
    def every(a: float, b: float, step: float, place: str) -> list[tuple[float, str, float]]:
        return [(a + i * step, place, 0.0) for i in range(int((b - a) / step) + 1)]

    def way(a: float, outward: bool) -> list[tuple[float, str, float]]:
        return [(a + i * 0.04, "way", (i + 1) / 9 if outward else 1 - (i + 1) / 9)
                for i in range(9)]

    if weekday < 5:
        return [*every(0.25, 8.25, 1.0, "home"), *way(8.5, True),
                *every(9.0, 17.5, 0.5, "work"), *way(17.6, False),
                *every(18.25, 23.25, 1.0, "home")]
    if weekday == 5:
        return [*every(0.25, 13.25, 1.0, "home"), *every(14.0, 17.0, 1 / 3, "grandma"),
                *every(18.0, 23.5, 1.0, "home")]
    return every(0.25, 23.25, 1.0, "home")


def build_fixes(start: float, end: float, seed: int = 3, person: str = "Ana") -> list[Fix]:
    """A phone's fixes between ``start`` and ``end`` around three places."""
    rng = random.Random(seed)
    zone = ZoneInfo(ZONE)
    out: list[Fix] = []
    day = datetime.fromtimestamp(start, zone).date()
    while local_time(day, 0, zone) <= end:
        for hour, place, k in _day_plan(day.weekday()):
            if place == "way":  # between home and work, on time
                at = local_time(day, hour, zone)
                lat = PLACES["home"][0] + k * (PLACES["work"][0] - PLACES["home"][0])
                lon = PLACES["home"][1] + k * (PLACES["work"][1] - PLACES["home"][1])
                jitter = 20.0
            else:
                at = local_time(day, hour + rng.uniform(-0.05, 0.05), zone)
                lat, lon = PLACES[place]
                jitter = 15.0
            if not start <= at <= end:
                continue
            lat += rng.gauss(0, jitter) / 111_000
            lon += rng.gauss(0, jitter) / (111_000 * math.cos(math.radians(lat)))
            out.append(Fix(person=person, lat=round(lat, 6), lon=round(lon, 6), at=at,
                           source="owntracks", accuracy_m=round(rng.uniform(5, 35), 1),
                           device="ana-phone"))
        day += timedelta(days=1)
    return out


# -- feeds and a calendar, served locally ---------------------------------------------------

GARDEN = [
    ("Tomato plants: when to pinch out the side shoots", "Pinching side shoots keeps tomato "
     "plants productive; do it weekly once the first truss sets.", True),
    ("Five herbs that thrive on a sunny windowsill", "Basil, rosemary and lavender do well "
     "on a bright windowsill with little water.", True),
    ("Why your basil keeps wilting", "Basil wilts from too much sun at noon or roots left "
     "standing in water.", True),
    ("Watering plants before a holiday", "A wick from a jar keeps pots moist for a week.",
     True),
    ("Ferns and peace lilies for a dark bathroom", "Both like humidity and low light.", True),
    ("Protecting a lemon tree from frost", "Wrap the pot and move it near a wall.", True),
    ("Composting kitchen scraps on a balcony", "A small bokashi bin works in flats.", True),
    ("Orchid care in winter", "Water less and keep it away from radiators.", False),
    ("The best lawnmowers of the year", "Cordless models now cut for an hour.", False),
    ("Garden shed organisation ideas", "Hooks for the ladder, the hedge trimmer and the "
     "wheelbarrow free the floor.", True),
    ("A beginner's guide to growing potatoes in bags", "Chit them first.", False),
    ("Hedgehog-friendly gardens", "Leave a gap in the fence.", False),
    ("How to repair a wobbly fence post", "Concrete spur or a new post.", True),
    ("Pruning roses in late winter", "Cut above an outward-facing bud.", False),
    ("Rainwater butts: are they worth it?", "One roof fills a butt in one storm.", False),
]
KITCHEN = [
    ("Banana bread with brown butter", "Brown butter and cardamom make the classic banana "
     "bread richer.", True),
    ("A weeknight lasagna in 40 minutes", "No-boil sheets and a quick ragù.", True),
    ("Mushroom risotto for a Sunday lunch", "Stir often and finish with mascarpone.", True),
    ("Lentil soup that kids actually eat", "Blend half of it and add smoked paprika.", True),
    ("Fixing a dishwasher that makes a grinding noise", "Check the filter and the spray "
     "arm for broken glass.", True),
    ("When to service a boiler", "Once a year, before the heating season.", True),
    ("A leaking tap: replace the washer", "Turn off the water first.", True),
    ("Packing a football kit bag the night before", "Boots, shin pads, water bottle.", True),
    ("Piano practice routines for children", "Ten minutes of scales before pieces.", True),
    ("The stock market in review", "Indices ended the quarter higher.", False),
    ("Celebrity chef opens a third restaurant", "Bookings open next month.", False),
    ("Smart thermostats compared", "Which one saves on the gas bill.", True),
    ("How to descale a kettle with lemons", "Boil lemon water, then rinse.", True),
    ("Electric cars: the new models", "Ranges above 500 km.", False),
    ("A guide to airport parking", "Book ahead to save.", False),
]


def rss(title: str, slug: str, items: list[tuple[str, str, bool]], now: float) -> bytes:
    parts = ['<?xml version="1.0" encoding="utf-8"?>', '<rss version="2.0"><channel>',
             f"<title>{title}</title><link>https://example.org/{slug}</link>",
             f"<description>{title}</description>"]
    for i, (head, text, _related) in enumerate(items):
        when = datetime.fromtimestamp(now - i * 9 * HOUR, ZoneInfo("UTC"))
        parts.append(f"<item><title>{head}</title>"
                     f"<link>https://example.org/{slug}/{i}</link>"
                     f"<guid>https://example.org/{slug}/{i}</guid>"
                     f"<pubDate>{format_datetime(when)}</pubDate>"
                     f"<description>{text}</description></item>")
    parts.append("</channel></rss>")
    return "\n".join(parts).encode()


def ics(now: float, seed: int = 5) -> bytes:
    """A family calendar: three weekly events and 40 single ones around ``now``."""
    rng = random.Random(seed)
    utc = ZoneInfo("UTC")

    def stamp(at: float) -> str:
        return datetime.fromtimestamp(at, utc).strftime("%Y%m%dT%H%M%SZ")

    zone = ZoneInfo(ZONE)
    today = datetime.fromtimestamp(now, zone).date()
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//reverie bench//jobs//EN"]

    def event(uid: str, at: float, hours: float, summary: str, rrule: str | None = None,
              where: str | None = None) -> None:
        lines.extend(["BEGIN:VEVENT", f"UID:{uid}@bench.invalid", f"DTSTAMP:{stamp(now)}",
                      f"DTSTART:{stamp(at)}", f"DTEND:{stamp(at + hours * HOUR)}",
                      f"SUMMARY:{summary}"])
        if rrule:
            lines.append(f"RRULE:{rrule}")
        if where:
            lines.append(f"LOCATION:{where}")
        lines.append("END:VEVENT")

    monday = today - timedelta(days=today.weekday() + 70)
    event("piano", local_time(monday + timedelta(days=2), 17, zone), 1, "Maya piano lesson",
          "FREQ=WEEKLY;BYDAY=WE", "Music school")
    event("football", local_time(monday + timedelta(days=1), 18, zone), 1.5,
          "Leo football training", "FREQ=WEEKLY;BYDAY=TU,TH", "Sports ground")
    event("market", local_time(monday + timedelta(days=5), 9, zone), 2, "Farmers market",
          "FREQ=WEEKLY;BYDAY=SA")
    for i in range(40):
        day = today + timedelta(days=rng.randint(-29, 89))
        what = rng.choice([f"{rng.choice(c.PEOPLE)} {rng.choice(c.APPOINTMENTS)} appointment",
                           f"{rng.choice(c.TRADES).capitalize()} for the "
                           f"{rng.choice(c.FIXTURES)}",
                           f"{rng.choice(c.PEOPLE)}'s birthday dinner",
                           f"{rng.choice(c.EVENTS).capitalize()} with {rng.choice(c.PEOPLE)}"])
        event(f"single-{i}", local_time(day, rng.choice([9, 10.5, 14, 16, 19]), zone), 1, what)
    lines.append("END:VCALENDAR")
    return ("\r\n".join(lines) + "\r\n").encode()


@contextmanager
def serve(docs: dict[str, tuple[str, bytes]]) -> Iterator[tuple[str, dict[str, int]]]:
    """Serve ``docs`` (path -> (content type, body)) on a free loopback port, with
    ETags; yield the base URL and a count of the answers by path and status."""
    served: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            doc = docs.get(self.path)
            if doc is None:
                status, body, ctype, etag = 404, b"", "text/plain", ""
            else:
                ctype, body = doc
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                status = 304 if self.headers.get("If-None-Match") == etag else 200
            with lock:
                served[f"{self.path} {status}"] = served.get(f"{self.path} {status}", 0) + 1
            self.send_response(status)
            if etag:
                self.send_header("ETag", etag)
            if status == 200:
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="bench-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


# -- the job actor's memory ----------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _field_kib(text: str | None, name: str) -> int | None:
    for line in (text or "").splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return None


def _cpu_s(pid: int) -> float | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    rest = stat[stat.rfind(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def ray_workers(root: int) -> dict[int, str]:
    """pid -> title of the Ray workers among the descendants of ``root`` (this
    driver: in local mode the raylet is its child, the workers the raylet's)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if stat is not None:
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(
                int(entry))
    out: dict[int, str] = {}
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            stack.append(pid)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    head = fh.read(200)
            except OSError:
                continue
            title = head.replace(b"\0", b" ").decode(errors="replace").strip()
            if title.startswith("ray::") or "default_worker.py" in title:
                out[pid] = title.split(" ", 1)[0] if title.startswith("ray::") else "starting"
    return out


@dataclass
class Tracked:
    titles: set[str] = field(default_factory=set)
    samples: int = 0
    peak_pss_kib: int = 0
    peak_rss_kib: int = 0
    vm_hwm_kib: int = 0
    cpu_s: float = 0.0
    first_s: float = 0.0
    last_s: float = 0.0


@dataclass
class ActorMemory:
    """The job actor's memory during one run, sampled from a thread.

    Every Ray worker of the session that appears during the run (a new process:
    Cron's job actor starts in one, ≈ 1 s before it is named), or an idle one that
    takes a job actor's title, is sampled from the first time it is seen; the one
    seen under a job actor's title (``ray::JobActor.run``,
    ``ray::job-geo-9:JobActor.__init__``) is the run's. A short job's actor
    carries such a title for only tens of milliseconds, so it is followed from
    its start. The previous run's actor, still being killed, was there before."""

    interval: float
    title: str = "JobActor"  # ray::JobActor.run, ray::job-geo-9:JobActor.__init__
    tracked: dict[int, Tracked] = field(default_factory=dict)
    _before: dict[int, str] = field(default_factory=dict)  # the workers at the start
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self, pid: int, got: Tracked, now: float) -> None:
        smaps = _read(f"/proc/{pid}/smaps_rollup")
        status = _read(f"/proc/{pid}/status")
        cpu = _cpu_s(pid)
        if smaps is None or status is None or cpu is None:
            return  # gone
        got.samples += 1
        got.peak_pss_kib = max(got.peak_pss_kib, _field_kib(smaps, "Pss:") or 0)
        got.peak_rss_kib = max(got.peak_rss_kib, _field_kib(smaps, "Rss:") or 0)
        got.vm_hwm_kib = max(got.vm_hwm_kib, _field_kib(status, "VmHWM:") or 0)
        got.cpu_s = cpu
        got.last_s = now

    def _loop(self, t0: float) -> None:
        me = os.getpid()
        while True:
            now = time.perf_counter() - t0
            for pid, title in ray_workers(me).items():
                if pid in self.tracked:
                    self.tracked[pid].titles.add(title)
                elif pid not in self._before or (self.title in title
                                                 and self.title not in self._before[pid]):
                    self.tracked[pid] = Tracked(titles={title}, first_s=now)
            for pid, got in self.tracked.items():
                self._sample(pid, got, now)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> ActorMemory:
        self._before = ray_workers(os.getpid())
        self._thread = threading.Thread(target=self._loop, args=(time.perf_counter(),),
                                        name="job-actor-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def job_actor(self) -> tuple[int | None, Tracked | None]:
        named = [(pid, t) for pid, t in self.tracked.items()
                 if any(self.title in x for x in t.titles)]
        if len(named) == 1:
            return named[0]
        return None, None

    def as_dict(self) -> dict[str, Any]:
        pid, got = self.job_actor()
        others = {str(p): sorted(t.titles) for p, t in self.tracked.items() if p != pid}
        if got is None:
            return {"pid": None, "samples": 0, "peak_pss_mib": None, "peak_rss_mib": None,
                    "vm_hwm_mib": None, "cpu_s": None, "other_new_workers": others}
        return {"pid": pid, "titles": sorted(got.titles), "samples": got.samples,
                "peak_pss_mib": round(got.peak_pss_kib / 1024, 1),
                "peak_rss_mib": round(got.peak_rss_kib / 1024, 1),
                "vm_hwm_mib": round(got.vm_hwm_kib / 1024, 1),
                "cpu_s": round(got.cpu_s, 2),
                "seen_from_s": round(got.first_s, 2), "seen_to_s": round(got.last_s, 2),
                "other_new_workers": others}


# -- the store, read by the driver ----------------------------------------------------------


def query(settings: Settings, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows from a read-only connection (the actors own the store)."""
    import apsw

    conn = apsw.Connection(str(settings.store.path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.setbusytimeout(10_000)
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def store_counts(settings: Settings) -> dict[str, Any]:
    one = {
        "transcript": "SELECT count(*) FROM transcript",
        "located_turns": "SELECT count(*) FROM transcript WHERE lat IS NOT NULL",
        "location_fixes": "SELECT count(*) FROM location_fixes",
        "vectors": "SELECT count(*) FROM vectors",
        "portraits": "SELECT count(*) FROM portraits",
        "compactions": "SELECT count(*) FROM compactions",
    }
    out: dict[str, Any] = {k: query(settings, sql)[0][0] for k, sql in one.items()}
    out["episodes_by_level"] = {
        f"level_{lvl}": {"all": n, "live": live} for lvl, n, live in query(
            settings, "SELECT level, count(*), sum(tombstoned_at IS NULL) FROM episodes"
            " GROUP BY level ORDER BY level")}
    out["current_facts_by_source"] = dict(query(
        settings, "SELECT source, count(*) FROM facts WHERE valid_to IS NULL"
        " GROUP BY source ORDER BY 2 DESC"))
    out["current_facts_by_kind"] = dict(query(
        settings, "SELECT kind, count(*) FROM facts WHERE valid_to IS NULL"
        " GROUP BY kind ORDER BY 2 DESC"))
    out["geo_places"] = [f"{k}: {v}" for k, v in query(
        settings, "SELECT key, value FROM facts WHERE source = 'geo' AND valid_to IS NULL"
        " ORDER BY key")]
    out["db_mib"] = round(sum(p.stat().st_size for p in settings.store.path.parent.glob(
        settings.store.path.name + "*")) / c.MiB, 1)
    return out


def consolidate_phases(settings: Settings, started: float, ended: float) -> dict[str, Any]:
    """When a consolidate run wrote its leaf episodes (distil) and its parents
    (roll-up), from the episodes' ``created_at`` (the Episodes actor's clock)."""
    levels = {lvl: (n, first, last) for lvl, n, first, last in query(
        settings, "SELECT level, count(*), min(created_at), max(created_at) FROM episodes"
        " WHERE created_at BETWEEN ? AND ? AND channel != 'dmn' GROUP BY level",
        (started, ended))}
    leaves = levels.get(0)
    distil_end = leaves[2] if leaves else started
    parents = [v for lvl, v in levels.items() if lvl > 0]
    out: dict[str, Any] = {"leaves": leaves[0] if leaves else 0,
                           "distil_s": round(distil_end - started, 2),
                           "after_distil_s": round(ended - distil_end, 2),
                           "parents": sum(v[0] for v in parents)}
    if parents:
        out["first_parent_after_distil_s"] = round(min(v[1] for v in parents) - distil_end, 2)
    return out


def numba_cache_files(settings: Settings) -> int:
    from runtime.mind.rollup import numba_cache_dir

    root = numba_cache_dir(settings)
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# -- the driver ------------------------------------------------------------------------------


def catch_up(sup: Any, timeout: float = 1800.0) -> float:
    """Wait until the Recall actor has indexed everything; return the seconds it took."""
    import ray

    t0 = time.perf_counter()
    ray.get(sup.handles[TRANSCRIPT].flush.remote(), timeout=timeout)
    recall = sup.handles[RECALL]
    while ray.get(recall.sync.remote(), timeout=timeout).added:
        pass
    return time.perf_counter() - t0


def run_job(sup: Any, settings: Settings, name: str, label: str, interval: float) -> dict[str, Any]:
    """One ``RunJob(wait=True)`` through the Cron actor, its job actor sampled."""
    cron = CronClient(settings.runtime.namespace)
    limit = settings.jobs.budget_s * 3 + LIMIT_PAD_S
    numba_before = numba_cache_files(settings) if name == "consolidate" else None
    load = c.loadavg()
    sampler = ActorMemory(interval)
    error: str | None = None
    t0 = time.perf_counter()
    with sampler:
        try:
            run = cron.run(RunJob(name=name, wait=True), timeout=limit)
        except Exception as exc:  # the call itself failed (a timeout): report it
            run = None
            error = f"{type(exc).__name__}: {exc}"[:300]
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"job": name, "label": label, "wall_s": round(wall, 2),
                           "loadavg_before": load, "actor": sampler.as_dict(),
                           "modified_files": git_state()["modified"]}
    if run is None:
        out.update(outcome="call failed", items=0, error=error, detail="")
    else:
        out.update(outcome=run.outcome, items=run.items, error=run.error, detail=run.detail,
                   run_id=run.run_id)
        if run.run_id is not None:
            started, ended = query(settings, "SELECT started_at, ended_at FROM job_runs"
                                   " WHERE id = ?", (run.run_id,))[0]
            out.update(started_at=started, ended_at=ended,
                       recorded_s=None if ended is None else round(ended - started, 2))
    if numba_before is not None:
        out["numba_cache_files"] = [numba_before, numba_cache_files(settings)]
        if out.get("ended_at") is not None:
            out["phases"] = consolidate_phases(settings, out["started_at"], out["ended_at"])
    out["index_s"] = round(catch_up(sup), 2)
    c.log(f"  {label}: {out['outcome']}, {out['items']} items in {wall:.1f} s; job actor peak "
          f"PSS {out['actor']['peak_pss_mib']} MiB, VmHWM {out['actor']['vm_hwm_mib']} MiB"
          f"{'; ' + out['detail'] if out.get('detail') else ''}"
          f"{'; ' + str(out['error']) if out.get('error') else ''}")
    return out


def git_state() -> dict[str, Any]:
    """The commit, and the files of the runtime then modified: a job actor imports
    the job's modules when it starts, so edits made during the run count too."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=c.ROOT, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD").strip(),
            "modified": [ln[3:].rstrip() for ln in git(
                "status", "--porcelain", "--", "runtime", "actors", "configs").splitlines()
                if ln.strip()]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=10_000)
    ap.add_argument("--days", type=float, default=182.0, help="the span of the turns")
    ap.add_argument("--fix-days", type=float, default=91.0, help="the span of the fixes")
    ap.add_argument("--new-turns", type=int, default=400,
                    help="turns added before the last consolidate run (0: no such run)")
    ap.add_argument("--interval", type=float, default=0.05, help="memory sampling, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    wall = time.perf_counter()
    load_before = c.loadavg()
    git_before = git_state()

    now = time.time()
    end = now - 3 * HOUR
    turns = build_corpus(args.turns, end - args.days * DAY, end)
    fixes = build_fixes(end - args.fix_days * DAY, end)
    docs = {"/garden.xml": ("application/rss+xml", rss("Garden notes", "garden", GARDEN, now)),
            "/kitchen.xml": ("application/rss+xml", rss("Kitchen and home", "kitchen",
                                                        KITCHEN, now)),
            "/family.ics": ("text/calendar", ics(now))}
    work = Path(tempfile.mkdtemp(prefix="rvb-jobs-"))
    runs: list[dict[str, Any]] = []
    built: dict[str, Any] = {"turns": len(turns), "user_turns": sum(
        t.role == "user" for t in turns), "fixes": len(fixes),
        "first_turn": turns[0].created_at, "last_turn": turns[-1].created_at}
    try:
        with serve(docs) as (base, served):
            settings = c.make_settings(
                work / "data",
                household={"timezone": ZONE},
                http={"enabled": False},
                jobs={"check_every_s": 1e9},  # Cron never ticks by itself
                research={"feeds": [f"{base}/garden.xml", f"{base}/kitchen.xml"]},
                sync={"connectors": [{"name": "family", "kind": "ical",
                                      "url": f"{base}/family.ics"}]},
            )
            with c.local_ray(settings, dashboard=False):
                t0 = time.perf_counter()
                sup = supervisor.start(settings)
                built["actors_ready_s"] = round(time.perf_counter() - t0, 2)
                try:
                    import ray

                    c.log(f"writing {len(turns):,} turns through the Transcript actor")
                    t0 = time.perf_counter()
                    th = sup.handles[TRANSCRIPT]
                    for i in range(0, len(turns), BATCH):
                        ray.get(th.append.remote(AppendTurns(turns=turns[i:i + BATCH])),
                                timeout=600)
                    built["append_s"] = round(time.perf_counter() - t0, 2)
                    built["index_s"] = round(catch_up(sup), 2)
                    c.log(f"  appended in {built['append_s']} s, indexed after "
                          f"{built['index_s']} s more")
                    t0 = time.perf_counter()
                    stored = backfilled = 0
                    for i in range(0, len(fixes), BATCH):
                        got = ray.get(th.record_fixes.remote(RecordFixes(
                            fixes=fixes[i:i + BATCH])), timeout=600)
                        stored += got.stored
                        backfilled += got.backfilled
                    built.update(fixes_stored=stored, backfilled_turns=backfilled,
                                 fixes_s=round(time.perf_counter() - t0, 2))
                    c.log(f"  {stored:,} fixes stored in {built['fixes_s']} s, "
                          f"{backfilled:,} turns located")
                    built["store"] = store_counts(settings)

                    order = list(JOBS)
                    for name in order:
                        if name == "consolidate":
                            c.log("consolidate (1): the fresh store, empty numba cache")
                            runs.append(run_job(sup, settings, name, "consolidate (1)",
                                                args.interval))
                            c.log("consolidate (2): every episode of (1) indexed")
                            runs.append(run_job(sup, settings, name, "consolidate (2)",
                                                args.interval))
                            continue
                        c.log(name)
                        runs.append(run_job(sup, settings, name, name, args.interval))
                    if args.new_turns:
                        extra = build_corpus(args.new_turns, now - 2.5 * HOUR,
                                             now - 40 * 60, seed=8)
                        for i in range(0, len(extra), BATCH):
                            ray.get(th.append.remote(AppendTurns(turns=extra[i:i + BATCH])),
                                    timeout=600)
                        catch_up(sup)
                        c.log(f"consolidate (3): {len(extra)} new turns, numba cache filled")
                        runs.append(run_job(sup, settings, "consolidate", "consolidate (3)",
                                            args.interval))
                    after = store_counts(settings)
                finally:
                    c.stop_runtime(sup)
            served_counts = dict(served)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    load_after = c.loadavg()
    rows = []
    for r in runs:
        a = r["actor"]
        rows.append([r["label"], r["outcome"] or "-", r["items"], r["wall_s"],
                     r.get("recorded_s") or 0.0, a["peak_pss_mib"] or 0.0,
                     a["vm_hwm_mib"] or 0.0, a["cpu_s"] or 0.0, r["index_s"]])
    print()
    print(c.table(["job", "outcome", "items", "wall s", "recorded s", "peak PSS MiB",
                   "VmHWM MiB", "actor CPU s", "index s"], rows))
    print()
    for r in runs:
        cache = (f" [numba cache files {r['numba_cache_files'][0]} -> "
                 f"{r['numba_cache_files'][1]}]" if "numba_cache_files" in r else "")
        phases = f" [phases {r['phases']}]" if "phases" in r else ""
        print(f"{r['label']}: {r.get('detail') or ''}{r.get('error') or ''}{cache}{phases}")
    idle = [r["label"] for r in runs if r["outcome"] == "ok" and not r["items"]]
    print(f"\nnothing to do (ok, 0 items): {', '.join(idle) or 'none'}")
    print(f"store before the jobs: {built['store']}")
    print(f"store after: {after}")
    print(f"served: {served_counts}")
    wall_s = time.perf_counter() - wall
    print(f"load average before {load_before}, after {load_after}; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "jobs", "machine": c.machine(), "loadavg_before": load_before,
        "loadavg_after": load_after, "wall_s": round(wall_s, 1),
        "git": {"before": git_before, "after": git_state()},
        "params": vars(args) | {"zone": ZONE, "budget_s": settings.jobs.budget_s},
        "store_built": built, "store_after": after, "served": served_counts, "runs": runs,
        "nothing_to_do": idle})
    return 0


if __name__ == "__main__":
    sys.exit(main())
