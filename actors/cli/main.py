"""The ``reverie`` command: argument parsing and the client commands.

``reverie run`` starts the runtime (``actors.node``); every other command
finds it through ``runtime.json`` in the data directory
(``actors.discovery``), joins its Ray cluster and sends typed messages to its
actors. ``REVERIE_DATA_DIR`` chooses the data directory.

Exit codes: 0 done; 1 no runtime answering (or one already running);
2 bad input or configuration; 3 the runtime failed (an actor died, a call
timed out). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from actors.discovery import NoRuntime, connect, prepare_client_auth, read_runtime
from runtime.config import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NO_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME_ERROR = 3

IMPORT_BATCH = 128
CALL_TIMEOUT_S = 120.0
REINDEX_TIMEOUT_S = 600.0


class Remote:
    """The running runtime, reached through the actors' typed clients."""

    def __init__(self, settings: Settings, timeout_s: float = CALL_TIMEOUT_S) -> None:
        connect(settings)
        from actors import handles

        ns = settings.runtime.namespace
        self.namespace = ns
        self.turns = handles.TurnsClient(ns, timeout_s)
        self.transcript = handles.TranscriptClient(ns, timeout_s)
        self.recall = handles.RecallClient(ns, timeout_s)
        self.graph = handles.GraphClient(ns, timeout_s)
        self.cron = handles.CronClient(ns, timeout_s)
        self.timeout_s = timeout_s

    def owner(self, ref: str) -> Any:
        """The client of the actor that owns ``ref``."""
        from actors.handles import owner

        return owner(ref, self.namespace, self.timeout_s)


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


# -- progress ---------------------------------------------------------------

def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    bar = "#" * int(frac * width)
    end = "\n" if done >= total else ""
    print(f"\r{label:<7}[{bar:<{width}}] {done}/{total}", end=end, file=sys.stderr, flush=True)


# -- commands ---------------------------------------------------------------

def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from actors import node

    return node.run(settings, address=args.address, verbose=args.verbose)


def cmd_init(args: argparse.Namespace, settings: Settings | None) -> int:
    from runtime.user_config import default_user_config_path, write_user_config

    path = args.path or default_user_config_path()
    written = write_user_config(path, force=args.force)
    print(f"wrote {written}")
    return EXIT_OK


def _turn(args: argparse.Namespace, text: str) -> Any:
    from actors.messages import UserTurn

    return UserTurn(channel=args.channel, source=args.source, text=text,
                    speaker=args.speaker, temporary=args.temporary)


def _print_reply(reply: Any, as_json: bool) -> None:
    if as_json:
        print(reply.model_dump_json())
        return
    print(reply.text)
    if reply.citations:
        print(f"  (memories used: {', '.join(reply.citations)})", file=sys.stderr)
    if reply.notice:
        print(f"  {reply.notice}", file=sys.stderr)


def cmd_say(args: argparse.Namespace, settings: Settings) -> int:
    remote = Remote(settings)
    _print_reply(remote.turns.process(_turn(args, args.text)), args.json)
    return EXIT_OK


