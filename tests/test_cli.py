"""The ``reverie`` command against a running runtime (joined to the test session's Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reverie_process import reverie as run_reverie
from tests.reverie_process import reverie_process, start_runtime

NS = "test-cli"


def _env(data_dir: Path, model_cache: Path) -> dict[str, str]:
    return {**os.environ, "REVERIE_DATA_DIR": str(data_dir),
            "REVERIE_RUNTIME__NAMESPACE": NS,
            "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
            "REVERIE_PERSONA__GLOBAL_DIR": str(data_dir / "persona"),
            "REVERIE_HTTP__PORT": "0"}  # the HTTP API on a free port


def reverie(env: dict[str, str], *args: str, stdin: str | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``reverie ARGS``: in this process against the module's runtime (it is joined
    to this process's Ray), in its own process otherwise (tests/reverie_process.py)."""
    return run_reverie(env, *args, stdin=stdin, timeout=timeout)


@pytest.fixture(scope="module")
def running(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    env = _env(tmp_path_factory.mktemp("cli-data"), model_cache)
    proc = start_runtime(env, "--address", ray_instance)
    yield env
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    after = reverie(env, "status")
    assert after.returncode == 1 and "no runtime" in after.stderr


def test_status_without_runtime_exits_non_zero(tmp_path: Path, model_cache: Path) -> None:
    result = reverie(_env(tmp_path, model_cache), "status")
    assert result.returncode == 1
    assert "no runtime is running" in result.stderr


def test_broken_config_is_named(tmp_path: Path, model_cache: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[recall]\nmax_items = 'many'\n")
    result = reverie(_env(tmp_path, model_cache), "--config", str(bad), "status")
    assert result.returncode == 2 and "recall.max_items" in result.stderr


def test_init_writes_a_user_config_that_loads(tmp_path: Path, model_cache: Path) -> None:
    env = _env(tmp_path / "data", model_cache)
    target = tmp_path / "conf" / "reverie.toml"
    made = reverie(env, "init", "--path", str(target))
    assert made.returncode == 0, made.stderr
    assert target.is_file() and (target.stat().st_mode & 0o777) == 0o600
    again = reverie(env, "init", "--path", str(target))
    assert again.returncode == 2 and str(target) in again.stderr
    target.write_text("# edited by hand\n")
    forced = reverie(env, "init", "--path", str(target), "--force")
    assert forced.returncode == 0 and "edited by hand" not in target.read_text()
    uses = reverie(env, "--config", str(target), "status")
    assert uses.returncode == 1 and "no runtime is running" in uses.stderr


def test_status_lists_every_actor(running: dict[str, str]) -> None:
    # a `reverie` process of its own, as a user runs it: its own Ray driver joins
    # the runtime's cluster (the other commands of this module run in-process)
    result = reverie_process(running, "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["namespace"] == NS
    assert status["actors"] == dict.fromkeys(
        ["transcript", "recall", "episodes", "graph", "turns", "cron", "http"],
        "ok")


def test_say_and_recall(running: dict[str, str]) -> None:
    told = reverie(running, "say", "Our neighbour Tomas keeps bees on his roof.",
                   "--channel", "voice", "--json")
    assert told.returncode == 0, told.stderr
    turn_id = json.loads(told.stdout)["turn_id"]
    asked = reverie(running, "say", "Who keeps bees near us?", "--json")
    assert asked.returncode == 0, asked.stderr
    reply = json.loads(asked.stdout)
    assert f"turn:{turn_id}" in reply["citations"]
    found = reverie(running, "recall", "bees on the roof")
    assert found.returncode == 0 and f"turn:{turn_id}" in found.stdout


def test_say_as_a_speaker(running: dict[str, str]) -> None:
    told = reverie(running, "say", "My violin lesson moved to Thursdays.",
                   "--speaker", "Maya", "--json")
    assert told.returncode == 0, told.stderr
    turn_ref = f"turn:{json.loads(told.stdout)['turn_id']}"
    found = reverie(running, "recall", "violin lesson", "--json")
    assert found.returncode == 0, found.stderr
    items = {i["ref"]: i for i in json.loads(found.stdout)["items"]}
    assert "] Maya: My violin lesson" in items[turn_ref]["text"]
    unnamed = reverie(running, "say", "hello", "--speaker", "x" * 201)
    assert unnamed.returncode == 2 and "speaker" in unnamed.stderr


def test_remember_disable_forget(running: dict[str, str]) -> None:
    made = reverie(running, "remember", "The spare bike lock code is 2718.")
    assert made.returncode == 0, made.stderr
    ref = made.stdout.split()[0]
    assert ref.startswith("fact:")
    assert ref in reverie(running, "recall", "bike lock code").stdout
    assert reverie(running, "disable", ref).returncode == 0
    assert ref not in reverie(running, "recall", "bike lock code").stdout
    assert reverie(running, "enable", ref).returncode == 0
    assert ref in reverie(running, "recall", "bike lock code").stdout
    assert reverie(running, "forget", ref).returncode == 0
    again = reverie(running, "forget", ref)
    assert again.returncode == 2 and "no fact" in again.stderr


def test_remember_forget_remember_recalls_the_new_fact(running: dict[str, str]) -> None:
    """A forgotten fact's id is never handed out again, so the next fact is indexed at once."""
    first = reverie(running, "remember", "The attic ladder is stored behind the boiler.")
    assert first.returncode == 0, first.stderr
    first_ref = first.stdout.split()[0]
    assert reverie(running, "forget", first_ref).returncode == 0
    second = reverie(running, "remember", "Grandma's violin needs new strings before Easter.")
    assert second.returncode == 0, second.stderr
    second_ref = second.stdout.split()[0]
    assert second_ref != first_ref
    found = reverie(running, "recall", "violin strings")
    assert found.returncode == 0 and second_ref in found.stdout, found.stdout


def test_forget_matching_asks_then_deletes_turns(running: dict[str, str]) -> None:
    told = reverie(running, "say", "The locker code at the gym is 4471.", "--json")
    assert told.returncode == 0, told.stderr
    turn_ref = f"turn:{json.loads(told.stdout)['turn_id']}"
    assert turn_ref in reverie(running, "recall", "gym locker code").stdout
    declined = reverie(running, "forget", "--matching", "locker code", stdin="n\n")
    assert declined.returncode == 0 and turn_ref in declined.stdout
    assert "nothing changed" in declined.stdout
    assert turn_ref in reverie(running, "recall", "gym locker code").stdout
    done = reverie(running, "forget", "--matching", "locker code", "--yes")
    assert done.returncode == 0, done.stderr
    assert turn_ref not in reverie(running, "recall", "gym locker code").stdout
    after = reverie(running, "forget", "--matching", "locker code", "--yes")
    assert after.returncode == 0 and "nothing matches" in after.stdout


def test_disable_and_enable_a_turn(running: dict[str, str]) -> None:
    told = reverie(running, "say", "Our canoe is moored at the north jetty.", "--json")
    assert told.returncode == 0, told.stderr
    turn_ref = f"turn:{json.loads(told.stdout)['turn_id']}"
    assert turn_ref in reverie(running, "recall", "canoe jetty").stdout
    assert reverie(running, "disable", turn_ref).returncode == 0
    assert turn_ref not in reverie(running, "recall", "canoe jetty").stdout
    assert reverie(running, "enable", turn_ref).returncode == 0
    assert turn_ref in reverie(running, "recall", "canoe jetty").stdout


@pytest.mark.parametrize(("args", "message"), [
    (["say", ""], "content"),
    (["say", "hello", "--channel", "nope"], "unknown channel"),
    (["forget", "note:3"], "note:3"),
    (["forget", "fact:999999"], "no fact 999999"),
    (["forget"], "--matching"),
])
def test_bad_input_is_a_clear_error(running: dict[str, str], args: list[str],
                                    message: str) -> None:
    result = reverie(running, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_chat_session(running: dict[str, str]) -> None:
    result = reverie(running, "chat", stdin="We planted three apple trees.\n\n/quit\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("reverie> ") == 1


def test_import_shows_progress_and_is_idempotent(running: dict[str, str],
                                                 tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text("\n".join(json.dumps(
        {"content": f"Imported memory number {i} about the garden shed.",
         "created_at": 1_600_000_000 + i}) for i in range(300)) + "\n")
    first = reverie(running, "import", str(history))
    assert first.returncode == 0, first.stderr
    assert "import [" in first.stderr and "300/300" in first.stderr
    assert "imported 300 turns" in first.stdout
    counts = json.loads(reverie(running, "status", "--json").stdout)["counts"]
    again = reverie(running, "import", str(history))
    assert again.returncode == 0
    assert json.loads(reverie(running, "status", "--json").stdout)["counts"] == counts
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "fine"}\n{not json\n')
    broken = reverie(running, "import", str(bad))
    assert broken.returncode == 2 and "bad.jsonl:2" in broken.stderr


def test_two_histories_with_the_same_name_both_import(running: dict[str, str],
                                                    tmp_path: Path) -> None:
    """The de-duplication key is what a line says, not the file's name and line number."""
    counts = json.loads(reverie(running, "status", "--json").stdout)["counts"]
    for folder, topic in (("a", "the plum tree"), ("b", "the rain barrel")):
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "history.jsonl"
        path.write_text("\n".join(json.dumps(
            {"content": f"Line {i} about {topic}.", "created_at": 1_650_000_000 + i,
             "role": "assistant" if i % 2 else "user"}) for i in range(10)) + "\n")
        result = reverie(running, "import", str(path))
        assert result.returncode == 0, result.stderr
    after = json.loads(reverie(running, "status", "--json").stdout)["counts"]
    assert after["transcript"] == counts["transcript"] + 20
    found = json.loads(reverie(running, "recall", "rain barrel", "--json").stdout)
    assert found["items"], "the second file's lines were not imported"


def test_imported_roles_keep_their_source(running: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "roles.jsonl"
    path.write_text(json.dumps({"role": "assistant", "content": "I set the oven timer."})
                    + "\n" + json.dumps({"source": "scheduled", "content": "Timer alarm."})
                    + "\n")
    assert reverie(running, "import", str(path), "--channel", "roles").returncode == 0
    import ray

    from actors.messages import RecentTurns

    recent = ray.get(ray.get_actor("transcript", namespace=NS).recent.remote(
        RecentTurns(channel="roles", limit=5)))
    assert [(t.role, t.source) for t in recent.turns] == [
        ("assistant", "assistant"), ("user", "scheduled")]


def test_reindex_reembeds_with_progress(running: dict[str, str]) -> None:
    before = reverie(running, "recall", "bees on the roof")
    result = reverie(running, "reindex", "--reembed")
    assert result.returncode == 0, result.stderr
    bars = [line for line in result.stderr.replace("\r", "\n").splitlines()
            if line.startswith("index  [")]
    assert bars
    done, total = bars[-1].split()[-1].split("/")
    assert done == total and int(total) > 0  # the bar ends full
    after = reverie(running, "recall", "bees on the roof")
    assert after.returncode == 0 and after.stdout == before.stdout


def test_a_dead_actor_is_one_line_and_its_own_exit_code(running: dict[str, str]) -> None:
    """Runs last: it kills the graph actor for good."""
    import ray

    ray.kill(ray.get_actor("graph", namespace=NS), no_restart=True)
    result = reverie(running, "remember", "The shed key hangs by the door.")
    assert result.returncode == 3, result.stderr
    assert "runtime error" in result.stderr and "graph" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
