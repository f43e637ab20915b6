"""The ``reverie`` command: argument parsing and the client commands.

``reverie run`` starts the runtime (``actors.node``); every other command
finds it through ``runtime.json`` in the data directory
(``actors.discovery``), joins its Ray cluster and sends typed messages to its
actors. ``REVERIE_DATA_DIR`` chooses the data directory.

Exit codes: 0 done; 1 no runtime answering (or one already running);
2 bad input or configuration; 3 the runtime failed (an actor died, a call
timed out). Errors are one line on stderr, never a traceback.

This module assembles the parser and runs ``main`` (the first paragraph above
is ``reverie --help``'s description); the commands are in one module per group
(:mod:`actors.cli`), what they share in :mod:`actors.cli.common`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from actors.cli.changes import (
    cmd_disable,
    cmd_enable,
    cmd_forget,
    cmd_remember,
    cmd_sensitive,
)
from actors.cli.common import EXIT_BAD_INPUT, EXIT_NO_RUNTIME, EXIT_OK, EXIT_RUNTIME_ERROR
from actors.cli.graph import (
    cmd_graph_map,
    cmd_graph_neighbours,
    cmd_place_list,
    cmd_place_name,
    cmd_viz,
)
from actors.cli.jobs import cmd_jobs, cmd_jobs_run, cmd_presence, cmd_remind
from actors.cli.lifecycle import (
    cmd_cluster_init,
    cmd_cluster_issue,
    cmd_init,
    cmd_join,
    cmd_run,
    cmd_status,
)
from actors.cli.talk import cmd_chat, cmd_recall, cmd_say
from actors.cli.transfer import cmd_backup_restore, cmd_backup_verify, cmd_import, cmd_reindex
from actors.discovery import NoRuntime, prepare_client_auth
from runtime.config import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)


def _exit_code(exc: BaseException) -> tuple[int, str]:
    """How an error is reported: its exit code and its one line."""
    from ray.exceptions import GetTimeoutError, RayActorError, RayError

    from actors.common import BadRequest, bad_request
    from actors.handles import NoActor

    if isinstance(exc, NoRuntime):
        return EXIT_NO_RUNTIME, str(exc)
    if isinstance(exc, ValidationError):
        return EXIT_BAD_INPUT, f"error: {bad_request(exc)}"
    if isinstance(exc, BadRequest | ValueError | FileExistsError):
        return EXIT_BAD_INPUT, f"error: {exc}"
    if isinstance(exc, NoActor):
        return EXIT_RUNTIME_ERROR, f"runtime error: {exc}; see `reverie status`"
    if isinstance(exc, GetTimeoutError):
        return EXIT_RUNTIME_ERROR, "runtime error: a call timed out; see `reverie status`"
    if isinstance(exc, RayActorError):
        return EXIT_RUNTIME_ERROR, ("runtime error: an actor died or is restarting; "
                                    "see `reverie status`")
    if isinstance(exc, RayError):
        return EXIT_RUNTIME_ERROR, f"runtime error: {type(exc).__name__}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return EXIT_RUNTIME_ERROR, f"runtime error: {type(exc).__name__}: {first}"


# -- entry point ------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reverie", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="configuration file, layered over the "
                   "packaged defaults (default: $REVERIE_CONFIG, else "
                   "~/.config/reverie/reverie.toml if it exists)")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start the runtime in the foreground")
    run.add_argument("--address", help="join this existing Ray cluster instead of starting "
                     "a local node (its addresses are routable: see docs/security.md)")
    run.add_argument("--verbose", action="store_true", help="show the actors' logs")
    run.add_argument("--cluster", action="store_true", help="be the head of the household's "
                     "cluster: a routable address, Ray's token auth and TLS (docs/scaling.md)")
    run.set_defaults(func=cmd_run)

    join = sub.add_parser("join", help="make this machine a helper node of a household's "
                          "cluster: it runs jobs (docs/scaling.md)")
    join.add_argument("address", help="the head's address, host:port")
    join.add_argument("--name", metavar="NAME", help="this node's name: it can serve "
                      "households (`reverie household move ID --to NAME`), kept under "
                      "this machine's [households] root")
    join.set_defaults(func=cmd_join)

    cluster = sub.add_parser("cluster", help="the household's cluster certificates and token")
    cluster_sub = cluster.add_subparsers(dest="cluster_command", required=True)
    cluster_init = cluster_sub.add_parser("init", help="make the CA, the Ray token and this "
                                          "hub's certificate")
    cluster_init.add_argument("--node-ip", help="this hub's routable address (default: "
                              "cluster.node_ip, else the machine's own)")
    cluster_init.set_defaults(func=cmd_cluster_init)
    cluster_issue = cluster_sub.add_parser("issue", help="make a helper's bundle")
    cluster_issue.add_argument("node_ip", help="the helper's routable address")
    cluster_issue.add_argument("--out", type=Path, required=True, help="a new directory")
    cluster_issue.set_defaults(func=cmd_cluster_issue)

    init = sub.add_parser("init", help="write a commented user configuration file")
    init.add_argument("--path", type=Path, help="where (default: $REVERIE_CONFIG or "
                      "~/.config/reverie/reverie.toml)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.add_argument("--service", action="store_true",
                      help="write a systemd unit that runs `reverie run` instead (default: "
                      "~/.config/systemd/user/reverie.service); enables and starts nothing")
    init.add_argument("--system", action="store_true", help="with --service: a system unit "
                      "(/etc/systemd/system/reverie.service) that runs as you")
    init.set_defaults(func=cmd_init, needs_settings=False)

    def turn_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--channel", default="cli")
        sp.add_argument("--source", default="user")
        sp.add_argument("--speaker", default=None,
                        help="who is talking (a household member's name): the turn is "
                             "theirs, and the reply may use only what the privacy rules "
                             "let that speaker be told")
        sp.add_argument("--temporary", action="store_true",
                        help="a temporary chat: writes no memory and no transcript")

    chat = sub.add_parser("chat", help="talk to the running runtime")
    turn_args(chat)
    chat.set_defaults(func=cmd_chat)

    say = sub.add_parser("say", help="say one turn, print the reply")
    say.add_argument("text")
    turn_args(say)
    say.add_argument("--json", action="store_true")
    say.set_defaults(func=cmd_say)

    recall = sub.add_parser("recall", help="what would be recalled for a query")
    recall.add_argument("query")
    recall.add_argument("--max-items", type=int)
    recall.add_argument("--json", action="store_true")
    recall.add_argument("--person", metavar="NAME",
                        help="only NAME's memories and the household's")
    recall.set_defaults(func=cmd_recall)

    remember = sub.add_parser("remember", help="remember something explicitly (a fact)")
    remember.add_argument("text")
    remember.add_argument("--kind", default="user_specific")
    remember.add_argument("--subject", default="user")
    remember.add_argument("--key", help="fact key (default: derived from the text)")
    remember.add_argument("--level", choices=("normal", "vivid", "seared"), default="normal",
                          help="memory level: vivid never fades below half, seared never fades")
    remember.add_argument("--sensitive", action="store_true",
                          help="codes, health, money: only its owner is ever told it, "
                          "never an unknown voice; never in a portrait or digest")
    remember.add_argument("--person", metavar="NAME",
                          help="whose it is (default: the household's)")
    remember.set_defaults(func=cmd_remember)

    def change_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("ref", nargs="?", help="turn:<id>, episode:<id> or fact:<id>")
        sp.add_argument("--matching", metavar="TEXT",
                        help="find memories by their words, show them and ask first")
        sp.add_argument("--yes", action="store_true", help="with --matching: do not ask")

    forget = sub.add_parser("forget", help="delete a memory for good, content and all")
    change_args(forget)
    forget.set_defaults(func=cmd_forget)

    disable = sub.add_parser("disable", help="hide a memory from recall, reversibly")
    change_args(disable)
    disable.set_defaults(func=cmd_disable)

    enable = sub.add_parser("enable", help="bring a disabled memory back")
    enable.add_argument("ref", help="turn:<id>, episode:<id> or fact:<id>")
    enable.set_defaults(func=cmd_enable)

    sensitive = sub.add_parser("sensitive", help="mark a memory sensitive (codes, health, "
                               "money), or not with --off")
    sensitive.add_argument("ref", help="turn:<id>, episode:<id> or fact:<id>")
    sensitive.add_argument("--off", action="store_true", help="no longer sensitive")
    sensitive.set_defaults(func=cmd_sensitive)

    status = sub.add_parser("status", help="health of the running runtime (exit 1 if none)")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    imp = sub.add_parser("import", help="import turns from a JSON-lines file")
    imp.add_argument("file")
    imp.add_argument("--channel", default="import")
    imp.set_defaults(func=cmd_import)

    reindex = sub.add_parser("reindex", help="catch the vector index up (or --reembed all)")
    reindex.add_argument("--reembed", action="store_true")
    reindex.set_defaults(func=cmd_reindex)

    jobs = sub.add_parser("jobs", help="the background jobs: last run, outcome, next time")
    jobs.add_argument("--json", action="store_true")
    jobs.set_defaults(func=cmd_jobs)
    jobs_sub = jobs.add_subparsers(dest="jobs_command")
    jobs_run = jobs_sub.add_parser("run", help="fire one job now, past the idle gate")
    jobs_run.add_argument("name")
    jobs_run.add_argument("--wait", action="store_true",
                          help="wait for the run; exit 0 only if it ended ok")
    jobs_run.set_defaults(func=cmd_jobs_run)

    presence = sub.add_parser("presence", help="someone came home or left (everyone "
                              "away counts as idle)")
    presence.add_argument("state", choices=("home", "away"))
    presence.add_argument("--person", default="household")
    presence.set_defaults(func=cmd_presence)

    remind = sub.add_parser("remind", help="say (or ask the assistant) something at a given "
                            "time, once or repeating; list or cancel reminders")
    remind.add_argument("text", nargs="?")
    remind.add_argument("--at", metavar="WHEN",
                        help="'tomorrow 8:00', 'today 21:30', 'in 2 hours', 'tuesday 19:00', "
                        "'2026-12-24 18:00', '8:00' (the household's time zone)")
    remind.add_argument("--every", metavar="RULE",
                        help="repeat: 'day', 'week', 'weekday' (Mon-Fri), 'N days', "
                        "'N hours' (local wall time kept across DST changes)")
    remind.add_argument("--ask", action="store_true",
                        help="a scheduled prompt: the assistant answers the text on the "
                        "channel (e.g. 'summarise what is on the calendar today')")
    remind.add_argument("--channel", default="cli")
    remind.add_argument("--list", action="store_true", help="the pending reminders")
    remind.add_argument("--json", action="store_true", help="with --list: as JSON")
    remind.add_argument("--cancel", type=int, metavar="ID", help="cancel a pending reminder")
    remind.set_defaults(func=cmd_remind)

    place = sub.add_parser("place", help="the places the geo job found: list them, name one")
    place_sub = place.add_subparsers(dest="place_command", required=True)
    place_list = place_sub.add_parser("list", help="the places with their ids, names and "
                                      "roles, and the habits (no runtime needed)")
    place_list.add_argument("--json", action="store_true")
    place_list.set_defaults(func=cmd_place_list)
    place_name = place_sub.add_parser("name", help="give a place your own name (wins over "
                                      "the gazetteer's, kept across geo runs)")
    place_name.add_argument("id", type=int, help="the place's id (see `reverie place list`)")
    place_name.add_argument("name", help="e.g. \"grandma's house\"")
    place_name.set_defaults(func=cmd_place_name)

    graph = sub.add_parser("graph", help="the fact graph: a subject's neighbours, the map "
                           "(read-only, no runtime needed)")
    graph_sub = graph.add_subparsers(dest="graph_command", required=True)
    graph_near = graph_sub.add_parser("neighbours", help="the facts about a subject, the "
                                      "facts naming it, and the subjects linked to it")
    graph_near.add_argument("subject")
    graph_near.add_argument("--json", action="store_true")
    graph_near.set_defaults(func=cmd_graph_neighbours)
    graph_map = graph_sub.add_parser("map", help="live facts by kind, subjects, links, hubs")
    graph_map.add_argument("--hubs", type=int, default=10, help="how many hubs (default 10)")
    graph_map.add_argument("--json", action="store_true")
    graph_map.set_defaults(func=cmd_graph_map)

    backup = sub.add_parser("backup", help="the Litestream replica: verify it, restore from it")
    backup_sub = backup.add_subparsers(dest="backup_command", required=True)
    verify = backup_sub.add_parser("verify", help="restore the latest replica to a temporary"
                                   " file and compare it with the live store")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_backup_verify)
    restore = backup_sub.add_parser("restore", help="restore the replica (refuses to"
                                    " overwrite the live store while the runtime runs)")
    restore.add_argument("--timestamp", metavar="T", help="a point in time (RFC 3339)")
    restore.add_argument("--to", metavar="PATH", help="a new file instead of the live store")
    restore.set_defaults(func=cmd_backup_restore)

    viz = sub.add_parser("viz", help="draw memory as a picture (PNG): the memory map, "
                         "a timeline, the decay curves")
    viz.add_argument("kind", choices=("map", "timeline", "decay"))
    viz.add_argument("--out", required=True, metavar="FILE.png", help="where to write it")
    viz.set_defaults(func=cmd_viz)

    from actors.cli import doctor  # doctor log | rollback | check-facts

    doctor.add_parser(sub)
    from actors.cli import (
        memory as memory_cli,  # digest [--period P] [--json]; profile [show | set F=V ...]
    )

    memory_cli.add_parsers(sub)
    from actors.cli import timeline as timeline_cmd  # timeline "EXPR" [--json]

    timeline_cmd.add_parser(sub)
    from actors.cli import households  # household add|stop|export|delete ID

    households.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace, Any], int] = args.func
    settings: Settings | None = None
    try:
        if getattr(args, "needs_settings", True):
            settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"reverie: configuration error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if settings is not None and args.command not in ("run", "join", "cluster"):
        # Ray reads its auth settings when first imported: nothing above imports it
        prepare_client_auth(settings)
    try:
        return int(func(args, settings))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`reverie recall … | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        log.debug("command failed", exc_info=True)
        code, line = _exit_code(exc)
        print(f"reverie: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
