"""The companion's mood (clanka), carried between conversations.

A mood is a valence (-1 bad .. 1 good), an energy (0 tired .. 1 lively), a
warmth toward the household (0 cold .. 1 warm) and one line of why. Each
reading is a row of ``mood`` (migration 0016): history is kept, the newest is
current. It is shown to the model as one line of the system prompt
(:func:`mood_line`, read by the Turns actor through :func:`current_line`) and
pulls mood-congruent episodes up a little in recall (:func:`congruence_bonus`).

**How it is computed** (the consolidate job,
:func:`runtime.mind.consolidate.update_mood`), honestly:
offline, from the people's turns written since the last reading (role
``user``, memory by their source's profile, not disabled). Each turn's
emotion is read with the lexicon of :mod:`runtime.memories.emotion`; each label stands
for a point (:data:`LABEL_POINTS`: joy is good, lively and warm; sadness bad,
tired; anger bad, lively and cold...), and the reading is their average
weighted by the lexicon's weights. The new mood moves from the current one
toward the reading by ``hits / (hits + 3)`` (at most 0.8): a few words of
feeling nudge it, a long sad talk moves it far. Turns without a feeling word
pull it a little toward neutral. No language model is asked (the schema
keeps ``how = 'llm'`` for one later).

**Time away**: between readings the mood decays toward neutral (valence 0,
energy and warmth 0.5) with a half-life of :data:`HALF_LIFE_HOURS`; what the
prompt and recall use is the latest reading decayed to now (:func:`current`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime.memories.emotion import LABELS, NEUTRAL, read_emotion
from runtime.store.database import Row, Store

log = logging.getLogger(__name__)

TABLE = "mood"
WRITER = "consolidate"
HALF_LIFE_HOURS = 36.0
WHY_CHARS = 200
MAX_TURNS = 500  # read per run; the rest waits for the next one
EVIDENCE_K = 3.0  # hits / (hits + K): how far one reading moves the mood
MAX_STEP = 0.8
CALM_STEP = 0.3  # at most this far toward neutral for turns without feeling words

#: (valence, energy, warmth) that each emotion label stands for.
LABEL_POINTS: dict[str, tuple[float, float, float]] = {
    "joy": (0.8, 0.7, 0.7),
    "love": (0.7, 0.5, 0.95),
    "surprise": (0.2, 0.8, 0.55),
    "sadness": (-0.7, 0.2, 0.45),
    "anger": (-0.7, 0.85, 0.2),
    "fear": (-0.6, 0.7, 0.4),
    NEUTRAL: (0.0, 0.5, 0.5),
}
#: How good or bad an episode's emotion feels, for mood congruence in recall.
EMOTION_VALENCE: dict[str, float] = {label: point[0] for label, point in LABEL_POINTS.items()}
_ADJECTIVE = {"joy": "happy", "love": "loving", "surprise": "surprised", "sadness": "sad",
              "anger": "angry", "fear": "anxious"}


class MoodIn(BaseModel):
    """A new reading of the mood."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    valence: float = Field(ge=-1.0, le=1.0, allow_inf_nan=False)
    energy: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    warmth: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    why: str = Field(min_length=1, max_length=WHY_CHARS)
    how: Literal["offline", "llm"] = "offline"
    through_turn: int = Field(default=0, ge=0)  # the last transcript row it read

    @field_validator("why")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = " ".join(value.split())
        if not value:
            raise ValueError("why is empty")
        return value


@dataclass(frozen=True)
class Mood:
    id: int
    valence: float
    energy: float
    warmth: float
    why: str
    how: str
    through_turn: int
    created_at: float

    @classmethod
    def of(cls, row: Row) -> Mood:
        return cls(int(row["id"]), float(row["valence"]), float(row["energy"]),
                   float(row["warmth"]), str(row["why"]), str(row["how"]),
                   int(row["through_turn"]), float(row["created_at"]))


class MoodService:
    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, mood: MoodIn, writer: str = WRITER) -> int:
        """Append a reading (the write log has it)."""
        return self.store.insert(writer, TABLE, {**mood.model_dump(),
                                                 "created_at": self.store.clock.now()})

    def latest(self) -> Mood | None:
        row = self.store.row(f"SELECT * FROM {TABLE} ORDER BY id DESC LIMIT 1")
        return None if row is None else Mood.of(row)