def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from actors.common import BadRequest

    remote = Remote(settings)
    print(f"reverie chat on channel {args.channel!r}; /quit or Ctrl-D to leave", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return EXIT_OK
        if line.strip() in ("/quit", "/exit"):
            return EXIT_OK
        if not line.strip():
            continue
        try:
            reply = remote.turns.process(_turn(args, line))
        except (BadRequest, ValidationError) as exc:
            print(f"reverie: {exc}", file=sys.stderr)
            continue
        print(f"reverie> {reply.text}")
        if reply.notice:
            print(f"  {reply.notice}", file=sys.stderr)


def cmd_recall(args: argparse.Namespace, settings: Settings) -> int:
    from actors.messages import Recall

    found = Remote(settings).recall.recall(Recall(query=args.query, max_items=args.max_items,
                                                  person=args.person))
    if args.json:
        print(found.model_dump_json())
        return EXIT_OK
    if found.degraded:
        print(f"(degraded recall: {found.reason})", file=sys.stderr)
    if not found.items:
        print("(nothing relevant)")
    for item in found.items:
        print(f"{item.ref:<12} {item.score:6.3f}  {item.text}")
    return EXIT_OK


def cmd_remember(args: argparse.Namespace, settings: Settings) -> int:
    """An explicit "remember: …": a user-managed fact that bypasses quality gating."""
    from actors.messages import AddFact
    from runtime.memories.facts import FactIn

    remote = Remote(settings)
    key = args.key or "note-" + hashlib.sha1(args.text.strip().lower().encode()).hexdigest()[:10]
    fact = FactIn(kind=args.kind, subject=args.subject, key=key, value=args.text,
                  confidence=1.0, source="user", user_managed=True,
                  sensitive=args.sensitive, person=args.person,
                  memory_level=args.level)  # the user may ask for vivid or seared
    written = remote.graph.add(AddFact(fact=fact, writer="cli"))
    remote.recall.sync()
    print(f"fact:{written.fact_id} ({written.action})")
    return EXIT_OK


def _change(remote: Remote, ref: str, change: str) -> str:
    from actors.messages import ChangeMemory
    from runtime.memories.refs import parse_ref

    parsed = str(parse_ref(ref))
    ack = remote.owner(parsed).change(
        ChangeMemory(ref=parsed, change=change, writer="cli"))  # type: ignore[arg-type]
    return str(ack.detail)


def _confirm(question: str) -> bool:
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _change_command(args: argparse.Namespace, settings: Settings, change: str) -> int:
    from actors.messages import FindMemories

    if bool(args.ref) == bool(args.matching):
        raise ValueError("give either a ref (turn:12, episode:3, fact:7) or --matching TEXT")
    remote = Remote(settings)
    if args.ref:
        print(_change(remote, args.ref, change))
        return EXIT_OK
    found = remote.recall.find(FindMemories(text=args.matching))
    if not found.items:
        print(f"nothing matches {args.matching!r}")
        return EXIT_OK
    for item in found.items:
        print(f"{item.ref:<12} {item.text}")
    verb = {"delete": "Forget", "disable": "Disable"}[change]
    if not args.yes and not _confirm(f"{verb} these {len(found.items)}?"):
        print("nothing changed")
        return EXIT_OK
    for item in found.items:
        print(_change(remote, item.ref, change))
    return EXIT_OK


def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    return _change_command(args, settings, "delete")


def cmd_disable(args: argparse.Namespace, settings: Settings) -> int:
    return _change_command(args, settings, "disable")


def cmd_enable(args: argparse.Namespace, settings: Settings) -> int:
    print(_change(Remote(settings), args.ref, "enable"))
    return EXIT_OK


def cmd_sensitive(args: argparse.Namespace, settings: Settings) -> int:
    """Mark a memory sensitive (codes, health, money), or not (``--off``).

    The rules: :mod:`runtime.memories.privacy`."""
    print(_change(Remote(settings), args.ref, "not_sensitive" if args.off else "sensitive"))
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


# -- backups (no runtime needed: they read the replica and the store file) -----

def cmd_backup_verify(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.store.backup import BackupError, verify

    try:
        result = verify(settings)
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(result.to_dict()))
    elif result.ok:
        lag = "" if result.lag_s is None else f" (replica {result.lag_s:.1f} s behind)"
        print(f"backup ok: {len(result.tables)} tables match the live store{lag}")
    for problem in result.problems:
        print(f"backup problem: {problem}", file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_RUNTIME_ERROR


def cmd_backup_restore(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.store.backup import BackupError, restore

    try:
        read_runtime(settings)
        running = True
    except NoRuntime:
        running = False
    try:
        path = restore(settings, timestamp=args.timestamp,
                       to=Path(args.to).expanduser() if args.to else None,
                       runtime_running=running)
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"restored {path}")
    return EXIT_OK


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


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: a line must be a JSON object")
            yield n, row


def _default_source(role: str) -> str:
    """The source of an imported line that does not name one: who spoke it."""
    return "assistant" if role == "assistant" else "user" if role == "user" else role


def import_request_id(turn: dict[str, Any], occurrence: int) -> str:
    """The de-duplication key of an imported line: what it says, never where it
    came from. The same line imported twice (from any file) is written once; two
    identical lines of one history are both kept (``occurrence`` tells them apart)."""
    key = json.dumps([turn.get(k) for k in
                      ("channel", "speaker", "role", "source", "created_at", "content")]
                     + [occurrence], sort_keys=True, default=str)
    return "import-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import a conversation history (JSON lines of turns) with a progress bar."""
    from actors.messages import AppendTurns
    from runtime.memories.transcript import TurnIn

    path = Path(args.file)
    turns: list[TurnIn] = []
    seen: dict[str, int] = {}
    for n, row in _read_jsonl(path):
        fields = {"channel": args.channel, **row}
        fields.setdefault("role", "user")
        fields.setdefault("source", _default_source(str(fields["role"])))
        base = import_request_id(fields, 0)
        seen[base] = seen.get(base, -1) + 1
        fields.setdefault("request_id", import_request_id(fields, seen[base]))
        try:
            turns.append(TurnIn(**fields))
        except (ValidationError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
    remote = Remote(settings, timeout_s=REINDEX_TIMEOUT_S)
    for start in range(0, len(turns), IMPORT_BATCH):
        remote.transcript.append(
            AppendTurns(turns=turns[start:start + IMPORT_BATCH], writer="import"))
        progress(min(start + IMPORT_BATCH, len(turns)), len(turns), "import")
    _reindex_progress(remote)
    print(f"imported {len(turns)} turns from {path}")
    return EXIT_OK


def _reindex_progress(remote: Remote) -> None:
    from actors.messages import SyncIndex

    first = remote.recall.pending()
    total, done = int(first), 0
    while True:
        synced = remote.recall.sync(SyncIndex(limit=256))
        if synced.added == 0:
            if done < total:  # fewer were pending than counted: finish the bar
                progress(total, total, "index")
            return
        done += synced.added
        progress(min(done, total), total, "index")


def cmd_reindex(args: argparse.Namespace, settings: Settings) -> int:
    remote = Remote(settings, timeout_s=REINDEX_TIMEOUT_S)
    if args.reembed:
        remote.recall.clear()
    _reindex_progress(remote)
    return EXIT_OK


# -- the subconscious: jobs, presence, reminders ------------------------------

def _local(stamp: float | None, settings: Settings, none: str = "-") -> str:
    from datetime import datetime

    from runtime.time.clock import household_zone

    if stamp is None:
        return none
    return datetime.fromtimestamp(stamp, tz=household_zone(settings.household.timezone)
                                  ).strftime("%Y-%m-%d %H:%M")


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    """The jobs: last run, last outcome, next eligible time, and under each job
    its last run in words (what it did, or why it failed); and the idle gate."""
    from actors.messages import JobsStatus

    report = Remote(settings).cron.status(JobsStatus())
    if args.json:
        print(json.dumps({"jobs": [j.model_dump() for j in report.jobs],
                          "idle": report.idle.model_dump()}))
        return EXIT_OK
    rows = [(j.name, j.last_outcome or "-", _local(j.last_run_at, settings),
             _local(j.next_eligible_at, settings, "now")) for j in report.jobs]
    head = ("job", "last outcome", "last run", "next eligible")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    for row in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        if row[0] in report.details and row is not head:
            print(f"    {report.details[row[0]]}")
    idle = report.idle
    if idle.idle:
        if idle.idle_since is None:
            print(f"idle: no user activity recorded yet ({idle.reason})")
        else:
            print(f"idle since {_local(idle.idle_since, settings)} ({idle.reason})")
    else:
        print(f"active; jobs may run from {_local(idle.eligible_at, settings)}")
    return EXIT_OK


def cmd_jobs_run(args: argparse.Namespace, settings: Settings) -> int:
    """Fire one job now, past the idle gate; with --wait, exit 0 only if it ended ok."""
    from actors.messages import RunJob

    limit = settings.jobs.budget_s * 3 + CALL_TIMEOUT_S
    run = Remote(settings).cron.run(RunJob(name=args.name, wait=args.wait), timeout=limit)
    if not args.wait:
        print(f"{run.name}: started")
        return EXIT_OK
    if run.outcome == "ok":
        detail = f" ({run.detail})" if run.detail else ""
        print(f"{run.name}: ok, {run.items} items{detail}")
        return EXIT_OK
    print(f"reverie: job {run.name} {run.outcome or 'did not end'}: {run.error or ''}".rstrip(),
          file=sys.stderr)
    return EXIT_RUNTIME_ERROR


def cmd_presence(args: argparse.Namespace, settings: Settings) -> int:
    from actors.messages import Presence

    ack = Remote(settings).cron.presence(Presence(person=args.person, state=args.state))
    print(ack.detail)
    return EXIT_OK


def cmd_remind(args: argparse.Namespace, settings: Settings) -> int:
    """Make a reminder (``--ask``: a scheduled prompt; ``--every``: repeating), or
    list the pending ones (``--list``), or cancel one (``--cancel ID``): all
    through the Cron actor, which owns the reminders."""
    from actors.messages import CancelReminder, Remind

    making = args.text is not None or args.at is not None or args.every or args.ask
    if args.list or args.cancel is not None:
        if making or (args.list and args.cancel is not None):
            raise ValueError("--list and --cancel take no text, --at, --every or --ask, "
                             "nor each other")
        if args.cancel is not None:
            print(Remote(settings).cron.cancel_reminder(CancelReminder(id=args.cancel)).detail)
            return EXIT_OK
        return _list_reminders(args, settings)
    if args.json:
        raise ValueError("--json goes with --list")
    if args.text is None or args.at is None:
        raise ValueError("a reminder needs its text and --at WHEN "
                         "(or: --list, --cancel ID)")
    made = Remote(settings).cron.remind(Remind(
        text=args.text, when=args.at, channel=args.channel,
        kind="ask" if args.ask else "say", every=args.every))
    what = "prompt" if made.kind == "ask" else "reminder"
    every = f", every {made.repeat}" if made.repeat else ""
    print(f"{what} {made.id} on {made.channel} at {made.due_local}{every}")
    return EXIT_OK


def _list_reminders(args: argparse.Namespace, settings: Settings) -> int:
    listed = Remote(settings).cron.list_reminders().reminders
    if args.json:
        print(json.dumps({"reminders": [r.model_dump() for r in listed]}))
        return EXIT_OK
    if not listed:
        print("no pending reminders")
        return EXIT_OK
    rows = [(str(r.id), r.kind, _local(r.due_at, settings), r.repeat or "once", r.channel,
             r.text if len(r.text) <= 60 else r.text[:59] + "…") for r in listed]
    head = ("id", "kind", "next", "repeat", "channel", "text")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return EXIT_OK


# -- places (the geo job) -------------------------------------------------------

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
    run.set_defaults(func=cmd_run)

    init = sub.add_parser("init", help="write a commented user configuration file")
    init.add_argument("--path", type=Path, help="where (default: $REVERIE_CONFIG or "
                      "~/.config/reverie/reverie.toml)")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
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
    if settings is not None and args.command != "run":
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
