"""``reverie graph``, ``reverie place`` and ``reverie viz``: the fact graph (a
subject's neighbours, the map), the places the geo job found (list them, name
one) and pictures of memory. All read the store read-only and need no runtime,
except ``place name``, which writes through the Graph actor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from actors.cli.common import EXIT_BAD_INPUT, EXIT_OK, Remote, _local
from runtime.config import Settings


def cmd_graph_neighbours(args: argparse.Namespace, settings: Settings) -> int:
    """A subject's neighbours in the fact graph (runtime.memories.graph_views), read-only."""
    from runtime.memories.graph_views import neighbours
    from runtime.memories.viz import open_read_only

    with open_read_only(settings) as store:
        view = neighbours(store, args.subject)
    if args.json:
        print(json.dumps(view))
        return EXIT_OK
    if not view["facts"] and not view["named_in"]:
        print(f"nothing known about {view['subject']!r}")
        return EXIT_OK
    print(f"{view['subject']}:")
    for f in view["facts"]:
        print(f"  {f['ref']:<10} {f['key']}: {f['value']}")
    if view["named_in"]:
        print("named in:")
    for f in view["named_in"]:
        print(f"  {f['ref']:<10} {f['subject']} {f['key']}: {f['value']}")
    if view["linked"]:
        print("linked: " + ", ".join(f"{n['subject']} ({len(n['via'])})" for n in view["linked"]))
    return EXIT_OK


def cmd_graph_map(args: argparse.Namespace, settings: Settings) -> int:
    """The fact graph in counts: by kind, subjects, links, and the hubs."""
    from runtime.memories.graph_views import graph_map
    from runtime.memories.viz import open_read_only

    with open_read_only(settings) as store:
        view = graph_map(store, args.hubs)
    if args.json:
        print(json.dumps(view))
        return EXIT_OK
    print(f"{view['facts']} facts about {view['subjects']} subjects, {view['links']} links")
    for kind, count in view["kinds"].items():
        print(f"  {kind:<20} {count}")
    if view["hubs"]:
        print("hubs:")
    for h in view["hubs"]:
        print(f"  {h['subject']}: {h['facts']} facts, {h['links']} links")
    return EXIT_OK


# -- places (the geo job) -------------------------------------------------------

def cmd_place_list(args: argparse.Namespace, settings: Settings) -> int:
    """The places the geo job found, their ids and names, and the habits: read
    from the store (read-only), so no runtime is needed."""
    from runtime.memories.viz import open_read_only
    from runtime.mind.geo_job import list_places

    with open_read_only(settings) as store:
        report = list_places(store)
    if args.json:
        print(json.dumps(report))
        return EXIT_OK
    if not report["places"]:
        print("no places yet (the geo job finds them in the location history)")
        return EXIT_OK
    rows = [(str(p["id"]), p["name"], p["role"], str(p["days"]),
             _local(p["last_seen"], settings)) for p in report["places"]]
    head = ("id", "name", "role", "days", "last seen")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    names = {p["id"]: p["name"] for p in report["places"]}
    if report["habits"]:
        print("habits:")
    for h in report["habits"]:
        print(f"  {h['person']}: {h['habit']} at place {h['place']} "
              f"({names.get(h['place'], '?')}), {h['when']}; support {h['support']}, "
              f"confidence {h['confidence']:.2f}")
    return EXIT_OK


def cmd_place_name(args: argparse.Namespace, settings: Settings) -> int:
    """Name a place: a user-managed fact written through the Graph actor (it wins
    over the gazetteer's name and survives the geo job's runs)."""
    from actors.messages import AddFact
    from runtime.memories.viz import open_read_only
    from runtime.mind.geo_job import known_place_ids, naming_fact

    fact = naming_fact(args.id, args.name)  # ValueError: an empty or overlong name
    with open_read_only(settings) as store:
        if args.id not in known_place_ids(store):
            raise ValueError(f"no place {args.id} (`reverie place list` shows the places)")
    remote = Remote(settings)
    written = remote.graph.add(AddFact(fact=fact, writer="cli"))
    remote.recall.sync()
    print(f"place {args.id} is now {fact.value!r} (fact:{written.fact_id}, {written.action})")
    return EXIT_OK


# -- pictures -------------------------------------------------------------------

def cmd_viz(args: argparse.Namespace, settings: Settings) -> int:
    """Draw a picture of memory into a PNG file, from the store read-only: no
    runtime needed, safe beside a running one."""
    from runtime.memories.viz import render_to_file

    try:
        path = render_to_file(args.kind, settings, Path(args.out))
    except ValueError as exc:
        print(f"reverie: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(path)
    return EXIT_OK
