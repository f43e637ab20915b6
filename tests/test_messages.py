"""Every message type survives a JSON round trip and a pickle round trip unchanged."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from actors import messages as m
from runtime.episodes import EpisodeIn
from runtime.facts import FactIn
from runtime.transcript import TurnIn

ITEM = m.MemoryItem(ref="turn:3", kind="turn", item_id=3, text="[2024-01-01] user: hi",
                    score=0.9, relevance=0.8, channel="chat", created_at=1.5, turns=[3],
                    tokens=6)
SAMPLES: list[m.Message] = [
    m.Ack(detail="done"),
    m.AppendTurns(turns=[TurnIn(channel="chat", source="user", content="hi",
                                location={"lat": 1.0, "lon": 2.0}, request_id="r1")]),
    m.TurnsAppended(ids=[1, 2]),
    m.RecentTurns(channel="chat", limit=3),
    m.TurnRow(id=1, channel="chat", source="user", role="user", speaker=None, content="hi",
              created_at=2.0),
    m.TurnList(turns=[m.TurnRow(id=1, channel="c", source="user", role="user", speaker="Ana",
                                content="x", created_at=1.0)]),
    m.SetCitations(turn_id=4, refs=["fact:1", "turn:2"]),
    m.Embed(texts=["a", "b"]),
    m.Embedded.of("model/x", np.eye(2, 4, dtype=np.float32)),
    m.Recall(query="where?", max_items=5, max_tokens=100, now=3.0, exclude=["turn:1"]),
    ITEM,
    m.Recalled(query="where?", items=[ITEM], degraded=True, reason="index down",
               elapsed_ms=1.2),
    m.SyncIndex(limit=10),
    m.IndexSynced(added=3, counts={"turn": 3}),
    m.DropFromIndex(kind="episode", item_id=9),
    m.AddEpisode(episode=EpisodeIn(channel="c", source="user", gist="g", cites=[1, 2])),
    m.EpisodeWritten(episode_id=7),
    m.AddFact(fact=FactIn(kind="place", subject="Ana", key="lives_in", value="Porto")),
    m.FactWritten(fact_id=2, action="supersede"),
    m.ChangeFact(fact_id=2, change="disable"),
    m.UserTurn(channel="chat", text="hello", temporary=True, request_id="abc"),
    m.TurnReply(turn_id=1, reply_id=2, text="hi", citations=["turn:1"], provider="offline"),
    m.StatusRequest(),
    m.Status(namespace="reverie", actors={"turns": "ok"}, counts={"transcript": 1}),
]


def test_every_message_type_has_a_sample() -> None:
    sampled = {type(s) for s in SAMPLES}
    assert set(m.REQUESTS) | set(m.REPLIES) <= sampled


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


def test_embedded_vectors_survive() -> None:
    vecs = np.random.default_rng(1).random((3, 8), dtype=np.float32)
    assert np.array_equal(m.Embedded.of("x", vecs).array(), vecs)
