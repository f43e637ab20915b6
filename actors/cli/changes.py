"""``reverie remember``, ``forget``, ``disable``, ``enable`` and ``sensitive``:
write a user-managed fact, change a memory by its ref (or, for ``forget`` and
``disable``, the memories ``--matching`` some words, after asking).

``forget --matching`` lists the turns, episodes and facts holding every word,
then the turns whose tool calls do (``runtime.memories.refs.find_matching``),
and forgets them in that order. Forgetting one forgets what quotes it
(``runtime.memories.derived``), so an item further down may be gone already
when its turn comes: it is said, and the command goes on.
"""

from __future__ import annotations

import argparse
import hashlib

from actors.cli.common import EXIT_OK, Remote, _confirm
from runtime.config import Settings


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


def _change_command(args: argparse.Namespace, settings: Settings, change: str) -> int:
    from actors.messages import FindMemories
    from runtime.memories.refs import NoSuchItem

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
        try:
            print(_change(remote, item.ref, change))
        except NoSuchItem:  # forgotten a moment ago, with a memory quoting it
            print(f"{item.ref.replace(':', ' ')} gone already, with what it was written from")
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
