"""The turn's core (``runtime.turn``) without Ray: through
:meth:`runtime.memory.Memory.turn` on a real store, with the offline provider
or a local server speaking the OpenAI API (tests/fake_openai.py) as the model,
and its steps called directly."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Mode, fake_openai_fixture  # noqa: F401

from runtime import turn
from runtime.config import Settings
from runtime.llm.embedder import Embedder
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.remember import note_fact
from runtime.time.clock import ManualClock

SECRET = "The alarm code for the front door is 4321."
PLAIN = "The alarm on the front door is set every night at eleven."
REF = re.compile(r"^- \[((?:fact|episode|turn):\d+)\]", re.M)
CHANNELS = {"den": {"injection": "pull"}, "hall": {"injection": "pull", "spoken": True}}


@pytest.fixture
def make_memory(make_settings: Callable[..., Settings], clock: ManualClock, embedder: Embedder,
                tmp_path: Path) -> Iterator[Callable[..., Memory]]:
    """A memory whose household is Ana and Ben, holding a sensitive fact of the
    household's (the alarm code) and a plain one; ``model``: a server as its
    language model (default: the offline provider alone), with the offline
    provider behind it when ``offline``."""
    opened: list[Memory] = []

    def make(model: FakeOpenAI | None = None, offline: bool = True) -> Memory:
        llm: dict[str, Any] = {"offline_fallback": offline}
        if model is not None:
            llm["providers"] = [{"name": "local", "base_url": model.base_url, "model": "tiny",
                                 "timeout_s": 10}]
        settings = make_settings(household={"people": ["Ana", "Ben"]}, channels=CHANNELS,
                                 persona={"global_dir": str(tmp_path / "persona")}, llm=llm)
        memory = Memory(settings, clock=clock, embedder=embedder)
        opened.append(memory)
        memory.add_fact(note_fact(SECRET, sensitive=True))
        memory.add_fact(note_fact(PLAIN))
        return memory

    yield make
    for memory in opened:
        memory.close()


def refs_of(memory: Memory, text: str) -> dict[str, str]:
    """The refs of the facts saying ``text``."""
    return {f"fact:{r['id']}": r["value"] for r in memory.store.rows(
        "SELECT id, value FROM facts WHERE value = ?", (text,))}


def secret_ref(memory: Memory) -> str:
    return next(iter(refs_of(memory, SECRET)))


def reply_row(memory: Memory, reply_id: int | None) -> dict[str, Any]:
    assert reply_id is not None
    row = memory.store.get("transcript", reply_id)
    assert row is not None
    return row


def test_a_sensitive_memory_is_withheld_from_a_guest_and_given_to_the_household(
        make_memory: Callable[..., Memory], fake_openai: FakeOpenAI) -> None:
    memory = make_memory(fake_openai)
    secret = secret_ref(memory)
    guest = memory.turn("What is the alarm code for the front door?", channel="voice",
                        speaker="a visitor")
    prompt = fake_openai.last.body["messages"][0]["content"]
    assert "4321" not in prompt and secret not in guest.citations
    assert guest.citations  # the plain memory about the alarm is given
    ana = memory.turn("What is the alarm code for the front door?", channel="voice",
                      speaker="ana")
    assert secret in ana.citations
    assert "4321" in fake_openai.last.body["messages"][0]["content"]


def test_the_citations_are_the_memories_given_to_the_model(
        make_memory: Callable[..., Memory], fake_openai: FakeOpenAI) -> None:
    memory = make_memory(fake_openai)
    replied = memory.turn("When is the alarm on the front door set?")
    given = REF.findall(fake_openai.last.body["messages"][0]["content"])
    assert given and replied.citations == given
    assert json.loads(reply_row(memory, replied.reply_id)["citations"]) == given


def test_a_temporary_turn_writes_nothing(make_memory: Callable[..., Memory]) -> None:
    memory = make_memory()
    before = memory.counts()
    logged = memory.store.scalar("SELECT count(*) FROM write_log")
    replied = memory.turn("remember: the boat key is in the red box. Where is the alarm code?",
                          temporary=True)
    assert replied.turn_id is None and replied.reply_id is None
    assert replied.citations  # it was answered from memory all the same
    assert memory.counts() == before
    assert memory.store.scalar("SELECT count(*) FROM write_log") == logged


def test_the_reply_is_stored_sensitive_when_given_a_sensitive_memory(
        make_memory: Callable[..., Memory]) -> None:
    memory = make_memory()
    # the household's own typed channel, nobody named: given the household's secret
    told = memory.turn("What is the alarm code for the front door?", channel="chat")
    assert secret_ref(memory) in told.citations
    assert reply_row(memory, told.reply_id)["sensitive"] == 1
    # a guest on a spoken channel is given only the plain memory: a plain reply
    guest = memory.turn("What is the alarm code for the front door?", channel="voice",
                        speaker="a visitor")
    assert guest.citations and secret_ref(memory) not in guest.citations
    assert reply_row(memory, guest.reply_id)["sensitive"] == 0


def test_when_no_model_answers_the_turn_says_so_and_is_written(
        make_memory: Callable[..., Memory], fake_openai: FakeOpenAI) -> None:
    memory = make_memory(fake_openai, offline=False)
    fake_openai.mode = Mode.HTTP_500
    replied = memory.turn("When is the alarm on the front door set?")
    assert (replied.text, replied.provider) == ("Sorry, I cannot answer right now.", "none")
    assert reply_row(memory, replied.reply_id)["content"] == replied.text
    assert replied.citations  # the memories it was given, all the same


def test_a_pull_channels_tool_calls_are_kept_with_the_reply(
        make_memory: Callable[..., Memory], fake_openai: FakeOpenAI) -> None:
    memory = make_memory(fake_openai)
    fake_openai.tool_calls.append([("recall", json.dumps({"query": "alarm code", "limit": 3})),
                                   ("shout", "{}")])
    # a turn that recalls nothing by itself: what the model is given, its tool pulled
    replied = memory.turn("Sing me a song.", channel="den", speaker="ana")
    assert replied.text.startswith("tool said: ") and "4321" in replied.text
    calls = memory.store.rows("SELECT name, arguments, result FROM tool_calls"
                              " WHERE transcript_id = ? ORDER BY id", (replied.reply_id,))
    assert [c["name"] for c in calls] == ["recall", "shout"]
    assert json.loads(calls[0]["arguments"]) == {"query": "alarm code", "limit": 3}
    assert "4321" in calls[0]["result"] and calls[1]["result"].startswith("error: ")
    pulled = REF.findall(calls[0]["result"])
    assert secret_ref(memory) in pulled and replied.citations == pulled
    assert reply_row(memory, replied.reply_id)["sensitive"] == 1


def test_a_pull_channels_recall_tool_withholds_a_sensitive_memory_from_a_guest(
        make_memory: Callable[..., Memory], fake_openai: FakeOpenAI) -> None:
    memory = make_memory(fake_openai)
    fake_openai.tool_calls.append([("recall", json.dumps({"query": "alarm code"}))])
    replied = memory.turn("Sing me a song.", channel="hall", speaker="a visitor")
    assert "4321" not in replied.text and secret_ref(memory) not in replied.citations
    calls = memory.store.rows("SELECT result FROM tool_calls WHERE transcript_id = ?",
                              (replied.reply_id,))
    assert len(calls) == 1 and "4321" not in calls[0]["result"]


# -- the steps, called directly ------------------------------------------------------


def said(turn_id: int, role: str, speaker: str | None = None, sensitive: bool = False,
         disabled: bool = False) -> turn.Turn:
    return turn.Turn(id=turn_id, role=role, speaker=speaker, content=f"turn {turn_id}",
                     sensitive=sensitive, disabled=disabled)


def test_the_history_for_the_prompt_leaves_out_the_turn_itself_disabled_and_others_secrets(
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(household={"people": ["Ana", "Ben"]})
    asked = turn.Asked(TurnIn(channel="voice", source="user", content="hi", speaker="Ben"),
                       settings.channels["voice"])
    history = [said(1, "user", "Ana", sensitive=True), said(2, "assistant", sensitive=True),
               said(3, "user", "Ben"), said(4, "assistant", disabled=True),
               said(5, "user", "Ben", sensitive=True), said(6, "user", "Ben")]
    past = turn.history_for_prompt(history, 6, turn.audience(settings, asked), limit=10)
    assert [t.id for t in past] == [3, 5]
    assert [t.id for t in turn.history_for_prompt(history, 6, turn.audience(settings, asked),
                                                  limit=1)] == [5]
