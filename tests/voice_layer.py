"""What the memory layer's tests share (tests/test_voice_layer.py,
test_responses_api.py, test_voice_ollama.py): the runtime with the fake
upstream model as its provider, and reading back what the layer stored and
what went upstream."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fake_openai import FakeOpenAI
from http_runtime import Api, http_runtime

from actors.handles import TranscriptClient
from actors.messages import RecentTurns

# The channels every layer test has; a module adds its own.
CHANNELS: dict[str, dict[str, Any]] = {
    "chat": {}, "voice": {"spoken": True}, "cli": {},
    "dmn": {"seed": False, "background": True}}


@contextmanager
def layer_runtime(namespace: str, data: Path, model_cache: Path, upstream: FakeOpenAI,
                  models: dict[str, str], channels: dict[str, dict[str, Any]],
                  vision: bool = False) -> Iterator[Api]:
    """The runtime on ``data`` whose one provider is ``upstream`` (model
    ``tiny``, reading images if ``vision``), with the ``[http.models]`` aliases
    ``models`` and the channels :data:`CHANNELS` and ``channels``."""
    with http_runtime(namespace, data, model_cache,
                      llm={"providers": [{"name": "local", "base_url": upstream.base_url,
                                          "model": "tiny", "timeout_s": 30,
                                          "vision": vision}]},
                      http={"models": models},
                      channels={**CHANNELS, **channels}) as started:
        yield started


# The smallest PNG (a 1x1 transparent pixel), as clients send images.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEA"
                       "wS2OUAAAAABJRU5ErkJggg==")


def remember(api: Api, text: str) -> None:
    """An explicit memory through ``POST /v1/memories``."""
    r = httpx.post(f"{api.base}/v1/memories", json={"text": text},
                   headers={"Authorization": f"Bearer {api.token}"}, timeout=60)
    assert r.status_code == 201, r.text


def turns(namespace: str, channel: str) -> list[Any]:
    """The channel's stored turns, oldest first (every write in)."""
    transcript = TranscriptClient(namespace)
    transcript.flush()
    return transcript.recent(RecentTurns(channel=channel, limit=200)).turns


def tool_calls_of(namespace: str, api: Api, turn_id: int) -> list[tuple[str, Any, str | None]]:
    """The tool calls stored with turn ``turn_id``: name, arguments, result."""
    TranscriptClient(namespace).flush()
    path = api.settings.store.resolved_dir / api.settings.store.file
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT name, arguments, result FROM tool_calls "
                          "WHERE transcript_id = ? ORDER BY id", (turn_id,)).fetchall()
    return [(name, json.loads(arguments), result) for name, arguments, result in rows]


def requests_since(upstream: FakeOpenAI, count: int) -> list[dict[str, Any]]:
    """The bodies of the requests the upstream got after its first ``count``."""
    return [r.body for r in upstream.requests[count:]]
