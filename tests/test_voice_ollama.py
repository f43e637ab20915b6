"""The Ollama-compatible API as Home Assistant's Ollama integration calls it,
driven by the ``ollama`` client it uses, against the running runtime (the fake
OpenAI-compatible server as the upstream model).

Home Assistant (homeassistant/components/ollama): the config flow validates the
server with ``list()`` (a 401/403 is "invalid_auth"), offers the listed models,
and ``pull(model)`` (not streamed) when the chosen one is not listed; the
coordinator polls ``list()`` and ``ps()`` together (a 401 there is a failed
authentication) and the sensors read ``ps().models[].model``, ``size`` and
``size_vram``.

Its conversation agent (entity.py) sends every chat as ``chat(model, messages,
tools, stream=True, keep_alive=-1, options={"num_ctx": 8192}, think=None,
format=None)``: its own system prompt first (the date and time, the
instructions, the Assist API's prompt with the exposed devices), the
conversation so far, and the Assist API's tools (``{"type": "function",
"function": {"name", "parameters", "description"}}``). After a tool call it
sends the same messages plus the assistant's message with its ``tool_calls``
(``function.name`` and ``arguments`` as an object, no id) and one ``role:
"tool"`` message per result (``{"data": ..., "error": ...}`` as JSON, no id).
The tests build their requests the same way."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ollama
import pytest
from fake_openai import FakeOpenAI
from http_runtime import Api
from voice_layer import PNG, layer_runtime, remember, turns

from actors.http import ollama as ollama_api
from actors.http.layer import LayerError

NS = "test-voice-ollama"

DETAILS = ("format", "family", "families", "parameter_size", "quantization_level")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def api(ray_instance: str, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with layer_runtime(NS, tmp_path_factory.mktemp("voice-ollama"), model_cache, upstream,
                       models={"quick": "offline"},
                       channels={"legacy": {"passthrough": False}}) as started:
        yield started


@pytest.fixture(autouse=True)
def _plain_upstream(upstream: FakeOpenAI) -> Iterator[None]:
    upstream.auto_tools = False
    upstream.tool_calls.clear()
    yield
    upstream.auto_tools = False


def client(api: Api) -> ollama.Client:
    return ollama.Client(host=api.base, headers={"Authorization": f"Bearer {api.token}"})


def async_client(api: Api, token: str | None = None) -> ollama.AsyncClient:
    """As Home Assistant's config flow makes it: the API key as a bearer header."""
    key = api.token if token is None else token
    return ollama.AsyncClient(host=api.base,
                              headers={"Authorization": f"Bearer {key}"} if key else None)


def test_config_flow_lists_models_with_their_details_and_pulls_a_listed_one(api: Api) -> None:
    async def flow() -> tuple[ollama.ListResponse, ollama.ProgressResponse]:
        ha = async_client(api)
        listed = await ha.list()
        # the model is listed, so Home Assistant would not pull; its download step
        # still must succeed for a served name
        return listed, await ha.pull("tiny:latest")

    listed, pulled = asyncio.run(flow())
    models = {m.model: m for m in listed.models}
    assert {"tiny:latest", "local:latest", "quick:latest", "reverie:latest"} <= set(models)
    for model in models.values():
        assert model.details is not None and model.digest
        assert all(model.details[field] is not None for field in DETAILS), model.details
        assert model.details.families == ["reverie"]
    assert models["tiny:latest"].details.format == "openai"  # type: ignore[union-attr]
    assert models["quick:latest"].details.format == "offline"  # type: ignore[union-attr]
    assert pulled.status == "success"


