"""OpenAI's Responses API (``POST /v1/responses``) on the memory layer, driven
with the official ``openai`` client's ``client.responses.create(...)``
(streamed and not) against a running runtime, with Home Assistant's prompt
and intent tools in the Responses API's shapes (``instructions``, function
tools ``{"type": "function", "name", ...}``, ``function_call`` and
``function_call_output`` input items).

Upstream is the fake OpenAI-compatible server (tests/fake_openai.py), which
records what it gets and, with ``auto_tools``, calls an offered tool the
user's words name ("turn on the kitchen light": HassTurnOn)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from fake_openai import FakeOpenAI, Mode
from http_runtime import Api
from openai.types.responses import Response, ResponseStreamEvent
from voice_layer import layer_runtime, remember, requests_since, tool_calls_of, turns

from actors.http.responses import ResponsesRequest, Shell, output_of, stream_events
from actors.messages import ClientToolCall, TurnDelta, TurnReply

NS = "test-responses-api"

HA_PROMPT = (
    "Current time is 21:14:07. Today's date is 2026-12-01.\n"
    "You are a voice assistant for Home Assistant.\n"
    "When controlling Home Assistant always call the intent tools.\n"
    "Static Context: An overview of the areas and the devices in this smart home:\n"
    "- names: Kitchen Light\n  domain: light\n  state: 'off'\n  areas: Kitchen\n")

PARAMETERS: dict[str, Any] = {
    "type": "object", "properties": {"name": {"type": "string"}, "area": {"type": "string"}},
    "required": []}
TOOLS: list[Any] = [
    {"type": "function", "name": "HassTurnOn", "strict": False,
     "description": "Turns on/opens/presses a device or entity.", "parameters": PARAMETERS},
    {"type": "function", "name": "HassLightSet", "strict": False,
     "description": "Sets the brightness percentage or color of a light",
     "parameters": PARAMETERS},
]
# the same tools as the upstream gets them: chat completions' shape
UPSTREAM_TOOLS = [{"type": "function", "function": {
    "name": t["name"], "description": t["description"], "parameters": PARAMETERS}}
    for t in TOOLS]

RESULT = json.dumps({"response_type": "action_done", "data": {"success": [
    {"name": "Kitchen Light", "type": "entity", "id": "light.kitchen"}]}})


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        fake.auto_tools = True
        yield fake


@pytest.fixture(scope="module")
def api(ray_instance: str, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with layer_runtime(NS, tmp_path_factory.mktemp("responses-data"), model_cache, upstream,
                       models={"memory-only": "offline"}, channels={"ha": {}}) as started:
        yield started


@pytest.fixture(autouse=True)
def _ok(upstream: FakeOpenAI) -> None:
    upstream.mode = Mode.OK


@pytest.fixture
def client(api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)


HA = {"X-Reverie-Channel": "ha"}


def reverie(response: Any) -> dict[str, Any]:
    return dict((response.model_extra or {})["reverie"])


def test_instructions_and_tools_arrive_upstream_with_memory_added(
        api: Api, client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    remember(api, "The porch light must stay on at night because of the cat.")
    before = len(upstream.requests)
    response = client.responses.create(
        model="reverie", instructions=HA_PROMPT, tools=TOOLS, temperature=0.3,
        max_output_tokens=200, input="Why is the porch light on at night?", extra_headers=HA)
    assert response.status == "completed"
    assert response.output_text == "echo: Why is the porch light on at night?"
    [sent] = requests_since(upstream, before)
    system = sent["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(HA_PROMPT)  # the client's own prompt, unchanged
    memory = system["content"][len(HA_PROMPT):]
    assert "# Memory" in memory and "because of the cat" in memory  # Reverie's, added
    assert sent["messages"][-1] == {"role": "user",
                                    "content": "Why is the porch light on at night?"}
    assert sent["tools"] == UPSTREAM_TOOLS
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 200
    extension = reverie(response)
    assert extension["provider"] == "local" and extension["reply_id"]
    assert response.usage is not None and response.usage.total_tokens == 0


def test_a_function_call_comes_back_and_its_output_continues_the_turn(
        api: Api, client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    asked = f"Turn on the kitchen light, {uuid.uuid4().hex[:6]} please."
    before = len(upstream.requests)
    first = client.responses.create(model="reverie", instructions=HA_PROMPT, tools=TOOLS,
                                    input=[{"role": "user", "content": asked}],
                                    extra_headers=HA)
    [call] = first.output
    assert call.type == "function_call" and call.name == "HassTurnOn"
    assert json.loads(call.arguments)["name"].startswith("kitchen light")
    assert first.output_text == ""

    # memory changes while Home Assistant runs the tool: a second recall would show it
    remember(api, "The kitchen light was installed by Marta last spring.")
    second = client.responses.create(
        model="reverie", instructions=HA_PROMPT, tools=TOOLS, extra_headers=HA,
        input=[{"role": "user", "content": asked},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    assert second.output_text == f"tool said: {RESULT}"
    assert [item.type for item in second.output] == ["message"]

    opening, going_on = requests_since(upstream, before)
    assert going_on["messages"][0] == opening["messages"][0]  # the same memory context
    assert "Marta" not in going_on["messages"][0]["content"]
    assert going_on["messages"][-2]["tool_calls"] == [
        {"id": call.call_id, "type": "function",
         "function": {"name": "HassTurnOn", "arguments": call.arguments}}]
    assert going_on["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id,
                                        "content": RESULT}

    rows = turns(NS, "ha")
    assert [r.content for r in rows].count(asked) == 1  # the user's turn, once
    assert not any(r.role == "user" and RESULT in r.content for r in rows)
    [reply] = [r for r in rows if r.role == "assistant" and r.content == f"tool said: {RESULT}"]
    assert reverie(second)["reply_id"] == reply.id
    assert tool_calls_of(NS, api, reply.id) == [("HassTurnOn", json.loads(call.arguments), RESULT)]


def test_streamed_a_function_call_and_the_continuation_come_as_responses_events(
        client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    asked = f"Turn on the porch light {uuid.uuid4().hex[:6]}"
    events = list(client.responses.create(model="reverie", instructions=HA_PROMPT,
                                          tools=TOOLS, input=asked, stream=True,
                                          extra_headers=HA))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1]
    assert done.type == "response.completed"
    [call] = done.response.output
    assert call.type == "function_call" and call.name == "HassTurnOn"
    assert json.loads(call.arguments) == {"name": asked.lower().split("turn on the ", 1)[1]}
    arguments = events[4]
    assert arguments.type == "response.function_call_arguments.done"
    assert arguments.arguments == call.arguments

    before = len(upstream.requests)
    rest = list(client.responses.create(
        model="reverie", instructions=HA_PROMPT, tools=TOOLS, stream=True, extra_headers=HA,
        input=[{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": asked}]},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]))
    text = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == f"tool said: {RESULT}"
    [finished] = [e for e in rest if e.type == "response.output_text.done"]
    assert finished.text == text
    completed = rest[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == text
    assert reverie(completed.response)["reply_id"]
    [going_on] = requests_since(upstream, before)
    assert going_on["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id,
                                        "content": RESULT}


def test_a_remembered_fact_shapes_the_reply(api: Api, client: openai.OpenAI) -> None:
    remember(api, "The garage door code is 2468.")
    response = client.responses.create(model="memory-only", instructions=HA_PROMPT,
                                       input="What is the garage door code?",
                                       extra_headers=HA)
    assert "2468" in response.output_text
    assert reverie(response)["citations"]  # the memories it was given
    with client.responses.stream(model="memory-only", input="What is the garage door code?",
                                 extra_headers={"X-Reverie-Channel": "chat"}) as stream:
        final = stream.get_final_response()  # the SDK's own accumulation of the events
    assert "2468" in final.output_text


def test_the_same_input_twice_writes_no_duplicate_turn(
        client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    tag = uuid.uuid4().hex[:6]
    asked = f"And the stairs {tag}? " + "Tell me all about them. " * 60  # over 1000 chars
    conversation: Any = [{"role": "user", "content": f"Hello from the hallway {tag}."},
                         {"role": "assistant", "content": "Hello."},
                         {"role": "user", "content": asked}]
    before = len(upstream.requests)
    first = client.responses.create(model="reverie", instructions=HA_PROMPT,
                                    input=conversation, extra_headers=HA)
    [sent] = requests_since(upstream, before)
    assert [m["content"] for m in sent["messages"][1:]] == [m["content"] for m in conversation]
    again = client.responses.create(model="reverie", instructions=HA_PROMPT,
                                    input=conversation, extra_headers=HA)
    assert len(upstream.requests) == before + 1  # the model not asked again
    assert again.output_text == first.output_text
    assert reverie(again)["reply_id"] == reverie(first)["reply_id"]
    said = [r.content for r in turns(NS, "ha") if tag in r.content]
    assert said == [asked, first.output_text]
    alone = client.responses.create(model="memory-only", input=asked, extra_headers=HA)
    assert alone.status == "completed"  # a string input of any length up to the body limit


def test_the_bearer_token_is_required(api: Api, upstream: FakeOpenAI) -> None:
    before = len(upstream.requests)
    stranger = openai.OpenAI(base_url=f"{api.base}/v1", api_key="not-the-token",
                             max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.responses.create(model="reverie", input="Hi")
    bare = httpx.post(f"{api.base}/v1/responses", json={"model": "reverie", "input": "Hi"},
                      timeout=60)
    assert bare.status_code == 401
    assert len(upstream.requests) == before


def test_what_needs_kept_state_or_other_tools_is_a_clear_400(
        client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    before = len(upstream.requests)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="reverie", input="Hi", previous_response_id="resp_1")
    assert "previous_response_id" in str(caught.value)
    assert caught.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="reverie", input="Hi",
                                tools=[{"type": "web_search"}])
    assert "tools[0]" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="reverie",
                                input=[{"type": "item_reference", "id": "msg_1"}])
    assert "input[0]" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:  # a result of no call
        client.responses.create(model="reverie", input=[
            {"role": "user", "content": "Turn on the kitchen light"},
            {"type": "function_call_output", "call_id": "call_9", "output": RESULT}])
    assert "input[1]" in str(caught.value) and "call_id" in str(caught.value)
    assert len(upstream.requests) == before


# -- the events' shapes, checked strictly against the SDK's own types ----------------------

STREAM_EVENT: Any = pydantic.TypeAdapter(ResponseStreamEvent)


def parsed(chunks: Iterator[bytes]) -> list[Any]:
    """Each server-sent event validated (strictly, not constructed as the client
    does) as the ``openai`` SDK's ``ResponseStreamEvent``."""
    out = []
    for chunk in chunks:
        name, data = chunk.decode().strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        out.append(STREAM_EVENT.validate_python(payload))
    return out


def test_every_event_fits_the_sdks_types_and_a_broken_turn_ends_failed() -> None:
    body = ResponsesRequest(model="reverie", input="Hi", tools=TOOLS)
    call = ClientToolCall(id="call_0", name="HassTurnOn", arguments='{"name": "porch"}')
    reply = TurnReply(turn_id=1, reply_id=2, text="On it.", citations=["fact:1"],
                      provider="local", tool_calls=[call])
    events = parsed(stream_events(TurnDelta(text="On "), iter([TurnDelta(text="it."), reply]),
                                  Shell(body)))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    done = events[-1].response
    assert [i.type for i in done.output] == ["message", "function_call"]
    assert done.output_text == "On it." and done.output[1].call_id == "call_0"
    assert Response.model_validate(Shell(body).response("completed", output_of(reply), reply))

    def broken() -> Iterator[TurnDelta | TurnReply]:
        yield TurnDelta(text="it")
        raise RuntimeError("the actor died")

    events = parsed(stream_events(TurnDelta(text="On "), broken(), Shell(body)))
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed" and events[-1].response.error.message
    assert events[-1].response.output[0].status == "incomplete"
