"""Disabling is reversible (issue 24, item 4): the decay job never deletes a
disabled row, even once consolidation has moved the watermark past it."""

from __future__ import annotations

from collections.abc import Callable

from runtime.config import Settings
from runtime.memories.episodes import EpisodeIn
from runtime.memories.refs import parse_ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import janitor
from runtime.mind.distil import distil
from runtime.time.clock import DAY, ManualClock

LINES = [
    "We booked the train to Porto for the second of May.",
    "My sister Ana will meet us at the station.",
    "Please never mention the surprise party to Ana.",
    "The hotel is near the river, we paid the deposit.",
    "We still need to buy a guide book about Porto.",
]


def test_a_disabled_turn_outlives_consolidation_and_the_janitor_and_can_be_enabled(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    ids = []
    for text in LINES:
        ids.append(memory.add_turn(TurnIn(channel="voice", source="user", content=text)))
        clock.advance(60)
    hidden = ids[2]
    memory.change(parse_ref(f"turn:{hidden}"), "disable")
    clock.advance(DAY / 2)  # the window is closed

    distil(memory.job_context())  # consolidation: skips the disabled turn
    watermark = memory.transcript.watermark("voice")
    assert watermark is not None and watermark >= ids[-1]  # moved past it

    janitor.run(memory.job_context(settings=make_settings()))

    row = memory.transcript.get(hidden)
    assert row is not None and row["disabled"] == 1
    memory.change(parse_ref(f"turn:{hidden}"), "enable")  # not "no turn N"
    row = memory.transcript.get(hidden)
    assert row is not None and row["disabled"] == 0

    # Enabled again, it stays: consolidation does not go back for it, and
    # the next decay run does not delete it either.
    memory.add_turn(TurnIn(channel="voice", source="user", content="A later turn."))
    clock.advance(DAY)
    distil(memory.job_context())
    assert (memory.transcript.watermark("voice") or 0) > watermark  # compacted again
    janitor.run(memory.job_context(settings=make_settings()))
    assert memory.transcript.get(hidden) is not None


def test_a_disabled_tombstoned_episode_is_not_purged(
        memory: Memory, make_settings: Callable[..., Settings], clock: ManualClock) -> None:
    kept = memory.add_episode(EpisodeIn(channel="voice", source="user", gist="Kept leaf."))
    gone = memory.add_episode(EpisodeIn(channel="voice", source="user", gist="Purged leaf."))
    memory.change(parse_ref(f"episode:{kept}"), "disable")
    memory.add_episode(EpisodeIn(channel="voice", source="user", level=1,
                                 gist="Their parent.", children=[kept, gone]))
    clock.advance(31 * DAY)  # both tombstoned more than 30 days ago

    janitor.run(memory.job_context(settings=make_settings()))

    assert memory.episodes.get(gone) is None
    assert memory.episodes.get(kept) is not None
    memory.change(parse_ref(f"episode:{kept}"), "enable")
