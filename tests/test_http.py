"""The HTTP API against the real runtime (the actors on the test session's Ray):
the token, REST memories and turns, the OpenAI-compatible endpoint driven by the
official ``openai`` client, and bad input (401, 413, 422, streaming asked)."""

from __future__ import annotations

import http.client
import json
import stat
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import http_runtime
import openai
import pytest

from actors.handles import TranscriptClient
from actors.http.app import load_or_create_token, token_path
from actors.messages import RecentTurns
from tests.waiting import wait_for

NS = "test-http"
MAX_BODY = 4096


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Client:
    """A few plain HTTP calls (http.client: no client library's habits in the way)."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.netloc = urlsplit(base).netloc
        self.headers = headers

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def request(self, method: str, path: str, json_body: Any = None,
                content: bytes | Iterable[bytes] | None = None,
                headers: dict[str, str] | None = None,
                params: dict[str, Any] | None = None) -> Response:
        conn = http.client.HTTPConnection(self.netloc, timeout=120)
        all_headers = {**self.headers, **(headers or {})}
        body: Any = content
        if json_body is not None:
            body = json.dumps(json_body).encode()
            all_headers["Content-Type"] = "application/json"
        if params:
            path = f"{path}?{urlencode(params)}"
        try:
            chunked = body is not None and not isinstance(body, bytes)
            conn.request(method, path, body=body, headers=all_headers, encode_chunked=chunked)
            r = conn.getresponse()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()},
                            r.read().decode())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, json: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, json_body=json, **kw)

    def delete(self, path: str, **kw: Any) -> Response:
        return self.request("DELETE", path, **kw)


class Api(http_runtime.Api):
    def client(self, token: str | None = None) -> Client:
        headers = {} if token == "" else {"Authorization": f"Bearer {token or self.token}"}
        return Client(self.base, headers)


@pytest.fixture(scope="module")
def api(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with http_runtime.http_runtime(
            NS, tmp_path_factory.mktemp("http-data"), model_cache,
            http={"max_body_bytes": MAX_BODY, "models": {"assistant": "offline"}}) as started:
        yield Api(started.settings, started.base, started.token)


transcript = TranscriptClient(NS)


def recent(channel: str) -> list[Any]:
    transcript.flush()
    return transcript.recent(RecentTurns(channel=channel, limit=50)).turns


def test_listens_on_loopback_with_a_private_token_reused(api: Api) -> None:
    assert api.base.startswith("http://127.0.0.1:") and not api.base.endswith(":0")
    path = token_path(api.settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(api.token) >= 32
    assert load_or_create_token(api.settings) == api.token  # reused, not regenerated


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/openapi.json", None),
    ("GET", "/v1/status", None),
    ("GET", "/v1/recall?q=boiler", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/turns", {"text": "hello"}),
    ("POST", "/v1/memories/fact:1/disable", None),
    ("DELETE", "/v1/memories/fact:1", None),
    ("POST", "/v1/chat/completions",
     {"model": "reverie", "messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/no/such/page", None),
])
@pytest.mark.parametrize("token", ["", "wrong-token", "scheme"])
def test_without_the_token_401(api: Api, method: str, path: str, body: Any,
                               token: str) -> None:
    if token == "scheme":  # the right secret, not as a bearer token
        with Client(api.base, {"Authorization": f"Basic {api.token}"}) as c:
            r = c.request(method, path, json_body=body)
    else:
        with api.client(token) as c:
            r = c.request(method, path, json_body=body)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert api.token not in r.text


def recalled(c: Client, query: str) -> dict[str, str]:
    """What recall finds for ``query``: each item's text by its ref."""
    r = c.get("/v1/recall", params={"q": query, "limit": 50})
    assert r.status_code == 200, r.text
    return {item["ref"]: item["text"] for item in r.json()["items"]}


def test_a_stored_secret_does_not_leak_to_a_caller_without_the_token(api: Api) -> None:
    number = str(uuid.uuid4().int % 9_000 + 1_000)
    secret = f"The spare key is under flower pot number {number}."
    question = "Where is the spare key?"
    with api.client() as c:
        stored = c.post("/v1/memories", json={"text": secret})
        assert stored.status_code == 201, stored.text
        ref = stored.json()["ref"]
        # stored and found: the checks below would see it if it leaked
        assert wait_for(lambda: ref in recalled(c, question), 60), recalled(c, question)
        assert number in recalled(c, question)[ref]
    with api.client("wrong-token") as c:
        answers = [
            c.get("/v1/recall", params={"q": question}),
            c.post("/v1/turns", json={"text": question}),
            c.post("/v1/chat/completions", json={
                "model": "reverie", "messages": [{"role": "user", "content": question}]}),
        ]
    for r in answers:
        assert r.status_code == 401, r.text
        assert number not in r.text and "flower pot" not in r.text


