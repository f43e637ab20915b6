"""A household moves to another node through its replica (issue 26), on Ray's
multi-node tooling (``ray.cluster_utils.Cluster``).

Two nodes on this machine: the head (the hub: the driver, the hub's owners, a
households root of its own) and a node named ``b`` (the Ray label
``reverie-node=b``) with another households root (``REVERIE_HOUSEHOLDS_ROOT``
in its processes' environment): no store path is shared. Litestream replicates
each household to a ``file://`` replica. Checked:

- turns told to household ``smith`` through the turn path (Turns, Recall,
  Transcript), acknowledged; then, while a writer keeps sending turns,
  ``reverie household move smith --to b``;
- every acknowledged turn, before and during the move, is in the store on
  ``b`` and recall there finds one; turns sent during the move waited (none
  refused, none lost) and landed after it;
- the hub's copy is gone (``moved.json`` left) and the hub's owners refuse the
  household; the hub's own household still answers;
- the route is durable: with the runtime's copy of the route cleared and the
  runtime started again, it serves ``smith`` from ``b`` (``routes.json``).

The cluster and its driver run in a subprocess (this file as a script,
:func:`harness`), as in ``tests/test_cluster.py``: the test session's own Ray
stays untouched. The harness acts and answers what it saw; the assertions are
here.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from script_harness import REPLY, Harness, script_harness

START_TIMEOUT_S = 300
CALL_TIMEOUT_S = 300
NS = "move-test"
ABANDONED_LEASE_S = 4.0
HOUSEHOLD = "smith"
QUEUED = "distil:smith:1-2"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("move")
    with script_harness(Path(__file__), str(root), str(model_cache),
                        start_timeout_s=START_TIMEOUT_S,
                        call_timeout_s=CALL_TIMEOUT_S) as harness:
        yield harness


def test_a_household_moves_to_another_node_with_every_acknowledged_turn(
        cluster: Harness) -> None:
    before = cluster.call("turns")["acked"]
    assert len(before) == 3
    cluster.call("prepare")  # b's owners up before the writer starts (fewer turns to send)

    moved = cluster.call("move")
    report = moved["report"]
    assert report["moved"] and report["from"] == "hub" and report["to"] == "b", report
    during = moved["writer"]
    assert during["errors"] == []  # nothing refused: requests waited for the move
    refusing = moved["move_began"] + report["steps"]["target_owners"]  # from the drain on
    assert any(refusing < t["sent"] < moved["move_ended"] < t["acked"]
               for t in during["acked"]), moved  # sent while refused, landed after the move
    assert any(t["sent"] > moved["move_ended"] for t in during["acked"])
    acked = before + [t["text"] for t in during["acked"]]
    # the restored copy held exactly what the source had after its final sync
    assert report["restored"]["turns"] == report["synced"]["turns"]

    seen = cluster.call("check")
    assert seen["store"].startswith(seen["root_b"])  # the store now lives on b's root
    missing = [text for text in acked if text not in seen["contents"]]
    assert missing == [], missing  # every acknowledged turn, none lost
    assert seen["recall_found"], seen  # recall (on b) finds what was told
    assert seen["queued_b"] == [QUEUED]  # the language model's retry queue came along
    assert report["synced"]["llm_queue_files"] == 1  # its one entry
    assert seen["served_by"] == "transcript@b"
    assert seen["owner_node"] == seen["node_b"]
    assert seen["hub_copy"] == {"moved": "b", "store": False}  # the old copy removed, marked
    assert seen["hub_refuses"] == "HouseholdElsewhere"
    assert seen["routes_file"] == {HOUSEHOLD: "b"}
    assert seen["home_answers"]  # the hub's own household, unchanged

    abandoned = cluster.call("abandon")  # a mover died after the drain: the lease frees it
    assert abandoned["stored"] and abandoned["waited_s"] >= ABANDONED_LEASE_S, abandoned

    again = cluster.call("restart")  # the runtime's routes cleared, then started again
    assert again["route_before"] == "hub" and again["route_after"] == "b"
    assert again["served_by"] == "transcript@b"
    assert [t for t in acked if t not in again["contents"]] == []

    # a mover killed between its flip and its retire left its copy on the hub:
    # the move back clears that older copy and restores the live one
    left = cluster.call("leftover")
    assert left["stale_rows"] < left["live_rows"], left
    for there in ("hub", "b"):  # back to the node it left, then to b again
        back = cluster.call(f"move_to {there}")
        assert back["report"]["moved"] and back["report"]["to"] == there, back
        assert back["turns_after"] == back["turns_before"] == left["live_turns"], back


def test_one_litestream_replicates_the_open_households_and_catches_up_after_a_close(
        tmp_path: Path) -> None:
    """In process, real litestream: two stores in one daemon; a store released
    (final sync, out of the daemon) and written meanwhile, its WAL checkpointed
    away by its last close, is caught up when registered again; the final sync
    carries every row into its replica."""
    import sqlite3

    from device.household_replicator import HouseholdReplicator
    from device.replicator import restore_into
    from runtime.config import load_settings
    from runtime.store.households import Households

    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(tmp_path / "hub")},
        "households": {"enabled": True},
        "replica": {"url": f"file://{tmp_path / 'replica'}", "sync_interval_s": 0.5}})
    registry = Households(settings)
    stores = {}
    for household in ("alpha", "beta"):
        registry.add(household)
        stores[household] = registry.settings_for(household)

    def write(household: str, start: int, n: int) -> None:
        db = sqlite3.connect(stores[household].store.path)
        with db:
            db.executemany("INSERT INTO transcript (channel, source, role, content, created_at)"
                           " VALUES ('chat', 'user', 'user', ?, 0)",
                           [(f"{household}-{i}",) for i in range(start, start + n)])
        db.close()

    replication = HouseholdReplicator(settings, registry.root)
    replication.start()
    try:
        for household, own in stores.items():
            replication.register(own.store.path, own.replica.url)
            write(household, 0, 20)
        assert len(replication.registered()) == 2
        replication.release(stores["alpha"].store.path)  # the LRU closed it
        write("alpha", 20, 30)  # another owner writes it meanwhile, then closes it
        assert not Path(str(stores["alpha"].store.path) + "-wal").exists()
        for own in stores.values():
            replication.final_sync(own.store.path, own.replica.url)
        assert replication.registered() == []
    finally:
        replication.stop()
    for household, own in stores.items():
        copy = tmp_path / f"{household}-restored.db"
        restore_into(own, copy)
        db = sqlite3.connect(copy)
        got = {r[0] for r in db.execute("SELECT content FROM transcript")}
        db.close()
        assert got == {f"{household}-{i}" for i in range(50 if household == "alpha" else 20)}


# -- the harness: run as a script by the fixture ----------------------------------------


def harness(root: Path, model_cache: Path) -> None:  # pragma: no cover
    """Start the two-node cluster and the runtime, then answer commands from stdin."""
    import contextlib
    import io
    import sqlite3
    import time

    from actors.cluster.pki import ClusterFiles, issue_node, make_ca, make_token
    from actors.cluster.security import cluster_environment, cluster_node, routable_ip

    # Ray's token auth and mutual TLS, as a household's cluster runs (and as
    # tests/test_cluster.py does: its nodes listen on the routable address)
    ip = routable_ip()
    files = ClusterFiles(root / "cluster")
    make_ca(files)
    make_token(files)
    issue_node(files, ip, files)
    cluster_environment(files)  # before Ray is imported: every node and the driver
    import ray
    from ray.cluster_utils import Cluster

    from actors import supervisor
    from actors.cli.main import parser
    from actors.handles import RecallClient, TranscriptClient, TurnsClient
    from actors.household_routing import LABEL, ROOT_ENV, publish, route
    from actors.messages import Recall, RecentTurns, UserTurn
    from runtime.config import load_settings
    from runtime.llm.queue import PendingEntry, PendingQueue
    from runtime.store.household_routes import load_routes
    from runtime.store.households import Households

    def reply(**fields: Any) -> None:
        print(REPLY + json.dumps(fields), flush=True)

    root_b = root / "node-b"
    root_b.mkdir(mode=0o700)
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(root / "hub")}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(root / "persona")},
        "households": {"enabled": True},
        "jobs": {"check_every_s": 86400.0, "idle_after_s": 86400.0},
        "http": {"enabled": False},
        "replica": {"url": f"file://{root / 'replica'}", "sync_interval_s": 0.5},
    })
    registry = Households(settings)
    node_args: dict[str, Any] = {"node_ip_address": ip, "num_cpus": 1,
                                 "object_store_memory": 80 * 1024 * 1024}
    with cluster_node():  # also: longer than Ray's 30 s for a node to register
        made = Cluster(initialize_head=True, head_node_args={
            **node_args, "include_dashboard": False})
        node_b = made.add_node(**node_args, labels={LABEL: "b"},
                               env_vars={ROOT_ENV: str(root_b)})
    made.wait_for_nodes()
    ray.init(address=made.address, namespace=NS, log_to_driver=False, logging_level="ERROR")
    sup = supervisor.start(settings, cluster=True)
    registry.add(HOUSEHOLD)
    turns = TurnsClient(NS, 240, household=HOUSEHOLD)

    def tell(text: str) -> None:
        got = turns.process(UserTurn(channel="chat", text=text))
        assert got.turn_id is not None

    def contents() -> list[str]:
        rows = TranscriptClient(NS, 120, household=HOUSEHOLD).recent(
            RecentTurns(channel="chat", limit=200)).turns
        return [r.content for r in rows]

    reply(started=True)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "turns":
                told = [f"The kettle of the smiths is number {i} on the shelf."
                        for i in range(3)]
                for text in told:
                    tell(text)
                reply(acked=told)
            elif command == "prepare":
                supervisor.start_node_owners(settings, "b", node_b.node_id)
                # a segment distil could not summarise yet: it travels with the household
                PendingQueue.in_data_dir(registry.dir_of(HOUSEHOLD)).push(PendingEntry(
                    key=QUEUED, kind="distil", payload={"turns": [1, 2]},
                    enqueued_at=time.time(), attempts=1, last_error="timeout"))
                reply(ready=True)
            elif command == "move":
                stop = threading.Event()
                acked: list[dict[str, Any]] = []
                errors: list[str] = []
                first = threading.Event()

                def writer(stop: threading.Event = stop, first: threading.Event = first,
                           acked: list[dict[str, Any]] = acked,
                           errors: list[str] = errors) -> None:
                    k = 0
                    while not stop.is_set():
                        text = f"During the move, note number {k} about the garden."
                        sent = time.time()
                        try:
                            tell(text)
                            acked.append({"text": text, "sent": sent, "acked": time.time()})
                            first.set()
                        except Exception as exc:
                            errors.append(f"{type(exc).__name__}: {exc}")
                        k += 1

                thread = threading.Thread(target=writer, daemon=True)
                thread.start()
                first.wait(120)
                args = parser().parse_args(["household", "move", HOUSEHOLD, "--to", "b",
                                            "--json"])
                out = io.StringIO()
                began = time.time()
                with contextlib.redirect_stdout(out):
                    code = args.func(args, settings)
                ended = time.time()
                deadline = time.monotonic() + 120
                while (not any(t["sent"] > ended for t in acked) and not errors
                       and time.monotonic() < deadline):
                    time.sleep(0.1)  # until one turn sent after the move is acknowledged
                stop.set()
                thread.join(240)
                reply(code=code, report=json.loads(out.getvalue()), move_began=began,
                      move_ended=ended, writer={"acked": acked, "errors": errors})
            elif command.startswith("move_to "):  # tools/bench/household_move.py
                from actors.household_move import move

                turns_before = len(contents())
                report = move(settings, HOUSEHOLD, command.split()[1])
                reply(report=report, turns_before=turns_before, turns_after=len(contents()))
            elif command == "check":
                own = Households(settings.model_copy(update={"households": (
                    settings.households.model_copy(update={"root": root_b}))}))
                store = own.settings_for(HOUSEHOLD).store.path
                with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
                    stored = [r[0] for r in db.execute("SELECT content FROM transcript")]
                found = RecallClient(NS, 120, household=HOUSEHOLD).recall(
                    Recall(query="which number is the kettle of the smiths"))
                client = TranscriptClient(NS, household=HOUSEHOLD)
                where = ray.get(client.handle.where.remote())
                hub_dir = registry.dir_of(HOUSEHOLD)
                try:
                    ray.get(ray.get_actor("transcript", namespace=NS).recent.remote(
                        RecentTurns(household=HOUSEHOLD, channel="chat")))
                    refuses = "nothing"
                except ray.exceptions.RayTaskError as exc:
                    refuses = type(exc.cause).__name__
                home = TurnsClient(NS, 240).process(UserTurn(channel="chat", text="hello home"))
                queued = sorted(PendingQueue.in_data_dir(root_b / HOUSEHOLD).keys())
                reply(store=str(store), root_b=str(root_b), contents=stored, queued_b=queued,
                      recall_found=any("kettle" in i.text for i in found.items),
                      served_by=client.actor_name(), owner_node=where["node_id"],
                      node_b=node_b.node_id,
                      hub_copy={"moved": registry.moved_to(HOUSEHOLD),
                                "store": (hub_dir / "reverie.db").exists()},
                      hub_refuses=refuses, routes_file=load_routes(registry.root),
                      home_answers=bool(home.text))
            elif command == "abandon":
                # what a mover killed after the drain leaves: b's owners holding
                # the household, never told the move ended; a short lease
                from actors.household_move import MOVE_ORDER
                from actors.household_routing import actor_name
                from actors.messages import Request

                req = Request(household=HOUSEHOLD)
                began = time.time()
                for name in MOVE_ORDER:
                    ray.get(ray.get_actor(actor_name(name, "b"), namespace=NS)
                            .begin_move.remote(req, ABANDONED_LEASE_S), timeout=60)
                text = "After the abandoned move, the kettle went to the attic."
                tell(text)  # refused as moving, sent again until the lease ran out
                reply(waited_s=time.time() - began, stored=text in contents())
            elif command == "leftover":
                # what a mover killed between the flip and the retire leaves on
                # the node it left: a store there, no moved.json, the route on b
                own_b = Households(settings.model_copy(update={"households": (
                    settings.households.model_copy(update={"root": root_b}))}))
                live = own_b.settings_for(HOUSEHOLD).store.path
                stale = registry.settings_for_new(HOUSEHOLD).store.path
                def rows(path: Path) -> int:
                    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro",
                                                            uri=True)) as db:
                        return int(db.execute("SELECT count(*) FROM transcript").fetchone()[0])

                with contextlib.closing(sqlite3.connect(f"file:{live}?mode=ro", uri=True)) \
                        as src, contextlib.closing(sqlite3.connect(stale)) as dst:
                    src.backup(dst)
                (registry.dir_of(HOUSEHOLD) / "moved.json").unlink()
                told = TurnsClient(NS, 240, household=HOUSEHOLD).process(  # since the restart
                    UserTurn(channel="chat", text="After the leftover copy, the kettle went "
                                                  "to the garage."))
                assert told.turn_id is not None
                reply(stale_rows=rows(stale), live_rows=rows(live), live_turns=len(contents()))
            elif command == "restart":
                sup.stop()
                publish(NS, HOUSEHOLD, "hub")  # the runtime's copy gone: only the file knows
                before = route(NS, HOUSEHOLD)
                sup = supervisor.start(settings, cluster=True)
                reply(route_before=before, route_after=route(NS, HOUSEHOLD),
                      served_by=TranscriptClient(NS, household=HOUSEHOLD).actor_name(),
                      contents=contents())
            else:
                reply(error=f"unknown command {command!r}")
        except Exception as exc:
            import traceback

            traceback.print_exc(file=sys.stdout)
            reply(error=f"{type(exc).__name__}: {exc}")
    sup.stop()
    ray.shutdown()
    made.shutdown()


if __name__ == "__main__":  # pragma: no cover
    harness(Path(sys.argv[1]), Path(sys.argv[2]))
