"""Pull injection: a stable memory index, a recall tool and a capped auto-recall.

A channel's ``injection`` (``runtime.config.ChannelSettings``) says how memory
reaches the language model. ``push`` (the default) puts the recalled memories
in the prompt. ``pull`` (ChatCLI's "index" mode) puts in their place:

* a small, **stable index** (:func:`index_text`) right after the persona: the
  portrait's first line, how many facts (by kind) and episodes are kept, and
  the main subjects of the facts. It is built from the store alone, in a fixed
  order, so it is byte-identical from one turn to the next while memory does
  not change (the prompt's start stays cacheable), and bounded
  (:data:`INDEX_MAX_BYTES`);
* the **recall tool** (:data:`RECALL_TOOL`: ``recall(query, limit?)``,
  OpenAI tool calling) the model calls to read memories on demand;
* a **capped auto-recall** (:func:`auto_recall`): the turn's top
  :data:`AUTO_RECALL_ITEMS` recalled memories in a block of at most
  :data:`AUTO_RECALL_BYTES` bytes, placed last in the system message (after
  the date/time line), for a model that skips the tool.

:func:`pull_answer` runs the tool loop: the model asks ``recall(query)``, the answer
goes back as a ``tool`` message, the model answers; at most :data:`MAX_ROUNDS`
rounds of calls (then the model must answer: ``tool_choice = "none"``), at most
:data:`MAX_CALLS_PER_ROUND` calls a round, results of at most
:data:`MAX_RESULT_BYTES` bytes. A call that is not a well-formed recall (an
unknown tool, arguments that are not a JSON object, a query missing or longer
than :data:`MAX_QUERY_CHARS`, a recall that fails) gets an ``error: ...`` tool
message back, never an exception. Every call is returned as a
:class:`~runtime.memories.transcript.ToolCallIn` for the transcript's ``tool_calls``
table, and the memories the tool returned for the reply's citations.

The rounds are whole (non-streamed) completions: on a streamed turn only the
final answer is sent, in one piece. A provider without tools (the offline one)
answers from the auto-recall memories (``LLMRequest.memories``), as on a push
channel.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from runtime.llm.prompt import memory_bullet, memory_section
from runtime.llm.providers import ChatMessage, Completion, LLMRequest, Tool, ToolCall
from runtime.memories.transcript import ToolCallIn
from runtime.store.database import Store

log = logging.getLogger(__name__)

AUTO_RECALL_ITEMS = 3
AUTO_RECALL_BYTES = 700
MAX_ROUNDS = 3
MAX_CALLS_PER_ROUND = 4
MAX_ARGUMENT_CHARS = 2_000
MAX_QUERY_CHARS = 500
DEFAULT_LIMIT = 5
MAX_LIMIT = 8
MAX_RESULT_BYTES = 2_000
MAX_RESULT_LINE_CHARS = 400
INDEX_MAX_BYTES = 1_000
INDEX_SUBJECTS = 8
_SUMMARY_CHARS = 200
_SUBJECT_CHARS = 40
_MIN_CLIPPED_CHARS = 20

TOOL_NAME = "recall"
RECALL_TOOL = Tool(
    name=TOOL_NAME,
    description=("Search your long-term memory of the household (facts, episodes and "
                 "earlier conversations). Returns the best matching memories, each with "
                 "its reference in brackets."),
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": MAX_QUERY_CHARS,
                      "description": "What to remember, in a few words or a question."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                      "description": f"How many memories at most (default {DEFAULT_LIMIT})."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)

INDEX_HEADING = "# Memory index"
INDEX_INSTRUCTION = (
    "Your memories of the household are not listed here. Call the recall tool (a query, "
    "optionally a limit) to read what you remember before relying on it; never invent "
    "memories.")
NO_MATCH = "no memories match this query"


class MemoryLine(Protocol):
    """A recalled memory (``actors.messages.MemoryItem`` fits)."""

    @property
    def ref(self) -> str: ...

    @property
    def text(self) -> str: ...


class SummaryLine(Protocol):
    """A portrait line (``runtime.memories.portrait.PortraitLine`` fits)."""

    @property
    def text(self) -> str: ...


M = TypeVar("M", bound=MemoryLine)


@dataclass(frozen=True)
class Shown:
    """A memory as shown in the auto-recall block (its text may be clipped)."""

    ref: str
    text: str


class ToolError(ValueError):
    """A tool call that cannot be run; its message goes back to the model."""


# -- the stable index --------------------------------------------------------------


# The index when the store cannot be read: the tool still works.
INDEX_FALLBACK = f"{INDEX_HEADING}\n{INDEX_INSTRUCTION}"


def index_text(store: Store, portrait: Sequence[SummaryLine] = ()) -> str:
    """The index for ``store``: at most :data:`INDEX_MAX_BYTES` bytes."""
    lines = [INDEX_HEADING, INDEX_INSTRUCTION]
    summary = next((_clip(p.text, _SUMMARY_CHARS) for p in portrait if p.text.strip()), "")
    if summary:
        lines.append(f"Summary: {summary}")
    kinds = store.rows("SELECT kind, count(*) AS n FROM facts"
                       " WHERE disabled = 0 AND valid_to IS NULL"
                       " GROUP BY kind ORDER BY n DESC, kind")
    facts = sum(int(r["n"]) for r in kinds)
    episodes = int(store.scalar("SELECT count(*) FROM episodes"
                                " WHERE disabled = 0 AND tombstoned_at IS NULL") or 0)
    by_kind = ", ".join(f"{r['kind']} {r['n']}" for r in kinds)
    lines.append(f"Kept: {_count(facts, 'fact')}" + (f" ({by_kind})" if by_kind else "")
                 + f", {_count(episodes, 'episode')}, and the conversations themselves.")
    subjects = store.rows("SELECT subject, count(*) AS n FROM facts"
                          " WHERE disabled = 0 AND valid_to IS NULL AND sensitive = 0"
                          " GROUP BY subject ORDER BY n DESC, subject LIMIT ?",
                          (INDEX_SUBJECTS,))
    names = [s for s in (_clip(r["subject"], _SUBJECT_CHARS) for r in subjects) if s]
    if names:
        lines.append("Main subjects: " + ", ".join(names))
    return _fit("\n".join(lines), INDEX_MAX_BYTES)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


# -- the auto-recall block ---------------------------------------------------------


def auto_recall(memories: Sequence[M]) -> tuple[list[M], list[Shown]]:
    """The turn's top memories (most relevant first) that fit the auto-recall
    block: at most :data:`AUTO_RECALL_ITEMS`, the block (as
    ``prompt.memory_section(..., "pull")`` renders it) at most
    :data:`AUTO_RECALL_BYTES` bytes; a memory too long for the room left is
    clipped, and one that cannot keep :data:`_MIN_CLIPPED_CHARS` characters
    ends the block. Returns the memories shown and how they are shown."""
    used: list[M] = []
    shown: list[Shown] = []
    for memory in memories[:AUTO_RECALL_ITEMS]:
        text = " ".join(memory.text.split())
        if not text:
            continue
        over = _size([*shown, Shown(memory.ref, text)]) - AUTO_RECALL_BYTES
        if over > 0:
            text = _clip_bytes(text, len(text.encode()) - over)
            if len(text) < _MIN_CLIPPED_CHARS:
                break
        used.append(memory)
        shown.append(Shown(memory.ref, text))
    return used, shown


def _size(shown: Sequence[Shown]) -> int:
    return len(memory_section(shown, "pull").encode())


# -- the tool loop -----------------------------------------------------------------


@dataclass
class PullOutcome(Generic[M]):
    """The model's final answer, the memories its recalls returned (first
    seen first, each once) and every tool call it made."""

    completion: Completion
    used: list[M] = field(default_factory=list)
    calls: list[ToolCallIn] = field(default_factory=list)


def pull_answer(request: LLMRequest, complete: Callable[[LLMRequest], Completion],
           recall: Callable[[str, int], Sequence[M]]) -> PullOutcome[M]:
    """Answer ``request`` (which offers :data:`RECALL_TOOL`), running the
    model's recall calls with ``recall(query, limit)`` (see the module
    docstring). Errors of ``complete`` (the language model) propagate."""
    messages = list(request.messages)
    used: dict[str, M] = {}
    calls: list[ToolCallIn] = []
    for round_no in range(MAX_ROUNDS + 1):
        final = round_no == MAX_ROUNDS
        completion = complete(request.model_copy(update={
            "messages": list(messages), "tools": [RECALL_TOOL],
            "tool_choice": "none" if final else "auto"}))
        if not completion.tool_calls or final:
            if completion.tool_calls:
                log.warning("pull: the model kept calling tools after %d rounds", MAX_ROUNDS)
            return PullOutcome(completion, list(used.values()), calls)
        messages.append(ChatMessage(role="assistant", content=completion.text,
                                    tool_calls=completion.tool_calls))
        for i, call in enumerate(completion.tool_calls):
            record, found = run_call(call, i, recall)
            calls.append(record)
            for memory in found:
                used.setdefault(memory.ref, memory)
            messages.append(ChatMessage(role="tool", content=record.result or "",
                                        tool_call_id=call.id))
    raise AssertionError("unreachable")  # the last round always returns


def run_call(call: ToolCall, position: int,
             recall: Callable[[str, int], Sequence[M]]) -> tuple[ToolCallIn, list[M]]:
    """One tool call: its record (name, arguments, the text the model gets
    back) and the memories it returned. Never raises for what the model sent."""
    name = _clip(call.name, 80) or "?"
    try:
        if position >= MAX_CALLS_PER_ROUND:
            raise ToolError(f"too many tool calls at once; at most {MAX_CALLS_PER_ROUND} "
                            f"a round")
        query, limit = recall_arguments(call)
    except ToolError as exc:
        log.info("pull: refused a tool call (%s)", type(exc).__name__)
        return ToolCallIn(name=name, result=f"error: {exc}"), []
    arguments: dict[str, object] = {"query": query, "limit": limit}
    try:
        found = list(recall(query, limit))
    except Exception as exc:  # the model hears it; the turn goes on
        log.warning("pull: recall failed: %s", type(exc).__name__)
        return ToolCallIn(name=name, arguments=arguments,
                          result=f"error: recall is unavailable right now "
                                 f"({type(exc).__name__})"), []
    text, shown = tool_result(found)
    return ToolCallIn(name=name, arguments=arguments, result=text), shown


def recall_arguments(call: ToolCall) -> tuple[str, int]:
    """``(query, limit)`` of a recall call; :class:`ToolError` saying what is wrong.
    A limit above :data:`MAX_LIMIT` is lowered to it."""
    if call.name != TOOL_NAME:
        raise ToolError(f"unknown tool {_clip(call.name, 40)!r}; the only tool is "
                        f"{TOOL_NAME!r}")
    if len(call.arguments) > MAX_ARGUMENT_CHARS:
        raise ToolError(f"arguments longer than {MAX_ARGUMENT_CHARS} characters")
    try:
        args = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError):
        raise ToolError("arguments are not valid JSON; send "
                        '{"query": "...", "limit": 5}') from None
    if not isinstance(args, dict):
        raise ToolError("arguments must be a JSON object with a 'query' string")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("'query' (a non-empty string) is required")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"'query' is longer than {MAX_QUERY_CHARS} characters; "
                        f"ask in a few words")
    limit = args.get("limit", DEFAULT_LIMIT)
    if limit is None:
        limit = DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ToolError(f"'limit' must be an integer from 1 to {MAX_LIMIT}")
    return " ".join(query.split()), min(limit, MAX_LIMIT)


def tool_result(memories: Sequence[M]) -> tuple[str, list[M]]:
    """The recall tool's answer: one ``- [ref] text`` line per memory (each
    clipped to :data:`MAX_RESULT_LINE_CHARS`), as many as fit in
    :data:`MAX_RESULT_BYTES` bytes; and the memories it holds."""
    lines: list[str] = []
    shown: list[M] = []
    size = 0
    for memory in memories:
        line = memory_bullet(Shown(memory.ref, _clip(memory.text, MAX_RESULT_LINE_CHARS)))
        if not line:
            continue
        cost = len(line.encode()) + (1 if lines else 0)
        if size + cost > MAX_RESULT_BYTES:
            break
        lines.append(line)
        shown.append(memory)
        size += cost
    return ("\n".join(lines) if lines else NO_MATCH), shown


# -- text helpers ------------------------------------------------------------------


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _clip_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, an ellipsis included."""
    if len(text.encode()) <= limit:
        return text
    room = max(limit - len("…".encode()), 0)
    return text.encode()[:room].decode("utf-8", errors="ignore").rstrip() + "…"


def _fit(text: str, limit: int) -> str:
    """``text`` cut at a line boundary to at most ``limit`` UTF-8 bytes."""
    if len(text.encode()) <= limit:
        return text
    kept: list[str] = []
    for line in text.split("\n"):
        if len("\n".join([*kept, line]).encode()) > limit:
            break
        kept.append(line)
    return "\n".join(kept)
