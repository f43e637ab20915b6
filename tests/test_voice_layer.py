"""The memory layer on ``POST /v1/chat/completions``, driven with the official
``openai`` client against a running runtime, with requests shaped as Home
Assistant's conversation agents send them (``homeassistant/helpers/llm.py``'s
prompt: the time, the instructions, the exposed devices and their states;
HassTurnOn/HassLightSet tools whose arguments and results it sends as JSON
text).

Upstream is the fake OpenAI-compatible server (tests/fake_openai.py), which
records what it gets and, with ``auto_tools``, calls an offered tool the
user's words name ("turn on the kitchen light": HassTurnOn)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from fake_openai import FakeOpenAI, Mode
from http_runtime import Api
from voice_layer import PNG, layer_runtime, remember, requests_since, tool_calls_of, turns

NS = "test-voice-layer"

HA_PROMPT = (
    "Current time is 21:14:07. Today's date is 2026-12-01.\n"
    "You are a voice assistant for Home Assistant.\n"
    "Answer questions about the world truthfully.\n"
    "Answer in plain text. Keep it simple and to the point.\n"
    "When controlling Home Assistant always call the intent tools. Use HassTurnOn to "
    "lock and HassTurnOff to unlock a lock. When controlling a device, prefer passing "
    "just name and domain. When controlling an area, prefer passing just area name "
    "and domain.\n"
    "Static Context: An overview of the areas and the devices in this smart home:\n"
    "- names: Kitchen Light\n  domain: light\n  state: 'off'\n  areas: Kitchen\n"
    "- names: Porch Light\n  domain: light\n  state: 'on'\n  areas: Outside\n")

HA_TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "HassTurnOn",
        "description": "Turns on/opens/presses a device or entity. For locks, this "
                       "performs a 'lock' action.",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string"}, "area": {"type": "string"},
            "floor": {"type": "string"},
            "domain": {"type": "array", "items": {"type": "string",
                                                  "enum": ["light", "switch", "fan"]}}},
            "required": []}}},
    {"type": "function", "function": {
        "name": "HassLightSet",
        "description": "Sets the brightness percentage or color of a light",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string"}, "area": {"type": "string"},
            "brightness": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": []}}},
]

HA_RESULT = json.dumps({"speech": {}, "response_type": "action_done",
                        "data": {"targets": [], "failed": [],
                                 "success": [{"name": "Kitchen Light", "type": "entity",
                                              "id": "light.kitchen"}]}})


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        fake.auto_tools = True
        yield fake


@pytest.fixture(scope="module")
def api(ray_instance: str, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with layer_runtime(NS, tmp_path_factory.mktemp("layer-data"), model_cache, upstream,
                       models={"memory-only": "offline"},
                       channels={"ha": {}, "plain": {"passthrough": False}, "pictures": {}},
                       vision=True) as started:
        yield started


@pytest.fixture(autouse=True)
def _ok(upstream: FakeOpenAI) -> None:
    upstream.mode = Mode.OK


@pytest.fixture
def client(api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.base}/v1", api_key=api.token, max_retries=0)


def on(channel: str) -> dict[str, str]:
    return {"X-Reverie-Channel": channel}


def test_the_prompt_and_tools_arrive_upstream_unchanged_with_memory_added(
        api: Api, client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    remember(api, "The porch light must stay on at night because of the cat.")
    before = len(upstream.requests)
    completion = client.chat.completions.create(
        model="reverie", temperature=0.3, top_p=0.9, tools=HA_TOOLS,
        messages=[{"role": "system", "content": HA_PROMPT},
                  {"role": "user", "content": "Why is the porch light on at night?"}],
        extra_headers=on("ha"))
    assert completion.choices[0].finish_reason == "stop"
    [sent] = requests_since(upstream, before)
    system = sent["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(HA_PROMPT)  # the client's own prompt, unchanged
    memory = system["content"][len(HA_PROMPT):]
    assert "# Memory" in memory and "because of the cat" in memory  # Reverie's, added
    assert sent["messages"][-1] == {"role": "user",
                                    "content": "Why is the porch light on at night?"}
    assert sent["tools"] == HA_TOOLS  # the client's tools, as sent
    assert sent["temperature"] == 0.3 and sent["top_p"] == 0.9


def test_images_reach_a_vision_provider_and_only_the_text_is_stored(
        api: Api, client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    before = len(upstream.requests)
    completion = client.chat.completions.create(
        model="reverie", messages=[
            {"role": "system", "content": HA_PROMPT},
            {"role": "user", "content": [
                {"type": "text", "text": "What is on the doorbell camera?"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}],
        extra_headers=on("pictures"))
    assert completion.choices[0].finish_reason == "stop"
    [sent] = requests_since(upstream, before)
    assert sent["messages"][-1] == {"role": "user", "content": [
        {"type": "text", "text": "What is on the doorbell camera?"},
        {"type": "image_url", "image_url": {"url": url}}]}
    said = [t for t in turns(NS, "pictures") if t.role == "user"]
    assert [t.content for t in said] == ["What is on the doorbell camera?"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="reverie", messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "And this?"},
                {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
            extra_headers=on("pictures"))
    assert "image_url" in str(bad.value)


def test_a_remembered_fact_shapes_the_reply(api: Api, client: openai.OpenAI) -> None:
    remember(api, "The garage door code is 2468.")
    completion = client.chat.completions.create(
        model="memory-only", tools=HA_TOOLS,
        response_format={"type": "text"},  # the offline provider drops it (and the tools)
        messages=[{"role": "system", "content": HA_PROMPT},
                  {"role": "user", "content": "What is the garage door code?"}],
        extra_headers=on("ha"))
    assert "2468" in (completion.choices[0].message.content or "")


def test_a_tool_call_goes_back_and_its_result_continues_the_turn(
        api: Api, client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    asked = f"Turn on the kitchen light, {uuid.uuid4().hex[:6]} please."
    conversation: list[Any] = [{"role": "system", "content": HA_PROMPT},
                               {"role": "user", "content": asked}]
    before = len(upstream.requests)
    first = client.chat.completions.create(model="reverie", tools=HA_TOOLS,
                                           messages=conversation, extra_headers=on("ha"))
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "HassTurnOn"
    assert json.loads(call.function.arguments)["name"].startswith("kitchen light")

    # memory changes while Home Assistant runs the tool: a second recall would show it
    remember(api, "The kitchen light was installed by Marta last spring.")
    conversation += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": HA_RESULT}]
    second = client.chat.completions.create(model="reverie", tools=HA_TOOLS,
                                            messages=conversation, extra_headers=on("ha"))
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == f"tool said: {HA_RESULT}"

    opening, going_on = requests_since(upstream, before)
    # the same memory context, not recalled again
    assert going_on["messages"][0] == opening["messages"][0]
    assert "Marta" not in going_on["messages"][0]["content"]
    assert going_on["messages"][-2]["tool_calls"][0]["function"]["name"] == "HassTurnOn"
    assert going_on["messages"][-1] == {"role": "tool", "tool_call_id": call.id,
                                        "content": HA_RESULT}

    rows = turns(NS, "ha")
    assert [r.content for r in rows].count(asked) == 1  # the user's turn, once
    assert not any(r.role == "user" and HA_RESULT in r.content for r in rows)  # nor a result
    [reply] = [r for r in rows if r.role == "assistant" and r.content == f"tool said: {HA_RESULT}"]
    extension = (second.model_extra or {})["reverie"]
    assert extension["reply_id"] == reply.id
    assert tool_calls_of(NS, api, reply.id) == [
        ("HassTurnOn", json.loads(call.function.arguments), HA_RESULT)]


def test_streamed_tool_calls_come_as_openai_deltas(client: openai.OpenAI,
                                                   upstream: FakeOpenAI) -> None:
    asked = f"Turn on the porch light {uuid.uuid4().hex[:6]}"
    conversation: list[Any] = [{"role": "system", "content": HA_PROMPT},
                               {"role": "user", "content": asked}]
    chunks = list(client.chat.completions.create(
        model="reverie", stream=True, tools=HA_TOOLS,
        messages=conversation, extra_headers=on("ha")))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    [delta] = deltas
    assert delta.index == 0 and delta.id and delta.function and delta.function.arguments
    assert delta.function.name == "HassTurnOn"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    sent = upstream.last.body  # streamed upstream too, with the tools
    assert sent["stream"] is True and sent["tools"] == HA_TOOLS
    conversation += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": delta.id, "type": "function",
             "function": {"name": "HassTurnOn", "arguments": delta.function.arguments}}]},
        {"role": "tool", "tool_call_id": delta.id, "content": HA_RESULT}]
    rest = list(client.chat.completions.create(
        model="reverie", stream=True, tools=HA_TOOLS,
        messages=conversation, extra_headers=on("ha")))
    text = "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert text == f"tool said: {HA_RESULT}"
    assert rest[-1].choices[0].finish_reason == "stop"


def test_the_clients_history_is_the_context_and_is_never_written_twice(
        client: openai.OpenAI, upstream: FakeOpenAI) -> None:
    tag = uuid.uuid4().hex[:6]
    channel = "chat"
    opening = f"Hello from the hallway {tag}."
    first = client.chat.completions.create(
        model="reverie", extra_headers=on(channel),
        messages=[{"role": "system", "content": HA_PROMPT},
                  {"role": "user", "content": opening}])
    answer = first.choices[0].message.content or ""
    conversation: list[Any] = [{"role": "system", "content": HA_PROMPT},
                               {"role": "user", "content": opening},
                               {"role": "assistant", "content": answer},
                               {"role": "user", "content": f"And the stairs {tag}?"}]
    before = len(upstream.requests)
    second = client.chat.completions.create(model="reverie", messages=conversation,
                                            extra_headers=on(channel))
    [sent] = requests_since(upstream, before)
    assert sent["messages"][1:] == conversation[1:]  # the client's history, as it sent it
    # its stored copies are not recalled: they are in the prompt already
    memory = sent["messages"][0]["content"][len(HA_PROMPT):]
    assert opening not in memory and answer not in memory
    # the same conversation again: the stored reply, the model not asked, nothing written
    again = client.chat.completions.create(model="reverie", messages=conversation,
                                           extra_headers=on(channel))
    assert len(upstream.requests) == before + 1
    assert again.choices[0].message.content == second.choices[0].message.content
    assert (again.model_extra or {})["reverie"]["reply_id"] == \
        (second.model_extra or {})["reverie"]["reply_id"]
    said = [r.content for r in turns(NS, channel) if tag in r.content]
    assert said == [opening, answer, f"And the stairs {tag}?",
                    second.choices[0].message.content]

    # no history sent: the channel's transcript is the history
    fresh = client.chat.completions.create(
        model="reverie", extra_headers=on(channel),
        messages=[{"role": "system", "content": HA_PROMPT},
                  {"role": "user", "content": f"Anything else {tag}?"}])
    assert fresh.choices[0].message.content
    contents = [m["content"] for m in upstream.last.body["messages"]]
    assert f"And the stairs {tag}?" in contents and opening in contents


def test_a_passthrough_false_channel_behaves_as_before(client: openai.OpenAI,
                                                       upstream: FakeOpenAI) -> None:
    tag = uuid.uuid4().hex[:6]
    conversation: list[Any] = [
        {"role": "system", "content": f"Answer only in French {tag}."},
        {"role": "user", "content": f"Earlier words {tag}."},
        {"role": "assistant", "content": "Earlier answer."},
        {"role": "user", "content": f"Turn on the kitchen light {tag}"}]
    for _ in range(2):
        completion = client.chat.completions.create(
            model="reverie", tools=HA_TOOLS, messages=conversation,
            extra_headers=on("plain"))
        assert completion.choices[0].finish_reason == "stop"
        assert not completion.choices[0].message.tool_calls
        sent = upstream.last.body
        assert "tools" not in sent
        assert tag not in sent["messages"][0]["content"]  # the client's prompt ignored
        assert f"Earlier words {tag}." not in [m["content"] for m in sent["messages"]]
    # no request id of its own: each request is a turn, as before
    assert [r.content for r in turns(NS, "plain")].count(f"Turn on the kitchen light {tag}") == 2


def test_a_tool_that_is_not_a_function_is_a_clear_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="reverie", tools=[cast(Any, {"type": "code_interpreter"})],
            messages=[{"role": "user", "content": "Hi"}], extra_headers=on("ha"))
    assert "tools[0]" in str(caught.value)


def test_the_turn_of_a_request_splits_the_conversation_around_its_last_user_message(
        ) -> None:
    from actors.http.layer import client_turn
    from actors.messages import ClientMessage, ClientToolCall
    from runtime.config import load_settings

    settings = load_settings(env={}, overrides={"channels": {
        "chat": {}, "plain": {"passthrough": False}}})
    said = [ClientMessage(role="system", content="House rules."),
            ClientMessage(role="system", content="Devices: lamp."),
            ClientMessage(role="user", content="Hi."),
            ClientMessage(role="assistant", content="Hello."),
            ClientMessage(role="user", content="Lamp on.")]
    going_on = [ClientMessage(role="assistant", content="", tool_calls=[
                    ClientToolCall(id="c1", name="HassTurnOn", arguments="{}")]),
                ClientMessage(role="tool", content="done", tool_call_id="c1")]
    turn = client_turn(settings, channel="chat", speaker=None, model=None, messages=said,
                       fields={"temperature": 0.1, "n": 2})
    assert turn.text == "Lamp on." and turn.conversation is not None
    assert turn.conversation.system == "House rules.\n\nDevices: lamp."
    assert [m.content for m in turn.conversation.history] == ["Hi.", "Hello."]
    assert turn.conversation.options == {"temperature": 0.1}  # "n" is not sent on
    more = client_turn(settings, channel="chat", speaker=None, model=None,
                       messages=[*said, *going_on])
    assert more.request_id == turn.request_id  # the tool results belong to the same turn
    assert more.conversation is not None and more.conversation.continuation == going_on
    other = client_turn(settings, channel="chat", speaker="ana", model=None, messages=said)
    assert other.request_id != turn.request_id
    plain = client_turn(settings, channel="plain", speaker=None, model=None, messages=said)
    assert plain.conversation is None and plain.request_id is None
