"""Forget, disable and enable through the actors, on a running runtime (no
reopen): ``ChangeMemory`` to the owner of each kind, ``FindMemories`` from Recall.

Each case checks what a user would check: recall right after the change, and
for a forget, that the words are gone from every place the store kept them
(rows, write log, full-text index, vectors)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from actors import supervisor
from actors.common import OWNERS, BadRequest, CitesForgotten
from actors.handles import (
    EpisodesClient,
    GraphClient,
    RecallClient,
    TranscriptClient,
    TurnsClient,
    owner,
)
from actors.messages import (
    AddEpisode,
    AddFact,
    ChangeMemory,
    Compact,
    FindMemories,
    Recall,
    UserTurn,
    WriteDigests,
)
from runtime.config import CONFIG_DIR, Settings, load_settings
from runtime.memories.cited import StaleCitation
from runtime.memories.digests import DigestBatch, DigestIn
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds

NS = "test-forget"

turns = TurnsClient(NS)
transcript = TranscriptClient(NS)
recall = RecallClient(NS)
episodes = EpisodesClient(NS)
graph = GraphClient(NS)


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    data = tmp_path_factory.mktemp("forget-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS}, "persona": {"global_dir": str(data / "persona")},
    })
    sup = supervisor.start(settings)
    yield settings
    sup.stop()


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def recalled(query: str) -> list[str]:
    return recall.recall(Recall(query=query)).refs


def change(ref: str, what: Literal["disable", "enable", "delete"]) -> str:
    ack = owner(ref, NS).change(ChangeMemory(ref=ref, change=what, writer="test"))
    return str(ack.detail)


def remember(value: str, key: str) -> str:
    written = graph.add(AddFact(fact=FactIn(kind="user_specific", subject="user", key=key,
                                            value=value, user_managed=True, confidence=1.0)))
    recall.sync()
    return f"fact:{written.fact_id}"


def say(text: str) -> int:
    reply = turns.process(UserTurn(channel="chat", text=text))
    transcript.flush()  # indexing caught up
    assert reply.turn_id is not None
    return reply.turn_id


def traces(settings: Settings, word: str) -> dict[str, int]:
    """Where ``word`` is still stored: rows, write log, full-text indexes."""
    like = f"%{word}%"
    store = read_store(settings)
    try:
        return {
            "transcript": store.scalar(
                "SELECT count(*) FROM transcript WHERE content LIKE ?", (like,)),
            "episodes": store.scalar("SELECT count(*) FROM episodes WHERE gist LIKE ?", (like,)),
            "facts": store.scalar("SELECT count(*) FROM facts WHERE value LIKE ?", (like,)),
            "write_log": store.scalar(
                "SELECT count(*) FROM write_log WHERE before LIKE ? OR after LIKE ?",
                (like, like)),
            "transcript_fts": store.scalar(
                "SELECT count(*) FROM transcript_fts WHERE transcript_fts MATCH ?", (word,)),
            "episodes_fts": store.scalar(
                "SELECT count(*) FROM episodes_fts WHERE episodes_fts MATCH ?", (word,)),
            "facts_fts": store.scalar(
                "SELECT count(*) FROM facts_fts WHERE facts_fts MATCH ?", (word,)),
        }
    finally:
        store.close()


def vector_count(settings: Settings, ref: str) -> int:
    kind, _, item_id = ref.partition(":")
    store = read_store(settings)
    try:
        return int(store.scalar("SELECT count(*) FROM vectors WHERE kind = ? AND item_id = ?",
                                (kind, int(item_id))))
    finally:
        store.close()


def test_owners_cover_every_kind() -> None:
    assert OWNERS == {"turn": "transcript", "episode": "episodes", "fact": "graph"}
    assert {type(owner(f"{k}:1", NS)).name for k in OWNERS} == set(OWNERS.values())


def test_remember_forget_remember_recalls_the_new_fact(runtime: Settings) -> None:
    first = remember("the spare bicycle key hangs behind the boiler", "spare-key")
    assert first in recalled("where is the spare bicycle key?")
    assert change(first, "delete") == f"fact {first.partition(':')[2]} deleted"
    assert first not in recalled("where is the spare bicycle key?")
    second = remember("grandmother's birthday is on the ninth of March", "birthday")
    assert second != first  # ids are never handed out again
    assert second in recalled("when is grandmother's birthday?")  # indexed, no restart
    assert not any(traces(runtime, "boiler").values())


def test_disabled_turn_leaves_recall_and_comes_back_on_enable(runtime: Settings) -> None:
    turn = f"turn:{say('The plumber Marek comes on Thursday to fix the leaking radiator.')}"
    query = "when is the plumber coming for the radiator?"
    assert turn in recalled(query)
    assert change(turn, "disable").endswith("disabled")
    assert turn not in recalled(query)
    assert vector_count(runtime, turn) == 0
    assert change(turn, "enable").endswith("enabled")
    assert turn in recalled(query)  # indexed again right away
    assert vector_count(runtime, turn) == 1


def test_forgotten_turn_is_gone_everywhere(runtime: Settings) -> None:
    word = "Quetzalcoatl" + uuid.uuid4().hex[:6]
    turn = f"turn:{say(f'The wifi password is {word} for the guest network.')}"
    assert turn in recalled(f"what is the guest wifi password {word}?")
    assert traces(runtime, word)["transcript_fts"] == 1
    assert change(turn, "delete").endswith("deleted")
    assert turn not in recalled(f"what is the guest wifi password {word}?")
    # the assistant's reply may have quoted the word: forget that turn as well
    for match in recall.find(FindMemories(text=word)).items:
        change(match.ref, "delete")
    left = traces(runtime, word)
    assert left == dict.fromkeys(left, 0)
    assert vector_count(runtime, turn) == 0
    store = read_store(runtime)
    try:  # the write log keeps that it was deleted, when and by whom
        deleted = store.row("SELECT writer, op FROM write_log WHERE table_name = 'transcript'"
                            " AND row_id = ? AND op = 'delete'", (int(turn[5:]),))
    finally:
        store.close()
    assert deleted == {"writer": "test", "op": "delete"}


def test_episode_disable_enable_forget(runtime: Settings) -> None:
    written = episodes.add(AddEpisode(episode=EpisodeIn(
        channel="chat", source="user",
        gist="We planned the Lisbon trip: flights on the twelfth, hotel near Alfama.")))
    transcript.flush()
    recall.sync()
    ref = f"episode:{written.episode_id}"
    query = "when are the Lisbon flights?"
    assert ref in recalled(query)
    change(ref, "disable")
    assert ref not in recalled(query)
    found = {m.ref: m for m in recall.find(FindMemories(text="Lisbon Alfama")).items}
    assert found[ref].disabled
    change(ref, "enable")
    assert ref in recalled(query)
    change(ref, "delete")
    assert ref not in recalled(query)
    assert not any(traces(runtime, "Alfama").values())


def test_find_memories_lists_matches_of_every_kind(runtime: Settings) -> None:
    word = "zucchini" + uuid.uuid4().hex[:6]
    fact = remember(f"the {word} seeds are in the garage", f"seeds-{word}")
    turn = f"turn:{say(f'Remember that the {word} bed needs water daily.')}"
    found = recall.find(FindMemories(text=word, limit=10))
    refs = [m.ref for m in found.items]
    assert fact in refs and turn in refs
    assert all(word in m.text for m in found.items)
    assert recall.find(FindMemories(text=word, limit=1)).items[0].ref in refs


@pytest.mark.parametrize(("client", "ref", "expected"), [
    (graph, "fact:999999", "no fact 999999"),
    (transcript, "turn:999999", "no turn 999999"),
    (episodes, "episode:999999", "no episode 999999"),
    (graph, "turn:1", "turn:1 is not a fact"),
    (transcript, "fact:1", "fact:1 is not a turn"),
])
def test_unknown_or_misrouted_refs_are_bad_requests(runtime: Settings, client: GraphClient,
                                                    ref: str, expected: str) -> None:
    with pytest.raises(BadRequest, match=expected):
        client.change(ChangeMemory(ref=ref, change="disable"))


def test_the_owners_refuse_a_write_citing_a_turn_forgotten_since_the_read(
        runtime: Settings) -> None:
    """A job read a turn, the user forgot it, then the job writes an episode and
    a fact made from it: both owners refuse, naming the ref
    (``CitesForgotten``: a BadRequest the job takes as a StaleCitation), and
    nothing of either is stored (runtime.memories.cited; per kind in process:
    tests/test_forget_race.py)."""
    word = "Xochimilco" + uuid.uuid4().hex[:6]
    turn = f"turn:{say(f'My bank PIN hint is {word}, keep it quiet.')}"
    change(turn, "delete")
    for match in recall.find(FindMemories(text=word)).items:  # a reply quoting it
        change(match.ref, "delete")
    turn_id = int(turn[5:])
    with pytest.raises(CitesForgotten, match=f"episode refused: it cites {turn}") as caught:
        episodes.add(AddEpisode(episode=EpisodeIn(
            channel="chat", source="user", gist=f"The PIN hint is {word}.", cites=[turn_id])))
    assert isinstance(caught.value, StaleCitation) and caught.value.refs == (turn,)
    with pytest.raises(CitesForgotten, match=f"fact refused: it cites {turn}"):
        graph.add(AddFact(fact=FactIn(kind="user_specific", subject="user", key="pin-hint",
                                      value=f"PIN hint {word}", provenance=[turn])))
    # the rows that name what they quote (issue 24): the reflection's episode its
    # findings, a compaction summary its gists' episodes, a model's digest its turns
    finding = graph.add(AddFact(fact=FactIn(kind="user_specific", subject="user",
                                            key="pin-note", value="a note"))).fact_id
    change(f"fact:{finding}", "delete")
    with pytest.raises(CitesForgotten, match=f"episode refused: it cites fact:{finding}"):
        episodes.add(AddEpisode(episode=EpisodeIn(
            channel="dmn", source="dmn", gist=f"Reverie reflected: {word}.",
            provenance=[f"fact:{finding}"])))
    told = episodes.add(AddEpisode(episode=EpisodeIn(
        channel="chat", source="user", gist=f"Told about the hint {word}."))).episode_id
    change(f"episode:{told}", "delete")
    with pytest.raises(CitesForgotten, match=f"compaction refused: it cites episode:{told}"):
        transcript.compact(Compact(channel="chat", summary=f"Conversation on chat: {word}.",
                                   watermark=turn_id, refs=[f"episode:{told}"]))
    now = time.time()
    with pytest.raises(CitesForgotten, match=f"digest refused: it cites {turn}"):
        graph.write_digests(WriteDigests(batch=DigestBatch(digests=[DigestIn(
            period="day", key="2020-01-07", starts_at=now - 86400, ends_at=now,
            text=f"The hint is {word}.", refs=[turn], how="llm")])))
    left = traces(runtime, word)
    assert left == dict.fromkeys(left, 0)