def test_a_refused_request_touches_nothing(api: Api) -> None:
    number = str(uuid.uuid4().int % 9_000 + 1_000)
    refused = f"The shed key hangs on hook number {number}."
    question = "Where is the shed key?"
    before = len(recent("chat"))
    with api.client("wrong-token") as c:
        assert c.post("/v1/memories", json={"text": refused}).status_code == 401
        assert c.post("/v1/turns", json={"text": refused}).status_code == 401
    # a memory like it, stored afterwards with the token: once recall finds that one,
    # it would find the refused one too, had it been stored
    with api.client() as c:
        control = c.post("/v1/memories", json={"text": "The shed key hangs on hook number 0."})
        assert control.status_code == 201, control.text
        ref = control.json()["ref"]
        assert wait_for(lambda: ref in recalled(c, question), 60), recalled(c, question)
        assert all(f"hook number {number}" not in text
                   for text in recalled(c, question).values())
    assert len(recent("chat")) == before


def test_memory_remember_recall_disable_enable_delete(api: Api) -> None:
    text = "The boiler service is due in March, call Rui the plumber."
    with api.client() as c:
        wrote = c.post("/v1/memories", json={"text": text})
        assert wrote.status_code == 201, wrote.text
        ref = wrote.json()["ref"]
        assert ref.startswith("fact:")

        def found() -> list[str]:
            r = c.get("/v1/recall", params={"q": "when is the boiler service due", "limit": 5})
            assert r.status_code == 200, r.text
            return [item["ref"] for item in r.json()["items"]]

        assert ref in found()
        off = c.post(f"/v1/memories/{ref}/disable")
        assert off.status_code == 200 and off.json()["change"] == "disable", off.text
        assert ref not in found()
        on = c.post(f"/v1/memories/{ref}/enable")
        assert on.status_code == 200 and on.json()["change"] == "enable", on.text
        assert ref in found()
        gone = c.delete(f"/v1/memories/{ref}")
        assert gone.status_code == 200 and gone.json()["change"] == "delete", gone.text
        assert ref not in found()
        again = c.delete(f"/v1/memories/{ref}")  # nothing left to delete: a clean 400
        assert again.status_code == 400, again.text
        assert c.post("/v1/memories/not-a-ref/disable").status_code == 400


def test_turn_answers_and_is_in_the_transcript(api: Api) -> None:
    text = f"My sister Ana moved to Porto ({uuid.uuid4().hex[:6]})."
    with api.client() as c:
        r = c.post("/v1/turns", json={"text": text, "channel": "voice", "speaker": "alice"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["provider"] == "offline" and body["text"]
    assert isinstance(body["citations"], list)
    rows = {row.id: row for row in recent("voice")}
    assert rows[body["turn_id"]].content == text
    assert rows[body["turn_id"]].speaker == "alice"
    assert rows[body["reply_id"]].content == body["text"]


def test_openai_client_chat_completion(api: Api) -> None:
    told = f"Our dog Biscuit is afraid of thunder ({uuid.uuid4().hex[:6]})."
    with api.client() as c:
        assert c.post("/v1/turns", json={"text": told}).status_code == 200
    client = openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="assistant", user="bob",
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is Biscuit afraid of?"}],
        extra_headers={"X-Reverie-Channel": "voice"})
    completion = raw.parse()
    assert completion.model == "assistant"  # the alias is echoed
    content = completion.choices[0].message.content
    assert content and "thunder" in content
    extension = raw.http_response.json()["reverie"]
    assert extension["provider"] == "offline"
    assert any(ref.startswith("turn:") for ref in extension["citations"])
    rows = {row.id: row for row in recent("voice")}
    asked = rows[extension["turn_id"]]
    assert asked.content == "What is Biscuit afraid of?" and asked.speaker == "bob"
    assert rows[extension["reply_id"]].content == content

    # the header wins over `user`; the default channel is chat
    header = client.chat.completions.with_raw_response.create(
        model="reverie", user="bob", messages=[{"role": "user", "content": "Hello there."}],
        extra_headers={"X-Reverie-Speaker": "carol"})
    turn_id = header.http_response.json()["reverie"]["turn_id"]
    row = {r.id: r for r in recent("chat")}[turn_id]
    assert row.speaker == "carol"


def test_streamed_through_the_offline_provider_is_stored(api: Api) -> None:
    client = openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)
    with api.client() as c:
        assert c.post("/v1/memories", json={"text": "The gate code is 4711."}).status_code == 201
    chunks = list(client.chat.completions.create(
        model="assistant", stream=True,
        messages=[{"role": "user", "content": "What is the gate code?"}]))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "4711" in text  # the offline provider answers from the recalled fact
    last = chunks[-1].model_extra or {}
    assert chunks[-1].choices[0].finish_reason == "stop"
    extension = last["reverie"]
    assert extension["provider"] == "offline" and extension["citations"]
    rows = {row.id: row for row in recent("chat")}
    assert rows[extension["turn_id"]].content == "What is the gate code?"
    assert rows[extension["reply_id"]].content == text


