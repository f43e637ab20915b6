#!/usr/bin/env python3
"""Recall over HTTP and MCP against the actors and in process; streaming time to
the first token through Reverie against the upstream alone.

Usage:
    tools/bench/http.py [--memories 2000] [--queries 150] [--ttft-requests 25]
                        [--upstream-first-ms 150] [--upstream-token-ms 20]
                        [--layer-rounds 12] [--only all|layer] [--json OUT.json]

``--only layer`` runs the memory-layer case (4. below) alone, on the same store
and runtime (about 1.5 minutes with the defaults).

1. Build a store of ``--memories`` synthetic household turns in process
   (``actor_recall.build_store``: ``Memory.add_turns`` in batches, which embeds
   and indexes them), then start a private local Ray node and the whole actor
   runtime on it (``actors.supervisor.start``) with the HTTP server on a free
   port (``http.port = 0``; its address from ``HttpClient.address()``, the
   token from ``<data dir>/http-token``) and the fake upstream below as the
   only language-model provider. ``Memory`` is opened on the same directory in
   the driver as well.

2. Recall, the same ``--queries`` distinct questions (never equal to a stored
   text) on every path, after ``--warmup`` queries per path (not counted):
     in-process  ``Memory.recall(q)`` in the driver (no actors, no HTTP)
     actors      ``RecallClient(ns).recall(Recall(query=q))``: driver -> Recall
                 actor -> Embedder actor -> Recall actor -> driver
     HTTP        ``GET /v1/recall?q=...`` with the bearer token on one keep-alive
                 ``http.client`` connection (-> HTTP actor -> the actors path)
     HTTP no-op  ``GET /v1/models`` on the same connection: the HTTP stack alone
                 (token check, FastAPI, JSON), no actor call
     MCP         the ``recall`` tool of ``/mcp`` (Streamable HTTP) with the ``mcp``
                 SDK's ``Client`` and the same bearer header, one session kept
                 open (``--mcp-modes``: ``legacy`` is the initialize handshake, as
                 Home Assistant's client speaks it; ``auto`` the SDK's default,
                 the 2026 per-request protocol), ``limit`` = ``recall.max_items``
                 so that it answers as much as the other paths
   Sequentially, in blocks of ``--block`` queries: each path runs over the
   whole block before the next starts, the order rotating from block to block
   (so that slow drift of the machine hits all paths alike). Then with 4
   clients at once (4 threads with a connection or client each; for MCP 4
   sessions in one event loop) over the same queries, for requests/s. Last,
   ``--mcp-session-calls`` MCP calls that each open a new session first (a
   client that connects per call; one shared keep-alive HTTP client).
   ``same refs`` is the share of queries a path answered with exactly the refs
   of the in-process call; ``inside`` is the ``elapsed_ms`` the Recall actor
   measured itself (in the actors' and HTTP's answers).

3. Streaming time to the first token. The upstream is a local OpenAI-compatible
   server in this process (threads): to a streamed request it sends the role
   chunk at once, its first content token ``--upstream-first-ms`` after the
   request arrived, then one every ``--upstream-token-ms``
   (``--upstream-tokens`` in all), then ``[DONE]``. ``--ttft-requests`` rounds
   (after 3 not counted), each with a distinct question, of four operations in
   an order that changes from round to round (each follows each other one
   equally often), and after each the Recall actor is let finish indexing
   what it wrote (``RecallClient.pending()``, not timed: the turns of a home
   hub are seconds apart, so the next turn finds the index idle):
     upstream       ``POST /v1/chat/completions`` with ``"stream": true`` straight to
                    the upstream (the request a client would send Reverie, the
                    model named as the upstream knows it)
     reverie/HTTP   the same request to Reverie (``"model": "reverie"``): the HTTP
                    actor -> Turns actor (transcript write, history, turn-zero
                    recall, prompt) -> the upstream, streamed back as SSE
     reverie/actors ``TurnsClient(ns).process_stream(UserTurn(...))`` from the
                    driver: the same turn without HTTP
     steps          the turn path's steps before the upstream, one by one from the
                    driver: ``TranscriptClient.append`` of one turn (another
                    channel), ``TranscriptClient.recent`` of the chat history,
                    ``RecallClient.recall`` of the question (right after the append,
                    as in the turn path: the Recall actor first indexes what the
                    append told it about), then the same recall again (nothing new
                    to index)
   Every streamed request uses a fresh connection. Times are from just before
   the request is sent: ``ttft`` to the first non-empty content delta, ``last``
   to the last one, ``done`` to ``[DONE]`` (for Reverie after the reply is
   stored). The upstream notes (same clock) when each request reached it and
   when it sent its first token: ``to upstream`` is the time until Reverie's
   request reached the upstream (its overhead before the model), ``back`` from
   the upstream's first token to the client's.

4. The memory layer (``--only layer`` runs only this, after 1.). Home
   Assistant's conversation as its Ollama and Extended OpenAI Conversation
   integrations send it: its system prompt (the house's instructions, the
   current time, 20 exposed devices and their states), 8 Hass tools
   (HassTurnOn, HassLightSet, ..., GetLiveContext), two earlier exchanges,
   streamed. Each goes straight to the upstream (the same request, the model
   named as the upstream knows it), through ``/v1/chat/completions`` and
   through ``/api/chat`` (Ollama's shapes: the calls' ``arguments`` an object,
   the result a ``role: tool`` message with ``tool_name``), as two turns:
     plain  a household question: the upstream answers text (tools offered,
            none called)
     tool   "Turn on the kitchen light, N": the upstream streams a HassTurnOn
            call (its arguments in 5 pieces, the first ``--upstream-first-ms``
            after the request, then one every ``--upstream-token-ms``); the
            client sends the call and its result back, and the upstream
            answers text, as for plain. Both legs timed.
   ``--layer-rounds`` rounds (after 3 not counted) of the 6 turns, their order
   rotating; every request has its own time in the system prompt (as Home
   Assistant's has), so no request repeats an earlier conversation (the layer
   would answer it with the stored reply). After each turn the Recall actor
   is let finish indexing (as in 3.). ``first`` is the first content or
   tool-call piece, ``done`` the end of the stream; ``turn`` adds the legs'
   ``done`` (the client's tool run, none here, not counted); ``to upstream``
   is until the leg's request reached the upstream. The upstream notes the
   length of the system message it got (the client's alone, or with Reverie's
   memory after it), the tools offered and whether the request was streamed.

Its entry point ``tools/bench/http.py`` is named like the standard library's
``http`` package; this file keeps its own directory off ``sys.path`` (and so
off Ray's workers' path) and works from the repository root whatever the
current directory was. Every figure is printed, nothing is asserted. The machine's load average
before and after is in the JSON: other work on the machine skews the figures.
"""

from __future__ import annotations

import os
import sys

