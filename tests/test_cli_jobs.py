"""``reverie jobs``, ``jobs run``, ``presence`` and ``remind`` against a running runtime
(``reverie run`` joined to the test session's Ray); a conversation imported
through ``reverie import``, and every job run on it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from actors.embedder import RemoteEmbedder
from actors.messages import Embed, Embedded
from runtime.config import JOB_NAMES
from runtime.mind import registry as jobs
from runtime.mind.contract import JobContext, JobResult
from tests.reverie_process import joined_runtime, runtime_env
from tests.reverie_process import reverie as run_reverie

NS = "test-cli-jobs"
ROOT = Path(__file__).resolve().parent.parent


def reverie(env: dict[str, str], *args: str, timeout: float = 300
            ) -> subprocess.CompletedProcess[str]:
    """``reverie ARGS`` from the repository, in this process (the runtime is joined
    to this process's Ray: tests/reverie_process.py)."""
    return run_reverie(env, *args, timeout=timeout, cwd=ROOT)


def embeds(ctx: JobContext) -> JobResult:
    """A job (``jobs.extra``) that embeds with its context's embedder and says which."""
    if ctx.embedder is None:
        raise RuntimeError("no embedder in the job context")
    vecs = ctx.embedder.embed(["the bees swarmed", "honey harvest", "a new hive", "pollen"])
    return JobResult(items=len(vecs), detail=f"{type(ctx.embedder).__name__} "
                                             f"{ctx.embedder.name} {vecs.shape[1]}")


def details_under(table: str) -> dict[str, str]:
    """``reverie jobs``' text: each job's indented line under its row, by job name."""
    out: dict[str, str] = {}
    lines = table.splitlines()
    for row, under in pairwise(lines[1:]):
        if row and not row.startswith(" ") and under.startswith("    "):
            out[row.split()[0]] = under.strip()
    return out


@pytest.fixture(scope="module")
def running(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    # the real jobs are listed; two test jobs are added for the exit codes, one
    # that tells the embedder its context holds
    config = ('[jobs]\nextra = { ok = "tests.jobs_for_tests:ok", '
              'boom = "tests.jobs_for_tests:boom", '
              'embeds = "tests.test_cli_jobs:embeds" }\n')
    env = runtime_env(tmp_path_factory.mktemp("cli-jobs-data"), NS, model_cache, config)
    with joined_runtime(env, ray_instance):
        yield env


def test_jobs_json_shape(running: dict[str, str]) -> None:
    result = reverie(running, "jobs", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"jobs", "idle"}
    assert [j["name"] for j in report["jobs"]] == [*JOB_NAMES, "ok", "boom", "embeds"]
    for job in report["jobs"]:
        assert set(job) == {"name", "last_outcome", "last_run_at", "next_eligible_at"}
        assert job["last_outcome"] in ("ok", "failed", None)
    assert isinstance(report["idle"]["idle"], bool)
    table = reverie(running, "jobs")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["job", "last"]
    assert "consolidate" in table.stdout


def test_jobs_run_wait_exit_codes(running: dict[str, str]) -> None:
    ok = reverie(running, "jobs", "run", "ok", "--wait")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ok, 1 items")
    boom = reverie(running, "jobs", "run", "boom", "--wait")
    assert boom.returncode == 3 and "RuntimeError: boom" in boom.stderr
    unknown = reverie(running, "jobs", "run", "nope", "--wait")
    assert unknown.returncode == 2 and "unknown job 'nope'" in unknown.stderr
    report = json.loads(reverie(running, "jobs", "--json").stdout)
    outcomes = {j["name"]: j["last_outcome"] for j in report["jobs"]}
    assert outcomes["ok"] == "ok" and outcomes["boom"] == "failed"
    # the text shows each last run in words: what it did, or why it failed
    table = reverie(running, "jobs")
    assert table.returncode == 0, table.stderr
    under = details_under(table.stdout)
    assert under["ok"] == ok.stdout.split(" items (", 1)[1].strip()[:-1]
    assert under["ok"].startswith("run ")
    assert under["boom"] == "RuntimeError: boom: this job always fails"
    started = reverie(running, "jobs", "run", "ok")
    assert started.returncode == 0 and "started" in started.stdout


def test_presence_resets_and_everyone_away_is_idle(running: dict[str, str]) -> None:
    home = reverie(running, "presence", "home", "--person", "ana")
    assert home.returncode == 0, home.stderr
    idle = json.loads(reverie(running, "jobs", "--json").stdout)["idle"]
    assert idle["idle"] is False and idle["presence"] == {"ana": "home"}
    assert reverie(running, "presence", "away", "--person", "ana").returncode == 0
    idle = json.loads(reverie(running, "jobs", "--json").stdout)["idle"]
    assert idle["idle"] is True and idle["reason"] == "everyone-away"
    bad = reverie(running, "presence", "sideways")
    assert bad.returncode == 2


def test_remind(running: dict[str, str]) -> None:
    made = reverie(running, "remind", "water the plants", "--at", "tomorrow 8:00",
                   "--channel", "chat")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("reminder ") and "on chat at " in made.stdout
    assert "T08:00" in made.stdout
    past = reverie(running, "remind", "too late", "--at", "2001-01-01 10:00")
    assert past.returncode == 2 and "in the past" in past.stderr


def test_remind_repeating_prompts_list_and_cancel(running: dict[str, str]) -> None:
    bins = reverie(running, "remind", "take the bins out", "--at", "tuesday 19:00",
                   "--every", "week", "--channel", "chat")
    assert bins.returncode == 0, bins.stderr
    assert bins.stdout.startswith("reminder ") and bins.stdout.rstrip().endswith(", every week")
    assert "T19:00" in bins.stdout
    ask = reverie(running, "remind", "summarise what is on the calendar today", "--at", "8:00",
                  "--ask", "--every", "weekday")
    assert ask.returncode == 0, ask.stderr
    assert ask.stdout.startswith("prompt ") and "every weekday" in ask.stdout
    bins_id, ask_id = (int(r.stdout.split()[1]) for r in (bins, ask))

    listed = reverie(running, "remind", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    lines = {r["id"]: r for r in json.loads(listed.stdout)["reminders"]}
    assert (lines[bins_id]["kind"], lines[bins_id]["repeat"]) == ("say", "week")
    assert (lines[ask_id]["kind"], lines[ask_id]["repeat"]) == ("ask", "weekday")
    assert lines[ask_id]["text"] == "summarise what is on the calendar today"
    assert lines[ask_id]["due_local"][11:16] == "08:00"
    table = reverie(running, "remind", "--list")
    assert table.returncode == 0 and table.stdout.split()[:6] == [
        "id", "kind", "next", "repeat", "channel", "text"]
    assert any(line.split()[:2] == [str(bins_id), "say"] and "week" in line.split()
               for line in table.stdout.splitlines())

    for rid in (bins_id, ask_id):
        gone = reverie(running, "remind", "--cancel", str(rid))
        assert gone.returncode == 0 and gone.stdout.strip() == f"reminder {rid} cancelled"
    after = json.loads(reverie(running, "remind", "--list", "--json").stdout)["reminders"]
    assert {bins_id, ask_id}.isdisjoint(r["id"] for r in after)
    unknown = reverie(running, "remind", "--cancel", "999999")
    assert unknown.returncode == 2 and "no reminder 999999" in unknown.stderr
    for bad in (["--list", "some text"], ["no time"], ["x", "--at", "8:00", "--every", "monthly"],
                ["x", "--at", "8:00", "--json"]):
        wrong = reverie(running, "remind", *bad)
        assert wrong.returncode == 2, (bad, wrong.stdout, wrong.stderr)


@pytest.fixture(scope="module")
def conversation(running: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, int]:
    """A two-person conversation of a few hundred turns (``tests/conversation.py``),
    imported once through ``reverie import``; answers the counts from before."""
    from tests.conversation import write_jsonl

    history = tmp_path_factory.mktemp("conversation") / "history.jsonl"
    assert write_jsonl(history) >= 200
    before: dict[str, int] = json.loads(reverie(running, "status", "--json").stdout)["counts"]
    imported = reverie(running, "import", str(history))
    assert imported.returncode == 0, imported.stderr
    return before


def test_a_conversation_becomes_episodes_and_facts_through_the_cli(
        running: dict[str, str], conversation: dict[str, int]) -> None:
    """Import a two-person conversation of a few hundred turns, run the jobs, and
    find the layers in status and recall (the Done-when of the subconscious)."""
    before = conversation
    consolidated = reverie(running, "jobs", "run", "consolidate", "--wait")
    assert consolidated.returncode == 0, consolidated.stdout + consolidated.stderr
    extracted = reverie(running, "jobs", "run", "facts", "--wait")
    assert extracted.returncode == 0, extracted.stdout + extracted.stderr
    counts = json.loads(reverie(running, "status", "--json").stdout)["counts"]
    assert counts["episodes"] - before["episodes"] >= 10, counts
    assert counts["facts"] - before["facts"] >= 10, counts
    found = json.loads(reverie(running, "recall", "What did Nora make in her pottery class?",
                               "--json").stdout)
    assert any(item["kind"] == "episode" for item in found["items"]), found["items"]
    moved = json.loads(reverie(running, "recall", "Where does Nora live now?", "--json").stdout)
    facts = [item["text"] for item in moved["items"] if item["kind"] == "fact"]
    assert any("York" in text for text in facts), facts
    jobs = {j["name"]: j for j in json.loads(reverie(running, "jobs", "--json").stdout)["jobs"]}
    assert jobs["consolidate"]["last_outcome"] == "ok" and jobs["facts"]["last_outcome"] == "ok"


def test_every_job_ends_ok_on_an_imported_conversation(
        running: dict[str, str], conversation: dict[str, int]) -> None:
    """The Done-when of "The subconscious II": with a real conversation imported
    and no language model configured, ``jobs run NAME --wait`` succeeds for each
    of the nine jobs (those with nothing to do too: no connectors, no feeds), and
    ``jobs --json`` shows each ok. The text of ``reverie jobs`` shows under each
    job the detail line its run recorded."""
    assert list(jobs.JOBS) == list(JOB_NAMES)
    said: dict[str, str] = {}
    for name in JOB_NAMES:
        done = reverie(running, "jobs", "run", name, "--wait")
        assert done.returncode == 0, (name, done.stdout, done.stderr)
        assert done.stdout.startswith(f"{name}: ok, ") and " items (" in done.stdout, done.stdout
        said[name] = done.stdout.split(" items (", 1)[1].strip()[:-1]
    report = json.loads(reverie(running, "jobs", "--json").stdout)
    outcomes = {j["name"]: j["last_outcome"] for j in report["jobs"]}
    assert {name: outcomes[name] for name in JOB_NAMES} == dict.fromkeys(JOB_NAMES, "ok")
    table = reverie(running, "jobs")
    assert table.returncode == 0, table.stderr
    under = details_under(table.stdout)
    assert {name: under.get(name) for name in JOB_NAMES} == said
    assert said["sync"] == "no connectors configured"
    assert said["research"] == "no feeds configured"


def test_a_job_embeds_with_the_embedder_actor(running: dict[str, str]) -> None:
    """The job actor hands its job the Embedder actor's model: no ONNX session of
    its own."""
    done = reverie(running, "jobs", "run", "embeds", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ("embeds: ok, 4 items "
                                   "(RemoteEmbedder all-MiniLM-L6-v2/fp32 384)")


# -- parts --------------------------------------------------------------------


class FakeRecallClient:
    """The Recall actor's client in this process, as RemoteEmbedder uses it: counts the calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embedder_info(self) -> tuple[str, int]:
        return "fake", 2

    def embed(self, msg: Embed) -> Embedded:
        self.calls.append(len(msg.texts))
        return Embedded.of("fake", np.array([[len(t), 1.0] for t in msg.texts],
                                            dtype=np.float32))


def test_the_remote_embedder_sends_bounded_calls() -> None:
    client = FakeRecallClient()
    remote = RemoteEmbedder(client, batch=2)  # type: ignore[arg-type]
    texts: Sequence[str] = ["a", "bb", "ccc", "dddd", "eeeee"]
    vecs = remote.embed(texts)
    assert client.calls == [2, 2, 1]
    assert vecs[:, 0].tolist() == [1, 2, 3, 4, 5] and vecs.shape == (5, 2)
    assert remote.embed([]).shape == (0, 2) and client.calls == [2, 2, 1]
    assert RemoteEmbedder(client, batch=10**6).batch == 1000  # type: ignore[arg-type]


def test_a_detail_is_recorded_on_one_bounded_line() -> None:
    assert jobs.detail_text("3 written,\n\tskipped  bad-event 1\x1b[2J") == \
        "3 written, skipped bad-event 1 [2J"
    long = jobs.detail_text("x " * 5000)
    assert long is not None and len(long) == jobs.MAX_DETAIL and long.endswith("…")
    assert jobs.detail_text(" \n ") is None
