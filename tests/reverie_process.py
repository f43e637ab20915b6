"""Starting ``reverie run`` in a subprocess for the CLI tests, as a user would."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REVERIE = [sys.executable, "-m", "actors.cli"]
START_TIMEOUT_S = 300.0
ROOT = Path(__file__).resolve().parent.parent


def runtime_env(data: Path, namespace: str, model_cache: Path, config: str | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a test's ``reverie run`` and its client commands: its
    data directory, namespace and persona directory, the session's model cache,
    the repository on PYTHONPATH (test jobs), and a configuration file holding
    ``config`` (without it, no file: the packaged defaults); ``extra`` last."""
    env = {**os.environ, "REVERIE_DATA_DIR": str(data), "REVERIE_RUNTIME__NAMESPACE": namespace,
           "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_PERSONA__GLOBAL_DIR": str(data / "persona"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    env.pop("REVERIE_CONFIG", None)
    if config is not None:
        path = data / "reverie.toml"
        path.write_text(config)
        env["REVERIE_CONFIG"] = str(path)
    env.update(extra)
    return env


@contextmanager
def joined_runtime(env: dict[str, str], ray_address: str) -> Iterator[dict[str, str]]:
    """``reverie run --address`` on the test session's Ray instance with ``env``;
    stopped by SIGTERM at the end, which it must answer by exiting 0."""
    proc = start_runtime(env, "--address", ray_address, cwd=ROOT)
    yield env
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def start_runtime(env: dict[str, str], *args: str,
                  cwd: Path | None = None) -> subprocess.Popen[str]:
    """``reverie run ARGS`` with ``env``; returns once it says it is running."""
    proc = subprocess.Popen([*REVERIE, "run", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    def pump() -> None:
        for line in proc.stdout or []:
            lines.put(line)
        lines.put("")  # end of output: the process is gone

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"reverie run did not start: {''.join(seen)}")
        if not line:
            proc.wait(30)
            pytest.fail(f"reverie run exited ({proc.returncode}): {''.join(seen)}")
        seen.append(line)
        if "Ctrl-C to stop" in line:
            return proc
        assert proc.poll() is None, "".join(seen)


def reverie(env: dict[str, str], *args: str, cwd: Path | None = None,
            timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """One client command (``reverie ARGS``) against the runtime ``env`` names.

    When that runtime is joined to this test process's Ray instance, the command's
    code (``actors.cli.main.main``) runs here, with ``env`` as the environment and
    ``cwd`` as the directory: the same parser, settings, actors' clients and exit
    codes, without a new Python process and Ray driver (about 1.1 CPU-s and 1.7 s
    each, most of the CLI modules' time). Otherwise, and for anything the command
    line itself decides (no runtime; another Ray cluster), a real ``reverie``
    process: :func:`reverie_process`."""
    if _joined_here(env):
        return _in_process(env, list(args), cwd, stdin)
    return reverie_process(env, *args, cwd=cwd, timeout=timeout, stdin=stdin)


def reverie_process(env: dict[str, str], *args: str, cwd: Path | None = None,
                    timeout: float = 300, stdin: str | None = None
                    ) -> subprocess.CompletedProcess[str]:
    """One client command (``reverie ARGS``) in its own process, as a user runs it."""
    return subprocess.run([*REVERIE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, input=stdin)


def _joined_here(env: dict[str, str]) -> bool:
    """Whether the runtime ``env`` names runs on this process's Ray instance."""
    ray = sys.modules.get("ray")
    data = env.get("REVERIE_DATA_DIR")
    if ray is None or not ray.is_initialized() or not data:
        return False
    try:
        info = json.loads((Path(data) / "runtime.json").read_text())
    except (OSError, ValueError):
        return False
    here: str = ray.get_runtime_context().gcs_address
    return isinstance(info, dict) and info.get("address") == here


_IN_PROCESS = threading.Lock()


def _in_process(env: dict[str, str], args: list[str], cwd: Path | None,
                stdin: str | None) -> subprocess.CompletedProcess[str]:
    """``reverie ARGS`` through ``actors.cli.main.main`` in this process: the
    environment, directory, stdin, stdout and stderr (and the root logger's
    output, which a process would write to its stderr) swapped for the call."""
    import contextlib
    import io
    import logging

    from actors.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    saved_handlers, saved_level = list(root.handlers), root.level
    with _IN_PROCESS:
        try:
            os.environ.clear()
            os.environ.update(env)
            if cwd is not None:
                os.chdir(cwd)
            sys.stdin = io.StringIO(stdin or "")
            root.addHandler(handler)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(args)
                except SystemExit as exc:  # argparse: --help (None), a usage error (2)
                    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            root.handlers[:] = saved_handlers  # main's logging.basicConfig, undone
            root.setLevel(saved_level)
            sys.stdin = saved_stdin
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    return subprocess.CompletedProcess([*REVERIE, *args], code, out.getvalue(), err.getvalue())


def status(env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """``reverie status --json``, which must succeed."""
    done = reverie(env, "status", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out
