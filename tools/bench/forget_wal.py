#!/usr/bin/env python3
"""The cost of resetting the WAL after a forget (``Store.reset_wal``, issue 24 item 5).

Usage:
    tools/bench/forget_wal.py [--turns 10000] [--pending 0,100,1000] [--rounds 5]
                              [--json OUT.json]

A store in a temporary directory holds ``--turns`` synthetic turns (about 25
words each), checkpointed. For each ``--pending`` value P, ``--rounds`` times:
P more turns are written (what the WAL holds since the last checkpoint; SQLite's
auto-checkpoint keeps it under about 1,000 pages), one turn is forgotten
through :func:`runtime.memories.refs.change` (the owner's path), timed with and
without the WAL reset (the reset is timed on its own as well), and the WAL's
size before the reset is recorded. A second connection stays open, as the
other actors' do. Medians in milliseconds; JSON on stdout or to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.config import CONFIG_DIR
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Ref, change
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds

WORDS = ("kitchen boiler porto sister train garden lamp holiday dentist bread "
         "winter school piano meeting birthday river bicycle coffee tomorrow").split()


def text(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(25)) + f" n{i}"


def fill(service: TranscriptService, start: int, n: int) -> list[int]:
    ids = []
    with service.store.write_transaction():
        for i in range(start, start + n):
            ids.append(service.append(TurnIn(channel="kitchen", source="user",
                                             content=text(i))))
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=10_000)
    ap.add_argument("--pending", default="0,100,1000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    kinds = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
    profiles = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")
    out: dict[str, Any] = {"turns": args.turns, "rounds": args.rounds, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "reverie.db", kinds)
        other = apsw.Connection(str(store.path))
        service = TranscriptService(store, profiles)
        written = args.turns
        for start in range(0, args.turns, 1000):
            fill(service, start, min(1000, args.turns - start))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for pending in (int(p) for p in args.pending.split(",")):
            plain, whole, reset, wal = [], [], [], []
            for _ in range(args.rounds):
                for with_reset in (False, True):
                    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    ids = fill(service, written, pending + 2)
                    written += pending + 2
                    if not with_reset:
                        t = time.perf_counter()
                        service.forget(ids[0], "bench")
                        plain.append((time.perf_counter() - t) * 1000)
                        continue
                    wal.append(Path(str(store.path) + "-wal").stat().st_size)
                    t = time.perf_counter()
                    change(service, Ref("turn", ids[0]), "delete", "bench")
                    whole.append((time.perf_counter() - t) * 1000)
                    # the reset alone, on the same backlog again
                    fill(service, written, pending)  # WAL was just reset
                    written += pending
                    service.forget(ids[1], "bench")
                    t = time.perf_counter()
                    store.reset_wal()
                    reset.append((time.perf_counter() - t) * 1000)
            out["runs"].append({
                "pending_turns": pending,
                "wal_bytes_before_reset_median": int(statistics.median(wal)),
                "forget_without_reset_ms": round(statistics.median(plain), 2),
                "forget_with_reset_ms": round(statistics.median(whole), 2),
                "reset_alone_ms": round(statistics.median(reset), 2),
            })
        other.close()
        store.close()
    text_out = json.dumps(out, indent=2)
    if args.json:
        args.json.write_text(text_out + "\n")
    print(text_out)


if __name__ == "__main__":
    main()