def test_unknown_model_and_wrong_token_through_the_client(api: Api) -> None:
    client = openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="gpt-nope", messages=[{"role": "user", "content": "Hi"}])
    wrong = openai.OpenAI(base_url=f"{api.base}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(
            model="reverie", messages=[{"role": "user", "content": "Hi"}])


def test_models_lists_aliases_and_reverie(api: Api) -> None:
    client = openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)
    names = {m.id for m in client.models.list()}
    assert {"assistant", "reverie"} <= names


def test_oversized_body_413(api: Api) -> None:
    big = {"text": "x" * (MAX_BODY + 10)}
    before = len(recent("chat"))
    with api.client() as c:
        declared = c.post("/v1/turns", json=big)
        assert declared.status_code == 413, declared.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: the bytes are counted
            yield b'{"text": "'
            for _ in range(MAX_BODY // 512 + 2):
                yield b"y" * 512
            yield b'"}'

        streamed = c.post("/v1/turns", content=chunks(),
                          headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413, streamed.text
        small = c.post("/v1/turns", json={"text": "A small one."})
        assert small.status_code == 200, small.text
    assert len(recent("chat")) == before + 2


def test_malformed_bodies_422_name_the_field(api: Api) -> None:
    with api.client() as c:
        r = c.post("/v1/turns", json={"txt": "hello"})
        assert r.status_code == 422
        assert any(e["loc"][-1] == "text" for e in r.json()["detail"]), r.text
        r = c.post("/v1/chat/completions", json={"model": "reverie"})
        assert r.status_code == 422
        assert any(e["loc"][-1] == "messages" for e in r.json()["detail"]), r.text
        r = c.post("/v1/memories", content=b"{not json", headers={
            "Content-Type": "application/json"})
        assert r.status_code == 422
        r = c.get("/v1/recall", params={"q": "x", "limit": "many"})
        assert r.status_code == 422
        assert any(e["loc"][-1] == "limit" for e in r.json()["detail"]), r.text


def test_status_and_openapi(api: Api) -> None:
    with api.client() as c:
        status = c.get("/v1/status")
        spec = c.get("/openapi.json")
    assert status.status_code == 200, status.text
    assert status.json()["actors"]["http"] == "ok"
    assert status.json()["namespace"] == NS
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    assert {"/v1/turns", "/v1/recall", "/v1/memories", "/v1/memories/{ref}",
            "/v1/chat/completions", "/v1/models", "/v1/status"} <= set(paths)


def test_refused_turns_are_400_not_5xx(api: Api) -> None:
    with api.client() as c:
        unknown = c.post("/v1/chat/completions", headers={"X-Reverie-Channel": "no-such"},
                         json={"model": "reverie",
                               "messages": [{"role": "user", "content": "Hi"}]})
        assert unknown.status_code == 400, unknown.text
        no_user = c.post("/v1/chat/completions", json={
            "model": "reverie", "messages": [{"role": "system", "content": "Be brief."}]})
        assert no_user.status_code == 400, no_user.text
        assert "user message" in no_user.json()["error"]["message"]


def test_the_listening_socket_is_tcp_so_answers_are_not_delayed() -> None:
    """asyncio turns Nagle off (TCP_NODELAY) on accepted connections only for a
    socket made with IPPROTO_TCP; with protocol 0 every answer sent in two writes
    waited ≈ 40 ms for the client's delayed ACK (measured: tools/bench/http.py)."""
    import socket

    from actors.http.server import _bind

    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_the_idle_server_wakes_once_a_second_and_keeps_its_date_current(api: Api) -> None:
    """uvicorn's own loop wakes ten times a second whether or not anything
    happens (the costliest idle actor); ours wakes once a second, and the Date
    header it refreshes on each wake stays current."""
    import time
    from email.utils import parsedate_to_datetime

    import ray

    from actors.common import HTTP
    from actors.http.server import TICK_S

    server = ray.get_actor(HTTP, namespace=NS)
    # Not a timing threshold: the wakes are counted against the time that really
    # passed between the two readings (longer on a loaded machine), and a loop
    # that is ours may wake at most once per TICK_S in it (one more for the edges).
    start, before = time.monotonic(), ray.get(server.ticks.remote())
    time.sleep(3 * TICK_S)
    assert wait_for(lambda: ray.get(server.ticks.remote()) >= before + 2, 60), \
        "the server's loop does not wake: it is not ours"
    woke = ray.get(server.ticks.remote()) - before
    elapsed = time.monotonic() - start
    assert woke <= elapsed / TICK_S + 1, (woke, elapsed)  # uvicorn's loop: ten a second
    asked = time.time()
    with api.client() as c:
        answer = c.get("/v1/status")
    answered = time.time()
    stamp = parsedate_to_datetime(answer.headers["date"]).timestamp()
    # the header is refreshed on each wake: at most a wake (and the second it is
    # rounded to) older than the request, never newer than the answer
    assert asked - 2 * TICK_S - 1 <= stamp <= answered + 1, (stamp, asked, answered)
