"""LLM providers over real HTTP against a fake OpenAI-compatible server."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import ssl
import threading
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401
from pydantic import ValidationError

from runtime.config import ConfigError, LLMSettings, ProviderSettings, load_settings
from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    Completion,
    FallbackChain,
    LLMError,
    LLMErrorKind,
    LLMProvider,
    LLMRequest,
    OfflineProvider,
    OpenAICompatibleProvider,
    make_llm,
)
from tests.pki import Pki

KEY_ENV = "REVERIE_TEST_LLM_KEY"
KEY = "sk-test-0123456789abcdefSECRET"

REQUEST = LLMRequest(
    messages=[
        ChatMessage(role="system", content="You are a helpful home assistant."),
        ChatMessage(role="user", content="Where does my sister live?"),
    ],
    memories=["Ana lives in Porto", "Ana works night shifts as a nurse.", "We have a cat."],
)


@pytest.fixture(autouse=True)
def _key_never_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture everything runtime.llm.providers logs, and check the key never shows up in
    it (proxies from the environment are cleared for every test: conftest.py)."""
    caplog.set_level(logging.DEBUG, logger="runtime.llm.providers")
    yield
    assert KEY not in caplog.text


def provider_settings(server: FakeOpenAI | str, name: str = "fake", *,
                      key_env: str | None = None, timeout_s: float = 5.0) -> ProviderSettings:
    base_url = server if isinstance(server, str) else server.base_url
    return ProviderSettings(name=name, base_url=base_url, model="fake-llama",
                            api_key_env=key_env, timeout_s=timeout_s)


def http_provider(server: FakeOpenAI | str, name: str = "fake", *, key_env: str | None = None,
                  timeout_s: float = 5.0) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(provider_settings(server, name, key_env=key_env,
                                                      timeout_s=timeout_s),
                                    default_max_tokens=128, default_temperature=0.2)


def assert_no_key(exc: BaseException) -> None:
    assert KEY not in str(exc)
    assert KEY not in repr(exc)
    assert KEY not in "".join(traceback.format_exception(exc))


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A base URL whose port is bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


# --------------------------------------------------------------------------- success


def test_success_sends_openai_body_and_parses_reply(fake_openai: FakeOpenAI) -> None:
    provider = http_provider(fake_openai.base_url + "/")  # trailing slash is stripped
    completion = provider.complete(REQUEST)

    assert completion == Completion(text="echo: Where does my sister live?", provider="fake",
                                    model="fake-llama", finish_reason="stop",
                                    usage={"prompt_tokens": 7, "completion_tokens": 3,
                                           "total_tokens": 10})
    sent = fake_openai.last
    assert sent.method == "POST"
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": "fake-llama",
        "messages": [
            {"role": "system", "content": "You are a helpful home assistant."},
            {"role": "user", "content": "Where does my sister live?"},
        ],
        "max_tokens": 128,
        "temperature": 0.2,
        "stream": False,
    }
    assert "authorization" not in sent.headers


def test_request_overrides_defaults(fake_openai: FakeOpenAI) -> None:
    request = REQUEST.model_copy(update={"max_tokens": 7, "temperature": 0.0})
    http_provider(fake_openai).complete(request)
    assert fake_openai.last.body["max_tokens"] == 7
    assert fake_openai.last.body["temperature"] == 0.0


