#!/usr/bin/env python3
"""What a job run off the hub pays before it starts: restoring the household's snapshot.

Usage:
    tools/bench/job_snapshot.py [--turns 100,10000] [--rounds 5] [--no-vectors]
                                [--json OUT.json]

For each size in ``--turns``: a store of that many synthetic household turns
is built in the driver (``TranscriptService``, transactions of 5,000, plus one
384-float vector per turn unless ``--no-vectors``: what the Recall actor
stores for every memory turn), a ``Replicator`` replicates it to a ``file://``
replica on the same disk (``sync_now`` until the initial snapshot is there)
and is stopped. Then ``--rounds`` times, timed:
``actors.job_snapshot.snapshot`` entered and left, as a job actor on a helper
does around its run: the owner-only scratch directory, the Cron actor's
answer (here an object answering ``HubJobState`` from the live store, no
Ray), ``litestream restore`` plus its ``PRAGMA integrity_check``, the
read-only open, the routed ``job_state``, then the close and the deletion.
Reported per size: the whole enter (``ready_s``), the restore within it
(``restore_s``), the exit (``cleanup_s``), medians and maxima over the rounds,
the store's and the replica's sizes.

The replica's files were just written, so they are in the page cache: a NAS or
S3 replica adds the transfer of ``replica_mib``. The machine is a shared 2-core
box; load averages are recorded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c
from replication import dir_bytes, fill, sync_replica

from actors import job_snapshot
from actors.common import open_store
from actors.messages import Ack, JobStateRow, JobStateRows, SaveJobState
from device.replicator import Replicator
from runtime.config import Settings
from runtime.store.job_state import set_state
from runtime.time.clock import SystemClock


class Hub:
    """The Cron actor's two answers, from the live store (no Ray)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def hub_job_state(self) -> JobStateRows:
        store = open_store(self.settings)
        try:
            newest = store.scalar("SELECT coalesce(max(id), 0) FROM write_log")
            rows = [JobStateRow(job=j, key=k, value=v) for j, k, v in
                    store.conn.execute("SELECT job, key, value FROM job_state")]
        finally:
            store.close()
        return JobStateRows(write_log_id=int(newest), rows=rows)

    def save_job_state(self, msg: SaveJobState) -> Ack:
        return Ack()


def build(settings: Settings, n: int, vectors: bool, seed: int) -> dict[str, Any]:
    t = time.perf_counter()
    store = open_store(settings)
    try:
        fill(store, settings, n, vectors, seed)
        set_state(store, "facts", "turns", {"after": n, "done": n})
    finally:
        store.close()
    return {"build_s": round(time.perf_counter() - t, 2),
            "db_mib": round(settings.store.path.stat().st_size / c.MiB, 2)}


def one_size(work: Path, n: int, rounds: int, vectors: bool, seed: int) -> dict[str, Any]:
    settings = c.make_settings(work / f"data-{n}",
                               replica={"url": f"file://{work / f'replica-{n}'}"})
    out: dict[str, Any] = {"turns": n, "vectors": n if vectors else 0,
                           **build(settings, n, vectors, seed)}
    rep = Replicator(settings)
    try:
        rep.start()
        sync_replica(rep, timeout_s=600)
    finally:
        rep.stop()
    out["replica_mib"] = round(dir_bytes(work / f"replica-{n}") / c.MiB, 2)
    scratch = work / f"node-tmp-{n}"
    scratch.mkdir(mode=0o700)
    job_snapshot.scratch_root = lambda: scratch  # type: ignore[assignment]
    hub = Hub(settings)
    restore_timer = job_snapshot.restore_caught_up
    ready, restore, cleanup = [], [], []
    out["loadavg_before"] = c.loadavg()

    def timed_restore(local: Settings, want: int) -> float:
        t = time.perf_counter()
        took = restore_timer(local, want)
        restore.append(time.perf_counter() - t)
        return took

    job_snapshot.restore_caught_up = timed_restore  # type: ignore[assignment]
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            with job_snapshot.snapshot(settings, SystemClock(), hub) as (_, store):  # type: ignore[arg-type]
                ready.append(time.perf_counter() - t)
                got = store.scalar("SELECT count(*) FROM transcript")
                t = time.perf_counter()
            cleanup.append(time.perf_counter() - t)
            if got != n or os.listdir(scratch):
                raise SystemExit(f"restored {got} turns of {n}, or the copy was left behind")
    finally:
        job_snapshot.restore_caught_up = restore_timer  # type: ignore[assignment]
    out["loadavg_after"] = c.loadavg()

    def s(values: list[float]) -> dict[str, float]:
        return {"median_s": round(statistics.median(values), 3), "max_s": round(max(values), 3)}

    out.update(rounds=rounds, ready=s(ready), restore=s(restore), cleanup=s(cleanup))
    shutil.rmtree(work / f"data-{n}", ignore_errors=True)
    shutil.rmtree(work / f"replica-{n}", ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", default="100,10000", help="store sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="timed restores per size")
    ap.add_argument("--no-vectors", action="store_true", help="stores without vectors")
    ap.add_argument("--seed", type=int, default=7, help="corpus seed")
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.turns.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="rvb-snap-", dir="/tmp"))
    results = []
    try:
        for n in sizes:
            c.log(f"{n:,} turns{'' if args.no_vectors else ' with vectors'}")
            results.append(one_size(work, n, args.rounds, not args.no_vectors, args.seed))
            r = results[-1]
            c.log(f"  {r['db_mib']} MiB, replica {r['replica_mib']} MiB: ready in"
                  f" {r['ready']['median_s']:.2f} s (restore {r['restore']['median_s']:.2f} s),"
                  f" cleanup {r['cleanup']['median_s']:.3f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(c.table(["turns", "db MiB", "replica MiB", "ready s (median)", "restore s",
                   "cleanup s", "ready s (max)"],
                  [[r["turns"], r["db_mib"], r["replica_mib"], r["ready"]["median_s"],
                    r["restore"]["median_s"], r["cleanup"]["median_s"], r["ready"]["max_s"]]
                   for r in results]))
    c.write_json(args.json_out, {"machine": c.machine(), "args": vars(args),
                                 "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
