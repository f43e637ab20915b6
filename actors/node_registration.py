"""How long a Ray node started in this process may take to register, and what
its raylet waits for.

``ray._private.node`` waits for a new raylet to appear in the GCS for a fixed
30 s (a local variable), asking ``services.get_node`` again each time that
raises; on a hub loaded by other work (a Pi 5 beside a busy process, a CPU
hog beside the test suite) that was seen to run out, and ``reverie run``
failed with "The current node timed out during startup". While
:func:`patient_registration` is entered, the first of those questions for a
node itself asks again until the node is there or :data:`NODE_REGISTER_S`
has passed (a raylet that died is then reported as Ray reports it, later).
Entered by :func:`actors.node.hub_node` (``reverie run``) and
:func:`actors.cluster.security.cluster_node` (a cluster's head, ``reverie
join``, the tests' clusters), which also give the raylet its dashboard agent's
HTTP port (:func:`with_agent_listen_port`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# How long our own new node may take to register with its GCS (Ray's own: 30 s).
NODE_REGISTER_S = 180.0


@contextmanager
def patient_registration() -> Iterator[None]:
    """While Ray starts a node in this process: each node gets
    :data:`NODE_REGISTER_S` to register, not Ray's 30 s."""
    from ray._private import services

    get_node = services.get_node
    waiting: dict[str, float] = {}  # node id: until when it may take to register

    def patient_get_node(gcs_address: str, node_id: str) -> Any:
        until = waiting.setdefault(node_id, time.monotonic() + NODE_REGISTER_S)
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:  # not registered yet
                if time.monotonic() >= until:
                    raise
                time.sleep(0.5)

    services.get_node = patient_get_node
    try:
        yield
    finally:
        services.get_node = get_node


def with_agent_listen_port(raylet: list[str]) -> list[str]:
    """The raylet's command, told its dashboard agent's HTTP port as well.

    Ray's Python gives the raylet the agents' other ports but not that one,
    although the raylet takes it (``--dashboard_agent_listen_port``); without
    it the raylet waits for the agent to write it to a file, a fixed 15 s, and
    aborts the start when the agent is slower to import than that — seen on
    a loaded machine (the suite's slow-registration crash drill, 2026-12-03:
    the agent wrote it 0.9 s late). Given it, the raylet waits for no agent.
    The port is the one the agent is told (``--listen-port`` in
    ``--dashboard_agent_command``); a command without one is left as it is."""
    if any(arg.startswith("--dashboard_agent_listen_port=") for arg in raylet):
        return raylet
    agent = next((arg for arg in raylet if arg.startswith("--dashboard_agent_command=")), "")
    port = re.search(r"--listen-port=(\d+)", agent)
    if port is None or int(port.group(1)) == 0:
        return raylet
    return [*raylet, f"--dashboard_agent_listen_port={port.group(1)}"]
