"""OpenAI's Responses API: ``POST /v1/responses`` (streamed or not, with
function tools), on the memory layer (``actors.http.layer``, which says what
the layer does; this module only converts the wire format).

The request, mapped onto the layer as ``/v1/chat/completions`` maps its own:

- ``instructions`` is the client's system prompt (kept, Reverie's memory
  added after it); leading ``system``/``developer`` messages of ``input``
  join it.
- ``input``: a string (one user message), or a list of input items:
  messages (``{"role", "content"}``, with or without ``"type": "message"``;
  content a string or ``input_text`` / ``output_text`` parts), ``function_call``
  items (``call_id``, ``name``, ``arguments``: the model's calls, the ones in a
  row one assistant message) and ``function_call_output`` items (``call_id``,
  ``output``: the client's results). The last user message is the turn;
  what comes before it the history, what comes after it (calls and results)
  continues the turn: no second recall, and the same input sent again writes
  nothing (the layer's request id). Images, files and audio parts and
  ``reasoning`` items are dropped with a log line; an ``item_reference`` (a
  stored item) and any other item type are a 400 naming it.
- ``tools``: function tools only (``{"type": "function", "name",
  "description", "parameters"}``; ``strict`` is not sent upstream, with a log
  line); any other tool type is a 400 naming it.
- ``temperature``, ``top_p``, ``parallel_tool_calls`` go upstream as they
  are; ``max_output_tokens`` as ``max_tokens``; ``tool_choice`` in
  chat-completions form; ``text.format`` as ``response_format``;
  ``reasoning.effort`` as ``reasoning_effort``. Other fields are dropped with
  the layer's log line; ``metadata`` is echoed back.
- The channel is the ``X-Reverie-Channel`` header (default ``chat``), the
  speaker the ``X-Reverie-Speaker`` header or else ``user``; ``model`` as for
  chat completions (``actors.http.openai.Models``).

Stateless: nothing of a response is kept for later (the turn and the reply
are in the transcript, as for every turn). ``previous_response_id``,
``conversation``, ``background`` and ``prompt`` need kept state, and are a
400 naming the field; send the whole input instead. ``store`` is accepted
and not honoured (a log line when it is true; ``GET /v1/responses/{id}`` is
not served).

The answer is a ``response`` object: ``output`` holds a ``message`` with
``output_text`` content (when there is text, or nothing else) and a
``function_call`` item per call of the client's tools (``call_id``, ``name``,
``arguments`` as JSON text); ``output_text``, ``status`` ``completed``,
``usage`` (zeros: the upstream's count is not kept), and the extension block
``reverie`` (``citations``, ``provider``, ``turn_id``, ``reply_id``,
``notice``) as on chat completions.

Streamed (``"stream": true``), server-sent events as OpenAI sends them:
``response.created``, ``response.in_progress``, then for the message
``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` per piece, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each
function call ``response.output_item.added``,
``response.function_call_arguments.delta`` and ``.done``,
``response.output_item.done``; then ``response.completed`` with the whole
response (``reverie`` in it). A turn that breaks half-way ends with
``response.failed``. Errors found before the first piece are plain HTTP
errors.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from itertools import count
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actors.http.backend import Backend
from actors.http.layer import LayerError, arguments_text, client_turn, invalid
from actors.http.openai import Models, extension, first_and_rest
from actors.messages import (
    MAX_CLIENT_MESSAGES,
    MAX_CLIENT_TOOLS,
    ClientMessage,
    ClientTool,
    ClientToolCall,
    TurnDelta,
    TurnReply,
)
from runtime.config import Settings

log = logging.getLogger(__name__)

# Fields that need state this server does not keep: refused, by name.
STATEFUL = ("previous_response_id", "conversation", "background", "prompt")
# Parts of a message's content that carry no text: dropped, with a log line.
NOT_TEXT = frozenset({"input_file", "input_audio", "refusal"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})

Role = Literal["system", "user", "assistant"]
ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user",
                          "assistant": "assistant"}


class ResponsesRequest(BaseModel):
    """OpenAI's Responses request; fields Reverie does not use are accepted
    (and dropped with a log line), those that need kept state refused."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_CLIENT_MESSAGES)]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_CLIENT_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    user: str | None = Field(default=None, max_length=200)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class Refused(LayerError):
    """A request this server does not take; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": None}}, status_code=status)


# -- the request onto the layer ---------------------------------------------------

def refuse_stateful(body: ResponsesRequest) -> None:
    """:class:`Refused` for a field that needs a response or conversation kept."""
    extra = body.model_extra or {}
    for name in STATEFUL:
        if extra.get(name) not in (None, False):
            raise Refused(f"{name} is not supported: this server keeps no responses or "
                          "conversations; send the whole conversation in input", name)


def content_text(content: Any, where: str) -> str:
    """The text of a message's content: a string, or a list of parts (the
    text ones joined; images are :func:`images_of`'s, files, audio and
    refusals are dropped)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Refused(f"{where}.content: a string or a list of parts", where)
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image":
            continue  # images_of
        elif kind in NOT_TEXT:
            log.info("responses: a %s part left out (text only)", kind)
        else:
            raise Refused(f"{where}.content[{j}]: a part of type {str(kind)[:40]!r} is "
                          "not supported (input_text, output_text, input_image)",
                          f"{where}.content")
    return "".join(texts)


