"""Pictures of memory, for people who would rather look than read.

Three pictures, each drawn from the store alone (no runtime, no embedder, no
model) with matplotlib's Agg renderer into PNG bytes; pyplot and GUI backends
are never touched, so rendering is safe inside a server and in a headless CLI:

- ``map``: every episode in two dimensions. Episodes with an embedding (the
  ``vectors`` table) are projected on the first two principal components of
  their unit-length embeddings (numpy SVD: deterministic, milliseconds for a
  thousand episodes; UMAP would cost a numba compile in a fresh process). An
  episode that was rolled up (tombstoned, its vector dropped) is drawn around
  the episode it was rolled into (``parent_id``), and a thin line joins every
  child to its parent. Marker shape is the level (leaf, theme, era); colour is
  the roll-up cluster: a parent and the children rolled into it share a
  colour, episodes never rolled up are grey. Episodes not embedded yet (and
  with no drawn parent) are counted in the subtitle, not drawn. Disabled
  episodes are hidden here as everywhere.
- ``timeline``: turns per day as bars (days in the household's time zone,
  ``household.timezone``), and below them a strip of markers: live episodes
  (by level, at the start of what they tell) and facts (when recorded; hollow
  once superseded).
- ``decay``: the retrieval weight of the most recent episodes over time, from
  when each was last relevant to some days past now, as
  :func:`runtime.memories.decay.episode_weight` computes it, with today's weight marked.

The pictures carry ids, levels and dates, never memory content (gists, turns,
fact values). :func:`render` returns PNG bytes; :func:`figure` returns the
matplotlib Figure itself (tests read what was plotted from it). The artists a
reader may look for carry a ``gid``: ``level-0``/``level-1``/``level-2`` (the
map's scatters), ``links`` (its child-parent lines), ``turns`` (the timeline's
bars: one per day with turns), ``episode:<id>`` and ``now:<id>`` (a decay curve
and its current point).

:func:`open_read_only` opens the configured database without writing to it
(read-only connection, ``query_only``; no migration, no fact-kind sync), which
is safe beside the running runtime: the store is in WAL mode, so readers never
block its writers.
"""

from __future__ import annotations

import io
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from datetime import time as dtime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import apsw
import numpy as np

from runtime.config import Settings
from runtime.memories.decay import MEMORY_LEVELS, MemoryLevel, episode_weight
from runtime.store.database import Store
from runtime.time.clock import DAY, SystemClock, household_zone

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

KINDS = ("map", "timeline", "decay")
WIDTH_IN, HEIGHT_IN, DPI = 10.0, 6.0, 100  # 1000 x 600 pixels
DECAY_SAMPLE = 12  # episodes drawn in the decay picture: the most recent ones
DECAY_HORIZON_DAYS = 30.0  # how far past now the decay curves run
CURVE_POINTS = 200

LEVEL_NAMES: dict[int, str] = {0: "leaf", 1: "theme", 2: "era"}
_LEVEL_STYLE: dict[int, tuple[str, float]] = {0: ("o", 22.0), 1: ("s", 70.0), 2: ("*", 220.0)}
_LEVEL_COLOUR: dict[int, str] = {0: "#4477aa", 1: "#ee6677", 2: "#228833"}
_UNCLUSTERED = "#b0b0b0"
_GOLDEN_ANGLE = math.pi * (3.0 - math.sqrt(5.0))

# Matplotlib keeps some global state (font cache, text layout): one picture at a time.
_lock = threading.Lock()


# -- opening the store ----------------------------------------------------------


