"""What moving a small household costs: ``reverie household move`` on a two-node
``ray.cluster_utils.Cluster`` (the harness of ``tests/test_household_move.py``).

    python tools/bench/household_move.py --turns 20 --json OUT

Tells household ``smith`` ``--turns`` turns through the turn path, then moves it
hub → b (b's owners not running yet: they start as part of the move), b → hub,
hub → b again (every owner running), and writes each move's steps
(``target_owners``, ``drain``, ``final_sync``, ``restore``, ``flip``,
``retire``, seconds) and whether the turns were all there after it:
``{"results": [{"move", "seconds", "steps", "turns_before", "turns_after"}]}``.
Run it under ``nice -n 10`` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPLY = "@@ "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="move-bench-") as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "test_household_move.py"),
                                 tmp, str(models)], env=env, cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdin is not None and proc.stdout is not None

        def answer() -> dict[str, Any]:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(REPLY):
                    got: dict[str, Any] = json.loads(line[len(REPLY):])
                    if "error" in got:
                        raise SystemExit(got["error"])
                    return got
            raise SystemExit(f"the harness exited ({proc.wait()})")

        def call(command: str) -> dict[str, Any]:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            return answer()

        answer()  # started
        results = []
        for _ in range(max(1, args.turns // 3)):
            call("turns")
        for label, node in (("hub->b (b's owners start)", "b"), ("b->hub", "hub"),
                            ("hub->b (owners running)", "b")):
            got = call(f"move_to {node}")
            report = got["report"]
            results.append({"move": label, "seconds": report["seconds"],
                            "steps": report["steps"], "turns_before": got["turns_before"],
                            "turns_after": got["turns_after"],
                            "store_turns": report["restored"]["turns"]})
            print(json.dumps(results[-1]), flush=True)
        proc.stdin.close()
        proc.wait(timeout=120)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
