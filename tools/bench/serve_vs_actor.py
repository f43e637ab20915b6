#!/usr/bin/env python3
"""Ray Serve against one plain actor for the HTTP server (issue 11): PSS, latency, cold start.

Usage:
    tools/bench/serve_vs_actor.py [--cases actor,actor-uvloop,serve] [--settle 15]
                                  [--requests 500] [--concurrent-requests 2000]
                                  [--json OUT.json]

Needs Ray Serve's extra (``pip install "ray[serve]==<ray's version>"``) for the
``serve`` case only; Reverie itself does not depend on it or import it.

Every case runs on a fresh private local Ray node (``_common.local_ray``:
``address="local"``, node IP 127.0.0.1, its own temp directory, the dashboard
off, no autoscaler or log monitor: the settings ``reverie run`` starts its node
with). On it:

1. a trivial actor ``Echo`` (``num_cpus=0``; ``echo(s)`` returns ``s``), the
   actor the ``/echo`` route calls; ``--settle`` seconds idle, then the node's
   processes are sampled (``footprint.sample``: PSS from
   ``/proc/<pid>/smaps_rollup`` of the driver, its descendants and anything
   naming the node's session directory; median of ``--samples``): the *bare*
   figure;
2. the HTTP server, timed from the call that starts it to the first answered
   ``GET /ping`` (polled every 10 ms, a new connection each; ``cold start``):
     actor         one plain Ray actor (``num_cpus=0``) that binds 127.0.0.1 on a
                   free port itself (``socket.socket(AF_INET, SOCK_STREAM,
                   IPPROTO_TCP)``, as ``actors/http/server.py``: with protocol 0 asyncio
                   leaves Nagle on and each answer waits ≈ 40 ms for the client's
                   delayed ACK) and runs uvicorn on it in one thread, with asyncio's
                   loop and h11, which is what Reverie's venv runs (no uvloop nor
                   httptools in it). ``RAY_USE_UVLOOP=0`` for the whole node: once
                   uvloop is installed (``ray[serve]`` brings it), every Ray worker
                   installs it as its event loop (``ray._private.async_compat``);
     actor-uvloop  the same actor with Ray's default (uvloop installed in every
                   worker) and uvicorn on uvloop and httptools: the stack Serve's
                   proxy runs, so that the stack and the architecture can be told
                   apart;
     serve         ``serve.start(http_options={"host": "127.0.0.1", "port": P})``
                   (P a free port) then ``serve.run`` of one deployment
                   (``@serve.deployment(num_replicas=1,
                   ray_actor_options={"num_cpus": 0})`` + ``@serve.ingress(app)``)
                   with the same two routes: a controller, a proxy (uvicorn, on
                   uvloop and httptools) and a replica;
   the FastAPI app is the same: ``GET /ping`` answers ``{"ok": true}`` without
   calling any actor; ``GET /echo?q=…`` calls ``Echo.echo`` once with ``ray.get``
   (one hop, as Reverie's routes call its actors through their blocking clients:
   both routes are plain ``def``, run in the thread pool);
3. ``--settle`` seconds idle, then sampled again: the processes that were not
   there (or had another name: a prestarted ``ray::IDLE`` worker may become the
   actor) are the *extra* ones; ``Δ`` is the total PSS (without the driver)
   over the bare figure of the same node, the driver's own change apart (Serve
   is imported and driven from it). The sockets listening in the node's
   processes are read from ``/proc/net/tcp{,6}`` (inode → pid through
   ``/proc/<pid>/fd``) before and after: the new ones are listed with their
   address, to check that nothing listens beyond loopback (one that does is
   probed: a TCP connection to it through this machine's address on its
   default route, which other hosts of the network would use);
4. latency, from this process with ``http.client``: ``--warmup`` requests per
   route, then ``--requests`` per route on one keep-alive connection, in blocks
   of 50 alternating ``/ping`` and ``/echo`` (drift hits both); then 4 threads,
   each with its own keep-alive connection, share ``--concurrent-requests``
   requests of one route (requests/s = requests / wall time); then the
   processes are sampled once more (``after load``, not settled).

Every figure is printed, nothing is asserted. One run on a shared 2-core
machine: the load average before and after each case is in the JSON.
"""

