"""``reverie import``, ``reverie reindex`` and ``reverie backup``: import a
conversation history (JSON lines of turns) with a progress bar, catch the
vector index up, verify the Litestream replica or restore from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from actors.cli.common import EXIT_BAD_INPUT, EXIT_OK, EXIT_RUNTIME_ERROR, Remote
from actors.discovery import NoRuntime, read_runtime
from runtime.config import Settings

IMPORT_BATCH = 128
REINDEX_TIMEOUT_S = 600.0


# -- progress ---------------------------------------------------------------

def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    bar = "#" * int(frac * width)
    end = "\n" if done >= total else ""
    print(f"\r{label:<7}[{bar:<{width}}] {done}/{total}", end=end, file=sys.stderr, flush=True)


# -- import, reindex -------------------------------------------------------

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
