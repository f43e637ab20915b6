"""The ``reverie`` command.

``reverie run`` starts the runtime in the foreground (a local Ray node with a
bounded object store and the dashboard on 127.0.0.1 behind Ray's token auth,
then the Supervisor and its actors) and stops cleanly on Ctrl-C or SIGTERM.
It writes ``runtime.json`` into the data directory; the other commands find
the running runtime from it (``REVERIE_DATA_DIR`` chooses the directory).

Exit codes: 0 done; 1 no runtime answering (or already running); 2 bad input
or configuration.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runtime.config import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)

RUNTIME_FILE = "runtime.json"
TOKEN_FILE = "ray-auth-token"
IMPORT_BATCH = 128


class NoRuntime(RuntimeError):
    pass


# -- runtime discovery ------------------------------------------------------

def _runtime_path(settings: Settings) -> Path:
    return settings.store.resolved_dir / RUNTIME_FILE


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_runtime(settings: Settings) -> dict[str, Any]:
    path = _runtime_path(settings)
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise NoRuntime(f"no runtime is running for {settings.store.resolved_dir}"
                        " (start one with `reverie run`)") from None
    except ValueError:
        raise NoRuntime(f"{path} is unreadable; is a runtime running?") from None
    if not _pid_alive(int(info.get("pid", -1))):
        raise NoRuntime(f"the runtime that wrote {path} (pid {info.get('pid')}) is gone")
    return info


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _use_token(settings: Settings) -> Path:
    """Ray's token auth, with a private token file in the data directory."""
    path = settings.store.resolved_dir / TOKEN_FILE
    if not path.exists():
        _write_private(path, secrets.token_urlsafe(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return path


def _prepare_auth(args: argparse.Namespace, settings: Settings) -> None:
    """Point Ray at our token file: when we start the node, or when the running
    runtime started its own node with one."""
    if args.command == "run":
        if not args.address:
            settings.store.resolved_dir.mkdir(parents=True, exist_ok=True)
            _use_token(settings)
        return
    try:
        info = json.loads(_runtime_path(settings).read_text())
    except (OSError, ValueError):
        return
    if info.get("auth") == "token-file":
        _use_token(settings)


def connect(settings: Settings) -> Any:
    """Join the running runtime's Ray cluster; return the ray module."""
    info = read_runtime(settings)
    import ray

    try:
        ray.init(address=info["address"], namespace=info["namespace"], logging_level=logging.ERROR,
                 log_to_driver=False, configure_logging=False)
    except Exception as exc:
        raise NoRuntime(f"the runtime at {info['address']} is not answering: {exc}") from None
    return ray


def _call(ray: Any, settings: Settings, name: str, method: str, *args: Any,
          timeout: float = 120.0) -> Any:
    from actors.common import actor, unwrap

    try:
        handle = actor(name, settings.runtime.namespace)
    except ValueError:
        raise NoRuntime(f"no {name!r} actor in namespace {settings.runtime.namespace!r}") from None
    try:
        return ray.get(getattr(handle, method).remote(*args), timeout=timeout)
    except ray.exceptions.RayTaskError as exc:
        raise unwrap(exc) from None


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
    from actors import supervisor

    path = _runtime_path(settings)
    try:
        read_runtime(settings)
        print(f"reverie: already running for {settings.store.resolved_dir}", file=sys.stderr)
        return 1
    except NoRuntime:
        pass
    settings.store.resolved_dir.mkdir(parents=True, exist_ok=True)
    rt = settings.runtime
    import ray

    auth = "inherited"
    init_args: dict[str, Any] = {"namespace": rt.namespace, "logging_level": logging.WARNING,
                                 "log_to_driver": args.verbose}
    if args.address:
        init_args["address"] = args.address
    else:
        auth = "token-file"  # set up by _prepare_auth before Ray was imported
        init_args.update(
            num_cpus=rt.num_cpus, object_store_memory=rt.object_store_mb * 1024 * 1024,
            include_dashboard=rt.dashboard, dashboard_host=rt.dashboard_host,
            dashboard_port=rt.dashboard_port, _node_ip_address="127.0.0.1")
    print("reverie: starting Ray…", file=sys.stderr, flush=True)
    ctx: Any = ray.init(**init_args)
    stop = threading.Event()  # installed after ray.init, which sets its own handlers
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print("reverie: starting actors…", file=sys.stderr, flush=True)
        sup = supervisor.start(settings)
        info = {"address": ctx.address_info["gcs_address"], "namespace": rt.namespace,
                "pid": os.getpid(), "auth": auth, "started_at": time.time(),
                "dashboard": ctx.dashboard_url or None}
        _write_private(path, json.dumps(info))
        print(f"reverie: running (namespace {rt.namespace}, data {settings.store.resolved_dir})")
        if ctx.dashboard_url:
            print(f"reverie: dashboard http://{ctx.dashboard_url} (token in "
                  f"{settings.store.resolved_dir / TOKEN_FILE})")
        print("reverie: Ctrl-C to stop", flush=True)
        while not stop.wait(5.0):
            try:
                ray.get(sup.ping.remote(), timeout=30)
            except Exception as exc:
                log.error("supervisor not answering: %s", exc)
        print("reverie: stopping…", file=sys.stderr, flush=True)
        try:
            ray.get(sup.stop.remote(), timeout=120)
        except Exception as exc:
            log.warning("clean stop failed: %s", exc)
    finally:
        if path.exists() and json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
        ray.shutdown()
    print("reverie: stopped", file=sys.stderr)
    return 0


def _turn(args: argparse.Namespace, text: str) -> Any:
    from actors.messages import UserTurn

    return UserTurn(channel=args.channel, source=args.source, text=text,
                    temporary=args.temporary)


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
    ray = connect(settings)
    _print_reply(_call(ray, settings, "turns", "process", _turn(args, args.text)), args.json)
    return 0


def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from actors.common import BadRequest

    ray = connect(settings)
    print(f"reverie chat on channel {args.channel!r}; /quit or Ctrl-D to leave", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if not line.strip():
            continue
        try:
            reply = _call(ray, settings, "turns", "process", _turn(args, line))
        except (BadRequest, ValidationError) as exc:
            print(f"reverie: {exc}", file=sys.stderr)
            continue
        print(f"reverie> {reply.text}")
        if reply.notice:
            print(f"  {reply.notice}", file=sys.stderr)


def cmd_recall(args: argparse.Namespace, settings: Settings) -> int:
    from actors.messages import Recall

    ray = connect(settings)
    found = _call(ray, settings, "recall", "recall",
                  Recall(query=args.query, max_items=args.max_items))
    if args.json:
        print(found.model_dump_json())
        return 0
    if found.degraded:
        print(f"(degraded recall: {found.reason})", file=sys.stderr)
    if not found.items:
        print("(nothing relevant)")
    for item in found.items:
        print(f"{item.ref:<12} {item.score:6.3f}  {item.text}")
    return 0


def cmd_remember(args: argparse.Namespace, settings: Settings) -> int:
    """An explicit "remember: …": a user-managed fact that bypasses quality gating."""
    from actors.messages import AddFact
    from runtime.facts import FactIn

    ray = connect(settings)
    key = "note-" + hashlib.sha1(args.text.strip().lower().encode()).hexdigest()[:10]
    fact = FactIn(kind=args.kind, subject=args.subject, key=args.key or key, value=args.text,
                  confidence=1.0, source="user", user_managed=True)
    written = _call(ray, settings, "graph", "add", AddFact(fact=fact, writer="cli"))
    _call(ray, settings, "recall", "sync", None)
    print(f"fact:{written.fact_id} ({written.action})")
    return 0


def _fact_id(ref: str) -> int:
    kind, _, ident = ref.rpartition(":")
    if kind not in ("", "fact") or not ident.isdigit():
        raise ValueError(f"{ref!r} is not a fact ref (fact:<id>); only facts can be "
                         "forgotten or disabled so far")
    return int(ident)


def _change(args: argparse.Namespace, settings: Settings, change: str) -> int:
    from actors.messages import ChangeFact

    fact_id = _fact_id(args.ref)
    ray = connect(settings)
    ack = _call(ray, settings, "graph", "change",
                ChangeFact(fact_id=fact_id, change=change, writer="cli"))  # type: ignore[arg-type]
    print(ack.detail)
    return 0


def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    return _change(args, settings, "delete")


def cmd_disable(args: argparse.Namespace, settings: Settings) -> int:
    return _change(args, settings, "disable")


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from actors.messages import StatusRequest

    ray = connect(settings)
    status = _call(ray, settings, "supervisor", "status", StatusRequest(), timeout=60)
    if args.json:
        print(status.model_dump_json())
    else:
        print(f"namespace {status.namespace}")
        for name, state in status.actors.items():
            print(f"  {name:<11} {state}")
        for name, count in status.counts.items():
            print(f"  {name:<11} {count}")
    return 0 if all(s == "ok" for s in status.actors.values()) else 1


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{n}: not JSON: {exc}") from None


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Import a conversation history (JSON lines of turns) with a progress bar."""
    from actors.messages import AppendTurns
    from runtime.transcript import TurnIn

    path = Path(args.file)
    turns: list[TurnIn] = []
    for n, row in _read_jsonl(path):
        # the same line imported twice is written once
        request_id = "import-" + hashlib.sha1(f"{path.name}:{n}".encode()).hexdigest()[:20]
        try:
            turns.append(TurnIn(**{"channel": args.channel, "source": "user",
                                   "request_id": request_id, **row}))
        except (ValidationError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
    ray = connect(settings)
    for start in range(0, len(turns), IMPORT_BATCH):
        _call(ray, settings, "transcript", "append",
              AppendTurns(turns=turns[start:start + IMPORT_BATCH], writer="import"))
        progress(min(start + IMPORT_BATCH, len(turns)), len(turns), "import")
    _reindex_progress(ray, settings)
    print(f"imported {len(turns)} turns from {path}")
    return 0


def _reindex_progress(ray: Any, settings: Settings) -> None:
    from actors.messages import SyncIndex

    first = _call(ray, settings, "recall", "pending", None)
    total, done = int(first), 0
    while True:
        synced = _call(ray, settings, "recall", "sync", SyncIndex(limit=256), timeout=600)
        if synced.added == 0:
            if done < total:  # fewer were pending than counted: finish the bar
                progress(total, total, "index")
            return
        done += synced.added
        progress(min(done, total), total, "index")


def cmd_reindex(args: argparse.Namespace, settings: Settings) -> int:
    ray = connect(settings)
    if args.reembed:
        _call(ray, settings, "recall", "clear", None, timeout=600)
    _reindex_progress(ray, settings)
    return 0


# -- entry point ------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reverie", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="configuration file (default: $REVERIE_CONFIG "
                   "or the shipped configs/reverie.toml)")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start the runtime in the foreground")
    run.add_argument("--address", help="join this existing Ray cluster instead of starting one")
    run.add_argument("--verbose", action="store_true", help="show the actors' logs")
    run.set_defaults(func=cmd_run)

    def turn_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--channel", default="cli")
        sp.add_argument("--source", default="user")
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
    recall.set_defaults(func=cmd_recall)

    remember = sub.add_parser("remember", help="remember something explicitly (a fact)")
    remember.add_argument("text")
    remember.add_argument("--kind", default="user_specific")
    remember.add_argument("--subject", default="user")
    remember.add_argument("--key", help="fact key (default: derived from the text)")
    remember.set_defaults(func=cmd_remember)

    forget = sub.add_parser("forget", help="delete a fact for good (fact:<id>)")
    forget.add_argument("ref")
    forget.set_defaults(func=cmd_forget)

    disable = sub.add_parser("disable", help="hide a fact from recall, reversibly (fact:<id>)")
    disable.add_argument("ref")
    disable.set_defaults(func=cmd_disable)

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
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"reverie: configuration error: {exc}", file=sys.stderr)
        return 2
    _prepare_auth(args, settings)  # Ray reads its auth settings when first imported
    from actors.common import BadRequest

    try:
        return int(args.func(args, settings))
    except NoRuntime as exc:
        print(f"reverie: {exc}", file=sys.stderr)
        return 1
    except (BadRequest, ValidationError, ValueError) as exc:
        print(f"reverie: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
