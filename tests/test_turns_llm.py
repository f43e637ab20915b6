"""The turn path with an OpenAI-compatible model configured (a local server speaking
the chat-completions API), its persona files, and its fallback to the offline provider."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from fake_openai import FakeOpenAI, Mode

from actors import supervisor
from actors.common import actor, unwrap
from actors.messages import UserTurn
from runtime.config import Settings, load_settings

NS = "test-turns-llm"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(slow_s=5.0) as fake:
        yield fake


@pytest.fixture(scope="module")
def runtime(ray_instance: str, server: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("llm-data")
    persona = data / "persona"
    persona.mkdir()
    (persona / "SOUL.md").write_text("You are Wren, a calm household assistant.")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(persona)},
        "llm": {"providers": [{"name": "local", "base_url": server.base_url,
                               "model": "tiny", "timeout_s": 1}]},
    })
    sup = supervisor.start(settings)
    yield settings
    ray.get(sup.stop.remote(), timeout=120)
    ray.kill(sup)


def say(text: str, channel: str = "chat") -> Any:
    try:
        reply = ray.get(actor("turns", NS).process.remote(UserTurn(channel=channel, text=text)),
                        timeout=120)
    except ray.exceptions.RayTaskError as exc:
        raise unwrap(exc) from None
    ray.get(actor("transcript", NS).flush.remote(), timeout=60)
    return reply


def test_model_gets_persona_memories_and_history(runtime: Settings, server: FakeOpenAI) -> None:
    server.mode = Mode.OK
    told = say("We keep the hedge trimmer in the blue shed.", channel="voice")
    assert told.provider == "local" and told.text.startswith("echo:")
    reply = say("Where is the hedge trimmer kept?")
    assert reply.provider == "local"
    assert f"turn:{told.turn_id}" in reply.citations
    body = server.last.body
    assert body["model"] == "tiny"
    system = body["messages"][0]
    assert system["role"] == "system"
    assert "You are Wren" in system["content"]
    assert "blue shed" in system["content"] and f"[turn:{told.turn_id}]" in system["content"]
    assert body["messages"][-1] == {"role": "user", "content": "Where is the hedge trimmer kept?"}


def test_failing_model_falls_back_and_then_shows_a_notice(runtime: Settings,
                                                          server: FakeOpenAI) -> None:
    server.mode = Mode.HTTP_500
    first = say("What day is the recycling collected?")
    assert first.provider == "offline" and first.notice is None
    second = say("And the garden waste?")
    assert second.provider == "offline"
    assert second.notice is not None and "failing" in second.notice
    server.mode = Mode.SLOW  # a timeout is a failure too, never a hang
    assert say("Anything else?").provider == "offline"
    server.mode = Mode.OK
    recovered = say("Thanks!")
    assert recovered.provider == "local" and recovered.notice is None
