from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.clock import ManualClock
from runtime.config import CONFIG_DIR
from runtime.fact_kinds import FactKinds, UnknownFactKind
from runtime.facts import FactIn, GraphService, resolve
from runtime.store import Store

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")


@pytest.fixture
def graph(tmp_path: Path) -> GraphService:
    store = Store(tmp_path / "g.db", KINDS, clock=ManualClock(100.0))
    yield GraphService(store, KINDS)
    store.close()


def fact(value: str, **kw: object) -> FactIn:
    return FactIn(**{"kind": "place", "subject": "Ana", "key": "lives_in", "value": value, **kw})


def test_unknown_kind_is_rejected_and_nothing_written(graph: GraphService) -> None:
    with pytest.raises(UnknownFactKind, match="gossip"):
        graph.add(fact("Porto", kind="gossip"))
    assert graph.store.scalar("SELECT count(*) FROM facts") == 0


def test_contradiction_closes_old_window_and_keeps_history(graph: GraphService) -> None:
    clock = graph.store.clock
    assert isinstance(clock, ManualClock)
    first, r1 = graph.add(fact("Porto"))
    clock.advance(50)
    second, r2 = graph.add(fact("Lisbon"))
    assert (r1.action, r2.action) == ("insert", "supersede")
    old, new = graph.get(first), graph.get(second)
    assert old is not None and new is not None
    assert old["valid_to"] == 150.0 and old["superseded_by"] == second
    assert new["valid_from"] == 150.0 and new["valid_to"] is None
    assert [h["value"] for h in graph.history("Ana", "lives_in")] == ["Porto", "Lisbon"]
    assert graph.current("Ana", "lives_in")["value"] == "Lisbon"  # type: ignore[index]


def test_restating_reinforces_instead_of_duplicating(graph: GraphService) -> None:
    first, _ = graph.add(fact("Porto", confidence=0.5))
    graph.store.clock.advance(10)  # type: ignore[attr-defined]
    again, r = graph.add(fact("  porto ", confidence=0.9))
    assert r.action == "reinforce" and again == first
    row = graph.get(first)
    assert row is not None and row["confidence"] == 0.9 and row["confirmed_at"] == 110.0
    assert graph.store.scalar("SELECT count(*) FROM facts") == 1


def test_weak_guess_never_wipes_user_managed_fact(graph: GraphService) -> None:
    kept, _ = graph.add(fact("Porto", user_managed=True, confidence=0.6))
    same, r = graph.add(fact("Lisbon", confidence=0.95, source="extraction"))
    assert r.action == "keep" and same == kept
    # the user can still correct it
    _, r = graph.add(fact("Lisbon", user_managed=True))
    assert r.action == "supersede"


def test_disable_and_delete_are_separate(graph: GraphService) -> None:
    fid, _ = graph.add(fact("Porto"))
    graph.disable(fid)
    assert graph.get(fid)["disabled"] == 1  # type: ignore[index]
    assert graph.current("Ana", "lives_in") is None
    graph.enable(fid)
    assert graph.current("Ana", "lives_in") is not None
    graph.delete(fid)
    assert graph.get(fid) is None
    ops = [r["op"] for r in graph.store.rows(
        "SELECT op FROM write_log WHERE table_name = 'facts' ORDER BY id")]
    assert ops == ["insert", "update", "update", "delete"]


values = st.text(alphabet="abc ", min_size=1, max_size=6).filter(lambda s: s.strip())


@given(old=values, new=values, c_old=st.floats(0, 1), c_new=st.floats(0, 1),
       managed=st.booleans(), seared=st.booleans())
def test_resolution_rules(old: str, new: str, c_old: float, c_new: float,
                          managed: bool, seared: bool) -> None:
    current = {"id": 1, "value": old, "confidence": c_old, "user_managed": int(managed),
               "memory_level": "seared" if seared else "normal"}
    r = resolve(current, fact(new, confidence=c_new))
    if " ".join(old.split()) == " ".join(new.split()):
        assert r.action == "reinforce"
    elif managed or seared or c_new < c_old:
        assert r.action == "keep"
    else:
        assert r.action == "supersede"
    assert resolve(None, fact(new)).action == "insert"