# This file is named http.py: its directory must stand neither before the standard
# library on sys.path (``import http.client`` would find this script) nor on Ray's
# workers' path (Ray gives them the driver's script directory when the driver's
# sys.path holds it, and the current directory: see main()).
HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != HERE]

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator, Callable  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import quote, urlsplit  # noqa: E402

sys.path.append(HERE)  # for _common and actor_recall only, after the standard library
import _common as c  # noqa: E402
from actor_recall import CORPUS_START, SPAN_DAYS, build_store  # noqa: E402

sys.path.remove(HERE)

from actors import supervisor  # noqa: E402
from actors.handles import HttpClient, RecallClient, TranscriptClient, TurnsClient  # noqa: E402
from actors.http.app import token_path  # noqa: E402
from actors.messages import (  # noqa: E402
    AppendTurns,
    Recall,
    RecentTurns,
    TurnDelta,
    TurnReply,
    UserTurn,
)
from runtime.config import Settings  # noqa: E402
from runtime.memories.transcript import TurnIn  # noqa: E402
from runtime.memory import Memory  # noqa: E402

SEED = 7
QUERY_SEED = 11
UPSTREAM_MODEL = "bench-model"
UPSTREAM_NAME = "upstream"
CHANNEL = "chat"          # what an OpenAI-compatible client's turns land in
STEPS_CHANNEL = "cli"     # the "steps" operation writes here, not into the chat's history
TTFT_WARMUP = 3
CONCURRENCY = 4


# -- the upstream: an OpenAI-compatible streaming server with set delays ---------

@dataclass
class Arrival:
    at: float                      # perf_counter when the request reached the upstream
    first_sent: float | None       # when its first content token was written
    body_bytes: int
    system_prompt: bool            # Reverie's requests carry a system message
    tools: int = 0                 # function tools offered
    system_chars: int = 0          # length of the system message(s)
    stream: bool = False           # asked for a streamed answer


# The memory-layer case: the upstream calls a tool when tools are offered and the
# last message is a user message asking for one (it starts with TOOL_ASK).
TOOL_ASK = "Turn on "
TOOL_CALL_NAME = "HassTurnOn"
TOOL_CALL_PIECES = ['{"na', 'me": "', 'Kitchen ', 'Light', '"}']


def _calls_tool(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    return (bool(body.get("tools")) and last.get("role") == "user"
            and str(last.get("content") or "").startswith(TOOL_ASK))


class _UpstreamServer(ThreadingHTTPServer):
    daemon_threads = True
    upstream: Upstream

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up half-way is not news here


class _UpstreamHandler(BaseHTTPRequestHandler):
    server: _UpstreamServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        arrived = time.perf_counter()
        up = self.server.upstream
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        messages = body.get("messages") or []
        systems = [m for m in messages if m.get("role") == "system"]
        arrival = Arrival(arrived, None, len(raw), bool(systems), len(body.get("tools") or []),
                          sum(len(str(m.get("content") or "")) for m in systems),
                          body.get("stream") is True)
        up.record(arrival)
        if _calls_tool(body):
            self._tool_call(body, arrived, arrival)
            return
        words = [f"tok{i} " for i in range(up.tokens)]
        if body.get("stream") is not True:
            payload = json.dumps({
                "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", UPSTREAM_MODEL),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(words)}}],
            }).encode()
            time.sleep(up.first_s + up.token_s * max(up.tokens - 1, 0))
            self._whole(payload)
            return
        self._start_stream()
        model = body.get("model", UPSTREAM_MODEL)
        self._event(model, {"role": "assistant", "content": ""}, None)
        for i, word in enumerate(words):
            wait = arrived + up.first_s + i * up.token_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            self._event(model, {"content": word}, None)
            if i == 0:
                arrival.first_sent = time.perf_counter()
        self._event(model, {}, "stop")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _whole(self, payload: bytes) -> None:
        """A whole (not streamed) answer."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _start_stream(self) -> None:
        """The head of a streamed answer (server-sent events)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        self.close_connection = True

    def _tool_call(self, body: dict[str, Any], arrived: float, arrival: Arrival) -> None:
        """The model calls ``HassTurnOn``: its arguments in ``TOOL_CALL_PIECES`` pieces,
        the first ``first_s`` after the request came, then one every ``token_s``
        (whole after the last one's delay when not streamed)."""
        up = self.server.upstream
        model = body.get("model", UPSTREAM_MODEL)
        call_id = f"call_{int(arrived * 1e6)}"
        if body.get("stream") is not True:
            time.sleep(up.first_s + up.token_s * (len(TOOL_CALL_PIECES) - 1))
            payload = json.dumps({
                "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": call_id, "type": "function",
                                  "function": {"name": TOOL_CALL_NAME,
                                               "arguments": "".join(TOOL_CALL_PIECES)}}]}}],
            }).encode()
            self._whole(payload)
            return
        self._start_stream()
        self._event(model, {"role": "assistant", "content": None}, None)
        for i, piece in enumerate(TOOL_CALL_PIECES):
            wait = arrived + up.first_s + i * up.token_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
            if i == 0:  # as OpenAI streams a call: id and name in its first chunk
                call.update(id=call_id, type="function")
                call["function"]["name"] = TOOL_CALL_NAME
            self._event(model, {"tool_calls": [call]}, None)
            if i == 0:
                arrival.first_sent = time.perf_counter()
        self._event(model, {}, "tool_calls")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, model: str, delta: dict[str, Any], finish: str | None) -> None:
        data = {"id": "chatcmpl-bench", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()


class Upstream:
    """The fake model server on 127.0.0.1 (a free port), in a thread of this process."""

    def __init__(self, first_ms: float, token_ms: float, tokens: int) -> None:
        self.first_s = first_ms / 1000
        self.token_s = token_ms / 1000
        self.tokens = tokens
        self._arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._server = _UpstreamServer(("127.0.0.1", 0), _UpstreamHandler)
        self._server.upstream = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="bench-upstream", daemon=True)

    def start(self) -> Upstream:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        return f"http://{self.netloc}/v1"

    def record(self, arrival: Arrival) -> None:
        with self._lock:
            self._arrivals.append(arrival)

    def since(self, t0: float) -> list[Arrival]:
        with self._lock:
            return [a for a in self._arrivals if a.at >= t0]


# -- clients --------------------------------------------------------------------

@dataclass
class Streamed:
    ttft_ms: float
    last_ms: float
    done_ms: float
    pieces: int
    to_upstream_ms: float | None = None
    back_ms: float | None = None


