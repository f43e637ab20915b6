"""Every message type survives a JSON round trip and a pickle round trip unchanged.

The types are enumerated from ``actors.messages`` itself, so a new message
cannot slip past without a sample here."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest
from pydantic import ValidationError

from actors import messages as m
from runtime.memories.digests import DigestBatch, DigestIn
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.mood import MoodIn
from runtime.memories.portrait import PortraitIn, PortraitLine
from runtime.memories.threads import ThreadChange
from runtime.memories.transcript import Location, TurnIn
from runtime.memories.user_profile import ProfileOp

ITEM = m.MemoryItem(ref="turn:3", kind="turn", item_id=3, text="[2024-01-01] user: hi",
                    score=0.9, relevance=0.8, channel="chat", created_at=1.5, turns=[3],
                    tokens=6)
MATCH = m.MemoryMatch(ref="fact:4", text="user locker: code 4471", created_at=2.5,
                      disabled=True)
IDLE = m.IdleInfo(idle=False, idle_since=1.0, eligible_at=1801.0, reason="active",
                  last_activity=1.0, presence={"ana": "home"}, now=5.0)
FIX = m.Fix(person="ana", lat=38.7, lon=-9.1, at=5.0, source="owntracks", accuracy_m=8.0,
            device="phone", place="Home", event="enter")
PERSON = m.PersonPresence(state="home", place="kitchen", source="espresense", since=4.0,
                          reported_at=6.0)

VIEW = m.MemoryView(ref="episode:3", kind="episode", item_id=3, text="a walk", created_at=4.0,
                    disabled=False, pinned=True, level="seared", channel="chat",
                    source="user", details={"salience": 6, "emotion": "calm"})

SAMPLES: list[m.Message] = [
    m.Ack(detail="done"),
    m.Request(household="smith-2"),
    m.AppendTurns(turns=[TurnIn(channel="chat", source="user", content="hi",
                                location=Location(lat=1.0, lon=2.0), request_id="r1")]),
    m.AppendTurns(turns=[TurnIn(channel="chat", source="assistant", role="assistant",
                                content="hello")], citations=[["fact:1", "turn:2"]]),
    m.TurnsAppended(ids=[1, 2]),
    m.RecentTurns(channel="chat", limit=3),
    m.TurnRow(id=1, channel="chat", source="user", role="user", speaker=None, content="hi",
              created_at=2.0, disabled=True),
    m.TurnList(turns=[m.TurnRow(id=1, channel="c", source="user", role="user", speaker="Ana",
                                content="x", created_at=1.0)]),
    m.Embed(texts=["a", "b"]),
    m.Embedded.of("model/x", np.eye(2, 4, dtype=np.float32)),
    m.Recall(query="where?", max_items=5, max_tokens=100, now=3.0, exclude=["turn:1"]),
    m.Recall(query="the garage code?", person="Ana"),
    m.MemoryItem(ref="fact:9", kind="fact", item_id=9, text="The garage code is 4471.",
                 score=0.9, relevance=0.8, channel=None, created_at=1.5, turns=[], tokens=6,
                 sensitive=True, person="Ana"),
    ITEM,
    m.Recalled(query="where?", items=[ITEM], degraded=True, reason="index down",
               elapsed_ms=1.2),
    m.SyncIndex(limit=10, refs=["episode:2"]),
    m.IndexSynced(added=3, counts={"turn": 3}),
    m.DropFromIndex(kind="episode", item_id=9),
    m.FindMemories(text="locker code", limit=5),
    MATCH,
    m.MemoryMatches(items=[MATCH]),
    m.NearestMemory(kind="fact", text="user: the spare key is under the pot", subject="user"),
    m.NearestFound(item_id=3, similarity=0.95),
    m.AddEpisode(episode=EpisodeIn(channel="c", source="user", gist="g", cites=[1, 2])),
    m.EpisodeWritten(episode_id=7),
    m.AddFact(fact=FactIn(kind="place", subject="Ana", key="lives_in", value="Porto")),
    m.FactWritten(fact_id=2, action="supersede"),
    m.FactWritten(fact_id=2, action="keep", existing_id=2, claim_id=5),
    m.AddPortrait(portrait=PortraitIn(lines=[PortraitLine(
        section="people", text="Ana: Caroline's sister", refs=["fact:2", "episode:1"])],
        signature="abc", how="offline")),
    m.PortraitWritten(portrait_id=3),
    m.WriteDigests(batch=DigestBatch(digests=[DigestIn(
        period="week", key="2026-W27", starts_at=1.0, ends_at=2.0, text="A quiet week.",
        refs=["episode:1"], how="llm")], prune=[4])),
    m.DigestsWritten(digest_ids=[5]),
    m.UpdateProfile(ops=[ProfileOp(field="goals", op="done", value="earn the CKA")]),
    m.ProfileUpdated(changes=["goals: 1 done (now milestones)"]),
    m.UpdateThread(change=ThreadChange(episode_id=4, change="resolve", at=9.0, resolved_by=7)),
    m.AddMood(mood=MoodIn(valence=-0.4, energy=0.3, warmth=0.6, why="2 new turns",
                          through_turn=12)),
    m.MoodWritten(mood_id=2),
    m.ChangeMemory(ref="turn:12", change="disable"),
    m.ChangeMemory(ref="episode:3", change="pin"),
    m.ChangeMemory(ref="turn:5", change="sensitive"),
    m.ChangeMemory(ref="fact:5", change="not_sensitive"),
    m.EditMemory(ref="fact:7", text="Ana lives in Lisbon now", writer="http"),
    m.BrowseMemories(kinds=["turn", "fact"], text="boiler", since=1.0, until=2.0,
                     include_disabled=False, oldest_first=True, limit=10, offset=20),
    VIEW,
    m.MemoryPage(items=[VIEW], total=31),
    m.ViewMemory(ref="turn:4"),
    m.TurnDelta(text="Hel"),
    m.UserTurn(channel="chat", text="hello", temporary=True, request_id="abc"),
    m.UserTurn(channel="voice", text="hello", speaker="ana", model="tiny"),
    m.TurnReply(turn_id=1, reply_id=2, text="hi", citations=["turn:1"], provider="offline"),
    # the memory layer: a client's conversation, and the calls of its tools
    m.UserTurn(channel="voice", text="turn on the light", request_id="layer-1",
               conversation=m.Conversation(
                   system="You are a voice assistant.",
                   history=[m.ClientMessage(role="user", content="hi")],
                   continuation=[
                       m.ClientMessage(role="assistant", content="", tool_calls=[
                           m.ClientToolCall(id="call_0", name="HassTurnOn",
                                            arguments='{"name": "light"}')]),
                       m.ClientMessage(role="tool", content="done", tool_call_id="call_0")],
                   tools=[m.ClientTool(name="HassTurnOn", description="Turns on",
                                       parameters={"type": "object"})],
                   options={"temperature": 0.2})),
    m.TurnReply(turn_id=1, reply_id=None, text="", citations=[], provider="local",
                tool_calls=[m.ClientToolCall(id="call_0", name="HassTurnOn", arguments="{}")]),
    m.ClientMessage(role="user", content="hi"),
    m.ClientToolCall(id="call_1", name="HassLightSet"),
    m.ClientTool(name="HassLightSet"),
    m.Conversation(),
    m.StatusRequest(),
    m.Status(namespace="reverie", actors={"turns": "ok"}, counts={"transcript": 1}),
    m.TouchEpisodes(ids=[3, 4], at=9.5),
    # the Cron actor and the jobs
    m.Compact(channel="chat", summary="they talked", watermark=12, writer="consolidate"),
    m.Compacted(compaction_id=3),
    # the janitor's deletes (the decay job)
    m.PurgeTombstones(now=7.0, writer="janitor"),
    m.TombstonesPurged(purged=2),
    m.PruneTranscript(channel="chat"),
    m.TranscriptPruned(pruned=4),
    m.ExpireWriteLog(now=7.0),
    m.ExpireWriteLog(),
    m.WriteLogExpired(dropped=9),
    m.Activity(at=5.0),
    m.Activity(),
    m.Presence(person="ana", state="away", at=6.0),
    m.Tick(now=7.0, wait=True),
    m.JobRun(name="facts", run_id=4, outcome="failed", items=0, error="ValueError: x"),
    m.Ticked(reminders=[1], started=["facts"], runs=[m.JobRun(name="facts")]),
    m.JobsStatus(now=8.0),
    m.JobsReport(jobs=[m.JobLine(name="decay", last_outcome=None, last_run_at=None,
                                 next_eligible_at=1801.0)], idle=IDLE),
    m.JobsReport(jobs=[m.JobLine(name="sync", last_outcome="ok", last_run_at=3.0,
                                 next_eligible_at=1803.0)], idle=IDLE,
                 details={"sync": "cal (ical): 2 written, skipped bad-event 1"}),
    m.JobRun(name="sync", run_id=5, outcome="ok", items=2, detail="cal (ical): 2 written"),
    m.RunJob(name="decay", wait=True),
    m.Remind(text="bins", when="tomorrow 8:00", channel="chat"),
    m.Reminded(id=1, due_at=9.0, due_local="2026-11-30T08:00+00:00", channel="chat"),
    m.Remind(text="what is on the calendar today?", when="tuesday 8:00", channel="voice",
             kind="ask", every="weekday", now=3.0),
    m.Reminded(id=2, due_at=9.0, due_local="2026-12-01T08:00+00:00", channel="voice",
               kind="ask", repeat="weekday"),
    m.Ticked(reminders=[1, 2], started=[], prompts=[2]),
    m.ListReminders(),
    m.ReminderList(reminders=[m.ReminderLine(
        id=2, text="bins", channel="chat", kind="say", repeat="week", due_at=9.0,
        due_local="2026-12-01T19:00+00:00", fired=3, last_outcome="said",
        error="NoActor: no transcript actor")]),
    m.CancelReminder(id=2),
    m.HubJobState(),
    m.JobStateRows(write_log_id=12, rows=[m.JobStateRow(job="facts", key="turns",
                                                          value='{"after": 3}')]),
    m.SaveJobState(job="facts", key="turns", value='{"after": 4}', at=5.0),
    m.SaveLLMQueue(files=[m.QueueFile(name="000000000001.json", data="{}"),
                          m.QueueFile(name="counters.json", data="{}")]),
    # the edge
    m.Presence(person="ana", state="home", at=6.0, place="kitchen", source="espresense",
               activity=True),
    m.RecordFixes(fixes=[FIX]),
    m.FixesStored(stored=1, backfilled=2),
    m.LocationRequest(),
    m.LocationInfo(fixes=3, last_fix_at=10.0),
    m.PresenceRequest(),
    m.PresenceReport(people={"ana": PERSON}),
    m.EdgeRequest(),
    m.EdgeInfo(configured=True, connected=True, accepted=3, rejected={"too-large": 1},
               broker="127.0.0.1:1883"),
    m.PublishFix(fix=FIX),
    m.Status(namespace="reverie", actors={"edge": "ok"}, counts={"facts": 1},
             mqtt=m.EdgeInfo(configured=False, connected=False),
             location=m.LocationInfo(fixes=0, last_fix_at=None), presence={"ana": PERSON}),
]


def message_types() -> set[type[m.Message]]:
    """Every concrete message class defined in ``actors.messages``."""
    return {cls for _, cls in inspect.getmembers(m, inspect.isclass)
            if issubclass(cls, m.Message) and cls is not m.Message
            and cls.__module__ == m.__name__}


def test_every_message_type_has_a_sample() -> None:
    types = message_types()
    assert len(types) >= 20  # the enumeration itself works
    missing = sorted(t.__name__ for t in types - {type(s) for s in SAMPLES})
    assert not missing, f"message types without a round-trip sample: {missing}"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(sample: m.Message) -> None:
    cls = type(sample)
    assert cls.model_validate_json(sample.model_dump_json()) == sample
    assert pickle.loads(pickle.dumps(sample)) == sample
    assert sample.v == m.VERSION


def test_unknown_fields_and_versions_are_refused() -> None:
    with pytest.raises(ValueError):
        m.UserTurn.model_validate({"channel": "c", "text": "x", "colour": "red"})
    with pytest.raises(ValueError):
        m.UserTurn.model_validate({"v": 2, "channel": "c", "text": "x"})


@pytest.mark.parametrize("ref", ["turn:", "fact:x", "room:3", "turn:1;drop", " turn:1"])
def test_change_memory_takes_only_memory_refs(ref: str) -> None:
    with pytest.raises(ValidationError, match="ref"):
        m.ChangeMemory(ref=ref, change="delete")


def test_citations_come_one_list_per_turn() -> None:
    turn = TurnIn(channel="chat", source="assistant", role="assistant", content="x")
    with pytest.raises(ValidationError, match="2 lists for 1 turns"):
        m.AppendTurns(turns=[turn], citations=[["turn:1"], ["turn:2"]])
    with pytest.raises(ValidationError, match="citations"):
        m.AppendTurns(turns=[turn], citations=[["not a ref"]])


def test_embedded_vectors_survive() -> None:
    vecs = np.random.default_rng(1).random((3, 8), dtype=np.float32)
    assert np.array_equal(m.Embedded.of("x", vecs).array(), vecs)


def test_fact_written_carries_the_whole_resolution_and_old_senders_still_validate() -> None:
    keep = m.FactWritten(fact_id=2, action="keep", existing_id=2, claim_id=5)
    back = m.FactWritten.model_validate_json(keep.model_dump_json())
    assert (back.existing_id, back.claim_id) == (2, 5)
    old = m.FactWritten.model_validate({"v": 1, "fact_id": 3, "action": "insert"})
    assert old.existing_id is None and old.claim_id is None
