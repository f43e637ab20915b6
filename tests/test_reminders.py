"""Scheduled prompts and repeating reminders (runtime.mind.reminders, the Cron actor).

In-process on a real SQLite file: weekday times, repeat rules, the next
occurrence across daylight-saving changes, occurrences, cancel, and the
migration of reminders made before prompts and repeats existed.

On real Ray with a fake OpenAI-compatible model (tests/fake_openai.py), time
jumped by ``Tick(now=...)``, never by sleeping: a scheduled prompt is answered
once, by the model, on its channel, without becoming memory or waking the idle
gate; a Cron crash while the model answers does not answer twice; a re-sent
turn is answered from the store; a weekly reminder keeps its local time across
a DST change; a missed run fires once; list and cancel. Every instant the
runtime sees lies years after the real clock, so the Cron actor's own
background loop never fires what a test means to fire itself.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import apsw
import pytest
import ray
from fake_openai import FakeOpenAI, Mode
from llm_runtime import llm_runtime, llm_settings

from actors.common import CRON, BadRequest
from actors.handles import CronClient, TurnsClient
from actors.messages import (
    CancelReminder,
    JobsStatus,
    Remind,
    Tick,
    UserTurn,
)
from runtime.config import CONFIG_DIR, Settings
from runtime.mind import registry as jobs
from runtime.mind import reminders
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.migrations import MIGRATIONS, migrate
from runtime.time.clock import ManualClock
from tests.waiting import wait_for

LISBON = ZoneInfo("Europe/Lisbon")
NS = "test-reminders"
HOUR = 3600.0


def lisbon(y: int, mo: int, d: int, h: int = 12, mi: int = 0) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=LISBON).timestamp()


def local(at: float) -> datetime:
    return datetime.fromtimestamp(at, LISBON)


# -- times and rules -------------------------------------------------------------

THURSDAY = lisbon(2026, 10, 15, 12, 0)


@pytest.mark.parametrize(("text", "expected"), [
    ("tuesday 19:00", lisbon(2026, 10, 20, 19, 0)),
    ("Monday at 8am", lisbon(2026, 10, 19, 8, 0)),
    ("on fri 9pm", lisbon(2026, 10, 16, 21, 0)),
    ("thursday 13:00", lisbon(2026, 10, 15, 13, 0)),  # today's, still ahead
    ("thu 11:00", lisbon(2026, 10, 22, 11, 0)),  # today's has passed: next week's
    ("wed 19:00", lisbon(2026, 10, 21, 19, 0)),
    ("Sunday 10:00", lisbon(2026, 10, 18, 10, 0)),
])
def test_parse_when_reads_weekdays(text: str, expected: float) -> None:
    assert reminders.parse_when(text, THURSDAY, LISBON) == expected


@pytest.mark.parametrize("text", ["funday 8:00", "tuesday", "tuesday 25:00", "tuesday 8"])
def test_parse_when_refuses_bad_weekdays(text: str) -> None:
    with pytest.raises(ValueError):
        reminders.parse_when(text, THURSDAY, LISBON)


@pytest.mark.parametrize(("text", "rule"), [
    ("day", "day"), ("daily", "day"), ("week", "week"), ("Weekly", "week"),
    ("weekday", "weekday"), ("weekdays", "weekday"), ("3 days", "3 days"),
    ("14 days", "2 weeks"), ("2 weeks", "2 weeks"), ("1 day", "day"), ("6 hours", "6 hours"),
    ("hourly", "hour"), ("every 2 days", "2 days"),
])
def test_repeat_rules_are_read_and_read_back(text: str, rule: str) -> None:
    repeat = reminders.parse_repeat(text)
    assert repeat.rule == rule
    assert reminders.parse_repeat(rule) == repeat


@pytest.mark.parametrize("text", ["fortnightly", "0 days", "2 weekdays", "500 days",
                                  "1000 hours", "monthly", ""])
def test_bad_repeat_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        reminders.parse_repeat(text)


def test_a_daily_reminder_keeps_its_local_time_across_both_dst_changes() -> None:
    day = reminders.parse_repeat("day")
    for start in (lisbon(2026, 3, 27, 8, 0), lisbon(2026, 10, 23, 8, 0)):
        at, seen = start, []
        for _ in range(4):
            at = reminders.next_occurrence(start, day, at, LISBON)
            seen.append(local(at))
        assert [(t.hour, t.minute) for t in seen] == [(8, 0)] * 4
        assert [(t - seen[0]).days for t in seen] == [0, 1, 2, 3]
        # one of the steps is 23 or 25 hours of elapsed time (the change)
        steps = {round((b.timestamp() - a.timestamp()) / HOUR)
                 for a, b in itertools.pairwise(seen)}
        assert steps in ({24, 23}, {24, 25})


def test_a_time_skipped_by_dst_does_not_move_the_next_days() -> None:
    day = reminders.parse_repeat("day")
    start = lisbon(2026, 3, 28, 1, 30)  # 01:30 does not exist on 29 March in Lisbon
    first = reminders.next_occurrence(start, day, start, LISBON)
    second = reminders.next_occurrence(start, day, first, LISBON)
    assert (local(first).hour, local(first).minute) == (2, 30)  # as late as the skip
    assert (local(second).day, local(second).hour, local(second).minute) == (30, 1, 30)


def test_weekday_and_hour_rules() -> None:
    weekday = reminders.parse_repeat("weekday")
    saturday = lisbon(2026, 3, 28, 8, 0)
    first = reminders.first_occurrence(saturday, weekday, LISBON)
    assert local(first).strftime("%a %H:%M") == "Mon 08:00"
    at, days = first, []
    for _ in range(6):
        at = reminders.next_occurrence(first, weekday, at, LISBON)
        days.append(local(at).strftime("%a %d"))
    assert days == ["Tue 31", "Wed 01", "Thu 02", "Fri 03", "Mon 06", "Tue 07"]
    hours = reminders.parse_repeat("6 hours")
    night = lisbon(2026, 3, 28, 22, 0)
    after = reminders.next_occurrence(night, hours, night, LISBON)
    assert after - night == 6 * HOUR  # elapsed time: 05:00 by the new clock
    assert local(after).hour == 5
    # far behind: the first occurrence after the given instant, not the next step
    assert reminders.next_occurrence(night, hours, night + 100 * HOUR, LISBON) == night + 102 * HOUR


# -- the table ---------------------------------------------------------------------

@pytest.fixture
def store(make_settings: Callable[..., Settings], clock: ManualClock) -> Iterator[Store]:
    settings = make_settings()
    s = Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"), clock=clock)
    yield s
    s.close()


def test_a_repeating_reminder_moves_on_once_per_occurrence(store: Store) -> None:
    week = reminders.parse_repeat("week")
    due = reminders.parse_when("tuesday 19:00", lisbon(2026, 10, 15), LISBON)
    made = reminders.add(store, "take the bins out", "chat", due, repeat=week, zone=LISBON)
    assert made.repeat == "week" and made.anchor_at == due
    assert made.request_id == f"reminder-{made.id}"
    assert reminders.mark_fired(store, made.id, 5, due + 60, zone=LISBON, occurrence=0)
    # the same occurrence marked again (a retry): nothing changes
    assert not reminders.mark_fired(store, made.id, 6, due + 90, zone=LISBON, occurrence=0)
    again = reminders.get(store, made.id)
    assert again is not None and again.fired_at is None and again.occurrence == 1
    assert again.request_id == f"reminder-{made.id}-1" and again.turn_id == 5
    assert local(again.due_at).strftime("%Y-%m-%d %H:%M %Z") == "2026-10-27 19:00 WET"
    # down for three weeks: fired late, once; the next is the one after the firing
    late = lisbon(2026, 11, 17, 21, 0)
    assert [r.id for r in reminders.due(store, late)] == [made.id]
    assert reminders.mark_fired(store, made.id, 7, late, zone=LISBON, occurrence=1)
    after = reminders.get(store, made.id)
    assert after is not None and local(after.due_at) == datetime(2026, 11, 24, 19, 0,
                                                                  tzinfo=LISBON)
    assert reminders.due(store, late) == []
    assert reminders.cancel(store, made.id, late) is True
    assert reminders.cancel(store, made.id, late) is False  # again: already
    assert reminders.due(store, after.due_at + 1) == [] and reminders.next_due(store) is None
    assert not reminders.mark_fired(store, made.id, 8, after.due_at, zone=LISBON)
    with pytest.raises(ValueError, match="no reminder"):
        reminders.cancel(store, 999, late)


def test_a_prompt_is_found_answered_by_its_reply(store: Store) -> None:
    made = reminders.add(store, "what is on today?", "voice", 100.0, kind="ask")
    assert reminders.answered(store, made) is None
    reply = store.insert("t", "transcript", {
        "channel": "voice", "source": "assistant", "role": "assistant", "content": "Nothing.",
        "created_at": 1.0, "request_id": reminders.reply_request_id(made.request_id)})
    assert reminders.answered(store, made) == reply
    with pytest.raises(ValueError):
        reminders.add(store, "x", "voice", 1.0, kind="shout")  # type: ignore[arg-type]


def test_reminders_made_before_prompts_and_repeats_keep_their_meaning(tmp_path: Path) -> None:
    names = [name for name, _ in MIGRATIONS]
    mine = names.index("0013_reminder_prompts_and_repeats")
    conn = apsw.Connection(str(tmp_path / "old.db"))
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn, MIGRATIONS[:mine])
    conn.execute("INSERT INTO reminders (text, channel, due_at, created_at, fired_at, turn_id)"
                 " VALUES ('said', 'chat', 10, 1, 11, 4), ('pending', 'chat', 20, 1, NULL, NULL)")
    conn.close()
    with Store(tmp_path / "old.db", FactKinds.load(CONFIG_DIR / "fact_kinds.toml")) as s:
        said, waiting = (reminders.get(s, i) for i in (1, 2))
        assert said is not None and said.fired_at == 11 and said.outcome == "said"
        assert waiting is not None and waiting.kind == "say" and waiting.repeat is None
        assert waiting.request_id == "reminder-2"  # what the old code would have used
        assert [r.id for r in reminders.due(s, 30)] == [2]


# -- on Ray, with a language model ----------------------------------------------------

_YEARS = itertools.count(2035)


def era() -> int:
    """A year of its own for each test, long after the real clock."""
    return next(_YEARS)


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    # no job to start (whichever there are): a tick here only fires reminders
    settings = llm_settings(NS, tmp_path_factory.mktemp("reminders-data"), model_cache, server,
                            timeout_s=30, household={"timezone": "Europe/Lisbon"},
                            jobs={"check_every_s": 86400.0, "disabled": list(jobs.JOBS)})
    assert jobs.registry(settings) == {}
    with llm_runtime(settings):
        yield settings


cron = CronClient(NS, timeout_s=300)
turns = TurnsClient(NS, timeout_s=120)


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def asked(server: FakeOpenAI, text: str) -> int:
    """How many requests reached the model with ``text`` in their last user message."""
    count = 0
    for request in server.requests:
        users = [m for m in (request.body or {}).get("messages", []) if m["role"] == "user"]
        count += bool(users) and text in users[-1]["content"]
    return count


def test_a_scheduled_prompt_is_answered_once_on_its_channel(
        runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    y = era()
    text = "summarise what is on the calendar today"
    made = cron.remind(Remind(text=text, when="8:00", channel="voice", kind="ask",
                              now=lisbon(y, 6, 1, 12)))
    assert made.kind == "ask" and made.repeat is None
    assert made.due_at == lisbon(y, 6, 2, 8, 0)
    before = cron.status(JobsStatus(now=made.due_at)).idle.last_activity

    early = cron.tick(Tick(now=made.due_at - 1, wait=True))
    assert made.id not in early.prompts and asked(server, text) == 0
    ticked = cron.tick(Tick(now=made.due_at, wait=True))
    assert made.id in ticked.prompts and made.id in ticked.reminders
    assert asked(server, text) == 1

    store = read_store(runtime)
    try:
        prompt = store.row("SELECT * FROM transcript WHERE request_id = ?",
                           (f"reminder-{made.id}",))
        assert prompt is not None
        assert (prompt["channel"], prompt["source"], prompt["role"], prompt["content"]) == (
            "voice", "scheduled", "user", text)
        assert prompt["memory"] == 0  # muted by the profiles: never memory
        reply = store.row("SELECT * FROM transcript WHERE request_id = ?",
                          (reminders.reply_request_id(f"reminder-{made.id}"),))
        assert reply is not None and reply["id"] > prompt["id"]
        assert (reply["channel"], reply["role"]) == ("voice", "assistant")
        assert reply["content"] == f"echo: {text}"  # the configured model's answer
        row = store.row("SELECT * FROM reminders WHERE id = ?", (made.id,))
        assert row is not None and row["fired_at"] == made.due_at
        assert (row["turn_id"], row["outcome"], row["occurrence"]) == (reply["id"], "answered", 1)
    finally:
        store.close()
    # a scheduled turn is not the user: the idle gate did not start again
    assert cron.status(JobsStatus(now=made.due_at)).idle.last_activity == before

    # ticked again (later, and at the same instant): never answered twice
    for now in (made.due_at, made.due_at + HOUR):
        again = cron.tick(Tick(now=now, wait=True))
        assert made.id not in again.prompts and made.id not in again.reminders
    assert asked(server, text) == 1
    assert made.id not in [r.id for r in cron.list_reminders().reminders]


def _pid() -> int | None:
    """The Cron actor's process id (None while it is restarting)."""
    try:
        handle = ray.get_actor(CRON, namespace=NS)
        pid: Any = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=5)
        return int(pid)
    except Exception:
        return None


