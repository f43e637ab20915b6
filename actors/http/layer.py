"""The memory layer: a chat client's own conversation through Reverie's turn.

What Home Assistant's conversation agents (its Ollama integration, Extended
OpenAI Conversation) send is a whole conversation: their own system prompt
(the house's instructions, the states of the exposed devices), the
conversation so far, ``tools`` (HassTurnOn, HassLightSet, ...), and after the
model called a tool, the tool's result. The layer keeps all of it and adds
Reverie's memory; the protocol modules (``actors.http.openai``, and
``actors.http.ollama``) only convert their wire format to and from what is
here:

- :func:`client_turn` makes the :class:`~actors.messages.UserTurn` of a
  request: the last user message is the turn's text; the leading system
  messages are the client's system prompt (kept as they are at the start of
  the system message, Reverie's memory added after it:
  ``runtime.llm.prompt.build_messages``); the messages before the last user
  message are the history (none sent: the channel's transcript is the
  history); those after it (the model's calls of the client's tools and
  their results) continue the turn; the tools and the request fields of
  :data:`UPSTREAM_FIELDS` go to the upstream model, and so do images (to a
  provider marked ``vision``; others get the text alone, and a log line says
  so). Images are never stored: the transcript keeps the text.
- The turn's request id is derived from the conversation up to its last user
  message (:func:`conversation_id`): a request sent again is answered with
  the stored reply (the Turns actor's re-sent-turn path) and writes nothing,
  and a request bringing tool results belongs to the turn that called the
  tools. So each request writes only what is new: the last user message, once,
  and the reply once it is text (the tool calls and their results kept with
  it, in the transcript's ``tool_calls``). A client that starts a new
  conversation with the very same system prompt and first message gets the
  stored reply; Home Assistant's system prompt carries the current time, so
  its conversations never meet this.
- The Turns actor keeps a turn whose model called the client's tools open
  (``actors.turns.TurnsActor._keep_open``): the results continue it upstream
  with the same memory context, no second recall (after a restart, the turn
  is recalled for again, and says so in the log).
- A channel with ``passthrough = false`` (``runtime.config.ChannelSettings``)
  opts out: only the last user message is used, the transcript is the history
  and the client's system prompt, tools and fields are ignored, as before.

Nothing here logs what a message says: only field names, counts and roles.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from actors.messages import ClientMessage, ClientTool, Conversation, UserTurn
from runtime.config import Settings

log = logging.getLogger(__name__)

# The request fields a client may send on to the upstream (the OpenAI
# chat-completions names; ``runtime.llm.providers.LLMRequest.options``).
UPSTREAM_FIELDS = frozenset({
    "response_format", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "frequency_penalty", "presence_penalty", "seed", "stop", "tool_choice",
    "parallel_tool_calls", "reasoning_effort", "logit_bias",
})
REQUEST_ID_PREFIX = "layer-"


class LayerError(ValueError):
    """A request the layer cannot take; the text says why (never its content)."""


def passthrough(settings: Settings, channel: str) -> bool:
    """Whether ``channel`` uses the layer (an unknown channel does: the Turns
    actor refuses it with the list of channels)."""
    found = settings.channels.get(channel)
    return found is None or found.passthrough


def conversation_id(channel: str, speaker: str | None,
                    messages: Sequence[ClientMessage]) -> str:
    """The request id of a turn: the conversation up to and including its last
    user message, its channel and speaker, hashed."""
    said = [[m.role, m.content, m.tool_call_id,
             [[c.id, c.name, c.arguments] for c in m.tool_calls]] for m in messages]
    digest = hashlib.sha256(json.dumps([channel, speaker, said]).encode()).hexdigest()
    return REQUEST_ID_PREFIX + digest[:48]


def client_turn(settings: Settings, *, channel: str, speaker: str | None, model: str | None,
                messages: Sequence[ClientMessage], tools: Sequence[ClientTool] = (),
                fields: dict[str, Any] | None = None) -> UserTurn:
    """The turn of a chat request (see the module docstring). :class:`LayerError`
    when there is no user message with text."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None or not messages[last].content.strip():
        raise LayerError("messages: no user message with text")
    text = messages[last].content
    if not passthrough(settings, channel):
        return UserTurn(channel=channel, text=text, model=model, speaker=speaker)
    try:
        return _layered(channel, speaker, model, messages, last, tools, fields or {})
    except ValidationError as exc:
        raise LayerError(invalid(exc)) from None


def _layered(channel: str, speaker: str | None, model: str | None,
             messages: Sequence[ClientMessage], last: int, tools: Sequence[ClientTool],
             fields: dict[str, Any]) -> UserTurn:
    lead = 0
    while lead < last and messages[lead].role == "system":
        lead += 1
    options = {k: v for k, v in fields.items() if k in UPSTREAM_FIELDS and v is not None}
    dropped = sorted(k for k, v in fields.items() if k not in UPSTREAM_FIELDS and v is not None)
    if dropped:
        log.info("memory layer: not sent upstream: %s", ", ".join(dropped))
    conversation = Conversation(
        system="\n\n".join(m.content for m in messages[:lead]),
        history=list(messages[lead:last]), continuation=list(messages[last + 1:]),
        tools=list(tools), options=options, images=list(messages[last].images))
    return UserTurn(channel=channel, text=messages[last].content, model=model, speaker=speaker,
                    request_id=conversation_id(channel, speaker, messages[:last + 1]),
                    conversation=conversation)


def invalid(exc: ValidationError) -> str:
    """What is wrong, by field and kind only (the values are the client's words)."""
    where = sorted({".".join(str(p) for p in e["loc"]) + f" ({e['type']})"
                    for e in exc.errors()})
    return "invalid " + ", ".join(where[:8])


def arguments_text(arguments: object) -> str:
    """A tool call's arguments as JSON text (OpenAI sends text, Ollama an object)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {})


#: The leading bytes of the image formats vision models read, and their type.
MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
         (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"))


def image_url(data: str, where: str) -> str:
    """An image sent as bare base64 (Ollama's ``images``) as a ``data:`` URL,
    its type read from its first bytes (PNG, JPEG, GIF, WebP).
    :class:`LayerError` for text that is not base64 or an image of another kind."""
    try:
        head = base64.b64decode(data[:64].strip() + "=" * (-len(data[:64].strip()) % 4),
                                validate=True)[:16]
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise LayerError(f"{where}: not base64") from None
    kind = next((t for magic, t in MAGIC if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "image/webp"
    if kind is None:
        raise LayerError(f"{where}: not a PNG, JPEG, GIF or WebP image")
    return f"data:{kind};base64,{data}"
