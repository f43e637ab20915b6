"""The timeline and temporal recall.

- runtime.recall.timeline on a real store against a fixed clock: "3 months ago"
  selects the episodes (and turns, facts) dated in that month, by when they
  happened, not when they were written.
- temporal recall (runtime.recall.temporal through Memory.recall, the real
  model and index): a time named in the question ranks its slice first, pulls
  in memories of the slice the other stages missed, and a "when" question
  favours memories that say when.
- ``reverie timeline`` and ``GET /v1/timeline?expr=`` against a running
  runtime: a conversation of 2023 imported and consolidated, then "May 2023"
  lists exactly May's memories, May's episodes and turns among them.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import pytest

from runtime.config import CONFIG_DIR, Settings
from runtime.llm.embedder import Embedder
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.memory import Memory
from runtime.recall import browse, timeline
from runtime.recall import temporal as temporal_recall
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import ManualClock
from runtime.time.expressions import TimeExpressionError
from tests.reverie_process import reverie as run_reverie
from tests.reverie_process import start_runtime

LISBON = ZoneInfo("Europe/Lisbon")
NOW = datetime(2026, 11, 30, 15, 0, tzinfo=LISBON).timestamp()  # a Monday
KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
ROOT = Path(__file__).resolve().parent.parent
NS = "test-timeline"


def at(*when: int) -> float:
    """Epoch seconds of a Lisbon wall time (year, month, day[, hour, minute])."""
    return datetime(*when, tzinfo=LISBON).timestamp()  # type: ignore[arg-type, misc]


# -- the timeline on a store, against a fixed clock -----------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "t.db", KINDS, clock=ManualClock(NOW))
    yield s
    s.close()


def listed(store: Store, expr: str) -> list[dict[str, Any]]:
    span = timeline.span_of(expr, ManualClock(NOW), LISBON)
    views = timeline.collect(span, lambda q: _page(store, q))
    return [timeline.item(v) for v in views]


@dataclass
class Page:
    items: list[browse.View]
    total: int


def _page(store: Store, query: browse.Browse) -> Page:
    return Page(*browse.browse(store, query))


def test_three_months_ago_selects_the_episodes_of_that_month(store: Store) -> None:
    """From 2026-11-30 in Lisbon, "3 months ago" is August 2026: the episodes
    that started in it (whenever they were written), its turns and the facts
    that became true in it; nothing from July 31 late evening or September 1."""
    clock = store.clock
    assert isinstance(clock, ManualClock)
    episodes = EpisodeService(store, PROFILES)
    transcript = TranscriptService(store, PROFILES)
    graph = GraphService(store, KINDS, PROFILES)

    def episode(gist: str, started: float) -> str:
        made = episodes.add(EpisodeIn(channel="kitchen", source="user", gist=gist,
                                      started_at=started, ended_at=started + 1800))
        return f"episode:{made}"

    clock.set(at(2026, 8, 20, 12))  # written in August, about July
    july = episode("We planned the summer fair.", at(2026, 7, 31, 23, 30))
    clock.set(NOW)  # written now, about August: dated by when it happened
    first = episode("We picked blackberries by the river.", at(2026, 8, 1, 0, 0))
    middle = episode("Ana's birthday picnic in the park.", at(2026, 8, 15, 16))
    september = episode("The first day back at school.", at(2026, 9, 1, 0, 0))
    said = transcript.append(TurnIn(channel="kitchen", source="user", speaker="Ana",
                                    content="The blackberries are ripe.",
                                    created_at=at(2026, 8, 2, 10)))
    transcript.append(TurnIn(channel="kitchen", source="user", speaker="Ana",
                             content="The leaves are turning.", created_at=at(2026, 9, 20, 9)))
    fact_id, _ = graph.add(FactIn(kind="place", subject="Ana", key="lives_in", value="Porto",
                                  valid_from=at(2026, 8, 10, 12)))

    items = listed(store, "3 months ago")
    refs = [i["ref"] for i in items]
    assert sorted(refs) == sorted([first, middle, f"turn:{said}", f"fact:{fact_id}"])
    assert july not in refs and september not in refs
    # oldest first, each dated when it happened
    span = timeline.span_of("3 months ago", ManualClock(NOW), LISBON)
    assert [i["created_at"] for i in items] == sorted(i["created_at"] for i in items)
    assert all(i["created_at"] in span for i in items)
    assert {i["ref"]: i["created_at"] for i in items}[middle] == at(2026, 8, 15, 16)
    # the same slice by when it was written would have been July's episode
    written = browse.browse(store, browse.Browse(kinds=("episode",), since=span.start,
                                                 until=span.end))[0]
    assert [v.ref for v in written] == [july]


def test_timeline_lines_and_errors(store: Store) -> None:
    TranscriptService(store, PROFILES).append(TurnIn(
        channel="kitchen", source="user", speaker="Ana", content="Snow at last!",
        created_at=at(2026, 11, 29, 18)))
    span = timeline.span_of("yesterday evening", ManualClock(NOW), LISBON)
    items = listed(store, "yesterday evening")
    assert timeline.lines(items, span, LISBON) == [
        "yesterday evening: 2026-11-29 17:00 to 2026-11-29 22:00, 1 memories",
        "2026-11-29 18:00  turn:1       Ana: Snow at last!"]
    assert listed(store, "this morning") == []
    with pytest.raises(TimeExpressionError, match="'next blue moon' is not a time"):
        listed(store, "next blue moon")


# -- temporal recall -----------------------------------------------------------

@pytest.mark.parametrize(("query", "names", "asks"), [
    ("What did Caroline do last week?", "last week", False),
    ("When did Melanie paint a sunrise?", None, True),
    ("How long has Nate had his turtles?", None, True),
    ("In which month did John start playing?", None, True),
    ("When did Nate win a tournament in July 2022?", "july 2022", True),
    ("Where does Ana live?", None, False),
])
def test_what_a_question_says_about_time(query: str, names: str | None, asks: bool) -> None:
    hint = temporal_recall.read(query, NOW, LISBON)
    if names is None and not asks:
        assert hint is None
        return
    assert hint is not None and hint.asks_when is asks
    assert (hint.span.text if hint.span else None) == names


@pytest.mark.parametrize(("text", "says_when"), [
    ("We went to the beach at Whitby last Saturday.", True),
    ("I've had them for 3 years now.", True),
    ("I went to a support group yesterday.", True),
    ("Back in 2019 we lived in Braga.", True),
    ("In May we painted the kitchen.", True),
    ("We went to the beach at Whitby.", False),
    ("I may go to the market.", False),
    ("Every day I run by the river.", False),
])
def test_which_memories_say_when(text: str, says_when: bool) -> None:
    assert temporal_recall.mentions_time(text) is says_when


@pytest.fixture
def lisbon_memory(make_settings: Callable[..., Settings],
                  embedder: Embedder) -> Iterator[Callable[..., Memory]]:
    made: list[Memory] = []

    def make(**recall: Any) -> Memory:
        mem = Memory(make_settings(household={"timezone": "Europe/Lisbon"}, recall=recall),
                     clock=ManualClock(NOW), embedder=embedder)
        made.append(mem)
        return mem

    yield make
    for mem in made:
        mem.close()


def say(memory: Memory, content: str, when: float, channel: str = "kitchen") -> int:
    return memory.add_turns([TurnIn(channel=channel, source="user", speaker="Ana",
                                    content=content, created_at=when)])[0]


def first_turn(memory: Memory, query: str) -> int:
    found = memory.recall(query, now=NOW)
    assert found.items, query
    return found.cited_turns()[0]


def test_a_time_in_the_question_ranks_its_slice_first(
        lisbon_memory: Callable[..., Memory]) -> None:
    """The same sentence said in October and in November: asked about October,
    October's ranks first; without temporal recall the newer one wins."""
    memory = lisbon_memory()
    text = "We cooked a mushroom risotto for dinner with the neighbours."
    october = say(memory, text, at(2026, 10, 10, 20))
    november = say(memory, text, at(2026, 11, 20, 20), channel="hall")
    assert first_turn(memory, "What did we cook in October?") == october
    memory.recaller.settings = memory.recaller.settings.model_copy(update={"temporal": False})
    assert first_turn(memory, "What did we cook in October?") == november


