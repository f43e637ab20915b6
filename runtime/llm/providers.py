"""Language-model providers: OpenAI-compatible endpoints, an offline fallback, a chain.

Every provider answers one :class:`LLMRequest` with one :class:`Completion` or
raises :class:`LLMError`, whose ``kind`` says what went wrong (timeout, HTTP
status, malformed response, refused or dropped connection).

* :class:`OpenAICompatibleProvider` speaks ``POST {base_url}/chat/completions``
  (Ollama, llama.cpp server, vLLM, OpenAI) over the standard library's HTTP
  client. The API key is read from the environment variable *named* in the
  settings at each call, sent only as a bearer header, and never logged or put
  in an error message.
* Nothing a provider says goes into a log line or an error message: an error
  body can echo the prompt (the household's memories), so errors carry the
  provider, the HTTP status, the body's size and at most the provider's short
  error type/code identifiers, never the body's text.
* :class:`OfflineProvider` is the built-in provider used when no endpoint is
  configured or all of them fail: deterministic, no network, lower quality.
* :class:`FallbackChain` tries providers in order and keeps a visible
  :attr:`~FallbackChain.notice` after two consecutive failures.
* Streaming: :meth:`OpenAICompatibleProvider.stream` asks the endpoint for
  server-sent events and yields the text as it comes; a provider without a
  ``stream`` method answers in one piece. :meth:`FallbackChain.stream` falls
  back to the next provider only until the first piece has arrived (after
  that, the words are out: an error then ends the stream).
* Tool calling: a request's ``tools`` are sent as OpenAI ``tools`` by
  :meth:`OpenAICompatibleProvider.complete`, and the answer's ``tool_calls``
  come back in :attr:`Completion.tool_calls`; streamed, the calls are put
  together from OpenAI's ``delta.tool_calls`` and yielded whole, as
  :class:`ToolCall` items after the text (a pull turn's tool rounds are not
  streamed: ``runtime.recall.pull``). The offline provider
  has no tools: it answers from the request's memories as always.
* A client's own fields (the memory layer: ``actors.http.layer``) come in
  :attr:`LLMRequest.options` and go into the body as they are (never over
  ``model``, ``messages``, ``stream`` or ``tools``); the offline provider
  drops them with a log line naming them.

:func:`make_llm` builds the chain from :class:`~runtime.config.LLMSettings`.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.config import ConfigError, LLMSettings, ProviderSettings

log = logging.getLogger(__name__)

# A chat completion is small; anything beyond this is not a reply we can use.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
# How much of an error body is read (to measure it and find its error type/code).
ERROR_BODY_READ_BYTES = 64 * 1024
# Only identifier-like error types/codes ("rate_limit_exceeded", "model_not_found")
# are reported; anything else could be text the provider echoed from the prompt.
_ERROR_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,48}$")
# Length cap for an OS/network error's own text (never a response body).
_REASON_CHARS = 200
# Consecutive failed calls after which FallbackChain.notice is shown.
NOTICE_AFTER_FAILURES = 2


# --------------------------------------------------------------------------- messages


class ToolCall(BaseModel):
    """A function call the model asked for (OpenAI tool calling): ``arguments``
    is the JSON text exactly as the model sent it (it may be malformed)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = ""


class Tool(BaseModel):
    """A function the model may call: its name, what it does, and its
    parameters as a JSON schema (sent as OpenAI ``tools``)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str
    parameters: dict[str, Any]


class ChatMessage(BaseModel):
    """One message. An assistant message may carry the ``tool_calls`` it made;
    a ``tool`` message answers one of them (``tool_call_id``)."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    # images with a user message: URLs (``data:image/png;base64,...`` or
    # ``https://...``), sent only to a provider marked ``vision``
    images: list[str] = Field(default_factory=list)