class ReadOnlyStore(Store):
    """A :class:`Store` over a read-only connection: its read methods work, any
    write fails (SQLITE_READONLY). Opening it migrates nothing, syncs nothing
    and creates nothing but SQLite's -wal and -shm files beside a WAL database
    (given the database file's mode by SQLite). It has no ``fact_kinds``: only
    the write path uses them."""

    def __init__(self, path: Path, busy_timeout_ms: int = 5000) -> None:
        # Store.__init__ is not called: it creates the file, migrates and writes
        # the fact kinds. Only the attributes the read path uses are set.
        self.path = Path(path)
        self.clock = SystemClock()
        self._expiring_write_log = False
        self.applied_migrations = []
        self.conn = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            self.conn.setbusytimeout(busy_timeout_ms)
            self.conn.execute("PRAGMA query_only = ON")
            if self.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                           " AND name IN ('episodes', 'transcript', 'facts', 'vectors')") != 4:
                raise ValueError(f"{self.path} is not a Reverie memory database")
        except BaseException:
            self.conn.close()
            raise


def open_read_only(settings: Settings) -> Store:
    """The configured memory database, read-only; ValueError if there is none."""
    path = settings.store.path
    if not path.is_file():
        raise ValueError(f"no memory database at {path} (check REVERIE_DATA_DIR or "
                         "store.data_dir)")
    try:
        return ReadOnlyStore(path, settings.store.busy_timeout_ms)
    except apsw.Error as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


# -- the data -------------------------------------------------------------------


@dataclass(frozen=True)
class MapPoint:
    episode_id: int
    level: int
    x: float
    y: float
    parent_id: int | None
    group: int | None  # the roll-up cluster: the id of the parent that heads it
    embedded: bool  # placed by its own embedding (else: around its parent)


@dataclass(frozen=True)
class MemoryMap:
    points: list[MapPoint]
    episodes: int  # episodes considered (not disabled), drawn or not
    unplaced: int  # of those, not drawn: no embedding and no drawn parent


def project(vectors: np.ndarray) -> np.ndarray:
    """Rows of ``vectors`` (n x d) as n x 2 coordinates on the first two principal
    components of the unit-length rows. Deterministic: each component's sign is
    fixed so that its largest loading is positive."""
    x = np.asarray(vectors, dtype=np.float64)
    out = np.zeros((len(x), 2))
    if len(x) < 2:
        return out
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    for j in range(min(2, len(vt))):
        component = vt[j]
        if component[np.argmax(np.abs(component))] < 0:
            component = -component
        out[:, j] = centred @ component
    return out


def memory_map(store: Store) -> MemoryMap:
    """Where each episode goes on the map (see the module docstring)."""
    rows = store.rows(
        "SELECT e.id, e.level, e.parent_id, v.model, v.vec FROM episodes e"
        " LEFT JOIN vectors v ON v.kind = 'episode' AND v.item_id = e.id"
        " WHERE e.disabled = 0 ORDER BY e.id")
    if not rows:
        return MemoryMap([], 0, 0)
    # One embedding model and dimension (a model change leaves a mix until re-embedded).
    shapes = Counter((r["model"], len(r["vec"])) for r in rows if r["vec"] is not None)
    shape = shapes.most_common(1)[0][0] if shapes else None
    embedded = [r for r in rows
                if r["vec"] is not None and (r["model"], len(r["vec"])) == shape]
    xy: dict[int, tuple[float, float]] = {}
    if embedded:
        coords = project(np.vstack([np.frombuffer(r["vec"], dtype=np.float32)
                                    for r in embedded]))
        xy = {int(r["id"]): (float(c[0]), float(c[1])) for r, c in zip(embedded, coords)}
    own = set(xy)
    # The rest go around their parent, parents first (a parent is one level up).
    span = float(np.ptp(np.array(list(xy.values())), axis=0).max()) if len(xy) > 1 else 1.0
    # Each parent's rolled-up children fill a disc of the same size, however many.
    radius = 0.05 * (span or 1.0)
    waiting = Counter(int(r["parent_id"]) for r in rows
                      if r["parent_id"] is not None and int(r["id"]) not in xy)
    around: Counter[int] = Counter()
    for r in sorted((r for r in rows if int(r["id"]) not in xy),
                    key=lambda r: (-int(r["level"]), int(r["id"]))):
        parent = r["parent_id"]
        if parent is None or int(parent) not in xy:
            continue
        k = around[int(parent)]
        around[int(parent)] += 1
        px, py = xy[int(parent)]
        angle, dist = k * _GOLDEN_ANGLE, radius * math.sqrt((k + 1) / waiting[int(parent)])
        xy[int(r["id"])] = (px + dist * math.cos(angle), py + dist * math.sin(angle))
    heads = {int(r["parent_id"]) for r in rows if r["parent_id"] is not None}
    points = []
    for r in rows:
        episode_id = int(r["id"])
        if episode_id not in xy:
            continue
        parent_id = None if r["parent_id"] is None else int(r["parent_id"])
        group = episode_id if episode_id in heads else parent_id
        x, y = xy[episode_id]
        points.append(MapPoint(episode_id, int(r["level"]), x, y, parent_id, group,
                               episode_id in own))
    return MemoryMap(points, len(rows), len(rows) - len(points))


