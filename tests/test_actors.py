"""The actor runtime on one shared Ray instance: the turn path end to end, muted and
temporary turns, bad input, and an actor killed during a stream of writes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from pydantic import ValidationError

from actors import supervisor
from actors.common import BadRequest, actor, unwrap
from actors.messages import (
    AddFact,
    AppendTurns,
    ChangeFact,
    Recall,
    StatusRequest,
    UserTurn,
)
from runtime.config import CONFIG_DIR, Settings
from runtime.fact_kinds import FactKinds
from runtime.facts import FactIn
from runtime.store import Store
from runtime.transcript import MAX_TURN_CHARS, TurnIn

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
    })
    sup = supervisor.start(settings)
    yield settings
    ray.get(sup.stop.remote(), timeout=120)
    ray.kill(sup)


def call(name: str, method: str, msg: Any, timeout: float = 60) -> Any:
    try:
        return ray.get(getattr(actor(name, NS), method).remote(msg), timeout=timeout)
    except ray.exceptions.RayTaskError as exc:
        raise unwrap(exc) from None


def say(text: str, channel: str = "chat", **kw: Any) -> Any:
    reply = call("turns", "process", UserTurn(channel=channel, text=text, **kw))
    ray.get(actor("transcript", NS).flush.remote(), timeout=60)  # indexing caught up
    return reply


def read_store(settings: Settings) -> Store:
    return Store(settings.store.path, FactKinds.load(CONFIG_DIR / "fact_kinds.toml"))


def test_turn_end_to_end_with_citations(runtime: Settings) -> None:
    told = say("My sister Ana moved to Porto last year and works as a nurse.", channel="voice")
    reply = say("Where does my sister live these days?")
    assert f"turn:{told.turn_id}" in reply.citations  # recall crossed channels
    assert reply.provider == "offline" and "Porto" in reply.text
    store = read_store(runtime)
    try:
        user = store.get("transcript", reply.turn_id)
        answer = store.get("transcript", reply.reply_id)
        assert user is not None and answer is not None
        assert (user["role"], user["channel"], user["memory"]) == ("user", "chat", 1)
        assert answer["role"] == "assistant" and answer["content"] == reply.text
        assert f"turn:{told.turn_id}" in answer["citations"]
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
    found = call("recall", "recall", Recall(query="Zanzibar ferry timetable"))
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
        call("turns", "process", UserTurn(**{"channel": "chat", **kw}))


def test_oversized_turn_is_refused_before_sending() -> None:
    with pytest.raises(ValidationError, match="text"):
        UserTurn(channel="chat", text="x" * (MAX_TURN_CHARS + 1))


def test_unknown_fact_kind_and_muted_fact_source_are_refused(runtime: Settings) -> None:
    with pytest.raises(BadRequest, match="unknown fact kind"):
        call("graph", "add", AddFact(fact=FactIn(kind="gossip", subject="a", key="b", value="c")))
    with pytest.raises(BadRequest, match="does not feed facts"):
        call("graph", "add", AddFact(fact=FactIn(kind="place", subject="a", key="b", value="c",
                                                 source="scheduled")))
    with pytest.raises(BadRequest, match="no fact"):
        call("graph", "change", ChangeFact(fact_id=999_999, change="disable"))


def test_facts_written_through_the_graph_are_recalled(runtime: Settings) -> None:
    written = call("graph", "add", AddFact(fact=FactIn(
        kind="user_specific", subject="user", key="allergy", value="allergic to peanuts")))
    ray.get(actor("graph", NS).ping.remote())
    call("recall", "sync", None)
    found = call("recall", "recall", Recall(query="what am I allergic to?"))
    assert f"fact:{written.fact_id}" in found.refs
    call("graph", "change", ChangeFact(fact_id=written.fact_id, change="disable"))
    found = call("recall", "recall", Recall(query="what am I allergic to?"))
    assert f"fact:{written.fact_id}" not in found.refs


def _stream(acked: list[int], errors: list[BaseException], stop: threading.Event,
            n: int) -> None:
    handle = actor("transcript", NS)
    for i in range(n):
        if stop.is_set():
            return
        turn = TurnIn(channel="chat", source="user", content=f"stream turn {i}",
                      request_id=f"stream-{i}")
        try:
            ids = ray.get(handle.append.remote(AppendTurns(turns=[turn])), timeout=120).ids
            acked.extend(ids)
        except Exception as exc:  # not acknowledged: allowed to be lost
            errors.append(exc)


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not done.is_set():
            if predicate():
                return True
            done.wait(0.05)
        return predicate()
    finally:
        deadline.cancel()


@pytest.mark.parametrize("victim", ["transcript", "recall"])
def test_killed_actor_loses_no_acknowledged_turn(runtime: Settings, victim: str) -> None:
    acked: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    worker = threading.Thread(target=_stream, args=(acked, errors, stop, 300))
    worker.start()
    assert _wait_for(lambda: len(acked) >= 50, timeout=120)
    ray.kill(actor(victim, NS), no_restart=False)  # Ray restarts it
    worker.join(timeout=300)
    stop.set()
    assert not worker.is_alive()
    store = read_store(runtime)
    try:
        stored = {r[0] for r in store.conn.execute("SELECT id FROM transcript")}
        assert set(acked) <= stored
        assert len(set(acked)) == len(acked)  # a retried append never wrote twice
        contents = [r[0] for r in store.conn.execute(
            "SELECT content FROM transcript WHERE content LIKE 'stream turn %'")]
    finally:
        store.close()
    assert len(contents) == len(set(contents))
    # the actor serves again, and so does recall over what was written
    assert ray.get(actor(victim, NS).ping.remote(), timeout=120) == "ok"
    call("recall", "sync", None, timeout=300)
    assert call("recall", "recall", Recall(query="stream turn 42")).items
    status = call("supervisor", "status", StatusRequest())
    assert set(status.actors.values()) == {"ok"}