def test_bearer_header_only_when_key_env_is_set(fake_openai: FakeOpenAI,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    provider = http_provider(fake_openai, key_env=KEY_ENV)

    monkeypatch.delenv(KEY_ENV, raising=False)
    provider.complete(REQUEST)
    assert "authorization" not in fake_openai.last.headers

    monkeypatch.setenv(KEY_ENV, "")
    provider.complete(REQUEST)
    assert "authorization" not in fake_openai.last.headers

    monkeypatch.setenv(KEY_ENV, KEY)  # read at call time, not at construction
    provider.complete(REQUEST)
    assert fake_openai.last.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(provider)


# --------------------------------------------------------------------------- failures

FAILURES = [
    (Mode.HTTP_500, LLMErrorKind.HTTP_STATUS, "HTTP 500"),
    (Mode.HTTP_429, LLMErrorKind.HTTP_STATUS, "HTTP 429"),
    (Mode.MALFORMED_JSON, LLMErrorKind.MALFORMED, "not JSON"),
    (Mode.NO_CHOICES, LLMErrorKind.MALFORMED, "no 'choices'"),
    (Mode.EMPTY_CHOICES, LLMErrorKind.MALFORMED, "empty 'choices'"),
    (Mode.NULL_CONTENT, LLMErrorKind.MALFORMED, "content is not a string"),
    (Mode.CLOSE, LLMErrorKind.CONNECTION, "closed the connection"),
    (Mode.HTTP_500_ECHO_AUTH, LLMErrorKind.HTTP_STATUS, "HTTP 500"),
]


@pytest.mark.parametrize(("mode", "kind", "says"), FAILURES, ids=[m for m, _, _ in FAILURES])
def test_failure_modes_raise_the_right_kind_without_the_key(
        fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
        mode: Mode, kind: LLMErrorKind, says: str) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    fake_openai.mode = mode
    with pytest.raises(LLMError) as info:
        http_provider(fake_openai, key_env=KEY_ENV).complete(REQUEST)
    err = info.value
    assert err.kind is kind
    assert err.provider == "fake"
    assert says in str(err)
    assert_no_key(err)
    if kind is LLMErrorKind.HTTP_STATUS:
        assert err.status == int(mode.value.split("_")[1])
    # the key did reach the server (so the redaction above was tested for real)
    assert fake_openai.last.headers["authorization"] == f"Bearer {KEY}"


def test_timeout_is_honoured(fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    fake_openai.mode = Mode.SLOW
    fake_openai.slow_s = 2.0
    with pytest.raises(LLMError) as info:
        http_provider(fake_openai, key_env=KEY_ENV, timeout_s=0.3).complete(REQUEST)
    assert info.value.kind is LLMErrorKind.TIMEOUT
    assert_no_key(info.value)


def test_connection_refused(refused_url: str) -> None:
    with pytest.raises(LLMError) as info:
        http_provider(refused_url).complete(REQUEST)
    assert info.value.kind is LLMErrorKind.CONNECTION_REFUSED
    assert "refused" in str(info.value)


def test_unknown_path_is_an_http_status_error(fake_openai: FakeOpenAI) -> None:
    wrong = fake_openai.base_url.removesuffix("/v1") + "/api"
    with pytest.raises(LLMError) as info:
        http_provider(wrong).complete(REQUEST)
    assert (info.value.kind, info.value.status) == (LLMErrorKind.HTTP_STATUS, 404)


@pytest.fixture
def https_openai(pki: Pki) -> Iterator[FakeOpenAI]:
    """The fake endpoint over https, its certificate from the test CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    with FakeOpenAI(tls=context) as server:
        yield server


def test_https_endpoint_trusted_through_its_ca_file(https_openai: FakeOpenAI,
                                                    pki: Pki) -> None:
    assert https_openai.base_url.startswith("https://")
    https_openai.replies.append("Ana is a nurse.")
    provider = OpenAICompatibleProvider(
        ProviderSettings(name="lan", base_url=https_openai.base_url, model="m",
                         ca_file=pki.ca), default_max_tokens=64, default_temperature=0.2)
    assert provider.complete(REQUEST).text == "Ana is a nurse."


@pytest.mark.parametrize("trust", ["system", "another CA"])
def test_https_endpoint_not_trusted_is_a_connection_error(
        https_openai: FakeOpenAI, pki: Pki, trust: str) -> None:
    ca = {"system": None, "another CA": pki.other_ca}[trust]
    provider = OpenAICompatibleProvider(
        ProviderSettings(name="lan", base_url=https_openai.base_url, model="m", ca_file=ca),
        default_max_tokens=64, default_temperature=0.2)
    with pytest.raises(LLMError) as info:
        provider.complete(REQUEST)
    assert info.value.kind is LLMErrorKind.CONNECTION
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    assert https_openai.requests == []  # nothing was sent


def test_a_ca_file_needs_https_and_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="ca_file is set but base_url is not https"):
        ProviderSettings(name="lan", base_url="http://192.0.2.1/v1", model="m",
                         ca_file=tmp_path / "ca.pem")
    with pytest.raises(ConfigError, match=r"lan: ca_file .* cannot be read"):
        OpenAICompatibleProvider(
            ProviderSettings(name="lan", base_url="https://192.0.2.1/v1", model="m",
                             ca_file=tmp_path / "missing.pem"),
            default_max_tokens=64, default_temperature=0.2)


# --------------------------------------------------------------------------- offline


def test_offline_provider_answers_from_the_first_two_memories() -> None:
    offline = OfflineProvider()
    first = offline.complete(REQUEST)
    assert first.text == ("From what I remember: Ana lives in Porto. "
                          "Ana works night shifts as a nurse.")
    assert "cat" not in first.text
    assert first.provider == "offline"
    assert offline.complete(REQUEST) == first
    assert OfflineProvider().complete(REQUEST.model_copy()) == first


def test_offline_provider_without_memories_is_fixed_and_echoes_nothing() -> None:
    secret = "my bank PIN is 4921, what is it?"
    a = OfflineProvider().complete(LLMRequest(messages=[ChatMessage(role="user", content=secret)]))
    b = OfflineProvider().complete(LLMRequest(messages=[ChatMessage(role="user", content="hi")],
                                              memories=["", "   "]))
    assert a.text == b.text == OfflineProvider.NO_MEMORY_REPLY
    assert "4921" not in a.text
    assert "no language model" in a.text.lower()


def test_make_llm_without_providers_answers_offline() -> None:
    llm = make_llm(LLMSettings())
    assert isinstance(llm, LLMProvider)
    completion = llm.complete(REQUEST)
    assert completion.provider == "offline"
    assert completion.text.startswith("From what I remember: Ana lives in Porto.")
    assert llm.consecutive_failures == 0
    assert llm.notice is None


def test_make_llm_without_providers_or_offline_fallback_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"llm\.providers"):
        make_llm(LLMSettings(offline_fallback=False))


# --------------------------------------------------------------------------- chain


def test_chain_falls_through_to_the_second_provider(fake_openai: FakeOpenAI,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    fake_openai.mode = Mode.HTTP_500
    with FakeOpenAI() as second:
        llm = make_llm(LLMSettings(providers=[provider_settings(fake_openai, "primary"),
                                              provider_settings(second, "secondary")]))
        completion = llm.complete(REQUEST)
        assert completion.provider == "secondary"
        assert completion.text == "echo: Where does my sister live?"
        assert len(fake_openai.requests) == len(second.requests) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("primary" in w and "http_status" in w for w in warnings)
    assert llm.consecutive_failures == 0


def test_chain_falls_back_to_offline_when_every_http_provider_fails(
        fake_openai: FakeOpenAI, refused_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    fake_openai.mode = Mode.SLOW
    settings = LLMSettings(providers=[
        provider_settings(fake_openai, "slow", key_env=KEY_ENV, timeout_s=0.3),
        provider_settings(refused_url, "down", key_env=KEY_ENV),
    ])
    llm = make_llm(settings)
    assert [p.name for p in llm.providers] == ["slow", "down", "offline"]
    completion = llm.complete(REQUEST)
    assert completion.provider == "offline"
    assert completion.text.startswith("From what I remember:")
    # the real models are failing even though memory still answered
    assert llm.consecutive_failures == 1
    assert [e.kind for e in llm.last_errors] == [LLMErrorKind.TIMEOUT,
                                                 LLMErrorKind.CONNECTION_REFUSED]


def test_all_providers_failed_without_offline_fallback(
        fake_openai: FakeOpenAI, refused_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    fake_openai.mode = Mode.HTTP_500_ECHO_AUTH
    llm = make_llm(LLMSettings(offline_fallback=False, providers=[
        provider_settings(fake_openai, "first", key_env=KEY_ENV),
        provider_settings(refused_url, "second", key_env=KEY_ENV),
    ]))
    with pytest.raises(AllProvidersFailed) as info:
        llm.complete(REQUEST)
    err = info.value
    assert isinstance(err, LLMError)
    assert err.kind is LLMErrorKind.ALL_FAILED
    assert [(e.provider, e.kind) for e in err.errors] == [
        ("first", LLMErrorKind.HTTP_STATUS), ("second", LLMErrorKind.CONNECTION_REFUSED)]
    assert "first" in str(err) and "second" in str(err)
    assert_no_key(err)
    # errors cross process boundaries (Ray actors) intact
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.kind) == (AllProvidersFailed, str(err), err.kind)
    assert [(e.provider, e.kind, e.status) for e in copy.errors] == [
        (e.provider, e.kind, e.status) for e in err.errors]


@pytest.mark.parametrize("offline_fallback", [False, True])
def test_notice_after_two_consecutive_failures_and_cleared_by_success(
        fake_openai: FakeOpenAI, offline_fallback: bool) -> None:
    llm = make_llm(LLMSettings(offline_fallback=offline_fallback,
                               providers=[provider_settings(fake_openai, "ollama")]))
    fake_openai.mode = Mode.HTTP_429

    def call() -> None:
        if offline_fallback:
            assert llm.complete(REQUEST).provider == "offline"
        else:
            with pytest.raises(AllProvidersFailed):
                llm.complete(REQUEST)

    call()
    assert llm.consecutive_failures == 1
    assert llm.notice is None
    call()
    assert llm.consecutive_failures == 2
    notice = llm.notice
    assert notice is not None
    assert notice.startswith("memory: language model failing (2 consecutive failures")
    assert "ollama http_status 429" in notice
    call()
    assert llm.notice is not None and "(3 consecutive failures" in llm.notice

    fake_openai.mode = Mode.OK
    assert llm.complete(REQUEST).provider == "ollama"
    assert llm.consecutive_failures == 0
    assert llm.notice is None


def test_chain_of_plain_providers_and_protocol() -> None:
    class Broken:
        name = "broken"
        model = "none"

        def complete(self, request: LLMRequest) -> Completion:
            raise LLMError(self.name, LLMErrorKind.MALFORMED, "always broken")

    broken = Broken()
    assert isinstance(broken, LLMProvider)
    chain = FallbackChain([broken, OfflineProvider()])
    assert chain.complete(REQUEST).provider == "offline"
    assert isinstance(chain, LLMProvider)
    with pytest.raises(ValueError):
        FallbackChain([])


# --------------------------------------------------------------------------- no content in logs

# What the user said; a provider's error body may echo it back.
MARKER = "MARKER-locker-code-48151623"
ECHO_REQUEST = LLMRequest(messages=[ChatMessage(role="user",
                                                content=f"the locker code is {MARKER}")],
                          memories=[f"Remembered: {MARKER}"])


class _EchoHandler(BaseHTTPRequestHandler):
    """Answers every POST with ``server.status`` and a body that quotes the request,
    as providers' validation errors do."""

    server: _EchoServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.status == 200:  # a 2xx that is not JSON, quoting the prompt
            payload = b"upstream said: " + raw
        else:
            payload = json.dumps({"error": {
                "message": "invalid request: " + raw.decode("utf-8", "replace"),
                "type": "invalid_request_error", "code": "context_length_exceeded"}}).encode()
        self.server.sizes.append(len(payload))
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _EchoServer(ThreadingHTTPServer):
    daemon_threads = True
    status = 400
    sizes: list[int]


@pytest.fixture
def echo_server() -> Iterator[_EchoServer]:
    server = _EchoServer(("127.0.0.1", 0), _EchoHandler)
    server.sizes = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything every captured record would print, tracebacks included."""
    handler = logging.StreamHandler()
    return "\n".join(handler.format(r) for r in caplog.records)


@pytest.mark.parametrize("status", [400, 500, 200])
def test_provider_bodies_echoing_the_prompt_never_reach_logs_or_errors(
        echo_server: _EchoServer, caplog: pytest.LogCaptureFixture, status: int) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, not only runtime.llm.providers
    echo_server.status = status
    url = f"http://127.0.0.1:{echo_server.server_address[1]}/v1"
    llm = make_llm(LLMSettings(offline_fallback=False,
                               providers=[provider_settings(url, "echoing")]))
    for _ in range(2):  # the second failure also logs the chain's error line
        with pytest.raises(AllProvidersFailed) as info:
            llm.complete(ECHO_REQUEST)
    err = info.value
    assert MARKER not in "".join(traceback.format_exception(err))
    assert MARKER not in (llm.notice or "")
    logged = _logged(caplog)
    assert MARKER not in logged
    assert "invalid request" not in logged and "upstream said" not in logged
    # ...while what is needed to diagnose the failure is there: provider, status, size.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all("echoing" in w for w in warnings)
    size = f"{echo_server.sizes[-1]} bytes"
    if status == 200:
        assert all("malformed" in w and "not JSON" in w and size in w for w in warnings)
    else:
        assert all(f"http_status {status}" in w and size in w for w in warnings)
        # short error identifiers are kept; they are not the user's words
        assert all("code=context_length_exceeded" in w for w in warnings)
    assert any(r.levelno == logging.ERROR and "echoing" in r.getMessage()
               for r in caplog.records)


def test_provider_repr_and_logs_hide_user_info_in_the_url(
        fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    url = fake_openai.base_url.replace("http://", "http://alice:hunter2pw@")
    provider = http_provider(url)
    with pytest.raises(LLMError) as info:  # urllib does not send URL credentials; fine
        provider.complete(REQUEST)
    assert "hunter2pw" not in "".join(traceback.format_exception(info.value))
    assert "hunter2pw" not in repr(provider)
    assert "hunter2pw" not in _logged(caplog)


def test_provider_from_the_environment_is_tried_first_with_the_named_key(
        fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)  # the provider reads the key at call time
    settings = load_settings(env={"REVERIE_LLM_BASE_URL": fake_openai.base_url,
                                  "REVERIE_LLM_MODEL": "env-model",
                                  "REVERIE_LLM_API_KEY_ENV": KEY_ENV, KEY_ENV: KEY})
    llm = make_llm(settings.llm)
    assert [p.name for p in llm.providers] == ["env", "offline"]
    completion = llm.complete(REQUEST)
    assert (completion.provider, completion.model) == ("env", "env-model")
    assert fake_openai.last.headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(llm)


# --------------------------------------------------------------------------- streaming


class _ScriptedSSE(ThreadingHTTPServer):
    """Answers every POST with ``body`` as ``content_type``, then closes."""

    daemon_threads = True
    body = b""
    content_type = "text/event-stream"


class _ScriptedHandler(BaseHTTPRequestHandler):
    server: _ScriptedSSE

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", self.server.content_type)
        self.end_headers()
        self.wfile.write(self.server.body)


@pytest.fixture
def scripted() -> Iterator[_ScriptedSSE]:
    server = _ScriptedSSE(("127.0.0.1", 0), _ScriptedHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _event(content: str | None = None, **extra: Any) -> bytes:
    delta = {} if content is None else {"content": content}
    data = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _url(server: _ScriptedSSE) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def test_stream_yields_the_pieces_as_sent(fake_openai: FakeOpenAI) -> None:
    pieces = list(http_provider(fake_openai).stream(REQUEST))
    assert len(pieces) > 2 and "".join(pieces) == "echo: Where does my sister live?"
    assert fake_openai.last.body["stream"] is True
    assert fake_openai.last.headers["accept"] == "text/event-stream"


def test_stream_skips_comments_and_empty_deltas_and_stops_at_done(
        scripted: _ScriptedSSE) -> None:
    scripted.body = (b": keep-alive\n\n" + _event() + _event("Hel") + b"event: x\n"
                     + _event("lo") + b"data: {\"choices\": []}\n\n" + b"data: [DONE]\n\n"
                     + _event("after done"))
    assert list(http_provider(_url(scripted)).stream(REQUEST)) == ["Hel", "lo"]


def test_stream_cut_before_done_or_malformed_raises_after_the_pieces(
        scripted: _ScriptedSSE) -> None:
    scripted.body = _event("Ana lives") + _event(" in Porto")
    pieces: list[str] = []
    with pytest.raises(LLMError) as cut:
        pieces.extend(http_provider(_url(scripted)).stream(REQUEST))
    assert pieces == ["Ana lives", " in Porto"] and cut.value.kind is LLMErrorKind.CONNECTION

    scripted.body = _event("Ana") + b"data: {Ana lives in Porto, not JSON\n\n"
    with pytest.raises(LLMError) as bad:
        list(http_provider(_url(scripted)).stream(REQUEST))
    assert bad.value.kind is LLMErrorKind.MALFORMED and "Porto" not in str(bad.value)


def test_stream_answered_as_one_json_completion_is_read_whole(scripted: _ScriptedSSE) -> None:
    scripted.content_type = "application/json"
    scripted.body = json.dumps({"choices": [{"message": {"content": "whole"}}]}).encode()
    assert list(http_provider(_url(scripted)).stream(REQUEST)) == ["whole"]


def test_chain_stream_falls_back_only_before_the_first_piece(
        fake_openai: FakeOpenAI, scripted: _ScriptedSSE) -> None:
    fake_openai.mode = Mode.HTTP_500
    chain = FallbackChain([http_provider(fake_openai, "down"), OfflineProvider()])
    out = list(chain.stream(REQUEST))
    assert {name for name, _ in out} == {"offline"}
    assert "".join(p for _, p in out).startswith(OfflineProvider.MEMORY_PREFIX)

    scripted.body = _event("Ana lives")  # then the connection ends: no [DONE]
    chain = FallbackChain([http_provider(_url(scripted), "cut"), OfflineProvider()])
    got: list[tuple[str, str]] = []
    with pytest.raises(LLMError):
        got.extend(chain.stream(REQUEST))
    assert got == [("cut", "Ana lives")]  # no offline answer glued after it


def test_chain_prefers_the_named_model_or_provider(fake_openai: FakeOpenAI) -> None:
    chain = FallbackChain([http_provider(fake_openai, "first"), OfflineProvider()])
    assert chain.complete(REQUEST).provider == "first"
    assert chain.complete(REQUEST, prefer="offline").provider == "offline"
    assert chain.complete(REQUEST, prefer=OfflineProvider.model).provider == "offline"
    assert next(iter(chain.stream(REQUEST, prefer="offline")))[0] == "offline"
    assert chain.complete(REQUEST, prefer="no-such-model").provider == "first"
