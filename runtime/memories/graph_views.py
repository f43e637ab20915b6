"""Views of the fact graph (ChatCLI "Knowledge graph"): a subject's neighbours
and a map of the whole graph. Read-only: they read the store and write nothing
(``reverie graph`` opens it read-only, as ``reverie viz`` does, so no runtime
needs to run).

The graph is the live facts (current: open window, not disabled). A fact
about subject S is an edge from S to its value; when that value *names*
another subject (the subject's words, whole and in order, case aside:
``Ana lives_with: Rui and the cat`` names ``Rui``), the fact is a **link**
between the two subjects.

- :func:`neighbours`: the facts about a subject, the facts whose value names
  it, and the subjects linked to it through either (with the facts that link
  them);
- :func:`graph_map`: how many live facts there are by kind, how many subjects
  and links, and the **hubs**: the subjects with the most live facts and
  links, most first.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

HUBS = 10
MAX_HUBS = 1000
_LIVE = "valid_to IS NULL AND disabled = 0"


@dataclass
class _Graph:
    facts: list[Row]
    subjects: dict[str, str]  # lower-cased subject -> its spelling (the first stored)
    # fact id -> the subjects (lower-cased) its value names, other than its own
    named: dict[int, set[str]] = field(default_factory=dict)


def _load(store: Store) -> _Graph:
    facts = store.rows(
        f"SELECT id, kind, subject, key, value, sensitive FROM facts WHERE {_LIVE}"
        " ORDER BY id")
    subjects: dict[str, str] = {}
    for f in facts:
        subjects.setdefault(" ".join(str(f["subject"]).split()).lower(), str(f["subject"]))
    graph = _Graph(facts, subjects)
    pattern = _names_pattern(list(subjects))
    if pattern is None:
        return graph
    for f in facts:
        own = " ".join(str(f["subject"]).split()).lower()
        found = {m.group(0).lower() for m in pattern.finditer(" ".join(str(f["value"]).split()))}
        found = {" ".join(s.split()) for s in found} - {own}
        if found:
            graph.named[int(f["id"])] = found
    return graph


def _names_pattern(subjects: list[str]) -> re.Pattern[str] | None:
    """One expression matching any subject as whole words, longest first."""
    words = sorted((s for s in subjects if s), key=len, reverse=True)
    if not words:
        return None
    alternation = "|".join(r"\s+".join(re.escape(w) for w in s.split()) for s in words)
    return re.compile(rf"(?<!\w)(?:{alternation})(?!\w)", re.IGNORECASE)


def _fact(row: Row) -> dict[str, Any]:
    return {"ref": f"fact:{row['id']}", "kind": row["kind"], "subject": row["subject"],
            "key": row["key"], "value": row["value"], "sensitive": bool(row["sensitive"])}


def neighbours(store: Store, subject: str) -> dict[str, Any]:
    """What the graph holds around ``subject`` (matched case aside)::

        {"subject": S, "facts": [fact...], "named_in": [fact...],
         "linked": [{"subject": T, "via": ["fact:N", ...]}, ...]}

    ``facts`` are about S; ``named_in`` are about other subjects and name S in
    their value; ``linked`` are the subjects those facts connect S with, most
    links first. Each fact is ``{"ref", "kind", "subject", "key", "value",
    "sensitive"}``. ValueError for an empty subject; a subject the graph does
    not know gives empty lists."""
    wanted = " ".join(subject.split()).lower()
    if not wanted:
        raise ValueError("a subject is needed, e.g. `reverie graph neighbours Ana`")
    graph = _load(store)
    about = [f for f in graph.facts if " ".join(str(f["subject"]).split()).lower() == wanted]
    named_in = [f for f in graph.facts if wanted in graph.named.get(int(f["id"]), set())]
    via: dict[str, list[str]] = {}
    for f in about:
        for other in sorted(graph.named.get(int(f["id"]), set())):
            via.setdefault(other, []).append(f"fact:{f['id']}")
    for f in named_in:
        other = " ".join(str(f["subject"]).split()).lower()
        via.setdefault(other, []).append(f"fact:{f['id']}")
    linked = [{"subject": graph.subjects.get(s, s), "via": refs}
              for s, refs in sorted(via.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    return {"subject": graph.subjects.get(wanted, " ".join(subject.split())),
            "facts": [_fact(f) for f in about], "named_in": [_fact(f) for f in named_in],
            "linked": linked}


def graph_map(store: Store, hubs: int = HUBS) -> dict[str, Any]:
    """The whole graph in counts::

        {"facts": N, "subjects": N, "links": N, "kinds": {kind: N, ...},
         "hubs": [{"subject", "facts", "links", "degree"}, ...]}

    ``links`` counts (fact, named subject) pairs; a hub's ``facts`` are the
    live facts about it, its ``links`` the links it takes part in (either
    end), ``degree`` their sum; at most ``hubs`` of them, highest degree first.
    ValueError for a ``hubs`` outside 1..1000."""
    if not 1 <= hubs <= MAX_HUBS:
        raise ValueError(f"hubs must be between 1 and {MAX_HUBS}, not {hubs}")
    graph = _load(store)
    kinds: dict[str, int] = {}
    facts_of: dict[str, int] = {}
    links_of: dict[str, int] = {}
    links = 0
    for f in graph.facts:
        kinds[str(f["kind"])] = kinds.get(str(f["kind"]), 0) + 1
        own = " ".join(str(f["subject"]).split()).lower()
        facts_of[own] = facts_of.get(own, 0) + 1
        for other in graph.named.get(int(f["id"]), set()):
            links += 1
            links_of[own] = links_of.get(own, 0) + 1
            links_of[other] = links_of.get(other, 0) + 1
    ranked = sorted(graph.subjects, key=lambda s: (
        -(facts_of.get(s, 0) + links_of.get(s, 0)), -links_of.get(s, 0), s))
    return {
        "facts": len(graph.facts), "subjects": len(graph.subjects), "links": links,
        "kinds": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        "hubs": [{"subject": graph.subjects[s], "facts": facts_of.get(s, 0),
                  "links": links_of.get(s, 0),
                  "degree": facts_of.get(s, 0) + links_of.get(s, 0)}
                 for s in ranked[:hubs]],
    }
