#!/usr/bin/env python3
"""Memory footprint (PSS) of the whole actor runtime, idle, with and without the dashboard.

Usage:
    tools/bench/footprint.py [--dashboard both|on|off] [--settle 15] [--memories 0]
                             [--json OUT.json]

For each case a private local Ray node is started from this driver
(``ray.init(address="local", _node_ip_address="127.0.0.1")``, object store
bounded by ``runtime.object_store_mb``, ``include_dashboard`` on or off), then
the actor runtime on a fresh store (``actors.supervisor.start``: Transcript,
Recall (with the embedding model), Episodes, Graph, Turns, Cron, Http). With ``--memories N``,
N synthetic turns are first written through the Transcript actor and indexed.
After ``--settle`` seconds idle, the processes are sampled ``--samples`` times,
``--interval`` seconds apart (the median per process is reported).

Which processes: every descendant of the driver (Ray's local mode starts
gcs_server, raylet, the dashboard, log and autoscaler monitors as the driver's
children; the raylet starts the workers, actors and agents as its children),
found by walking parent pids in /proc; plus any other process whose command
line mentions this node's session or temp directory; plus the driver itself.
Ray gives many of them a process title (``ray::RecallActor``,
``ray::IDLE``, ``ray::DashboardAgent``), used as their name.

What: ``Pss`` from /proc/<pid>/smaps_rollup (proportional set size: each
shared page divided among the processes mapping it, so the sum over processes
counts shared libraries and the shared-memory object store once), with its
``Pss_Anon`` / ``Pss_File`` / ``Pss_Shmem`` parts and ``Rss`` for comparison
(RSS sums count shared pages several times).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import _common as c

from actors import supervisor
from actors.common import RECALL, TRANSCRIPT, actor
from actors.messages import AppendTurns

FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Private_Clean",
          "Private_Dirty", "Swap")


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces
        rest = stat[stat.rfind(")") + 2:].split()
        out[int(entry)] = int(rest[1])
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def ray_processes(markers: list[str]) -> dict[int, str]:
    """pid -> command line of the driver, its descendants, and processes naming a marker."""
    me = os.getpid()
    parents = _ppid_map()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found = {me}
    stack = [me]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    for pid in parents:
        if pid not in found:
            line = cmdline(pid)
            if any(m and m in line for m in markers):
                found.add(pid)
    return {pid: cmdline(pid) for pid in sorted(found) if cmdline(pid) or pid == me}


def role(pid: int, line: str) -> str:
    if pid == os.getpid():
        return "driver (this script)"
    first = line.split(" ", 1)[0]
    if first.startswith("ray::") or first.startswith("ray-dashboard-"):
        return first
    if "multiprocessing.forkserver" in line:
        return "mp forkserver (dashboard)"
    if "multiprocessing.resource_tracker" in line:
        return "mp resource_tracker"
    for name in ("gcs_server", "raylet", "dashboard.py", "log_monitor.py", "monitor.py",
                 "agent.py", "runtime_env_agent", "default_worker.py"):
        if name in line:
            return name
    return os.path.basename(first)[:40]


def smaps(pid: int) -> dict[str, int] | None:
    """Fields of /proc/<pid>/smaps_rollup, in KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            text = fh.read()
    except OSError:
        return None
    out = dict.fromkeys(FIELDS, 0)
    for ln in text.splitlines():
        key, _, value = ln.partition(":")
        if key in out:
            out[key] = int(value.split()[0])
    return out


def sample(markers: list[str], samples: int, interval: float) -> list[dict[str, Any]]:
    per_pid: dict[int, list[dict[str, int]]] = {}
    lines: dict[int, str] = {}
    for i in range(samples):
        if i:
            time.sleep(interval)
        for pid, line in ray_processes(markers).items():
            mem = smaps(pid)
            if mem is not None:
                per_pid.setdefault(pid, []).append(mem)
                lines[pid] = line
    procs = []
    for pid, mems in per_pid.items():
        med = {k: statistics.median(m[k] for m in mems) for k in FIELDS}
        procs.append({"pid": pid, "role": role(pid, lines[pid]), "cmdline": lines[pid][:300],
                      "samples": len(mems),
                      **{f"{k.lower()}_mib": round(v / 1024, 2) for k, v in med.items()}})
    procs.sort(key=lambda p: -p["pss_mib"])
    return procs


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process, in clock ticks (/proc/<pid>/stat fields 14, 15)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def idle_cpu(markers: list[str], window_s: float) -> dict[str, Any]:
    """CPU used by every runtime process over ``window_s`` idle seconds, as % of one core."""
    hz = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    procs = {pid: line for pid, line in ray_processes(markers).items() if pid != me}
    start = {pid: cpu_ticks(pid) for pid in procs}
    time.sleep(window_s)
    rows = []
    for pid, line in procs.items():
        end, begin = cpu_ticks(pid), start[pid]
        if end is None or begin is None:
            continue
        rows.append({"pid": pid, "role": role(pid, line),
                     "pct_of_core": round(100 * (end - begin) / hz / window_s, 2)})
    rows.sort(key=lambda r: -r["pct_of_core"])
    return {"window_s": window_s, "total_pct_of_core": round(sum(r["pct_of_core"]
                                                                 for r in rows), 2),
            "processes": rows}


def populate(ns: str, n: int) -> None:
    import ray

    th, rh = actor(TRANSCRIPT, ns), actor(RECALL, ns)
    turns = list(c.household_turns(n))
    for i in range(0, n, 64):
        ray.get(th.append.remote(AppendTurns(turns=turns[i:i + 64])), timeout=300)
    ray.get(th.flush.remote(), timeout=900)
    while ray.get(rh.sync.remote(), timeout=900).added:
        pass


