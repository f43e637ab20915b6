"""A hub with helper nodes, on Ray's multi-node tooling (``ray.cluster_utils.Cluster``).

Three nodes on this machine, with the household's token auth and mutual TLS
(``actors.cluster.security``): the head (the hub: the driver and the turn
path), a helper offering the job resource (``[cluster] job_resource``), and a
plain node offering something else. Checked:

- the turn path (every actor the Supervisor starts) is on the head;
- a job's actor runs on the helper;
- a job on the helper reads the hub's memory from a snapshot restored from the
  household's Litestream replica (a ``file://`` one) into the helper's own
  temporary directory (the helper node runs with another ``TMPDIR``: no
  shared data directory), writes an episode through the owners and its
  ``job_state`` through the Cron actor, and the copy is gone after the run;
- after the helper is killed, turns still answer and the job runs again, on
  the hub (not on the plain node).

The cluster and its driver run in a subprocess of their own (this file, run as
a script: :func:`harness`): the test session's own Ray (``ray_instance``, on
loopback, without TLS) stays untouched, and a driver can be connected to one
cluster at a time. The harness only acts (starts, sends a turn, fires a job,
kills a node) and answers what it saw, one JSON line per command; every
assertion is here. Waits are on conditions, with deadlines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from script_harness import REPLY, Harness, script_harness

from runtime.memories.episodes import EpisodeIn
from runtime.mind.contract import JobContext, JobResult
from runtime.store.job_state import get_state, set_state

JOB_RESOURCE = "reverie_jobs"
START_TIMEOUT_S = 300
CALL_TIMEOUT_S = 240
NODE_DEATH_TIMEOUT_S = 180


def where(ctx: JobContext) -> JobResult:
    """A job that answers the id of the Ray node it ran on (its ``detail``)."""
    import ray

    return JobResult(items=1, detail=ray.get_runtime_context().get_node_id())


MARK = "cluster test"  # in the turn the harness sends; the snapshot job looks for it


def snapshot_read(ctx: JobContext) -> JobResult:
    """A job that reads the hub's turns from its store, writes an episode citing
    them through the owners and counts its runs in ``job_state``; its
    ``detail`` says where it ran and what it saw (JSON)."""
    import ray

    seen = [int(r[0]) for r in ctx.store.conn.execute(
        "SELECT id FROM transcript WHERE content LIKE ?", (f"%{MARK}%",))]
    runs = int(get_state(ctx.store, "snapshot_read", "runs", 0)) + 1
    set_state(ctx.store, "snapshot_read", "runs", runs)
    episode = ctx.writer.add_episode(EpisodeIn(
        channel="chat", source="user", gist=f"snapshot episode {runs}", cites=seen[:1]),
        writer="snapshot_read") if seen else None
    return JobResult(items=len(seen), detail=json.dumps({
        "node": ray.get_runtime_context().get_node_id(), "store": str(ctx.store.path),
        "seen": len(seen), "runs": runs, "read_back": get_state(ctx.store, "snapshot_read",
                                                                 "runs"),
        "episode": episode}))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("cluster")
    with FakeOpenAI() as server, script_harness(
            Path(__file__), str(root), str(model_cache), server.base_url,
            start_timeout_s=START_TIMEOUT_S, call_timeout_s=CALL_TIMEOUT_S) as harness:
        yield harness


def test_turn_path_on_the_hub_jobs_on_the_helper_and_back_on_the_hub(
        cluster: Harness) -> None:
    nodes = cluster.call("nodes")
    head, helper, plain = nodes["head"], nodes["helper"], nodes["plain"]
    assert len({head, helper, plain}) == 3
    assert nodes["driver"] == head
    assert nodes["resources"][helper].get(JOB_RESOURCE) == 2
    assert JOB_RESOURCE not in nodes["resources"][head]
    turn_path = nodes["actors"]
    assert {"transcript", "recall", "turns", "cron"} <= set(turn_path)
    assert set(turn_path.values()) == {head}, turn_path

    assert cluster.call("turn")["reply"]
    ran = cluster.call("job")
    assert ran["outcome"] == "ok", ran
    assert ran["node"] == helper

    # the hub's memory read from a snapshot on the helper, writes through the owners
    for run in (1, 2):
        got = cluster.call("snapshot_job")
        assert got["outcome"] == "ok", got
        seen = json.loads(got["detail"])
        assert seen["node"] == helper
        assert Path(seen["store"]).is_relative_to(got["helper_tmp"]), seen  # not the hub's
        assert seen["store"] != got["hub_store"]
        assert seen["seen"] >= 1  # the turn sent to the hub above
        assert seen["runs"] == seen["read_back"] == run  # the last run's state, from the hub
        assert got["hub_state"] == run  # written on the hub, through the Cron actor
        assert got["hub_episode"] == f"snapshot episode {run}"  # through the owners
        assert got["left"] == []  # the restored copy is gone

    gone = cluster.call("kill_helper", timeout=NODE_DEATH_TIMEOUT_S + 60)
    assert gone["alive"] == sorted([head, plain])
    assert cluster.call("turn")["reply"]  # the turn path never leaned on the helper
    again = cluster.call("job")
    assert again["outcome"] == "ok", again
    assert again["node"] == head  # back on the hub, not on the plain node
    assert set(cluster.call("nodes")["actors"].values()) == {head}


# -- the harness: run as a script by the fixture ----------------------------------------


def harness(root: Path, model_cache: Path, llm_url: str) -> None:  # pragma: no cover
    """Start the cluster and the runtime, then answer commands from stdin."""
    import time

    import apsw

    from actors.cluster.pki import ClusterFiles, issue_node, make_ca, make_token
    from actors.cluster.security import cluster_environment, cluster_node, routable_ip
    from runtime.config import load_settings

    def reply(**fields: Any) -> None:
        print(REPLY + json.dumps(fields), flush=True)

    ip = routable_ip()
    files = ClusterFiles(root / "data" / "cluster")
    make_ca(files)
    make_token(files)
    issue_node(files, ip, files)
    cluster_environment(files)  # before Ray is imported: every node and the driver
    import ray
    from ray._private.state import state
    from ray.cluster_utils import Cluster

    from actors import supervisor
    from actors.handles import CronClient, TurnsClient
    from actors.messages import RunJob, UserTurn

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(root / "data")}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": "cluster-test"},
        "persona": {"global_dir": str(root / "persona")},
        "llm": {"providers": [{"name": "local", "base_url": llm_url, "model": "tiny",
                               "timeout_s": 30}]},
        "http": {"enabled": False},
        "jobs": {"extra": {"where": "test_cluster:where",
                           "snapshot_read": "test_cluster:snapshot_read"}},
        "replica": {"url": f"file://{root / 'replica'}"},
    })
    helper_tmp = root / "helper-tmp"  # the helper's own temporary directory
    helper_tmp.mkdir(mode=0o700)
    node_args: dict[str, Any] = {"node_ip_address": ip, "num_cpus": 1,
                                 "object_store_memory": 80 * 1024 * 1024}
    with cluster_node():
        made = Cluster(initialize_head=True, head_node_args={**node_args,
                                                              "include_dashboard": False})
        helper = made.add_node(**node_args, resources={JOB_RESOURCE: 2},
                               env_vars={"TMPDIR": str(helper_tmp)})
        plain = made.add_node(**node_args, resources={"other": 1})
    made.wait_for_nodes()
    ray.init(address=made.address, namespace=settings.runtime.namespace,
             log_to_driver=False, logging_level="ERROR")
    sup = supervisor.start(settings, cluster=True)
    head_id = made.head_node.node_id

    def actors_at() -> dict[str, str]:
        return {str(a["Name"]): str(a["Address"]["NodeID"])
                for a in state.actor_table(None).values()
                if a["State"] == "ALIVE" and a["Name"] in sup.names}

    def alive() -> list[str]:
        return sorted(str(n["NodeID"]) for n in ray.nodes() if n["Alive"])

    reply(started=True)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "nodes":
                reply(head=head_id, helper=helper.node_id, plain=plain.node_id,
                      driver=ray.get_runtime_context().get_node_id(), actors=actors_at(),
                      resources={str(n["NodeID"]): n["Resources"] for n in ray.nodes()
                                 if n["Alive"]})
            elif command == "turn":
                got = TurnsClient(settings.runtime.namespace, 120).process(
                    UserTurn(channel="chat", text="hello from the cluster test"))
                reply(reply=got.text, turn_id=got.turn_id)
            elif command == "job":
                run = CronClient(settings.runtime.namespace, 200).run(
                    RunJob(name="where", wait=True), timeout=200)
                reply(outcome=run.outcome, node=run.detail, failure=run.error)
            elif command == "snapshot_job":
                run = CronClient(settings.runtime.namespace, 200).run(
                    RunJob(name="snapshot_read", wait=True), timeout=200)
                with apsw.Connection(str(settings.store.path),
                                     flags=apsw.SQLITE_OPEN_READONLY) as hub:
                    kept = hub.execute("SELECT value FROM job_state WHERE job = ?"
                                        " AND key = 'runs'", ("snapshot_read",)).fetchall()
                    gist = hub.execute("SELECT gist FROM episodes WHERE id = ?", (
                        json.loads(run.detail).get("episode") if run.detail else None,
                    )).fetchall()
                reply(outcome=run.outcome, detail=run.detail, failure=run.error,
                      helper_tmp=str(helper_tmp), hub_store=str(settings.store.path),
                      hub_state=json.loads(kept[0][0]) if kept else None,
                      hub_episode=gist[0][0] if gist else None,
                      left=sorted(p.name for p in helper_tmp.iterdir()
                                  if p.name.startswith("reverie-snapshot-")))
            elif command == "kill_helper":
                made.remove_node(helper, allow_graceful=False)
                deadline = time.monotonic() + NODE_DEATH_TIMEOUT_S
                while helper.node_id in alive() and time.monotonic() < deadline:
                    time.sleep(1)  # polling a condition (Ray's health checks), with a deadline
                reply(alive=alive())
            else:
                reply(error=f"unknown command {command!r}")
        except Exception as exc:
            reply(error=f"{type(exc).__name__}: {exc}")
    sup.stop()
    ray.shutdown()
    made.shutdown()


if __name__ == "__main__":  # pragma: no cover
    harness(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
