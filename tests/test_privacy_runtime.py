"""Privacy through the running runtime (``reverie run`` on the test session's Ray,
a local server speaking the OpenAI API as the model): a sensitive fact is never
sent upstream for an unknown voice speaker, nor for another of the household's
people, and is for its owner; ``reverie remember --sensitive --person``,
``reverie sensitive REF [--off]``, ``reverie recall --person`` and the HTTP
actions ``/sensitive`` and ``/not-sensitive``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode

from actors.handles import HttpClient, TranscriptClient, TurnsClient
from actors.messages import UserTurn
from tests.reverie_process import joined_runtime, reverie, runtime_env

NS = "test-privacy"
ROOT = Path(__file__).resolve().parent.parent
CODE = "4471"
QUESTION = "What is the garage code?"


@pytest.fixture(scope="module")
def running(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[dict[str, str]]:
    config = ('[household]\npeople = ["Ana", "Bob"]\n\n[http]\nport = 0\n\n'
              f'[[llm.providers]]\nname = "local"\nbase_url = "{server.base_url}"\n'
              'model = "tiny"\ntimeout_s = 30\n')
    env = runtime_env(tmp_path_factory.mktemp("privacy-data"), NS, model_cache, config)
    with joined_runtime(env, ray_instance):
        yield env


def cli(env: dict[str, str], *args: str) -> str:
    done = reverie(env, *args, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def remembered(env: dict[str, str], *args: str) -> str:
    """``reverie remember ARGS``: the new fact's ref."""
    return cli(env, "remember", *args).split()[0]


def upstream(server: FakeOpenAI, text: str, speaker: str | None,
             channel: str = "voice") -> str:
    """Say ``text`` as ``speaker``; everything the model was sent, as JSON text."""
    server.mode = Mode.OK
    before = len(server.requests)
    reply = TurnsClient(NS, timeout_s=120).process(
        UserTurn(channel=channel, text=text, speaker=speaker))
    TranscriptClient(NS).flush()
    assert reply.provider == "local"
    [request] = server.requests[before:]
    return json.dumps(request.body)


@pytest.fixture(scope="module")
def facts(running: dict[str, str]) -> dict[str, str]:
    return {
        "code": remembered(running, "The garage code is 4471.", "--sensitive",
                           "--person", "Ana"),
        "bins": remembered(running, "The bins go out on Tuesday night."),
    }


@pytest.mark.parametrize("speaker", [None, "Dave"])
def test_a_sensitive_fact_is_not_spoken_to_an_unknown_voice_speaker(
        facts: dict[str, str], server: FakeOpenAI, speaker: str | None) -> None:
    sent = upstream(server, QUESTION, speaker)
    assert CODE not in sent
    assert "bins go out on Tuesday" in upstream(server, "When do the bins go out?", speaker)


def test_a_sensitive_fact_personalises_answers_for_its_owner_only(
        facts: dict[str, str], server: FakeOpenAI) -> None:
    server.replies.append("The garage code is 4471.")  # the model says it aloud to Ana
    assert CODE in upstream(server, QUESTION, "Ana")
    assert CODE in upstream(server, QUESTION, "ana", channel="chat")
    # another of the household's people: neither the fact nor Ana's answer, which
    # was given the code and so is sensitive too (in the channel's history)
    assert CODE not in upstream(server, QUESTION, "Bob")
    assert CODE not in upstream(server, "Can you repeat that?", None)  # nor a stranger
    assert CODE in upstream(server, "Can you repeat that?", "Ana")  # her own answer


def test_the_user_marks_and_unmarks_any_memory(facts: dict[str, str], running: dict[str, str],
                                               server: FakeOpenAI) -> None:
    alarm = remembered(running, "The alarm code for the shed is 8812.")
    assert "8812" in upstream(server, "What is the alarm code for the shed?", None)
    assert cli(running, "sensitive", alarm).strip() == f"fact {alarm[5:]} marked sensitive"
    assert "8812" not in upstream(server, "What is the alarm code for the shed?", None)
    assert "8812" in upstream(server, "What is the alarm code for the shed?", "Bob")
    assert cli(running, "sensitive", alarm, "--off").strip() == (
        f"fact {alarm[5:]} marked not sensitive")
    assert "8812" in upstream(server, "What is the alarm code for the shed?", None)
    bad = reverie(running, "sensitive", "fact:abc", cwd=ROOT)
    assert bad.returncode == 2 and "bad reference" in bad.stderr


def test_recall_scoped_to_a_person(facts: dict[str, str], running: dict[str, str]) -> None:
    bob = remembered(running, "Bob's garage code for the bike shed is 5530.",
                     "--person", "Bob")

    def refs(*extra: str) -> set[str]:
        out = json.loads(cli(running, "recall", "garage code", "--json", *extra))
        return {i["ref"] for i in out["items"]}

    assert {facts["code"], bob} <= refs()
    assert facts["code"] in refs("--person", "Ana") and bob not in refs("--person", "Ana")
    assert bob in refs("--person", "bob") and facts["code"] not in refs("--person", "bob")


def http(running: dict[str, str], method: str, path: str) -> tuple[int, Any]:
    token = (Path(running["REVERIE_DATA_DIR"]) / "http-token").read_text().strip()
    request = urllib.request.Request(HttpClient(NS).address() + path, method=method,
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_marks_and_shows_the_mark(facts: dict[str, str], running: dict[str, str]) -> None:
    ref = facts["bins"]
    assert http(running, "GET", f"/v1/memories/{ref}")[1]["sensitive"] is False
    status, body = http(running, "POST", f"/v1/memories/{ref}/sensitive")
    assert status == 200 and body["change"] == "sensitive", body
    assert http(running, "GET", f"/v1/memories/{ref}")[1]["sensitive"] is True
    status, body = http(running, "POST", f"/v1/memories/{ref}/not-sensitive")
    assert status == 200 and body["change"] == "not_sensitive", body
    shown = http(running, "GET", f"/v1/memories/{ref}")[1]
    assert shown["sensitive"] is False and shown["person"] is None
    code = http(running, "GET", f"/v1/memories/{facts['code']}")[1]
    assert (code["sensitive"], code["person"]) == (True, "Ana")
    assert http(running, "POST", "/v1/memories/fact:999999/sensitive")[0] == 404
