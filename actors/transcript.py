"""The Transcript actor: the only writer of transcript, tool-call and compaction rows."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from actors.common import (
    Notifier,
    accept,
    bad_request,
    load_profiles,
    open_store,
    setup_logging,
)
from actors.handles import RecallClient, change_memory, edit_memory
from actors.households import serving
from actors.messages import (
    Ack,
    AppendTurns,
    ChangeMemory,
    Compact,
    Compacted,
    EditMemory,
    ExpireWriteLog,
    FixesStored,
    LocationInfo,
    LocationRequest,
    PruneTranscript,
    RecentTurns,
    RecordFixes,
    TranscriptPruned,
    TurnList,
    TurnRow,
    TurnsAppended,
    WriteLogExpired,
)
from device.records import LocationRecord
from runtime.config import Settings
from runtime.memories import location
from runtime.memories.retention import TRANSCRIPT_HISTORY, expire_write_log
from runtime.memories.transcript import TranscriptService

log = logging.getLogger(__name__)


class HouseholdTranscript:
    """The Transcript actor's work for one household (``actors/households.py``)."""

    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, "transcript")
        self.store = open_store(settings)
        # The hub's own GPS fixes locate every speaker's turns (runtime.memories.location).
        self.hub_person = settings.gps.person if settings.gps.enabled else None
        self.profiles = load_profiles(settings)
        self.transcript = TranscriptService(self.store, self.profiles, self.hub_person)
        self.recall = RecallClient(settings.runtime.namespace,
                                   household=settings.household.id)
        self.notify_recall = Notifier(self.recall.sync_some_async, "recall.sync_some")

    def append(self, msg: AppendTurns) -> TurnsAppended:
        """Commit the turns and their citations (all or nothing, one write
        transaction), then tell Recall there is news. Whether a turn becomes
        memory is its source profile's decision, taken by the service."""
        msg = accept(AppendTurns, msg)
        cites = msg.citations or [[] for _ in msg.turns]
        calls = msg.tool_calls or [[] for _ in msg.turns]
        try:
            with self.store.write_transaction():
                ids = []
                for turn, refs, made in zip(msg.turns, cites, calls, strict=True):
                    turn_id = self.transcript.append(turn, msg.writer)
                    if refs:
                        self.transcript.set_citations(turn_id, refs, msg.writer)
                    if made:
                        self.transcript.add_tool_calls(turn_id, made, msg.writer)
                    ids.append(turn_id)
        except (ValidationError, ValueError) as exc:
            raise bad_request(exc) from None
        if msg.index_now:
            self.notify_recall()
        return TurnsAppended(ids=ids)

    def record_fixes(self, msg: RecordFixes) -> FixesStored:
        """Store location fixes (the edge) and back-fill user turns, in one transaction."""
        msg = accept(RecordFixes, msg)
        try:
            fixes = [LocationRecord(**fix.model_dump()) for fix in msg.fixes]
        except ValueError as exc:
            raise bad_request(exc) from None
        done = location.store_fixes(self.store, fixes, self.profiles, self.hub_person)
        return FixesStored(stored=done.fixes, backfilled=done.backfilled)

    def location(self, msg: LocationRequest | None = None) -> LocationInfo:
        fixes, last = location.summary(self.store)
        return LocationInfo(fixes=fixes, last_fix_at=last)

    def recent(self, msg: RecentTurns) -> TurnList:
        msg = accept(RecentTurns, msg)
        return TurnList(turns=[TurnRow(**{**r, "disabled": bool(r["disabled"]),
                                          "sensitive": bool(r["sensitive"])})
                               for r in self.transcript.recent(msg.channel, msg.limit)])

    def change(self, msg: ChangeMemory) -> Ack:
        """Disable, enable or forget one turn; then bring the index in step."""
        return change_memory(self.recall, self.transcript, accept(ChangeMemory, msg), "turn")

    def edit(self, msg: EditMemory) -> Ack:
        """Refused: the transcript is append-only (disable or delete the turn
        instead). A turn that does not exist is a NoSuchMemory."""
        return edit_memory(self.recall, self.transcript, accept(EditMemory, msg), "turn")

    def compact(self, msg: Compact) -> Compacted:
        """Record a continuity summary of a channel up to a watermark (written by
        the consolidation job); a watermark behind the current one is refused, and
        so is one whose refs name an episode forgotten meanwhile (CitesForgotten)."""
        msg = accept(Compact, msg)
        try:
            compaction_id = self.transcript.compact(msg.channel, msg.summary, msg.watermark,
                                                    msg.writer, msg.refs)
        except ValueError as exc:
            raise bad_request(exc) from None
        return Compacted(compaction_id=compaction_id)

    def prune(self, msg: PruneTranscript) -> TranscriptPruned:
        """Delete a channel's rows at or below its compaction watermark that no
        live episode cites (the decay job); their tool calls go by cascade."""
        msg = accept(PruneTranscript, msg)
        return TranscriptPruned(pruned=self.transcript.prune(msg.channel, msg.writer))

    def expire_write_log(self, msg: ExpireWriteLog) -> WriteLogExpired:
        """Drop the write-log history of pruned transcript rows past retention."""
        msg = accept(ExpireWriteLog, msg)
        return WriteLogExpired(dropped=expire_write_log(self.store, msg.now, TRANSCRIPT_HISTORY))

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    def flush(self) -> Ack:
        self.notify_recall.flush()
        return Ack()

    def close(self) -> None:
        self.notify_recall.close()
        self.store.close()

    def ping(self) -> str:
        return "ok"


# The actor: the households it serves, each a HouseholdTranscript (actors/households.py).
TranscriptActor = serving(HouseholdTranscript, "TranscriptActor", replicates=True)
