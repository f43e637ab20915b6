"""Which node serves which household: the durable routing table (issue 26).

A node that serves households has a name (:data:`NODE_NAME`: the household
id's pattern); the hub's is :data:`HUB_NODE`. The table is one JSON file in
the hub's households root, ``<root>/routes.json`` (0600), ``{"routes":
{household: node}}``: a household not in it is served by the hub. It is
replaced atomically (written beside it, flushed, renamed: a reader sees the
old table or the new one). It is the truth; the running runtime's copy (Ray's
internal key-value store, ``actors/household_routing.py``) is filled from it at
start and after every change. No Ray here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.config import HOUSEHOLD_ID
from runtime.store.files import private_dir, write_private

ROUTES = "routes.json"
HUB_NODE = "hub"
NODE_NAME = HOUSEHOLD_ID  # a node's name: lower-case letters, digits, dashes
_NODE = re.compile(NODE_NAME)


def check_node(name: object) -> str:
    """``name`` when it is a well-formed node name, else ValueError."""
    if not isinstance(name, str) or not _NODE.fullmatch(name):
        raise ValueError(f"not a node name (lower-case letters, digits and dashes): "
                         f"{str(name)[:80]!r}")
    return name


def load_routes(root: Path) -> dict[str, str]:
    """Every household served by a node other than the hub: {household: node}."""
    try:
        data = json.loads((root / ROUTES).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    routes = data.get("routes", {}) if isinstance(data, dict) else {}
    return {str(h): check_node(n) for h, n in routes.items() if n != HUB_NODE}


def route_of(root: Path, household: str) -> str:
    return load_routes(root).get(household, HUB_NODE)


def save_route(root: Path, household: str, node: str) -> dict[str, str]:
    """Record that ``node`` serves ``household`` (the hub: out of the table);
    the table after it."""
    check_node(node)
    routes = load_routes(root)
    if node == HUB_NODE:
        routes.pop(household, None)
    else:
        routes[household] = node
    private_dir(root)
    write_private(root / ROUTES, json.dumps({"routes": dict(sorted(routes.items()))},
                                            indent=1) + "\n")
    return routes


def forget_route(root: Path, household: str) -> None:
    """A deleted household leaves the table."""
    if household in load_routes(root):
        save_route(root, household, HUB_NODE)
