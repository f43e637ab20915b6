import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import CONFIG_DIR
from runtime.memories.episodes import MutedSource
from runtime.memories.facts import FactIn, GraphService
from runtime.memories.profiles import MemoryProfiles
from runtime.store.database import Row, Store
from runtime.store.fact_kinds import FactKinds, UnknownFactKind
from runtime.time.clock import ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
PROFILES = MemoryProfiles.load(CONFIG_DIR / "profiles.toml")


def open_graph(path: Path) -> GraphService:
    return GraphService(Store(path, KINDS, clock=ManualClock(100.0)), KINDS, PROFILES)


@pytest.fixture
def graph(tmp_path: Path) -> Iterator[GraphService]:
    g = open_graph(tmp_path / "g.db")
    yield g
    g.store.close()


def advance(graph: GraphService, seconds: float) -> None:
    clock = graph.store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(seconds)


def fact(value: str, **kw: object) -> FactIn:
    return FactIn.model_validate(
        {"kind": "place", "subject": "Ana", "key": "lives_in", "value": value, **kw})


def current_rows(graph: GraphService, subject: str = "Ana", key: str = "lives_in") -> list[Row]:
    return [r for r in graph.history(subject, key) if r["valid_to"] is None]


def test_unknown_kind_is_rejected_and_nothing_written(graph: GraphService) -> None:
    with pytest.raises(UnknownFactKind, match="gossip"):
        graph.add(fact("Porto", kind="gossip"))
    assert graph.store.scalar("SELECT count(*) FROM facts") == 0


def test_source_that_does_not_feed_facts_is_refused(graph: GraphService) -> None:
    with pytest.raises(MutedSource, match="delegate:search"):
        graph.add(fact("Porto", source="delegate:search"))
    with pytest.raises(ValueError):  # callers catch ValueError for bad input
        graph.add(fact("Porto", source="never-configured"))
    assert graph.store.scalar("SELECT count(*) FROM facts") == 0
    assert graph.add(fact("Porto", source="dmn"))[1].action == "insert"


def test_contradiction_closes_old_window_and_keeps_history(graph: GraphService) -> None:
    first, r1 = graph.add(fact("Porto"))
    advance(graph, 50)
    second, r2 = graph.add(fact("Lisbon"))
    assert (r1.action, r2.action) == ("insert", "supersede")
    old, new = graph.get(first), graph.get(second)
    assert old is not None and new is not None
    assert old["valid_to"] == 150.0 and old["superseded_by"] == second
    assert new["valid_from"] == 150.0 and new["valid_to"] is None
    assert [h["value"] for h in graph.history("Ana", "lives_in")] == ["Porto", "Lisbon"]
    assert graph.current("Ana", "lives_in")["value"] == "Lisbon"  # type: ignore[index]


def test_restating_reinforces_with_the_mean_confidence(graph: GraphService) -> None:
    first, _ = graph.add(fact("Porto", confidence=0.5))
    advance(graph, 10)
    again, r = graph.add(fact("  porto ", confidence=0.9))
    assert r.action == "reinforce" and again == first
    row = graph.get(first)
    assert row is not None and row["confirmed_at"] == 110.0 and row["claims"] == 2
    assert row["confidence"] == pytest.approx(0.7)
    graph.add(fact("Porto", confidence=0.4))
    assert graph.get(first)["confidence"] == pytest.approx(0.6)  # type: ignore[index]
    assert graph.store.scalar("SELECT count(*) FROM facts") == 1


def test_one_strong_restatement_does_not_lock_the_fact(graph: GraphService) -> None:
    """The old max() ratchet pinned Porto at 0.9, and the 0.8 move was dropped."""
    porto, _ = graph.add(fact("Porto", confidence=0.5))
    graph.add(fact("Porto", confidence=0.9))
    advance(graph, 10)
    lisbon, r = graph.add(fact("Lisbon", confidence=0.8))
    assert r.action == "supersede" and r.existing_id == porto
    assert graph.current("Ana", "lives_in")["id"] == lisbon  # type: ignore[index]


