"""``reverie household add|stop|export|delete ID``: the households one runtime
serves (``[households] enabled``; :mod:`runtime.store.households`).

- ``add ID``: its directory (0700), its store (made and migrated), its HTTP
  bearer token (``<root>/ID/http-token``, 0600); a stopped household is
  served again. A running runtime serves it from its next request on.
- ``stop ID``: no longer served: the running owners close it (a request for it
  is then refused, as for any household not served); its data stays.
- ``export ID --to FILE``: a consistent copy of its store (SQLite's online
  backup, while the runtime runs), 0600. The vector index is derived: it is
  rebuilt from the store.
- ``delete ID --yes``: stopped, then its directory removed for good.
- ``move ID --to NODE``: served from another node from now on, through its
  replica (``actors/household_move.py``): writes held back (refused as
  retryable) while it moves, a final sync, a restore on that node, the route
  flipped (``<root>/routes.json``), the old copy removed. NODE is a node's
  name (``reverie join --name NAME``; the hub is ``hub``) or its Ray node id.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from actors.cli.common import EXIT_BAD_INPUT, EXIT_OK, _confirm
from runtime.config import Settings
from runtime.store.households import Households

# Every owner that may hold a household open.
OWNER_ACTORS = ("turns", "cron", "graph", "episodes", "recall", "transcript")


def close_in_runtime(settings: Settings, household: str) -> list[str]:
    """Ask the running runtime's owners to close ``household`` (each answers
    whether it had it open); nothing when no runtime runs. The owners closed."""
    import ray

    from actors.discovery import NoRuntime, connect
    from actors.messages import Request

    if not ray.is_initialized():
        try:
            connect(settings)
        except NoRuntime:
            return []
    ns = settings.runtime.namespace
    closed: list[str] = []
    for name in OWNER_ACTORS:
        try:
            handle = ray.get_actor(name, namespace=ns)
        except ValueError:
            continue
        if ray.get(handle.close_household.remote(Request(household=household)), timeout=120):
            closed.append(name)
    return closed


def cmd_household_add(args: argparse.Namespace, settings: Settings) -> int:
    from actors.http.app import load_or_create_token, token_path

    registry = Households(settings)
    where = registry.add(args.id)
    own = registry.settings_for(args.id)
    load_or_create_token(own)
    print(f"household {args.id}: {where}")
    print(f"  its HTTP API: /households/{args.id}/, bearer token in {token_path(own)}")
    return EXIT_OK


def cmd_household_stop(args: argparse.Namespace, settings: Settings) -> int:
    registry = Households(settings)
    registry.stop(args.id)
    closed = close_in_runtime(settings, args.id)
    print(f"household {args.id} stopped" + (f" (closed by {', '.join(closed)})"
                                            if closed else ""))
    return EXIT_OK


def cmd_household_export(args: argparse.Namespace, settings: Settings) -> int:
    import apsw

    registry = Households(settings)
    source = registry.settings_for(args.id).store.path
    target = Path(args.to).expanduser()
    if target.exists():
        print(f"error: {target} exists; not overwritten")
        return EXIT_BAD_INPUT
    fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
    dst = apsw.Connection(str(target))
    try:
        with dst.backup("main", src, "main") as copy:
            while not copy.done:
                copy.step(1000)
    finally:
        dst.close()
        src.close()
    os.chmod(target, 0o600)
    print(f"household {args.id} exported to {target}")
    return EXIT_OK


def cmd_household_delete(args: argparse.Namespace, settings: Settings) -> int:
    registry = Households(settings)
    registry.dir_of(args.id)  # a bad id is refused before anything is asked
    if not args.yes and not _confirm(f"delete household {args.id} and all its memories "
                                     "for good?"):
        return 1
    registry.stop(args.id)
    close_in_runtime(settings, args.id)
    registry.delete(args.id)
    print(f"household {args.id} deleted")
    return EXIT_OK


def cmd_household_move(args: argparse.Namespace, settings: Settings) -> int:
    import ray

    from actors.discovery import NoRuntime, connect
    from actors.household_move import move

    registry = Households(settings)
    registry.dir_of(args.id)  # a bad id is refused before anything is asked
    if not ray.is_initialized():
        try:
            connect(settings)
        except NoRuntime as exc:
            print(f"error: {exc}")
            return EXIT_BAD_INPUT
    try:
        report = move(settings, args.id, args.to)
    except ValueError as exc:
        print(f"error: {exc}")
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(report, indent=1))
    elif not report["moved"]:
        print(f"household {args.id} is served by {report['to']} already")
    else:
        print(f"household {args.id} moved from {report['from']} to {report['to']} in "
              f"{report['seconds']:.1f} s ({report['restored']['turns']} turns, write log "
              f"{report['restored']['write_log_id']})")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    household = sub.add_parser("household", help="the households this runtime serves "
                               "([households] enabled): add, stop, export, delete, move")
    household_sub = household.add_subparsers(dest="household_command", required=True)
    add = household_sub.add_parser("add", help="add a household (or serve a stopped one again)")
    add.add_argument("id", help="lower-case letters, digits and dashes")
    add.set_defaults(func=cmd_household_add)
    stop = household_sub.add_parser("stop", help="stop serving a household (its data stays)")
    stop.add_argument("id")
    stop.set_defaults(func=cmd_household_stop)
    export = household_sub.add_parser("export", help="a consistent copy of its store")
    export.add_argument("id")
    export.add_argument("--to", required=True, metavar="FILE")
    export.set_defaults(func=cmd_household_export)
    delete = household_sub.add_parser("delete", help="delete a household for good")
    delete.add_argument("id")
    delete.add_argument("--yes", action="store_true", help="do not ask")
    delete.set_defaults(func=cmd_household_delete)
    move = household_sub.add_parser("move", help="serve a household from another node, "
                                    "through its replica")
    move.add_argument("id")
    move.add_argument("--to", required=True, metavar="NODE",
                      help="the node's name (reverie join --name; the hub is 'hub') "
                           "or its Ray node id")
    move.add_argument("--json", action="store_true", help="the report as JSON")
    move.set_defaults(func=cmd_household_move)
