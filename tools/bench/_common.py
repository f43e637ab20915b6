"""Shared pieces of the actor-runtime benchmarks (tools/bench/*.py).

* a synthetic household corpus: statements said to a home hub and questions
  about them, from templates with a fixed random seed (no external dataset);
* settings for a throw-away store (temporary data directory, unique namespace,
  offline language model, empty persona directory);
* a private local Ray instance (``address="local"``, ``127.0.0.1``, its own
  temp directory, a bounded object store) that is shut down and removed after;
* percentiles, a plain-text table and the JSON output.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

# No usage-stats prompt or upload from the Ray instances these scripts start.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from runtime.config import Settings, load_settings  # noqa: E402
from runtime.memories.transcript import TurnIn  # noqa: E402

T = TypeVar("T")

MiB = 1024 * 1024
CORPUS_VERSION = 1  # bump when the generator changes (invalidates cached stores)

# -- the synthetic household corpus ------------------------------------------

FAMILY = ["Ana", "Tom", "Maya", "Leo"]
KIDS = ["Maya", "Leo"]
PEOPLE = ["Ana", "Tom", "Maya", "Leo", "Grandma Rosa", "Uncle Pete", "Sofia", "Daniel",
          "Priya", "Marco", "Chloe", "Nadia", "Jonas", "Elif", "Kenji", "Aunt Bea"]
PETS = ["Miso", "Biscuit", "Pepper", "Nemo"]
ROOMS = ["kitchen", "living room", "garage", "basement", "attic", "bathroom", "hallway",
         "garden shed", "office", "laundry room", "balcony", "spare bedroom"]
APPLIANCES = ["dishwasher", "washing machine", "boiler", "fridge", "oven", "router",
              "thermostat", "dryer", "robot vacuum", "smoke alarm", "coffee machine",
              "freezer", "water heater", "doorbell camera", "extractor fan", "kettle"]
NOISES = ["rattling", "clicking", "humming", "grinding", "beeping", "squeaking", "buzzing"]
FOODS = ["lasagna", "lentil soup", "banana bread", "pad thai", "chicken curry", "pancakes",
         "mushroom risotto", "fish tacos", "shakshuka", "sourdough", "apple pie",
         "miso ramen", "vegetable chili", "gazpacho", "moussaka", "dumplings"]
GROCERIES = ["oat milk", "eggs", "coffee beans", "basmati rice", "olive oil", "dish soap",
             "toilet paper", "spinach", "cheddar", "Greek yogurt", "AA batteries",
             "cat food", "dog treats", "tinned tomatoes", "lemons", "bin bags", "butter",
             "oats", "frozen peas", "sparkling water"]
APPOINTMENTS = ["dentist", "eye doctor", "pediatrician", "physiotherapist", "GP",
                "dermatologist", "orthodontist", "hairdresser", "vet", "optician"]
ACTIVITIES = ["piano lesson", "football practice", "swimming class", "chess club",
              "ballet class", "scout meeting", "climbing session", "art class",
              "drama club", "tennis lesson", "coding club", "choir rehearsal"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DAYS = [*WEEKDAYS, "next Tuesday", "this weekend", "the 14th", "tomorrow",
        "the first of the month", "next Friday"]
TIMES = ["7:30", "8 am", "noon", "3:15 pm", "6 pm", "half past five", "9:45", "4 pm",
         "10:30 am", "quarter to eight"]
CITIES = ["Porto", "Lisbon", "Kyoto", "Berlin", "Edinburgh", "Lyon", "Seville",
          "Copenhagen", "Vienna", "Krakow", "Bologna", "Dublin", "Montreal", "Oslo"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
THINGS = ["house key", "car key", "phone charger", "passport", "umbrella", "torch",
          "bike lock", "reading glasses", "remote control", "garage opener", "first-aid kit",
          "USB stick", "fuse", "light bulbs", "tape measure"]
CONTAINERS = ["top drawer", "blue box", "shoebox", "biscuit tin", "cupboard above the sink",
              "basket by the door", "toolbox", "filing cabinet"]
ALLERGENS = ["peanuts", "shellfish", "penicillin", "cat hair", "pollen", "gluten",
             "sesame", "bee stings", "lactose", "kiwi"]
GIFTS = ["a telescope", "a bread maker", "new running shoes", "a jigsaw puzzle",
         "a pottery class", "a board game", "a camera bag", "concert tickets", "a hammock",
         "a fountain pen", "a cookbook", "noise-cancelling headphones"]
BILLS = ["electricity", "water", "gas", "internet", "phone", "council tax", "insurance"]
TRADES = ["plumber", "electrician", "roofer", "carpenter", "locksmith", "window cleaner",
          "chimney sweep", "gardener", "painter"]
FIXTURES = ["leaking tap", "broken gutter", "sticky back door", "cracked tile",
            "flickering light", "loose banister", "blocked drain", "damp patch",
            "wobbly fence", "stuck window"]
SUBJECTS = ["science", "history", "geography", "maths", "art", "reading", "music"]
PLANTS = ["basil", "fern", "orchid", "tomato plants", "lemon tree", "succulents",
          "monstera", "lavender", "rosemary", "peace lily"]
SPOTS = ["windowsill", "balcony", "back step", "bookshelf", "porch", "bathroom shelf"]
TOOLS = ["ladder", "drill", "lawnmower", "hedge trimmer", "pressure washer", "tent",
         "camping stove", "wheelbarrow", "jump leads", "sewing machine"]
DOCS = ["birth certificates", "car insurance papers", "tax return", "warranty cards",
        "school reports", "mortgage letters", "vaccination records", "passports"]
TOPICS = ["the school trip", "the boiler service", "the book club", "the football kit",
          "the party on Saturday", "the roof repair", "the allotment", "the car insurance",
          "the neighbourhood meeting", "the piano recital"]
CONDITIONS = ["back pain", "hay fever", "blood pressure", "migraines", "eczema", "sleep",
              "asthma", "knee"]
MEDS = ["ibuprofen", "antihistamines", "vitamin D", "magnesium", "iron tablets",
        "the blue inhaler", "eye drops", "fish oil"]
SHOWS = ["the detective series", "the baking show", "the space documentary",
         "the Danish drama", "the cooking competition", "the nature series",
         "the sitcom about the hotel", "the courtroom drama"]
CUISINES = ["Lebanese", "Vietnamese", "Georgian", "Ethiopian", "Peruvian", "Sicilian",
            "Korean", "Nepalese", "Basque", "Mexican"]
STREETS = ["Mill", "Church", "Station", "Harbour", "Elm", "Market", "Bridge", "Oak"]
NEIGHBOURS = ["Mrs Patel", "Mr Okafor", "the Jensens", "old Mr Birch", "Gloria",
              "the couple with the twins"]
EVENTS = ["concert", "theatre", "football", "museum", "cinema", "festival"]
INGREDIENTS = ["yogurt", "cardamom", "brown butter", "buttermilk", "smoked paprika",
               "orange zest", "honey", "walnuts", "mascarpone", "fresh dill"]
WORDS = ["tangerine", "lighthouse", "marmalade", "pinecone", "harbour", "velvet", "comet"]

PREFIXES = ["", "", "", "By the way, ", "Oh, and ", "Just so you know, ", "Quick note: ",
            "Hey, ", "Heads up: ", "Remember this: "]
SUFFIXES = ["", "", "", " Thanks.", " Can you remember that?", " Please keep that in mind.",
            " Don't let me forget.", " Just saying."]

_LOWER_AFTER_PREFIX = {"The", "We", "We're", "We still", "Let's", "Don't", "My"}

STATEMENTS = [
    "{person} has a {appt} appointment on {day} at {time}.",
    "We're out of {grocery}; put it on the shopping list.",
    "We still have plenty of {grocery}, no need to buy more this week.",
    "The {appliance} in the {room} is making a {noise} noise again.",
    "{pet} needs {med2} every {weekday} morning with breakfast.",
    "{person} is allergic to {allergen}, so be careful when we have guests.",
    "{kid} has {activity} every {weekday} at {time}.",
    "{kid}'s {activity} moved from {weekday} to {weekday2} starting next month.",
    "We're planning a trip to {city} in {month} with {person}.",
    "{person} just got back from {city} and brought us {food} to try.",
    "I put the spare {thing} in the {container} in the {room}.",
    "The guest wifi password is {word}-{num}.",
    "{person}'s birthday is on {month} {dom}; they would love {gift}.",
    "Let's make {food} for dinner on {day}, {person} loves it.",
    "The {bill} bill came to {amount} euros this month, more than usual.",
    "I booked the {trade} to fix the {fixture} on {day} morning.",
    "{kid}'s teacher said the {subject} project is due {day}.",
    "Don't forget to water the {plant} on the {spot}, they look dry.",
    "The recycling goes out on {weekday} and the garden waste on {weekday2}.",
    "{person} borrowed our {tool} and still hasn't returned it.",
    "I moved the {docs} into the folder in the {room} cupboard.",
    "The car needs a service before {month}; it's at {km} thousand kilometres.",
    "{person} called about {topic}; call them back after {time}.",
    "I've started taking {med} in the mornings for my {condition}.",
    "The heating should stay at {temp} degrees at night.",
    "We finished season {small} of {show}, next we want to try {show2}.",
    "{person} recommended the {cuisine} place on {street} Street.",
    "{pet} was sick after eating {food}, keep it away from the bowl.",
    "{neighbour} at number {num} keeps a spare key to our house.",
    "The {appliance} warranty runs out in {month} {year}.",
    "Grandma Rosa's {food} recipe uses {ingredient} instead of {ingredient2}.",
    "I paid {person} back {amount} euros for the {event} tickets.",
    "{person} is staying with us from {day} until {weekday}.",
    "The {appliance} filter was changed on {month} {dom}.",
    "{kid} wants to invite {person} for a sleepover on {day}.",
    "My {condition} was much better after the {appt} visit.",
    "The {room} light switch is wired to the {appliance}, oddly enough.",
    "{person} prefers {grocery} over the usual brand.",
    "{kid} finally learned to ride a bike in the park near {street} Street.",
    "We parked the car on level {small} at the {city} airport.",
]
ASSISTANT = [
    "Okay, I'll remind you about the {appt} appointment on {day} at {time}.",
    "Noted: {grocery} is on the shopping list.",
    "Got it, {person} is allergic to {allergen}.",
    "I've saved that the spare {thing} is in the {container} in the {room}.",
    "Sure, {food} for dinner on {day}. Want me to list the ingredients?",
    "I'll remember that the {trade} comes on {day} morning for the {fixture}.",
]
QUESTIONS = [
    "When is {person}'s {appt} appointment?",
    "Do we need to buy {grocery}?",
    "What's the noise coming from the {appliance}?",
    "What medicine does {pet} take?",
    "What is {person} allergic to?",
    "What day does {kid} have {activity}?",
    "Who is coming with us to {city}?",
    "When are we going to {city}?",
    "Where did I leave the spare {thing}?",
    "What's the password for the guest network?",
    "What would {person} like for their birthday?",
    "What are we cooking for dinner on {day}?",
    "How much was the {bill} bill?",
    "When is the {trade} coming?",
    "Who is fixing the {fixture}?",
    "When is {kid}'s {subject} homework due?",
    "Which plants need watering?",
    "Which day is the recycling collected?",
    "Who has our {tool}?",
    "Where are the {docs}?",
    "When does the car need servicing?",
    "Who phoned about {topic}?",
    "What am I taking for my {condition}?",
    "What temperature should the heating be at night?",
    "What should we watch after {show}?",
    "Which restaurant did {person} recommend?",
    "Which neighbour has a key to our house?",
    "When does the {appliance} warranty expire?",
    "What's in grandma's {food} recipe?",
    "How much do I owe {person}?",
    "When is {person} coming to stay?",
    "When was the {appliance} filter last changed?",
    "Who is {kid} inviting for a sleepover?",
    "Where did we park at the {city} airport?",
    "Is anything wrong in the {room}?",
    "What does {person} prefer to buy?",
]


def _fill(rng: random.Random, template: str) -> str:
    pick = rng.choice
    two = rng.sample(WEEKDAYS, 2)
    shows = rng.sample(SHOWS, 2)
    ingredients = rng.sample(INGREDIENTS, 2)
    return template.format(
        person=pick(PEOPLE), kid=pick(KIDS), pet=pick(PETS), room=pick(ROOMS),
        appliance=pick(APPLIANCES), noise=pick(NOISES), food=pick(FOODS),
        grocery=pick(GROCERIES), appt=pick(APPOINTMENTS), activity=pick(ACTIVITIES),
        weekday=two[0], weekday2=two[1], day=pick(DAYS), time=pick(TIMES), city=pick(CITIES),
        month=pick(MONTHS), thing=pick(THINGS), container=pick(CONTAINERS),
        allergen=pick(ALLERGENS), gift=pick(GIFTS), bill=pick(BILLS), trade=pick(TRADES),
        fixture=pick(FIXTURES), subject=pick(SUBJECTS), plant=pick(PLANTS), spot=pick(SPOTS),
        tool=pick(TOOLS), docs=pick(DOCS), topic=pick(TOPICS), condition=pick(CONDITIONS),
        med=pick(MEDS), med2=pick(MEDS), show=shows[0], show2=shows[1],
        cuisine=pick(CUISINES), street=pick(STREETS), neighbour=pick(NEIGHBOURS),
        event=pick(EVENTS), ingredient=ingredients[0], ingredient2=ingredients[1],
        word=pick(WORDS), num=rng.randint(2, 99), dom=rng.randint(1, 28),
        amount=rng.randint(12, 240), km=rng.randint(20, 180), temp=rng.randint(16, 21),
        small=rng.randint(1, 6), year=rng.randint(2026, 2029),
    )


def household_turns(n: int, seed: int = 7, start: float = 1_760_000_000.0,
                    span_days: float = 365.0) -> Iterator[TurnIn]:
    """``n`` turns said to (and answered by) a home hub, oldest first.

    About 85 % are user turns (a family member speaking on one of a few
    channels), 15 % assistant acknowledgements; all are memory (their sources
    are remembered). Times spread evenly over ``span_days`` from ``start``."""
    rng = random.Random(seed)
    channels = ["voice", "voice", "voice", "chat", "cli"]
    step = span_days * 86400.0 / max(n, 1)
    for i in range(n):
        when = start + i * step + rng.uniform(0, step / 2)
        channel = rng.choice(channels)
        if rng.random() < 0.15:
            text = _fill(rng, rng.choice(ASSISTANT))
            yield TurnIn(channel=channel, source="assistant", role="assistant", content=text,
                         created_at=when)
        else:
            prefix, body = rng.choice(PREFIXES), _fill(rng, rng.choice(STATEMENTS))
            if prefix and body.split(" ", 1)[0] in _LOWER_AFTER_PREFIX:
                body = body[0].lower() + body[1:]
            text = prefix + body + rng.choice(SUFFIXES)
            yield TurnIn(channel=channel, source="user", role="user", content=text,
                         speaker=rng.choice(FAMILY), created_at=when)


def household_queries(n: int, seed: int = 11, avoid: Sequence[str] = ()) -> list[str]:
    """``n`` distinct questions about household matters (none equal to a stored text)."""
    rng = random.Random(seed)
    taken = set(avoid)
    out: list[str] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > n * 200:
            raise RuntimeError(f"cannot make {n} distinct queries")
        q = _fill(rng, rng.choice(QUESTIONS))
        if q not in taken:
            taken.add(q)
            out.append(q)
    return out


# -- settings and a private Ray instance --------------------------------------

def make_settings(data_dir: Path, namespace: str | None = None,
                  **sections: dict[str, Any]) -> Settings:
    """Settings for a throw-away store: shipped defaults, no environment, the given
    data directory, a unique namespace, an empty persona directory, offline LLM."""
    overrides: dict[str, Any] = {
        "store": {"data_dir": str(data_dir)},
        "runtime": {"namespace": namespace or f"bench-{uuid.uuid4().hex[:10]}"},
        "persona": {"global_dir": str(Path(data_dir) / "persona")},
        "llm": {"providers": [], "offline_fallback": True},
        "log_level": "WARNING",
    }
    for name, values in sections.items():
        base = overrides.get(name, {})
        overrides[name] = {**base, **values} if isinstance(base, dict) else values
    return load_settings(env={}, overrides=overrides)


@contextmanager
def local_ray(settings: Settings, dashboard: bool | None = None,
              object_store_mb: int | None = None) -> Iterator[dict[str, Any]]:
    """A private local Ray node for the benchmark, shut down and removed after.

    ``address="local"`` never joins another instance (another engineer's, or
    one recorded in /tmp/ray); ``_temp_dir`` is a fresh directory so that the
    session directory (logs, sockets) is ours alone and removed afterwards.
    The dashboard port is left to Ray (8265, or the next free one). It listens
    on loopback only, as ``reverie run`` does (``actors.discovery.loopback_environment``)."""
    from actors.discovery import loopback_environment
    from actors.node import hub_node

    loopback_environment()
    import ray

    rt = settings.runtime
    temp_dir = tempfile.mkdtemp(prefix="rvb-ray-", dir="/tmp")
    started = time.perf_counter()
    with hub_node(log_monitor=False):  # as ``reverie run`` starts its node
        ctx = ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            num_cpus=rt.num_cpus,
            object_store_memory=(object_store_mb or rt.object_store_mb) * MiB,
            include_dashboard=rt.dashboard if dashboard is None else dashboard,
            dashboard_host=rt.dashboard_host,
            logging_level="WARNING",
            log_to_driver=False,
        )
    info = {
        "init_s": time.perf_counter() - started,
        "session_dir": ctx.address_info.get("session_dir"),
        "gcs_address": ctx.address_info.get("gcs_address"),
        "dashboard_url": ctx.dashboard_url,
        "temp_dir": temp_dir,
    }
    try:
        yield info
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def stop_runtime(sup: Any) -> None:
    """Stop the Supervisor's actors (it saves the index first)."""
    sup.stop()


