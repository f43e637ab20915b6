"""A small, real OpenAI-compatible HTTP server for tests.

``FakeOpenAI`` runs a :class:`http.server.ThreadingHTTPServer` on 127.0.0.1
(port chosen by the OS) in a background thread. ``POST /v1/chat/completions``
answers ``"echo: <last user message>"`` and every request is recorded (path,
headers, JSON body). Set :attr:`FakeOpenAI.mode` to make it fail (see
:class:`Mode`).

To test what happens while a model is slow, without sleeping: :meth:`FakeOpenAI.hold`
a marker, and every completion request whose last user message contains it
waits (after being recorded) until :meth:`FakeOpenAI.release`;
:meth:`FakeOpenAI.wait_held` blocks until such a request has arrived::

    server.hold("slow room")
    ...  # send a turn saying "slow room ..."
    assert server.wait_held("slow room")
    ...  # the request is in the server, unanswered
    server.release("slow room")

Use it from any test module (``tests/`` is on ``sys.path`` under pytest)::

    from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401

    def test_something(fake_openai: FakeOpenAI) -> None:
        fake_openai.mode = Mode.HTTP_500
        ...

or as a context manager: ``with FakeOpenAI() as server: server.base_url``.

To script what the model says, append to :attr:`FakeOpenAI.replies`: in
``Mode.OK`` each request takes the next one (oldest first) as its content, and
answers the echo once they are used up.

OpenAI tool calling: append a round of calls to :attr:`FakeOpenAI.tool_calls`
(a list of ``(name, arguments JSON text)``): a request that offers ``tools``
(and does not say ``"tool_choice": "none"``) takes the next round, oldest
first, and is answered with those ``tool_calls`` (``content`` null,
``finish_reason`` ``"tool_calls"``); streamed, as OpenAI streams them (each
call's id and name in one ``delta.tool_calls`` chunk, its arguments in two
more). A request whose last message is a ``tool`` message, with no scripted
reply left, is answered ``"tool said: "`` followed by the contents of the tool
messages since the last assistant message (so a test sees the model use what
its tool returned).

Tools asked for in words: with :attr:`FakeOpenAI.auto_tools` on, a request
whose last message is the user's and that offers a tool whose name, in words,
the message says (``HassTurnOn``: "turn on", ``HassLightSet``: "light set";
a leading ``Hass`` is not said) is answered with one call of it, its
``arguments`` ``{"name": <the words after it, a leading "the" left out>}``:
"turn on the kitchen light" calls ``HassTurnOn`` with ``{"name": "kitchen
light"}``. Scripted rounds (:attr:`FakeOpenAI.tool_calls`) go first.

A request with ``"stream": true`` is answered as OpenAI streams: server-sent
events, one ``chat.completion.chunk`` per word of the content, then ``data:
[DONE]``. To see that a stream really flows, :meth:`FakeOpenAI.hold_stream` a
marker: a streamed answer to a message containing it sends its first chunk and
then waits until :meth:`FakeOpenAI.release` of the same marker.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import pytest

COMPLETIONS_PATH = "/v1/chat/completions"


class Mode(StrEnum):
    OK = "ok"                          # a well-formed completion: "echo: <last user message>"
    HTTP_500 = "http_500"              # 500 with a JSON error body
    HTTP_429 = "http_429"              # 429 rate limited, with Retry-After
    HTTP_500_ECHO_AUTH = "http_500_echo_auth"  # 500 whose body repeats the Authorization header
    SLOW = "slow"                      # waits slow_s before answering (> a client timeout)
    MALFORMED_JSON = "malformed_json"  # 200 with a body that is not JSON
    NO_CHOICES = "no_choices"          # 200, valid JSON without "choices"
    EMPTY_CHOICES = "empty_choices"    # 200, "choices": []
    NULL_CONTENT = "null_content"      # 200, choices[0].message.content is null
    CLOSE = "close"                    # reads the request, closes the connection, sends nothing


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]            # lower-cased names
    body: Any                          # parsed JSON, or None when the body was not JSON
    raw: bytes = field(repr=False)


class _Gate:
    """Holds the requests carrying one marker until released."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.count = 0  # requests that arrived with the marker


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected here; stay quiet.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, payload: bytes, content_type: str = "application/json",
               extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._reply(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake._record(RecordedRequest(self.command, self.path, headers, body, raw))
        if self.path != COMPLETIONS_PATH:
            self._reply(404, b'{"error": {"message": "not found"}}')
            return
        if not fake._wait_gates(_echo(body).removeprefix("echo: ")):
            return  # server shutting down
        mode = fake.mode
        if mode is Mode.CLOSE:
            self.close_connection = True
            return
        if mode is Mode.SLOW and fake._stopping.wait(fake.slow_s):
            return  # server shutting down
        if mode is Mode.HTTP_500:
            self._reply(500, b'{"error": {"message": "internal server error"}}')
        elif mode is Mode.HTTP_429:
            self._reply(429, b'{"error": {"message": "rate limited, slow down"}}',
                        extra={"Retry-After": "1"})
        elif mode is Mode.HTTP_500_ECHO_AUTH:
            echoed = json.dumps({"error": {"message": "bad request",
                                           "authorization": headers.get("authorization")}})
            self._reply(500, echoed.encode())
        elif mode is Mode.MALFORMED_JSON:
            self._reply(200, b'{"choices": [{"message": {"content": "trunc')
        elif mode is Mode.NO_CHOICES:
            self._reply(200, json.dumps({"id": "x", "object": "chat.completion"}).encode())
        elif mode is Mode.EMPTY_CHOICES:
            self._reply(200, json.dumps({"id": "x", "choices": []}).encode())
        elif mode is Mode.NULL_CONTENT:
            self._reply(200, json.dumps(_completion(body, None)).encode())
        else:
            calls = fake._next_tool_calls(body)
            if calls is not None and isinstance(body, dict) and body.get("stream") is True:
                self._stream_calls(body, calls)
                return
            if calls is not None:
                self._reply(200, json.dumps(_tool_completion(body, calls)).encode())
                return
            content = fake._next_reply()
            if content is not None:
                text = content
            elif _after_tool(body):
                text = _quote_tools(body)
            else:
                text = _echo(body)
            if isinstance(body, dict) and body.get("stream") is True:
                self._stream(body, text)
            else:
                self._reply(200, json.dumps(_completion(body, text)).encode())

    def _stream(self, body: dict[str, Any], text: str) -> None:
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        self.close_connection = True
        pieces = [w + " " for w in text.split(" ")]
        pieces[-1] = pieces[-1][:-1]
        first = [{"role": "assistant", "content": ""}]
        deltas = first + [{"content": p} for p in pieces]
        for i, delta in enumerate(deltas):
            self._event(_chunk(body, delta, None))
            said = _echo(body).removeprefix("echo: ")
            if i == 1 and (not fake._wait_stream_gates(said) or fake._drops(said)):
                return
        self._event(_chunk(body, {}, "stop"))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _stream_calls(self, body: dict[str, Any], calls: list[tuple[str, str]]) -> None:
        """Tool calls streamed as OpenAI streams them: each call's id and name
        in one delta, its arguments' text in two more."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.close_connection = True
        self._event(_chunk(body, {"role": "assistant", "content": None}, None))
        for i, (name, arguments) in enumerate(calls):
            self._event(_chunk(body, {"tool_calls": [
                {"index": i, "id": f"call_{i}", "type": "function",
                 "function": {"name": name, "arguments": ""}}]}, None))
            half = len(arguments) // 2
            for part in (arguments[:half], arguments[half:]):
                self._event(_chunk(body, {"tool_calls": [
                    {"index": i, "function": {"arguments": part}}]}, None))
        self._event(_chunk(body, {}, "tool_calls"))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, data: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()


def _echo(body: Any) -> str:
    last = ""
    if isinstance(body, dict):
        for message in body.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "user":
                last = str(message.get("content", ""))
    return f"echo: {last}"


def _after_tool(body: Any) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return False
    return isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"


def _quote_tools(body: dict[str, Any]) -> str:
    """``tool said: ...``: the tool messages after the last assistant message."""
    said: list[str] = []
    for message in body["messages"]:
        if message.get("role") == "assistant":
            said = []
        elif message.get("role") == "tool":
            said.append(str(message.get("content", "")))
    return "tool said: " + " | ".join(said)


def _said_tool_call(body: Any) -> list[tuple[str, str]] | None:
    """The one call of an offered tool whose name, in words, the last message
    (the user's) says; None when there is none."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "user":
        return None
    said = " ".join(str(messages[-1].get("content", "")).lower().split())
    for tool in body.get("tools") or []:
        name = str((tool.get("function") or {}).get("name", "")) if isinstance(tool, dict) else ""
        words = " ".join(re.findall(r"[A-Z][a-z]*|[a-z]+", name.removeprefix("Hass"))).lower()
        if words and words in said:
            rest = said.split(words, 1)[1].strip(" .!?").removeprefix("the ").strip()
            return [(name, json.dumps({"name": rest}))]
    return None


def _tool_completion(body: Any, calls: list[tuple[str, str]]) -> dict[str, Any]:
    done = _completion(body, None)
    done["choices"][0]["finish_reason"] = "tool_calls"
    done["choices"][0]["message"]["tool_calls"] = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)]
    return done