def images_of(content: Any, where: str) -> list[str]:
    """The URLs of a message's ``input_image`` parts (``image_url``); one sent
    by ``file_id`` is left out, with a log line (this server keeps no files)."""
    urls: list[str] = []
    for j, part in enumerate(content if isinstance(content, list) else []):
        if not isinstance(part, dict) or part.get("type") != "input_image":
            continue
        url = part.get("image_url")
        if url is None and part.get("file_id") is not None:
            log.info("responses: an input_image by file_id left out (no files kept here)")
            continue
        if not isinstance(url, str) or not url.startswith(("data:image/", "https://",
                                                           "http://")):
            raise Refused(f"{where}.content[{j}]: input_image needs an image_url: a "
                          "data:image/ or http(s) URL", f"{where}.content")
        urls.append(url)
    return urls


def output_text_of(output: Any, where: str) -> str:
    """A function call's output: a string, or a list of parts."""
    return content_text(output, where) if output is not None else ""


def client_messages(instructions: str | None, given: str | list[dict[str, Any]]
                    ) -> list[ClientMessage]:
    """``instructions`` and ``input`` as the layer takes them (see the module
    docstring). :class:`Refused` for an item this server does not take."""
    messages: list[dict[str, Any]] = []
    called: set[str] = set()  # the call_ids of the function calls so far
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return [ClientMessage(**m) for m in messages]
    for i, item in enumerate(given):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(str(item.get("role")))
            if role is None:
                raise Refused(f"{where}.role: user, assistant, system or developer", where)
            messages.append({"role": role, "content": content_text(item.get("content"), where),
                             "images": images_of(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise Refused(f"{where}: a function_call needs a call_id and a name", where)
            call = {"id": call_id, "name": name,
                    "arguments": arguments_text(item.get("arguments"))}
            called.add(call_id)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the same response's
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise Refused(f"{where}: a function_call_output needs a call_id", where)
            if call_id not in called:
                raise Refused(f"{where}: no function_call with this call_id comes before "
                              "it in input", where)
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": output_text_of(item.get("output"), where)})
        elif kind == "reasoning":
            log.info("responses: a reasoning item left out")
        elif kind == "item_reference":
            raise Refused(f"{where}: item_reference is not supported: this server keeps "
                          "no items; send the item itself", where)
        else:
            raise Refused(f"{where}: an item of type {str(kind)[:40]!r} is not supported "
                          "(message, function_call, function_call_output)", where)
    return [ClientMessage(**m) for m in messages]


def client_tools(tools: list[dict[str, Any]] | None) -> list[ClientTool]:
    """The Responses API's function tools as the layer takes them."""
    out: list[ClientTool] = []
    if any(t.get("strict") for t in tools or []):
        log.info("responses: the tools' strict is not sent upstream")
    for i, tool in enumerate(tools or []):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise Refused(f"tools[{i}]: only function tools, each with a name, are "
                          f"supported (not {str(tool.get('type'))[:40]!r})", f"tools[{i}]")
        description, parameters = tool.get("description"), tool.get("parameters")
        out.append(ClientTool(
            name=tool["name"], description=description if isinstance(description, str) else "",
            parameters=parameters if isinstance(parameters, dict) else {}))
    return out


def upstream_fields(body: ResponsesRequest) -> dict[str, Any]:
    """The request's fields under their chat-completions names (the layer sends
    those of ``layer.UPSTREAM_FIELDS`` upstream and logs the others)."""
    fields: dict[str, Any] = {k: v for k, v in (body.model_extra or {}).items()
                              if k not in STATEFUL}
    fields.update(temperature=body.temperature, top_p=body.top_p,
                  max_tokens=body.max_output_tokens,
                  parallel_tool_calls=body.parallel_tool_calls,
                  tool_choice=tool_choice(body.tool_choice))
    text = dict(body.text or {})
    if "format" in text:
        fields["response_format"] = response_format(text.pop("format"))
    fields.update({f"text.{k}": v for k, v in text.items()})
    reasoning = dict(body.reasoning or {})
    fields["reasoning_effort"] = reasoning.pop("effort", None)
    fields.update({f"reasoning.{k}": v for k, v in reasoning.items()})
    return fields


def tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``tool_choice`` in chat-completions form."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Refused("tool_choice: auto, none, required or {\"type\": \"function\", "
                  "\"name\": ...}", "tool_choice")


def response_format(given: Any) -> dict[str, Any]:
    """``text.format`` as chat completions' ``response_format``."""
    kind = given.get("type") if isinstance(given, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema" and isinstance(given, dict):
        schema = {k: given[k] for k in ("name", "schema", "description", "strict")
                  if k in given}
        return {"type": "json_schema", "json_schema": schema}
    raise Refused("text.format: text, json_object or json_schema", "text.format")


# -- the reply as a response -----------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [text_part(text)]}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ClientToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status == "completed" else "", "status": status}


def usage() -> dict[str, Any]:
    """Token counts: zeros (the upstream's count is not kept with the turn)."""
    return {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


class Shell:
    """What every response object of one request says, whatever its status."""

    def __init__(self, body: ResponsesRequest) -> None:
        self.id = new_id("resp")
        self.created = int(time.time())
        self.body = body

    def response(self, status: str, output: list[dict[str, Any]],
                 reply: TurnReply | None = None,
                 failure: str | None = None) -> dict[str, Any]:
        body = self.body
        done = status == "completed"
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "completed_at": int(time.time()) if done else None, "status": status,
            "error": None if failure is None else {"code": "server_error", "message": failure},
            "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "model": body.model,
            "output": output,
            "output_text": "".join(p["text"] for i in output if i["type"] == "message"
                                   for p in i["content"]),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": body.reasoning,
            "temperature": body.temperature, "top_p": body.top_p,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "truncation": "disabled", "usage": usage() if done else None,
            "user": body.user, "metadata": body.metadata or {},
        }
        if reply is not None:
            out["reverie"] = extension(reply)
        return out


def output_of(reply: TurnReply) -> list[dict[str, Any]]:
    """The reply's output items: its text as a message (when there is text, or
    nothing else), then a function call per call of the client's tools."""
    items: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        items.append(message_item(new_id("msg"), reply.text))
    items.extend(call_item(new_id("fc"), c) for c in reply.tool_calls)
    return items


def stream_events(first: TurnDelta | TurnReply, rest: Iterator[TurnDelta | TurnReply],
            shell: Shell) -> Iterator[bytes]:
    """The SSE body (see the module docstring)."""
    numbers = count()

    def event(kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": next(numbers), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    output: list[dict[str, Any]] = []
    yield event("response.created", response=shell.response("in_progress", []))
    yield event("response.in_progress", response=shell.response("in_progress", []))
    message_id = new_id("msg")
    at = {"item_id": message_id, "output_index": 0}
    pieces: list[str] = []

    def open_message() -> Iterator[bytes]:
        yield event("response.output_item.added", output_index=0,
                    item=message_item(message_id, "", "in_progress"))
        yield event("response.content_part.added", content_index=0, part=text_part(""), **at)

    item = first
    while not isinstance(item, TurnReply):
        if item.text:
            if not pieces:
                yield from open_message()
            pieces.append(item.text)
            yield event("response.output_text.delta", content_index=0, delta=item.text,
                        logprobs=[], **at)
        try:
            item = next(rest)
        except Exception as exc:  # StopIteration: the actor ended without its reply
            why = "ended without its reply" if isinstance(exc, StopIteration) \
                else f"failed half-way ({type(exc).__name__})"
            log.warning("a streamed response %s", why)
            if pieces:
                output.append(message_item(message_id, "".join(pieces), "incomplete"))
            yield event("response.failed", response=shell.response(
                "failed", output, failure=f"the turn {why}; see `reverie status`"))
            return
    reply = item
    if pieces or not reply.tool_calls:
        if not pieces:
            yield from open_message()
        text = "".join(pieces)
        yield event("response.output_text.done", content_index=0, text=text, logprobs=[], **at)
        yield event("response.content_part.done", content_index=0, part=text_part(text), **at)
        output.append(message_item(message_id, text))
        yield event("response.output_item.done", output_index=0, item=output[-1])
    for call in reply.tool_calls:
        index, call_id = len(output), new_id("fc")
        where = {"item_id": call_id, "output_index": index}
        yield event("response.output_item.added", output_index=index,
                    item=call_item(call_id, call, "in_progress"))
        yield event("response.function_call_arguments.delta", delta=call.arguments, **where)
        yield event("response.function_call_arguments.done", arguments=call.arguments,
                    name=call.name, **where)
        output.append(call_item(call_id, call))
        yield event("response.output_item.done", output_index=index, item=output[-1])
    yield event("response.completed", response=shell.response("completed", output, reply))


# -- the route ---------------------------------------------------------------------------

def install(app: FastAPI, settings: Settings, backend: Backend) -> None:
    models = Models(settings)

    @app.post("/v1/responses", tags=["openai"], response_model=None)
    def create_response(body: ResponsesRequest,
                        x_reverie_speaker: str | None = Header(default=None, max_length=200),
                        x_reverie_channel: str = Header(default="chat", min_length=1,
                                                        max_length=200),
                        ) -> JSONResponse | StreamingResponse | dict[str, Any]:
        """OpenAI's Responses API on the memory layer: ``instructions`` and
        ``input`` as the client's conversation, function ``tools``; streamed as
        server-sent events with ``"stream": true``. Stateless:
        ``previous_response_id`` is refused. Extension: ``reverie``."""
        try:
            upstream = models.upstream(body.model)
        except KeyError:
            return error(404, f"model {body.model!r} is not served here; see /v1/models",
                         "model_not_found", "model")
        try:
            refuse_stateful(body)
            if body.store:
                log.info("responses: store is not honoured (no response is kept for later)")
            turn = client_turn(settings, channel=x_reverie_channel,
                               speaker=x_reverie_speaker or body.user, model=upstream,
                               messages=client_messages(body.instructions, body.input),
                               tools=client_tools(body.tools), fields=upstream_fields(body))
        except Refused as exc:
            return error(400, str(exc), "invalid_request_error", exc.param)
        except LayerError as exc:
            return error(400, str(exc), "invalid_request_error", "input")
        except ValidationError as exc:
            return error(400, invalid(exc), "invalid_request_error", "input")
        shell = Shell(body)
        if not body.stream:
            reply = backend.turn(turn)
            return shell.response("completed", output_of(reply), reply)
        first, rest = first_and_rest(backend.turn_stream(turn))
        return StreamingResponse(stream_events(first, rest, shell), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})
