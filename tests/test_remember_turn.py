"""Explicit remembering on a running runtime (``reverie run``, joined to the
test session's Ray, a local server speaking the OpenAI API as its model):

- "remember: ..." in a turn is stored at once as a user-managed fact (no
  quality gating), the model is told in the prompt so it acknowledges it, the
  offline provider acknowledges it itself, and the facts job does not store
  it a second time;
- ``reverie remember "..." --level vivid|seared`` and ``POST /v1/memories``
  with a ``level``."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode

from actors.handles import TurnsClient
from actors.messages import UserTurn
from runtime.config import CONFIG_DIR
from runtime.llm.providers import OfflineProvider
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.reverie_process import joined_runtime, runtime_env
from tests.reverie_process import reverie as run_reverie

NS = "test-remember-turn"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def running(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    config = ('[[llm.providers]]\nname = "local"\n'
              f'base_url = "{server.base_url}"\nmodel = "tiny"\ntimeout_s = 5\n')
    env = runtime_env(tmp_path_factory.mktemp("remember-data"), NS, model_cache, config,
                      REVERIE_HTTP__PORT="0")
    with joined_runtime(env, ray_instance):
        yield env


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_reverie(env, *args, timeout=300, cwd=ROOT)  # in-process when joined here


def store_of(env: dict[str, str]) -> Store:
    return Store(Path(env["REVERIE_DATA_DIR"]) / "reverie.db",
                 FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def facts_citing(env: dict[str, str], turn_id: int) -> list[dict[str, Any]]:
    store = store_of(env)
    try:
        return store.rows(
            "SELECT f.* FROM facts f, json_each(f.provenance) j WHERE j.value = ?"
            " ORDER BY f.id", (f"turn:{turn_id}",))
    finally:
        store.close()


def fact_row(env: dict[str, str], ref: str) -> dict[str, Any]:
    store = store_of(env)
    try:
        row = store.get("facts", int(ref.split(":")[1]))
    finally:
        store.close()
    assert row is not None
    return row


def say(text: str, temporary: bool = False) -> Any:
    return TurnsClient(NS, timeout_s=120).process(
        UserTurn(channel="chat", text=text, temporary=temporary))


# -- "remember: ..." in a turn ------------------------------------------------------


def test_a_remember_turn_is_stored_at_once_and_the_model_is_told(
        running: dict[str, str], server: FakeOpenAI) -> None:
    reply = say("remember: the bike lock code is kept in the green notebook")
    facts = facts_citing(running, reply.turn_id)
    assert len(facts) == 1  # before any job ran
    stored = facts[0]
    assert stored["user_managed"] == 1 and stored["confidence"] == 1.0
    assert stored["value"] == "the bike lock code is kept in the green notebook"
    system = server.last.body["messages"][0]
    assert system["role"] == "system" and "## Stored just now" in system["content"]
    assert "the bike lock code is kept in the green notebook" in system["content"]
    assert "Acknowledge" in system["content"]


def test_a_turn_that_asks_nothing_stores_nothing_and_tells_nothing(
        running: dict[str, str], server: FakeOpenAI) -> None:
    reply = say("Do you remember that? The green notebook, I mean.")
    assert facts_citing(running, reply.turn_id) == []
    assert "Stored just now" not in server.last.body["messages"][0]["content"]


def test_a_temporary_turn_remembers_nothing(running: dict[str, str]) -> None:
    before = len(store_of(running).rows("SELECT id FROM facts"))
    say("remember: the boat key is in the red box", temporary=True)
    assert len(store_of(running).rows("SELECT id FROM facts")) == before


def test_the_offline_provider_acknowledges_what_was_stored(
        running: dict[str, str], server: FakeOpenAI) -> None:
    server.mode = Mode.HTTP_500  # the model fails: the offline provider answers
    try:
        reply = say("remember: the ferry leaves at seven on Saturdays")
    finally:
        server.mode = Mode.OK
    assert reply.provider == "offline"
    assert reply.text == (OfflineProvider.REMEMBERED_PREFIX
                          + "the ferry leaves at seven on Saturdays.")
    assert len(facts_citing(running, reply.turn_id)) == 1


def test_the_facts_job_does_not_store_it_a_second_time(running: dict[str, str]) -> None:
    reply = say("remember: the wifi router is behind the bookshelf")
    before = facts_citing(running, reply.turn_id)
    assert len(before) == 1
    ran = reverie(running, "jobs", "run", "facts", "--wait")
    assert ran.returncode == 0, ran.stderr
    after = facts_citing(running, reply.turn_id)
    assert after == before  # no new row, not even a second claim on it


# -- reverie remember --level and POST /v1/memories {"level"} -------------------------


def test_reverie_remember_at_a_level(running: dict[str, str]) -> None:
    made = reverie(running, "remember", "Our wedding was in the olive grove at Sintra.",
                   "--level", "seared")
    assert made.returncode == 0, made.stderr
    ref = made.stdout.split()[0]
    row = fact_row(running, ref)
    assert row["memory_level"] == "seared" and row["user_managed"] == 1
    vivid = reverie(running, "remember", "The plumber Joaquim fixed the boiler for free.",
                    "--level", "vivid")
    assert vivid.returncode == 0, vivid.stderr
    assert fact_row(running, vivid.stdout.split()[0])["memory_level"] == "vivid"
    plain = reverie(running, "remember", "The recycling goes out on Thursdays.")
    assert fact_row(running, plain.stdout.split()[0])["memory_level"] == "normal"
    bad = reverie(running, "remember", "Something faint.", "--level", "faint")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def _post(env: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
    data = Path(env["REVERIE_DATA_DIR"])
    base = json.loads((data / "runtime.json").read_text())["http"]
    token = (data / "http-token").read_text().strip()
    request = urllib.request.Request(
        f"{base}/v1/memories", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_remember_at_a_level(running: dict[str, str]) -> None:
    status, made = _post(running, {"text": "Grandpa planted the fig tree in 1962.",
                                   "level": "vivid"})
    assert status == 201, made
    assert fact_row(running, made["ref"])["memory_level"] == "vivid"
    status, plain = _post(running, {"text": "The gate code changed to the new one in June."})
    assert status == 201 and fact_row(running, plain["ref"])["memory_level"] == "normal"
    status, refused = _post(running, {"text": "Something faint.", "level": "faint"})
    assert status == 422, refused