def without_images(messages: list[ChatMessage]) -> tuple[list[ChatMessage], int]:
    """The messages with their images taken out, and how many there were."""
    count = sum(len(m.images) for m in messages)
    if not count:
        return messages, 0
    return [m.model_copy(update={"images": []}) if m.images else m for m in messages], count


def _wire_message(m: ChatMessage) -> dict[str, Any]:
    """A message as the chat-completions API takes it (with images: a list of
    parts, the text first)."""
    content: str | list[dict[str, Any]] = m.content
    if m.images:
        content = [{"type": "text", "text": m.content},
                   *({"type": "image_url", "image_url": {"url": url}} for url in m.images)]
    out: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


class LLMRequest(BaseModel):
    """One chat request. ``memories`` are the recalled memory texts already
    injected into ``messages`` (most relevant first); only the offline provider
    reads them. ``None`` for ``max_tokens``/``temperature`` means the configured
    default. ``tools``: functions the model may call (``tool_choice``: ``auto``
    or ``none``); a provider without tool calling (the offline one) ignores
    them and answers text."""

    model_config = ConfigDict(frozen=True)

    messages: list[ChatMessage] = Field(min_length=1)
    memories: list[str] = Field(default_factory=list)
    # what the user asked to remember in this turn, stored already (runtime.mind.remember)
    remembered: list[str] = Field(default_factory=list)
    # one flag per memory (or none): a sensitive one is never quoted (runtime.memories.privacy)
    sensitive: list[bool] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none"] = "auto"
    # a client's own request fields (response_format, temperature, tool_choice, ...)
    # sent as they came by a provider that takes them (the OpenAI-compatible one);
    # the offline provider drops them, saying which (never their values)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_flag_per_memory(self) -> LLMRequest:
        if self.sensitive and len(self.sensitive) != len(self.memories):
            raise ValueError(f"sensitive: {len(self.sensitive)} flags for "
                             f"{len(self.memories)} memories")
        return self


class Completion(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    provider: str
    model: str
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


# --------------------------------------------------------------------------- errors


class LLMErrorKind(StrEnum):
    TIMEOUT = "timeout"                        # connect or read took longer than timeout_s
    HTTP_STATUS = "http_status"                # the endpoint answered with a non-2xx status
    MALFORMED = "malformed"                    # 2xx, but not a usable chat completion
    CONNECTION_REFUSED = "connection_refused"  # nothing listening at base_url
    CONNECTION = "connection"                  # dropped, reset, TLS or name-resolution failure
    ALL_FAILED = "all_failed"                  # every provider of a chain failed


class LLMError(RuntimeError):
    """A provider could not produce a completion. ``kind`` says why; ``status``
    is the HTTP status for :attr:`LLMErrorKind.HTTP_STATUS`."""

    def __init__(self, provider: str, kind: LLMErrorKind, detail: str,
                 status: int | None = None) -> None:
        super().__init__(f"{provider}: {kind}: {detail}")
        self.provider = provider
        self.kind = kind
        self.detail = detail
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (Ray actors): rebuild from the fields.
        return (type(self), (self.provider, self.kind, self.detail, self.status))


class AllProvidersFailed(LLMError):
    """Every provider of a :class:`FallbackChain` failed; ``errors`` holds each
    provider's error, in the order they were tried."""

    def __init__(self, chain: str, errors: list[LLMError]) -> None:
        summary = "; ".join(str(e) for e in errors)
        super().__init__(chain, LLMErrorKind.ALL_FAILED,
                         f"all {len(errors)} providers failed: {summary}")
        self.errors = list(errors)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.provider, self.errors))


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class LLMProvider(Protocol):
    name: str
    model: str

    def complete(self, request: LLMRequest) -> Completion: ...


# --------------------------------------------------------------------------- HTTP


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A POST must not be silently re-sent elsewhere (or turned into a GET):
    a redirect surfaces as an HTTP status error."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        return None


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _size(n: int, capped: bool = False) -> str:
    return f"{n}+ bytes" if capped else f"{n} byte" + ("" if n == 1 else "s")


