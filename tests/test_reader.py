"""The prompt parts' shared read connection (runtime.recall.reader): opened once, and a
part that cannot be read is left out (its default) with a warning naming it."""

from __future__ import annotations

import logging

import pytest

from runtime.memory import Memory
from runtime.recall.reader import StoreReader
from runtime.store.database import Store


def test_one_connection_serves_every_part(memory: Memory) -> None:
    opened: list[Store] = []

    def open_store() -> Store:
        opened.append(memory.store)
        return memory.store

    reader = StoreReader(open_store)
    assert reader.read("a", lambda s: s.scalar("SELECT 1"), 0) == 1
    assert reader.read("b", lambda s: s.scalar("SELECT 2"), 0) == 2
    assert len(opened) == 1


def test_a_part_that_cannot_be_read_is_left_out(memory: Memory,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runtime.recall.reader")
    reader = StoreReader(lambda: memory.store)
    assert reader.read("mood", lambda s: s.scalar("SELECT secret FROM nowhere"), "") == ""
    assert "mood unavailable: SQLError" in caplog.text and "secret" not in caplog.text

    def cannot_open() -> Store:
        raise OSError("disk gone")

    assert StoreReader(cannot_open).read("profile", lambda s: "never", "none") == "none"