def test_a_pull_of_a_model_not_served_fails_as_ollama_does(api: Api) -> None:
    with pytest.raises(ollama.ResponseError) as whole:
        asyncio.run(async_client(api).pull("llama3.2:latest"))  # Home Assistant's call
    assert whole.value.status_code == 404  # Ollama says 500: no 5xx for bad input here
    assert whole.value.error == "pull model manifest: file does not exist"

    with pytest.raises(ollama.ResponseError) as streamed:
        list(client(api).pull("llama3.2:latest", stream=True))
    assert streamed.value.error == "pull model manifest: file does not exist"

    parts = list(client(api).pull("reverie", stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"


def test_coordinator_polls_list_and_ps_together(api: Api) -> None:
    async def poll() -> tuple[ollama.ListResponse, ollama.ProcessResponse]:
        ha = async_client(api)
        installed, loaded = await asyncio.gather(ha.list(), ha.ps())
        return installed, loaded

    installed, loaded = asyncio.run(poll())
    running = {m.model: m for m in loaded.models}
    assert set(running) == {m.model for m in installed.models}
    for model in running.values():
        assert model.name == model.model and model.size == 0 and model.size_vram == 0
        assert model.details is not None and model.details.family == "reverie"


def test_show_reports_tools_only_where_the_upstream_takes_them(api: Api) -> None:
    c = client(api)
    tiny = c.show("tiny:latest")
    assert tiny.capabilities == ["completion", "tools"]
    assert tiny.details is not None and tiny.details.format == "openai"
    assert tiny.modelinfo == {}
    assert c.show("local").capabilities == ["completion", "tools"]
    assert c.show("reverie").capabilities == ["completion", "tools"]  # providers first
    quick = c.show("quick")  # the alias of the offline provider: no tools
    assert quick.capabilities == ["completion"]
    assert quick.details is not None and quick.details.format == "offline"
    with pytest.raises(ollama.ResponseError) as missing:
        c.show("llama3.2")
    assert missing.value.status_code == 404
    assert missing.value.error == "model 'llama3.2' not found"


def _post(api: Api, path: str, body: bytes, token: str | None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(urlsplit(api.base).netloc, timeout=60)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_the_older_name_field_and_bad_bodies(api: Api) -> None:
    status, shown = _post(api, "/api/show", b'{"name": "quick"}', api.token)
    assert status == 200 and shown["capabilities"] == ["completion"]
    status, pulled = _post(api, "/api/pull", b'{"name": "tiny", "stream": false}', api.token)
    assert status == 200 and pulled == {"status": "success"}
    status, bad = _post(api, "/api/show", b'{"model": 7}', api.token)
    assert status == 422 and bad["detail"][0]["loc"] == ["body", "model"]
    status, _ = _post(api, "/api/pull", b"not json", api.token)
    assert status == 422


@pytest.mark.parametrize("call", ["list", "ps", "show", "pull"])
def test_without_the_token_every_model_call_is_401(api: Api, call: str) -> None:
    """Home Assistant reads 401 as "invalid_auth" (config flow) or a failed
    authentication (coordinator)."""
    ha = async_client(api, token="")
    calls = {"list": ha.list, "ps": ha.ps, "show": lambda: ha.show("tiny"),
             "pull": lambda: ha.pull("tiny")}
    with pytest.raises(ollama.ResponseError) as denied:
        asyncio.run(calls[call]())
    assert denied.value.status_code == 401
    wrong = async_client(api, token="not-the-token")
    with pytest.raises(ollama.ResponseError) as refused:
        asyncio.run(wrong.list())
    assert refused.value.status_code == 401


# -- /api/chat through the memory layer, as Home Assistant's Ollama integration chats --

# homeassistant.helpers.llm: DATE_TIME_PROMPT, DEFAULT_INSTRUCTIONS_PROMPT and the
# Assist API's prompt with its overview of the exposed devices
HA_PROMPT = (
    "Current time is 21:04:11. Today's date is 2026-12-01.\n"
    "You are a voice assistant for Home Assistant.\n"
    "Answer questions about the world truthfully.\n"
    "Answer in plain text. Keep it simple and to the point.\n"
    "When controlling Home Assistant always call the intent tools. Use HassTurnOn to lock "
    "and HassTurnOff to unlock a lock. When controlling a device, prefer passing just name "
    "and domain. When controlling an area, prefer passing just area name and domain.\n"
    "Static Context: An overview of the areas and the devices in this smart home:\n"
    "- names: Kitchen Light\n  domain: light\n  state: 'off'\n  areas: Kitchen\n"
    "- names: Porch Light\n  domain: light\n  state: 'on'\n  areas: Outside\n"
    "When a user asks to turn on all devices of a specific type, ask user to specify an "
    "area, unless there is only one device of that type.\n"
    "This device is not able to start timers.")


def _intent_tool(name: str, description: str, extra: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """An intent tool as entity._format_tool writes it (probatio.to_openapi)."""
    properties: dict[str, Any] = {
        "name": {"type": "string"}, "area": {"type": "string"},
        "floor": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string"}},
        "device_class": {"type": "array", "items": {"type": "string"}},
        **(extra or {})}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": []}}}


HA_TOOLS = [
    _intent_tool("HassTurnOn", "Turns on/opens/presses a device or entity. For locks, this "
                 "performs a 'lock' action. Use for requests like 'turn on', 'activate', "
                 "'enable', or 'lock'."),
    _intent_tool("HassTurnOff", "Turns off/closes a device or entity. For locks, this "
                 "performs an 'unlock' action."),
    _intent_tool("HassLightSet", "Sets the brightness percentage or color of a light",
                 {"brightness": {"type": "integer", "minimum": 0, "maximum": 100,
                                 "description": "The brightness percentage of the light "
                                                "between 0 and 100"}}),
    {"type": "function", "function": {
        "name": "GetLiveContext",
        "description": "Provides real-time information about the CURRENT state, value, "
                       "or mode of devices, sensors, entities, or areas.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]


def sent_tools() -> list[dict[str, Any]]:
    """HA_TOOLS as the ``ollama`` client sends them (its Tool type keeps a
    property's type, items, description and enum, and drops the rest)."""
    from ollama._types import ChatRequest

    request = ChatRequest(model="tiny", tools=HA_TOOLS).model_dump(exclude_none=True)
    return list(request["tools"])


def ha_chat(api: Api, messages: list[dict[str, Any]], model: str = "tiny:latest",
            headers: dict[str, str] | None = None) -> list[ollama.ChatResponse]:
    """One round of entity._async_handle_chat_log: the stream, read whole."""
    async def run() -> list[ollama.ChatResponse]:
        ha = ollama.AsyncClient(host=api.base, headers={
            "Authorization": f"Bearer {api.token}", **(headers or {})})
        stream = await ha.chat(model=model, messages=messages, tools=HA_TOOLS, stream=True,
                               keep_alive=-1, options={"num_ctx": 8192}, think=None,
                               format=None)
        return [part async for part in stream]

    return asyncio.run(run())


def test_ha_prompt_and_tools_go_upstream_a_tool_call_comes_back_and_its_result_goes_on(
        api: Api, upstream: FakeOpenAI) -> None:
    remember(api, "The kitchen light is the lamp over the sink.")
    upstream.auto_tools = True
    asked = [{"role": "system", "content": HA_PROMPT},
             {"role": "user", "content": "Turn on the kitchen light"}]
    parts = ha_chat(api, asked)

    first = upstream.last.body
    system = first["messages"][0]
    assert system["role"] == "system" and system["content"].startswith(HA_PROMPT)
    assert "over the sink" in system["content"][len(HA_PROMPT):]  # Reverie's memory added
    assert [m["role"] for m in first["messages"]][-1] == "user"
    assert [t["function"] for t in first["tools"]] == [t["function"] for t in sent_tools()]
    assert not {"num_ctx", "keep_alive", "options", "think"} & set(first)

    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "HassTurnOn"
    assert calls[0].function.arguments == {"name": "kitchen light"}  # an object
    assert parts[-1].done and not parts[-1].message.tool_calls

    # entity.py: the assistant's message with its calls, then the tool's result
    result = json.dumps({"data": {"success": [{"name": "Kitchen Light", "type": "entity",
                                               "id": "light.kitchen"}], "failed": []},
                         "error": None})
    went_on = [*asked,
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "HassTurnOn",
                                 "arguments": {"name": "kitchen light"}}}]},
               {"role": "tool", "content": result}]
    parts = ha_chat(api, went_on)
    reply = "".join(p.message.content or "" for p in parts)
    assert "light.kitchen" in reply  # the fake upstream quotes the tool's result
    assert not any(p.message.tool_calls for p in parts)

    second = upstream.last.body
    assert second["messages"][0] == system  # the same memory context: no second recall
    call = next(m for m in second["messages"] if m["role"] == "assistant")
    answer = second["messages"][-1]
    assert answer["role"] == "tool" and answer["content"] == result
    assert answer["tool_call_id"] == call["tool_calls"][0]["id"]
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {
        "name": "kitchen light"}

    said = [t.content for t in turns(NS, "chat")]
    assert said.count("Turn on the kitchen light") == 1
    assert said.count(reply) == 1
    assert result not in said  # the tool's result is no user turn


def test_a_tool_call_not_streamed_has_arguments_as_an_object(api: Api,
                                                             upstream: FakeOpenAI) -> None:
    upstream.auto_tools = True
    answer = client(api).chat(model="reverie", stream=False, tools=HA_TOOLS, messages=[
        {"role": "system", "content": HA_PROMPT},
        {"role": "user", "content": "Turn off the porch light"}])
    assert answer.done
    calls = answer.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("HassTurnOff", {"name": "porch light"})]


def test_a_remembered_fact_shapes_the_reply(api: Api) -> None:
    remember(api, "The garage code is 8812.")
    parts = ha_chat(api, [{"role": "system", "content": HA_PROMPT},
                          {"role": "user", "content": "What is the garage code?"}],
                    model="quick")  # the offline provider answers from memory
    assert "8812" in "".join(p.message.content or "" for p in parts)


def test_the_same_history_twice_writes_no_duplicate_turn(api: Api,
                                                         upstream: FakeOpenAI) -> None:
    history = [{"role": "system", "content": HA_PROMPT},
               {"role": "user", "content": "Is the porch light on?"},
               {"role": "assistant", "content": "Yes, the porch light is on."},
               {"role": "user", "content": "And how long has it been on?"}]
    first = client(api).chat(model="tiny", stream=False, messages=history)
    sent = upstream.last.body["messages"]
    # the client's history is the short-term context, after Reverie's system message
    assert [m["content"] for m in sent[1:]] == [m["content"] for m in history[1:]]
    again = client(api).chat(model="tiny", stream=False, messages=history)
    assert again.message.content == first.message.content
    said = [t.content for t in turns(NS, "chat")]
    assert said.count("And how long has it been on?") == 1
    assert said.count(first.message.content) == 1
    assert "Is the porch light on?" not in said  # history is context, not written again


def test_format_options_and_think_go_upstream_under_their_openai_names(
        api: Api, upstream: FakeOpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"]}
    client(api).chat(model="tiny", stream=False, format=schema, think="high", keep_alive="5m",
                     options={"temperature": 0.2, "num_predict": 64, "num_ctx": 4096,
                              "top_k": 20, "seed": 7},
                     messages=[{"role": "user", "content": "Answer in JSON, please.",
                                "images": [PNG]}])  # no vision here: left out
    body = upstream.last.body
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": schema}}
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64 and body["seed"] == 7
    assert body["reasoning_effort"] == "high"
    assert not {"num_ctx", "top_k", "keep_alive", "think", "options", "format",
                "images"} & set(body)
    assert body["messages"][-1]["content"] == "Answer in JSON, please."

    client(api).chat(model="tiny", stream=False, format="json",
                     messages=[{"role": "user", "content": "JSON again."}])
    assert upstream.last.body["response_format"] == {"type": "json_object"}


def test_a_channel_with_passthrough_off_keeps_only_the_last_message(
        api: Api, upstream: FakeOpenAI) -> None:
    upstream.auto_tools = True
    parts = ha_chat(api, [{"role": "system", "content": HA_PROMPT},
                          {"role": "user", "content": "Earlier words."},
                          {"role": "assistant", "content": "Earlier reply."},
                          {"role": "user", "content": "Turn on the kitchen light"}],
                    headers={"X-Reverie-Channel": "legacy"})
    body = upstream.last.body
    assert "tools" not in body or not body["tools"]
    assert HA_PROMPT not in body["messages"][0]["content"]
    assert "Earlier words." not in json.dumps(body["messages"])
    assert not any(p.message.tool_calls for p in parts)
    assert "".join(p.message.content or "" for p in parts) == "echo: Turn on the kitchen light"


@pytest.mark.parametrize("messages,why", [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}],
     "a tool result with no tool call before it"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]},
      {"role": "user", "content": "hi"}], "needs a function with a name"),
])
def test_a_malformed_conversation_is_a_400_saying_why(api: Api, messages: list[Any],
                                                      why: str) -> None:
    before = len(turns(NS, "chat"))
    status, answer = _post(api, "/api/chat", json.dumps(
        {"model": "tiny", "stream": False, "messages": messages}).encode(), api.token)
    assert status == 400 and why in answer["error"]
    assert len(turns(NS, "chat")) == before  # nothing written


