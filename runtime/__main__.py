"""``python -m runtime``: the embedded default, as a short demonstration.

Creates a store in a temporary directory (deleted afterwards, so the user's
real memory is never touched), writes a few turns, recalls, and prints what
turn-zero recall would inject. ``--data-dir DIR`` uses (and keeps) a store in
``DIR`` instead. The actor runtime and the ``reverie`` command build on this.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from runtime.config import ConfigError, load_settings
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory

DEMO_TURNS = [
    "My sister Ana lives in Porto and works night shifts as a nurse.",
    "We adopted a grey cat called Miso last spring.",
    "I'm allergic to peanuts, so keep that in mind for recipes.",
    "We're planning a trip to Kyoto in October.",
]
DEMO_QUESTIONS = ["Where does my sister live?", "Any dinner ideas?", "What is a black hole?"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m runtime",
        description="A short in-process demonstration of Reverie's memory, without Ray. "
                    "It uses a temporary store unless --data-dir is given.")
    p.add_argument("--data-dir", type=Path, metavar="DIR",
                   help="use (and keep) the store in DIR instead of a temporary one")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.data_dir is not None:
        return demo(args.data_dir.expanduser(), temporary=False)
    with tempfile.TemporaryDirectory(prefix="reverie-demo-") as tmp:
        return demo(Path(tmp), temporary=True)


def demo(data_dir: Path, temporary: bool) -> int:
    try:
        # The demo's store wins over REVERIE_DATA_DIR and any configured data_dir.
        settings = load_settings(overrides={"store": {"data_dir": str(data_dir)}})
    except ConfigError as exc:
        print(f"reverie: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s: %(message)s")
    with Memory(settings) as memory:
        where = " (temporary, deleted on exit; --data-dir DIR keeps one)" if temporary else ""
        print(f"store: {settings.store.path}{where}")
        if memory.counts()["transcript"] == 0:
            memory.add_turns([TurnIn(channel="demo", source="user", content=t)
                              for t in DEMO_TURNS])
        print(f"memory: {memory.counts()}")
        for question in DEMO_QUESTIONS:
            result = memory.recall(question)
            print(f"\n> {question}  ({len(result.items)} memories, {result.elapsed_ms:.1f} ms)")
            for item in result.items:
                print(f"  {item.ref:<10} {item.score:.3f}  {item.text}")
            if not result.items:
                print("  (nothing relevant: nothing injected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
