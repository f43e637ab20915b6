"""Starting ``reverie run`` in a subprocess for the CLI tests, as a user would."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

REVERIE = [sys.executable, "-m", "actors.cli"]
START_TIMEOUT_S = 300.0


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
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """One client command (``reverie ARGS``) against the runtime ``env`` names."""
    return subprocess.run([*REVERIE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def status(env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """``reverie status --json``, which must succeed."""
    done = reverie(env, "status", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out