def stream_sse(netloc: str, path: str, body: dict[str, Any],
               headers: dict[str, str]) -> tuple[float, float | None, float | None, float, int]:
    """POST ``body`` and read the server-sent events; (t0, first, last, done, pieces)
    in perf_counter seconds. A fresh connection, as Reverie's own provider uses."""
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(netloc, timeout=120)
    try:
        conn.request("POST", path, body=payload, headers={
            "Content-Type": "application/json", "Accept": "text/event-stream", **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {resp.read()[:300]!r}")
        first: float | None = None
        last: float | None = None
        pieces = 0
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            choices = json.loads(data).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
                pieces += 1
        return t0, first, last, time.perf_counter(), pieces
    finally:
        conn.close()


def timed_stream(upstream: Upstream, netloc: str, path: str, body: dict[str, Any],
                 headers: dict[str, str]) -> Streamed:
    t0, first, last, done, pieces = stream_sse(netloc, path, body, headers)
    if first is None or last is None:
        raise RuntimeError(f"POST {netloc}{path}: no content in the stream")
    return with_upstream(upstream, t0, first, last, done, pieces)


def with_upstream(upstream: Upstream, t0: float, first: float, last: float, done: float,
                  pieces: int) -> Streamed:
    out = Streamed((first - t0) * 1000, (last - t0) * 1000, (done - t0) * 1000, pieces)
    arrivals = upstream.since(t0)
    if len(arrivals) == 1:  # one request at a time: it is ours
        out.to_upstream_ms = (arrivals[0].at - t0) * 1000
        if arrivals[0].first_sent is not None:
            out.back_ms = (first - arrivals[0].first_sent) * 1000
    return out


class HttpRecall:
    """``GET /v1/recall`` on one keep-alive connection (opened again when the
    server has closed it while idle: uvicorn does after 5 s; the failed attempt
    is not timed, and ``reconnects`` counts them)."""

    def __init__(self, netloc: str, token: str) -> None:
        self.conn = http.client.HTTPConnection(netloc, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.reconnects = 0

    def _get(self, path: str) -> tuple[float, bytes]:
        for attempt in range(2):
            t = time.perf_counter()
            try:
                self.conn.request("GET", path, headers=self.headers)
                resp = self.conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()  # the next request connects again
                self.reconnects += 1
                if attempt:
                    raise
                continue
            ms = (time.perf_counter() - t) * 1000
            if resp.status != 200:
                raise RuntimeError(f"GET {path.split('?')[0]}: {resp.status} {raw[:300]!r}")
            return ms, raw
        raise AssertionError("unreachable")

    def models(self) -> float:
        """``GET /v1/models``: the HTTP stack alone (token check, FastAPI, JSON), no actor."""
        return self._get("/v1/models")[0]

    def __call__(self, q: str) -> tuple[float, list[str], float]:
        ms, raw = self._get(f"/v1/recall?q={quote(q)}")
        data = json.loads(raw)
        return ms, [i["ref"] for i in data["items"]], float(data.get("elapsed_ms") or 0.0)

    def close(self) -> None:
        self.conn.close()


@asynccontextmanager
async def mcp_session(base: str, token: str, mode: str, http: Any = None) -> AsyncIterator[Any]:
    """The ``mcp`` SDK's client over Streamable HTTP at ``<base>/mcp`` with the token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
                if http is None else _borrowed(http)) as client_http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=client_http),
                          mode=mode) as client:
            yield client


@asynccontextmanager
async def _borrowed(http: Any) -> AsyncIterator[Any]:
    yield http


def _mcp_refs(result: Any) -> list[str]:
    if result.is_error:
        text = result.content[0].text if result.content else "?"
        raise RuntimeError(f"mcp recall failed: {text}")
    return [m["ref"] for m in (result.structured_content or {}).get("memories", [])]


async def mcp_recall(client: Any, q: str, limit: int) -> tuple[float, list[str]]:
    t = time.perf_counter()
    result = await client.call_tool("recall", {"query": q, "limit": limit})
    ms = (time.perf_counter() - t) * 1000
    return ms, _mcp_refs(result)


async def mcp_session_calls(base: str, token: str, mode: str, queries: list[str],
                            limit: int) -> list[float]:
    """Each call opens its own session (one shared keep-alive HTTP client)."""
    import httpx2

    times: list[float] = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        for q in queries:
            t = time.perf_counter()
            async with mcp_session(base, token, mode, http) as client:
                _mcp_refs(await client.call_tool("recall", {"query": q, "limit": limit}))
            times.append((time.perf_counter() - t) * 1000)
    return times


async def mcp_concurrent(base: str, token: str, mode: str, queries: list[str], limit: int,
                         workers: int) -> tuple[list[float], float]:
    """``workers`` sessions calling at once over a shared queue; (latencies, wall s)."""
    import anyio

    times: list[float] = []
    todo = list(reversed(queries))

    async def worker() -> None:
        async with mcp_session(base, token, mode) as client:
            await mcp_recall(client, "warm up the session", limit)
            await barrier.wait()
            while todo:
                q = todo.pop()
                ms, _ = await mcp_recall(client, q, limit)
                times.append(ms)

    class _Barrier:
        def __init__(self, n: int) -> None:
            self.n = n
            self.event = anyio.Event()

        async def wait(self) -> None:
            self.n -= 1
            if self.n == 0:
                self.event.set()
                started.append(time.perf_counter())
            await self.event.wait()

    barrier = _Barrier(workers)
    started: list[float] = []
    async with anyio.create_task_group() as group:
        for _ in range(workers):
            group.start_soon(worker)
    return times, time.perf_counter() - started[0]


def threaded(fn_for: Callable[[int], Callable[[str], float]], queries: list[str],
             workers: int) -> tuple[list[float], float]:
    """``workers`` threads, each with its own caller (``fn_for(i)``), over a shared
    queue of ``queries``; (latencies in ms, wall seconds)."""
    todo = list(reversed(queries))
    lock = threading.Lock()
    times: list[float] = []
    calls = [fn_for(i) for i in range(workers)]

    def run(call: Callable[[str], float]) -> None:
        while True:
            with lock:
                if not todo:
                    return
                q = todo.pop()
            ms = call(q)
            with lock:
                times.append(ms)

    return times, c.released_together(run, calls)


# -- measuring ------------------------------------------------------------------

@dataclass
class Series:
    ms: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    same: int | None = None    # queries answered with the in-process refs (None: not compared)

    def summary(self) -> dict[str, Any]:
        n = len(self.ms)
        out: dict[str, Any] = c.lat_summary(self.ms)
        out["req_per_s"] = round(n / self.wall_s, 1) if self.wall_s else 0.0
        if self.inside:
            out["inside_p50_ms"] = round(c.pct(self.inside, 50), 3)
        if n and self.same is not None:
            out["same_refs"] = round(self.same / n, 4)
        return out


def measure_recall(settings: Settings, memory: Memory, base: str, token: str,
                   queries: list[str], warmup: list[str], block: int, modes: list[str],
                   session_calls: int) -> dict[str, Any]:
    from anyio.from_thread import start_blocking_portal

    ns = settings.runtime.namespace
    limit = settings.recall.max_items
    netloc = urlsplit(base).netloc
    recall = RecallClient(ns)
    web = HttpRecall(netloc, token)
    results: dict[str, Any] = {}
    with start_blocking_portal() as portal:
        clients = {mode: portal.wrap_async_context_manager(mcp_session(base, token, mode))
                   for mode in modes}
        opened = {mode: cm.__enter__() for mode, cm in clients.items()}
        try:
            def op_inproc(q: str) -> tuple[float, list[str], float | None]:
                t = time.perf_counter()
                refs = memory.recall(q).refs
                return (time.perf_counter() - t) * 1000, refs, None

            def op_actor(q: str) -> tuple[float, list[str], float | None]:
                t = time.perf_counter()
                reply = recall.recall(Recall(query=q))
                return (time.perf_counter() - t) * 1000, reply.refs, reply.elapsed_ms

            def op_http(q: str) -> tuple[float, list[str], float | None]:
                return web(q)

            def op_http_noop(q: str) -> tuple[float, list[str] | None, float | None]:
                return web.models(), None, None

            def op_mcp(mode: str) -> Callable[[str], tuple[float, list[str], float | None]]:
                def op(q: str) -> tuple[float, list[str], float | None]:
                    ms, refs = portal.call(mcp_recall, opened[mode], q, limit)
                    return ms, refs, None
                return op

            ops: dict[str, Callable[[str], tuple[float, list[str] | None, float | None]]] = {
                "inproc": op_inproc, "actor": op_actor, "http": op_http,
                "http_noop": op_http_noop}
            for mode in modes:
                ops[f"mcp_{mode}"] = op_mcp(mode)
            series = {name: Series() for name in ops}
            order = list(ops)

            c.log(f"  recall warm-up: {len(warmup)} queries per path")
            for name in order:
                for q in warmup:
                    ops[name](q)
            c.log(f"  recall, sequential: {len(queries)} queries x {len(order)} paths, "
                  f"blocks of {block}")
            for k, start in enumerate(range(0, len(queries), block)):
                chunk = queries[start:start + block]
                refs: dict[str, list[list[str] | None]] = {}
                for name in order[k % len(order):] + order[:k % len(order)]:
                    s = series[name]
                    got = []
                    t = time.perf_counter()
                    for q in chunk:
                        ms, r, inside = ops[name](q)
                        s.ms.append(ms)
                        if inside is not None:
                            s.inside.append(inside)
                        got.append(r)
                    s.wall_s += time.perf_counter() - t
                    refs[name] = got
                for name in order:
                    if refs[name] and refs[name][0] is not None:
                        same = sum(a == b for a, b in zip(refs[name], refs["inproc"]))
                        series[name].same = (series[name].same or 0) + same
            for name, s in series.items():
                results[name] = s.summary()
            results["http_reconnects"] = web.reconnects

            c.log(f"  recall, {CONCURRENCY} at once: actors, HTTP, MCP ({modes[0]})")

            def actor_caller(i: int) -> Callable[[str], float]:
                client = RecallClient(ns)

                def call(q: str) -> float:
                    t = time.perf_counter()
                    client.recall(Recall(query=q))
                    return (time.perf_counter() - t) * 1000
                return call

            lat, wall = threaded(actor_caller, queries, CONCURRENCY)
            results["actor_c4"] = Series(lat, wall_s=wall).summary()

            conns: list[HttpRecall] = []

            def http_caller(i: int) -> Callable[[str], float]:
                caller = HttpRecall(netloc, token)
                conns.append(caller)
                caller("warm up the connection")
                return lambda q: caller(q)[0]

            lat, wall = threaded(http_caller, queries, CONCURRENCY)
            for conn in conns:
                conn.close()
            results["http_c4"] = Series(lat, wall_s=wall).summary()

            lat, wall = portal.call(mcp_concurrent, base, token, modes[0], queries, limit,
                                   CONCURRENCY)
            results[f"mcp_{modes[0]}_c4"] = Series(lat, wall_s=wall).summary()

            if session_calls:
                c.log(f"  recall over MCP, a new session per call: {session_calls} calls")
                t = time.perf_counter()
                lat = portal.call(mcp_session_calls, base, token, modes[0],
                                 queries[:session_calls], limit)
                results[f"mcp_{modes[0]}_session"] = Series(
                    lat, wall_s=time.perf_counter() - t).summary()
        finally:
            for cm in clients.values():
                cm.__exit__(None, None, None)
            web.close()
    return results


def measure_ttft(settings: Settings, upstream: Upstream, base: str, token: str,
                 queries: list[str]) -> dict[str, Any]:
    ns = settings.runtime.namespace
    netloc = urlsplit(base).netloc
    auth = {"Authorization": f"Bearer {token}"}
    turns = TurnsClient(ns, timeout_s=120)
    transcript = TranscriptClient(ns)
    recall = RecallClient(ns)
    history = settings.runtime.history_turns + 1

    def request(q: str, model: str) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": q}], "stream": True,
                "max_tokens": settings.llm.max_tokens, "temperature": settings.llm.temperature}

    def op_upstream(q: str) -> Streamed:
        return timed_stream(upstream, upstream.netloc, "/v1/chat/completions",
                            request(q, UPSTREAM_MODEL), {})

    def op_http(q: str) -> Streamed:
        return timed_stream(upstream, netloc, "/v1/chat/completions", request(q, "reverie"),
                            auth)

    def op_actors(q: str) -> Streamed:
        t0 = time.perf_counter()
        first: float | None = None
        last = t0
        pieces = 0
        for item in turns.process_stream(UserTurn(channel=CHANNEL, text=q)):
            if isinstance(item, TurnDelta) and item.text:
                last = time.perf_counter()
                first = first or last
                pieces += 1
            elif isinstance(item, TurnReply) and item.provider != UPSTREAM_NAME:
                raise RuntimeError(f"the turn was answered by {item.provider!r}, "
                                   f"not the upstream ({item.notice})")
        if first is None:
            raise RuntimeError("the streamed turn had no content")
        return with_upstream(upstream, t0, first, last, time.perf_counter(), pieces)

    steps: dict[str, list[float]] = {"append": [], "recent": [], "recall": [],
                                     "recall_inside": [], "recall_again": []}

    def op_steps(q: str, keep: bool) -> None:
        t = time.perf_counter()
        transcript.append(AppendTurns(turns=[TurnIn(channel=STEPS_CHANNEL, source="user",
                                                    role="user", content=q)]))
        t1 = time.perf_counter()
        transcript.recent(RecentTurns(channel=CHANNEL, limit=history))
        t2 = time.perf_counter()
        inside = recall.recall(Recall(query=q)).elapsed_ms
        t3 = time.perf_counter()
        recall.recall(Recall(query=q))
        t4 = time.perf_counter()
        if keep:
            steps["append"].append((t1 - t) * 1000)
            steps["recent"].append((t2 - t1) * 1000)
            steps["recall"].append((t3 - t2) * 1000)
            steps["recall_inside"].append(inside)
            steps["recall_again"].append((t4 - t3) * 1000)

    streams = {"upstream": op_upstream, "reverie_http": op_http, "reverie_actors": op_actors}
    # every rotation of the four, and of the four with the two Reverie paths swapped:
    # each operation follows each other one equally often
    orders = []
    for base_order in (["upstream", "reverie_http", "reverie_actors", "steps"],
                       ["upstream", "reverie_actors", "reverie_http", "steps"]):
        orders += [base_order[i:] + base_order[:i] for i in range(len(base_order))]
    got: dict[str, list[Streamed]] = {name: [] for name in streams}
    c.log(f"  streaming: {TTFT_WARMUP} + {len(queries) - TTFT_WARMUP} rounds of "
          f"{len(orders[0])} operations")
    for k, q in enumerate(queries):
        keep = k >= TTFT_WARMUP
        for name in orders[k % len(orders)]:
            if name == "steps":
                op_steps(q, keep)
            else:
                out = streams[name](q)
                if keep:
                    got[name].append(out)
            # settle: the Recall actor answers this only after indexing what the
            # operation wrote (turns seconds apart find it idle, as here)
            recall.pending()

    arrivals = upstream.since(0.0)
    res: dict[str, Any] = {}
    for name, runs in got.items():
        res[name] = {
            "ttft": c.lat_summary([r.ttft_ms for r in runs]),
            "last": c.lat_summary([r.last_ms for r in runs]),
            "done": c.lat_summary([r.done_ms for r in runs]),
            "to_upstream": c.lat_summary([r.to_upstream_ms for r in runs
                                          if r.to_upstream_ms is not None]),
            "back": c.lat_summary([r.back_ms for r in runs if r.back_ms is not None]),
            "pieces_mean": round(sum(r.pieces for r in runs) / max(len(runs), 1), 2),
        }
    res["steps"] = {name: c.lat_summary(ms) for name, ms in steps.items()}
    res["steps"]["sum_p50_ms"] = round(sum(res["steps"][n]["p50_ms"]
                                           for n in ("append", "recent", "recall")), 3)
    res["upstream_prompt_bytes"] = {
        "reverie_mean": _mean([a.body_bytes for a in arrivals if a.system_prompt]),
        "direct_mean": _mean([a.body_bytes for a in arrivals if not a.system_prompt])}
    return res


def _mean(values: list[int]) -> float:
    return round(sum(values) / len(values), 1) if values else 0.0


# -- the memory layer: Home Assistant's conversation, direct and through Reverie --

HA_TOOLS = [
    ("HassTurnOn", "Turns on/opens/presses a device or entity"),
    ("HassTurnOff", "Turns off/closes a device or entity"),
    ("HassLightSet", "Sets the brightness percentage or color of a light"),
    ("HassClimateSetTemperature", "Sets the desired indoor temperature"),
    ("HassClimateGetTemperature", "Gets the current temperature of a climate device or entity"),
    ("HassMediaPause", "Pauses a media player"),
    ("HassMediaUnpause", "Resumes a media player"),
    ("GetLiveContext", "Provides real-time information about the CURRENT state, value, or "
                       "mode of devices, sensors, entities, or areas"),
]

HA_DEVICES = [
    ("Kitchen Light", "light", "off", "Kitchen"), ("Kitchen Ceiling", "light", "on", "Kitchen"),
    ("Living Room Lamp", "light", "on", "Living Room"),
    ("Living Room TV", "media_player", "paused", "Living Room"),
    ("Sofa Light", "light", "off", "Living Room"), ("Hall Light", "light", "off", "Hall"),
    ("Front Door", "lock", "locked", "Hall"), ("Porch Light", "light", "off", "Outside"),
    ("Bedroom Light", "light", "off", "Bedroom"), ("Bedside Lamp", "light", "on", "Bedroom"),
    ("Bedroom Blinds", "cover", "closed", "Bedroom"),
    ("Thermostat", "climate", "heat", "Living Room"),
    ("Bathroom Fan", "fan", "off", "Bathroom"), ("Bathroom Light", "light", "off", "Bathroom"),
    ("Office Light", "light", "on", "Office"), ("Office Speaker", "media_player", "idle", "Office"),
    ("Garage Door", "cover", "closed", "Garage"), ("Washing Machine", "switch", "on", "Utility"),
    ("Garden Sprinkler", "switch", "off", "Outside"),
    ("Outdoor Temperature", "sensor", "4.5 °C", "Outside"),
]


def ha_tools() -> list[dict[str, Any]]:
    """Function tools as Home Assistant's conversation integrations offer them."""
    params = {"type": "object", "properties": {
        "name": {"type": "string"}, "area": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string"}}}, "required": []}
    return [{"type": "function",
             "function": {"name": name, "description": desc, "parameters": params}}
            for name, desc in HA_TOOLS]


def ha_system_prompt(k: int) -> str:
    """The house's instructions and the exposed devices' states, with the current time
    (distinct per request, as Home Assistant's carries the time)."""
    devices = "\n".join(f"- names: {n}\n  domain: {d}\n  state: '{st}'\n  areas: {a}"
                        for n, d, st, a in HA_DEVICES)
    return ("You are a voice assistant for Home Assistant.\n"
            "Answer questions about the world truthfully.\n"
            "Answer in plain text. Keep it simple and to the point.\n"
            f"Current time is {k // 3600 % 24:02d}:{k // 60 % 60:02d}:{k % 60:02d}. "
            "Today's date is 2026-12-02.\n"
            "When controlling Home Assistant always call the intent tools. Use HassTurnOn "
            "to lock and HassTurnOff to unlock a lock. When controlling a device, prefer "
            "passing just name and domain. When controlling an area, prefer passing just "
            "area name and domain.\n"
            "Static Context: An overview of the areas and the devices in this smart home:\n"
            + devices)


HA_HISTORY = [
    {"role": "user", "content": "What's the temperature outside?"},
    {"role": "assistant", "content": "It is 4.5 degrees outside."},
    {"role": "user", "content": "Is the front door locked?"},
    {"role": "assistant", "content": "Yes, the front door is locked."},
]


@dataclass
class Leg:
    """One request of a turn: ``first`` the first content or tool-call piece,
    ``done`` the end of the answer, in ms from sending the request."""
    first_ms: float
    done_ms: float
    to_upstream_ms: float | None
    calls: list[dict[str, Any]]    # the tool calls, as the client got them
    content: str


def stream_leg(upstream: Upstream, netloc: str, path: str, body: dict[str, Any],
               headers: dict[str, str]) -> Leg:
    """POST ``body`` streamed and read the answer: server-sent events (OpenAI) or,
    for ``/api/chat``, NDJSON lines (Ollama). A fresh connection."""
    ollama = path == "/api/chat"
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(netloc, timeout=120)
    first: float | None = None
    calls: dict[int, dict[str, Any]] = {}
    content: list[str] = []
    try:
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json",
                                                          **headers})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            if ollama:
                if not line.strip():
                    continue
                event = json.loads(line)
                message = event.get("message") or {}
                text, pieces = message.get("content") or "", message.get("tool_calls") or []
                for call in pieces:
                    calls[len(calls)] = call
                if event.get("done"):
                    if text:
                        content.append(text)
                    first = first or (time.perf_counter() if text or pieces else None)
                    break
            else:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                delta = ((json.loads(data).get("choices") or [{}])[0].get("delta") or {})
                text, pieces = delta.get("content") or "", delta.get("tool_calls") or []
                for piece in pieces:
                    call = calls.setdefault(piece.get("index", 0),
                                            {"id": None, "type": "function",
                                             "function": {"name": "", "arguments": ""}})
                    call["id"] = piece.get("id") or call["id"]
                    fn = piece.get("function") or {}
                    call["function"]["name"] += fn.get("name") or ""
                    call["function"]["arguments"] += fn.get("arguments") or ""
            if text or pieces:
                first = first or time.perf_counter()
                if text:
                    content.append(text)
        done = time.perf_counter()
    finally:
        conn.close()
    if first is None:
        raise RuntimeError(f"POST {netloc}{path}: no content and no tool call in the answer")
    arrivals = upstream.since(t0)
    return Leg((first - t0) * 1000, (done - t0) * 1000,
               (arrivals[0].at - t0) * 1000 if len(arrivals) == 1 else None,
               [calls[i] for i in sorted(calls)], "".join(content))


LAYER_PATHS = {  # name: (path, Reverie's, Ollama's shapes)
    "upstream": ("/v1/chat/completions", False, False),
    "reverie_openai": ("/v1/chat/completions", True, False),
    "reverie_ollama": ("/api/chat", True, True),
}


def measure_layer(settings: Settings, upstream: Upstream, base: str, token: str,
                  rounds: int, questions: list[str]) -> dict[str, Any]:
    """Home Assistant's request (its system prompt with ~20 device states, 8 Hass
    tools, two earlier exchanges) straight to the upstream and through Reverie's
    memory layer (``/v1/chat/completions``, ``/api/chat``), streamed: a plain answer
    (tools offered, none called) and a tool-calling turn (the upstream calls
    HassTurnOn; the client sends the result; the upstream answers text), both
    legs timed. ``rounds`` rounds after ``TTFT_WARMUP``, the paths' order rotating;
    each request with its own system prompt time (as Home Assistant's), so no
    request repeats an earlier conversation."""
    netloc = urlsplit(base).netloc
    auth = {"Authorization": f"Bearer {token}"}
    recall = RecallClient(settings.runtime.namespace)
    tools = ha_tools()
    stamp = [0]

    def conversation(question: str) -> list[dict[str, Any]]:
        stamp[0] += 7
        return [{"role": "system", "content": ha_system_prompt(stamp[0])}, *HA_HISTORY,
                {"role": "user", "content": question}]

    def body(name: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        _, via_reverie, _ = LAYER_PATHS[name]
        return {"model": "reverie" if via_reverie else UPSTREAM_MODEL, "messages": messages,
                "tools": tools, "stream": True}

    def leg(name: str, messages: list[dict[str, Any]]) -> Leg:
        path, via_reverie, _ = LAYER_PATHS[name]
        return stream_leg(upstream, netloc if via_reverie else upstream.netloc, path,
                          body(name, messages), auth if via_reverie else {})

    def plain(name: str, question: str) -> dict[str, Leg]:
        answer = leg(name, conversation(question))
        if answer.calls or not answer.content:
            raise RuntimeError(f"{name}: a plain question got {len(answer.calls)} tool calls")
        return {"answer": answer}

    def tool_turn(name: str, question: str) -> dict[str, Leg]:
        messages = conversation(question)
        call = leg(name, messages)
        if [c["function"]["name"] for c in call.calls] != [TOOL_CALL_NAME]:
            raise RuntimeError(f"{name}: expected a {TOOL_CALL_NAME} call, got {call.calls}")
        result = json.dumps({"speech": {}, "response_type": "action_done",
                             "data": {"success": [{"name": "Kitchen Light", "type": "entity"}],
                                      "failed": []}})
        if LAYER_PATHS[name][2]:  # Ollama's shapes: no call ids, tool_name
            messages += [{"role": "assistant", "content": "", "tool_calls": call.calls},
                         {"role": "tool", "content": result, "tool_name": TOOL_CALL_NAME}]
        else:
            messages += [{"role": "assistant", "content": None, "tool_calls": call.calls},
                         {"role": "tool", "tool_call_id": call.calls[0]["id"],
                          "content": result}]
        answer = leg(name, messages)
        if answer.calls or not answer.content:
            raise RuntimeError(f"{name}: the tool result got no text answer")
        return {"call": call, "answer": answer}

    ops = [(name, kind) for kind in ("plain", "tool") for name in LAYER_PATHS]
    got: dict[tuple[str, str], list[dict[str, Leg]]] = {op: [] for op in ops}
    c.log(f"  memory layer: {TTFT_WARMUP} + {rounds} rounds of {len(ops)} turns")
    t_start = time.perf_counter()
    for k in range(TTFT_WARMUP + rounds):
        q = questions[k % len(questions)]
        for name, kind in ops[k % len(ops):] + ops[:k % len(ops)]:
            legs = (plain(name, q) if kind == "plain"
                    else tool_turn(name, f"{TOOL_ASK}the kitchen light, {k}"))
            if k >= TTFT_WARMUP:
                got[(name, kind)].append(legs)
            recall.pending()  # the Recall actor idle again, as between a hub's turns
    arrivals = upstream.since(t_start)

    res: dict[str, Any] = {}
    for (name, kind), runs in got.items():
        out: dict[str, Any] = {}
        for part in runs[0]:
            out[part] = {
                "first": c.lat_summary([r[part].first_ms for r in runs]),
                "done": c.lat_summary([r[part].done_ms for r in runs]),
                "to_upstream": c.lat_summary([ms for r in runs
                                              if (ms := r[part].to_upstream_ms) is not None])}
        out["turn"] = c.lat_summary([sum(leg.done_ms for leg in r.values()) for r in runs])
        res[f"{kind}_{name}"] = out
    client_prompt = len(ha_system_prompt(0))  # the same length whatever the time
    res["upstream_requests"] = {
        "reverie_system_chars_mean": _mean([a.system_chars for a in arrivals
                                            if a.system_chars > client_prompt]),
        "direct_system_chars_mean": _mean([a.system_chars for a in arrivals
                                           if a.system_chars <= client_prompt]),
        "tools_offered": sorted({a.tools for a in arrivals}),
        "streamed_share": round(sum(a.stream for a in arrivals) / max(len(arrivals), 1), 3)}
    return res


def report_layer(res: dict[str, Any]) -> None:
    lay = res["layer"]
    p = res["params"]
    rows = []
    for kind, label in (("plain", "plain answer"), ("tool", "tool call, then the answer")):
        up = lay[f"{kind}_upstream"]
        for name, path_label in (("upstream", "upstream direct"),
                                 ("reverie_openai", "Reverie /v1/chat/completions"),
                                 ("reverie_ollama", "Reverie /api/chat")):
            s = lay[f"{kind}_{name}"]
            call = s.get("call")
            rows.append([label, path_label, s["turn"]["n"],
                         call["first"]["p50_ms"] if call else "-",
                         call["done"]["p50_ms"] if call else "-",
                         call["to_upstream"]["p50_ms"] if call else "-",
                         s["answer"]["first"]["p50_ms"], s["answer"]["first"]["p99_ms"],
                         s["answer"]["done"]["p50_ms"], s["turn"]["p50_ms"],
                         s["turn"]["p99_ms"],
                         round(s["turn"]["p50_ms"] - up["turn"]["p50_ms"], 1),
                         s["answer"]["to_upstream"]["p50_ms"]])
    print()
    print(f"Memory layer: Home Assistant's request ({len(HA_DEVICES)} device states, "
          f"{len(HA_TOOLS)} tools, {len(HA_HISTORY)} messages of history), upstream first "
          f"token after {p['upstream_first_ms']:g} ms, then one every "
          f"{p['upstream_token_ms']:g} ms")
    print(c.table(["turn", "path", "n", "call first p50", "call done p50",
                   "call to upstream p50", "ttft p50",
                   "ttft p99", "answer done p50", "turn p50", "turn p99", "turn overhead p50",
                   "answer to upstream p50"], rows))
    ur = lay["upstream_requests"]
    print("(ms from sending each request; turn: the legs' done times added, the client's "
          "tool run not counted; overhead: turn p50 - upstream direct's)")
    print(f"system message the upstream got: {ur['reverie_system_chars_mean']:,.0f} chars "
          f"through Reverie, {ur['direct_system_chars_mean']:,.0f} direct; tools offered "
          f"{ur['tools_offered']}; share of upstream requests streamed "
          f"{ur['streamed_share']:.0%}")


# -- report ---------------------------------------------------------------------

RECALL_ROWS = [
    ("inproc", "in-process Memory.recall", "sequential"),
    ("actor", "actors RecallClient.recall", "sequential"),
    ("actor_c4", "actors RecallClient.recall", f"{CONCURRENCY} at once"),
    ("http", "HTTP GET /v1/recall", "sequential, keep-alive"),
    ("http_c4", "HTTP GET /v1/recall", f"{CONCURRENCY} at once"),
    ("http_noop", "HTTP GET /v1/models (no actor)", "sequential, keep-alive"),
]


def recall_rows(rec: dict[str, Any], modes: list[str]) -> list[tuple[str, str, str]]:
    rows = list(RECALL_ROWS)
    for mode in modes:
        rows.append((f"mcp_{mode}", f"MCP recall tool ({mode})", "sequential, one session"))
    rows.append((f"mcp_{modes[0]}_c4", f"MCP recall tool ({modes[0]})",
                 f"{CONCURRENCY} sessions at once"))
    if f"mcp_{modes[0]}_session" in rec:
        rows.append((f"mcp_{modes[0]}_session", f"MCP recall tool ({modes[0]})",
                     "new session per call"))
    return rows


def report(res: dict[str, Any], modes: list[str]) -> None:
    rec = res["recall"]
    base = rec["inproc"]["p50_ms"] or 1.0
    rows = []
    for key, label, how in recall_rows(rec, modes):
        s = rec[key]
        rows.append([label, how, s["n"], s["req_per_s"], s["p50_ms"], s["p90_ms"], s["p99_ms"],
                     round(s["p50_ms"] / base, 2),
                     s.get("inside_p50_ms", "-"), s.get("same_refs", "-")])
    print()
    print(f"Recall, {res['memories']:,} memories")
    print(c.table(["path", "how", "n", "req/s", "p50 ms", "p90 ms", "p99 ms", "x p50",
                   "inside p50", "same refs"], rows))
    print("(x p50: ratio to in-process; inside: the Recall actor's own elapsed_ms; "
          "same refs: share of queries answered exactly as in process)")

    tt = res["ttft"]
    up = tt["upstream"]
    rows = []
    for key, label in [("upstream", "upstream alone"), ("reverie_actors", "Reverie via actors"),
                       ("reverie_http", "Reverie via HTTP")]:
        s = tt[key]
        rows.append([label, s["ttft"]["n"], s["ttft"]["p50_ms"], s["ttft"]["p99_ms"],
                     round(s["ttft"]["p50_ms"] - up["ttft"]["p50_ms"], 1),
                     s["last"]["p50_ms"], s["last"]["p99_ms"], s["done"]["p50_ms"],
                     s["to_upstream"]["p50_ms"], s["back"]["p50_ms"], s["pieces_mean"]])
    p = res["params"]
    print()
    print(f"Streaming, upstream first token after {p['upstream_first_ms']:g} ms, then one "
          f"every {p['upstream_token_ms']:g} ms ({p['upstream_tokens']} tokens)")
    print(c.table(["path", "n", "ttft p50", "ttft p99", "overhead p50", "last p50", "last p99",
                   "done p50", "to upstream p50", "back p50", "tokens"], rows))
    print("(ms from sending the request; overhead: ttft p50 - upstream's; to upstream: "
          "until the request reached the upstream; back: upstream's first token -> client)")
    st = tt["steps"]
    print()
    print(c.table(["step before the upstream (from the driver)", "p50 ms", "p99 ms"],
                  [["Transcript append (1 turn)", st["append"]["p50_ms"], st["append"]["p99_ms"]],
                   ["Transcript recent (history)", st["recent"]["p50_ms"], st["recent"]["p99_ms"]],
                   ["Recall", st["recall"]["p50_ms"], st["recall"]["p99_ms"]],
                   ["  of which inside the Recall actor", st["recall_inside"]["p50_ms"],
                    st["recall_inside"]["p99_ms"]],
                   ["Recall again, nothing new to index", st["recall_again"]["p50_ms"],
                    st["recall_again"]["p99_ms"]],
                   ["sum of the p50s", st["sum_p50_ms"], "-"]]))
    pb = tt["upstream_prompt_bytes"]
    print(f"request body the upstream got: {pb['reverie_mean']:,.0f} bytes from Reverie "
          f"(persona, memories, history), {pb['direct_mean']:,.0f} bytes direct")


# -- main -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memories", type=int, default=2000, help="turns in the store")
    ap.add_argument("--queries", type=int, default=150, help="distinct recall queries")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up queries per recall path")
    ap.add_argument("--block", type=int, default=25,
                    help="queries per block: each recall path runs over a block in turn")
    ap.add_argument("--mcp-modes", default="legacy,auto",
                    help="MCP client modes, comma-separated (the first also runs "
                         "concurrently and per session)")
    ap.add_argument("--mcp-session-calls", type=int, default=30,
                    help="MCP calls that each open a new session (0: none)")
    ap.add_argument("--ttft-requests", type=int, default=25,
                    help="streamed requests per path (after 3 not counted)")
    ap.add_argument("--upstream-first-ms", type=float, default=150.0,
                    help="the upstream's delay to its first token")
    ap.add_argument("--upstream-token-ms", type=float, default=20.0,
                    help="the upstream's delay between tokens")
    ap.add_argument("--upstream-tokens", type=int, default=20, help="tokens per reply")
    ap.add_argument("--batch", type=int, default=256, help="Memory.add_turns batch when building")
    ap.add_argument("--seed", type=int, default=SEED, help="corpus seed")
    ap.add_argument("--layer-rounds", type=int, default=12,
                    help="memory-layer rounds (after 3 not counted), each of 6 turns")
    ap.add_argument("--only", choices=["all", "layer"], default="all",
                    help="layer: only the memory-layer case (no recall, no plain streaming)")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    json_out = os.path.abspath(args.json_out) if args.json_out else None
    os.chdir(c.ROOT)  # Ray puts the current directory on its workers' path (see the top)
    modes = [m.strip() for m in args.mcp_modes.split(",") if m.strip()]
    wall = time.perf_counter()
    load_before = c.loadavg()

    work = Path(tempfile.mkdtemp(prefix="rvb-http-"))
    upstream = Upstream(args.upstream_first_ms, args.upstream_token_ms,
                        args.upstream_tokens).start()
    res: dict[str, Any] = {"memories": args.memories}
    try:
        data_dir = work / "data"
        res["store"] = build_store(data_dir, args.memories, args.seed, args.batch)
        texts = {t.content for t in c.household_turns(args.memories, seed=args.seed,
                                                       start=CORPUS_START, span_days=SPAN_DAYS)}
        n_ttft = args.ttft_requests + TTFT_WARMUP
        n_layer = args.layer_rounds + TTFT_WARMUP
        all_q = c.household_queries(args.warmup + args.queries + n_ttft + n_layer,
                                    seed=QUERY_SEED, avoid=list(texts))
        warmup = all_q[:args.warmup]
        queries = all_q[args.warmup:args.warmup + args.queries]
        ttft_queries = all_q[args.warmup + args.queries:-n_layer]
        layer_queries = all_q[-n_layer:]
        settings = c.make_settings(
            data_dir, http={"port": 0},
            llm={"providers": [{"name": UPSTREAM_NAME, "base_url": upstream.base_url,
                                "model": UPSTREAM_MODEL, "timeout_s": 60}],
                 "offline_fallback": True})
        with c.local_ray(settings, dashboard=False) as ray_info:
            c.log(f"ray up in {ray_info['init_s']:.1f} s")
            started = time.perf_counter()
            sup = supervisor.start(settings)
            res["actors_ready_s"] = round(time.perf_counter() - started, 2)
            try:
                ns = settings.runtime.namespace
                res["index_counts"] = RecallClient(ns).sync().counts
                base = HttpClient(ns).address()
                if not base:
                    raise RuntimeError("the HTTP server is not listening (see reverie status)")
                token = token_path(settings).read_text().strip()
                c.log(f"  actors ready in {res['actors_ready_s']:.1f} s, HTTP at {base}")
                if args.only == "all":
                    memory = Memory(settings)
                    memory.embedder.embed(["warm up"])
                    try:
                        res["recall"] = measure_recall(
                            settings, memory, base, token, queries, warmup, args.block,
                            modes, min(args.mcp_session_calls, len(queries)))
                    finally:
                        memory.close()
                    res["ttft"] = measure_ttft(settings, upstream, base, token, ttft_queries)
                res["layer"] = measure_layer(settings, upstream, base, token,
                                             args.layer_rounds, layer_queries)
            finally:
                c.stop_runtime(sup)
    finally:
        upstream.close()
        shutil.rmtree(work, ignore_errors=True)

    res["params"] = {"memories": args.memories, "queries": args.queries, "warmup": args.warmup,
                     "block": args.block, "mcp_modes": modes,
                     "mcp_session_calls": args.mcp_session_calls,
                     "ttft_requests": args.ttft_requests, "ttft_warmup": TTFT_WARMUP,
                     "upstream_first_ms": args.upstream_first_ms,
                     "upstream_token_ms": args.upstream_token_ms,
                     "upstream_tokens": args.upstream_tokens, "concurrency": CONCURRENCY,
                     "only": args.only, "layer_rounds": args.layer_rounds,
                     "seed": args.seed, "query_seed": QUERY_SEED}
    res["loadavg_before"] = load_before
    res["loadavg_after"] = c.loadavg()
    if args.only == "all":
        report(res, modes)
    report_layer(res)
    wall_s = time.perf_counter() - wall
    lay = res["layer"]
    print(f"\nSUMMARY http layer: Home Assistant's turn p50, upstream direct / Reverie "
          f"/v1/chat/completions / /api/chat: plain answer ttft "
          f"{lay['plain_upstream']['answer']['first']['p50_ms']:.0f} / "
          f"{lay['plain_reverie_openai']['answer']['first']['p50_ms']:.0f} / "
          f"{lay['plain_reverie_ollama']['answer']['first']['p50_ms']:.0f} ms, whole "
          f"{lay['plain_upstream']['turn']['p50_ms']:.0f} / "
          f"{lay['plain_reverie_openai']['turn']['p50_ms']:.0f} / "
          f"{lay['plain_reverie_ollama']['turn']['p50_ms']:.0f} ms; tool turn (both legs) "
          f"{lay['tool_upstream']['turn']['p50_ms']:.0f} / "
          f"{lay['tool_reverie_openai']['turn']['p50_ms']:.0f} / "
          f"{lay['tool_reverie_ollama']['turn']['p50_ms']:.0f} ms; wall {wall_s:.0f} s")
    if args.only == "layer":
        c.write_json(json_out, {"benchmark": "http", "machine": c.machine(),
                                "wall_s": round(wall_s, 1), **res})
        return 0
    rec, tt = res["recall"], res["ttft"]
    print(f"\nSUMMARY http: recall p50 in-process {rec['inproc']['p50_ms']:.1f} / actors "
          f"{rec['actor']['p50_ms']:.1f} / HTTP {rec['http']['p50_ms']:.1f} / MCP "
          f"{rec[f'mcp_{modes[0]}']['p50_ms']:.1f} ms; HTTP {rec['http_c4']['req_per_s']:.0f} "
          f"req/s at {CONCURRENCY}; TTFT p50 upstream {tt['upstream']['ttft']['p50_ms']:.0f} / "
          f"Reverie HTTP {tt['reverie_http']['ttft']['p50_ms']:.0f} ms; wall {wall_s:.0f} s")
    c.write_json(json_out, {"benchmark": "http", "machine": c.machine(),
                                 "wall_s": round(wall_s, 1), **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