def test_losing_contradiction_is_kept_in_history(graph: GraphService) -> None:
    porto, _ = graph.add(fact("Porto", confidence=0.9))
    advance(graph, 10)
    same, r = graph.add(fact("Lisbon", confidence=0.5, source="dmn"))
    assert r.action == "keep" and same == porto and r.claim_id is not None
    claim = graph.get(r.claim_id)
    assert claim is not None and claim["value"] == "Lisbon" and claim["source"] == "dmn"
    # recorded, never in force: an empty window, beaten by the current fact
    assert claim["valid_from"] == claim["valid_to"] == 110.0
    assert claim["superseded_by"] == porto and claim["recorded_at"] == 110.0
    assert [r["id"] for r in current_rows(graph)] == [porto]
    assert [h["value"] for h in graph.history("Ana", "lives_in")] == ["Porto", "Lisbon"]


def test_weak_guess_never_wipes_user_managed_fact(graph: GraphService) -> None:
    kept, _ = graph.add(fact("Porto", user_managed=True, confidence=0.6))
    same, r = graph.add(fact("Lisbon", confidence=0.95, source="dmn"))
    assert r.action == "keep" and same == kept
    assert graph.get(r.claim_id)["superseded_by"] == kept  # type: ignore[arg-type,index]
    # the user can still correct it
    _, r = graph.add(fact("Lisbon", user_managed=True))
    assert r.action == "supersede"


def test_a_disabled_fact_is_still_the_current_one(graph: GraphService) -> None:
    """disable, write, enable: the old code left two current facts."""
    porto, _ = graph.add(fact("Porto"))
    graph.disable(porto)
    assert graph.current("Ana", "lives_in")["id"] == porto  # type: ignore[index]
    advance(graph, 10)
    lisbon, r = graph.add(fact("Lisbon"))
    assert r.action == "supersede" and r.existing_id == porto
    graph.enable(porto)
    assert [r["id"] for r in current_rows(graph)] == [lisbon]


def test_delete_forgets_and_leaves_older_windows_closed(graph: GraphService) -> None:
    porto, _ = graph.add(fact("Porto"))
    advance(graph, 10)
    lisbon, _ = graph.add(fact("Lisbon"))
    graph.disable(lisbon)
    graph.enable(lisbon)
    assert graph.delete(lisbon, writer="user") is not None
    assert graph.get(lisbon) is None
    older = graph.get(porto)
    assert older is not None and older["superseded_by"] is None and older["valid_to"] == 110.0
    log = graph.store.rows("SELECT writer, op, row_id, before, after FROM write_log"
                           " WHERE table_name = 'facts' ORDER BY id")
    assert [(r["op"], r["row_id"]) for r in log] == [
        ("insert", porto), ("insert", lisbon), ("update", porto), ("update", lisbon),
        ("update", lisbon), ("update", porto), ("delete", lisbon)]
    # clearing the link went through the write path, by the deleting writer
    assert log[5]["writer"] == "user"
    assert json.loads(log[5]["after"])["superseded_by"] is None
    assert not any("Lisbon" in str(r["before"]) + str(r["after"]) for r in log)


# -- properties over sequences of writes ----------------------------------------------

SUBJECTS = ("Ana", "Bo")
VALUES = ("Porto", "porto ", "Lisbon", "Faro")


@dataclass(frozen=True)
class Add:
    subject: str
    value: str
    confidence: float
    user_managed: bool
    seared: bool
    valid_from: float | None
    wait: float


@dataclass(frozen=True)
class Change:
    action: str  # disable, enable or delete
    pick: int  # which existing fact, modulo their number