def test_a_memory_of_the_slice_missed_by_both_stages_is_pulled_in(
        lisbon_memory: Callable[..., Memory]) -> None:
    """With five candidates per stage, a dozen November lines closer to the
    question (and matching its words) fill both stages; last month's line is
    found only through its date."""
    memory = lisbon_memory(candidates=5)
    for day in range(12):
        say(memory, "We cooked and cooked, cooking all day: mushroom risotto.",
            at(2026, 11, 14 + day, 19), channel=f"room-{day}")
    october = say(memory, "Dinner was a pumpkin soup that I made.", at(2026, 10, 15, 19),
                  channel="porch")
    assert october in memory.recall("What did we cook last month?", now=NOW).cited_turns()
    memory.recaller.settings = memory.recaller.settings.model_copy(update={"temporal": False})
    assert october not in memory.recall("What did we cook last month?", now=NOW).cited_turns()


def test_a_when_question_favours_the_memory_that_says_when(
        lisbon_memory: Callable[..., Memory]) -> None:
    """ "When did ...?" asks for a time: of two lines about the same outing, the
    one that says when ranks first, though it is a little less similar."""
    memory = lisbon_memory()
    plain = say(memory, "We went to the beach at Whitby.", at(2026, 11, 2, 10), channel="a")
    dated = say(memory, "We went to the beach at Whitby last Saturday.", at(2026, 11, 2, 10),
                channel="b")
    assert first_turn(memory, "When did we go to the beach?") == dated
    memory.recaller.settings = memory.recaller.settings.model_copy(update={"temporal": False})
    assert first_turn(memory, "When did we go to the beach?") == plain


