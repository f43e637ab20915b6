"""The word-for-word support check, and the doctor's list of unsupported facts."""

from __future__ import annotations

from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind.support import Unsupported, missing_terms, salient_terms, unsupported_facts


def test_salient_terms_are_names_places_and_dates() -> None:
    assert salient_terms("Ana's flight", "lands in New York on May 5th, 2024 at 7:30") == [
        "Ana", "New", "York", "May", "5th", "2024", "7:30"]
    assert salient_terms("user", "The spare key is under the pot. I know.") == []


def test_missing_terms_whole_words_ignoring_case() -> None:
    turn = "Caroline: my sister ana lives in porto since May 5th"
    assert missing_terms("Ana", "Porto", [turn]) == []
    assert missing_terms("Caroline", "loves the ocean", [turn]) == []  # the speaker counts
    assert missing_terms("Anabel", "Porto", [turn]) == ["Anabel"]  # not a prefix match
    assert missing_terms("Ana", "Port", [turn]) == ["Port"]  # nor a part of a word
    assert missing_terms("Ana", "since May 6th", [turn]) == ["6th"]
    assert missing_terms("Ana", "Lisbon", [turn, "Melanie: we love Lisbon"]) == []


def test_unsupported_facts_lists_what_the_cited_turns_do_not_say(memory: Memory) -> None:
    porto = memory.add_turn(TurnIn(channel="c", source="user", speaker="Caroline",
                                   content="I live in Porto."))
    episode = memory.add_episode(EpisodeIn(channel="c", source="user", gist="g",
                                           cites=[porto]))
    good, _ = memory.add_fact(FactIn(kind="place", subject="Caroline", key="lives_in",
                                     value="Porto", provenance=[f"turn:{porto}"]))
    bad, _ = memory.add_fact(FactIn(kind="place", subject="Caroline", key="grew_up_in",
                                    value="Madrid", provenance=[f"turn:{porto}"]))
    via_episode, _ = memory.add_fact(FactIn(kind="user_specific", subject="Ana",
                                            key="relation_to_caroline", value="sister",
                                            provenance=[f"episode:{episode}"]))
    # Nothing cited, or cited turns gone: cannot be checked, not listed.
    memory.add_fact(FactIn(kind="place", subject="user", key="gym", value="Fitness Hut"))
    oslo = memory.add_turn(TurnIn(channel="c", source="user", speaker="Bob",
                                  content="I live in Oslo."))
    memory.add_fact(FactIn(kind="place", subject="Bob", key="lives_in", value="Oslo",
                           provenance=[f"turn:{oslo}"]))
    memory.store.delete("janitor", "transcript", oslo)  # pruned since (a write citing a
    # turn already gone is refused: runtime.memories.cited)
    assert unsupported_facts(memory.store) == [
        Unsupported(bad, "Caroline", "grew_up_in", ("Madrid",)),
        Unsupported(via_episode, "Ana", "relation_to_caroline", ("Ana",)),
    ]
    assert good not in [u.fact_id for u in unsupported_facts(memory.store)]
