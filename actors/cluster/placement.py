"""Where actors go on a household's cluster (a hub plus helper nodes).

- The turn path (every actor the Supervisor starts) is pinned to the hub, the
  node the ``reverie run --cluster`` driver runs on: a hard node affinity, so
  Ray restarts a crashed owner there too and never on a helper.
- A job's actor asks for one unit of the helpers' custom resource
  (``[cluster] job_resource``, offered by ``reverie join``) when a live node
  offers it; otherwise, on a cluster of more than one node, it is pinned to
  the node its Cron actor runs on, the hub (a hard affinity: with a soft one
  Ray placed it on a plain node of the test cluster, ``tests/test_cluster.py``);
  on a single node it gets no options at all (the single hub, unchanged).

Ray keeps a dead node's resources out of ``ray.available_resources`` and marks it
dead in ``ray.nodes()`` once its health checks fail, so a helper that goes away
stops attracting jobs then; a run sent to it in between stays pending until the
Cron actor's hard limit kills it (recorded failed), and the next run goes to the hub.
"""

from __future__ import annotations

from typing import Any

from runtime.config import Settings


def pin_here() -> dict[str, Any]:
    """Options pinning an actor to this process's node, for good (hard affinity)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


def helpers_offering(resource: str) -> list[str]:
    """The ids of the live nodes that offer ``resource``."""
    import ray

    return [str(n["NodeID"]) for n in ray.nodes()
            if n.get("Alive") and float(n.get("Resources", {}).get(resource, 0)) > 0]


def job_options(settings: Settings) -> dict[str, Any]:
    """Placement options for a job's actor (see the module's docstring)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    resource = settings.cluster.job_resource
    if helpers_offering(resource):
        return {"resources": {resource: 1}}
    if sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
        here = ray.get_runtime_context().get_node_id()
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=here, soft=False)}
    return {}