# -- `reverie timeline` and /v1/timeline?expr= on a conversation of 2023 -----------

SPEAKERS = ("Ines", "Tomas")
# (Lisbon wall time of the first line, lines): a session each in April, May (two)
# and June 2023; the June one starts at 00:20 on 1 June in Lisbon, which is still
# 31 May in UTC
SESSIONS: list[tuple[tuple[int, ...], list[str]]] = [
    ((2023, 4, 12, 19, 0), [
        "Hi Tomas, how was your week?", "Busy, Ines. The bakery opened a second shop.",
        "A second shop! Where is it?", "In Alfama, near the tram stop.",
        "I started learning the guitar this month.", "Guitar? Which songs are you playing?",
        "Mostly fado, my teacher is very patient.", "Fado on the guitar is hard, good luck.",
        "My cousin Rui is visiting from Braga at Easter.", "Will you take him to Sintra?",
        "Yes, we want to see the Pena palace.", "Pack a jacket, Sintra is always misty.",
        "Talk soon, Tomas!", "Bye Ines!"]),
    ((2023, 5, 7, 10, 0), [
        "Morning Tomas! I ran my first ten kilometre race today.", "Ines, that is great news!",
        "It was along the river from Belem to Cais do Sodre.", "How long did it take you?",
        "Fifty eight minutes, I was so happy.", "Under an hour on your first race, wow.",
        "My knees hurt a little now.", "Ice and rest, and a pastel de nata.",
        "I adopted a kitten called Sardinha last night.", "Sardinha! What colour is she?",
        "Grey with white paws, she sleeps on my keyboard.", "Send me a photo of her!",
        "Will do, bye for now.", "Bye Ines, congratulations again."]),
    ((2023, 5, 25, 20, 30), [
        "Tomas, the kitten broke my favourite mug.", "Oh no, Sardinha strikes again.",
        "I am thinking of painting the living room blue.", "Blue would suit the old tiles.",
        "My sister Marta got a job in Porto.", "Porto! Is she moving there?",
        "Yes, in June, she found a flat by the river.", "You will visit her a lot then.",
        "We want to go to the Douro valley together.", "The vineyards are beautiful in summer.",
        "I booked a pottery class for Saturday.", "Pottery, you are collecting hobbies.",
        "Good night Tomas.", "Good night Ines."]),
    ((2023, 6, 1, 0, 20), [
        "Tomas, are you awake? I cannot sleep.", "Still up, Ines. What is wrong?",
        "Marta moved to Porto today and the flat feels empty.", "You will miss her.",
        "Sardinha keeps looking for her.", "Cats notice everything.",
        "I might take the train to Porto next weekend.", "The Alfa Pendular takes three hours.",
        "We could watch the Sao Joao festival there.", "Bring a plastic hammer, it is a must.",
        "I will try to sleep now.", "Sleep well, Ines."]),
]


def history() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for start, lines in SESSIONS:
        t = at(*start)
        for n, line in enumerate(lines):
            out.append({"speaker": SPEAKERS[n % 2], "content": line, "created_at": t,
                        "channel": "chat"})
            t += 60.0
    return out


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_reverie(env, *args, timeout=300, cwd=ROOT)  # in-process when joined here