# -- load ---------------------------------------------------------------------

def released_together(target: Callable[[T], None], args: Sequence[T]) -> float:
    """Run ``target(arg)`` in a thread of its own for each of ``args``, all held at
    a barrier and released at once; return the wall seconds from the release
    until the last one is done."""
    gate = threading.Barrier(len(args) + 1)

    def run(arg: T) -> None:
        gate.wait()
        target(arg)

    threads = [threading.Thread(target=run, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    gate.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started


# -- figures ----------------------------------------------------------------

def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def lat_summary(ms: Sequence[float]) -> dict[str, float | int]:
    return {"n": len(ms), "p50_ms": round(pct(ms, 50), 3), "p90_ms": round(pct(ms, 90), 3),
            "p99_ms": round(pct(ms, 99), 3), "mean_ms": round(float(np.mean(ms)), 3) if ms
            else 0.0, "max_ms": round(max(ms), 3) if ms else 0.0}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, numbers right-aligned."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 1e6 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(headers))]
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()
    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def machine() -> dict[str, Any]:
    import ray

    return {"python": platform.python_version(), "ray": ray.__version__,
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}


def loadavg() -> list[float]:
    """The 1/5/15-minute load averages: other work on the machine skews the figures."""
    return [round(x, 2) for x in os.getloadavg()]


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    print(f"wrote {path}")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