adds = st.builds(
    Add, st.sampled_from(SUBJECTS), st.sampled_from(VALUES),
    st.sampled_from((0.2, 0.5, 0.7, 0.9)), st.booleans(), st.booleans(),
    st.one_of(st.none(), st.sampled_from((0.0, 95.0, 130.0, 1e6))),
    st.sampled_from((0.0, 1.0, 30.0)))
changes = st.builds(Change, st.sampled_from(("disable", "enable", "delete")),
                    st.integers(0, 50))


def _histories(graph: GraphService) -> dict[str, list[Row]]:
    return {s: graph.history(s, "lives_in") for s in SUBJECTS}


def _check_invariants(graph: GraphService) -> None:
    for subject, rows in _histories(graph).items():
        assert len([r for r in rows if r["valid_to"] is None]) <= 1, subject
        for r in rows:
            assert 0.0 <= r["confidence"] <= 1.0
        windows = [(r["valid_from"], math.inf if r["valid_to"] is None else r["valid_to"])
                   for r in rows]
        for i, (a_from, a_to) in enumerate(windows):
            for b_from, b_to in windows[i + 1:]:
                # half-open windows [from, to): an empty one overlaps nothing
                assert max(a_from, b_from) >= min(a_to, b_to), (subject, windows)


def _apply_add(graph: GraphService, op: Add) -> None:
    before = {r["id"]: r for r in graph.history(op.subject, "lives_in")}
    advance(graph, op.wait)
    fact_id, r = graph.add(FactIn(
        kind="place", subject=op.subject, key="lives_in", value=op.value,
        confidence=op.confidence, user_managed=op.user_managed,
        memory_level="seared" if op.seared else "normal", valid_from=op.valid_from))
    after = {r["id"]: r for r in graph.history(op.subject, "lives_in")}
    assert set(before) <= set(after)  # an add never takes history away
    current = [row for row in after.values() if row["valid_to"] is None]
    assert [row["id"] for row in current] == [fact_id]  # exactly one, the one returned
    if r.action == "reinforce":
        assert set(after) == set(before)
        assert after[fact_id]["claims"] == before[fact_id]["claims"] + 1
        assert after[fact_id]["value"].lower().split() == op.value.lower().split()
    else:  # the claim is in history, whether it won or lost
        (new_id,) = set(after) - set(before)
        assert after[new_id]["value"] == op.value


def _apply_change(graph: GraphService, op: Change) -> None:
    everything = graph.store.rows("SELECT id FROM facts ORDER BY id")
    if not everything:
        return
    fact_id = everything[op.pick % len(everything)]["id"]
    before = _histories(graph)
    if op.action == "delete":
        graph.delete(fact_id)
    elif op.action == "disable":
        graph.disable(fact_id)
    else:
        graph.enable(fact_id)
    after = _histories(graph)
    for subject in SUBJECTS:
        lost = {r["id"] for r in before[subject]} - {r["id"] for r in after[subject]}
        assert lost <= ({fact_id} if op.action == "delete" else set())  # only by delete
        # disabling or enabling never changes which fact is current
        opened_before = {r["id"] for r in before[subject] if r["valid_to"] is None}
        opened_after = {r["id"] for r in after[subject] if r["valid_to"] is None}
        gone = {fact_id} if op.action == "delete" else set()
        assert opened_after == opened_before - gone


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(adds, changes), min_size=1, max_size=25))
def test_graph_properties_hold_over_any_sequence(ops: list[Add | Change]) -> None:
    """Whatever the adds, disables, enables and deletes: at most one current fact
    per subject and key (exactly one, the returned one, after any add); history
    never shrinks except by an explicit delete, and keeps every claim; windows
    never overlap."""
    with tempfile.TemporaryDirectory() as tmp:
        graph = open_graph(Path(tmp) / "g.db")
        try:
            for op in ops:
                if isinstance(op, Add):
                    _apply_add(graph, op)
                else:
                    _apply_change(graph, op)
                _check_invariants(graph)
        finally:
            graph.store.close()
