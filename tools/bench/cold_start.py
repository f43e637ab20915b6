#!/usr/bin/env python3
"""Cold start: from process start to the first answered turn.

Usage:
    tools/bench/cold_start.py [--runs 3] [--dashboard on|off|both] [--cold-cache]
                              [--json OUT.json]

Each run spawns a fresh Python process (this script with ``--child``) that does
the whole start-up sequence on a fresh, empty store and reports monotonic
timestamps (CLOCK_MONOTONIC is system-wide, so the parent's spawn time and the
child's timestamps compare directly):

    spawn       the parent calls Popen                            (t = 0)
    imports     interpreter up, ray + actors + runtime imported
    ray init    ``ray.init(address="local", _node_ip_address="127.0.0.1", ...)``
    actors      ``actors.supervisor.start(settings)`` returned (every actor pinged;
                the Embedder actor has loaded the ONNX model and embedded once)
    first turn  ``ray.get(turns.process.remote(UserTurn(...)))`` answered (offline
                LLM: turn written, recalled, prompt built, reply written)

A second turn is timed as well, for comparison with a warm turn, and the
shutdown (Supervisor.stop + ray.shutdown) after it.

Model cache: "warm" uses the usual cache directory (``embedder.cache_dir`` unset:
``~/.cache/reverie/models``); an unmeasured priming run first makes sure the
exported ONNX file exists there (and that the OS file cache holds Ray and the
libraries, as on a hub that has run before). ``--cold-cache`` adds runs with
``embedder.cache_dir`` set to a new empty directory each time, so the Embedder
actor exports the model from the packaged safetensors first.
"""

from __future__ import annotations

import time

T_SCRIPT = time.monotonic()  # as early as possible in the child

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import _common as c  # noqa: E402

PHASES = ("imports", "ray_init", "actors", "first_turn")
FIRST = "Good morning! Could you remind me what is on the calendar today?"
SECOND = "And is there anything I should buy on the way home?"


# -- the child: one start-up sequence ------------------------------------------

def child(args: argparse.Namespace) -> int:
    import ray

    from actors import supervisor
    from actors.common import TURNS, actor
    from actors.messages import TurnReply, UserTurn

    marks: dict[str, float] = {"script": T_SCRIPT, "imports": time.monotonic()}
    sections: dict[str, Any] = {"runtime": {"dashboard": args.dashboard == "on"}}
    if args.cache_dir:
        sections["embedder"] = {"cache_dir": args.cache_dir}
    settings = c.make_settings(Path(args.data_dir), **sections)
    out: dict[str, Any] = {}
    with c.local_ray(settings) as info:
        marks["ray_init"] = time.monotonic()
        sup_wall = time.time()
        sup = supervisor.start(settings)
        marks["actors"] = time.monotonic()
        turns = actor(TURNS, settings.runtime.namespace)
        first: TurnReply = ray.get(turns.process.remote(UserTurn(channel="voice", text=FIRST)),
                                   timeout=300)
        marks["first_turn"] = time.monotonic()
        t = time.monotonic()
        ray.get(turns.process.remote(UserTurn(channel="voice", text=SECOND)), timeout=300)
        out["second_turn_s"] = time.monotonic() - t
        out["reply_provider"] = first.provider
        out["dashboard_url"] = info["dashboard_url"]
        if info["dashboard_url"]:
            out["actor_breakdown"] = breakdown(info["dashboard_url"], sup_wall)
        t = time.monotonic()
        c.stop_runtime(sup)
    out["shutdown_s"] = time.monotonic() - t
    out["marks"] = marks
    print("CHILD-RESULT " + json.dumps(out), flush=True)
    return 0


def breakdown(dashboard_url: str, t0: float) -> list[dict[str, Any]] | str:
    """Per actor: when its creation was submitted, when its constructor started
    (a worker process was ready) and ended, in seconds after supervisor.start was
    called; from Ray's task events (state API, served by the dashboard)."""
    import ray
    from ray.util.state import list_tasks

    job = ray.get_runtime_context().get_job_id()
    time.sleep(2.5)  # task events reach the GCS about once a second
    try:
        tasks = list_tasks(address=f"http://{dashboard_url}", detail=True, limit=1000,
                           filters=[("job_id", "=", job)], raise_on_missing_output=False)
    except Exception as exc:  # the state API is a diagnostic only
        return f"unavailable: {type(exc).__name__}: {exc}"
    out = []
    for t in sorted(tasks, key=lambda t: t.creation_time_ms or 0):
        if t.type != "ACTOR_CREATION_TASK" or not t.start_time_ms or not t.end_time_ms:
            continue
        out.append({"actor": t.name.split(":")[0], "submitted_s": round(
            t.creation_time_ms / 1000 - t0, 3),
            "started_s": round(t.start_time_ms / 1000 - t0, 3),
            "ended_s": round(t.end_time_ms / 1000 - t0, 3)})
    return out


# -- the parent -------------------------------------------------------------

