"""Injection modes per channel: push (the recalled memories in the prompt) and pull
(a stable index, the recall tool through OpenAI tool calling, a capped auto-recall),
through the real runtime against a local server that speaks OpenAI tool calls."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401
from llm_runtime import llm_runtime, llm_settings

from actors.common import BadRequest
from actors.handles import GraphClient, RecallClient, TranscriptClient, TurnsClient
from actors.messages import AddFact, AppendTurns, Recall, TurnDelta, TurnReply, UserTurn
from runtime.config import CONFIG_DIR, ConfigError, ProviderSettings, Settings, load_settings
from runtime.llm.prompt import (
    AUTO_RECALL_HEADING,
    MEMORY_HEADING,
    MEMORY_INSTRUCTION,
    SEPARATOR,
    memory_section,
)
from runtime.llm.providers import (
    ChatMessage,
    LLMError,
    LLMErrorKind,
    LLMRequest,
    OpenAICompatibleProvider,
)
from runtime.memories.facts import FactIn
from runtime.memories.transcript import ToolCallIn, TurnIn
from runtime.recall.pull import (
    AUTO_RECALL_BYTES,
    AUTO_RECALL_ITEMS,
    INDEX_HEADING,
    MAX_RESULT_BYTES,
    MAX_ROUNDS,
    RECALL_TOOL,
    Shown,
    auto_recall,
    tool_result,
)
from runtime.store.database import Row, Store
from runtime.store.fact_kinds import FactKinds

NS = "test-pull"
PULL = "den"  # the pull channel; chat and voice stay push
SPOKEN = "hall"  # a pull channel read aloud


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("pull-data")
    persona = data / "persona"
    persona.mkdir()
    (persona / "SOUL.md").write_text("You are Wren, a calm household assistant.")
    settings = llm_settings(NS, data, model_cache, server, timeout_s=30,
                            channels={PULL: {"injection": "pull"},
                                      SPOKEN: {"injection": "pull", "spoken": True}})
    with llm_runtime(settings):
        _remember(settings)
        yield settings


GARDEN = [
    "We keep the hedge trimmer in the blue shed behind the greenhouse, on the left hook.",
    "The garden hose for the vegetable beds hangs in the blue shed, coiled on the reel, "
    "and the spare nozzles are in the tin box under the bench next to the seed trays. " * 4,
    "In the garden shed we also store the lawn mower, its petrol can and the leaf rake; "
    "the key to the shed is on the hook by the back door of the kitchen. " * 4,
    "The blue shed in the garden has the secateurs, the watering cans and the garden "
    "gloves; the compost bags are stacked along the back wall of the shed. " * 4,
    "Garden tools go back in the shed after use: the spade, the fork and the hoe hang "
    "above the potting bench, the wheelbarrow stands outside the shed door. " * 4,
]


def _remember(settings: Settings) -> None:
    """What the household said before (on a push channel), recallable."""
    turns = TurnsClient(NS, timeout_s=120)
    for text in GARDEN:
        turns.process(UserTurn(channel="voice", text=text))
    TranscriptClient(NS).flush()
    RecallClient(NS, timeout_s=120).sync()


def say(text: str, channel: str = PULL) -> TurnReply:
    reply = TurnsClient(NS, timeout_s=120).process(UserTurn(channel=channel, text=text))
    TranscriptClient(NS).flush()
    return reply


def _store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def _tool_calls(settings: Settings, reply_id: int | None) -> list[Row]:
    store = _store(settings)
    try:
        return store.rows("SELECT name, arguments, result FROM tool_calls"
                          " WHERE transcript_id = ? ORDER BY id", (reply_id,))
    finally:
        store.close()


def _asked(server: FakeOpenAI, text: str) -> list[dict[str, Any]]:
    """The bodies of the model requests for the turn saying ``text`` (in order)."""
    return [r.body for r in server.requests if r.body and r.path.endswith("/completions")
            and [m["content"] for m in r.body["messages"] if m["role"] == "user"][-1] == text]


def _stable_part(system: str) -> str:
    """The system message up to the date/time line (what a prompt cache keeps)."""
    return system.split("Current date and time:")[0]


def _auto_recall_block(system: str) -> str:
    blocks = [s for s in system.split(SEPARATOR) if s.startswith(AUTO_RECALL_HEADING)]
    assert len(blocks) == 1, system
    return blocks[0]


# -- the done-when: pull answers through the recall tool ------------------------------


def test_pull_answers_through_the_recall_tool(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    question = "Which garden tools are kept in the blue shed?"
    server.tool_calls.append([("recall", json.dumps({"query": "hedge trimmer", "limit": 2}))])
    reply = say(question)

    first, second = _asked(server, question)
    # the first request offered the recall tool, and the prompt carried the stable
    # index and a capped top-3 auto-recall, not the full recall block
    assert [t["function"]["name"] for t in first["tools"]] == ["recall"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["query"]
    assert first["tool_choice"] == "auto"
    system = first["messages"][0]["content"]
    assert INDEX_HEADING in _stable_part(system)
    assert MEMORY_INSTRUCTION not in system and f"{MEMORY_HEADING}\n" not in system
    block = _auto_recall_block(system)
    bullets = [line for line in block.splitlines() if line.startswith("- [")]
    assert 1 <= len(bullets) <= AUTO_RECALL_ITEMS
    assert len(block.encode()) <= AUTO_RECALL_BYTES
    # (a push prompt would have listed every recalled memory: more than that)
    recalled = RecallClient(NS).recall(Recall(query=question))
    assert len(recalled.items) > AUTO_RECALL_ITEMS
    assert sum(len(m.text.encode()) for m in recalled.items) > AUTO_RECALL_BYTES

    # the model's call went to Recall; the result came back as a tool message
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_0"
    assert "blue shed behind the greenhouse" in tool_message["content"]
    call = second["messages"][-2]
    assert call["role"] == "assistant"
    assert call["tool_calls"][0]["function"]["name"] == "recall"

    # the reply uses it, cites what the tool returned, and the call is recorded
    assert reply.provider == "local"
    assert reply.text.startswith("tool said: ") and "blue shed behind the greenhouse" in reply.text
    store = _store(runtime)
    try:
        told = store.scalar("SELECT id FROM transcript WHERE content = ?", (GARDEN[0],))
    finally:
        store.close()
    trimmer = f"turn:{told}"
    assert trimmer in reply.citations
    rows = _tool_calls(runtime, reply.reply_id)
    assert [r["name"] for r in rows] == ["recall"]
    assert json.loads(rows[0]["arguments"]) == {"query": "hedge trimmer", "limit": 2}
    assert rows[0]["result"] == tool_message["content"]
    assert f"[{trimmer}]" in rows[0]["result"]


def test_a_push_channel_is_unchanged(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    question = "Where does the wheelbarrow stand?"
    reply = say(question, channel="chat")
    (body,) = _asked(server, question)
    assert "tools" not in body and "tool_choice" not in body
    system = body["messages"][0]["content"]
    assert f"{MEMORY_HEADING}\n{MEMORY_INSTRUCTION}" in system
    assert INDEX_HEADING not in system and AUTO_RECALL_HEADING not in system
    assert reply.text == f"echo: {question}" and reply.citations
    assert _tool_calls(runtime, reply.reply_id) == []


def test_the_index_is_byte_identical_until_memory_changes(runtime: Settings,
                                                          server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    graph = GraphClient(NS, timeout_s=60)
    graph.add(AddFact(fact=FactIn(kind="place", subject="blue shed", key="location",
                                  value="behind the greenhouse")))
    one, two, three = ("What is in the blue shed?", "And the spare nozzles?",
                       "Who mows the lawn?")
    say(one)
    say(two)
    first = _stable_part(_asked(server, one)[0]["messages"][0]["content"])
    second = _stable_part(_asked(server, two)[0]["messages"][0]["content"])
    assert first == second  # byte for byte, though a turn and its reply were written between
    assert "1 fact (place 1)" in first and "Main subjects: blue shed" in first
    graph.add(AddFact(fact=FactIn(kind="contact", subject="Ana", key="phone",
                                  value="+351 912 345 678")))
    say(three)
    third = _stable_part(_asked(server, three)[0]["messages"][0]["content"])
    assert third != second and "2 facts" in third


def test_hostile_tool_calls_get_a_clear_error_back(runtime: Settings,
                                                   server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    question = "Can you look something up for me?"
    server.tool_calls.append([
        ("delete_everything", json.dumps({"query": "all"})),
        ("recall", "{'query': not json"),
        ("recall", json.dumps({"query": "shed " * 2000})),
        ("recall", json.dumps(["shed"])),
        ("recall", json.dumps({"query": "shed"})),
    ])
    reply = say(question)
    assert reply.provider == "local" and reply.text.startswith("tool said: ")
    tool_messages = [m for m in _asked(server, question)[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [f"call_{i}" for i in range(5)]
    results = [m["content"] for m in tool_messages]
    assert results[0] == "error: unknown tool 'delete_everything'; the only tool is 'recall'"
    assert results[1].startswith("error: arguments are not valid JSON")
    assert results[2] == "error: arguments longer than 2000 characters"
    assert results[3] == "error: arguments must be a JSON object with a 'query' string"
    assert results[4] == "error: too many tool calls at once; at most 4 a round"
    rows = _tool_calls(runtime, reply.reply_id)
    assert [r["result"] for r in rows] == results
    assert [r["name"] for r in rows] == ["delete_everything", "recall", "recall", "recall",
                                         "recall"]
    assert all(json.loads(r["arguments"]) == {} for r in rows)

    # a query too long (in short enough arguments), a bad limit, a missing query
    again = "One more lookup, please."
    server.tool_calls.append([("recall", json.dumps({"query": "q" * 501})),
                              ("recall", json.dumps({"query": "shed", "limit": "all"})),
                              ("recall", json.dumps({"query": "shed", "limit": 0})),
                              ("recall", json.dumps({"q": "shed"}))])
    say(again)
    results = [m["content"] for m in _asked(server, again)[-1]["messages"]
               if m["role"] == "tool"]
    assert results == ["error: 'query' is longer than 500 characters; ask in a few words",
                       "error: 'limit' must be an integer from 1 to 8",
                       "error: 'limit' must be an integer from 1 to 8",
                       "error: 'query' (a non-empty string) is required"]


def test_tool_rounds_are_bounded(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    question = "Tell me everything about the garden."
    for _ in range(MAX_ROUNDS + 2):
        server.tool_calls.append([("recall", json.dumps({"query": "garden"}))])
    reply = say(question)
    asked = _asked(server, question)
    assert len(asked) == MAX_ROUNDS + 1
    assert [b["tool_choice"] for b in asked] == ["auto"] * MAX_ROUNDS + ["none"]
    assert len(_tool_calls(runtime, reply.reply_id)) == MAX_ROUNDS
    assert reply.text.startswith("tool said: ")
    server.tool_calls.clear()


def test_a_streamed_pull_turn_uses_the_tool_too(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    question = "Where is the key to the shed?"
    server.tool_calls.append([("recall", json.dumps({"query": "key to the shed"}))])
    out = list(TurnsClient(NS, timeout_s=120).process_stream(
        UserTurn(channel=PULL, text=question)))
    TranscriptClient(NS).flush()
    deltas = [o for o in out if isinstance(o, TurnDelta)]
    reply = out[-1]
    assert isinstance(reply, TurnReply)
    assert "".join(d.text for d in deltas) == reply.text
    assert "hook by the back door" in reply.text
    assert [r["name"] for r in _tool_calls(runtime, reply.reply_id)] == ["recall"]
    assert any("stream" in b and b["stream"] is False for b in _asked(server, question))


def test_the_offline_provider_answers_from_the_auto_recall(runtime: Settings,
                                                           server: FakeOpenAI) -> None:
    server.mode = Mode.HTTP_500
    try:
        reply = say("Where is the hedge trimmer?")
    finally:
        server.mode = Mode.OK
    assert reply.provider == "offline"
    assert reply.text.startswith("From what I remember: ")
    assert 1 <= len(reply.citations) <= AUTO_RECALL_ITEMS
    assert _tool_calls(runtime, reply.reply_id) == []


# -- the parts on their own ----------------------------------------------------------


def test_auto_recall_keeps_the_top_three_within_the_byte_cap() -> None:
    long = [Shown(f"turn:{i}", f"memory {i} " + "word " * 200) for i in range(5)]
    used, shown = auto_recall(long)
    block = memory_section(shown, "pull")
    assert len(block.encode()) <= AUTO_RECALL_BYTES
    assert [m.ref for m in used] == [s.ref for s in shown] == ["turn:0"]
    assert shown[0].text.endswith("…")
    short = [Shown(f"fact:{i}", f"Short memory {i}.") for i in range(5)]
    used, shown = auto_recall(short)
    assert [m.ref for m in used] == ["fact:0", "fact:1", "fact:2"]
    assert [s.text for s in shown] == ["Short memory 0.", "Short memory 1.", "Short memory 2."]


def test_a_tool_result_is_capped() -> None:
    many = [Shown(f"turn:{i}", "a long memory " * 100) for i in range(20)]
    text, shown = tool_result(many)
    assert len(text.encode()) <= MAX_RESULT_BYTES
    assert 1 <= len(shown) < 20 and text.count("\n") == len(shown) - 1
    assert tool_result([]) == ("no memories match this query", [])


def test_pull_needs_a_seeded_foreground_channel() -> None:
    with pytest.raises(ConfigError, match='injection = "pull" needs seed = true'):
        load_settings(env={}, overrides={"channels": {"den": {"injection": "pull",
                                                              "seed": False}}})
    with pytest.raises(ConfigError, match="injection"):
        load_settings(env={}, overrides={"channels": {"den": {"injection": "index"}}})


def test_the_provider_sends_tools_and_reads_tool_calls(fake_openai: FakeOpenAI) -> None:
    provider = OpenAICompatibleProvider(
        ProviderSettings(name="local", base_url=fake_openai.base_url, model="tiny"), 64, 0.0)
    request = LLMRequest(messages=[ChatMessage(role="user", content="hi")], tools=[RECALL_TOOL])
    fake_openai.tool_calls.append([("recall", '{"query": "hi"}')])
    done = provider.complete(request)
    assert done.text == "" and done.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in done.tool_calls] == [
        ("call_0", "recall", '{"query": "hi"}')]
    body = fake_openai.last.body
    assert body["tools"][0] == {"type": "function", "function": {
        "name": "recall", "description": RECALL_TOOL.description,
        "parameters": RECALL_TOOL.parameters}}
    # the calls and their answer go back in the chat-completions shape
    follow = request.model_copy(update={"messages": [
        *request.messages,
        ChatMessage(role="assistant", content="", tool_calls=done.tool_calls),
        ChatMessage(role="tool", content="- [fact:1] hello", tool_call_id="call_0")]})
    assert provider.complete(follow).text == "tool said: - [fact:1] hello"
    sent = fake_openai.last.body["messages"]
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "recall", "arguments": '{"query": "hi"}'}}]}
    assert sent[2] == {"role": "tool", "content": "- [fact:1] hello", "tool_call_id": "call_0"}
    # a plain request sends no tools; a malformed tool call is a malformed answer
    provider.complete(LLMRequest(messages=[ChatMessage(role="user", content="hi")]))
    assert "tools" not in fake_openai.last.body
    assert fake_openai.last.body["messages"] == [{"role": "user", "content": "hi"}]


class _OneAnswer(ThreadingHTTPServer):
    daemon_threads = True
    body = b""


class _OneAnswerHandler(BaseHTTPRequestHandler):
    server: _OneAnswer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)


@pytest.mark.parametrize(("calls", "why"), [
    ({"id": "c", "function": {"arguments": "{}"}}, "tool_calls[0] has no function name"),
    ("recall", "tool_calls[0] has no function name"),
])
def test_a_malformed_tool_call_is_a_malformed_answer(calls: Any, why: str) -> None:
    server = _OneAnswer(("127.0.0.1", 0), _OneAnswerHandler)
    server.body = json.dumps({"choices": [{"message": {"content": None,
                                                       "tool_calls": [calls]}}]}).encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = OpenAICompatibleProvider(ProviderSettings(
            name="local", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
            model="tiny"), 64, 0.0)
        with pytest.raises(LLMError) as err:
            provider.complete(LLMRequest(messages=[ChatMessage(role="user", content="hi")],
                                         tools=[RECALL_TOOL]))
        assert err.value.kind is LLMErrorKind.MALFORMED and err.value.detail == why
    finally:
        server.shutdown()
        server.server_close()


def test_a_retried_append_records_its_tool_calls_once(runtime: Settings) -> None:
    transcript = TranscriptClient(NS)
    reply = TurnIn(channel=PULL, source="assistant", role="assistant",
                   content="The trimmer is in the blue shed.", request_id="reply-retried-1")
    call = ToolCallIn(name="recall", arguments={"query": "trimmer", "limit": 5},
                      result="- [turn:1] the trimmer")
    first = transcript.append(AppendTurns(turns=[reply], citations=[["turn:1"]],
                                          tool_calls=[[call]])).ids[0]
    again = transcript.append(AppendTurns(turns=[reply], citations=[["turn:1"]],
                                          tool_calls=[[call, call]])).ids[0]
    assert again == first
    rows = _tool_calls(runtime, first)
    assert [(r["name"], json.loads(r["arguments"]), r["result"]) for r in rows] == [
        ("recall", {"query": "trimmer", "limit": 5}, "- [turn:1] the trimmer")]
    with pytest.raises(BadRequest, match="tool_calls: 2 lists for 1 turns"):
        transcript.append(AppendTurns.model_construct(turns=[reply], citations=None,
                                                      tool_calls=[[call], [call]]))


def test_the_recall_tool_keeps_sensitive_memories_from_an_unknown_voice(
        runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    GraphClient(NS, timeout_s=60).add(AddFact(fact=FactIn(
        kind="credential", subject="garage", key="door_code", value="4471 then enter",
        sensitive=True)))
    RecallClient(NS, timeout_s=120).sync()
    typed, spoken = "What is the garage door code?", "Tell me the garage door code."
    for question, channel in ((typed, PULL), (spoken, SPOKEN)):
        server.tool_calls.append([("recall", json.dumps({"query": "garage door code"}))])
        say(question, channel=channel)
    # typed on the household's own channel: the tool finds it; read aloud to an
    # unknown voice: neither the tool nor the auto-recall gives it to the model
    typed_tool = _asked(server, typed)[-1]["messages"][-1]
    assert typed_tool["role"] == "tool" and "4471" in typed_tool["content"]
    last = _asked(server, spoken)[-1]
    assert last["messages"][-1]["role"] == "tool"
    assert all("4471" not in str(m["content"]) for m in last["messages"])
