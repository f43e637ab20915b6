"""``python -m runtime``: the embedded default, as a short demonstration.

Opens (or creates) the store in the data directory, writes a few turns,
recalls, and prints what turn-zero recall would inject. The actor runtime and
the ``reverie`` command build on this.
"""

from __future__ import annotations

import logging
import sys

from runtime.config import ConfigError, load_settings
from runtime.memory import Memory
from runtime.transcript import TurnIn

DEMO_TURNS = [
    "My sister Ana lives in Porto and works night shifts as a nurse.",
    "We adopted a grey cat called Miso last spring.",
    "I'm allergic to peanuts, so keep that in mind for recipes.",
    "We're planning a trip to Kyoto in October.",
]
DEMO_QUESTIONS = ["Where does my sister live?", "Any dinner ideas?", "What is a black hole?"]


def main() -> int:
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"reverie: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s: %(message)s")
    with Memory(settings) as memory:
        print(f"store: {settings.store.path}")
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
