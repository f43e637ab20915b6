"""The Ollama-compatible API as Home Assistant's Ollama integration calls it,
driven by the ``ollama`` client it uses, against the running runtime (the fake
OpenAI-compatible server as the upstream model).

Home Assistant (homeassistant/components/ollama): the config flow validates the
server with ``list()`` (a 401/403 is "invalid_auth"), offers the listed models,
and ``pull(model)`` (not streamed) when the chosen one is not listed; the
coordinator polls ``list()`` and ``ps()`` together (a 401 there is a failed
authentication) and the sensors read ``ps().models[].model``, ``size`` and
``size_vram``."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ollama
import pytest
from fake_openai import FakeOpenAI
from http_runtime import Api, http_runtime

NS = "test-voice-ollama"

DETAILS = ("format", "family", "families", "parameter_size", "quantization_level")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def api(ray_instance: str, upstream: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
        model_cache: Path) -> Iterator[Api]:
    with http_runtime(NS, tmp_path_factory.mktemp("voice-ollama"), model_cache,
                      llm={"providers": [{"name": "local", "base_url": upstream.base_url,
                                          "model": "tiny", "timeout_s": 30}]},
                      http={"models": {"quick": "offline"}}) as started:
        yield started


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
