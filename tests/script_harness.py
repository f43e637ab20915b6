"""A test module run as a script in a subprocess (its own Ray cluster, away from
the test session's Ray), driven line by line: the test writes a command on its
stdin, the script acts and prints one reply line, ``REPLY`` then JSON. Used by
``tests/test_cluster.py`` and ``tests/test_household_move.py``."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPLY = "@@ "


class Harness:
    def __init__(self, proc: subprocess.Popen[str], call_timeout_s: float) -> None:
        self.proc = proc
        self.call_timeout_s = call_timeout_s
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout or []:
            self.output.append(line)
            if line.startswith(REPLY):
                self.lines.put(line[len(REPLY):])
        self.lines.put(None)

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the harness did not answer in {timeout:.0f} s:\n"
                        + "".join(self.output[-40:]))
        if line is None:
            pytest.fail(f"the harness exited ({self.proc.wait()}):\n"
                        + "".join(self.output[-40:]))
        reply: dict[str, Any] = json.loads(line)
        assert "error" not in reply, reply["error"] + "\n" + "".join(self.output[-40:])
        return reply

    def call(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(self.call_timeout_s if timeout is None else timeout)


@contextmanager
def script_harness(script: Path, *args: str, start_timeout_s: float,
                   call_timeout_s: float) -> Iterator[Harness]:
    """``script ARGS`` started (Ray's variables of the test session not passed on),
    once it answered its start; at the end its stdin closed (it stops its driver
    and nodes), killed if it has not exited within two minutes."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    harness = Harness(proc, call_timeout_s)
    try:
        harness.answer(start_timeout_s)  # started
        yield harness
    finally:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.close()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
