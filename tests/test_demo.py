"""``python -m runtime``: the demonstration never writes into the user's data.

The real module runs in a subprocess, with the real ONNX model (from the
session's model cache). XDG_CACHE_HOME points at a directory of its own:
onnxruntime (1.32) writes a device id and a telemetry database into the user's
cache directory on import, which is a cache, not the user's data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.llm.embedder import Embedder

REPO = Path(__file__).resolve().parent.parent


def _dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {name: tmp_path / name for name in ("home", "data", "tmp", "cache")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def _run(dirs: dict[str, Path], model_cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REVERIE_", "XDG_"))}
    env.update(HOME=str(dirs["home"]), REVERIE_DATA_DIR=str(dirs["data"]),
               TMPDIR=str(dirs["tmp"]), XDG_CACHE_HOME=str(dirs["cache"]),
               REVERIE_EMBEDDER__CACHE_DIR=str(model_cache))
    return subprocess.run([sys.executable, "-m", "runtime", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)


def _contents(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.timeout(300)
def test_demo_leaves_home_and_the_data_dir_empty(tmp_path: Path, model_cache: Path,
                                                 embedder: Embedder) -> None:
    # `embedder` has exported the model into model_cache once for the session.
    dirs = _dirs(tmp_path)
    run = _run(dirs, model_cache)
    assert run.returncode == 0, run.stderr
    for name in ("home", "data"):
        assert _contents(dirs[name]) == [], name
    # the temporary store is gone as well (other tools may leave their own files in TMPDIR)
    assert not list(dirs["tmp"].glob("reverie-demo-*"))
    store_line = next(line for line in run.stdout.splitlines() if line.startswith("store: "))
    assert store_line.startswith(f"store: {dirs['tmp']}{os.sep}reverie-demo-")
    assert "temporary" in store_line
    # the demo did work: the sister's city was recalled
    answer = run.stdout.split("> Where does my sister live?")[1].split("\n> ")[0]
    assert "Porto" in answer
    assert not [p for p in _contents(dirs["cache"]) if "reverie" in p.lower()]


@pytest.mark.timeout(300)
def test_demo_with_data_dir_keeps_its_store_there(tmp_path: Path, model_cache: Path,
                                                  embedder: Embedder) -> None:
    dirs = _dirs(tmp_path)
    chosen = tmp_path / "chosen"
    run = _run(dirs, model_cache, "--data-dir", str(chosen))
    assert run.returncode == 0, run.stderr
    assert f"store: {chosen / 'reverie.db'}" in run.stdout
    assert (chosen / "reverie.db").is_file()
    for name in ("home", "data"):
        assert _contents(dirs[name]) == [], name
