"""``reverie jobs``, ``reverie presence`` and ``reverie remind``: the
subconscious, through the Cron actor: the background jobs (and firing one),
someone coming home or leaving, reminders and scheduled prompts.
"""

from __future__ import annotations

import argparse
import json
import sys

from actors.cli.common import CALL_TIMEOUT_S, EXIT_OK, EXIT_RUNTIME_ERROR, Remote, _local
from runtime.config import Settings


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