def test_images_are_left_out_for_a_provider_without_vision(api: Api,
                                                        upstream: FakeOpenAI) -> None:
    c = client(api)
    assert "vision" not in (c.show("tiny").capabilities or [])
    reply = c.chat(model="tiny", messages=[
        {"role": "user", "content": "What is in this picture?", "images": [PNG]}])
    assert reply.message.content
    assert upstream.last.body["messages"][-1] == {"role": "user",
                                                  "content": "What is in this picture?"}
    status, body = _post(api, "/api/chat", json.dumps({"model": "tiny", "stream": False,
        "messages": [{"role": "user", "content": "And this?",
                      "images": ["bm90IGFuIGltYWdl"]}]}).encode(), api.token)
    assert status == 400 and "images[0]" in body["error"]  # base64 of "not an image"


def test_an_ollama_image_becomes_a_data_url_of_its_type() -> None:
    png = base64.b64encode(PNG).decode()
    jpeg = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(20)).decode()
    [m] = ollama_api.client_messages([ollama_api.OllamaMessage(
        role="user", content="look", images=[png, jpeg])])
    assert m.images == ["data:image/png;base64," + png, "data:image/jpeg;base64," + jpeg]
    with pytest.raises(LayerError, match="not base64"):
        ollama_api.client_messages([ollama_api.OllamaMessage(
            role="user", content="look", images=["%%%"])])