def _chunk(body: Any, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    model = body.get("model") if isinstance(body, dict) else None
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model or "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _completion(body: Any, content: str | None) -> dict[str, Any]:
    model = body.get("model") if isinstance(body, dict) else None
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }


class FakeOpenAI:
    """A real HTTP server speaking the OpenAI chat-completions API on 127.0.0.1."""

    def __init__(self, mode: Mode = Mode.OK, slow_s: float = 2.0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.mode = mode
        self.tls = tls  # a server context: https instead of http
        self.slow_s = slow_s
        self._requests: list[RecordedRequest] = []
        self.replies: list[str] = []  # scripted contents, taken oldest first in Mode.OK
        # scripted tool-call rounds, (name, arguments JSON) each, for requests offering tools
        self.tool_calls: list[list[tuple[str, str]]] = []
        self.auto_tools = False  # call an offered tool the user's message names in words
        self._gates: dict[str, _Gate] = {}
        self._stream_gates: dict[str, _Gate] = {}
        self._dropped: set[str] = set()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeOpenAI:
        server = _Server(("127.0.0.1", 0), _Handler)
        if self.tls is not None:  # a failed handshake is an OSError serve_forever drops
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def hold(self, marker: str) -> None:
        """Hold every completion request whose last user message contains ``marker``
        until :meth:`release`."""
        with self._lock:
            self._gates[marker] = _Gate()

    def wait_held(self, marker: str, count: int = 1, timeout: float = 60.0) -> bool:
        """Wait until ``count`` requests with ``marker`` have arrived; False after
        ``timeout`` (a deadline for a broken test, not a measurement)."""
        with self._arrived:
            gate = self._gates.get(marker) or self._stream_gates[marker]
            return self._arrived.wait_for(lambda: gate.count >= count, timeout)

    def held(self, marker: str) -> int:
        """How many requests with ``marker`` have arrived (held or released)."""
        with self._lock:
            return self._gates[marker].count

    def hold_stream(self, marker: str, drop: bool = False) -> None:
        """Streamed answers to a message containing ``marker`` send their first
        word, then wait until :meth:`release`; with ``drop``, the connection is
        then closed without the rest of the reply or ``[DONE]``."""
        with self._lock:
            self._stream_gates[marker] = _Gate()
            if drop:
                self._dropped.add(marker)

    def release(self, marker: str) -> None:
        """Answer the held requests with ``marker`` (and let later ones through)."""
        with self._lock:
            gates = [g for g in (self._gates.get(marker), self._stream_gates.get(marker)) if g]
        for gate in gates:
            gate.opened.set()

    def _drops(self, text: str) -> bool:
        with self._lock:
            return any(m in text for m in self._dropped)

    def _wait_stream_gates(self, text: str) -> bool:
        return self._wait_gates(text, self._stream_gates)

    def _wait_gates(self, text: str, held: dict[str, _Gate] | None = None) -> bool:
        """Block while a gate (of ``held``: the request gates by default) holds
        ``text``; False if the server is stopping."""
        with self._arrived:
            gates = [g for m, g in (self._gates if held is None else held).items()
                     if m in text]
            for gate in gates:
                gate.count += 1
            self._arrived.notify_all()
        for gate in gates:
            gate.opened.wait()
        return not self._stopping.is_set()

    def close(self) -> None:
        self._stopping.set()  # wakes handlers waiting in SLOW mode
        with self._lock:
            for gate in [*self._gates.values(), *self._stream_gates.values()]:  # held ones
                gate.opened.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            assert not self._thread.is_alive(), "fake OpenAI server did not stop"
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What goes in ``ProviderSettings.base_url``."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def last(self) -> RecordedRequest:
        with self._lock:
            assert self._requests, "no request received"
            return self._requests[-1]

    def _next_tool_calls(self, body: Any) -> list[tuple[str, str]] | None:
        if not isinstance(body, dict) or not body.get("tools") or \
                body.get("tool_choice") == "none":
            return None
        with self._lock:
            if self.tool_calls:
                return self.tool_calls.pop(0)
            auto = self.auto_tools
        return _said_tool_call(body) if auto else None

    def _next_reply(self) -> str | None:
        with self._lock:
            return self.replies.pop(0) if self.replies else None

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)


@pytest.fixture(name="fake_openai")
def fake_openai_fixture() -> Iterator[FakeOpenAI]:
    """A started :class:`FakeOpenAI` in ``Mode.OK``, stopped after the test."""
    with FakeOpenAI() as server:
        yield server
