"""Pictures of memory (runtime/memories/viz.py, ``reverie viz``): real stores, real PNGs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import apsw
import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.dates import num2date
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from PIL import Image

from runtime.config import Settings
from runtime.memories import viz
from runtime.memories.decay import episode_weight
from runtime.memories.episodes import EpisodeIn
from runtime.memories.facts import FactIn
from runtime.memories.refs import parse_ref
from runtime.memories.transcript import TurnIn
from runtime.memory import Memory
from runtime.mind import clustering
from runtime.time.clock import DAY, ManualClock, household_zone

ZONE = "America/New_York"  # UTC-5 in November: local midnight is 05:00 UTC


def _episode(memory: Memory, gist: str, **fields: Any) -> int:
    return memory.add_episode(EpisodeIn(channel="voice", source="user", gist=gist, **fields))


def _png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        img.verify()
        return img.size


def _collections(fig: Figure, gid: str) -> list[Any]:
    return [c for ax in fig.axes for c in ax.collections if c.get_gid() == gid]


def _lines(fig: Figure, gid: str) -> list[Line2D]:
    return [ln for ax in fig.axes for ln in ax.lines if ln.get_gid() == gid]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _seed_some(memory: Memory, clock: ManualClock) -> None:
    memory.add_turns([TurnIn(channel="voice", source="user", content=f"turn {i}",
                             created_at=clock.now() - i * DAY) for i in range(5)])
    for i in range(3):
        _episode(memory, f"Something that happened, number {i}.")
    memory.add_fact(FactIn(kind="user_specific", subject="user", key="tea",
                           value="likes green tea"))


def test_each_picture_is_a_png_of_the_expected_size(
        memory: Memory, clock: ManualClock) -> None:
    _seed_some(memory, clock)
    for kind in viz.KINDS:
        data = viz.render(kind, memory.store, memory.settings)
        assert _png_size(data) == (1000, 600), kind


def test_an_unknown_picture_is_a_value_error(memory: Memory) -> None:
    with pytest.raises(ValueError, match="unknown picture"):
        viz.render("pie", memory.store, memory.settings)


def test_an_empty_store_draws_empty_charts_not_errors(memory: Memory) -> None:
    expected = {"map": "no episodes yet", "timeline": "no memories yet",
                "decay": "no episodes yet"}
    for kind, text in expected.items():
        assert text in _texts(viz.figure(kind, memory.store, memory.settings)), kind
        assert _png_size(viz.render(kind, memory.store, memory.settings)) == (1000, 600)


def test_the_map_draws_one_point_per_episode_coloured_by_its_roll_up(
        memory: Memory) -> None:
    leaves = [_episode(memory, f"We talked about the garden, part {i}.") for i in range(6)]
    rolled = leaves[:3]
    theme = _episode(memory, "The garden: a summary.", level=1, children=rolled)
    hidden = _episode(memory, "Something the user hid.")
    memory.change(parse_ref(f"episode:{hidden}"), "disable")
    # The rolled-up leaves lost their vectors (tombstoned): drawn around their parent.
    assert memory.store.scalar(
        f"SELECT count(*) FROM vectors WHERE kind = 'episode' AND item_id IN"
        f" ({', '.join(map(str, rolled))})") == 0

    fig = viz.figure("map", memory.store, memory.settings)
    (leaf_dots,) = _collections(fig, "level-0")
    (theme_dots,) = _collections(fig, "level-1")
    assert isinstance(leaf_dots, PathCollection)
    assert len(leaf_dots.get_offsets()) == 6
    assert len(theme_dots.get_offsets()) == 1
    points = {p.episode_id: p for p in viz.memory_map(memory.store).points}
    assert set(points) == {*leaves, theme}
    # What is drawn is what memory_map placed, in episode order.
    drawn = np.asarray(leaf_dots.get_offsets())
    assert np.allclose(drawn, [(points[i].x, points[i].y) for i in leaves])
    # A rolled-up leaf has its theme's colour; a leaf never rolled up is grey.
    theme_colour = theme_dots.get_facecolors()[0]
    colours = leaf_dots.get_facecolors()
    for i, episode_id in enumerate(leaves):
        if episode_id in rolled:
            assert np.allclose(colours[i], theme_colour)
            assert not points[episode_id].embedded
        else:
            assert np.allclose(colours[i][:3], (0xb0 / 255,) * 3)
            assert points[episode_id].embedded
    (links,) = _collections(fig, "links")
    assert isinstance(links, LineCollection) and len(links.get_segments()) == 3


def test_the_map_projection_separates_what_the_embeddings_separate(
        memory: Memory) -> None:
    ids = [_episode(memory, f"Episode {i}.") for i in range(40)]
    vectors, truth = clustering.synthetic(40, 2, seed=5)
    memory.indexer.put("episode", ids, vectors)
    points = {p.episode_id: p for p in viz.memory_map(memory.store).points}
    xs = np.array([points[i].x for i in ids])
    # The first axis is the one the two groups differ along.
    assert xs[truth == 0].max() < xs[truth == 1].min() or \
        xs[truth == 1].max() < xs[truth == 0].min()
    again = viz.memory_map(memory.store).points
    assert [(p.x, p.y) for p in again] == [(points[i].x, points[i].y) for i in ids]


def test_the_timeline_counts_turns_per_day_in_the_household_zone(
        memory: Memory, make_settings: Callable[..., Settings]) -> None:
    zone = ZoneInfo(ZONE)

    def at(day: int, hour: int, minute: int) -> float:
        return datetime(2023, 11, day, hour, minute, tzinfo=zone).timestamp()

    # Late evening of the 14th and just after midnight of the 15th, local time:
    # all five are on the 15th in UTC.
    times = [at(14, 23, 0), at(14, 23, 20), at(14, 23, 40), at(15, 0, 10), at(15, 0, 30),
             at(17, 12, 0)]
    memory.add_turns([TurnIn(channel="voice", source="user", content=f"turn {i}",
                             created_at=t) for i, t in enumerate(times)])
    _episode(memory, "An evening chat.", started_at=at(14, 23, 0))
    settings = make_settings(household={"timezone": ZONE})

    fig = viz.figure("timeline", memory.store, settings, now=at(18, 9, 0))
    heights: dict[date, float] = {}
    for ax in fig.axes:
        for patch in ax.patches:
            if isinstance(patch, Rectangle) and patch.get_gid() == "turns" \
                    and patch.get_height() > 0:
                middle = patch.get_x() + patch.get_width() / 2
                heights[num2date(middle).date()] = patch.get_height()
    assert heights == {date(2023, 11, 14): 3, date(2023, 11, 15): 2, date(2023, 11, 17): 1}
    assert viz.turns_per_day(memory.store, zone) == heights
    assert _png_size(viz.render("timeline", memory.store, settings)) == (1000, 600)


def test_the_decay_curves_use_runtime_decay_and_mark_todays_weight(
        memory: Memory, clock: ManualClock) -> None:
    made: list[int] = []
    for i in range(14):
        level = 1 if i % 5 == 4 else 0
        memory_level = ("normal", "vivid", "faint", "seared")[i % 4]
        made.append(_episode(memory, f"Memory {i}.", level=level,
                             memory_level=memory_level))
        clock.advance(3 * DAY)
    memory.episodes.touch([made[-2]], clock.now())  # relevant again: its decay restarts
    now = clock.now() + 10 * DAY

    fig = viz.figure("decay", memory.store, memory.settings, now=now)
    newest = made[-viz.DECAY_SAMPLE:]
    drawn = {int(str(ln.get_gid()).split(":")[1]) for ax in fig.axes for ln in ax.lines
             if str(ln.get_gid()).startswith("now:")}
    assert drawn == set(newest)  # the 12 most recent; the two oldest left out
    x_now = viz._local(now, household_zone(memory.settings.household.timezone))
    weights = set()
    for episode_id in newest:
        row = memory.episodes.get(episode_id)
        assert row is not None
        expected = episode_weight(row["level"], row["last_relevant_at"], now,
                                  memory_level=row["memory_level"])
        (point,) = _lines(fig, f"now:{episode_id}")
        assert point.get_xdata()[0] == pytest.approx(x_now)
        assert point.get_ydata()[0] == pytest.approx(expected, rel=1e-12)
        (curve,) = _lines(fig, f"episode:{episode_id}")
        ys = np.asarray(curve.get_ydata())
        assert ys[0] == pytest.approx(1.0)  # last relevant: full weight
        assert np.all(np.diff(ys) <= 1e-12)  # never rises
        weights.add(round(expected, 6))
    assert len(weights) > 3  # levels and memory levels make different curves


def test_the_read_only_store_reads_beside_a_writer_and_never_writes(
        memory: Memory, clock: ManualClock, make_settings: Callable[..., Settings]) -> None:
    _seed_some(memory, clock)
    settings = make_settings()
    with viz.open_read_only(settings) as store:
        assert _png_size(viz.render("map", store, settings)) == (1000, 600)
        with pytest.raises(apsw.ReadOnlyError):
            store.insert("test", "transcript", {
                "channel": "voice", "source": "user", "role": "user",
                "content": "nope", "created_at": 1.0})
        memory.add_turn(TurnIn(channel="voice", source="user", content="while reading"))
        assert store.counts()["transcript"] == 6
    with pytest.raises(ValueError, match="no memory database"):
        viz.open_read_only(make_settings(store={"data_dir": str(Path(settings.store.path)
                                                                .parent / "elsewhere")}))


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REVERIE_DATA_DIR": str(data_dir),
           "REVERIE_HOUSEHOLD__TIMEZONE": ZONE}
    env.pop("REVERIE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_reverie_viz_writes_a_png_without_a_runtime(
        memory: Memory, clock: ManualClock, tmp_path: Path) -> None:
    _seed_some(memory, clock)
    data_dir = memory.settings.store.resolved_dir
    out = tmp_path / "pictures" / "timeline.png"
    out.parent.mkdir()

    done = _cli(data_dir, "viz", "timeline", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert _png_size(out.read_bytes()) == (1000, 600)

    inside = data_dir / "timeline.png"
    refused = _cli(data_dir, "viz", "map", "--out", str(inside))
    assert refused.returncode == 2 and "data directory" in refused.stderr
    assert not inside.exists()
    bad_kind = _cli(data_dir, "viz", "pie", "--out", str(out))
    assert bad_kind.returncode == 2
    no_store = _cli(tmp_path / "empty", "viz", "decay", "--out", str(out))
    assert no_store.returncode == 2 and "no memory database" in no_store.stderr
    no_dir = _cli(data_dir, "viz", "decay", "--out", str(tmp_path / "missing" / "x.png"))
    assert no_dir.returncode == 2 and "cannot write" in no_dir.stderr
