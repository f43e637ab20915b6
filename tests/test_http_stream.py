"""Streamed replies end to end: a local server speaking OpenAI's streaming API
upstream, the Turns actor's streaming generator, and the OpenAI-compatible
endpoint driven by the official ``openai`` client.

That a piece really flows before the upstream has finished is shown without
timing: the upstream sends its first word and then waits (``hold_stream``);
the client must already hold that word, and the reply must not be stored yet."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from fake_openai import FakeOpenAI, Mode
from http_runtime import http_runtime

from actors.handles import TranscriptClient, TurnsClient
from actors.messages import RecentTurns, TurnDelta, TurnReply, UserTurn
from runtime.config import Settings

NS = "test-http-stream"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def runtime(ray_instance: str, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[tuple[Settings, str, str]]:
    with http_runtime(NS, tmp_path_factory.mktemp("stream-data"), model_cache,
                      llm={"providers": [{"name": "local", "base_url": upstream.base_url,
                                          "model": "tiny", "timeout_s": 30}]},
                      http={"models": {"quick": "offline"}}) as started:
        yield started.settings, started.base, started.token


@pytest.fixture
def client(runtime: tuple[Settings, str, str]) -> openai.OpenAI:
    _, base, token = runtime
    return openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)


@pytest.fixture(autouse=True)
def _ok(upstream: FakeOpenAI) -> None:
    upstream.mode = Mode.OK


def stored(channel: str = "chat") -> dict[int, Any]:
    transcript = TranscriptClient(NS)
    transcript.flush()
    return {t.id: t for t in transcript.recent(RecentTurns(channel=channel, limit=100)).turns}


def test_the_actor_streams_pieces_then_the_stored_reply(runtime: tuple[Settings, str, str]
                                                        ) -> None:
    items = list(TurnsClient(NS).process_stream(
        UserTurn(channel="chat", text="Tell me three little words")))
    *pieces, last = items
    assert all(isinstance(p, TurnDelta) for p in pieces) and len(pieces) > 3
    assert isinstance(last, TurnReply) and last.provider == "local"
    text = "".join(p.text for p in pieces if isinstance(p, TurnDelta))
    assert text == "echo: Tell me three little words" == last.text
    assert last.reply_id is not None and stored()[last.reply_id].content == text


def test_openai_client_streams_and_the_reply_is_stored(client: openai.OpenAI,
                                                       upstream: FakeOpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="reverie", stream=True,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "Where are the candles?"}]))
    content = [c.choices[0].delta.content for c in chunks if c.choices and
               c.choices[0].delta.content]
    assert len(content) > 2  # word by word, not one lump
    text = "".join(content)
    assert text == "echo: Where are the candles?"
    assert upstream.last.body["stream"] is True
    extension = (chunks[-1].model_extra or {})["reverie"]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert extension["provider"] == "local"
    rows = stored()
    assert rows[extension["turn_id"]].content == "Where are the candles?"
    assert rows[extension["reply_id"]].content == text


def test_the_first_piece_arrives_while_the_upstream_is_still_writing(
        runtime: tuple[Settings, str, str], upstream: FakeOpenAI) -> None:
    _, base, token = runtime
    marker = f"slowpoke-{uuid.uuid4().hex[:8]}"
    upstream.hold_stream(marker)
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "model": "reverie", "stream": True,
            "messages": [{"role": "user", "content": f"say {marker} slowly"}]}),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")

        def next_content() -> str:
            while True:
                line = resp.readline()
                assert line, "the stream ended"
                if line.startswith(b"data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    if delta.get("content"):
                        return str(delta["content"])

        assert next_content() == "echo: "       # the upstream's first word ...
        assert upstream.wait_held(marker)       # ... while it still holds the rest
        replies = [t for t in stored().values() if t.role == "assistant" and marker in t.content]
        assert replies == []                    # not stored before it is complete
        upstream.release(marker)
        rest = resp.read().decode()
        assert "data: [DONE]" in rest
    finally:
        conn.close()
    replies = [t for t in stored().values() if t.role == "assistant" and marker in t.content]
    assert [r.content for r in replies] == [f"echo: say {marker} slowly"]


def test_upstream_down_before_the_first_word_falls_back_offline(client: openai.OpenAI,
                                                                upstream: FakeOpenAI) -> None:
    upstream.mode = Mode.HTTP_500
    chunks = list(client.chat.completions.create(
        model="reverie", stream=True, messages=[{"role": "user", "content": "Anyone home?"}]))
    extension = (chunks[-1].model_extra or {})["reverie"]
    assert extension["provider"] == "offline"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and stored()[extension["reply_id"]].content == text


def test_a_stream_that_breaks_keeps_the_words_that_came(runtime: tuple[Settings, str, str],
                                                        upstream: FakeOpenAI) -> None:
    marker = f"breaks-{uuid.uuid4().hex[:8]}"
    upstream.hold_stream(marker, drop=True)
    stream = TurnsClient(NS).process_stream(UserTurn(channel="chat", text=f"{marker} now"))
    first = next(stream)
    assert isinstance(first, TurnDelta) and first.text == "echo: "
    upstream.release(marker)        # the connection then drops mid-reply
    *_, last = stream
    assert isinstance(last, TurnReply) and last.provider == "local"
    assert last.text.startswith("echo:") and last.reply_id is not None
    assert stored()[last.reply_id].content == last.text


def test_model_alias_picks_the_provider(client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    asked = len(upstream.requests)
    reply = client.chat.completions.with_raw_response.create(
        model="quick", messages=[{"role": "user", "content": "Quick one?"}])
    assert reply.http_response.json()["reverie"]["provider"] == "offline"
    assert len(upstream.requests) == asked  # the alias names the offline provider
    tiny = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "Slow one?"}])
    assert tiny.http_response.json()["reverie"]["provider"] == "local"
    assert len(upstream.requests) == asked + 1


def test_a_bad_stream_request_is_a_plain_error(runtime: tuple[Settings, str, str],
                                               client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="reverie", stream=True, messages=[{"role": "user", "content": "Hi"}],
            extra_headers={"X-Reverie-Channel": "no-such-room"})
    assert "unknown channel" in str(err.value)


# -- the Ollama-compatible endpoints, driven by the `ollama` client --------------------


@pytest.fixture
def ollama_client(runtime: tuple[Settings, str, str]) -> Any:
    import ollama

    _, base, token = runtime
    return ollama.Client(host=base, headers={"Authorization": f"Bearer {token}"})


def test_ollama_tags_and_version(runtime: tuple[Settings, str, str], ollama_client: Any) -> None:
    names = {m.model for m in ollama_client.list().models}
    assert {"tiny:latest", "local:latest", "quick:latest", "reverie:latest"} <= names
    _, base, token = runtime
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=30)
    try:
        conn.request("GET", "/api/version", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["version"]
    finally:
        conn.close()


def test_ollama_chat_not_streamed_and_streamed(ollama_client: Any,
                                               upstream: FakeOpenAI) -> None:
    whole = ollama_client.chat(model="tiny:latest", stream=False, messages=[
        {"role": "system", "content": "You control the lights."},
        {"role": "user", "content": "Is the porch light on?"}])
    assert whole.message.content == "echo: Is the porch light on?" and whole.done
    assert [t.content for t in stored().values() if "porch" in t.content] == [
        "Is the porch light on?", "echo: Is the porch light on?"]

    parts = list(ollama_client.chat(model="reverie", stream=True, messages=[
        {"role": "user", "content": "And the garage door?"}]))
    pieces = [p.message.content for p in parts if not p.done]
    assert len(pieces) > 2 and "".join(pieces) == "echo: And the garage door?"
    assert parts[-1].done and parts[-1].done_reason == "stop"
    assert [t.content for t in stored().values() if "garage" in t.content] == [
        "And the garage door?", "echo: And the garage door?"]
    assert upstream.last.body["stream"] is True


def test_ollama_answer_carries_the_extension(runtime: tuple[Settings, str, str]) -> None:
    _, base, token = runtime
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=60)
    try:
        conn.request("POST", "/api/chat", body=json.dumps({
            "model": "quick", "messages": [{"role": "user", "content": "Any news?"}]}),
            headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("application/x-ndjson")
        lines = [json.loads(line) for line in resp.read().splitlines() if line]
    finally:
        conn.close()
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])
    extension = lines[-1]["reverie"]
    assert extension["provider"] == "offline"  # the alias, streamed by default
    assert stored()[extension["reply_id"]].content == "".join(
        x["message"]["content"] for x in lines)


def test_ollama_unknown_model_and_no_token(runtime: tuple[Settings, str, str],
                                           ollama_client: Any) -> None:
    import ollama

    with pytest.raises(ollama.ResponseError) as missing:
        ollama_client.chat(model="llama9", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404
    _, base, _ = runtime
    with pytest.raises(ollama.ResponseError) as denied:
        ollama.Client(host=base).chat(model="reverie", stream=False,
                                      messages=[{"role": "user", "content": "hi"}])
    assert denied.value.status_code == 401


@pytest.mark.parametrize("body,field", [
    (b'{"model": "reverie"}', "messages"),
    (b'{"model": "reverie", "messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b"not json at all {", None),
])
def test_ollama_malformed_bodies_are_422_naming_the_field(
        runtime: tuple[Settings, str, str], body: bytes, field: str | None) -> None:
    _, base, token = runtime
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=30)
    try:
        conn.request("POST", "/api/chat", body=body,
                     headers={"Authorization": f"Bearer {token}",
                              "Content-Type": "application/json"})
        resp = conn.getresponse()
        detail = json.loads(resp.read())["detail"]
    finally:
        conn.close()
    assert resp.status == 422
    assert detail[0]["loc"][0] == "body"
    if field:
        assert field in [str(part) for part in detail[0]["loc"]]


def _scrape() -> str:
    import ray

    node: Any = ray._private.worker.global_worker.node
    port = node.metrics_export_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _sample(text: str, name: str, **tags: str) -> float:
    """The summed value of the samples of ``name`` carrying ``tags``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels = line[len(name) + 1:line.index("}")]
        if all(f'{k}="{v}"' in labels for k, v in tags.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_turns_recall_and_http_requests_reach_the_metrics(
        runtime: tuple[Settings, str, str], client: openai.OpenAI) -> None:
    from tests.waiting import wait_for

    client.chat.completions.create(
        model="reverie", messages=[{"role": "user", "content": "Count me in the metrics."}],
        extra_headers={"X-Reverie-Channel": "voice"})
    list(client.chat.completions.create(
        model="reverie", stream=True, extra_headers={"X-Reverie-Channel": "voice"},
        messages=[{"role": "user", "content": "And me, streamed."}]))

    def exported() -> bool:
        text = _scrape()
        return (_sample(text, "ray_reverie_turns_total", channel="voice", streamed="false") >= 1
                and _sample(text, "ray_reverie_turns_total", channel="voice",
                            streamed="true") >= 1
                and _sample(text, "ray_reverie_recall_latency_ms_count") >= 2
                and _sample(text, "ray_reverie_http_requests_total",
                            route="/v1/chat/completions", status="200") >= 2)

    assert wait_for(exported, timeout=60), "metrics not exported"
