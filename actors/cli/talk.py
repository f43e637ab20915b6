"""``reverie say``, ``reverie chat`` and ``reverie recall``: turns to the running
runtime, and what recall would find for a query.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from actors.cli.common import EXIT_OK, Remote
from runtime.config import Settings


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
