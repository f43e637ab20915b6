"""The MCP server at ``/mcp``: Reverie's memory as tools for Home Assistant's MCP
client and other agents.

Streamable HTTP (the Python ``mcp`` SDK, 2.x), stateless and answering in
plain JSON: every POST is a whole exchange, no session lives in the actor, and
both the handshake-era protocol (``initialize``, as Home Assistant's client
speaks it) and the 2026 per-request protocol are served on the same path. The
tools:

* ``recall``: what memory holds about a question or topic;
* ``remember``: keep a fact (as ``reverie remember``, with its ``level``);
* ``forget``: delete one memory by its ref, for good;
* ``timeline``: what was remembered within a time window, oldest first: the
  time in words (``expr``: "last week", as ``GET /v1/timeline?expr=``) or
  bounds (``since``/``until``), read in the household's time zone
  (``household.timezone``);
* ``status``: the runtime's health and counts (as ``reverie status``).

Each result is a short text for the model plus the same answer as structured
content (each tool declares its output schema). A failure is a tool error
(``isError``), never a hang: every backend call runs on a small pool of worker
threads and is given :data:`TOOL_TIMEOUT_S` (Home Assistant gives a tool 10
s); one that has not answered by then is a tool error saying so (a write may
still land). The pool is bounded, so calls stuck in an unresponsive runtime
cannot pile up threads: later calls wait their turn and time out in the same
way.

Who may call: the app's :class:`actors.http.app.Guard` (the bearer token, the
body limit) wraps ``/mcp`` like every other path; it also takes an OAuth access
token (:mod:`actors.http.oauth`, as Home Assistant's MCP client logs in). What a
caller is told follows the privacy tier (:mod:`runtime.memories.privacy`): an
OAuth client is bound to the audience its approver chose, a token of
``[http.tokens]`` to the one its table names (:mod:`actors.http.audience`: the
Guard leaves either in the scope), and ``recall`` and
``timeline`` leave out every memory :func:`~runtime.memories.privacy.may_use`
refuses it (another person's sensitive memories; for a client approved for the
household as a whole, every person's), and ``forget`` answers such a memory as
one that does not exist. The admin bearer token is the
household's administrator: it sees everything. The SDK's own Host/Origin
check is off: the hub is reached by its LAN address and the token already
keeps a rebinding page out.

The SDK is heavy (≈ 0.5 s to import, ≈ 27 MiB of the actor's memory), so
nothing of it is loaded until the first request to ``/mcp``: the app's
lifespan only opens a task group, in which that first request starts the SDK's
session manager (its ``run()`` context lasts until the app shuts down).

Logs never hold memory content, queries or arguments: a failed call is logged
by tool name and exception type only.
"""

from __future__ import annotations

import asyncio
import logging
import time as clock
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actors.http.audience import browse_for, recall_for, view_visible
from actors.http.backend import Backend
from actors.http.oauth import AUDIENCE_KEY
from actors.messages import MAX_TURN_CHARS, BrowseMemories, Recall, Status
from runtime.config import Settings
from runtime.memories.privacy import Audience
from runtime.time.clock import household_zone

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus
    from mcp.server import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp_types import CallToolResult

log = logging.getLogger(__name__)

T = TypeVar("T")

PATH = "/mcp"
TOOL_TIMEOUT_S = 8.0   # Home Assistant waits 10 s for a tool
WORKERS = 4            # backend calls at once; more wait (and time out) in turn
SERVER_NAME = "reverie"
TOOL_NAMES = ("recall", "remember", "forget", "timeline", "status")

INSTRUCTIONS = (
    "Reverie is this household's long-term memory. Before answering anything that "
    "depends on earlier conversations, people, preferences, plans or past events, "
    "call recall. Call remember when the user asks you to remember something or "
    "states a lasting fact worth keeping. Use timeline for questions about a period "
    "('what did we talk about yesterday'). Call forget only when the user asks to "
    "delete a memory.")


