"""The actor runtime on the test session's Ray with the fake OpenAI-compatible
server (tests/fake_openai.py) as its model: one place that starts and stops it
for the modules that test a job or the prompt through the actors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI

from actors import supervisor
from runtime.config import Settings, load_settings


def llm_settings(namespace: str, data: Path, model_cache: Path, server: FakeOpenAI,
                 timeout_s: float = 10.0, **sections: dict[str, Any]) -> Settings:
    """Settings on ``data`` whose only model is ``server``; ``sections`` are added."""
    return load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": namespace}, "persona": {"global_dir": str(data / "persona")},
        "llm": {"providers": [{"name": "local", "base_url": server.base_url, "model": "tiny",
                               "timeout_s": timeout_s}]},
        **sections,
    })


@contextmanager
def llm_runtime(settings: Settings) -> Iterator[Settings]:
    """Every actor of ``settings`` started, and stopped afterwards."""
    sup = supervisor.start(settings)
    try:
        yield settings
    finally:
        sup.stop()