def turns_per_day(store: Store, zone: tzinfo) -> dict[date, int]:
    """How many turns (transcript rows) fell on each day, days in ``zone``."""
    days: Counter[date] = Counter()
    for (created_at,) in store.conn.execute("SELECT created_at FROM transcript"):
        days[datetime.fromtimestamp(created_at, zone).date()] += 1
    return dict(sorted(days.items()))


@dataclass(frozen=True)
class DecayCurve:
    episode_id: int
    level: int
    memory_level: MemoryLevel
    last_relevant_at: float
    times: list[float]
    weights: list[float]
    now: float
    now_weight: float


def decay_curves(store: Store, now: float, sample: int = DECAY_SAMPLE,
                 horizon_days: float = DECAY_HORIZON_DAYS) -> list[DecayCurve]:
    """The weight over time of the ``sample`` most recent live episodes (newest
    first), from when each was last relevant to ``horizon_days`` past ``now``."""
    rows = store.rows(
        "SELECT id, level, memory_level, last_relevant_at FROM episodes"
        " WHERE tombstoned_at IS NULL AND disabled = 0"
        " ORDER BY created_at DESC, id DESC LIMIT ?", (sample,))
    end = now + horizon_days * DAY
    curves = []
    for r in rows:
        level, since = int(r["level"]), float(r["last_relevant_at"])
        memory_level = _memory_level(r["memory_level"])
        times = np.linspace(min(since, now), end, CURVE_POINTS).tolist()
        weights = [episode_weight(level, since, t, memory_level=memory_level) for t in times]
        curves.append(DecayCurve(
            int(r["id"]), level, memory_level, since, times, weights, now,
            episode_weight(level, since, now, memory_level=memory_level)))
    return curves


def _memory_level(value: Any) -> MemoryLevel:
    return cast(MemoryLevel, value) if value in MEMORY_LEVELS else "normal"


# -- the pictures -----------------------------------------------------------------


def figure(kind: str, store: Store, settings: Settings, now: float | None = None) -> Figure:
    """The picture ``kind`` (``map``, ``timeline`` or ``decay``) as a matplotlib
    Figure on the Agg canvas; ValueError for another kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown picture {kind!r} (expected one of {', '.join(KINDS)})")
    when = store.clock.now() if now is None else float(now)
    zone = household_zone(settings.household.timezone)
    fig = _new_figure()
    if kind == "map":
        _draw_map(fig, memory_map(store))
    elif kind == "timeline":
        _draw_timeline(fig, store, zone, when)
    else:
        _draw_decay(fig, decay_curves(store, when), zone)
    return fig


def render(kind: str, store: Store, settings: Settings, now: float | None = None) -> bytes:
    """The picture ``kind`` (``map``, ``timeline`` or ``decay``) as PNG bytes;
    ValueError for another kind. ``now`` defaults to the store's clock."""
    started = time.perf_counter()
    with _lock:
        data = to_png(figure(kind, store, settings, now))
    log.debug("picture drawn", extra={"kind": kind, "bytes": len(data),
                                      "seconds": round(time.perf_counter() - started, 3)})
    return data