def spawn(dashboard: bool, cache_dir: Path | None, work: Path, label: str) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--data-dir", str(data),
           "--dashboard", "on" if dashboard else "off"]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    load = c.loadavg()
    t_spawn = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900,
                          check=False)
    t_exit = time.monotonic()
    shutil.rmtree(data, ignore_errors=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD-RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise RuntimeError(f"{label}: child failed (exit {proc.returncode})")
    res = json.loads(line.split(" ", 1)[1])
    m = res.pop("marks")
    prev = t_spawn
    phases: dict[str, float] = {}
    for name in PHASES:
        phases[name] = round(m[name] - prev, 3)
        prev = m[name]
    return {"label": label, "dashboard": dashboard, "cold_cache": cache_dir is not None,
            "phases_s": phases, "python_up_s": round(m["script"] - t_spawn, 3),
            "to_first_turn_s": round(m["first_turn"] - t_spawn, 3),
            "second_turn_s": round(res["second_turn_s"], 3),
            "shutdown_s": round(res["shutdown_s"], 3),
            "process_exit_s": round(t_exit - t_spawn, 3),
            "provider": res["reply_provider"], "loadavg_before": load,
            "actor_breakdown": res.get("actor_breakdown")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="measured runs per case")
    ap.add_argument("--dashboard", choices=("on", "off", "both"), default="on",
                    help="include_dashboard (default: on, as configs/reverie.toml)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="also run with an empty embedder cache directory")
    ap.add_argument("--no-prime", action="store_true", help="skip the unmeasured first run")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    # child mode (internal)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    wall = time.perf_counter()

    dashes = {"on": [True], "off": [False], "both": [True, False]}[args.dashboard]
    work = Path(tempfile.mkdtemp(prefix="rvb-cold-"))
    runs: list[dict[str, Any]] = []
    try:
        if not args.no_prime:
            c.log("priming run (not counted): model export cache and OS file cache")
            spawn(dashes[0], None, work, "prime")
        cases = [(d, False) for d in dashes] + ([(d, True) for d in dashes]
                                                 if args.cold_cache else [])
        for dash, cold in cases:
            for i in range(args.runs):
                label = (f"{'cold' if cold else 'warm'} cache, dashboard "
                         f"{'on' if dash else 'off'}, run {i + 1}")
                cache = Path(tempfile.mkdtemp(prefix="models-", dir=work)) if cold else None
                res = spawn(dash, cache, work, label)
                if cache is not None:
                    shutil.rmtree(cache, ignore_errors=True)
                runs.append(res)
                c.log(f"{label}: first turn after {res['to_first_turn_s']:.2f} s "
                      f"({', '.join(f'{k} {v:.2f}' for k, v in res['phases_s'].items())})")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = [[r["label"], *(r["phases_s"][p] for p in PHASES), r["to_first_turn_s"],
             r["second_turn_s"], r["shutdown_s"]] for r in runs]
    cases_summary = []
    for dash, cold in dict.fromkeys((r["dashboard"], r["cold_cache"]) for r in runs):
        sel = [r for r in runs if r["dashboard"] == dash and r["cold_cache"] == cold]
        med = {p: round(statistics.median(r["phases_s"][p] for r in sel), 3) for p in PHASES}
        total = round(statistics.median(r["to_first_turn_s"] for r in sel), 3)
        second = round(statistics.median(r["second_turn_s"] for r in sel), 3)
        label = f"median: {'cold' if cold else 'warm'} cache, dashboard {'on' if dash else 'off'}"
        rows.append([label, *med.values(), total, second,
                     round(statistics.median(r["shutdown_s"] for r in sel), 3)])
        cases_summary.append({"dashboard": dash, "cold_cache": cold, "runs": len(sel),
                              "median_phases_s": med, "median_to_first_turn_s": total,
                              "median_second_turn_s": second})
    shown = next((r for r in runs if isinstance(r.get("actor_breakdown"), list)), None)
    if shown:
        print(f"\nactor start-up inside supervisor.start ({shown['label']}; seconds after "
              "the call; wait = submitted to constructor start, i.e. worker process start):")
        print(c.table(["actor", "submitted", "ctor start", "ctor end", "wait s", "ctor s"],
                      [[a["actor"], a["submitted_s"], a["started_s"], a["ended_s"],
                        round(a["started_s"] - a["submitted_s"], 3),
                        round(a["ended_s"] - a["started_s"], 3)]
                       for a in shown["actor_breakdown"]]))
    print()
    print(c.table(["run", "imports s", "ray init s", "actors s", "first turn s", "total s",
                   "2nd turn s", "shutdown s"], rows))
    wall_s = time.perf_counter() - wall
    summary = "; ".join(
        f"{'cold' if s['cold_cache'] else 'warm'} cache, dashboard "
        f"{'on' if s['dashboard'] else 'off'}: {s['median_to_first_turn_s']:.1f} s "
        f"(ray {s['median_phases_s']['ray_init']:.1f}, actors {s['median_phases_s']['actors']:.1f},"
        f" turn {s['median_phases_s']['first_turn']:.2f})" for s in cases_summary)
    print(f"\nSUMMARY cold_start (median of {args.runs}, process start to first answered turn):"
          f" {summary}; wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "cold_start", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "params": {"runs": args.runs, "dashboard": args.dashboard,
                   "cold_cache": args.cold_cache, "primed": not args.no_prime},
        "cases": cases_summary, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
