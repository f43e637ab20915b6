"""Digests (runtime.memories.digests): daily notes roll up into weekly and monthly digests on
a real store against a fixed clock in the household's time zone, grounded in
episodes; the language model through a local fake OpenAI server (and its
failure: the extractive fallback); sensitive memories never enter; retention
keeps monthlies; the trajectory reaches the prompt; the synthesis job runs the
digest step whatever the portrait step does; ``reverie digest``; and the whole
path through the real runtime (the job actor writes through the Graph actor, the
Turns actor puts the trajectory into the system message)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401
from llm_runtime import llm_runtime, llm_settings

from runtime.config import LLMSettings, ProviderSettings, Settings
from runtime.llm.embedder import Embedder
from runtime.llm.prompt import system_prompt
from runtime.llm.providers import FallbackChain, make_llm
from runtime.memories.digests import (
    TRAJECTORY_HEADING,
    DigestBatch,
    DigestService,
    shown,
    trajectory,
    trajectory_section,
)
from runtime.memories.episodes import EpisodeIn
from runtime.memories.refs import Ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import synthesis as portrait
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.digest_job import digest_step
from runtime.time.clock import ManualClock

ZONE_NAME = "Europe/Lisbon"
ZONE = ZoneInfo(ZONE_NAME)
ROOT = Path(__file__).resolve().parent.parent


def local(y: int, m: int, d: int, h: int = 12, mi: int = 0) -> float:
    return datetime(y, m, d, h, mi, tzinfo=ZONE).timestamp()


@pytest.fixture
def mem(make_settings: Callable[..., Settings], embedder: Embedder) -> Iterator[Memory]:
    clock = ManualClock(local(2026, 6, 1, 8))
    m = Memory(make_settings(household={"timezone": ZONE_NAME}), clock=clock,
               embedder=embedder)
    yield m
    m.close()


def clock_of(mem: Memory) -> ManualClock:
    assert isinstance(mem.clock, ManualClock)
    return mem.clock


def ctx(mem: Memory, llm: FallbackChain | None = None) -> JobContext:
    return JobContext(store=mem.store, writer=mem, llm=llm or make_llm(mem.settings.llm),
                      clock=mem.clock, settings=mem.settings)


def llm_for(server: FakeOpenAI) -> FallbackChain:
    return make_llm(LLMSettings(providers=[ProviderSettings(
        name="local", base_url=server.base_url, model="tiny", timeout_s=5)]))


def happened(mem: Memory, when: float, said: str, gist: str, salience: int = 5,
             sensitive: bool = False) -> int:
    """A user turn at ``when`` and the episode distilled from it (``sensitive``: the
    episode is marked, not its turn)."""
    clock = clock_of(mem)
    now = clock.now()
    clock.set(when)
    turn = mem.add_turn(TurnIn(channel="voice", source="user", speaker="Caroline",
                               content=said))
    clock.set(now)
    return mem.add_episode(EpisodeIn(channel="voice", source="user", gist=gist,
                                     salience=salience, cites=[turn], started_at=when,
                                     ended_at=when + 60, sensitive=sensitive))


JUNE = [  # (day, gist, salience): two ISO weeks of June 2026 and the start of a third
    (1, "Caroline planted tomatoes in the back garden with Ana", 7),
    (2, "Booked a dentist appointment for Leo on Friday", 4),
    (4, "The kitchen tap started leaking and a plumber was called", 6),
    (9, "Caroline started training for the Lisbon half marathon", 8),
    (11, "Grandma Rosa came over for a fish stew dinner", 5),
    (22, "The family planned a summer trip to the Azores islands", 9),
]


def seed_june(mem: Memory) -> dict[int, int]:
    return {day: happened(mem, local(2026, 6, day, 10), f"Note: {gist}.", gist, sal)
            for day, gist, sal in JUNE}


def digests(mem: Memory, period: str) -> dict[str, tuple[str, list[str], str]]:
    return {d.key: (d.text, list(d.refs), d.how)
            for d in DigestService(mem.store).listed(period)}


# -- days, weeks, months --------------------------------------------------------------


def test_days_roll_up_into_a_week_and_weeks_into_a_month(mem: Memory) -> None:
    ids = seed_june(mem)
    clock = clock_of(mem)

    clock.set(local(2026, 6, 4, 23, 59))  # Thursday night: its episode's day has not ended
    result = digest_step(ctx(mem))
    assert result.items == 2 and not result.more
    days = digests(mem, "day")
    assert sorted(days) == ["2026-06-01", "2026-06-02"], "only ended local days with activity"
    text, refs, how = days["2026-06-01"]
    assert "planted tomatoes" in text and refs == [f"episode:{ids[1]}"] and how == "offline"
    assert digests(mem, "week") == {}, "the week has not ended"
    assert digest_step(ctx(mem)).items == 0, "idempotent: nothing new, nothing written"

    clock.set(local(2026, 6, 8, 0, 30))  # just after the week's end, local time
    digest_step(ctx(mem))
    weeks = digests(mem, "week")
    assert list(weeks) == ["2026-W23"]
    text, refs, _ = weeks["2026-W23"]
    # grounded: it cites the week's episodes, leads with them, in time order
    assert refs == [f"episode:{ids[d]}" for d in (1, 2, 4)]
    assert text.index("tomatoes") < text.index("dentist") < text.index("plumber")
    assert "2026-06-04" in digests(mem, "day"), "the days of the week got their notes too"

    clock.set(local(2026, 7, 1, 9))
    digest_step(ctx(mem))
    assert sorted(digests(mem, "week")) == ["2026-W23", "2026-W24", "2026-W26"], "W25: quiet"
    months = digests(mem, "month")
    assert list(months) == ["2026-06"]
    text, refs, _ = months["2026-06"]
    assert set(refs) <= {f"episode:{i}" for i in ids.values()} and len(refs) == 6
    assert "Azores" in text and "half marathon" in text
    june = DigestService(mem.store).listed("month")[0]
    assert (june.starts_at, june.ends_at) == (local(2026, 6, 1, 0), local(2026, 7, 1, 0))
    # written through the write log by the synthesis writer
    assert mem.store.scalar("SELECT count(*) FROM write_log WHERE table_name = 'digests'"
                            " AND writer = 'synthesis'") == len(DigestService(mem.store)
                                                                .listed())


def test_a_week_waits_for_consolidation_then_settles(mem: Memory) -> None:
    clock = clock_of(mem)
    clock.set(local(2026, 6, 2, 10))
    mem.add_turn(TurnIn(channel="voice", source="user", content="We painted the fence blue."))
    clock.set(local(2026, 6, 3, 9))
    assert digest_step(ctx(mem)).items == 0, "a turn not yet in an episode: wait"
    clock.set(local(2026, 6, 4, 23))
    assert digest_step(ctx(mem)).items == 0
    clock.set(local(2026, 6, 5, 1))  # two days after the day ended: settled
    digest_step(ctx(mem))
    assert digests(mem, "day")["2026-06-02"][0] == "1 user turn (voice)."


# -- the language model -----------------------------------------------------------------


def test_with_a_model_the_digest_is_its_answer_and_cites_its_evidence(
        mem: Memory, fake_openai: FakeOpenAI) -> None:
    ids = seed_june(mem)
    clock_of(mem).set(local(2026, 6, 8, 9))
    fake_openai.replies = [json.dumps({"summary": f"A summary number {i}."}) for i in range(9)]
    digest_step(ctx(mem, llm_for(fake_openai)))
    text, refs, how = digests(mem, "week")["2026-W23"]
    assert how == "llm" and text.startswith("A summary number")
    # its episodes, then its colour, the daily notes it was given (issue 24)
    days = {d.key: d.id for d in DigestService(mem.store).listed("day")}
    assert refs == [*(f"episode:{ids[d]}" for d in (1, 2, 4)),
                    *(f"digest:{days[f'2026-06-0{d}']}" for d in (1, 2, 4))]
    asked = [r.body["messages"][1]["content"] for r in fake_openai.requests]
    week = next(a for a in asked if "NOTES" in a and "2026-06-01:" in a)
    assert f"[episode:{ids[1]}]" in week, "the week's episodes lead"
    assert "A summary number" in week, "its daily notes are colour"


def test_when_the_model_fails_the_digest_falls_back_to_the_episodes(
        mem: Memory, fake_openai: FakeOpenAI) -> None:
    ids = seed_june(mem)
    clock_of(mem).set(local(2026, 6, 8, 9))
    fake_openai.mode = Mode.HTTP_500
    digest_step(ctx(mem, llm_for(fake_openai)))
    text, refs, how = digests(mem, "week")["2026-W23"]
    assert how == "fallback"
    assert "tomatoes" in text and refs == [f"episode:{ids[d]}" for d in (1, 2, 4)]
    assert fake_openai.requests, "the model was asked"


# -- privacy --------------------------------------------------------------------------------


def test_sensitive_memories_never_enter_a_digest(mem: Memory, fake_openai: FakeOpenAI) -> None:
    ids = seed_june(mem)
    # an episode marked sensitive (its turn is not): neither it nor its turn enters
    secret = happened(mem, local(2026, 6, 3, 10), "My bank PIN is 4821.",
                      "Caroline said her bank PIN is 4821", salience=10, sensitive=True)
    # a turn marked sensitive makes the episode citing it private too
    clock_of(mem).set(local(2026, 6, 3, 11))
    private_turn = mem.add_turn(TurnIn(channel="voice", source="user",
                                       content="The HIV test came back negative.",
                                       sensitive=True))
    via_turn = mem.add_episode(EpisodeIn(channel="voice", source="user",
                                         gist="Caroline got her HIV test results",
                                         salience=10, cites=[private_turn],
                                         started_at=local(2026, 6, 3, 11)))
    # a sensitive turn no episode cites
    clock_of(mem).set(local(2026, 6, 3, 12))
    mem.add_turn(TurnIn(channel="voice", source="user", content="The door code is 7789.",
                        sensitive=True))
    clock_of(mem).set(local(2026, 6, 10, 9))  # settled: the door code is in no episode
    fake_openai.replies = [json.dumps({"summary": "A quiet summary."})] * 40
    digest_step(ctx(mem, llm_for(fake_openai)))  # with a model: the days and week of them
    clock_of(mem).set(local(2026, 7, 3, 9))
    digest_step(ctx(mem))  # offline: the month of the secrets, its other weeks
    assert {d.how for d in DigestService(mem.store).listed("week")} == {"offline", "llm"}
    everything = DigestService(mem.store).listed()
    assert {d.period for d in everything} == {"day", "week", "month"}
    for d in everything:
        assert "PIN" not in d.text and "4821" not in d.text and "HIV" not in d.text, d
        assert f"episode:{secret}" not in d.refs and f"episode:{via_turn}" not in d.refs
    sent = json.dumps([r.body for r in fake_openai.requests])
    assert "4821" not in sent and "HIV" not in sent and "7789" not in sent, \
        "nor does the model ever see them"
    assert f"[episode:{ids[1]}]" in sent and "Note: Caroline planted tomatoes" in sent, \
        "the other episodes lead, a day's other turns are colour"

    # an episode made sensitive after its digest was written: the digest is no longer shown
    month = DigestService(mem.store).listed("month")[0]
    assert any(d.key == "2026-06" for d in trajectory(mem.store))
    mem.change(Ref("episode", ids[22]), "sensitive", "user")
    assert month.key not in {d.key for d in trajectory(mem.store)}
    # and one resting on an episode the user forgot
    weeks = DigestService(mem.store).listed("week")
    assert "2026-W23" in {d.key for d in shown(mem.store, weeks)}
    mem.change(Ref("episode", ids[1]), "delete", "user")
    assert "2026-W23" not in {d.key for d in shown(mem.store, weeks)}


# -- retention ------------------------------------------------------------------------------


def test_dailies_and_weeklies_are_pruned_after_their_roll_up_and_monthlies_kept(
        mem: Memory) -> None:
    seed_june(mem)
    clock = clock_of(mem)
    clock.set(local(2026, 7, 1, 9))
    digest_step(ctx(mem))
    assert digests(mem, "day") and digests(mem, "week")
    clock.set(local(2026, 7, 20, 9))  # June 22 is 28 days old, June 19 31
    result = digest_step(ctx(mem))
    assert sorted(digests(mem, "day")) == ["2026-06-22"], "rolled up and 30 days old: gone"
    assert "pruned" in result.detail
    clock.set(local(2026, 7, 25, 9))
    digest_step(ctx(mem))
    assert digests(mem, "day") == {}
    assert sorted(digests(mem, "week")) == ["2026-W23", "2026-W24", "2026-W26"], \
        "weeklies are kept for 26 weeks"
    clock.set(local(2027, 3, 1, 9))  # 26 weeks on: the weeklies go too
    digest_step(ctx(mem))
    assert digests(mem, "day") == {} and digests(mem, "week") == {}
    assert list(digests(mem, "month")) == ["2026-06"], "monthlies are kept forever"
    # and the service refuses to delete one, whoever asks
    june = DigestService(mem.store).listed("month")[0]
    with pytest.raises(ValueError, match="kept forever"):
        mem.write_digests(DigestBatch(prune=[june.id]))
    assert DigestService(mem.store).listed("month") == [june]


# -- the prompt and the job -------------------------------------------------------------------


def test_the_trajectory_is_the_latest_monthly_and_the_weeklies_after_it(mem: Memory) -> None:
    seed_june(mem)
    happened(mem, local(2026, 7, 2, 10), "We repainted the garden fence blue.",
             "The garden fence was repainted blue over the weekend", 5)
    happened(mem, local(2026, 7, 7, 10), "Leo lost his first tooth.",
             "Leo lost his first milk tooth at school", 6)
    clock_of(mem).set(local(2026, 7, 20, 9))
    digest_step(ctx(mem))
    shown = trajectory(mem.store)
    assert [d.key for d in shown] == ["2026-06", "2026-W27", "2026-W28"]
    section = trajectory_section(shown)
    assert section.startswith(TRAJECTORY_HEADING) and "- 2026-06: " in section
    assert "milk tooth" in section
    assert len(trajectory_section(shown, limit=300)) <= 300 + len(TRAJECTORY_HEADING) + 200
    now = datetime(2026, 7, 20, 9, tzinfo=ZONE)
    prompt = system_prompt([], [], now, context=[section])
    assert prompt.index("Current date and time") < prompt.index(TRAJECTORY_HEADING)


def test_the_synthesis_job_runs_both_steps_whatever_the_other_does(
        mem: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_june(mem)
    clock_of(mem).set(local(2026, 6, 8, 9))

    def broken(ctx: JobContext) -> JobResult:
        raise RuntimeError("portrait broke")

    monkeypatch.setattr(portrait, "synthesise", broken)
    with pytest.raises(RuntimeError, match="portrait broke"):
        portrait.run(ctx(mem))
    assert "2026-W23" in digests(mem, "week"), "the digests were written all the same"
    monkeypatch.undo()

    import runtime.mind.digest_job as digests_module

    def broken_digests(ctx: JobContext) -> JobResult:
        raise RuntimeError("digests broke")

    monkeypatch.setattr(digests_module, "digest_step", broken_digests)
    with pytest.raises(RuntimeError, match="digests broke"):
        portrait.run(ctx(mem))
    assert portrait.PortraitService(mem.store).versions() == 1, "the portrait was written"


# -- reverie digest ---------------------------------------------------------------------------


def test_reverie_digest_lists_them_read_only(mem: Memory) -> None:
    seed_june(mem)
    clock_of(mem).set(local(2026, 7, 1, 9))
    digest_step(ctx(mem))
    env = {**os.environ, "REVERIE_DATA_DIR": str(mem.settings.store.resolved_dir),
           "REVERIE_EMBEDDER__CACHE_DIR": str(mem.settings.embedder.cache_dir)}

    def reverie(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    out = reverie("digest", "--period", "month", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["digests"]
    assert [(d["period"], d["key"]) for d in listed] == [("month", "2026-06")]
    assert set(listed[0]) == {"id", "period", "key", "starts_at", "ends_at", "text", "refs",
                              "how", "created_at"}
    every = json.loads(reverie("digest", "--json").stdout)["digests"]
    assert {d["period"] for d in every} == {"day", "week", "month"}
    text = reverie("digest", "--period", "week")
    assert text.returncode == 0 and "2026-W23  (week, offline" in text.stdout
    bad = reverie("digest", "--period", "year")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# -- through the runtime -----------------------------------------------------------------------

NS = "test-digests"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    settings = llm_settings(NS, tmp_path_factory.mktemp("digests-data"), model_cache, server,
                            http={"enabled": False}, jobs={"idle_after_s": 3600},
                            household={"timezone": "UTC"})
    with llm_runtime(settings):
        yield settings


def test_the_job_writes_through_the_graph_actor_and_turns_see_the_trajectory(
        runtime: Settings, server: FakeOpenAI) -> None:
    from actors.handles import CronClient, EpisodesClient, TurnsClient
    from actors.messages import AddEpisode, RunJob, UserTurn

    today = datetime.now(tz=ZoneInfo("UTC")).date()
    last_month = (today.replace(day=1) - timedelta(days=1)).replace(day=15)
    when = datetime(last_month.year, last_month.month, 15, 10,
                    tzinfo=ZoneInfo("UTC")).timestamp()
    episodes = EpisodesClient(NS)
    written = episodes.add(AddEpisode(episode=EpisodeIn(
        channel="voice", source="user", gist="The household adopted a grey kitten named Miso",
        salience=8, started_at=when, ended_at=when + 60), writer="test"))
    server.mode = Mode.OK
    # the portrait step asks first (and is refused this answer); then the week, the month
    server.replies = [json.dumps({"summary": "They adopted Miso, a grey kitten."})] * 6
    ran = CronClient(NS, timeout_s=300).run(RunJob(name="synthesis", wait=True), timeout=300)
    assert ran.outcome == "ok", ran
    assert "1 weekly, 1 monthly" in (ran.detail or ""), ran.detail
    server.replies.clear()
    TurnsClient(NS, timeout_s=120).process(UserTurn(channel="chat", text="What's new lately?"))
    system = server.last.body["messages"][0]["content"]
    assert TRAJECTORY_HEADING in system
    assert f"- {last_month:%Y-%m}: They adopted Miso, a grey kitten." in system, system
    from runtime.memories.viz import open_read_only

    with open_read_only(runtime) as store:
        month = DigestService(store).listed("month")
        [week] = DigestService(store).listed("week")  # its colour: cited (issue 24)
        assert month and month[0].refs == (f"episode:{written.episode_id}", f"digest:{week.id}")
        assert store.scalar("SELECT writer FROM write_log WHERE table_name = 'digests'"
                            " AND row_id = ?", (month[0].id,)) == "synthesis"