def _error_ids(body: bytes) -> str:
    """The provider's error ``type``/``code`` from an OpenAI-style JSON error body,
    when they are short identifiers; never its message or anything else."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ""
    ids = [f"{field}={error[field]}" for field in ("type", "code")
           if isinstance(error.get(field), str) and _ERROR_ID.match(error[field])]
    return ", ".join(ids)


# What a request's ``options`` never replace: the provider's own fields.
_OWN_FIELDS = frozenset({"model", "messages", "stream", "tools", "stream_options"})


class OpenAICompatibleProvider:
    """An OpenAI-compatible chat-completions endpoint.

    ``timeout_s`` bounds the connection and each read of the response. Proxies
    come from the usual environment variables; redirects are not followed.
    """

    def __init__(self, settings: ProviderSettings, default_max_tokens: int,
                 default_temperature: float) -> None:
        self.name = settings.name
        self.model = settings.model
        self.base_url = settings.base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        parts = urlsplit(self.url)
        if not parts.hostname:
            raise ConfigError(f"llm.providers: {settings.name}: base_url has no host: "
                              f"{settings.base_url!r}")
        self._where = parts.netloc.rpartition("@")[2]  # host[:port], never user info
        # The endpoint without user info, for repr() and logs.
        self._shown_url = f"{parts.scheme}://{self._where}{parts.path}"
        self._api_key_env = settings.api_key_env or None
        self._timeout_s = settings.timeout_s
        self._tls: ssl.SSLContext | None = None  # None: the system's CAs
        if settings.ca_file is not None:
            try:
                self._tls = ssl.create_default_context(cafile=str(settings.ca_file.expanduser()))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"llm.providers: {settings.name}: ca_file "
                                  f"{settings.ca_file} cannot be read as certificates "
                                  f"({type(exc).__name__})") from None
        self._default_max_tokens = default_max_tokens
        self._default_temperature = default_temperature
        self.vision = settings.vision

    def __repr__(self) -> str:
        return (f"OpenAICompatibleProvider(name={self.name!r}, url={self._shown_url!r}, "
                f"model={self.model!r})")

    def _api_key(self) -> str | None:
        if not self._api_key_env:
            return None
        return os.environ.get(self._api_key_env) or None

    def _error(self, kind: LLMErrorKind, detail: str, key: str | None,
               status: int | None = None) -> LLMError:
        if key:
            detail = detail.replace(key, "[redacted]")
        return LLMError(self.name, kind, detail, status)

    def _request(self, request: LLMRequest, stream: bool,
                 key: str | None) -> urllib.request.Request:
        messages = request.messages
        if not self.vision:
            messages, count = without_images(messages)
            if count:
                log.info("llm %s: %d image(s) not sent: the provider is not marked vision",
                         self.name, count)
        body = {
            "model": self.model,
            "messages": [_wire_message(m) for m in messages],
            "max_tokens": (request.max_tokens if request.max_tokens is not None
                           else self._default_max_tokens),
            "temperature": (request.temperature if request.temperature is not None
                            else self._default_temperature),
            "stream": stream,
        }
        if request.tools:
            body["tools"] = [{"type": "function",
                              "function": {"name": t.name, "description": t.description,
                                           "parameters": t.parameters}}
                             for t in request.tools]
            body["tool_choice"] = request.tool_choice
        for name, value in request.options.items():  # a client's fields (the memory layer)
            if name not in _OWN_FIELDS and (name != "tool_choice" or "tools" in body):
                body[name] = value
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if stream else "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        log.debug("llm %s: POST %s model=%s messages=%d stream=%s", self.name,
                  self._shown_url, self.model, len(request.messages), stream)
        return urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"),
                                      headers=headers, method="POST")

    def complete(self, request: LLMRequest) -> Completion:
        key = self._api_key()
        raw = self._post(self._request(request, False, key), key)
        return self._parse(raw, key)

    def stream(self, request: LLMRequest) -> Iterator[str | ToolCall]:
        """The reply's text as the endpoint streams it (server-sent events),
        then the tool calls it made, each whole (only when the request offers
        ``tools``).

        Connecting, an HTTP error status or a refused connection raise
        :class:`LLMError` here, before anything is yielded; a stream that breaks
        or turns malformed later raises it from the iterator. An endpoint that
        ignores ``stream`` and answers one JSON completion is read whole."""
        key = self._api_key()
        resp = self._open(self._request(request, True, key), key)
        return self._events(resp, key)

    def _events(self, resp: Any, key: str | None) -> Iterator[str | ToolCall]:
        received = 0
        calls: dict[int, dict[str, str]] = {}  # tool calls by index, as their deltas come
        try:
            if "json" in (resp.headers.get("Content-Type") or ""):
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
                if len(raw) > MAX_RESPONSE_BYTES:
                    raise self._error(LLMErrorKind.MALFORMED,
                                      f"response larger than {MAX_RESPONSE_BYTES} bytes", key)
                whole = self._parse(raw, key)
                if whole.text or not whole.tool_calls:
                    yield whole.text
                yield from whole.tool_calls
                return
            while True:
                try:
                    line = resp.readline(MAX_RESPONSE_BYTES + 1)
                except (OSError, http.client.HTTPException) as exc:
                    raise self._network_error(exc, key) from None
                if not line:
                    raise self._error(LLMErrorKind.CONNECTION,
                                      f"{self._where} ended the stream before [DONE]", key)
                received += len(line)
                if received > MAX_RESPONSE_BYTES:
                    raise self._error(LLMErrorKind.MALFORMED,
                                      f"stream larger than {MAX_RESPONSE_BYTES} bytes", key)
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event names
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    yield from _assembled(calls)
                    return
                piece = self._delta(payload, key, calls)
                if piece:
                    yield piece
        finally:
            resp.close()

    def _delta(self, payload: bytes, key: str | None,
               calls: dict[int, dict[str, str]] | None = None) -> str:
        """The text of one ``chat.completion.chunk`` event ("" when it has none);
        its ``tool_calls`` deltas are added to ``calls``."""
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            raise self._error(LLMErrorKind.MALFORMED,
                              f"stream event is not JSON ({_size(len(payload))})", key) from None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            ids = _error_ids(payload)
            raise self._error(LLMErrorKind.MALFORMED, "the stream reported an error"
                              + (f" ({ids})" if ids else ""), key)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list):
            raise self._error(LLMErrorKind.MALFORMED, "stream event has no 'choices' list", key)
        if not choices:
            return ""  # e.g. the usage-only last chunk
        delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
        if calls is not None and isinstance(delta, dict) \
                and isinstance(delta.get("tool_calls"), list):
            _add_call_deltas(calls, delta["tool_calls"])
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else ""

    def _post(self, req: urllib.request.Request, key: str | None) -> bytes:
        resp = self._open(req, key)
        try:
            raw: bytes = resp.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise self._network_error(exc, key) from None
        finally:
            resp.close()
        if len(raw) > MAX_RESPONSE_BYTES:
            raise self._error(LLMErrorKind.MALFORMED,
                              f"response larger than {MAX_RESPONSE_BYTES} bytes", key)
        return raw

    def _open(self, req: urllib.request.Request, key: str | None) -> Any:
        """Send ``req``; the open response, or :class:`LLMError`."""
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if self._tls is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self._tls))
        opener = urllib.request.build_opener(*handlers)
        try:
            return opener.open(req, timeout=self._timeout_s)
        except urllib.error.HTTPError as exc:
            # The body is measured, never quoted: it can echo the prompt.
            try:
                body = exc.read(ERROR_BODY_READ_BYTES + 1)
            except (OSError, http.client.HTTPException):
                body = b""
            finally:
                exc.close()
            ids = _error_ids(body[:ERROR_BODY_READ_BYTES])
            size = _size(min(len(body), ERROR_BODY_READ_BYTES),
                         capped=len(body) > ERROR_BODY_READ_BYTES)
            extra = f"; {ids}" if ids else ""
            raise self._error(LLMErrorKind.HTTP_STATUS,
                              f"HTTP {exc.code} from {self._where} ({size}{extra})", key,
                              status=exc.code) from None
        except urllib.error.URLError as exc:
            raise self._network_error(exc.reason, key) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._network_error(exc, key) from None

    def _network_error(self, reason: object, key: str | None) -> LLMError:
        if isinstance(reason, TimeoutError):
            return self._error(LLMErrorKind.TIMEOUT, f"no answer from {self._where} within "
                               f"{self._timeout_s:g} s", key)
        if isinstance(reason, ConnectionRefusedError):
            return self._error(LLMErrorKind.CONNECTION_REFUSED,
                               f"connection refused by {self._where}", key)
        if isinstance(reason, http.client.RemoteDisconnected):
            return self._error(LLMErrorKind.CONNECTION,
                               f"{self._where} closed the connection without a response", key)
        what = type(reason).__name__ if isinstance(reason, BaseException) else "error"
        if isinstance(reason, http.client.HTTPException):
            # Its text quotes what the server sent (a bad status line): never shown.
            return self._error(LLMErrorKind.CONNECTION,
                               f"{what} talking to {self._where}", key)
        return self._error(LLMErrorKind.CONNECTION, f"{what} talking to {self._where}: "
                           f"{_one_line(str(reason), _REASON_CHARS)}", key)

    def _parse(self, raw: bytes, key: str | None) -> Completion:
        def bad(why: str) -> LLMError:
            return self._error(LLMErrorKind.MALFORMED, why, key)

        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise bad(f"response is not JSON ({_size(len(raw))})") from None
        if not isinstance(data, dict):
            raise bad(f"response is a JSON {type(data).__name__}, not an object")
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise bad("response has no 'choices' list")
        if not choices:
            raise bad("response has an empty 'choices' list")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise bad("choices[0] has no 'message' object")
        content = message.get("content")
        calls = _parse_tool_calls(message.get("tool_calls"), bad)
        if content is None and calls:
            content = ""  # a tool-calling answer has no text
        if not isinstance(content, str):
            got = "missing" if "content" not in message else type(content).__name__
            raise bad(f"choices[0].message.content is not a string ({got})")
        finish = choice.get("finish_reason")
        usage = data.get("usage")
        model = data.get("model")
        completion = Completion(
            text=content,
            provider=self.name,
            model=model if isinstance(model, str) and model else self.model,
            finish_reason=finish if isinstance(finish, str) else None,
            usage=({k: v for k, v in usage.items()
                    if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}
                   if isinstance(usage, dict) else None),
            tool_calls=calls,
        )
        log.debug("llm %s: %d chars, %d tool calls, finish_reason=%s", self.name, len(content),
                  len(calls), completion.finish_reason)
        return completion


def _add_call_deltas(calls: dict[int, dict[str, str]], deltas: list[Any]) -> None:
    """OpenAI's streamed ``delta.tool_calls``: the id and name come once, the
    arguments' text in pieces, each delta naming its call by ``index``."""
    for i, delta in enumerate(deltas):
        if not isinstance(delta, dict):
            continue
        index = delta.get("index")
        call = calls.setdefault(index if isinstance(index, int) else i,
                                {"id": "", "name": "", "arguments": ""})
        function = delta.get("function")
        if isinstance(delta.get("id"), str):
            call["id"] = delta["id"]
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call["name"] += function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                arguments = json.dumps(arguments)
            if isinstance(arguments, str):
                call["arguments"] += arguments