def current(mood: Mood | None, now: float) -> Mood | None:
    """The mood as it is at ``now``: the reading decayed toward neutral by the
    time since it was taken."""
    if mood is None:
        return None
    hours = max(0.0, now - mood.created_at) / 3600.0
    keep = 0.5 ** (hours / HALF_LIFE_HOURS)
    return replace(mood, valence=mood.valence * keep,
                   energy=0.5 + (mood.energy - 0.5) * keep,
                   warmth=0.5 + (mood.warmth - 0.5) * keep)


def congruence_bonus(mood: Mood | None, emotion: str | None, weight: float) -> float:
    """What a memory of ``emotion`` gains in recall under ``mood``: ``weight``
    times how much their valences agree (a sad memory in a sad mood), never
    negative, at most ``weight``."""
    if mood is None or emotion is None:
        return 0.0
    valence = EMOTION_VALENCE.get(emotion)
    if valence is None:
        return 0.0
    return weight * max(0.0, min(1.0, mood.valence * valence))


def _word(value: float, low: str, mid: str, high: str, cut: float = 0.2,
          centre: float = 0.0) -> str:
    if value <= centre - cut:
        return low
    if value >= centre + cut:
        return high
    return mid


def mood_line(mood: Mood) -> str:
    """One line for the system prompt."""
    feel = _word(mood.valence, "low", "even", "good")
    energy = _word(mood.energy, "tired", "steady", "lively", 0.15, 0.5)
    warmth = _word(mood.warmth, "distant", "friendly", "warm", 0.15, 0.5)
    return (f"Your mood: {feel}, {energy}, {warmth} toward the household "
            f"(valence {mood.valence:+.2f}, energy {mood.energy:.2f}, "
            f"warmth {mood.warmth:.2f}); why: {mood.why}")


def current_line(store: Store, now: float) -> str:
    """The current mood's line for the prompt ("" when there is none yet)."""
    mood = current(MoodService(store).latest(), now)
    return "" if mood is None else mood_line(mood)


@dataclass(frozen=True)
class Reading:
    valence: float
    energy: float
    warmth: float
    hits: float
    labels: dict[str, float]


def read_turns(texts: list[str]) -> Reading:
    """The lexicon's reading of turns (see the module docstring)."""
    weights: dict[str, float] = dict.fromkeys(LABELS, 0.0)
    for text in texts:
        found = read_emotion(text)
        if found.label != NEUTRAL:
            weights[found.label] += found.weight
    weights = {label: w for label, w in weights.items() if w > 0}
    total = sum(weights.values())
    if total <= 0:
        return Reading(*LABEL_POINTS[NEUTRAL], hits=0.0, labels={})
    point = [sum(LABEL_POINTS[label][i] * w for label, w in weights.items()) / total
             for i in range(3)]
    return Reading(point[0], point[1], point[2], total, weights)


def _why(turns: int, reading: Reading) -> str:
    said = "1 new turn" if turns == 1 else f"{turns} new turns"
    if not reading.labels:
        return f"{said} without strong feeling"
    top = max(reading.labels, key=lambda label: reading.labels[label])
    counts = ", ".join(f"{label} {weight:g}" for label, weight in
                       sorted(reading.labels.items(), key=lambda kv: -kv[1]))
    return f"{said} that sounded mostly {_ADJECTIVE[top]} ({counts})"


def next_mood(before: Mood | None, reading: Reading, turns: int, through: int) -> MoodIn:
    """The mood after ``reading``: ``before`` (already decayed to now) moved
    toward it by the weight of its evidence."""
    base = ((before.valence, before.energy, before.warmth) if before is not None
            else LABEL_POINTS[NEUTRAL])
    if reading.hits > 0:
        step = min(MAX_STEP, reading.hits / (reading.hits + EVIDENCE_K))
    else:
        step = min(CALM_STEP, turns / (turns + 10.0))
    target = (reading.valence, reading.energy, reading.warmth)
    v, e, w = (b + step * (t - b) for b, t in zip(base, target))
    return MoodIn(valence=max(-1.0, min(1.0, v)), energy=max(0.0, min(1.0, e)),
                  warmth=max(0.0, min(1.0, w)), why=_why(turns, reading),
                  through_turn=through)
