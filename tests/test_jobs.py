"""The job registry and the record of runs (runtime.mind.registry), reminders' times and
storage (runtime.mind.reminders): in-process, on a real SQLite file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from actors import messages as m
from runtime.config import CONFIG_DIR, JOB_NAMES, ConfigError, Settings
from runtime.mind import registry as jobs
from runtime.mind import reminders
from runtime.mind.contract import JobResult
from runtime.mind.idle import idle_state
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import ManualClock

T0 = 1_700_000_000.0
LISBON = ZoneInfo("Europe/Lisbon")


@pytest.fixture
def store(make_settings: Callable[..., Settings], clock: ManualClock) -> Iterator[Store]:
    settings = make_settings()
    s = Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"), clock=clock)
    yield s
    s.close()


def test_registry_lists_the_nine_jobs_then_extras(make_settings: Callable[..., Settings]
                                                  ) -> None:
    settings = make_settings(jobs={"extra": {"ok": "tests.jobs_for_tests:ok"}})
    assert list(jobs.registry(settings)) == [*JOB_NAMES, "ok"]  # in the design's order
    assert jobs.LATER == ()
    off = make_settings(jobs={"disabled": ["decay"]})
    assert list(jobs.registry(off)) == [n for n in JOB_NAMES if n != "decay"]


@pytest.mark.parametrize("bad", [{"extra": {"facts": "x.y:z"}}, {"extra": {"Bad Name": "x:y"}},
                                 {"extra": {"ok": "no-colon"}}, {"disabled": ["nope"]}])
def test_bad_jobs_settings_are_named(make_settings: Callable[..., Settings],
                                     bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="jobs"):
        make_settings(jobs=bad)


def test_a_run_is_recorded_and_a_raising_job_does_not_stop_the_others(store: Store) -> None:
    def execute(name: str, target: str) -> JobResult:
        fn = jobs.resolve(target)  # imported when it fires
        return fn(None)  # type: ignore[arg-type]

    targets = {"boom": "tests.jobs_for_tests:boom", "missing": "runtime.no_such_job:run",
               "odd": "tests.jobs_for_tests:not_a_result",
               "fine": "tests.jobs_for_tests_fine:run"}

    def fine(name: str, target: str) -> JobResult:
        return JobResult(items=3) if name == "fine" else execute(name, target)

    runs = [jobs.run_job(store, name, target, T0, fine) for name, target in targets.items()]
    assert [r.outcome for r in runs] == ["failed", "failed", "failed", "ok"]
    assert runs[0].error == "RuntimeError: boom: this job always fails"
    assert runs[1].error is not None and runs[1].error.startswith("ModuleNotFoundError")
    assert runs[2].error is not None and runs[2].error.startswith("TypeError")
    assert runs[3].items == 3 and runs[3].ended_at == T0
    last = jobs.last_runs(store)
    assert {n: r.outcome for n, r in last.items()} == {
        "boom": "failed", "missing": "failed", "odd": "failed", "fine": "ok"}


def test_error_text_is_short_and_one_line() -> None:
    text = jobs.error_text(ValueError("first line\nsecond line with memory content"))
    assert text == "ValueError: first line"
    assert len(jobs.error_text(ValueError("x" * 5000))) == jobs.MAX_ERROR


def test_next_eligible_and_due(store: Store) -> None:
    names = ["a", "b"]
    quiet = idle_state(T0, {}, T0 + 1800, 1800)
    assert jobs.due_jobs(store, names, quiet, T0 + 1800, 300) == ["a", "b"]
    active = idle_state(T0, {}, T0 + 60, 1800)
    assert jobs.due_jobs(store, names, active, T0 + 60, 300) == []
    run_id = jobs.start_run(store, "a", T0 + 1800)
    jobs.end_run(store, run_id, T0 + 1810, result=JobResult(items=1))
    later = idle_state(T0, {}, T0 + 1900, 1800)
    assert jobs.due_jobs(store, names, later, T0 + 1900, 300) == ["b"]
    lines = {x["name"]: x for x in jobs.status(store, names, later, 300)}
    assert lines["a"] == {"name": "a", "last_outcome": "ok", "last_run_at": T0 + 1800,
                          "next_eligible_at": T0 + 2100}
    assert lines["b"]["next_eligible_at"] == T0 + 1800 and lines["b"]["last_outcome"] is None
    # not before the gate opens, even when the interval has passed
    busy = idle_state(T0 + 3000, {}, T0 + 3000, 1800)
    assert jobs.next_eligible_at(jobs.last_runs(store)["a"], busy, 300) == T0 + 4800


def test_a_store_job_that_found_nothing_waits_for_news(store: Store) -> None:
    """A store-driven job whose last run did nothing, with nothing written since,
    is checked again after QUIET_RECHECK_S, not check_every_s; any write makes it
    due at once; a job that reads the world outside (sync) keeps the usual check."""
    names = ["consolidate", "facts", "sync"]
    for name, items in [("consolidate", 0), ("facts", 3), ("sync", 0)]:
        jobs.end_run(store, jobs.start_run(store, name, T0), T0 + 5,
                     result=JobResult(items=items))
    at = T0 + 301
    gate = idle_state(T0 - 3600, {}, at, 1800)
    assert jobs.due_jobs(store, names, gate, at, 300) == ["facts", "sync"]
    lines = {x["name"]: x for x in jobs.status(store, names, gate, 300)}
    assert lines["consolidate"]["next_eligible_at"] == T0 + jobs.QUIET_RECHECK_S
    hour = T0 + jobs.QUIET_RECHECK_S
    assert jobs.due_jobs(store, names, idle_state(T0 - 3600, {}, hour, 1800), hour,
                         300) == names
    store.insert("test", "transcript", {"channel": "kitchen", "source": "user", "role": "user",
                                        "content": "the boiler is making a noise",
                                        "created_at": T0 + 200})
    assert jobs.due_jobs(store, names, gate, at, 300) == names
    # a failed run is retried at the usual check, news or not
    jobs.end_run(store, jobs.start_run(store, "consolidate", at), at + 5, error="Boom: x")
    later = at + 301
    assert "consolidate" in jobs.due_jobs(store, names, idle_state(T0 - 3600, {}, later, 1800),
                                          later, 300)


def test_interrupted_runs_are_closed_failed(store: Store) -> None:
    run_id = jobs.start_run(store, "a", T0)
    assert jobs.close_interrupted(store, T0 + 5) == 1
    run = jobs.get_run(store, run_id)
    assert run is not None and run.outcome == "failed" and run.error is not None
    assert run.error.startswith("Interrupted")


def test_activity_and_presence_are_durable(store: Store, make_settings: Callable[..., Settings]
                                           ) -> None:
    jobs.record_activity(store, T0 + 10)
    jobs.record_activity(store, T0)  # an older report never moves it back
    jobs.record_presence(store, "ana", "away", T0 + 20)
    jobs.record_presence(store, "ana", "home", T0 + 5)  # older: ignored
    again = Store(store.path, store.fact_kinds)
    try:
        assert jobs.load_activity(again) == T0 + 10
        presence = jobs.load_presence(again)
        assert presence["ana"].state == "away" and presence["ana"].at == T0 + 20
    finally:
        again.close()


# -- reminders ---------------------------------------------------------------

NOW = datetime(2026, 11, 29, 19, 30, tzinfo=LISBON).timestamp()


def at(y: int, mo: int, d: int, h: int, mi: int) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=LISBON).timestamp()


@pytest.mark.parametrize(("text", "expected"), [
    ("tomorrow 8:00", at(2026, 11, 30, 8, 0)),
    ("Tomorrow at 8am", at(2026, 11, 30, 8, 0)),
    ("today 21:30", at(2026, 11, 29, 21, 30)),
    ("in 2 hours", NOW + 7200),
    ("in 45 minutes", NOW + 2700),
    ("in 1 day", NOW + 86400),
    ("2026-12-24 18:00", at(2026, 12, 24, 18, 0)),
    ("8:00", at(2026, 11, 30, 8, 0)),  # the next 8:00 is tomorrow's
    ("21:00", at(2026, 11, 29, 21, 0)),  # the next 21:00 is today's
    ("9pm", at(2026, 11, 29, 21, 0)),
])
def test_parse_when(text: str, expected: float) -> None:
    assert reminders.parse_when(text, NOW, LISBON) == expected


def test_parse_when_across_a_dst_change() -> None:
    before = datetime(2026, 3, 28, 12, 0, tzinfo=LISBON).timestamp()  # WET, UTC+0
    assert reminders.parse_when("tomorrow 12:00", before, LISBON) == before + 23 * 3600


@pytest.mark.parametrize("text", ["today 8:00", "2020-01-01 10:00", "yesterday 8:00",
                                  "tomorrow 25:00", "2026-02-30 10:00", "tomorrow 8",
                                  "soon"])
def test_parse_when_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        reminders.parse_when(text, NOW, LISBON)


def test_reminders_fire_once(store: Store) -> None:
    made = reminders.add(store, "  take the bins out ", "chat", T0 + 60)
    assert made.text == "take the bins out" and made.request_id == f"reminder-{made.id}"
    assert reminders.due(store, T0) == [] and reminders.next_due(store) == T0 + 60
    assert [r.id for r in reminders.due(store, T0 + 60)] == [made.id]
    reminders.mark_fired(store, made.id, 7, T0 + 61)
    reminders.mark_fired(store, made.id, 8, T0 + 62)  # a second mark changes nothing
    got = reminders.get(store, made.id)
    assert got is not None and got.fired_at == T0 + 61 and got.turn_id == 7
    assert reminders.due(store, T0 + 999) == [] and reminders.next_due(store) is None
    with pytest.raises(ValueError):
        reminders.add(store, "   ", "chat", T0)


# -- the Cron messages survive JSON and pickle (as tests/test_messages.py does for
# the others; its sample list should take these too) ----------------------------

def test_cron_messages_refuse_bad_values() -> None:
    with pytest.raises(ValidationError):
        m.Presence(state="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        m.Tick(now=float("nan"))
    with pytest.raises(ValidationError):
        m.Compact(channel="chat", summary="x", watermark=-1)
    # jobs --json prints these as they are: no version field
    assert set(m.JobLine.model_fields) == {"name", "last_outcome", "last_run_at",
                                           "next_eligible_at"}
