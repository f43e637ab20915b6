#!/usr/bin/env python3
"""What a process that wakes N times a second costs this machine, doing nothing else.

Usage:
    tools/bench/wake_cost.py [--seconds 20] [--rates 100,10] [--json OUT.json]

Every idle Ray worker wakes 100 times a second: Ray's core worker re-arms a
10 ms timer (``CoreWorker.CheckSignals``, a constant in its C++) on the
worker's main thread, whatever the actor does. This bench prices that wake
alone, without Ray: for each rate, a child Python process sleeps
``1 / rate`` seconds in a loop for ``--seconds``, and its CPU time is read
from ``/proc/<pid>/schedstat`` (the scheduler's own run time in ns, not
sampled at ticks) before and after. It prints the share of one core and
the CPU time per wake. Compare the 100/s figure with an idle actor's in
``tools/bench/footprint.py --cpu-window 60``: when they match, the actor's
idle cost is the wake-ups themselves.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import _common as c

LOOP = (
    "import time, sys\n"
    "period = float(sys.argv[1]); end = time.monotonic() + float(sys.argv[2])\n"
    "print('ready', flush=True)\n"
    "while time.monotonic() < end:\n"
    "    time.sleep(period)\n"
)


def run_time_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def measure(rate: float, seconds: float) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(1.0 / rate), str(seconds + 2)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # started: the interpreter's own start is not counted
        time.sleep(1.0)
        before, t0 = run_time_ns(proc.pid), time.monotonic()
        time.sleep(seconds)
        after, t1 = run_time_ns(proc.pid), time.monotonic()
    finally:
        proc.wait(timeout=seconds + 10)
    cpu_s = (after - before) / 1e9
    wakes = rate * (t1 - t0)
    return {"rate_per_s": rate, "seconds": round(t1 - t0, 2),
            "core_pct": round(100 * cpu_s / (t1 - t0), 3),
            "us_per_wake": round(1e6 * cpu_s / wakes, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per rate")
    ap.add_argument("--rates", default="100,10", help="wakes per second, comma-separated")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not rates or any(r <= 0 for r in rates):
        ap.error("--rates: positive numbers, comma-separated")
    results = []
    for rate in rates:
        c.log(f"sleeping 1/{rate:g} s in a loop for {args.seconds:g} s")
        results.append(measure(rate, args.seconds))
    print()
    print(f"{'wakes/s':>8}  {'% of a core':>11}  {'us per wake':>11}")
    for r in results:
        print(f"{r['rate_per_s']:>8g}  {r['core_pct']:>11.2f}  {r['us_per_wake']:>11.1f}")
    print("\nSUMMARY wake_cost: " + "; ".join(
        f"{r['rate_per_s']:g}/s: {r['core_pct']:.2f} % of a core, {r['us_per_wake']:.0f} us a wake"
        for r in results))
    c.write_json(args.json_out, {"bench": "wake_cost", "machine": c.machine(),
                                 "loadavg": c.loadavg(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
