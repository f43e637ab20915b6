"""The Transcript actor: the only writer of transcript, tool-call and compaction rows."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from actors.common import RECALL, Notifier, bad_request, load_profiles, open_store, setup_logging
from actors.messages import (
    Ack,
    AppendTurns,
    RecentTurns,
    SetCitations,
    TurnList,
    TurnRow,
    TurnsAppended,
)
from runtime.config import Settings
from runtime.transcript import TranscriptService

log = logging.getLogger(__name__)


class TranscriptActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "transcript")
        self.store = open_store(settings)
        self.profiles = load_profiles(settings)
        self.transcript = TranscriptService(self.store)
        self.notify_recall = Notifier(settings.runtime.namespace, RECALL, "sync_some")

    def append(self, msg: AppendTurns) -> TurnsAppended:
        """Commit the turns (all or nothing), then tell Recall there is news."""
        try:
            with self.store.transaction():
                ids = [self.transcript.append(
                    t, msg.writer, memory=self.profiles.for_source(t.source).remembered)
                    for t in msg.turns]
        except (ValidationError, ValueError) as exc:
            raise bad_request(exc) from None
        self.notify_recall()
        return TurnsAppended(ids=ids)

    def recent(self, msg: RecentTurns) -> TurnList:
        rows = self.store.rows(
            "SELECT id, channel, source, role, speaker, content, created_at FROM transcript"
            " WHERE channel = ? ORDER BY id DESC LIMIT ?", (msg.channel, msg.limit))
        return TurnList(turns=[TurnRow(**r) for r in reversed(rows)])

    def set_citations(self, msg: SetCitations) -> Ack:
        self.transcript.set_citations(msg.turn_id, msg.refs)
        return Ack()

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def flush(self) -> Ack:
        self.notify_recall.flush()
        return Ack()

    def ping(self) -> str:
        return "ok"