def to_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def render_to_file(kind: str, settings: Settings, out: Path, now: float | None = None) -> Path:
    """``reverie viz``: draw ``kind`` from the configured store (read-only) into
    ``out``; return the path written. ValueError for an unknown kind, a missing
    database or an ``out`` inside the data directory (the database, its index
    and the runtime's secrets live there: a picture never overwrites them)."""
    if kind not in KINDS:
        raise ValueError(f"unknown picture {kind!r} (expected one of {', '.join(KINDS)})")
    out = Path(out).expanduser()
    target = out.resolve()
    data_dir = settings.store.resolved_dir.resolve()
    if target == data_dir or data_dir in target.parents:
        raise ValueError(f"{out}: will not write into the data directory {data_dir}")
    with open_read_only(settings) as store:
        data = render(kind, store, settings, now)
    try:
        out.write_bytes(data)
    except OSError as exc:
        raise ValueError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def _new_figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _nothing(ax: Axes, text: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
            fontsize=18, color="#555555")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _zone_name(zone: tzinfo) -> str:
    return str(getattr(zone, "key", None) or zone.tzname(datetime.now(zone)) or "local")


def _local(stamp: float, zone: tzinfo) -> float:
    """A time as a matplotlib date number of its wall-clock time in ``zone``."""
    from matplotlib.dates import date2num

    return float(date2num(datetime.fromtimestamp(stamp, zone).replace(tzinfo=None)))


def _date_axis(ax: Axes) -> None:
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))


def _draw_map(fig: Figure, m: MemoryMap) -> None:
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D

    ax = fig.add_subplot()
    if not m.points:
        _nothing(ax, "no episodes yet" if m.episodes == 0
                 else f"no episode embedded yet ({_plural(m.episodes, 'episode')})")
        ax.set_title("Memory map")
        return
    groups = sorted({p.group for p in m.points if p.group is not None})
    palette = [to_hex(c) for c in _palette()]
    colour = {g: palette[i % len(palette)] for i, g in enumerate(groups)}
    where = {p.episode_id: (p.x, p.y) for p in m.points}
    links = [(where[p.episode_id], where[p.parent_id]) for p in m.points
             if p.parent_id is not None and p.parent_id in where]
    if links:
        ax.add_collection(LineCollection(links, colors="#999999", linewidths=0.5, alpha=0.6,
                                         zorder=1, gid="links"))
    counts = Counter(p.level for p in m.points)
    for level in sorted(counts):
        pts = [p for p in m.points if p.level == level]
        marker, size = _LEVEL_STYLE.get(level, ("o", 22.0))
        ax.scatter([p.x for p in pts], [p.y for p in pts], s=size, marker=marker,
                   c=[_UNCLUSTERED if p.group is None else colour[p.group] for p in pts],
                   edgecolors="#333333", linewidths=0.4, zorder=2 + level, gid=f"level-{level}",
                   label=f"{LEVEL_NAMES.get(level, level)} ({counts[level]})")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(handles=[  # the scatters' own handles would wear a cluster's colour
        Line2D([], [], linestyle="none", marker=_LEVEL_STYLE.get(level, ("o", 22.0))[0],
               markersize=math.sqrt(_LEVEL_STYLE.get(level, ("o", 22.0))[1]),
               color="#666666", label=f"{LEVEL_NAMES.get(level, level)} ({counts[level]})")
        for level in sorted(counts)], loc="best", fontsize=9, title="level",
        title_fontsize=9)
    title = f"Memory map: {_plural(len(m.points), 'episode')}"
    note = "episodes projected on their embeddings' two main axes; colour: roll-up cluster"
    if m.unplaced:
        note += f"; {m.unplaced} not embedded yet, not shown"
    ax.set_title(f"{title}\n{note}", fontsize=11)