# -- the tools' arguments and answers (plain pydantic: the SDK is loaded lazily) --

class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecallArgs(_Args):
    query: str = Field(min_length=1, max_length=MAX_TURN_CHARS,
                       description="What to look for, in plain words, e.g. "
                                   "'when is the boiler serviced' or 'Ana's allergies'.")
    limit: int = Field(default=8, ge=1, le=50, description="At most this many memories.")


class RememberArgs(_Args):
    text: str = Field(min_length=1, max_length=MAX_TURN_CHARS,
                      description="One self-contained statement naming who or what it is "
                                  "about, e.g. 'Ana is allergic to peanuts'.")
    level: Literal["normal", "vivid", "seared"] = Field(
        default="normal", description="How deeply to keep it: vivid never fades below "
                                      "half, seared never fades (only when the user asks).")


class ForgetArgs(_Args):
    ref: str = Field(min_length=1, max_length=100,
                     description="The memory's ref as recall or timeline gave it, "
                                 "e.g. 'fact:12'.")


class TimelineArgs(_Args):
    expr: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="The time in words instead of since/until: 'yesterday', 'last week', "
                    "'in May 2023', 'last summer', 'two weeks ago'. The memories dated in "
                    "that time (a conversation summary by its conversation's date).")
    since: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="Start of the window (when expr is not given): an ISO-8601 date "
                    "(2024-05-03) or date-time (2024-05-03T18:30), or 'today', "
                    "'yesterday', 'now'.")
    until: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="End of the window, in the same forms (default: now); a date "
                    "includes that whole day.")
    limit: int = Field(default=20, ge=1, le=100, description="At most this many memories.")


class StatusArgs(_Args):
    pass


class RecalledMemory(BaseModel):
    ref: str = Field(description="Pass this to forget to delete the memory.")
    kind: str = Field(description="fact, episode (a summary of a conversation) or turn "
                                  "(one line of a conversation).")
    text: str
    when: str = Field(description="When it was written (ISO-8601, the household's time).")
    channel: str | None = None


class RecallAnswer(BaseModel):
    query: str
    memories: list[RecalledMemory] = Field(description="Most relevant first.")
    degraded: bool = Field(description="True when recall could not search everything.")
    reason: str | None = None


class RememberAnswer(BaseModel):
    ref: str
    action: str = Field(description="What memory did with it (e.g. added, updated, unchanged).")


class ForgetAnswer(BaseModel):
    ref: str
    detail: str


class TimelineMemory(RecalledMemory):
    speaker: str | None = None


class TimelineAnswer(BaseModel):
    since: str
    until: str
    memories: list[TimelineMemory] = Field(description="Oldest first.")
    total: int = Field(description="How many memories the window holds in all.")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    args: type[_Args]
    answer: type[BaseModel]
    read_only: bool
    destructive: bool = False


def _tool_specs(zone_name: str) -> list[ToolSpec]:
    return [
        ToolSpec(
            "recall", "Recall memories",
            "Search the household's long-term memory (facts, past conversations and their "
            "summaries) for what is relevant to a question or topic. Use it before answering "
            "anything that depends on what you were told earlier: people, preferences, "
            "plans, routines, past events. Returns the best matches, most relevant first, "
            "each with a ref (such as fact:12) that forget takes.",
            RecallArgs, RecallAnswer, read_only=True),
        ToolSpec(
            "remember", "Remember a fact",
            "Store a fact in long-term memory so it can be recalled later. Use it when the "
            "user asks you to remember something, or states a lasting fact or preference "
            "worth keeping. Write one self-contained statement that names who or what it is "
            "about ('The boiler is serviced every March', not 'it is in March'). Returns the "
            "stored memory's ref.",
            RememberArgs, RememberAnswer, read_only=False),
        ToolSpec(
            "forget", "Forget a memory",
            "Delete one memory for good, by the ref recall or timeline gave (such as "
            "fact:12). Use it only when the user asks to forget or delete something; it "
            "cannot be undone.",
            ForgetArgs, ForgetAnswer, read_only=False, destructive=True),
        ToolSpec(
            "timeline", "Memories of a time window",
            "List what was remembered (facts, conversation lines and conversation summaries) "
            "within a time window, oldest first. Use it for questions about a period, such "
            "as 'what did we talk about yesterday' or 'what happened last week': pass the "
            "time in words as expr, or exact bounds as since/until. Dates and "
            "times without an offset are read in the household's time zone "
            f"({zone_name}).",
            TimelineArgs, TimelineAnswer, read_only=True),
        ToolSpec(
            "status", "Memory runtime status",
            "Tell whether Reverie's memory runtime is healthy: which of its parts are up, "
            "how many memories of each kind it holds, and any notice. Use it when the user "
            "asks about the memory system or when the other memory tools fail.",
            StatusArgs, Status, read_only=True),
    ]