from __future__ import annotations

import os
import sys

# tools/bench/http.py would shadow the standard library's ``http`` package: keep
# this directory off sys.path (and so off Ray's workers' path) except to import
# the two sibling modules below.
HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != HERE]

import argparse  # noqa: E402
import http.client  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.append(HERE)
import _common as c  # noqa: E402
import footprint as fp  # noqa: E402

sys.path.remove(HERE)

from actors.discovery import is_loopback  # noqa: E402

ECHO = "bench-echo"
HTTP_ACTOR = "bench-http"
SERVE_APP = "bench"
CONCURRENCY = 4
BLOCK = 50
CASES = ("actor", "actor-uvloop", "serve")


# -- what runs in the workers (pickled by value: nothing from _common here) ------

class Echo:
    """The actor ``/echo`` calls: one hop, no work."""

    def echo(self, s: str) -> str:
        return s


def make_app(echo: Any) -> Any:
    """The FastAPI app of the plain actor: ``/ping`` (no actor call), ``/echo`` (one)."""
    import ray
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/echo")
    def echo_route(q: str = "x") -> dict[str, str]:
        return {"echo": ray.get(echo.echo.remote(q), timeout=30)}

    return app


def listen_loopback() -> socket.socket:
    # IPPROTO_TCP, not 0, as actors/http/server.py: asyncio sets TCP_NODELAY on accepted
    # connections only when the listening socket's protocol says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class HttpServer:
    """uvicorn + the FastAPI app in one thread of one actor (as ``actors/http/server.py``)."""

    def __init__(self, namespace: str, loop: str, protocol: str) -> None:
        import ray
        import uvicorn

        app = make_app(ray.get_actor(ECHO, namespace=namespace))
        self._sock = listen_loopback()
        self._address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                                loop=loop, http=protocol)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()

    def address(self) -> str:
        return self._address

    def stack(self) -> dict[str, str]:
        import asyncio

        return {"event_loop_policy": type(asyncio.get_event_loop_policy()).__module__}


# -- processes and sockets ----------------------------------------------------------

def listeners(pids: dict[int, str]) -> list[dict[str, Any]]:
    """The TCP sockets listening in these processes: role, pid, address, loopback?"""
    owner: dict[int, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[int(link[8:-1])] = pid
        except OSError:
            continue
    out = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            if parts[3] != "0A" or int(parts[9]) not in owner:  # 0A: LISTEN
                continue
            hexip, hexport = parts[1].split(":")
            raw = bytes.fromhex(hexip)
            if v6:  # four 32-bit words, each in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                ip = socket.inet_ntop(socket.AF_INET6, raw)
            else:
                ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
            pid = owner[int(parts[9])]
            out.append({"pid": pid, "role": fp.role(pid, pids[pid]),
                        "address": f"[{ip}]:{int(hexport, 16)}" if v6
                        else f"{ip}:{int(hexport, 16)}",
                        "port": int(hexport, 16), "loopback": is_loopback(ip)})
    return sorted(out, key=lambda r: (r["role"], r["address"]))


def routable_ip() -> str | None:
    """This machine's address on its default route (no packet is sent), if not loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the route
            ip = str(sock.getsockname()[0])
    except OSError:
        return None
    return None if is_loopback(ip) else ip


def reachable(ip: str | None, port: int) -> bool | None:
    """Whether a TCP connection to ``ip:port`` is accepted (None: no routable address)."""
    if ip is None:
        return None
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


def totals(procs: list[dict[str, Any]]) -> dict[str, float]:
    driver = sum(p["pss_mib"] for p in procs if p["role"].startswith("driver"))
    return {"n_processes": len(procs),
            "pss_mib": round(sum(p["pss_mib"] for p in procs), 1),
            "pss_without_driver_mib": round(sum(p["pss_mib"] for p in procs) - driver, 1),
            "driver_pss_mib": round(driver, 1)}


def extra(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Processes of ``after`` that were not in ``before`` under the same pid and name."""
    seen = {(p["pid"], p["role"]) for p in before}
    return [p for p in after if (p["pid"], p["role"]) not in seen]


# -- HTTP client ------------------------------------------------------------------

class Conn:
    """One keep-alive connection; ``get(path)`` → milliseconds (status 200 checked)."""

    def __init__(self, netloc: str) -> None:
        self.conn = http.client.HTTPConnection(netloc, timeout=60)

    def get(self, path: str) -> float:
        t = time.perf_counter()
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        body = resp.read()
        ms = (time.perf_counter() - t) * 1000
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        return ms

    def close(self) -> None:
        self.conn.close()


def wait_ping(netloc: str, deadline_s: float = 180.0) -> float:
    """Poll ``GET /ping`` (a new connection each time) until it answers 200; perf_counter then."""
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        conn = http.client.HTTPConnection(netloc, timeout=2)
        try:
            conn.request("GET", "/ping")
            if conn.getresponse().status == 200:
                return time.perf_counter()
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.01)
    raise TimeoutError(f"{netloc} did not answer /ping in {deadline_s:.0f} s")


