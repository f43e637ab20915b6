"""``reverie run``, ``reverie join``, ``reverie cluster``, ``reverie init`` and
``reverie status``: start the runtime (:mod:`actors.node`), join a household's
cluster as a helper (:mod:`actors.cluster.join`) or make its certificates,
write a user configuration file (or, with ``--service``, a systemd unit that
runs ``reverie run``), show the runtime's health (and, in words, the MQTT
bridge, the location history and presence).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.cli.common import EXIT_NO_RUNTIME, EXIT_OK, Remote
from runtime.config import Settings


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from actors import node

    return node.run(settings, address=args.address, verbose=args.verbose,
                    cluster=bool(getattr(args, "cluster", False)))


def cmd_join(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cluster.join import join

    return join(settings, args.address, getattr(args, "name", None))


def cmd_cluster_init(args: argparse.Namespace, settings: Settings) -> int:
    """``reverie cluster init``: the household's CA, Ray token and the hub's certificate."""
    from actors.cluster.pki import cluster_files, issue_node, make_ca, make_token
    from actors.cluster.security import routable_ip

    files = cluster_files(settings)
    node_ip = args.node_ip or settings.cluster.node_ip or routable_ip()
    make_ca(files)
    make_token(files)
    issue_node(files, node_ip, files)
    print(f"made the household's CA, Ray token and this hub's certificate ({node_ip}) in"
          f" {files.dir} (owner-only); start the head with `reverie run --cluster`")
    return EXIT_OK


def cmd_cluster_issue(args: argparse.Namespace, settings: Settings) -> int:
    """``reverie cluster issue IP --out DIR``: a helper's bundle (no CA key)."""
    from actors.cluster.pki import ClusterFiles, cluster_files, issue_node

    out = ClusterFiles(args.out.expanduser())
    issue_node(cluster_files(settings), args.node_ip, out)
    print(f"wrote a helper's bundle for {args.node_ip} to {out.dir} (owner-only): copy it"
          " to the helper's <data dir>/cluster (scp -rp), then run `reverie join` there")
    return EXIT_OK


def cmd_init(args: argparse.Namespace, settings: Settings | None) -> int:
    from runtime.user_config import default_user_config_path, write_user_config

    if getattr(args, "service", False):
        return _init_service(args)
    if getattr(args, "system", False):
        raise ValueError("--system goes with --service")
    path = args.path or default_user_config_path()
    written = write_user_config(path, force=args.force)
    print(f"wrote {written}")
    return EXIT_OK


def _reverie_executable() -> Path:
    """The absolute path of this installation's ``reverie`` command (the venv's)."""
    beside = Path(os.path.abspath(sys.executable)).parent / "reverie"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("reverie")
    if found:
        return Path(os.path.abspath(found))
    raise ValueError(f"no `reverie` command beside {sys.executable} or on PATH; "
                     "install the package (make venv) first")


def _init_service(args: argparse.Namespace) -> int:
    """``reverie init --service``: write the systemd unit, print how to start it."""
    import grp
    import pwd

    from runtime.user_config import (
        CARRIED_ENV,
        default_service_path,
        default_user_config_path,
        service_commands,
        service_unit_text,
        write_service_unit,
    )

    system = bool(args.system)
    user = group = None
    if system:
        if os.geteuid() == 0:
            raise ValueError("the unit runs Reverie as the user who writes it, never as root:"
                             " run `reverie init --service --system --path reverie.service` "
                             "as that user, then install the file with sudo")
        entry = pwd.getpwuid(os.getuid())
        user, group = entry.pw_name, grp.getgrgid(entry.pw_gid).gr_name
    environment = {name: os.environ[name] for name in CARRIED_ENV if os.environ.get(name)}
    if args.config is not None:  # `reverie --config FILE init --service`: the unit reads it
        environment["REVERIE_CONFIG"] = os.path.abspath(args.config)
    for name in ("REVERIE_CONFIG", "REVERIE_DATA_DIR"):
        if name in environment:
            environment[name] = os.path.abspath(os.path.expanduser(environment[name]))
    config = Path(environment.get("REVERIE_CONFIG") or default_user_config_path())
    text = service_unit_text(_reverie_executable(), env_file=config.parent / "reverie.env",
                             system=system, user=user, group=group, environment=environment)
    path = args.path or default_service_path(system)
    written, changed = write_service_unit(path, text, force=args.force)
    print(f"wrote {written}" if changed else f"{written} is up to date; left as it is")
    print("nothing was enabled or started; to run Reverie as a service:")
    for command in service_commands(written, system):
        print(f"  {command}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from actors.status import gather_status

    Remote(settings)  # joins the runtime's Ray
    status = gather_status(settings)
    if args.json:
        print(status.model_dump_json())
    else:
        print(f"namespace {status.namespace}")
        for name, state in status.actors.items():
            print(f"  {name:<11} {state}")
        for name, count in status.counts.items():
            print(f"  {name:<11} {count}")
        if status.notice:
            print(f"notice: {status.notice}")
        for line in _edge_lines(status, settings):
            print(line)
    return (EXIT_OK if all(s.startswith("ok") for s in status.actors.values())
            else EXIT_NO_RUNTIME)


def _edge_lines(status: Any, settings: Settings) -> Iterator[str]:
    """``reverie status`` in words: the MQTT bridge, the location history, presence."""
    from datetime import datetime

    from runtime.time.clock import household_zone

    zone = household_zone(settings.household.timezone)

    def when(t: float | None) -> str:
        return "never" if t is None else datetime.fromtimestamp(t, zone).strftime(
            "%Y-%m-%d %H:%M")

    mqtt = status.mqtt
    if mqtt is None or not mqtt.configured:
        yield "mqtt: no broker configured (set mqtt.host); running without the bridge"
    else:
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(mqtt.rejected.items())) or "none"
        state = ("NOT connected" if not mqtt.connected else "connected" if mqtt.subscribed
                 else "connected (topics not subscribed yet)")
        yield (f"mqtt: {state} to {mqtt.broker}; {mqtt.accepted} accepted, {mqtt.stored}"
               f" stored, rejected: {rejected}" + (f" ({mqtt.error})" if mqtt.error else ""))
    if status.location is not None:
        yield f"location: {status.location.fixes} fixes, last {when(status.location.last_fix_at)}"
    if status.presence:
        yield "presence:"
        for person, p in status.presence.items():
            where = f" ({p.place})" if p.place else ""
            yield f"  {person:<11} {p.state}{where} since {when(p.since)}"