# -- failures a tool reports ------------------------------------------------------

class ToolFailure(Exception):
    """A tool's answer is an error the model should read (an ``isError`` result)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _invalid(name: str, exc: ValidationError) -> str:
    """What was wrong with the arguments: field and reason, never the values."""
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{field}: {error['msg']}")
    return f"invalid arguments for {name}: " + "; ".join(problems)


# -- times in the household's zone ---------------------------------------------------

def _midnight(day: date, zone: tzinfo) -> float:
    return datetime.combine(day, time(0), tzinfo=zone).timestamp()


def parse_instant(text: str, zone: tzinfo, *, end: bool = False,
                  now: float | None = None) -> float:
    """Seconds since the epoch for ``text``: an ISO-8601 date or date-time (one
    without an offset is in ``zone``), ``today``, ``yesterday`` or ``now``. A day
    (a date, ``today``, ``yesterday``) starts the window, or with ``end`` closes
    it after its last second. ValueError, saying what is expected, otherwise."""
    at = clock.time() if now is None else now
    word = text.strip().lower()
    if word == "now":
        return at
    day: date | None = None
    if word in ("today", "yesterday"):
        day = datetime.fromtimestamp(at, tz=zone).date()
        if word == "yesterday":
            day -= timedelta(days=1)
    else:
        try:
            day = date.fromisoformat(word)
        except ValueError:
            try:
                moment = datetime.fromisoformat(text.strip())
            except ValueError:
                raise ValueError(
                    f"{text!r} is not an ISO-8601 date or date-time (expected e.g. "
                    "2024-05-03 or 2024-05-03T18:30, or today, yesterday, now)") from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=zone)
            return moment.timestamp()
    return _midnight(day + timedelta(days=1), zone) if end else _midnight(day, zone)


def _when(stamp: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(stamp, tz=zone).isoformat(timespec="minutes")


def _short(stamp: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(stamp, tz=zone).strftime("%Y-%m-%d %H:%M")


# -- the tools -----------------------------------------------------------------------

class Tools:
    """The five tools over a backend, each call bounded by ``timeout_s``."""

    def __init__(self, settings: Settings, backend: Backend,
                 timeout_s: float = TOOL_TIMEOUT_S, workers: int = WORKERS) -> None:
        self.backend = backend
        self.zone_name = settings.household.timezone or "the system's zone"
        self.zone = household_zone(settings.household.timezone)
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mcp-tool")
        self.specs = {spec.name: spec for spec in _tool_specs(self.zone_name)}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, name: str, fn: Callable[[], T], writes: bool = False,
                    label: str = "") -> T:
        """``fn()`` on the pool; ToolFailure (its text starting with ``label``, by
        default ``name``) if it fails or has not answered in time (a queued call
        that never started is dropped). Logs name only: never arguments."""
        label = label or name
        future = asyncio.wrap_future(self.pool.submit(fn))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            log.warning("mcp: %s: the runtime did not answer within %g s", name,
                        self.timeout_s)
            maybe = " The change may still be applied." if writes else ""
            raise ToolFailure(
                f"{label}: Reverie's memory did not answer within {self.timeout_s:g} s (it may "
                f"be busy or restarting); try again in a moment.{maybe}") from None
        except NotImplementedError:
            raise ToolFailure(f"{name} is not available in this version of Reverie") from None
        except ValueError as exc:  # BadRequest from an actor, a bad ref, a refused message
            raise ToolFailure(f"{label}: {_first_line(exc)}") from None
        except Exception as exc:
            log.warning("mcp: %s failed: %s", name, type(exc).__name__)
            raise ToolFailure(
                f"{label}: Reverie's memory could not answer ({type(exc).__name__}); the "
                "status tool tells which part is down") from None

    async def run(self, name: str, arguments: dict[str, Any],
                  who: Audience | None = None) -> tuple[str, BaseModel]:
        """The tool's text and structured answer; ToolFailure for the model to read.
        ``who``: the caller's audience (None: the admin token, everything)."""
        spec = self.specs.get(name)
        if spec is None:
            raise ToolFailure(f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
        try:
            args = spec.args.model_validate(arguments)
        except ValidationError as exc:
            log.info("mcp: %s: rejected arguments (%s)", name,
                     ", ".join(sorted({str(e["loc"][0]) if e["loc"] else "-"
                                       for e in exc.errors()})))
            raise ToolFailure(_invalid(name, exc)) from None
        handler: Callable[[Any, Audience | None], Any] = getattr(self, f"_{name}")
        text, answer = await handler(args, who)
        return text, answer

    async def _recall(self, args: RecallArgs,
                      who: Audience | None = None) -> tuple[str, RecallAnswer]:
        found = await self._call("recall", lambda: self.backend.recall(
            Recall(query=args.query, max_items=args.limit)) if who is None else recall_for(
            self.backend, Recall(query=args.query, max_items=args.limit), who))
        items = found.items[:args.limit]
        memories = [RecalledMemory(ref=i.ref, kind=i.kind, text=i.text,
                                   when=_when(i.created_at, self.zone), channel=i.channel)
                    for i in items]
        answer = RecallAnswer(query=args.query, memories=memories, degraded=found.degraded,
                              reason=found.reason)
        if memories:
            lines = [f"{len(memories)} memor{'y' if len(memories) == 1 else 'ies'} "
                     f"for {args.query!r}, most relevant first:"]
            lines += [f"- [{m.ref}, {_short(i.created_at, self.zone)}] {m.text}"
                      for m, i in zip(memories, items, strict=True)]
        else:
            lines = [f"Nothing in memory matches {args.query!r}."]
        if found.degraded:
            lines.append(f"(Recall was degraded: {found.reason or 'not everything was searched'}.)")
        return "\n".join(lines), answer

    async def _remember(self, args: RememberArgs,
                        who: Audience | None = None) -> tuple[str, RememberAnswer]:
        ref, action = await self._call(
            "remember", lambda: self.backend.remember(args.text, args.level), writes=True)
        return f"Remembered as {ref} ({action}).", RememberAnswer(ref=ref, action=action)

    async def _forget(self, args: ForgetArgs,
                      who: Audience | None = None) -> tuple[str, ForgetAnswer]:
        ref = args.ref.strip()
        if who is not None:  # an OAuth client forgets only what it may be told
            seen = await self._call("forget", lambda: self.backend.get(ref),
                                    label=f"forget {ref}")
            if not view_visible(who, seen):
                # the answer for a memory that does not exist: nothing told of it
                raise ToolFailure(f"forget {ref}: no {seen.kind} {seen.item_id}")
        detail = await self._call("forget", lambda: self.backend.change(ref, "delete"),
                                  writes=True, label=f"forget {ref}")
        return f"Forgot {ref}: {detail}.", ForgetAnswer(ref=ref, detail=detail)

    def _window(self, args: TimelineArgs) -> tuple[float, float, bool]:
        """``[since, until)`` of a timeline call, and whether memories are placed
        by the time they tell of (``expr``, as ``GET /v1/timeline?expr=``) rather
        than by when they were written."""
        from runtime.recall import timeline as timelines
        from runtime.time.clock import SystemClock

        if args.expr is not None:
            if args.since is not None or args.until is not None:
                raise ToolFailure("timeline: give either expr or since/until, not both")
            try:
                span = timelines.span_of(args.expr, SystemClock(), self.zone)
            except ValueError as exc:
                raise ToolFailure(f"timeline: expr: {exc}") from None
            return span.start, span.end, True
        if args.since is None:
            raise ToolFailure("timeline: give expr (such as 'last week') or since")
        now = clock.time()
        try:
            since = parse_instant(args.since, self.zone, now=now)
            until = parse_instant(args.until or "now", self.zone, end=True, now=now)
        except ValueError as exc:
            raise ToolFailure(f"timeline: {exc}") from None
        if until <= since:
            raise ToolFailure("timeline: until must come after since")
        return since, until, False

    async def _timeline(self, args: TimelineArgs,
                        who: Audience | None = None) -> tuple[str, TimelineAnswer]:
        since, until, dated = self._window(args)
        asked = BrowseMemories(since=since, until=until, oldest_first=True,
                               include_disabled=False, dated=dated, limit=args.limit)
        page = await self._call("timeline", lambda: self.backend.browse(asked)
                                if who is None else browse_for(self.backend, asked, who))
        items = page.items[:args.limit]
        memories = [TimelineMemory(ref=v.ref, kind=v.kind, text=v.text,
                                   when=_when(v.created_at, self.zone), channel=v.channel,
                                   speaker=v.speaker) for v in items]
        answer = TimelineAnswer(since=_when(since, self.zone), until=_when(until, self.zone),
                                memories=memories, total=page.total)
        window = f"{_short(since, self.zone)} to {_short(until, self.zone)}"
        if not memories:
            return f"Nothing was remembered from {window}.", answer
        more = (f" (the first {len(memories)} of {page.total}; narrow the window or raise "
                "limit for more)") if page.total > len(memories) else ""
        lines = [f"{len(memories)} memor{'y' if len(memories) == 1 else 'ies'} from "
                 f"{window}, oldest first{more}:"]
        for m, v in zip(memories, items, strict=True):
            said = f" {m.speaker}:" if m.speaker else ""
            lines.append(f"- [{m.ref}, {_short(v.created_at, self.zone)}]{said} {m.text}")
        return "\n".join(lines), answer

    async def _status(self, args: StatusArgs,
                      who: Audience | None = None) -> tuple[str, Status]:
        status = await self._call("status", self.backend.status)
        down = {name: state for name, state in status.actors.items() if state != "ok"}
        lines = [f"Reverie ({status.namespace}): "
                 + (f"all {len(status.actors)} parts up." if not down else
                    f"{len(status.actors) - len(down)} of {len(status.actors)} parts up; "
                    + "; ".join(f"{name} {state}" for name, state in down.items()) + ".")]
        if status.counts:
            lines.append("Memories: " + ", ".join(f"{kind} {n}"
                                                  for kind, n in status.counts.items()) + ".")
        if status.notice:
            lines.append(f"Notice: {status.notice}")
        return "\n".join(lines), status


# -- the MCP server (the SDK, loaded on first use) ---------------------------------

def build_server(tools: Tools) -> Server[Any]:
    """The SDK's low-level server over ``tools`` (schemas from the pydantic models)."""
    from mcp.server import Server, ServerRequestContext
    from mcp_types import (
        CallToolRequestParams,
        ListToolsResult,
        PaginatedRequestParams,
        TextContent,
        Tool,
        ToolAnnotations,
    )
    from mcp_types import CallToolResult as Result

    listed = [
        Tool(name=spec.name, title=spec.title, description=spec.description,
             input_schema=spec.args.model_json_schema(),
             output_schema=spec.answer.model_json_schema(mode="serialization"),
             annotations=ToolAnnotations(title=spec.title, read_only_hint=spec.read_only,
                                         destructive_hint=spec.destructive,
                                         idempotent_hint=spec.read_only or spec.destructive,
                                         open_world_hint=False))
        for spec in tools.specs.values()
    ]
    schemas = {tool.name: tool.input_schema for tool in listed}

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: CallToolRequestParams) -> CallToolResult:
        try:
            scope = getattr(ctx.request, "scope", None) or {}
            who = scope.get(AUDIENCE_KEY)  # an OAuth client's; none: the admin token
            text, answer = await tools.run(params.name, params.arguments or {},
                                           who if isinstance(who, Audience) else None)
        except ToolFailure as exc:
            return Result(content=[TextContent(text=str(exc))], is_error=True)
        return Result(content=[TextContent(text=text)],
                      structured_content=answer.model_dump(mode="json"))

    return Server(SERVER_NAME, version="1", title="Reverie memory",
                  instructions=INSTRUCTIONS, get_tool_input_schema=schemas.get,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def session_manager(server: Server[Any], max_body_bytes: int) -> StreamableHTTPSessionManager:
    """Stateless, JSON answers; the Host/Origin check off (the Guard's token is the gate)."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    return StreamableHTTPSessionManager(
        app=server, json_response=True, stateless=True,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=max_body_bytes)


def _refuse(status: int, message: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "mcp_unavailable"}},
                        status_code=status)


class McpEndpoint:
    """The ASGI app at ``/mcp``. :meth:`lifespan` (merged into the app's) opens the
    task group in which the first request starts the SDK's session manager."""

    def __init__(self, settings: Settings, backend: Backend,
                 timeout_s: float = TOOL_TIMEOUT_S) -> None:
        self.settings = settings
        self.backend = backend
        self.timeout_s = timeout_s
        self._group: TaskGroup | None = None
        self._lock: anyio.Lock | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._tools: Tools | None = None

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            self._group = group
            self._lock = anyio.Lock()
            try:
                yield
            finally:
                self._group = None
                self._manager = None
                group.cancel_scope.cancel()
                if self._tools is not None:
                    self._tools.close()
                    self._tools = None

    def _build(self) -> Server[Any]:
        """The tools and the SDK's server (importing the SDK: run in a thread)."""
        tools = Tools(self.settings, self.backend, self.timeout_s)
        self._tools = tools
        return build_server(tools)

    async def _serve(self, manager: StreamableHTTPSessionManager, *,
                     task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with manager.run():
            task_status.started()
            await anyio.sleep_forever()

    async def _started(self) -> StreamableHTTPSessionManager | None:
        if self._manager is not None or self._lock is None:
            return self._manager
        async with self._lock:
            group = self._group
            if self._manager is None and group is not None:
                server = await anyio.to_thread.run_sync(self._build)  # the import: ≈ 0.5 s
                manager = session_manager(server, self.settings.http.max_body_bytes)
                await group.start(self._serve, manager)
                self._manager = manager
                log.info("mcp: serving %s", PATH)
        return self._manager

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        manager = await self._started()
        if manager is None:  # the app was not started with its lifespan
            await _refuse(503, "the MCP server is not running")(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)


def install(app: Any, settings: Settings, backend: Backend) -> None:
    """Serve MCP at exactly ``/mcp`` (no redirect to ``/mcp/``), behind the app's Guard."""
    from fastapi import APIRouter

    endpoint = McpEndpoint(settings, backend)
    app.router.add_route(PATH, endpoint, include_in_schema=False)  # an ASGI app: every method
    app.include_router(APIRouter(lifespan=endpoint.lifespan))       # merges the lifespans