@pytest.fixture(scope="module")
def running(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    """The runtime (household in Lisbon, HTTP on a free port) with the 2023
    conversation imported and consolidated."""
    data = tmp_path_factory.mktemp("timeline-data")
    env = {**os.environ, "REVERIE_DATA_DIR": str(data), "REVERIE_RUNTIME__NAMESPACE": NS,
           "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_HOUSEHOLD__TIMEZONE": "Europe/Lisbon", "REVERIE_HTTP__PORT": "0",
           "REVERIE_PERSONA__GLOBAL_DIR": str(data / "persona"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("REVERIE_CONFIG", None)
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    try:
        path = data / "history.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in history()))
        imported = reverie(env, "import", str(path))
        assert imported.returncode == 0, imported.stderr
        done = reverie(env, "jobs", "run", "consolidate", "--wait")
        assert done.returncode == 0, done.stdout + done.stderr
        yield {**env, "DATA": str(data)}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0


# the first test using `running` also pays for starting the runtime, importing and
# consolidating (seconds when idle, minutes on a loaded two-core machine)
RUNTIME_TIMEOUT = pytest.mark.timeout(600)
MAY = (at(2023, 5, 1), at(2023, 6, 1))
MAY_LINES = {line for start, lines in SESSIONS if start[1] == 5 for line in lines}


@RUNTIME_TIMEOUT
def test_timeline_may_2023_lists_only_may(running: dict[str, str]) -> None:
    """The Done-when: ``reverie timeline "May 2023" --json`` returns memories only
    from May 2023 in the household's zone, May's episodes and every May turn."""
    done = reverie(running, "timeline", "May 2023", "--json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    assert items and all(set(i) == {"ref", "kind", "text", "created_at"} for i in items)
    assert all(MAY[0] <= i["created_at"] < MAY[1] for i in items), [
        (i["ref"], i["created_at"]) for i in items if not MAY[0] <= i["created_at"] < MAY[1]]
    turns = {i["text"].split(": ", 1)[1] for i in items if i["kind"] == "turn"}
    assert turns == MAY_LINES
    episodes = [i for i in items if i["kind"] == "episode"]
    assert episodes, items
    # every episode of the store that started in May is listed, and no other
    everything = json.loads(reverie(running, "timeline", "2023", "--json").stdout)["items"]
    assert {i["ref"] for i in everything if i["kind"] == "episode"
            and MAY[0] <= i["created_at"] < MAY[1]} == {i["ref"] for i in episodes}
    assert len({i["ref"] for i in everything if i["kind"] == "episode"}) > len(episodes)
    # oldest first
    assert [i["created_at"] for i in items] == sorted(i["created_at"] for i in items)


@RUNTIME_TIMEOUT
def test_timeline_text_kind_and_bad_expression(running: dict[str, str]) -> None:
    text = reverie(running, "timeline", "2023-06-01")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("2023-06-01: 2023-06-01 00:00 to 2023-06-02 00:00, ")
    assert "2023-06-01 00:20  turn:" in lines[1] and "Tomas, are you awake?" in lines[1]
    only = json.loads(reverie(running, "timeline", "May 2023", "--kind", "episode",
                              "--json").stdout)["items"]
    assert only and {i["kind"] for i in only} == {"episode"}
    may = json.loads(reverie(running, "timeline", "May 2023", "--json").stdout)["items"]
    first = json.loads(reverie(running, "timeline", "May 2023", "--limit", "3",
                               "--json").stdout)["items"]
    assert len(may) > 3 and first == may[:3]
    assert reverie(running, "timeline", "May 2023", "--limit", "0").returncode == 2
    bad = reverie(running, "timeline", "the blue moon", "--json")
    assert bad.returncode == 2
    assert "'the blue moon' is not a time expression" in bad.stderr and bad.stdout == ""


@RUNTIME_TIMEOUT
def test_http_timeline_takes_an_expression(running: dict[str, str]) -> None:
    from actors.handles import HttpClient

    base = urlsplit(HttpClient(NS).address()).netloc
    token = (Path(running["DATA"]) / "http-token").read_text().strip()

    def get(**params: str) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(base, timeout=120)
        try:
            conn.request("GET", "/v1/timeline?" + urlencode(params),
                         headers={"Authorization": f"Bearer {token}"})
            r = conn.getresponse()
            return r.status, json.loads(r.read().decode())
        finally:
            conn.close()

    status, page = get(expr="May 2023", limit="500")
    assert status == 200, page
    cli = json.loads(reverie(running, "timeline", "May 2023", "--json").stdout)["items"]
    assert [i["ref"] for i in page["items"]] == [i["ref"] for i in cli]
    assert page["total"] == len(cli)
    status, error = get(expr="whenever")
    assert status == 422 and "is not a time expression" in json.dumps(error)
    status, error = get(expr="May 2023", since="2023-01-01")
    assert status == 422 and "not both" in json.dumps(error)