def test_a_cron_crash_while_the_model_answers_does_not_answer_twice(
        runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    y = era()
    text = "what should I cook tonight, slow model"
    made = cron.remind(Remind(text=text, when="18:00", channel="chat", kind="ask",
                              now=lisbon(y, 3, 1, 12)))
    server.hold("slow model")
    try:
        # the tick does not wait for the model (nor does the next one re-send)
        started = cron.tick(Tick(now=made.due_at))
        assert started.prompts == [made.id] and started.reminders == []
        assert server.wait_held("slow model")
        busy = cron.tick(Tick(now=made.due_at + 60, wait=True))
        assert busy.prompts == [] and busy.reminders == []

        first = _pid()
        ray.kill(ray.get_actor(CRON, namespace=NS), no_restart=False)  # Ray restarts it
        assert wait_for(lambda: _pid() not in (None, first), timeout=120)
        # the new Cron fires it again (not marked): the re-send waits in the Turns
        # actor's channel queue behind the turn the model is still answering
        again = cron.tick(Tick(now=made.due_at + 120))
        assert again.prompts == [made.id]
        assert wait_for(lambda: turns.waiting().get("chat") == 1, timeout=60)
    finally:
        server.release("slow model")
    store = read_store(runtime)
    try:
        assert wait_for(lambda: store.scalar(
            "SELECT fired_at FROM reminders WHERE id = ?", (made.id,)) is not None, timeout=120)
        row = store.row("SELECT * FROM reminders WHERE id = ?", (made.id,))
        assert row is not None and row["outcome"] == "answered" and row["occurrence"] == 1
        replies = store.rows("SELECT id FROM transcript WHERE request_id = ?",
                             (reminders.reply_request_id(f"reminder-{made.id}"),))
        assert [r["id"] for r in replies] == [row["turn_id"]]
        assert store.scalar("SELECT count(*) FROM transcript WHERE request_id = ?",
                            (f"reminder-{made.id}",)) == 1
    finally:
        store.close()
    assert asked(server, text) == 1  # the model was asked once


def test_a_prompt_answered_before_a_crash_is_not_asked_again(
        runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    y = era()
    text = "any parcels due this week, answered before the crash"
    made = cron.remind(Remind(text=text, when="9:00", channel="voice", kind="ask",
                              now=lisbon(y, 1, 10, 12)))
    # as if Cron had sent it, the answer was stored, and Cron died before the mark
    said = turns.process(UserTurn(channel="voice", source="scheduled", text=text,
                                  request_id=f"reminder-{made.id}"))
    assert asked(server, text) == 1
    ticked = cron.tick(Tick(now=made.due_at, wait=True))
    assert made.id in ticked.reminders and asked(server, text) == 1
    store = read_store(runtime)
    try:
        row = store.row("SELECT * FROM reminders WHERE id = ?", (made.id,))
        assert row is not None and row["turn_id"] == said.reply_id
        assert (row["outcome"], row["fired_at"]) == ("answered", made.due_at)
    finally:
        store.close()


def test_a_resent_turn_is_answered_from_the_store(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    text = "is the back door locked, asked once"
    turn = UserTurn(channel="cli", source="scheduled", text=text, request_id="resend-door")
    first = turns.process(turn)
    assert first.provider == "local" and asked(server, text) == 1
    second = turns.process(turn)
    assert (second.turn_id, second.reply_id, second.text) == (
        first.turn_id, first.reply_id, first.text)
    assert second.provider == "stored" and asked(server, text) == 1
    streamed = list(turns.process_stream(turn))
    assert streamed[-1] == second and asked(server, text) == 1


def test_a_weekly_reminder_keeps_its_local_time_across_a_dst_change(runtime: Settings) -> None:
    y = 2040  # 28 October 2040 is the last Sunday of October: Lisbon goes back to WET
    made = cron.remind(Remind(text="take the bins out", when="tuesday 19:00", every="week",
                              channel="chat", now=lisbon(y, 10, 18, 12)))
    try:
        assert made.repeat == "week" and made.due_at == lisbon(y, 10, 23, 19, 0)
        fired_at = []
        due = made.due_at
        for _ in range(3):
            assert made.id not in cron.tick(Tick(now=due - 1, wait=True)).reminders
            assert made.id in cron.tick(Tick(now=due, wait=True)).reminders
            fired_at.append(due)
            listed = {r.id: r for r in cron.list_reminders().reminders}[made.id]
            due = listed.due_at
        assert [local(t).strftime("%a %H:%M") for t in fired_at] == ["Tue 19:00"] * 3
        assert [local(t).day for t in fired_at] == [23, 30, 6]
        assert fired_at[1] - fired_at[0] == 7 * 24 * HOUR + HOUR  # the week with the change
        assert local(due) == datetime(y, 11, 13, 19, 0, tzinfo=LISBON)
        store = read_store(runtime)
        try:
            said = store.rows("SELECT created_at, request_id, content FROM transcript"
                              " WHERE request_id LIKE ? ORDER BY id", (f"reminder-{made.id}%",))
        finally:
            store.close()
        assert [r["request_id"] for r in said] == [
            f"reminder-{made.id}", f"reminder-{made.id}-1", f"reminder-{made.id}-2"]
        assert [r["created_at"] for r in said] == fired_at
        assert {r["content"] for r in said} == {"Reminder: take the bins out"}
    finally:
        cron.cancel_reminder(CancelReminder(id=made.id))


def test_a_missed_run_fires_once_then_the_schedule_goes_on(runtime: Settings) -> None:
    y = era()
    made = cron.remind(Remind(text="water the plants", when="monday 9:00", every="week",
                              channel="chat", now=lisbon(y, 5, 1, 12)))
    try:
        # the runtime was down for three occurrences; it comes back on a Thursday
        back = made.due_at + 24 * 24 * HOUR + 5 * HOUR
        assert made.id in cron.tick(Tick(now=back, wait=True)).reminders
        assert made.id not in cron.tick(Tick(now=back + 60, wait=True)).reminders
        listed = {r.id: r for r in cron.list_reminders().reminders}[made.id]
        assert listed.fired == 1 and listed.last_outcome == "said"
        assert local(listed.due_at).strftime("%a %H:%M") == "Mon 09:00"
        assert back < listed.due_at < back + 7 * 24 * HOUR
        assert made.id in cron.tick(Tick(now=listed.due_at, wait=True)).reminders
        store = read_store(runtime)
        try:
            assert store.scalar("SELECT count(*) FROM transcript WHERE request_id LIKE ?",
                                (f"reminder-{made.id}%",)) == 2
        finally:
            store.close()
    finally:
        cron.cancel_reminder(CancelReminder(id=made.id))


def test_list_and_cancel(runtime: Settings, server: FakeOpenAI) -> None:
    y = era()
    now = lisbon(y, 2, 1, 12)
    bins = cron.remind(Remind(text="bins", when="tuesday 19:00", every="week", channel="chat",
                              now=now))
    news = cron.remind(Remind(text="read me the news, cancelled", when="tomorrow 7:30",
                              channel="voice", kind="ask", now=now))
    listed = {r.id: r for r in cron.list_reminders().reminders}
    assert listed[bins.id].model_dump() == {
        "id": bins.id, "text": "bins", "channel": "chat", "kind": "say", "repeat": "week",
        "due_at": bins.due_at, "due_local": bins.due_local, "fired": 0, "last_outcome": None,
        "error": None}
    assert (listed[news.id].kind, listed[news.id].repeat) == ("ask", None)
    assert listed[news.id].due_local == datetime(y, 2, 2, 7, 30, tzinfo=LISBON).isoformat(
        timespec="minutes")

    for made in (bins, news):
        assert cron.cancel_reminder(CancelReminder(id=made.id)).detail == (
            f"reminder {made.id} cancelled")
        assert cron.cancel_reminder(CancelReminder(id=made.id)).detail == (
            f"reminder {made.id} was cancelled")
    assert {bins.id, news.id}.isdisjoint(r.id for r in cron.list_reminders().reminders)
    # a cancelled one never fires
    ticked = cron.tick(Tick(now=now + 30 * 24 * HOUR, wait=True))
    assert {bins.id, news.id}.isdisjoint(ticked.reminders + ticked.prompts)
    assert asked(server, "read me the news") == 0
    store = read_store(runtime)
    try:
        assert store.scalar("SELECT count(*) FROM transcript WHERE request_id IN (?, ?)",
                            (f"reminder-{bins.id}", f"reminder-{news.id}")) == 0
    finally:
        store.close()

    with pytest.raises(BadRequest, match="no reminder 999999"):
        cron.cancel_reminder(CancelReminder(id=999999))
    once = cron.remind(Remind(text="once", when="in 1 hour", channel="chat", now=now))
    assert once.id in cron.tick(Tick(now=once.due_at, wait=True)).reminders
    with pytest.raises(BadRequest, match="fired already"):
        cron.cancel_reminder(CancelReminder(id=once.id))
    with pytest.raises(BadRequest, match="cannot read the repeat"):
        cron.remind(Remind(text="x", when="8:00", every="monthly", now=now))
