"""Which owner actors serve a household: routes, node names, actor names (issue 26).

- A node that serves households is named by its Ray node label
  :data:`LABEL` (``reverie join --name NAME`` sets it); the hub is
  :data:`runtime.store.household_routes.HUB_NODE`. The hub's owners are the
  named actors the Supervisor starts (``transcript``, ``recall``, ...); a
  node's are ``transcript@NODE``, ``recall@NODE``, ... (:func:`actor_name`),
  pinned to that node.
- A node keeps its households' stores under its own root: the environment
  variable :data:`ROOT_ENV` of that node's Ray processes (``reverie join``
  sets it from that machine's ``[households] root``), else ``households.root``.
- Routes: the durable table is ``<hub root>/routes.json``
  (:mod:`runtime.store.household_routes`); the running runtime reads them from
  Ray's internal key-value store (GCS), where the Supervisor puts the table at
  start and a move puts its change (:func:`publish`). A client looks its
  household's route up when it first needs its actor and again when an owner
  answers :class:`actors.common.HouseholdElsewhere`; ``home`` is never routed
  (the hub's own household, the single-household path, pays nothing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from actors.common import ACTORS
from runtime.config import HUB_HOUSEHOLD, Settings
from runtime.store.household_routes import HUB_NODE, check_node

LABEL = "reverie-node"
ROOT_ENV = "REVERIE_HOUSEHOLDS_ROOT"
KV_NAMESPACE = b"reverie-household-routes"
OWNERS = frozenset(ACTORS)


def actor_name(name: str, node: str) -> str:
    """The owner actor ``name`` of ``node`` (the hub's: ``name`` itself)."""
    return name if node == HUB_NODE else f"{name}@{check_node(node)}"


def node_settings(settings: Settings, node: str) -> Settings:
    """The settings an owner of ``node`` serves with, in that node's process:
    its households' root from :data:`ROOT_ENV` when that node sets it."""
    root = os.environ.get(ROOT_ENV)
    if node == HUB_NODE or not root:
        return settings
    return settings.model_copy(update={"households": settings.households.model_copy(
        update={"root": Path(root)})})


def _key(namespace: str, household: str) -> bytes:
    return f"{namespace}/{household}".encode()


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv if internal_kv._internal_kv_initialized() else None


def route(namespace: str, household: str) -> str:
    """The node serving ``household`` for the runtime in ``namespace``."""
    if household == HUB_HOUSEHOLD:
        return HUB_NODE
    kv = _kv()
    if kv is None:
        return HUB_NODE
    found = kv._internal_kv_get(_key(namespace, household), namespace=KV_NAMESPACE)
    return found.decode() if found else HUB_NODE


def publish(namespace: str, household: str, node: str) -> None:
    """The running runtime's copy of one route (the file is written first)."""
    kv = _kv()
    if kv is None:
        raise RuntimeError("not connected to Ray")
    key = _key(namespace, household)
    if node == HUB_NODE:
        kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    else:
        kv._internal_kv_put(key, check_node(node).encode(), overwrite=True,
                            namespace=KV_NAMESPACE)


def publish_all(namespace: str, routes: dict[str, str]) -> None:
    """The whole table (at start): every route in it, and none left of another."""
    kv = _kv()
    if kv is None:
        return
    prefix = f"{namespace}/".encode()
    for key in kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
        if key[len(prefix):].decode() not in routes:
            kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    for household, node in routes.items():
        publish(namespace, household, node)


def nodes() -> dict[str, str]:
    """The live nodes that have a name: {name: Ray node id}."""
    import ray

    named: dict[str, str] = {}
    for n in ray.nodes():
        name = (n.get("Labels") or {}).get(LABEL)
        if n.get("Alive") and name:
            named[str(name)] = str(n["NodeID"])
    return named


def resolve_node(wanted: str, hub_node_id: str) -> tuple[str, str]:
    """``wanted`` (a node's name or a Ray node id) as (name, node id); the hub's
    node is :data:`HUB_NODE` whatever its label. ValueError when no live node
    answers to it, or the node has no name (label it: ``reverie join --name``)."""
    named = nodes()
    if wanted in (HUB_NODE, hub_node_id):
        return HUB_NODE, hub_node_id
    if wanted in named:
        if named[wanted] == hub_node_id:
            return HUB_NODE, hub_node_id
        return check_node(wanted), named[wanted]
    for name, node_id in named.items():
        if node_id == wanted:
            return check_node(name), node_id
    import ray

    if any(str(n["NodeID"]) == wanted and n.get("Alive") for n in ray.nodes()):
        raise ValueError(f"node {wanted} has no name: start it with `reverie join --name "
                         f"NAME` (the Ray label {LABEL}=NAME)")
    raise ValueError(f"no live node named {wanted!r} (named nodes: "
                     f"{', '.join(sorted(named)) or 'none'})")
