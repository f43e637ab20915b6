"""``reverie doctor``: read the write log, roll memory back, check facts.

- ``reverie doctor log [--writer W] [--since T] [--until T] [--table TABLE]``:
  the write log, oldest first (the newest ``--limit`` entries);
- ``reverie doctor rollback --to T`` or ``--writer W --since T``: shows what it
  would change (and what it leaves: seared memories, conflicts, forgotten
  rows), asks ``Apply? [y/N]`` unless ``--yes``, then puts episodes and facts
  back (:mod:`runtime.store.rollback`). The rollback is logged as writer
  ``rollback``; the command prints how to undo it;
- ``reverie doctor check-facts``: facts whose names, places or dates are not
  word for word in the turns they cite (:mod:`runtime.mind.support`).

These are maintenance commands: they open the database file directly (WAL and
``BEGIN IMMEDIATE`` make that safe beside the running actors) and need no
runtime. After a rollback, a running runtime's Recall is asked to index the
rows again; with none running, the next start does.

Times (``T``) are read in the household's zone: ``2026-05-01``,
``2026-05-01 14:30``, ``2026-05-01T14:30:00+02:00``, ``today``,
``yesterday 21:30``, ``14:30`` (its last occurrence), ``2 hours ago``,
``3 days ago``, or ``@1777642200`` (seconds since the epoch).

Exit codes as :mod:`actors.cli.common`: 0 done (or nothing to do), 1 the user
declined, 2 bad input, 3 the runtime or the database failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from datetime import date, datetime, timedelta, tzinfo
from datetime import time as dtime
from typing import Any

from actors.cli.common import EXIT_OK, EXIT_RUNTIME_ERROR
from runtime.config import Settings
from runtime.store.database import Row, Store
from runtime.store.rollback import Applied, LogEntry, Plan

log = logging.getLogger(__name__)

EXIT_DECLINED = 1  # the user said no (the code the other commands use for no runtime)

EXCERPT = 48
RESYNC_TIMEOUT_S = 120.0

# -- times ------------------------------------------------------------------------

_UNITS = {"second": 1, "sec": 1, "s": 1, "minute": 60, "min": 60, "m": 60,
          "hour": 3600, "h": 3600, "day": 86400, "d": 86400, "week": 604800, "w": 604800}
_AGO = re.compile(r"^(\d{1,6})\s*(seconds?|secs?|s|minutes?|mins?|m|hours?|h|days?|d|"
                  r"weeks?|w)\s+ago$")
_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?|(\d{1,2})\s*(am|pm)"
_DAY = re.compile(rf"^(today|yesterday)(?:\s+(?:at\s+)?(?:{_CLOCK}))?$")
_BARE = re.compile(rf"^(?:at\s+)?(?:{_CLOCK})$")
_EPOCH = re.compile(r"^@(\d+(?:\.\d+)?)$")
EXAMPLES = ("'2026-05-01 14:30', '2026-05-01', 'yesterday 21:30', '14:30', "
            "'2 hours ago', '3 days ago' or '@1777642200'")


def _clock(groups: Sequence[str | None]) -> dtime:
    hour, minute, second, ampm, bare_hour, bare_ampm = groups
    if bare_hour is not None:
        hour, minute, ampm = bare_hour, "0", bare_ampm
    assert hour is not None
    h, m, s = int(hour), int(minute or 0), int(second or 0)
    if ampm is not None:
        if not 1 <= h <= 12:
            raise ValueError(f"{h}{ampm} is not a time")
        h = h % 12 + (12 if ampm == "pm" else 0)
    if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 60):
        raise ValueError(f"{hour}:{minute} is not a time")
    return dtime(h, m, s)


def _at(day: date, when: dtime, zone: tzinfo) -> float:
    return datetime.combine(day, when).replace(tzinfo=zone).timestamp()


def parse_time(text: str, now: float, zone: tzinfo) -> float:
    """The past instant ``text`` names, read at ``now`` in ``zone``. Raises
    ValueError (a time in the future, or one it cannot read)."""
    spec = " ".join(text.strip().lower().split())
    local = datetime.fromtimestamp(now, tz=zone)
    if m := _EPOCH.match(spec):
        when = float(m.group(1))
    elif spec == "now":
        when = now
    elif m := _AGO.match(spec):
        unit = m.group(2)
        seconds = _UNITS.get(unit) or _UNITS[unit.rstrip("s")]
        when = now - int(m.group(1)) * seconds
    elif m := _DAY.match(spec):
        day = local.date() - timedelta(days=1 if m.group(1) == "yesterday" else 0)
        clock = dtime(0, 0) if m.group(2) is None and m.group(6) is None \
            else _clock(m.groups()[1:])
        when = _at(day, clock, zone)
    elif m := _BARE.match(spec):
        clock = _clock(m.groups())
        when = _at(local.date(), clock, zone)
        if when > now:
            when = _at(local.date() - timedelta(days=1), clock, zone)
    else:
        try:
            parsed = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(f"cannot read the time {text!r}; say {EXAMPLES}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=zone)
        when = parsed.timestamp()
    if when > now:
        raise ValueError(f"{text!r} is in the future")
    return when


def _zone(settings: Settings) -> tzinfo:
    from runtime.time.clock import household_zone

    return household_zone(settings.household.timezone)


def _local(stamp: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(stamp, tz=zone).strftime("%Y-%m-%d %H:%M:%S")


# -- the store ----------------------------------------------------------------------

def open_store(settings: Settings) -> Store:
    """The memory database, opened directly; ValueError if there is none yet."""
    from runtime.store.fact_kinds import FactKinds

    path = settings.store.path
    if not path.is_file():
        raise ValueError(f"no memory database at {path} (check REVERIE_DATA_DIR or "
                         "store.data_dir)")
    return Store(path, FactKinds.load(settings.memory.fact_kinds_file),
                 settings.store.busy_timeout_ms, synchronous=settings.store.synchronous)


def _excerpt(text: Any, width: int = EXCERPT) -> str:
    flat = " ".join(str(text).split())
    return json.dumps(flat if len(flat) <= width else flat[:width - 1] + "…",
                      ensure_ascii=False)


_REF_KIND = {"transcript": "turn", "episodes": "episode", "facts": "fact",
             "compactions": "compaction", "tool_calls": "tool_call",
             "episode_citations": "episode"}


def _what(table: str, row: Row) -> str:
    """A short excerpt saying which memory a row is."""
    if table == "episodes" and "gist" in row:
        return _excerpt(row["gist"])
    if table == "facts" and "value" in row:
        return _excerpt(f"{row.get('subject', '')} {row.get('key', '')}: {row['value']}")
    if table == "transcript" and "content" in row:
        return _excerpt(row["content"])
    if table == "compactions" and "summary" in row:
        return _excerpt(row["summary"])
    if table == "tool_calls" and "name" in row:
        return str(row["name"])
    if table == "episode_citations":
        return f"cites turn:{row.get('transcript_id')}"
    return ""


def _entry_detail(entry: LogEntry) -> str:
    if entry.forgotten:
        return "(forgotten)"
    if entry.op == "update" and entry.before is not None and entry.after is not None:
        changed = [c for c in entry.after if c != "id" and entry.before.get(c) != entry.after[c]]
        return ", ".join(changed) or "(no change)"
    row = entry.after if entry.op == "insert" else entry.before
    return "" if row is None else _what(entry.table, row)


# -- doctor log -------------------------------------------------------------------

def cmd_doctor_log(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.store.rollback import log_entries

    zone = _zone(settings)
    now = time.time()
    since = None if args.since is None else parse_time(args.since, now, zone)
    until = None if args.until is None else parse_time(args.until, now, zone)
    if args.limit < 1:
        raise ValueError("--limit must be at least 1")
    with open_store(settings) as store:
        entries = log_entries(store, writer=args.writer, since=since, until=until,
                              tables=args.table or None, limit=args.limit)
    if args.json:
        for e in entries:
            print(json.dumps({"id": e.id, "at": e.at, "writer": e.writer, "op": e.op,
                              "table": e.table, "row_id": e.row_id, "before": e.before,
                              "after": e.after}, ensure_ascii=False))
        return EXIT_OK
    if not entries:
        print("(no write-log entries match)")
        return EXIT_OK
    for e in entries:
        ref = f"{_REF_KIND.get(e.table, e.table)}:{e.row_id}"
        print(f"{_local(e.at, zone)}  {e.writer:<12} {e.op:<6} {ref:<14} "
              f"{_entry_detail(e)}".rstrip())
    return EXIT_OK


# -- doctor rollback ----------------------------------------------------------------

_ACTION = {"delete": "remove", "restore": "restore", "update": "put back",
           "relink": "citations"}


def _change_line(change: Any) -> str:
    row = change.current if change.action == "delete" else change.target
    if change.action == "update":
        detail = ", ".join(change.columns)
    elif change.action == "relink":
        detail = ""
    else:
        detail = _what(change.table, row or {})
    cites = []
    if change.cite_add:
        cites.append(f"+{len(change.cite_add)} citations")
    if change.cite_remove:
        cites.append(f"-{len(change.cite_remove)} citations")
    if change.kept:  # privacy marks are never loosened (runtime.store.rollback)
        cites.append(f"keeps {' and '.join(change.kept)}")
    tail = " ".join(p for p in (detail, f"({', '.join(cites)})" if cites else "") if p)
    return f"  {change.ref:<14} {_ACTION[change.action]:<10} {tail}".rstrip()


def print_plan(p: Plan, zone: tzinfo) -> None:
    if p.to is not None:
        print(f"Roll back every change to episodes and facts after {_local(p.to, zone)}:")
    else:
        since = "" if p.since is None else f" since {_local(p.since, zone)}"
        print(f"Roll back what {p.writer!r} changed in episodes and facts{since}:")
    for change in p.changes:
        print(_change_line(change))
    if not p.changes:
        print("  nothing to roll back")
    if p.skipped:
        print("Left as they are:")
        for s in p.skipped:
            when = f" at {_local(s.at, zone)}" if s.at is not None else ""
            print(f"  {s.ref:<14} {s.reason:<10} {s.detail}{when}")


def _confirm(question: str) -> bool:
    from actors.cli.common import _confirm as confirm  # the one the other commands ask with

    return confirm(question)


def cmd_doctor_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.store.rollback import PlanOutdated, apply, plan

    if args.to is not None and (args.writer is not None or args.since is not None):
        raise ValueError("give either --to T, or --writer W --since T")
    if args.to is None and (args.writer is None or args.since is None):
        raise ValueError("give --to T (undo everything after T), or --writer W --since T "
                         "(undo what W changed since T)")
    zone = _zone(settings)
    now = time.time()
    to = None if args.to is None else parse_time(args.to, now, zone)
    since = None if args.since is None else parse_time(args.since, now, zone)
    with open_store(settings) as store:
        planned = plan(store, to=to, writer=args.writer, since=since)
        print_plan(planned, zone)
        if planned.empty:
            return EXIT_OK
        n = len(planned.changes)
        print(f"{n} change{'s' if n != 1 else ''}, logged as writer 'rollback'.")
        sys.stdout.flush()
        if not args.yes and not _confirm("Apply?"):
            print("nothing changed")
            return EXIT_DECLINED
        try:
            applied = apply(store, planned)
        except PlanOutdated as exc:
            print(f"reverie: {exc}", file=sys.stderr)
            return EXIT_RUNTIME_ERROR
    print(f"rolled back {applied.changes} change{'s' if applied.changes != 1 else ''}; "
          f"to undo: reverie doctor rollback --writer rollback --since "
          f"'{_local(int(applied.at), zone)}'")
    _resync(settings, applied)
    return EXIT_OK


def _resync(settings: Settings, applied: Applied) -> None:
    """Ask a running runtime's Recall to index the rows again (their vectors
    were dropped); with none running, the next start does."""
    from actors.discovery import NoRuntime, read_runtime

    if not applied.refs:
        return
    try:
        read_runtime(settings)
    except NoRuntime:
        return
    try:
        from actors.discovery import connect

        connect(settings)
        from actors.handles import RecallClient
        from actors.messages import MAX_BATCH, SyncIndex

        recall = RecallClient(settings.runtime.namespace, RESYNC_TIMEOUT_S)
        refs = list(applied.refs)
        for start in range(0, len(refs), MAX_BATCH):
            recall.sync(SyncIndex(refs=refs[start:start + MAX_BATCH]))
    except Exception as exc:  # applied already: say so, and how to finish
        log.debug("resync failed", exc_info=True)
        print(f"reverie: rolled back, but the running runtime's index was not refreshed "
              f"({type(exc).__name__}); run `reverie reindex`", file=sys.stderr)


# -- doctor check-facts -------------------------------------------------------------

def cmd_doctor_check_facts(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.mind.support import unsupported_facts

    with open_store(settings) as store:
        found = unsupported_facts(store)
    if args.json:
        for u in found:
            print(json.dumps({"ref": f"fact:{u.fact_id}", "subject": u.subject, "key": u.key,
                              "missing": list(u.missing)}, ensure_ascii=False))
        return EXIT_OK
    if not found:
        print("every fact that cites turns is supported by them")
        return EXIT_OK
    for u in found:
        missing = ", ".join(u.missing)
        ref = f"fact:{u.fact_id}"
        print(f"{ref:<14} {_excerpt(u.subject, 24)} {u.key}: not in the turns it cites: "
              f"{missing}")
    print(f"{len(found)} fact{'s' if len(found) != 1 else ''} not supported word for word "
          "by the turns they cite")
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------

def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``doctor log|rollback|check-facts`` on the ``reverie`` sub-parsers."""
    doctor = sub.add_parser("doctor", help="the write log, rollback, fact checks")
    commands = doctor.add_subparsers(dest="doctor_command", required=True)

    show = commands.add_parser("log", help="print the write log (the newest entries)")
    show.add_argument("--writer", help="only this writer (a job, cli, rollback...)")
    show.add_argument("--since", metavar="T", help="from this time on")
    show.add_argument("--until", metavar="T", help="up to this time")
    show.add_argument("--table", action="append",
                      choices=("transcript", "episodes", "facts", "episode_citations",
                               "compactions", "tool_calls"),
                      help="only this table (repeatable)")
    show.add_argument("--limit", type=int, default=200, help="at most this many (newest)")
    show.add_argument("--json", action="store_true", help="one JSON object per entry")
    show.set_defaults(func=cmd_doctor_log)

    back = commands.add_parser(
        "rollback", help="put episodes and facts back as they were (shows, then asks)")
    back.add_argument("--to", metavar="T", help="undo every change after T")
    back.add_argument("--writer", help="undo what this writer changed (with --since)")
    back.add_argument("--since", metavar="T", help="with --writer: from this time on")
    back.add_argument("--yes", action="store_true", help="do not ask")
    back.set_defaults(func=cmd_doctor_rollback)

    check = commands.add_parser(
        "check-facts", help="facts whose names, places or dates are not in the turns "
        "they cite")
    check.add_argument("--json", action="store_true", help="one JSON object per fact")
    check.set_defaults(func=cmd_doctor_check_facts)
    return doctor
