"""``reverie digest`` and ``reverie profile``: the digests and the user profile.

- ``reverie digest [--period day|week|month] [--json]`` lists the digests
  (``runtime.memories.digests``), oldest first, read from the store read-only (no
  runtime needed, safe beside a running one). JSON: ``{"digests": [{"id",
  "period", "key", "starts_at", "ends_at", "text", "refs", "how",
  "created_at"}]}``. A digest resting on an episode since made sensitive,
  disabled or forgotten is not listed.
- ``reverie profile`` / ``reverie profile show [--json] [--history]`` shows the
  user profile (``runtime.memories.user_profile``), read-only. JSON: ``{"profile":
  {field: value | [values]}, "items": [...]}`` (``--history``: the items that
  left too, with their status and times).
- ``reverie profile set FIELD=VALUE [FIELD=VALUE ...]`` applies the operations
  through the running runtime (the Graph actor), all or nothing. A malformed
  assignment or an unknown field is refused before anything is sent (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from runtime.config import Settings

log = logging.getLogger(__name__)


def cmd_digest(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cli.common import EXIT_OK, _local
    from runtime.memories.digests import DigestService, shown
    from runtime.memories.viz import open_read_only

    with open_read_only(settings) as store:
        digests = shown(store, DigestService(store).listed(args.period))
    if args.json:
        print(json.dumps({"digests": [d.as_json() for d in digests]}))
        return EXIT_OK
    if not digests:
        print("no digests yet (the synthesis job writes them once a day, week or month ends)")
        return EXIT_OK
    for d in digests:
        print(f"{d.key}  ({d.period}, {d.how}, written {_local(d.created_at, settings)})")
        print(f"    {d.text}")
        if d.refs:
            print(f"    from {', '.join(d.refs)}")
    return EXIT_OK


def cmd_profile_show(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cli.common import EXIT_OK, _local
    from runtime.memories.user_profile import ProfileService, profile_fields
    from runtime.memories.viz import open_read_only

    with open_read_only(settings) as store:
        items = ProfileService(store).items(include_ended=args.history)
    if args.json:
        print(json.dumps({"profile": profile_fields(items),
                          "items": [i.as_json() for i in items]}))
        return EXIT_OK
    if not items:
        print("the profile is empty (reverie profile set FIELD=VALUE)")
        return EXIT_OK
    fields: dict[str, Any] = profile_fields(items)
    for field, value in fields.items():
        if isinstance(value, str):
            print(f"{field}: {value}")
            continue
        print(f"{field}:")
        for v in value:
            if isinstance(v, dict):
                tags = "".join(f"[{t}] " for t in (
                    f"scope:{v['scope']}" if v["scope"] else "", v["severity"] or "") if t)
                print(f"  - {tags}{v['text']}")
            else:
                print(f"  - {v}")
    if args.history:
        ended = [i for i in items if i.status != "active"]
        if ended:
            print("history:")
        for i in ended:
            print(f"  {i.field}: {i.value} ({i.status} {_local(i.ended_at, settings)})")
    return EXIT_OK


def cmd_profile_set(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cli.common import EXIT_OK, Remote
    from actors.messages import UpdateProfile
    from runtime.memories.user_profile import parse_assignment

    ops = [parse_assignment(a) for a in args.assignments]  # ValueError: nothing sent
    updated = Remote(settings).graph.update_profile(UpdateProfile(ops=ops, writer="cli"))
    for line in updated.changes:
        print(line)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """The ``digest`` and ``profile`` commands on ``reverie``'s subparsers."""
    digest = sub.add_parser("digest", help="the daily, weekly and monthly digests (no "
                            "runtime needed)")
    digest.add_argument("--period", choices=("day", "week", "month"))
    digest.add_argument("--json", action="store_true")
    digest.set_defaults(func=cmd_digest)

    profile = sub.add_parser("profile", help="the user profile: show it, or set FIELD=VALUE "
                             "(goals=..., goals_done=..., goals_remove=..., goals_replace=...)")
    profile.set_defaults(func=cmd_profile_show, json=False, history=False)
    profile_sub = profile.add_subparsers(dest="profile_command")
    show = profile_sub.add_parser("show", help="the active profile (no runtime needed)")
    show.add_argument("--json", action="store_true")
    show.add_argument("--history", action="store_true",
                      help="also the items that left: done, removed, replaced")
    show.set_defaults(func=cmd_profile_show)
    set_ = profile_sub.add_parser(
        "set", help="apply FIELD=VALUE operations through the runtime, all or nothing; "
        "directives may start with [scope:CHANNEL-OR-PERSON] and [hard]")
    set_.add_argument("assignments", nargs="+", metavar="FIELD=VALUE")
    set_.set_defaults(func=cmd_profile_set)