def sequential(netloc: str, warmup: int, n: int) -> dict[str, dict[str, Any]]:
    conn = Conn(netloc)
    try:
        for i in range(warmup):
            conn.get("/ping")
            conn.get(f"/echo?q=w{i}")
        ms: dict[str, list[float]] = {"ping": [], "echo": []}
        done = 0
        while done < n:
            block = min(BLOCK, n - done)
            for route in ("ping", "echo"):
                for i in range(block):
                    ms[route].append(conn.get("/ping" if route == "ping"
                                              else f"/echo?q=r{done + i}"))
            done += block
    finally:
        conn.close()
    out = {}
    for route, lat in ms.items():
        s = c.lat_summary(lat)
        s["req_per_s"] = round(1000 * len(lat) / sum(lat), 1)
        out[route] = s
    return out


def concurrent(netloc: str, path: str, n: int, workers: int = CONCURRENCY) -> dict[str, Any]:
    left = [n]
    lock = threading.Lock()
    times: list[float] = []
    errors: list[str] = []

    def run(conn: Conn) -> None:
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                ms = conn.get(path)
                with lock:
                    times.append(ms)
        except Exception as exc:  # reported, not raised: the figures say how many
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    conns = [Conn(netloc) for _ in range(workers)]
    for conn in conns:  # connect (and warm) each before the clock starts
        conn.get(path)
    wall = c.released_together(run, conns)
    out: dict[str, Any] = c.lat_summary(times)
    out |= {"workers": workers, "req_per_s": round(len(times) / wall, 1), "wall_s": round(wall, 2),
            "errors": errors[:3]}
    return out


# -- the cases ---------------------------------------------------------------------

