"""The decay job (janitor) in the actor runtime, on real Ray and real SQLite: it
runs in a job actor started by Cron, reads on its own connection and deletes
only through the owners (``PurgeTombstones`` to Episodes, ``PruneTranscript``
and the transcript's ``ExpireWriteLog`` to Transcript, the episodes'
``ExpireWriteLog`` to Episodes), at the tick's ``now``. A job that writes on
its own connection anything but its ``job_state`` fails loudly. And
``RemoteWriter.add_fact`` answers the Graph actor's whole resolution.

Time: the owners stamp rows with the system clock; the ticks name instants days
ahead of it (``T0`` + n days), so every tombstone is as old as the tick says."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors import supervisor
from actors.handles import CronClient, EpisodesClient, TranscriptClient
from actors.messages import Activity, AddEpisode, AppendTurns, Compact, Tick
from actors.remote_writer import RemoteWriter
from runtime.config import CONFIG_DIR, JOB_NAMES, Settings, load_settings
from runtime.memories.decay import WRITE_LOG_RETENTION_DAYS
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.transcript import ToolCallIn, TurnIn
from runtime.mind.contract import JobContext, JobResult
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.job_state import get_state, set_state

NS = "test-janitor"
DAY = 86400.0
T0 = time.time()  # the owners' clock, about; the ticks jump ahead of it

cron = CronClient(NS, timeout_s=300)
transcript = TranscriptClient(NS)
episodes = EpisodesClient(NS)


def sneaky(ctx: JobContext) -> JobResult:
    """A job that keeps its bookkeeping (allowed), then writes a turn on its own
    connection instead of through ``ctx.writer`` (refused)."""
    set_state(ctx.store, "sneaky", "ran_at", ctx.clock.now())
    ctx.store.insert("sneaky", "transcript", {
        "channel": "sneaky", "source": "user", "role": "user", "content": "not through Transcript",
        "created_at": ctx.clock.now()})
    return JobResult(1)


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("janitor-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
        "http": {"enabled": False},
        # ticked by messages only; the decay job and the one above, nothing else
        "jobs": {"check_every_s": DAY, "idle_after_s": 1800,
                 "extra": {"sneaky": "tests.test_janitor_actors:sneaky"},
                 "disabled": [n for n in JOB_NAMES if n != "decay"]},
    })
    sup = supervisor.start(settings)
    cron.activity(Activity(at=T0))
    yield settings
    sup.stop()


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def turns(channel: str, n: int, calls: dict[int, str] | None = None) -> list[int]:
    calls = calls or {}
    return transcript.append(AppendTurns(
        turns=[TurnIn(channel=channel, source="user", content=f"{channel} turn {i}.")
               for i in range(n)],
        tool_calls=[[ToolCallIn(name=calls[i])] if i in calls else [] for i in range(n)],
        writer="test")).ids


def episode(channel: str, gist: str, cites: list[int] | None = None,
            children: list[int] | None = None) -> int:
    written = episodes.add(AddEpisode(episode=EpisodeIn(
        channel=channel, source="user", gist=gist, level=1 if children else 0,
        cites=cites or [], children=children or []), writer="test"))
    assert not written.duplicate, gist
    return written.episode_id


def tick(days: float) -> dict[str, tuple[str | None, str | None, str]]:
    ticked = cron.tick(Tick(now=T0 + days * DAY, wait=True), timeout=300)
    assert ticked.started == ["decay", "sneaky"], ticked
    return {r.name: (r.outcome, r.error, r.detail) for r in ticked.runs}


def ids(store: Store, sql: str, args: tuple[object, ...] = ()) -> set[int]:
    return {int(r[0]) for r in store.conn.execute(sql, args)}


def log_rows(store: Store, table: str, row_ids: list[int]) -> int:
    marks = ", ".join("?" for _ in row_ids)
    return int(store.scalar(f"SELECT count(*) FROM write_log WHERE table_name = ?"
                            f" AND row_id IN ({marks})", (table, *row_ids)))


def call_log_rows(store: Store, turn_id: int) -> int:
    return int(store.scalar(
        "SELECT count(*) FROM write_log WHERE table_name = 'tool_calls'"
        " AND json_extract(coalesce(after, before), '$.transcript_id') = ?", (turn_id,)))


def test_the_decay_job_deletes_through_the_owners_at_the_ticks_now(runtime: Settings) -> None:
    r0, r1, r2, r3, r4, r5 = turns("voice", 6, {1: "lights", 2: "timer"})
    (other,) = turns("chat", 1)  # a channel never compacted: nothing pruned
    live = episode("voice", "Ana set a kitchen timer for the pasta.", cites=[r2])
    dead = episode("voice", "The boiler pressure dropped on Sunday.", cites=[r0])
    young = episode("voice", "Ben booked the dentist for March.", cites=[r5])
    parents = [episode("voice", "A weekend of home repairs.", children=[dead]),
               episode("voice", "Appointments for the spring.", children=[young])]
    store = read_store(runtime)
    try:  # young: tombstoned two days after the others, 29 days before the tick
        store.update("test", "episodes", young, {"tombstoned_at": T0 + 2 * DAY})
        kept_call = ids(store, "SELECT id FROM tool_calls WHERE transcript_id = ?", (r2,))
        assert len(kept_call) == 1
    finally:
        store.close()
    transcript.compact(Compact(channel="voice", summary="Turns up to 3.", watermark=r3))

    runs = tick(31)

    assert runs["decay"] == ("ok", None, "1 tombstones purged, 3 transcript rows pruned,"
                             " 0 write-log rows expired, 0 open threads escalated")
    store = read_store(runtime)
    try:
        assert ids(store, "SELECT id FROM episodes") == {live, young, *parents}
        assert ids(store, "SELECT transcript_id FROM episode_citations"
                          " WHERE episode_id = ?", (dead,)) == set()
        # r0 (cited by a purged tombstone only), r1, r3 go; r2 is cited; r4, r5 are above
        assert ids(store, "SELECT id FROM transcript WHERE channel IN ('voice', 'chat')") == {
            r2, r4, r5, other}
        assert ids(store, "SELECT id FROM tool_calls") == kept_call
        deletes = store.rows("SELECT table_name, row_id, writer, at FROM write_log"
                             " WHERE op = 'delete' ORDER BY table_name, row_id")
        assert [(d["table_name"], d["row_id"], d["writer"]) for d in deletes] == [
            ("episodes", dead, "janitor"), ("transcript", r0, "janitor"),
            ("transcript", r1, "janitor"), ("transcript", r3, "janitor")]
        # made by the owners (the system's clock), not on the job's connection (the tick's)
        assert all(d["at"] < T0 + DAY for d in deletes), deletes
        assert store.scalar("SELECT max(watermark) FROM compactions WHERE channel = 'voice'") == r3
        run = store.row("SELECT outcome, items FROM job_runs WHERE job = 'decay'"
                        " ORDER BY id DESC LIMIT 1")
        assert run == {"outcome": "ok", "items": 4}
    finally:
        store.close()


def test_the_write_log_of_pruned_rows_expires_through_their_owners(runtime: Settings) -> None:
    gone, forgotten, kept = turns("kitchen", 3, {0: "oven"})
    leaf = episode("kitchen", "The oven timer beeped twice at noon.", cites=[gone])
    episode("kitchen", "Cooking lunch together.", children=[leaf], cites=[kept])
    transcript.compact(Compact(channel="kitchen", summary="All of it.", watermark=kept))
    first, _ = RemoteWriter(NS).add_fact(FactIn(kind="user_specific", subject="Ana",
                                                key="favourite dish", value="bacalhau"), "test")
    store = read_store(runtime)
    try:
        store.forget("test", "transcript", forgotten)  # a forget's trace is kept for good
        facts = int(store.scalar("SELECT count(*) FROM write_log WHERE table_name = 'facts'"))
    finally:
        store.close()

    assert tick(33)["decay"][0] == "ok"  # purges leaf, prunes gone (and its tool call)
    store = read_store(runtime)
    try:
        assert store.get("episodes", leaf) is None and store.get("transcript", gone) is None
        assert log_rows(store, "transcript", [gone]) == 2  # insert, delete: kept a while
        assert call_log_rows(store, gone) == 1  # the oven call's insert (gone by cascade)
        assert log_rows(store, "episodes", [leaf]) >= 3  # insert, tombstone, delete
        assert log_rows(store, "episode_citations", [leaf]) == 1
    finally:
        store.close()

    # a later write: the log's newest entry, which never expires, is not theirs
    turns("hall", 1)
    decay = tick(34 + WRITE_LOG_RETENTION_DAYS)["decay"]
    assert decay[0] == "ok" and "write-log rows expired" in decay[2]
    assert " 0 write-log rows expired" not in decay[2]
    store = read_store(runtime)
    try:
        assert log_rows(store, "transcript", [gone]) == 0
        assert call_log_rows(store, gone) == 0
        assert log_rows(store, "episodes", [leaf]) == 0
        assert log_rows(store, "episode_citations", [leaf]) == 0
        # facts' history stays whole, and so does the trace of a forgotten turn
        assert store.scalar("SELECT count(*) FROM write_log WHERE table_name = 'facts'") == facts
        assert log_rows(store, "facts", [first]) >= 1
        assert log_rows(store, "transcript", [forgotten]) == 2
        assert log_rows(store, "transcript", [kept]) >= 1
    finally:
        store.close()


def test_a_job_writing_on_its_own_connection_fails_and_writes_nothing(
        runtime: Settings) -> None:
    runs = tick(40 + WRITE_LOG_RETENTION_DAYS)
    assert runs["decay"][0] == "ok"
    outcome, error, _ = runs["sneaky"]
    assert outcome == "failed" and error is not None and "AuthError" in error, runs
    store = read_store(runtime)
    try:
        assert store.scalar("SELECT count(*) FROM transcript WHERE channel = 'sneaky'") == 0
        # its own bookkeeping it may keep
        assert get_state(store, "sneaky", "ran_at") == T0 + (40 + WRITE_LOG_RETENTION_DAYS) * DAY
    finally:
        store.close()


def test_remote_writer_answers_the_whole_resolution(runtime: Settings) -> None:
    writer = RemoteWriter(NS)
    pinned, first = writer.add_fact(FactIn(
        kind="user_specific", subject="Ben", key="shoe size", value="44",
        user_managed=True, confidence=1.0), "test")
    assert first.action == "insert" and first.existing_id is None and first.claim_id is None

    current, kept = writer.add_fact(FactIn(
        kind="user_specific", subject="Ben", key="shoe size", value="46", confidence=0.5),
        "test")
    assert (current, kept.action, kept.existing_id) == (pinned, "keep", pinned)
    assert kept.claim_id is not None and kept.claim_id != pinned
    store = read_store(runtime)
    try:
        claim = store.get("facts", kept.claim_id)
    finally:
        store.close()
    assert claim is not None and (claim["value"], claim["superseded_by"]) == ("46", pinned)

    old, _ = writer.add_fact(FactIn(kind="user_specific", subject="Ben", key="team",
                                    value="Benfica", confidence=0.6), "test")
    new, superseded = writer.add_fact(FactIn(kind="user_specific", subject="Ben", key="team",
                                             value="Sporting", confidence=0.9), "test")
    assert superseded.action == "supersede" and superseded.existing_id == old != new
