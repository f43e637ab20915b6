#!/usr/bin/env python3
"""The digest step (``runtime.mind.digest_job.digest_step``) on a long history, offline.

Usage:
    tools/bench/digests.py [--days 730] [--per-day 15]

Builds a store in a temporary directory: ``--days`` days of history in the
household's zone (Europe/Lisbon), each with ``--per-day`` user turns and one
leaf episode citing each turn (random words, salience 1-10), written through
the services (no embedding). Then, with a fixed clock two hours after the last
day and the offline chain (no language model), times the step twice: the
first run (every daily within retention, every weekly within retention, every
monthly) and the next one (nothing new). The writer is
:class:`runtime.memories.digests.DigestService` on the same store, as the Graph actor
does it.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from datetime import datetime
from typing import Any, cast
from zoneinfo import ZoneInfo

from runtime.config import load_settings
from runtime.llm.providers import make_llm
from runtime.memories.digests import DigestBatch, DigestService
from runtime.memories.episodes import EpisodeIn, EpisodeService
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.transcript import TranscriptService, TurnIn
from runtime.mind.contract import JobContext, MemoryWriter
from runtime.mind.digest_job import digest_step
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.time.clock import ManualClock

WORDS = ("garden dentist plumber marathon dinner trip kitten school piano boiler heating "
         "market").split()


class _Writer:
    def __init__(self, store: Store) -> None:
        self.service = DigestService(store)

    def write_digests(self, batch: DigestBatch, writer: str) -> list[int]:
        return self.service.write(batch, writer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=730)
    ap.add_argument("--per-day", type=int, default=15)
    args = ap.parse_args()
    zone = "Europe/Lisbon"
    settings = load_settings(env={}, overrides={"store": {"data_dir": tempfile.mkdtemp()},
                                                "household": {"timezone": zone}})
    start = datetime(2024, 12, 1, tzinfo=ZoneInfo(zone)).timestamp()
    clock = ManualClock(start)
    store = Store(settings.store.path, FactKinds.load(settings.memory.fact_kinds_file),
                  clock=clock)
    profiles = MemoryProfiles.load(settings.memory.profiles_file)
    episodes, transcript = EpisodeService(store, profiles), TranscriptService(store, profiles)
    rng = random.Random(1)
    with store.write_transaction():
        for day in range(args.days):
            for k in range(args.per_day):
                at = start + day * 86400 + 8 * 3600 + k * 3000
                clock.set(at)
                turn = transcript.append(TurnIn(
                    channel="voice", source="user",
                    content=f"talk {day} {k} " + " ".join(rng.sample(WORDS, 4))), "bench")
                episodes.add(EpisodeIn(
                    channel="voice", source="user",
                    gist=f"episode {day}-{k} about " + " ".join(rng.sample(WORDS, 5)),
                    salience=rng.randint(1, 10), cites=[turn], started_at=at,
                    ended_at=at + 60), "bench")
    clock.set(start + args.days * 86400 + 2 * 3600)
    writer = cast(MemoryWriter, _Writer(store))  # the step writes only digests
    ctx = JobContext(store=store, writer=writer, llm=make_llm(settings.llm),
                     clock=clock, settings=settings)
    out: dict[str, Any] = {"episodes": store.scalar("SELECT count(*) FROM episodes"),
                           "turns": store.scalar("SELECT count(*) FROM transcript")}
    for label in ("first_run", "nothing_new"):
        began = time.perf_counter()
        result = digest_step(ctx)
        out[label] = {"s": round(time.perf_counter() - began, 3), "detail": result.detail}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
