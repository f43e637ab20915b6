"""The MCP server at ``/mcp`` against the real runtime (the actors on the test
session's Ray), driven by the ``mcp`` SDK's own Streamable HTTP client with the
bearer token: the handshake-era protocol as Home Assistant speaks it
(``mode="legacy"``) and the SDK's default (``"auto"``, the 2026 protocol). Then,
without the runtime: a backend that never answers is a tool error within the
bound, and the time-window parser."""

from __future__ import annotations

import http.client
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import anyio
import httpx2
import pytest
from http_runtime import Api, http_runtime
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from actors.common import actors_for
from actors.http import mcp as http_mcp
from actors.http.mcp import TOOL_NAMES, Tools, build_server, parse_instant
from actors.messages import (
    MemoryPage,
    MemoryView,
    Recalled,
    Status,
    TurnDelta,
    TurnReply,
    UserTurn,
)
from runtime.config import load_settings
from runtime.time.clock import household_zone
from tests.waiting import wait_for

NS = "test-http-mcp"
MODES = ["legacy", "auto"]  # legacy: initialize, as Home Assistant's client does
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "plain-http", "version": "1"}}}


@pytest.fixture(scope="module")
def api(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with http_runtime(NS, tmp_path_factory.mktemp("http-mcp-data"), model_cache,
                      household={"people": ["Ana", "Rui"]},
                      http={"models": {"assistant": "offline"},
                            "tokens": {"ana": {"person": "Ana"},
                                       "hall": {"channel": "voice"}}}) as api:
        yield api


def post(api: Api, path: str, body: Any,
         headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(urlsplit(api.base).netloc, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", **headers})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


@asynccontextmanager
async def connected(api: Api, mode: str = "legacy",
                    token: str | None = None) -> AsyncIterator[Client]:
    """The SDK's client over Streamable HTTP at ``<base>/mcp``, with the token
    (default: the admin token)."""
    bearer = token or api.token
    # timeout: a loaded machine answers slower than httpx's default 5 s read timeout
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"},
                                  timeout=60) as http:
        async with Client(streamable_http_client(f"{api.base}/mcp", http_client=http),
                          mode=mode) as client:
            yield client


def call(api: Api, tool: str, arguments: dict[str, Any],
         mode: str = "legacy", token: str | None = None) -> CallToolResult:
    async def go() -> CallToolResult:
        async with connected(api, mode, token) as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(go)


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def recalled_refs(api: Api, query: str) -> list[str]:
    result = call(api, "recall", {"query": query, "limit": 20})
    assert not result.is_error, text(result)
    return [m["ref"] for m in result.structured_content["memories"]]


def remember(api: Api, words: str, mode: str = "legacy") -> str:
    result = call(api, "remember", {"text": words}, mode)
    assert not result.is_error, text(result)
    ref: str = result.structured_content["ref"]
    assert ref.startswith("fact:") and ref in text(result)
    return ref


# -- over HTTP, against the runtime ---------------------------------------------

def test_initialize_at_exactly_mcp_answers_200(api: Api) -> None:
    status, headers, body = post(api, "/mcp", INITIALIZE,
                                 {"Authorization": f"Bearer {api.token}"})
    assert status == 200, body  # not a 307 to /mcp/
    assert headers["content-type"].startswith("application/json")  # JSON, not an SSE stream
    result = json.loads(body)["result"]
    assert result["serverInfo"]["name"] == "reverie"
    assert result["protocolVersion"] == "2025-06-18"
    assert result["capabilities"]["tools"] is not None
    assert "mcp-session-id" not in headers  # stateless: nothing kept in the actor


@pytest.mark.parametrize("auth", ["", "Bearer wrong-token", "Basic {token}"])
def test_without_the_token_401(api: Api, auth: str) -> None:
    headers = {"Authorization": auth.format(token=api.token)} if auth else {}
    status, response_headers, body = post(api, "/mcp", INITIALIZE, headers)
    assert status == 401, body
    # RFC 9728: the 401 names the protected-resource metadata (OAuth, actors.http.oauth)
    assert response_headers["www-authenticate"].startswith("Bearer ")
    assert (f'resource_metadata="{api.base}/.well-known/oauth-protected-resource/mcp"'
            in response_headers["www-authenticate"])
    assert "serverInfo" not in body


@pytest.mark.parametrize("mode", MODES)
def test_lists_exactly_the_five_tools(api: Api, mode: str) -> None:
    async def go() -> Any:
        async with connected(api, mode) as client:
            return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in anyio.run(go)}
    assert set(tools) == set(TOOL_NAMES) == {"recall", "remember", "forget", "timeline",
                                             "status"}
    for tool in tools.values():
        assert tool.description and len(tool.description) > 80, tool.name
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
        assert tool.annotations is not None
    assert tools["recall"].input_schema["required"] == ["query"]
    assert "required" not in tools["timeline"].input_schema  # expr, or since (and until)
    assert "expr" in tools["timeline"].input_schema["properties"]
    assert tools["forget"].annotations.destructive_hint is True
    assert tools["recall"].annotations.read_only_hint is True
    assert tools["remember"].annotations.read_only_hint is False


def test_remember_keeps_the_level_asked_for(api: Api) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    result = call(api, "remember", {"text": f"Our wedding day was at the {word} chapel",
                                    "level": "seared"})
    assert not result.is_error, text(result)
    ref = result.structured_content["ref"]
    conn = http.client.HTTPConnection(urlsplit(api.base).netloc, timeout=60)
    try:
        conn.request("GET", f"/v1/memories/{ref}",
                     headers={"Authorization": f"Bearer {api.token}"})
        got = conn.getresponse()
        assert got.status == 200 and json.loads(got.read())["level"] == "seared"
    finally:
        conn.close()
    bad = call(api, "remember", {"text": f"the {word} shed", "level": "faint"})
    assert bad.is_error and "level" in text(bad)


@pytest.mark.parametrize("mode", MODES)
def test_remember_recall_forget(api: Api, mode: str) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    ref = remember(api, f"The spare boiler key is kept in the {word} tin", mode)

    assert wait_for(lambda: ref in recalled_refs(api, f"{word} tin boiler key"), 60)
    found = call(api, "recall", {"query": f"where is the boiler key {word}"}, mode)
    assert not found.is_error
    assert word in text(found) and ref in text(found)
    memory = next(m for m in found.structured_content["memories"] if m["ref"] == ref)
    assert memory["kind"] == "fact" and word in memory["text"]

    gone = call(api, "forget", {"ref": ref}, mode)
    assert not gone.is_error, text(gone)
    assert gone.structured_content["ref"] == ref
    assert wait_for(lambda: ref not in recalled_refs(api, f"{word} tin boiler key"), 60)

    again = call(api, "forget", {"ref": ref}, mode)  # already gone: said, not a crash
    assert again.is_error and ref in text(again)


@pytest.mark.parametrize("mode", MODES)
def test_status_is_the_runtime_status(api: Api, mode: str) -> None:
    result = call(api, "status", {}, mode)
    assert not result.is_error, text(result)
    status = Status.model_validate(result.structured_content)
    assert status.namespace == NS
    assert set(status.actors) == set(actors_for(api.settings))
    assert all(state == "ok" for state in status.actors.values()), status.actors
    assert f"all {len(status.actors)} parts up" in text(result)


def test_timeline_finds_what_was_written_in_its_window(api: Api) -> None:
    word = f"zq{uuid.uuid4().hex[:10]}"
    ref = remember(api, f"The window cleaner comes on {word} day")
    zone = household_zone(api.settings.household.timezone)
    an_hour_ago = (datetime.now(zone) - timedelta(hours=1)).replace(tzinfo=None)
    yesterday = datetime.now(zone).date() - timedelta(days=1)

    def refs(arguments: dict[str, Any]) -> list[str]:
        result = call(api, "timeline", {"limit": 100, **arguments})
        assert not result.is_error, text(result)
        return [m["ref"] for m in result.structured_content["memories"]]

    # a local date-time without an offset (until: now), and whole days
    assert ref in refs({"since": an_hour_ago.isoformat(timespec="seconds")})
    assert ref in refs({"since": yesterday.isoformat(), "until": "today"})
    result = call(api, "timeline", {"since": "today", "limit": 100})
    assert ref in text(result) and word in text(result)
    # a window in the past holds nothing written now
    assert ref not in refs({"since": "2001-01-01", "until": "2001-01-02"})
    assert ref not in refs({"since": yesterday.isoformat(), "until": yesterday.isoformat()})
    # the time in words, as GET /v1/timeline?expr=
    assert ref in refs({"expr": "today"})
    assert ref in refs({"expr": "this week"})
    assert ref not in refs({"expr": "yesterday"})
    assert ref not in refs({"expr": "May 2001"})


def test_a_bound_token_is_told_only_what_its_audience_may_be(api: Api) -> None:
    """A static token bound to an audience ([http.tokens]) gets the privacy rules
    on recall, timeline and forget, as an OAuth client does; the admin token
    sees everything."""
    from actors.http.audience import tokens_dir
    from actors.http.backend import ActorBackend

    word = f"zq{uuid.uuid4().hex[:10]}"
    backend = ActorBackend(api.settings)
    ana_ref, _ = backend.remember(f"Ana's {word} bank card PIN is 4417", sensitive=True,
                                  person="Ana")
    rui_ref, _ = backend.remember(f"Rui's {word} bank card PIN is 9182", sensitive=True,
                                  person="Rui")
    plain_ref = remember(api, f"The {word} bank is on the corner")
    token = {name: (tokens_dir(api.settings) / name).read_text().strip()
             for name in ("ana", "hall")}

    def refs(tool: str, arguments: dict[str, Any], who: str | None = None) -> set[str]:
        result = call(api, tool, arguments, token=None if who is None else token[who])
        assert not result.is_error, text(result)
        assert (who is None) == ("9182" in text(result)), (who, tool)
        return {m["ref"] for m in result.structured_content["memories"]}

    query = {"query": f"{word} bank card PIN", "limit": 20}
    window = {"since": "today", "limit": 100}
    assert wait_for(lambda: {ana_ref, rui_ref, plain_ref} <= refs("recall", query), 60)
    assert {ana_ref, rui_ref, plain_ref} <= refs("timeline", window)
    for tool, arguments in (("recall", query), ("timeline", window)):
        seen = refs(tool, arguments, "ana")
        assert ana_ref in seen and plain_ref in seen and rui_ref not in seen, tool
        seen = refs(tool, arguments, "hall")  # a spoken channel, nobody known: nothing sensitive
        assert plain_ref in seen and not {ana_ref, rui_ref} & seen, tool
    kind, number = rui_ref.split(":")
    refused = call(api, "forget", {"ref": rui_ref}, token=token["ana"])
    assert refused.is_error and text(refused) == f"forget {rui_ref}: no {kind} {number}"
    assert backend.get(rui_ref).sensitive


@pytest.mark.parametrize("tool,arguments,says", [
    ("recall", {}, "query"),
    ("recall", {"query": ""}, "query"),
    ("recall", {"query": "boiler", "limit": "many"}, "limit"),
    ("recall", {"query": "boiler", "colour": "red"}, "colour"),
    ("remember", {"text": 42}, "text"),
    ("forget", {"ref": "the boiler one"}, "bad reference"),
    ("timeline", {"since": "last tuesday-ish"}, "ISO-8601"),
    ("timeline", {"since": "today", "until": "yesterday"}, "after since"),
    ("timeline", {}, "since"),
    ("timeline", {"expr": "when the music died"}, "expr"),
    ("timeline", {"expr": "today", "since": "today"}, "either expr"),
    ("no_such_tool", {}, "unknown tool"),
])
def test_bad_arguments_are_a_tool_error(api: Api, tool: str, arguments: dict[str, Any],
                                        says: str) -> None:
    result = call(api, tool, arguments)
    assert result.is_error
    assert says in text(result)
    # and the server is still there
    assert not call(api, "status", {}).is_error


# -- without the runtime ----------------------------------------------------------

class StuckBackend:
    """Answers nothing until released; counts the calls that reached it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    def _wait(self) -> None:
        self.started += 1
        self.release.wait(60)

    def recall(self, msg: Any) -> Recalled:
        self._wait()
        return Recalled(query=msg.query, items=[])

    def remember(self, text: str, level: str = "normal") -> tuple[str, str]:
        self._wait()
        return "fact:1", "added"

    def change(self, ref: str, change: str) -> str:
        self._wait()
        return "deleted"

    def browse(self, msg: Any) -> MemoryPage:
        self._wait()
        return MemoryPage(items=[], total=0)

    def status(self) -> Status:
        self._wait()
        return Status(namespace="x", actors={}, counts={})

    def turn(self, msg: UserTurn) -> TurnReply:
        raise NotImplementedError

    def turn_stream(self, msg: UserTurn) -> Iterator[TurnDelta | TurnReply]:
        raise NotImplementedError

    def edit(self, ref: str, text: str) -> str:
        raise NotImplementedError

    def get(self, ref: str) -> MemoryView:
        raise NotImplementedError


def test_a_backend_that_does_not_answer_is_a_tool_error(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    assert http_mcp.TOOL_TIMEOUT_S < 10  # Home Assistant gives a tool 10 s
    settings = load_settings(env={}, overrides={"store": {"data_dir": str(tmp_path)}})
    backend = StuckBackend()
    tools = Tools(settings, backend, timeout_s=0.2, workers=1)
    secret = f"secret{uuid.uuid4().hex[:8]}"

    async def go() -> list[CallToolResult]:
        async with Client(build_server(tools), mode="legacy") as client:
            return [await client.call_tool("recall", {"query": secret}),
                    await client.call_tool("remember", {"text": secret}),
                    await client.call_tool("timeline", {"since": "today"})]

    caplog.set_level(logging.DEBUG)
    try:
        results = anyio.run(go)
    finally:
        backend.release.set()
        tools.close()
    for result in results:
        assert result.is_error
        assert "did not answer within 0.2 s" in text(result)
    assert "may still be applied" in text(results[1])
    # one worker, stuck on the first call: the later ones were dropped unstarted
    assert backend.started == 1
    assert secret not in caplog.text  # no query or memory text in the logs


LAZY = """
import sys, tempfile
from actors.http.app import make_app
from runtime.config import load_settings
settings = load_settings(env={}, overrides={"store": {"data_dir": tempfile.mkdtemp()}})
make_app(settings, "token", object())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("mcp", "mcp_types", "httpx2")))
"""


def test_the_sdk_is_not_loaded_until_mcp_is_asked() -> None:
    """≈ 27 MiB and 0.5 s that a household without an MCP client never pays."""
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- the time window ----------------------------------------------------------------

LISBON = ZoneInfo("Europe/Lisbon")
NOW = datetime(2024, 7, 3, 15, 30, tzinfo=LISBON).timestamp()  # summer: UTC+1


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
       second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=LISBON).timestamp()


@pytest.mark.parametrize("given,end,expected", [
    ("2024-05-03", False, at(2024, 5, 3)),
    ("2024-05-03", True, at(2024, 5, 4)),                       # the whole day
    ("2024-05-03T18:30", False, at(2024, 5, 3, 18, 30)),       # household time
    ("2024-05-03 18:30:15", True, at(2024, 5, 3, 18, 30, 15)),
    ("2024-05-03T18:30Z", False, datetime(2024, 5, 3, 18, 30, tzinfo=UTC).timestamp()),
    ("2024-05-03T18:30+02:00", False,
     datetime(2024, 5, 3, 16, 30, tzinfo=UTC).timestamp()),
    ("2024-12-03T18:30", False, datetime(2024, 12, 3, 18, 30, tzinfo=UTC).timestamp()),
    ("today", False, at(2024, 7, 3)),
    (" Today ", True, at(2024, 7, 4)),
    ("yesterday", False, at(2024, 7, 2)),
    ("yesterday", True, at(2024, 7, 3)),
    ("now", True, NOW),
])
def test_parse_instant(given: str, end: bool, expected: float) -> None:
    assert parse_instant(given, LISBON, end=end, now=NOW) == expected


@pytest.mark.parametrize("given", ["", "last week", "2024-13-01", "03/05/2024", "18:30"])
def test_parse_instant_refuses(given: str) -> None:
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_instant(given, LISBON, now=NOW)


def test_a_date_is_a_day_in_the_household_zone() -> None:
    day = date(2024, 7, 3)
    tokyo = ZoneInfo("Asia/Tokyo")
    assert parse_instant(day.isoformat(), tokyo) == datetime(2024, 7, 2, 15, tzinfo=UTC).timestamp()