@contextmanager
def edge_services(work: Path) -> Iterator[dict[str, Any]]:
    """A real Mosquitto on a free loopback port for the MQTT bridge to connect to.
    The GPS reader is switched on too; with no receiver here it polls a gpsd port
    nobody answers (back-off), which costs the same memory as reading one."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    conf = work / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c",
                             str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        yield {"mqtt": {"host": "127.0.0.1", "port": port},
               "gps": {"enabled": True, "port": 1}}
    finally:
        proc.terminate()
        proc.wait(10)


def run_case(dashboard: bool, args: argparse.Namespace, work: Path,
             edge: dict[str, Any] | None = None) -> dict[str, Any]:
    data = work / f"data-{'dash' if dashboard else 'nodash'}"
    settings = c.make_settings(data, **(edge or {}))
    with c.local_ray(settings, dashboard=dashboard) as info:
        started = time.perf_counter()
        sup = supervisor.start(settings)
        ready_s = time.perf_counter() - started
        try:
            if args.memories:
                c.log(f"  writing {args.memories:,} memories through the Transcript actor")
                populate(settings.runtime.namespace, args.memories)
            c.log(f"  actors ready in {ready_s:.1f} s; settling {args.settle:.0f} s")
            time.sleep(args.settle)
            markers = [info["session_dir"] or "", info["temp_dir"]]
            procs = sample(markers, args.samples, args.interval)
            cpu = idle_cpu(markers, args.cpu_window) if args.cpu_window else None
        finally:
            c.stop_runtime(sup)
    totals = {k: round(sum(p[k] for p in procs), 1)
              for k in ("pss_mib", "pss_anon_mib", "pss_file_mib", "pss_shmem_mib", "rss_mib")}
    driver = next((p["pss_mib"] for p in procs if p["role"].startswith("driver")), 0.0)
    return {"dashboard": dashboard, "processes": procs, "n_processes": len(procs),
            "total": totals, "total_without_driver_pss_mib": round(totals["pss_mib"] - driver, 1),
            "actors_ready_s": round(ready_s, 2), "ray_init_s": round(info["init_s"], 2),
            "dashboard_url": info["dashboard_url"], "memories": args.memories,
            "edge": bool(edge and "mqtt" in edge), "replica": bool(edge and "replica" in edge),
            "idle_cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dashboard", choices=("both", "on", "off"), default="both")
    ap.add_argument("--settle", type=float, default=15.0, help="idle seconds before sampling")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--memories", type=int, default=0,
                    help="write this many turns through the actors first (default 0)")
    ap.add_argument("--cpu-window", type=float, default=0.0,
                    help="also measure idle CPU over this many seconds (the driver excluded)")
    ap.add_argument("--edge", action="store_true",
                    help="the MQTT bridge (a local Mosquitto) and the GPS reader on")
    ap.add_argument("--replica", action="store_true",
                    help="Litestream on, replicating to a directory")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    wall = time.perf_counter()
    cases = {"both": [False, True], "on": [True], "off": [False]}[args.dashboard]

    work = Path(tempfile.mkdtemp(prefix="rvb-footprint-"))
    results = []
    try:
        for dash in cases:
            c.log(f"dashboard {'on' if dash else 'off'}: starting Ray and the actors")
            with edge_services(work) if args.edge else nullcontext() as edge:
                sections = dict(edge or {})
                if args.replica:
                    sections["replica"] = {"url": f"file://{work}/replica-{int(dash)}"}
                results.append(run_case(dash, args, work, sections or None))
            c.log(f"  total PSS {results[-1]['total']['pss_mib']:.0f} MiB in "
                  f"{results[-1]['n_processes']} processes")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for res in results:
        print(f"\n== dashboard {'on' if res['dashboard'] else 'off'}: "
              f"{res['n_processes']} processes ==")
        rows = [[p["role"], p["pid"], p["pss_mib"], p["pss_anon_mib"], p["pss_file_mib"],
                 p["pss_shmem_mib"], p["rss_mib"]] for p in res["processes"]]
        t = res["total"]
        rows.append(["TOTAL", len(res["processes"]), t["pss_mib"], t["pss_anon_mib"],
                     t["pss_file_mib"], t["pss_shmem_mib"], t["rss_mib"]])
        print(c.table(["process", "pid", "PSS MiB", "anon", "file", "shmem", "RSS MiB"], rows))
        if res["idle_cpu"]:
            cpu = res["idle_cpu"]
            print(f"\nidle CPU over {cpu['window_s']:.0f} s: {cpu['total_pct_of_core']:.1f} % of"
                  " one core")
            print(c.table(["process", "pid", "% of a core"],
                          [[p["role"], p["pid"], p["pct_of_core"]] for p in cpu["processes"]
                           if p["pct_of_core"] > 0]))
    wall_s = time.perf_counter() - wall
    on = ("edge on; " if args.edge else "") + ("replica on; " if args.replica else "")
    summary = on + "; ".join(
        f"dashboard {'on' if r['dashboard'] else 'off'}: {r['total']['pss_mib']:.0f} MiB PSS "
        f"in {r['n_processes']} processes ({r['total_without_driver_pss_mib']:.0f} without "
        f"the driver)" for r in results)
    print(f"\nSUMMARY footprint (idle, {args.memories:,} memories): {summary}; "
          f"wall {wall_s:.0f} s")
    c.write_json(args.json_out, {
        "benchmark": "footprint", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "params": vars(args) | {"method": "PSS from /proc/<pid>/smaps_rollup over the driver,"
                                " its descendants and processes naming the session dir"},
        "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
