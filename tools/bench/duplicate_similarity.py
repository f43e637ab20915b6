#!/usr/bin/env python3
"""How ``memory.duplicate_similarity`` (0.92) was chosen: cosine similarities,
with the configured embedder, of pairs that say the same thing (paraphrases:
should be refused as near-duplicates) and of pairs that say different things
(should be stored), as :mod:`runtime.memories.duplicates` compares them.

Usage:
    tools/bench/duplicate_similarity.py [--json]

Measured 2026-11-30, all-MiniLM-L6-v2 (ONNX): paraphrases 0.85-0.97 (close
restatements 0.95-0.97), different memories 0.42-0.78, the same topic with
another detail 0.89; a changed date, day or negation 0.95-0.99 (the embedding
blurs them: :func:`runtime.memories.duplicates.details` keeps such pairs apart).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.config import load_settings
from runtime.llm.embedder import make_embedder
from runtime.memories.duplicates import details, fact_text

SAME = [
    ("The spare key is under the blue flower pot.", "The spare key is under the blue plant pot."),
    ("Ana's birthday is on the 14th of May.", "Ana has her birthday on May 14th."),
    ("We went hiking in the Serra da Estrela last weekend and it snowed.",
     "Last weekend we hiked in Serra da Estrela; there was snow."),
    ("The wifi password for guests is on the fridge.",
     "The guest wifi password is stuck on the fridge."),
    ("Grandma's violin needs new strings before Easter.",
     "Before Easter, grandma's violin needs restringing."),
    (fact_text("user", "note-1a2b3c4d5e", "The spare key is under the blue flower pot."),
     fact_text("user", "note-9f8e7d6c5b", "The spare key is under the blue plant pot.")),
]
DIFFERENT = [
    ("The spare key is under the blue flower pot.", "The spare key is under the red doormat."),
    ("Ana's birthday is on the 14th of May.", "Rui's birthday is on the 14th of May."),
    ("The wifi password for guests is on the fridge.",
     "The alarm code for the garage is on the fridge."),
    ("Grandma's violin needs new strings before Easter.",
     "Grandma's piano needs tuning before Easter."),
    ("Ana lands in Lisbon on Tuesday.", "Ana flies to Porto on Tuesday."),
    ("We had dinner with Rui and talked about his new job in Porto.",
     "We had dinner with Rui and talked about his new flat in Porto."),
]
BLURRED = [  # different, but the embedding cannot tell: kept apart by details()
    ("Ana's birthday is on the 14th of May.", "Ana's birthday is on the 15th of May."),
    ("The dentist appointment is on Monday at 9.", "The dentist appointment is on Tuesday at 9."),
    ("The spare key is under the blue flower pot.",
     "The spare key is no longer under the blue flower pot."),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = load_settings()
    embedder = make_embedder(settings.embedder)
    threshold = settings.memory.duplicate_similarity

    def measure(pairs: list[tuple[str, str]]) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for a, b in pairs:
            vecs = embedder.embed([a, b])
            sim = float(np.dot(vecs[0], vecs[1]))
            out.append({"a": a, "b": b, "similarity": round(sim, 3),
                        "refused": sim >= threshold and details(a) == details(b)})
        return out

    groups = {"same": measure(SAME), "different": measure(DIFFERENT),
              "blurred": measure(BLURRED)}
    if args.json:
        print(json.dumps({"embedder": embedder.name, "threshold": threshold, **groups},
                         indent=2))
        return 0
    print(f"{embedder.name}, duplicate_similarity {threshold}")
    for group, rows in groups.items():
        print(f"{group}:")
        for row in rows:
            print(f"  {row['similarity']:.3f} {'refused' if row['refused'] else 'stored '}"
                  f"  {str(row['a'])[:50]!r} / {str(row['b'])[:50]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