@contextmanager
def node_env(case: str) -> Iterator[None]:
    """``RAY_USE_UVLOOP=0`` for the whole node of the ``actor`` case (Reverie's venv
    has no uvloop, so its workers run asyncio's loop)."""
    saved = os.environ.get("RAY_USE_UVLOOP")
    if case == "actor":
        os.environ["RAY_USE_UVLOOP"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("RAY_USE_UVLOOP", None)
        else:
            os.environ["RAY_USE_UVLOOP"] = saved


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_actor(case: str, ns: str) -> tuple[str, dict[str, Any], Any]:
    import ray

    loop, protocol = ("asyncio", "h11") if case == "actor" else ("uvloop", "httptools")
    t0 = time.perf_counter()
    cls: Any = ray.remote(HttpServer)
    server: Any = cls.options(name=HTTP_ACTOR, namespace=ns, num_cpus=0,
                              max_concurrency=1).remote(ns, loop, protocol)
    netloc: str = ray.get(server.address.remote(), timeout=180)
    t1 = time.perf_counter()
    t2 = wait_ping(netloc)
    stack: dict[str, str] = {"uvicorn_loop": loop, "uvicorn_http": protocol,
             **ray.get(server.stack.remote(), timeout=30)}
    return netloc, {"cold_start_s": round(t2 - t0, 3),
                    "steps_s": {"actor_up_with_address": round(t1 - t0, 3),
                                "first_ping": round(t2 - t1, 3)}, "stack": stack}, server


def start_serve(ns: str) -> tuple[str, dict[str, Any], Any]:
    import ray
    from fastapi import FastAPI
    from ray import serve
    from ray.serve.config import HTTPOptions

    app = FastAPI()

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class ServeApp:
        def __init__(self, namespace: str) -> None:
            self.echo_actor: Any = ray.get_actor(ECHO, namespace=namespace)

        @app.get("/ping")
        def ping(self) -> dict[str, bool]:
            return {"ok": True}

        @app.get("/echo")
        def echo_route(self, q: str = "x") -> dict[str, str]:
            return {"echo": ray.get(self.echo_actor.echo.remote(q), timeout=30)}

    port = free_port()
    t0 = time.perf_counter()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    t1 = time.perf_counter()
    deployment: Any = ServeApp
    serve.run(deployment.bind(ns), name=SERVE_APP, route_prefix="/")
    t2 = time.perf_counter()
    netloc = f"127.0.0.1:{port}"
    t3 = wait_ping(netloc)
    return netloc, {"cold_start_s": round(t3 - t0, 3),
                    "steps_s": {"serve_start": round(t1 - t0, 3),
                                "serve_run": round(t2 - t1, 3), "first_ping": round(t3 - t2, 3)},
                    "stack": {"proxy": "uvicorn (Serve's http_util), loop and http 'auto'",
                              "http_options_default_host": HTTPOptions().host}}, None


def run_case(case: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import ray

    load_before = c.loadavg()
    settings = c.make_settings(work / f"data-{case}")
    ns = settings.runtime.namespace
    with node_env(case), c.local_ray(settings, dashboard=False) as info:
        markers = [info["session_dir"] or "", info["temp_dir"]]
        echo_cls: Any = ray.remote(Echo)
        echo = echo_cls.options(name=ECHO, namespace=ns, num_cpus=0).remote()
        ray.get(echo.echo.remote("up"), timeout=120)  # the handle lives as long as the node
        c.log(f"  {case}: node up in {info['init_s']:.1f} s; settling {args.settle:.0f} s")
        time.sleep(args.settle)
        bare = fp.sample(markers, args.samples, args.interval)
        bare_listen = listeners({p["pid"]: p["cmdline"] for p in bare})

        c.log(f"  {case}: starting the HTTP server")
        # (the actor's handle is kept: an actor without handles is stopped)
        netloc, start, _server = start_serve(ns) if case == "serve" else start_actor(case, ns)
        c.log(f"  {case}: answering /ping on {netloc} after {start['cold_start_s']:.2f} s; "
              f"settling {args.settle:.0f} s")
        time.sleep(args.settle)
        idle = fp.sample(markers, args.samples, args.interval)
        idle_listen = listeners({p["pid"]: p["cmdline"] for p in idle})
        lan = routable_ip()
        probes = {r["port"]: reachable(lan, r["port"]) for r in idle_listen
                  if not r["loopback"]}

        c.log(f"  {case}: latency")
        seq = sequential(netloc, args.warmup, args.requests)
        conc = {route: concurrent(netloc, path, args.concurrent_requests)
                for route, path in (("ping", "/ping"), ("echo", "/echo?q=c"))}
        loaded = fp.sample(markers, 1, 0.0)
        if case == "serve":
            from ray import serve

            serve.shutdown()
    seen = {(r["pid"], r["address"]) for r in bare_listen}
    new_listen = [r for r in idle_listen if (r["pid"], r["address"]) not in seen]
    for r in new_listen:  # probed while the node ran: see ``probes`` below
        r["reachable_from_lan_address"] = probes.get(r["port"])
    b, i, ld = totals(bare), totals(idle), totals(loaded)
    xs = extra(bare, idle)
    return {
        "case": case, "netloc": netloc, **start,
        "bare": {**b, "processes": bare},
        "idle": {**i, "processes": idle},
        "after_load": {**ld, "processes": loaded},
        "extra_processes": [{k: p[k] for k in ("pid", "role", "pss_mib", "pss_anon_mib",
                                                "pss_file_mib", "pss_shmem_mib", "rss_mib")}
                            for p in xs],
        "extra_pss_mib": round(sum(p["pss_mib"] for p in xs), 1),
        "delta_pss_without_driver_mib": round(i["pss_without_driver_mib"]
                                              - b["pss_without_driver_mib"], 1),
        "delta_driver_pss_mib": round(i["driver_pss_mib"] - b["driver_pss_mib"], 1),
        "delta_after_load_without_driver_mib": round(ld["pss_without_driver_mib"]
                                                     - b["pss_without_driver_mib"], 1),
        "listening_new": new_listen, "listening_bare": bare_listen, "lan_address": lan,
        "sequential": seq, "concurrent": conc,
        "ray_init_s": round(info["init_s"], 2),
        "loadavg_before": load_before, "loadavg_after": c.loadavg(),
    }


def report(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(f"\n== {r['case']}: bare node {r['bare']['pss_without_driver_mib']:.1f} MiB PSS in "
              f"{r['bare']['n_processes'] - 1} processes (+ driver "
              f"{r['bare']['driver_pss_mib']:.1f}); the extra processes ==")
        rows: list[list[Any]] = [[p["role"], p["pid"], p["pss_mib"], p["pss_anon_mib"],
                                  p["pss_file_mib"], p["rss_mib"]] for p in r["extra_processes"]]
        print(c.table(["process", "pid", "PSS MiB", "anon", "file", "RSS MiB"], rows))
        print("new listening sockets: " + ", ".join(
            f"{x['role']} {x['address']}" + ("" if x["loopback"] else
                                             f" (NOT loopback; connect from {r['lan_address']}: "
                                             f"{x['reachable_from_lan_address']})")
            for x in r["listening_new"]))
        print("cold start: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["steps_s"].items())
              + f"; stack {r['stack']}")
    print("\n== summary ==")
    rows = []
    for r in results:
        s, k = r["sequential"], r["concurrent"]
        rows.append([r["case"], len(r["extra_processes"]),
                     r["idle"]["n_processes"] - r["bare"]["n_processes"], r["extra_pss_mib"],
                     r["delta_pss_without_driver_mib"], r["delta_driver_pss_mib"],
                     r["delta_after_load_without_driver_mib"], r["cold_start_s"],
                     f"{s['ping']['p50_ms']:.2f} / {s['ping']['p99_ms']:.2f}",
                     f"{s['echo']['p50_ms']:.2f} / {s['echo']['p99_ms']:.2f}",
                     k["ping"]["req_per_s"], k["echo"]["req_per_s"]])
    print(c.table(["case", "extra procs", "net procs", "their PSS", "Δ PSS", "Δ driver",
                   "Δ after load", "cold start s", "/ping p50/p99 ms", "/echo p50/p99 ms",
                   "/ping 4x req/s", "/echo 4x req/s"], rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, in order (of {', '.join(CASES)})")
    ap.add_argument("--settle", type=float, default=15.0, help="idle seconds before sampling")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--warmup", type=int, default=50, help="requests per route first")
    ap.add_argument("--requests", type=int, default=500, help="sequential requests per route")
    ap.add_argument("--concurrent-requests", type=int, default=2000,
                    help="requests per route shared by 4 clients")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    cases = [x.strip() for x in args.cases.split(",") if x.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    os.chdir(c.ROOT)  # Ray puts the current directory on its workers' path
    wall = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rvb-serve-"))
    results = []
    try:
        for case in cases:
            c.log(f"{case}: a fresh Ray node")
            results.append(run_case(case, args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    wall_s = time.perf_counter() - wall
    print("\nSUMMARY serve_vs_actor: " + "; ".join(
        f"{r['case']}: +{len(r['extra_processes'])} processes, "
        f"Δ {r['delta_pss_without_driver_mib']:.0f} MiB PSS, "
        f"cold start {r['cold_start_s']:.1f} s, /echo p50 "
        f"{r['sequential']['echo']['p50_ms']:.2f} ms" for r in results) + f"; wall {wall_s:.0f} s")
    try:
        from importlib.metadata import version

        versions: dict[str, str | None] = {p: version(p)
                                           for p in ("fastapi", "starlette", "uvicorn")}
        for p in ("uvloop", "httptools"):
            try:
                versions[p] = version(p)
            except Exception:
                versions[p] = None
    except Exception:
        versions = {}
    c.write_json(args.json_out, {
        "benchmark": "serve_vs_actor", "machine": c.machine(), "wall_s": round(wall_s, 1),
        "versions": versions,
        "params": vars(args) | {"method": "see the script's docstring"},
        "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

