"""What the ``reverie`` commands share: the exit codes, the handle on the
running runtime (:class:`Remote`), the yes/no question and local times.

Exit codes: 0 done; 1 no runtime answering (or one already running);
2 bad input or configuration; 3 the runtime failed (an actor died, a call
timed out). ``reverie doctor`` also exits 1 when the user declines.
"""

from __future__ import annotations

from typing import Any

from actors.discovery import connect
from runtime.config import Settings

EXIT_OK = 0
EXIT_NO_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME_ERROR = 3

CALL_TIMEOUT_S = 120.0


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


def _confirm(question: str) -> bool:
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _local(stamp: float | None, settings: Settings, none: str = "-") -> str:
    from datetime import datetime

    from runtime.time.clock import household_zone

    if stamp is None:
        return none
    return datetime.fromtimestamp(stamp, tz=household_zone(settings.household.timezone)
                                  ).strftime("%Y-%m-%d %H:%M")