def _assembled(calls: dict[int, dict[str, str]]) -> list[ToolCall]:
    """The streamed tool calls, whole, in their order (one without a name is dropped)."""
    return [ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
            for i, c in sorted(calls.items()) if c["name"]]


def _parse_tool_calls(raw: object, bad: Callable[[str], LLMError]) -> list[ToolCall]:
    """``message.tool_calls`` of a completion (``[]`` when absent); ``bad(why)``
    builds the error for a malformed one. Arguments sent as a JSON object
    rather than its text (some servers do) are re-encoded."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("choices[0].message.tool_calls is not a list")
    calls = []
    for i, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str):
            raise bad(f"tool_calls[{i}] has no function name")
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        call_id = call.get("id")
        calls.append(ToolCall(id=call_id if isinstance(call_id, str) and call_id else f"call_{i}",
                              name=name, arguments=arguments if isinstance(arguments, str) else ""))
    return calls


# --------------------------------------------------------------------------- offline

_MEMORY_CHARS = 300


class OfflineProvider:
    """The built-in offline provider: lower quality, never blocking.

    No network and no model: it answers from ``request.memories`` alone, so
    memory keeps working with no endpoint configured or while every endpoint
    is down. With memories it replies "From what I remember: " followed by the
    first one or two (recall hands them over most relevant first), each
    trimmed to a sentence-sized length, never one flagged sensitive
    (``request.sensitive``: it answers as if it were not there); with none it says, in a fixed line,
    that no language model is available and nothing relevant is remembered.
    It never repeats the user's words, but for one case: when the user asked to
    remember something in this turn (``request.remembered``, stored already),
    it acknowledges it: "Noted, I will remember that: ...". Same request, same
    reply; it never raises :class:`LLMError`.
    """

    name = "offline"
    model = "offline-extractive"
    #: Marks a last-resort provider: FallbackChain does not count its answers
    #: as the language model working.
    last_resort = True

    NO_MEMORY_REPLY = ("No language model is configured or reachable right now, "
                       "and I don't remember anything relevant to that.")
    MEMORY_PREFIX = "From what I remember: "
    REMEMBERED_PREFIX = "Noted, I will remember that: "
    MAX_MEMORIES = 2

    def complete(self, request: LLMRequest) -> Completion:
        images = ["images"] if any(m.images for m in request.messages) else []
        if request.options or request.tools or images:  # names only, never a value
            log.info("offline provider: dropped what it cannot use: %s",
                     ", ".join(sorted(request.options) + (["tools"] if request.tools else [])
                               + images))
        picked: list[str] = []
        for i, memory in enumerate(request.memories):
            text = _one_line(memory, _MEMORY_CHARS)
            if not text or (i < len(request.sensitive) and request.sensitive[i]):
                continue  # a sensitive memory is never quoted
            if text[-1] not in ".!?…":
                text += "."
            picked.append(text)
            if len(picked) == self.MAX_MEMORIES:
                break
        text = self.MEMORY_PREFIX + " ".join(picked) if picked else self.NO_MEMORY_REPLY
        if request.remembered:  # a "remember: ..." stored during the turn: say so
            noted = " ".join(_one_line(r, _MEMORY_CHARS).rstrip(".!?…") + "."
                             for r in request.remembered)
            text = self.REMEMBERED_PREFIX + noted
        return Completion(text=text, provider=self.name, model=self.model,
                          finish_reason="stop", usage=None)


# --------------------------------------------------------------------------- chain


def format_notice(failures: int, causes: list[str], answered_offline: bool) -> str:
    """The line shown to the user after ``failures`` consecutive failures."""
    tail = "answering from memory only" if answered_offline else "no answers available"
    return (f"memory: language model failing ({failures} consecutive failures: "
            f"{', '.join(causes)}); {tail}")


def _cause(error: LLMError) -> str:
    return f"{error.provider} {error.kind}" + (f" {error.status}" if error.status else "")


class ChainHealth(Protocol):
    """Where a chain keeps its failure count beyond its own memory, so that the
    notice survives a restart and every process sees it
    (:class:`runtime.llm.queue.LLMHealth`)."""

    def record_failure(self, causes: list[str], answered_offline: bool) -> int: ...

    def record_success(self) -> bool: ...

    def notice(self) -> str | None: ...


class FallbackChain:
    """Tries each provider in order and returns the first completion.

    A provider's :class:`LLMError` is logged as a warning (provider, kind,
    status, and the error's content-free detail) and the next one is tried;
    when all fail, :class:`AllProvidersFailed` lists every error.

    A call *fails* when no real language model answered: every provider failed,
    or only a last-resort provider (:class:`OfflineProvider`) did, after at least
    one real provider was tried. ``consecutive_failures`` counts such calls and
    resets when a real provider answers; from two on, :attr:`notice` is a short
    line to show the user. A chain holding only the offline provider has
    nothing to fail and never shows a notice.

    With a ``health`` store, every failure and success is also recorded there
    and :attr:`notice` reads it: the count is shared with other processes and
    survives a restart.
    """

    def __init__(self, providers: list[LLMProvider],
                 health: ChainHealth | None = None) -> None:
        if not providers:
            raise ValueError("FallbackChain needs at least one provider")
        self.providers = list(providers)
        self.name = "fallback(" + ", ".join(p.name for p in self.providers) + ")"
        self.model = self.providers[0].model
        self.consecutive_failures = 0
        self.last_errors: list[LLMError] = []
        self._answered_offline = False
        self._lock = threading.Lock()
        self.health = health

    def __repr__(self) -> str:
        return f"FallbackChain({self.providers!r})"

    @property
    def real_providers(self) -> bool:
        """Whether any provider is a real language model (not last-resort)."""
        return any(not getattr(p, "last_resort", False) for p in self.providers)

    @property
    def notice(self) -> str | None:
        if self.health is not None:
            return self.health.notice()
        with self._lock:
            failures = self.consecutive_failures
            errors = list(self.last_errors)
            offline = self._answered_offline
        if failures < NOTICE_AFTER_FAILURES:
            return None
        return format_notice(failures, [_cause(e) for e in errors], offline)

    def ordered(self, prefer: str | None = None) -> list[LLMProvider]:
        """The providers in order, those whose model or name is ``prefer`` first."""
        if not prefer:
            return list(self.providers)
        first = [p for p in self.providers if prefer in (p.model, p.name)]
        return first + [p for p in self.providers if p not in first]

    def stream(self, request: LLMRequest,
               prefer: str | None = None) -> Iterator[tuple[str, str | ToolCall]]:
        """``(provider name, text piece or whole tool call)`` as the first
        provider that answers streams its reply. A provider that fails before its first piece is
        skipped, as in :meth:`complete`; one that fails after it ends the stream
        with its :class:`LLMError` (what was said is said)."""
        errors: list[LLMError] = []
        for provider in self.ordered(prefer):
            try:
                pieces = _pieces(provider, request)
                first = next(pieces, None)
            except LLMError as exc:
                self._skipped(provider, exc, errors)
                continue
            self._answered(provider, errors)
            if first is not None:
                yield provider.name, first
            for piece in pieces:
                yield provider.name, piece
            return
        self._failed(errors, answered_offline=False)
        raise AllProvidersFailed(self.name, errors)

    def complete(self, request: LLMRequest, prefer: str | None = None) -> Completion:
        errors: list[LLMError] = []
        for provider in self.ordered(prefer):
            try:
                completion = provider.complete(request)
            except LLMError as exc:
                self._skipped(provider, exc, errors)
                continue
            self._answered(provider, errors)
            return completion
        self._failed(errors, answered_offline=False)
        raise AllProvidersFailed(self.name, errors)

    def _skipped(self, provider: LLMProvider, exc: LLMError, errors: list[LLMError]) -> None:
        """A provider failed: logged (content-free), kept, and the next one tried."""
        log.warning("llm provider %s failed (%s%s): %s", provider.name, exc.kind,
                    f" {exc.status}" if exc.status else "", exc.detail)
        errors.append(exc)

    def _answered(self, provider: LLMProvider, errors: list[LLMError]) -> None:
        """``provider`` answered after ``errors``: a success, unless only the
        last-resort provider did (after a real one failed)."""
        if not getattr(provider, "last_resort", False):
            self._succeeded()
        elif errors:
            self._failed(errors, answered_offline=True)

    def _succeeded(self) -> None:
        with self._lock:
            recovered = self.consecutive_failures >= NOTICE_AFTER_FAILURES
            self.consecutive_failures = 0
            self.last_errors = []
            self._answered_offline = False
        if self.health is not None:
            try:
                recovered = self.health.record_success() or recovered
            except OSError as exc:  # the notice must never cost an answer
                log.warning("llm: could not record the recovery: %s", type(exc).__name__)
        if recovered:
            log.warning("llm: language model answering again")

    def _failed(self, errors: list[LLMError], answered_offline: bool) -> None:
        with self._lock:
            self.consecutive_failures += 1
            self.last_errors = list(errors)
            self._answered_offline = answered_offline
            failures = self.consecutive_failures
        if self.health is not None:
            try:
                failures = self.health.record_failure([_cause(e) for e in errors],
                                                      answered_offline)
            except OSError as exc:
                log.warning("llm: could not record the failure: %s", type(exc).__name__)
        if failures == NOTICE_AFTER_FAILURES:
            log.error("llm: %d consecutive failures of every language model (%s)", failures,
                      ", ".join(f"{e.provider} {e.kind}" for e in errors))


def _pieces(provider: LLMProvider, request: LLMRequest) -> Iterator[str | ToolCall]:
    """The provider's streamed pieces; its whole completion when it cannot stream."""
    stream = getattr(provider, "stream", None)
    if stream is not None:
        return iter(stream(request))
    completion = provider.complete(request)
    return iter([completion.text, *completion.tool_calls])


