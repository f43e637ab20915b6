"""Shared fixtures: real SQLite files in temporary directories, the real model."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI

from runtime.config import Settings, load_settings
from runtime.llm.embedder import Embedder, make_embedder
from runtime.memory import Memory
from runtime.time.clock import ManualClock
from tests.pki import Pki, made_pki

# Every runtime a test starts serves HTTP on a free port, not the default 8765:
# two runtimes may run at once (a module's and a test's own), and the machine's
# 8765 may be taken. `reverie run` subprocesses inherit this.
os.environ.setdefault("REVERIE_HTTP__PORT", "0")


# The modules that take longest (junit totals of a fresh-clone run beside a CPU
# hog, 2026-12-03, run D: test_crash 353 s, test_cron 119, test_cli_jobs 103,
# test_household_move 94, test_actors 81, the rest under 72), longest first:
# collected first, so that under `make test`'s three processes (pytest-xdist,
# --dist loadfile) they start early and the run does not end waiting on one.
SLOW_MODULES = ("test_crash", "test_cron", "test_cli_jobs", "test_household_move", "test_actors",
                "test_cli", "test_http_page", "test_http_fuzz", "test_rollup", "test_cluster",
                "test_janitor_actors", "test_wyoming", "test_pull", "test_cluster_listeners",
                "test_portrait", "test_edge_runtime", "test_turns_llm", "test_replicator",
                "test_listeners", "test_replica_runtime", "test_geo", "test_recall",
                "test_households", "test_http_mcp", "test_digests", "test_mcp_oauth")


def pytest_configure(config: pytest.Config) -> None:
    """One numba cache for the test process and everything it starts (Ray's
    workers, ``reverie run``): UMAP's compile (8-30 s of CPU) is paid once per
    process of the run instead of once per data directory
    (``runtime.mind.rollup.numba_cache_dir``). Set before Ray starts, so its
    workers inherit it."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        cache = Path(tempfile.mkdtemp(prefix="reverie-test-numba-"))
        os.environ["NUMBA_CACHE_DIR"] = str(cache)
        config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(getattr(item.module, "__name__", ""), len(rank))
               if isinstance(item, pytest.Function) else len(rank))  # stable: order kept within


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Loopback servers are reached directly: a proxy from the environment never
    sits between a test and the local HTTP servers it starts."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def embedder(model_cache: Path) -> Embedder:
    """One real ONNX MiniLM session for the whole run (loading costs seconds)."""
    settings = load_settings(env={}, overrides={"embedder": {"cache_dir": str(model_cache)}})
    return make_embedder(settings.embedder)


@pytest.fixture
def make_settings(tmp_path: Path, model_cache: Path) -> Callable[..., Settings]:
    def make(**sections: Any) -> Settings:
        overrides: dict[str, Any] = {
            "store": {"data_dir": str(tmp_path / "data")},
            "embedder": {"cache_dir": str(model_cache)},
            "http": {"port": 0},
        }
        for name, values in sections.items():
            overrides[name] = {**overrides.get(name, {}), **values}
        return load_settings(env={}, overrides=overrides)

    return make


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def memory(make_settings: Callable[..., Settings], clock: ManualClock,
           embedder: Embedder) -> Iterator[Memory]:
    mem = Memory(make_settings(), clock=clock, embedder=embedder)
    yield mem
    mem.close()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    """A fake OpenAI-compatible model server (tests/fake_openai.py) for a module's
    runtime, in ``Mode.OK``; a module may define its own (a slow one, say)."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="session")
def pki() -> Iterator[Pki]:
    """Certificates for the TLS tests (MQTT, IMAP, CalDAV/CardDAV, HTTPS)."""
    with made_pki() as made:
        yield made


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[str]:
    """One real local Ray instance for the whole test session (start-up costs seconds);
    under ``pytest -n 2`` (``make test``) each of the two test processes has its own.

    Yields its GCS address, so that subprocesses (the ``reverie`` command) can join it.
    Like ``reverie run``, it is a node of its own (never one named by ``RAY_ADDRESS``)
    listening on loopback only."""
    import logging

    from actors.discovery import loopback_environment
    from actors.node import LOOPBACK, exposed, hub_node

    loopback_environment()  # Ray may be imported already (test modules import actors)
    import ray

    # The hub's trimmed node, as `reverie run` starts it: no autoscaler monitor,
    # no log monitor (it globbed the session's log directory ten times a second:
    # about 6 % of the suite's CPU), Ray's chores at the hub's periods.
    with hub_node(log_monitor=False):
        ctx: Any = ray.init(address="local", num_cpus=2, object_store_memory=96 * 1024 * 1024,
                            include_dashboard=False, logging_level=logging.WARNING,
                            log_to_driver=False, _node_ip_address=LOOPBACK)
    assert not exposed(ctx.address_info), ctx.address_info
    yield str(ctx.address_info["gcs_address"])
    ray.shutdown()