def _palette() -> Sequence[Any]:
    """Cluster colours: tab20's strong ones first, then its pale ones; no greys
    (grey is for episodes never rolled up)."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]
    return [tab20(i) for i in [*range(0, 20, 2), *range(1, 20, 2)] if i not in (14, 15)]


def _draw_timeline(fig: Figure, store: Store, zone: tzinfo, now: float) -> None:
    days = turns_per_day(store, zone)
    episodes = store.rows(
        "SELECT coalesce(started_at, created_at) AS at, level FROM episodes"
        " WHERE tombstoned_at IS NULL AND disabled = 0")
    facts = store.rows("SELECT recorded_at AS at, valid_to FROM facts WHERE disabled = 0")
    if not days and not episodes and not facts:
        ax = fig.add_subplot()
        _nothing(ax, "no memories yet")
        ax.set_title("Memories over time")
        return
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    from matplotlib.dates import date2num

    noon = [float(date2num(datetime.combine(d, dtime(12)))) for d in days]
    top.bar(noon, list(days.values()), width=0.9, color="#4477aa", gid="turns")
    top.set_ylabel("turns per day")
    top.set_title(f"Memories over time: {_plural(sum(days.values()), 'turn')},"
                  f" {_plural(len(episodes), 'episode')}, {_plural(len(facts), 'fact')}",
                  fontsize=11)
    for level in (0, 1, 2):
        xs = [_local(e["at"], zone) for e in episodes if e["level"] == level]
        if xs:
            bottom.scatter(xs, [level + 1] * len(xs), marker=_LEVEL_STYLE[level][0], s=30,
                           color=_LEVEL_COLOUR[level], gid=f"episodes-{level}")
    current = [_local(f["at"], zone) for f in facts if f["valid_to"] is None]
    superseded = [_local(f["at"], zone) for f in facts if f["valid_to"] is not None]
    if current:
        bottom.scatter(current, [0] * len(current), marker="D", s=22, color="#aa3377",
                       gid="facts")
    if superseded:
        bottom.scatter(superseded, [0] * len(superseded), marker="D", s=22,
                       facecolors="none", edgecolors="#aa3377", gid="facts-superseded")
    bottom.set_yticks([0, 1, 2, 3], ["facts", "leaves", "themes", "eras"])
    bottom.set_ylim(-0.7, 3.7)
    for ax in (top, bottom):
        ax.axvline(_local(now, zone), color="#777777", linestyle=":", linewidth=1)
        ax.grid(axis="x", alpha=0.3)
    _date_axis(bottom)
    bottom.set_xlabel(f"date ({_zone_name(zone)}); dotted: now")


def _draw_decay(fig: Figure, curves: list[DecayCurve], zone: tzinfo) -> None:
    ax = fig.add_subplot()
    if not curves:
        _nothing(ax, "no episodes yet")
        ax.set_title("Decay of memories")
        return
    now = curves[0].now
    styles = {"faint": ":", "normal": "-", "vivid": "--", "seared": "-."}
    for c in curves:
        detail = LEVEL_NAMES.get(c.level, str(c.level))
        if c.memory_level != "normal":
            detail += f", {c.memory_level}"
        colour = _LEVEL_COLOUR.get(c.level, "#4477aa")
        ax.plot([_local(t, zone) for t in c.times], c.weights, color=colour,
                linestyle=styles[c.memory_level], linewidth=1.2, alpha=0.8,
                gid=f"episode:{c.episode_id}", label=f"episode:{c.episode_id} ({detail})")
        ax.plot([_local(c.now, zone)], [c.now_weight], marker="o", markersize=6,
                color=colour, markeredgecolor="#222222", linestyle="none",
                gid=f"now:{c.episode_id}")
    ax.axvline(_local(now, zone), color="#777777", linestyle=":", linewidth=1)
    ax.set_ylim(0.0, 1.05)
    ax.set_ylabel("retrieval weight")
    ax.set_xlabel(f"date ({_zone_name(zone)}); dotted: now, dots: today's weight")
    ax.grid(alpha=0.3)
    _date_axis(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(f"Decay of the {_plural(len(curves), 'most recent episode')}"
                 if len(curves) > 1 else "Decay of the most recent episode", fontsize=11)
