"""The actor runtime on one shared Ray instance: the turn path end to end, muted and
temporary turns, bad input (also input that skipped validation on the way), the
typed clients, and an actor killed during a stream of writes."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from pydantic import ValidationError

from actors import supervisor
from actors.common import BadRequest
from actors.handles import (
    ActorClient,
    EpisodesClient,
    GraphClient,
    NoActor,
    RecallClient,
    TranscriptClient,
    TurnsClient,
)
from actors.messages import (
    AddFact,
    AppendTurns,
    ChangeMemory,
    Recall,
    RecentTurns,
    UserTurn,
)
from actors.status import gather_status
from runtime.config import CONFIG_DIR, Settings
from runtime.memories.facts import FactIn
from runtime.memories.transcript import MAX_TURN_CHARS, TurnIn
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.waiting import wait_for

NS = "test-actors"


@pytest.fixture(scope="module")
def runtime(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Settings]:
    from runtime.config import load_settings

    data = tmp_path_factory.mktemp("actors-data")
    settings = load_settings(env={}, overrides={
        "store": {"data_dir": str(data)}, "embedder": {"cache_dir": str(model_cache)},
        "runtime": {"namespace": NS},
        "persona": {"global_dir": str(data / "persona")},
        "http": {"port": 0},
    })
    sup = supervisor.start(settings)
    yield settings
    sup.stop()


turns = TurnsClient(NS)
transcript = TranscriptClient(NS)
recall = RecallClient(NS)
graph = GraphClient(NS)


def say(text: str, channel: str = "chat", **kw: Any) -> Any:
    reply = turns.process(UserTurn(channel=channel, text=text, **kw))
    transcript.flush()  # indexing caught up
    return reply


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def test_turn_end_to_end_with_citations(runtime: Settings) -> None:
    told = say("My sister Ana moved to Porto last year and works as a nurse.", channel="voice")
    reply = turns.process(UserTurn(channel="chat", text="Where does my sister live these days?"))
    assert reply.turn_id is not None and reply.reply_id is not None
    # read right after the turn, before any flush: the reply was written with its citations
    store = read_store(runtime)
    try:
        user = store.get("transcript", reply.turn_id)
        answer = store.get("transcript", reply.reply_id)
    finally:
        store.close()
    assert f"turn:{told.turn_id}" in reply.citations  # recall crossed channels
    assert reply.provider == "offline" and "Porto" in reply.text
    assert user is not None and answer is not None
    assert (user["role"], user["channel"], user["memory"]) == ("user", "chat", 1)
    assert answer["role"] == "assistant" and answer["content"] == reply.text
    assert json.loads(answer["citations"]) == reply.citations
    transcript.flush()


def test_reply_and_citations_are_one_write(runtime: Settings) -> None:
    """A turn and its citations arrive in one AppendTurns and are written together;
    a batch with a bad citation list writes nothing at all."""
    rid = f"cited-{uuid.uuid4().hex}"
    reply = TurnIn(channel="chat", source="assistant", role="assistant",
                   content="Your passport is in the desk drawer.", request_id=rid)
    ids = transcript.append(AppendTurns(turns=[reply], citations=[["fact:1", "turn:2"]])).ids
    store = read_store(runtime)
    try:
        row = store.get("transcript", ids[0])
        assert row is not None and json.loads(row["citations"]) == ["fact:1", "turn:2"]
        before = store.scalar("SELECT count(*) FROM transcript")
        bad = AppendTurns.model_construct(
            turns=[reply.model_copy(update={"request_id": f"{rid}-2"})],
            citations=[["turn:1"], ["turn:2"]], writer="transcript")
        with pytest.raises(BadRequest, match="citations"):
            transcript.append(bad)
        assert store.scalar("SELECT count(*) FROM transcript") == before
    finally:
        store.close()


def test_muted_source_writes_no_memory(runtime: Settings) -> None:
    reply = say("Zanzibar ferry timetable changed to 7:45 on weekdays.", source="delegate:search")
    store = read_store(runtime)
    try:
        row = store.get("transcript", reply.turn_id)
        assert row is not None and row["memory"] == 0  # kept in the transcript, not memory
        assert store.scalar("SELECT count(*) FROM vectors WHERE kind = 'turn' AND item_id = ?",
                            (reply.turn_id,)) == 0
    finally:
        store.close()
    found = recall.recall(Recall(query="Zanzibar ferry timetable"))
    assert f"turn:{reply.turn_id}" not in found.refs


def test_temporary_chat_writes_nothing(runtime: Settings) -> None:
    store = read_store(runtime)
    try:
        before = store.scalar("SELECT count(*) FROM transcript")
        reply = say("Just between us: my locker code is 4471.", temporary=True)
        assert reply.turn_id is None and reply.reply_id is None
        assert store.scalar("SELECT count(*) FROM transcript") == before
    finally:
        store.close()


@pytest.mark.parametrize(("kw", "expected"), [
    ({"text": ""}, "content"),
    ({"text": "   "}, "content"),
    ({"text": "hello", "channel": "no-such-channel"}, "unknown channel"),
])
def test_bad_turns_get_a_clear_error(runtime: Settings, kw: dict[str, str],
                                     expected: str) -> None:
    with pytest.raises(BadRequest, match=expected):
        turns.process(UserTurn.model_validate({"channel": "chat", **kw}))


def test_oversized_turn_is_refused_before_sending() -> None:
    with pytest.raises(ValidationError, match="text"):
        UserTurn(channel="chat", text="x" * (MAX_TURN_CHARS + 1))


def test_unvalidated_input_is_refused_by_the_actor(runtime: Settings) -> None:
    """Messages that skipped pydantic on the way (model_construct, a plain dict)
    reach the actors, which validate them again and refuse them."""
    big = "x" * (MAX_TURN_CHARS + 1)
    store = read_store(runtime)
    try:
        before = store.scalar("SELECT count(*) FROM transcript")
        with pytest.raises(BadRequest, match=r"^text: "):
            turns.process(UserTurn.model_construct(channel="chat", text=big))
        with pytest.raises(BadRequest, match=r"^text: "):
            turns.call("process", {"channel": "chat", "text": big}, reply=object)
        oversized = TurnIn.model_construct(channel="chat", source="user", role="user",
                                           content=big, request_id=f"big-{uuid.uuid4().hex}")
        with pytest.raises(BadRequest, match=r"turns\.0\.content"):
            transcript.append(AppendTurns.model_construct(turns=[oversized], citations=None,
                                                          writer="transcript"))
        with pytest.raises(BadRequest, match="query"):
            recall.recall(Recall.model_construct(query=big, max_items=None, max_tokens=None,
                                                 now=None, exclude=[]))
        with pytest.raises(BadRequest, match="colour: Extra inputs"):
            recall.call("recall", {"query": "x", "colour": "red"}, reply=object)
        assert store.scalar("SELECT count(*) FROM transcript") == before
    finally:
        store.close()


def test_unknown_fact_kind_and_muted_fact_source_are_refused(runtime: Settings) -> None:
    with pytest.raises(BadRequest, match="unknown fact kind"):
        graph.add(AddFact(fact=FactIn(kind="gossip", subject="a", key="b", value="c")))
    with pytest.raises(BadRequest, match="does not feed facts"):
        graph.add(AddFact(fact=FactIn(kind="place", subject="a", key="b", value="c",
                                      source="scheduled")))
    with pytest.raises(BadRequest, match="no fact 999999"):
        graph.change(ChangeMemory(ref="fact:999999", change="disable"))


def test_facts_written_through_the_graph_are_recalled(runtime: Settings) -> None:
    written = graph.add(AddFact(fact=FactIn(
        kind="user_specific", subject="user", key="allergy", value="allergic to peanuts")))
    recall.sync()
    found = recall.recall(Recall(query="what am I allergic to?"))
    assert f"fact:{written.fact_id}" in found.refs
    graph.change(ChangeMemory(ref=f"fact:{written.fact_id}", change="disable"))
    found = recall.recall(Recall(query="what am I allergic to?"))
    assert f"fact:{written.fact_id}" not in found.refs


# -- typed clients ------------------------------------------------------------

def _echo_class() -> type:
    """A stand-in actor for the client mechanics (defined in a function, so Ray
    ships it by value: the workers cannot import this test module)."""

    class Echo:
        def __init__(self, tag: str) -> None:
            self.tag = tag
            self.calls = 0

        def echo(self, text: str) -> str:
            self.calls += 1
            return f"{self.tag}:{text}"

        def refuse(self, text: str) -> str:
            raise BadRequest(f"refused {text}")

        def count(self) -> int:
            return self.calls

    return Echo


class EchoClient(ActorClient):
    name = "echo"

    def echo(self, text: str, retry: bool = True) -> str:
        return self.call("echo", text, reply=str, retry=retry)


def _start_echo(tag: str) -> Any:
    echo: Any = ray.remote(_echo_class())
    handle = echo.options(name="echo", namespace=NS, num_cpus=0).remote(tag)
    ray.get(handle.count.remote(), timeout=60)
    return handle


def test_client_resolves_once_and_again_after_the_actor_is_gone(ray_instance: str) -> None:
    client = EchoClient(NS, timeout_s=60)
    with pytest.raises(NoActor, match="no echo actor"):
        client.echo("x")
    first = _start_echo("one")
    try:
        assert client.echo("a") == "one:a"
        held = client.handle
        assert client.echo("b") == "one:b" and client.handle is held  # looked up once
        with pytest.raises(BadRequest, match="refused z") as refused:
            client.call("refuse", "z", reply=str)
        assert type(refused.value) is BadRequest  # the callee's error itself, not Ray's wrapper
        with pytest.raises(TypeError, match="expected str"):
            client.call("count", reply=str)
        ray.kill(first, no_restart=True)  # gone for good; a new one takes its name
        second = _start_echo("two")
        assert client.echo("c") == "two:c"  # a repeatable call is sent again
        assert client.handle is not held
        ray.kill(second, no_restart=True)
        third = _start_echo("three")
        with pytest.raises(ray.exceptions.RayActorError):
            client.echo("d", retry=False)  # not repeatable: raised, never sent twice
        assert ray.get(third.count.remote(), timeout=60) == 0
        assert client.echo("e", retry=False) == "three:e"  # the next call uses the new one
        ray.kill(third, no_restart=True)
    finally:
        ray.kill(first, no_restart=True)


def test_supervisor_reports_through_clients(runtime: Settings) -> None:
    TranscriptClient(NS).append(AppendTurns(turns=[TurnIn(
        channel="chat", source="user", content="a turn of its own to count",
        request_id=f"status-{uuid.uuid4().hex}")]))
    status = gather_status(runtime)
    assert set(status.actors) == {"transcript", "recall", "episodes", "graph", "turns",
                                  "cron", "http"}
    assert set(status.actors.values()) == {"ok"}
    assert status.counts["transcript"] >= 1
    assert EpisodesClient(NS).ping() == "ok"


# -- a killed actor ---------------------------------------------------------------

def _stream(run: str, acked: dict[int, int], errors: list[BaseException],
            stop: threading.Event, n: int) -> None:
    client = TranscriptClient(NS, timeout_s=120)
    for i in range(n):
        if stop.is_set():
            return
        turn = TurnIn(channel="chat", source="user", content=f"stream {run} turn {i}",
                      request_id=f"stream-{run}-{i}")
        try:
            acked[i] = client.append(AppendTurns(turns=[turn])).ids[0]
        except Exception as exc:
            errors.append(exc)


@pytest.mark.parametrize("victim", ["transcript", "recall"])
def test_killed_actor_loses_no_acknowledged_turn(runtime: Settings, victim: str) -> None:
    run = uuid.uuid4().hex[:8]  # fresh request ids: every append really writes
    n = 300
    store = read_store(runtime)
    try:
        before = store.scalar("SELECT count(*) FROM transcript")
    finally:
        store.close()
    acked: dict[int, int] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    worker = threading.Thread(target=_stream, args=(run, acked, errors, stop, n))
    worker.start()
    assert wait_for(lambda: len(acked) >= 50, timeout=120)
    ray.kill(ray.get_actor(victim, namespace=NS), no_restart=False)  # Ray restarts it
    worker.join(timeout=300)
    stop.set()
    assert not worker.is_alive()
    # appends carry request ids, so Ray retries them on the restarted actor: none fails
    assert errors == []
    assert sorted(acked) == list(range(n))
    store = read_store(runtime)
    try:
        rows = {r[0]: r[1] for r in store.conn.execute(
            "SELECT id, content FROM transcript WHERE content LIKE ?", (f"stream {run} turn %",))}
        total = store.scalar("SELECT count(*) FROM transcript")
    finally:
        store.close()
    assert len(set(acked.values())) == n  # a retried append never wrote twice
    assert {rows.get(turn_id) for turn_id in acked.values()} == {
        f"stream {run} turn {i}" for i in range(n)}  # each acked id holds its own turn
    assert len(rows) == n and total == before + n
    # the actor serves again, and so does recall over what was written
    assert ray.get(ray.get_actor(victim, namespace=NS).ping.remote(), timeout=120) == "ok"
    recall.sync()
    assert recall.recall(Recall(query=f"stream {run} turn 42")).items
    status = gather_status(runtime)
    assert set(status.actors.values()) == {"ok"}


def test_recent_turns_in_order(runtime: Settings) -> None:
    listed = transcript.recent(RecentTurns(channel="chat", limit=5)).turns
    assert [t.id for t in listed] == sorted(t.id for t in listed)