# --------------------------------------------------------------------------- answers

M = TypeVar("M", bound=BaseModel)


def parse_json_answer(text: str, model: type[M]) -> M:
    """A model's JSON answer as ``model`` (a code fence or prose around the object
    is tolerated); ValueError saying, without content, why not."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object")
    try:
        data = json.loads(text[start:end + 1])
    except ValueError:
        raise ValueError("not valid JSON") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) or "object" for e in exc.errors()})
        raise ValueError("invalid " + ", ".join(fields[:8])) from None


# --------------------------------------------------------------------------- factory


def make_llm(settings: LLMSettings, health: ChainHealth | None = None) -> FallbackChain:
    """The configured providers in order, then the offline provider when
    ``offline_fallback`` is on; with no provider configured, the offline
    provider alone. Always a :class:`FallbackChain`, so callers can read its
    :attr:`~FallbackChain.notice`. ``health`` makes the notice durable
    (:class:`runtime.llm.queue.LLMHealth`)."""
    providers: list[LLMProvider] = [
        OpenAICompatibleProvider(p, settings.max_tokens, settings.temperature)
        for p in settings.providers
    ]
    if settings.offline_fallback:
        providers.append(OfflineProvider())
    if not providers:
        raise ConfigError("llm.providers: no language model provider configured and "
                          "llm.offline_fallback is false; add an [[llm.providers]] entry "
                          "or set llm.offline_fallback = true")
    names = [p.name for p in providers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"llm.providers: duplicate provider name(s): {', '.join(duplicates)}")
    log.info("llm providers: %s", ", ".join(names))
    return FallbackChain(providers, health)
