"""Graph views: a subject's neighbours and the map (counts by kind, hubs), read
from real facts; ``reverie graph neighbours|map [--json]`` on the store,
read-only, with no runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.memories.facts import FactIn
from runtime.memories.graph_views import graph_map, neighbours
from runtime.memories.refs import Ref
from runtime.memory import Memory

ROOT = Path(__file__).resolve().parent.parent


def fact(memory: Memory, subject: str, key: str, value: str,
         kind: str = "user_specific") -> str:
    fact_id, _ = memory.add_fact(FactIn(kind=kind, subject=subject, key=key, value=value))
    return f"fact:{fact_id}"


@pytest.fixture
def household(memory: Memory) -> dict[str, str]:
    """Ana, Rui, Maria and the cat, with the facts that link them."""
    return {
        "ana_city": fact(memory, "Ana", "lives_in", "Porto"),
        "ana_job": fact(memory, "Ana", "occupation", "nurse at the night shift"),
        "ana_spouse": fact(memory, "Ana", "married_to", "Rui"),
        "ana_daughter": fact(memory, "Ana", "daughter", "Maria"),
        "rui_job": fact(memory, "Rui", "occupation", "carpenter"),
        "maria_pet": fact(memory, "Maria", "pet", "Tobias the cat"),
        "tobias": fact(memory, "Tobias", "species", "a grey cat"),
        "clinic": fact(memory, "clinic", "address", "Rua das Flores 12", kind="place"),
        "rui_old": fact(memory, "Rui", "hobby", "fishing with ana on sundays"),
    }


def test_neighbours_of_a_subject(memory: Memory, household: dict[str, str]) -> None:
    view = neighbours(memory.store, "ana")  # case aside
    assert view["subject"] == "Ana"
    assert [f["ref"] for f in view["facts"]] == [household[k] for k in (
        "ana_city", "ana_job", "ana_spouse", "ana_daughter")]
    assert [f["ref"] for f in view["named_in"]] == [household["rui_old"]]
    linked = {n["subject"]: n["via"] for n in view["linked"]}
    assert linked == {"Rui": [household["ana_spouse"], household["rui_old"]],
                      "Maria": [household["ana_daughter"]]}
    assert view["linked"][0]["subject"] == "Rui"  # most links first


def test_a_value_names_a_subject_only_as_whole_words(memory: Memory) -> None:
    fact(memory, "Ana", "note", "bought anagrams for the crossword")
    fact(memory, "anagrams", "kind", "a word game")  # a subject that contains "ana"
    fact(memory, "Rui", "note", "Ana's brother")
    fact(memory, "Maria", "likes", "banana bread")  # "ana" inside a word: no link
    view = neighbours(memory.store, "Ana")
    assert {n["subject"] for n in view["linked"]} == {"anagrams", "Rui"}


def test_only_live_facts_count(memory: Memory, household: dict[str, str]) -> None:
    memory.change(Ref("fact", int(household["ana_spouse"][5:])), "disable")
    fact(memory, "Ana", "daughter", "Maria Joana")  # supersedes: the old window closes
    view = neighbours(memory.store, "Ana")
    refs = [f["ref"] for f in view["facts"]]
    assert household["ana_spouse"] not in refs and household["ana_daughter"] not in refs
    assert {n["subject"] for n in view["linked"]} == {"Rui", "Maria"}
    assert {n["subject"]: n["via"] for n in view["linked"]}["Rui"] == [household["rui_old"]]


def test_an_unknown_subject_has_no_neighbours_and_an_empty_one_is_refused(
        memory: Memory, household: dict[str, str]) -> None:
    assert neighbours(memory.store, "Zeca") == {
        "subject": "Zeca", "facts": [], "named_in": [], "linked": []}
    with pytest.raises(ValueError, match="a subject is needed"):
        neighbours(memory.store, "   ")


def test_the_map_counts_by_kind_and_ranks_the_hubs(memory: Memory,
                                                   household: dict[str, str]) -> None:
    view = graph_map(memory.store, hubs=3)
    assert view["facts"] == 9 and view["subjects"] == 5
    assert view["kinds"] == {"user_specific": 8, "place": 1}
    # links: Ana->Rui, Ana->Maria, Maria->Tobias, Rui->Ana
    assert view["links"] == 4
    assert view["hubs"] == [
        {"subject": "Ana", "facts": 4, "links": 3, "degree": 7},
        {"subject": "Rui", "facts": 2, "links": 2, "degree": 4},
        {"subject": "Maria", "facts": 1, "links": 2, "degree": 3},
    ]
    with pytest.raises(ValueError, match="hubs must be between"):
        graph_map(memory.store, hubs=0)


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REVERIE_DATA_DIR": str(data_dir)}
    env.pop("REVERIE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_reverie_graph_reads_the_store_without_a_runtime(
        memory: Memory, household: dict[str, str]) -> None:
    data = memory.settings.store.resolved_dir
    near = _cli(data, "graph", "neighbours", "Ana", "--json")
    assert near.returncode == 0, near.stderr
    assert json.loads(near.stdout) == neighbours(memory.store, "Ana")
    shown = _cli(data, "graph", "neighbours", "Maria")
    assert shown.returncode == 0 and "Tobias (1)" in shown.stdout and "Ana (1)" in shown.stdout
    mapped = _cli(data, "graph", "map", "--json", "--hubs", "2")
    assert mapped.returncode == 0, mapped.stderr
    assert json.loads(mapped.stdout) == graph_map(memory.store, hubs=2)
    text = _cli(data, "graph", "map")
    assert text.returncode == 0 and "9 facts about 5 subjects, 4 links" in text.stdout
    bad = _cli(data, "graph", "map", "--hubs", "0")
    assert bad.returncode != 0 and "hubs must be between" in bad.stderr
