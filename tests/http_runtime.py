"""The actor runtime with its HTTP server, for the HTTP tests: one place that
starts it on the test session's Ray (a namespace and data directory of the
module's own, the HTTP API on a free port) and stops it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors import supervisor
from actors.handles import HttpClient
from actors.http.app import token_path
from runtime.config import Settings, load_settings


@dataclass
class Api:
    settings: Settings
    base: str    # http://127.0.0.1:PORT
    token: str   # the bearer token from <data dir>/http-token


@contextmanager
def http_runtime(namespace: str, data: Path, model_cache: Path,
                 **sections: dict[str, Any]) -> Iterator[Api]:
    """The runtime on ``data``; ``sections`` are settings sections to add (an
    ``http`` section is merged over ``port = 0``)."""
    overrides: dict[str, Any] = {
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": namespace}, "persona": {"global_dir": str(data / "persona")},
        **sections,
        "http": {"port": 0, **sections.get("http", {})},
    }
    settings = load_settings(env={}, overrides=overrides)
    sup = supervisor.start(settings)
    try:
        yield Api(settings, HttpClient(namespace).address(),
                  token_path(settings).read_text().strip())
    finally:
        sup.stop()
