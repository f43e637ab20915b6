"""``reverie timeline "EXPR" [--json] [--kind K] [--limit N]``: the memories of
a slice of time named in words ("last week", "May 2023"; :mod:`runtime.recall.timeline`).

The expression is read in the household's zone at the system clock's now (the
runtime's own clock); the memories come from the running runtime's Recall actor
(``BrowseMemories`` with ``dated``). With ``--json`` the answer is
``{"items": [{"ref", "kind", "text", "created_at"}]}`` (``created_at``: when the
memory happened, epoch seconds), oldest first; without it, a heading naming the
span and one line per memory. An expression that names no time exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from runtime.config import Settings

log = logging.getLogger(__name__)


def cmd_timeline(args: argparse.Namespace, settings: Settings) -> int:
    from actors.cli.common import EXIT_OK, Remote
    from actors.messages import BrowseMemories
    from runtime.recall import timeline
    from runtime.time.clock import SystemClock, household_zone

    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    zone = household_zone(settings.household.timezone)
    span = timeline.span_of(args.expr, SystemClock(), zone)  # a bad one: ValueError, exit 2
    recall = Remote(settings).recall

    def browse(query: Any) -> Any:
        return recall.browse(BrowseMemories(
            kinds=list(query.kinds), since=query.since, until=query.until, dated=True,
            oldest_first=True, include_disabled=query.include_disabled, limit=query.limit,
            offset=query.offset))

    kinds = args.kind or list(timeline.KINDS)
    items = [timeline.item(v) for v in timeline.collect(span, browse, args.limit, kinds)]
    if args.json:
        print(json.dumps({"items": items}))
    else:
        print("\n".join(timeline.lines(items, span, zone)))
    return EXIT_OK


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``timeline`` on the ``reverie`` sub-parsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "timeline", help='the memories of a time named in words ("last week", "May 2023")')
    p.add_argument("expr", help='a time: "yesterday evening", "3 months ago", "in April", '
                                '"May 2023", "2023-05-07", ...')
    p.add_argument("--kind", action="append", choices=timeline_kinds(),
                   help="only this kind (repeatable; default: all)")
    p.add_argument("--limit", type=int, help="at most this many (oldest first)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_timeline)
    return p


def timeline_kinds() -> tuple[str, ...]:
    from runtime.recall.timeline import KINDS

    return KINDS
