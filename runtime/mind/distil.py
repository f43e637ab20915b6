"""Distil: windows of transcript become leaf episodes (consolidation, part 1).

For each channel, the rows after the job's position are read in id order.
Rows that cannot become episodes are skipped but passed: their source's
profile does not say ``episodes``, the user disabled them, or they are tool or
system rows. The others are cut into **windows**: a new window starts after
a silence of ``gap_s`` or when one holds ``max_turns`` turns. A window still
open (its last turn is recent and it is not full) waits for the next run.

Each window becomes one leaf episode (with a language model: one per segment
of at most ``evidence_per_call`` turns) that cites its turns, spans their
times, and carries a gist, a salience (1-10) and an emotion:

* **Offline** (no real provider configured, or the chain fell back to the
  offline provider during this run): :func:`offline_distil`, an extractive
  gist of the most informative sentences under their speakers' names, a
  salience from simple signals and the emotion from :mod:`runtime.memories.emotion`.
* **With a language model**: a JSON-schema prompt; the answer is validated
  (:class:`DistilOut`). An invalid answer is asked for once more, then the
  segment goes to the durable queue (:mod:`runtime.llm.queue`) and the run
  moves on; queued segments are retried first on later runs, oldest first.
  One that stays invalid for ``max_attempts`` runs, or falls off the
  queue's cap, is distilled offline: nothing is lost.

Each episode may also open a thread (:mod:`runtime.memories.threads`: something left
unresolved; with a language model its answer names it, offline the rules of
:func:`runtime.memories.threads.detect` find it) and resolve the channel's earlier open
threads that its window closes (:class:`ThreadKeeper`: the model's ``closes``, among
the open threads listed after the evidence; offline a closing sentence close to the
thread).

Progress is committed window by window: the episode is written, then the
channel's position (``job_state``). A crash in between is harmless: turns
already cited by a leaf episode of the channel are not distilled again, and a
segment already queued is not queued twice. Every ``batch_windows`` windows,
and at the end of a channel, a compaction row records a short continuity
summary and moves the channel's watermark to the position, held below the
oldest queued segment of the channel so that its rows are not pruned first.
Only transcript rows are read, and only episodes and compactions written:
user-managed facts are never touched.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    Completion,
    FallbackChain,
    LLMRequest,
    parse_json_answer,
)
from runtime.llm.queue import PendingEntry, PendingQueue
from runtime.memories import derived, privacy
from runtime.memories.cited import StaleCitation
from runtime.memories.emotion import LABELS, NEUTRAL, read_emotion
from runtime.memories.episodes import EpisodeIn
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.threads import (
    THREAD_WHAT_CHARS,
    ThreadChange,
    ThreadService,
    ThreadState,
    closing_sentences,
    open_threads_text,
)
from runtime.memories.threads import detect as detect_thread
from runtime.mind.contract import JobContext, JobResult
from runtime.store.database import Row
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import household_zone

if TYPE_CHECKING:
    from runtime.config import EmbedderSettings
    from runtime.llm.embedder import Embedder

log = logging.getLogger(__name__)

JOB = "consolidate"
WRITER = "consolidate"
QUEUE_KIND = "distil"
DISTIL_ROLES = ("user", "assistant")
EMOTIONS = (*LABELS, NEUTRAL)


@dataclass(frozen=True)
class DistilParams:
    gap_s: float = 1800.0        # a silence this long closes a window
    max_turns: int = 20          # a window holds at most this many turns
    evidence_per_call: int = 12  # turns per language-model call (longer windows are split)
    page_rows: int = 500         # transcript rows read at a time
    batch_windows: int = 10      # windows between compaction rows
    gist_chars: int = 420        # offline gist length bound
    turn_chars: int = 1000       # a turn's text in the prompt is cut to this
    queue_cap: int = 200
    max_attempts: int = 3        # runs a queued segment is retried with the LLM
    llm_max_tokens: int = 400


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Turn:
    id: int
    source: str
    role: str
    speaker: str | None
    content: str
    created_at: float

    @property
    def label(self) -> str:
        if self.speaker:
            return self.speaker
        return "Assistant" if self.role == "assistant" else "User"


def split_windows(turns: Sequence[Turn], gap_s: float, max_turns: int) -> list[list[Turn]]:
    """Cut turns (one channel, id order) at silences of ``gap_s`` and every ``max_turns``."""
    windows: list[list[Turn]] = []
    for turn in turns:
        if (not windows or len(windows[-1]) >= max_turns
                or turn.created_at - windows[-1][-1].created_at >= gap_s):
            windows.append([turn])
        else:
            windows[-1].append(turn)
    return windows


_T = TypeVar("_T")


def chunks(items: Sequence[_T], size: int) -> list[list[_T]]:
    """``items`` in balanced pieces of at most ``size`` (20 by 12: 10 and 10)."""
    n = max(1, math.ceil(len(items) / size))
    step = len(items) / n
    return [list(items[round(i * step):round((i + 1) * step)]) for i in range(n)]


def episode_source(turns: Sequence[Turn]) -> str:
    """The source an episode is filed under: the most frequent one, preferring
    the people's side to the assistant's; ties go to the earliest."""
    people = [t.source for t in turns if t.role != "assistant"] or [t.source for t in turns]
    counts = Counter(people)
    return max(people, key=lambda s: (counts[s], -people.index(s)))


# --------------------------------------------------------------------------- offline

_STOP = frozenset("""
a about above after again against all am an and any are aren't as at be because been
before being below between both but by can can't could couldn't did didn't do does doesn't
doing don't down during each few for from further had hadn't has hasn't have haven't having
he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm
i've if in into is isn't it it's its itself just let's like me more most much my myself no
nor not now of off on once only or other ought our ours ourselves out over own really same
she she'd she'll she's should shouldn't so some such than that that's the their theirs them
themselves then there there's these they they'd they'll they're they've this those through
to too under until up very was wasn't we we'd we'll we're we've were weren't what what's
when when's where where's which while who who's whom why why's will with won't would
wouldn't yeah yes yep you you'd you'll you're you've your yours yourself yourselves hey hi
hello ok okay oh wow thanks thank lol haha sure also get got go going gonna one thing things
know think lot really well right good great cool awesome totally definitely
""".split())
_MONTHS = frozenset("""january february march april may june july august september october
november december monday tuesday wednesday thursday friday saturday sunday today tomorrow
yesterday tonight weekend week month year""".split())
_DISCLOSURE = frozenset("""moved move moving married marry wedding born started start quit
lost bought buy adopted adopt graduated graduate diagnosed promoted hired fired pregnant
engaged divorced decided decide planning plan plans joined join finished retire retired
learned learning visited visit travel travelled traveled trip job career school college
kids baby dog cat house""".split())
_FIRST_PERSON = frozenset({"i", "i'm", "i've", "i'd", "i'll", "my", "we", "we're", "our",
                           "me", "mine"})
_REMEMBER = re.compile(r"\b(remember|don't forget|never forget|important)\b", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?…])\s+|\n+")
_WORD = re.compile(r"[A-Za-z][A-Za-z'\u2019-]*|\d+(?:[.,:/-]\d+)*")
_SENTENCE_CHARS = 200
_RELATIVE_FLOOR = 0.25  # a sentence scoring below this fraction of the best is left out
_MAX_SENTENCES = 6


@dataclass
class _Sentence:
    turn: int          # index of its turn in the window
    index: int         # its position in the turn
    speaker: str
    text: str
    words: list[str]
    terms: set[str] = field(default_factory=set)
    score: float = 0.0


def _is_number(word: str) -> bool:
    return word[0].isdigit()


def _proper_nouns(words: list[str], exclude: set[str]) -> set[str]:
    """Capitalised words not at the start of the sentence (a rough name finder)."""
    return {w for i, w in enumerate(words) if i > 0 and w[0].isupper() and w != "I"
            and w.lower() not in _STOP and w not in exclude}


def _sentences(turns: Sequence[Turn]) -> list[_Sentence]:
    out = []
    for ti, turn in enumerate(turns):
        for si, text in enumerate(p.strip() for p in _SENTENCE.split(turn.content)):
            words = _WORD.findall(text)
            if words:
                out.append(_Sentence(ti, si, turn.label, text, words))
    return out


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _score(sentences: list[_Sentence], speakers: set[str]) -> None:
    tf: Counter[str] = Counter()
    for s in sentences:
        s.terms = {w.lower() for w in s.words
                   if w.lower() not in _STOP and (len(w) > 2 or _is_number(w))}
        tf.update(s.terms)
    for s in sentences:
        score = sum(1.0 + math.log(tf[t]) for t in s.terms)
        score += 1.5 * len(_proper_nouns(s.words, speakers))
        score += 1.5 * sum(1 for w in s.words if _is_number(w) or w.lower() in _MONTHS)
        score += read_emotion(s.text).weight
        lowered = {w.lower() for w in s.words}
        if lowered & _FIRST_PERSON and lowered & _DISCLOSURE:
            score += 1.5
        if len(s.terms) < 3:
            score *= 0.3  # "Hey!", "Thanks so much!": little to remember
        s.score = score / math.sqrt(max(len(s.words), 4))


def extractive_gist(turns: Sequence[Turn], limit: int) -> str:
    """The window's most informative sentences, in order, under their speakers'
    names ("Caroline: ...; Melanie: ..."), at most ``limit`` characters."""
    sentences = _sentences(turns)
    if not sentences:
        return _clip("; ".join(f"{t.label}: {t.content}" for t in turns), limit)
    speakers = {t.label for t in turns}
    _score(sentences, speakers)
    ranked = sorted(sentences, key=lambda s: (-s.score, s.turn, s.index))
    floor = _RELATIVE_FLOOR * ranked[0].score
    ranked = [s for s in ranked if s.score >= floor] or ranked[:1]
    best_per_speaker: dict[str, _Sentence] = {}
    for s in ranked:
        best_per_speaker.setdefault(s.speaker, s)
    order = list(best_per_speaker.values()) + [s for s in ranked
                                               if s not in best_per_speaker.values()]
    picked: list[_Sentence] = []
    used = 0
    for s in order:
        if len(picked) == _MAX_SENTENCES:
            break
        if any(s.terms and len(s.terms & p.terms) > 0.6 * len(s.terms) for p in picked):
            continue  # says again what a picked sentence says
        cost = min(len(s.text), _SENTENCE_CHARS) + len(s.speaker) + 3
        if picked and used + cost > limit:
            continue
        picked.append(s)
        used += cost
    picked.sort(key=lambda s: (s.turn, s.index))
    parts: list[str] = []
    last_speaker = None
    for s in picked:
        text = _clip(s.text, _SENTENCE_CHARS)
        if s.speaker == last_speaker:
            parts[-1] += " " + text
        else:
            parts.append(f"{s.speaker}: {text}")
            last_speaker = s.speaker
    return _clip("; ".join(parts), limit)


def offline_salience(turns: Sequence[Turn]) -> int:
    """Salience 1-10 from simple signals, each saturating, and by density (so a
    long window is not important just for being long): distinct names, numbers
    and dates, the share of sentences that are first-person disclosures ("I
    moved", "we adopted"), emotion words per sentence, questions, length, and
    an explicit "remember". Small talk (under five content words) stays at 2."""
    text = "\n".join(t.content for t in turns)
    speakers = {t.label for t in turns}
    sentences = _sentences(turns)
    n = max(1, len(sentences))
    words = [w for s in sentences for w in s.words]
    content = [w for w in words if w.lower() not in _STOP and len(w) > 2]
    names: set[str] = set()
    disclosures = 0
    for s in sentences:
        names |= _proper_nouns(s.words, speakers)
        lowered = {w.lower() for w in s.words}
        disclosures += bool(lowered & _FIRST_PERSON and lowered & _DISCLOSURE)
    specifics = {w.lower() for w in words if _is_number(w) or w.lower() in _MONTHS}
    score = 1.0
    score += min(2.0, len(names) / 3)
    score += min(1.0, len(specifics) / 2)
    score += min(2.5, 5.0 * disclosures / n)
    score += min(2.0, 3.0 * read_emotion(text).weight / n)
    score += 0.5 if "?" in text else 0.0
    score += min(1.0, len(words) / 300)
    if _REMEMBER.search(text):
        score += 2.0
    if len(content) < 5:
        score = min(score, 2.0)
    return max(1, min(10, round(score)))


@dataclass(frozen=True)
class Distilled:
    gist: str
    salience: int
    emotion: str
    how: Literal["offline", "llm"]
    # an open thread it leaves (runtime.memories.threads), and the earlier threads it
    # closes (None: judged by the offline rule)
    thread: ThreadState | None = None
    thread_what: str | None = None
    closes: tuple[int, ...] | None = None


def offline_distil(turns: Sequence[Turn], params: DistilParams) -> Distilled:
    text = "\n".join(t.content for t in turns)
    found = detect_thread(turns)
    return Distilled(extractive_gist(turns, params.gist_chars), offline_salience(turns),
                     read_emotion(text).label, "offline",
                     None if found is None else found.state,
                     None if found is None else found.what)


# --------------------------------------------------------------------------- LLM


class DistilOut(BaseModel):
    """What the model must answer: one JSON object."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    gist: str = Field(min_length=1, max_length=800,
                      description="1-3 sentences, third person, names/places/dates as said")
    salience: int = Field(ge=1, le=10, description="1 small talk ... 10 life-changing")
    emotion: Literal["joy", "sadness", "anger", "fear", "surprise", "love", "neutral"]  # = EMOTIONS
    thread: Literal["simmering", "hot"] | None = Field(
        default=None, description="something left unresolved: simmering, hot (urgent) or null")
    thread_what: str | None = Field(default=None, max_length=THREAD_WHAT_CHARS,
                                    description="the words of what is left unresolved")
    closes: list[int] = Field(default_factory=list, max_length=50,
                              description="ids of the listed open threads this closes")

    @field_validator("gist")
    @classmethod
    def _strip(cls, value: str) -> str:
        value = " ".join(value.split())
        if not value:
            raise ValueError("gist is empty")
        return value

    @field_validator("emotion", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


_SYSTEM = (
    "You turn a window of a household's conversation into one memory episode. "
    "Answer with a single JSON object and nothing else, matching this JSON schema:\n"
    "{schema}\n"
    "gist: one to three sentences, at most 400 characters, in the third person, naming "
    "the speakers and keeping names, places, dates and numbers exactly as they were said; "
    "nothing that is not in the evidence. salience: 1 for small talk up to 10 for a "
    "life-changing event. emotion: the dominant emotion of the conversation. thread: "
    "when the conversation leaves something unresolved (a plan or promise not kept yet, "
    "a question left unanswered), hot if urgent, else simmering, with thread_what its "
    "words; otherwise null. closes: the ids of the open threads listed after the "
    "evidence that this conversation resolves (done, answered, no longer needed)."
)
_RETRY = ("That answer was not a valid JSON object for the schema ({why}). Answer again "
          "with only the JSON object.")


class InvalidOutput(Exception):
    """The model answered twice, but not with a valid :class:`DistilOut`."""


def parse_output(text: str) -> DistilOut:
    """The model's answer as a :class:`DistilOut` (a code fence or prose around
    the object is tolerated); raises ValueError saying, without content, why not."""
    return parse_json_answer(text, DistilOut)


class Distiller:
    """Distils segments, with the chain's language model while one answers,
    offline otherwise (see the module docstring)."""

    def __init__(self, llm: FallbackChain, params: DistilParams, zone: Any = None) -> None:
        self.llm = llm
        self.params = params
        self.zone = zone
        self.offline = not llm.real_providers  # no real provider: never ask
        self.calls = 0

    def evidence(self, turns: Sequence[Turn]) -> str:
        lines = []
        for i, t in enumerate(turns, 1):
            when = datetime.fromtimestamp(t.created_at, self.zone).strftime("%Y-%m-%d %H:%M")
            lines.append(f"[{i}] {when} {t.label}: {_clip(t.content, self.params.turn_chars)}")
        return "Evidence:\n" + "\n".join(lines)

    def _ask(self, messages: list[ChatMessage]) -> Completion:
        self.calls += 1
        return self.llm.complete(LLMRequest(messages=messages, temperature=0.2,
                                            max_tokens=self.params.llm_max_tokens))

    def _offline_answer(self, completion: Completion) -> bool:
        provider = next((p for p in self.llm.providers if p.name == completion.provider), None)
        return provider is None or bool(getattr(provider, "last_resort", False))

    def distil(self, turns: Sequence[Turn], threads: Sequence[Row] = ()) -> Distilled:
        """Raises :class:`InvalidOutput` (queue it) or
        :class:`~runtime.llm.providers.AllProvidersFailed` (no provider answered).
        ``threads``: the channel's open threads, which the model may close."""
        if self.offline:
            return offline_distil(turns, self.params)
        schema = json.dumps(DistilOut.model_json_schema(), separators=(",", ":"))
        messages = [ChatMessage(role="system", content=_SYSTEM.format(schema=schema)),
                    ChatMessage(role="user", content=self.evidence(turns)
                                + open_threads_text(threads))]
        why = ""
        for attempt in range(2):
            completion = self._ask(messages)
            if self._offline_answer(completion):
                # Every real provider failed just now: offline for the rest of the run.
                log.warning("distil: language model unavailable; distilling offline")
                self.offline = True
                return offline_distil(turns, self.params)
            try:
                out = parse_output(completion.text)
            except ValueError as exc:
                why = str(exc)
                log.warning("distil: invalid model output (%s), attempt %d", why, attempt + 1)
                messages = [*messages,
                            ChatMessage(role="assistant", content=completion.text[:2000]),
                            ChatMessage(role="user", content=_RETRY.format(why=why))]
                continue
            what = out.thread_what or (None if out.thread is None else _clip(out.gist, 300))
            return Distilled(_clip(out.gist, 800), out.salience, out.emotion, "llm",
                             out.thread, what if out.thread else None, tuple(out.closes))
        raise InvalidOutput(why)


# --------------------------------------------------------------------------- threads


_OWN: dict[str, Embedder] = {}
_OWN_LOCK = threading.Lock()


def _own_embedder(settings: EmbedderSettings) -> Embedder:
    """A model of this process's own, for a job context that lends none (loaded
    once per configuration, not per run)."""
    key = settings.model_dump_json()
    with _OWN_LOCK:
        if key not in _OWN:
            from runtime.llm.embedder import make_embedder
            log.info("threads: no embedder in the job context; loading %s", settings.kind)
            _OWN[key] = make_embedder(settings)
        return _OWN[key]


class ThreadKeeper:
    """The consolidate job's thread work on one run: the channel's open
    threads, and resolving those a new episode closes."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.similarity = ctx.settings.threads.resolve_similarity
        self._embedder: Embedder | None = ctx.embedder
        self.resolved = 0

    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = _own_embedder(self.ctx.settings.embedder)
        return self._embedder

    def open_threads(self, channel: str) -> list[Row]:
        return ThreadService(self.ctx.store).open_threads(channel)

    def offline_closes(self, threads: Sequence[Row], turns: Sequence[Any]) -> list[int]:
        """The threads a window closes by the offline rule: a closing sentence
        at least ``resolve_similarity`` from the thread's words."""
        closers = closing_sentences(turns)
        if not closers or not threads:
            return []
        whats = [str(r["thread_what"] or r["gist"]) for r in threads]
        vecs = self.embedder().embed([*whats, *closers])
        sims = np.asarray(vecs[: len(whats)]) @ np.asarray(vecs[len(whats):]).T
        return [int(r["id"]) for r, row_sims in zip(threads, sims)
                if float(row_sims.max()) >= self.similarity]

    def resolve(self, channel: str, episode_id: int, turns: Sequence[Any],
                closes: Sequence[int] | None) -> int:
        """Resolve the channel's threads opened before ``episode_id`` that its
        window closes: ``closes`` as the language model judged them, or (None)
        by the offline rule. Returns how many were resolved."""
        threads = [r for r in self.open_threads(channel) if r["id"] < episode_id]
        if closes is None:
            ids = self.offline_closes(threads, turns)
        else:
            known = {int(r["id"]) for r in threads}
            ids = [i for i in closes if i in known]
        now = self.ctx.clock.now()
        for thread_id in ids:
            self.ctx.writer.update_thread(ThreadChange(
                episode_id=thread_id, change="resolve", at=now, resolved_by=episode_id),
                "consolidate")
        self.resolved += len(ids)
        return len(ids)


# --------------------------------------------------------------------------- the job


def _position_key(channel: str) -> str:
    return f"distil.position.{channel}"


@dataclass
class _Run:
    ctx: JobContext
    params: DistilParams
    profiles: MemoryProfiles
    queue: PendingQueue
    distiller: Distiller
    episodes: int = 0
    windows: int = 0
    by_llm: int = 0
    stale: int = 0  # segments refused: they cite a turn forgotten since it was read
    offline: int = 0
    queued: int = 0
    retried: int = 0
    down: bool = False  # no provider answered (and no offline fallback): queue the rest
    # per channel, its last gists written and their episodes: the compaction summary
    recent: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)  # of the queued entries
    threads: ThreadKeeper | None = None

    # -- reads ------------------------------------------------------------

    def eligible(self, row: dict[str, Any]) -> bool:
        return (not row["disabled"] and row["role"] in DISTIL_ROLES
                and self.profiles.for_source(row["source"]).episodes)

    def cited(self, channel: str, lo: int, hi: int) -> set[int]:
        """Turns in [lo, hi] already cited by a leaf episode of the channel."""
        return {r[0] for r in self.ctx.store.conn.execute(
            "SELECT c.transcript_id FROM episode_citations c JOIN episodes e"
            " ON e.id = c.episode_id WHERE e.level = 0 AND e.channel = ?"
            " AND c.transcript_id BETWEEN ? AND ?", (channel, lo, hi))}

    def watermark(self, channel: str) -> int:
        value = self.ctx.store.scalar(
            "SELECT max(watermark) FROM compactions WHERE channel = ?", (channel,))
        return 0 if value is None else int(value)

    def open_threads(self, channel: str) -> list[Row]:
        return [] if self.threads is None else self.threads.open_threads(channel)

    def position(self, channel: str) -> int:
        stored = get_state(self.ctx.store, JOB, _position_key(channel), 0)
        return max(int(stored), self.watermark(channel))

    # -- writes -----------------------------------------------------------

    def write(self, channel: str, turns: Sequence[Turn], distilled: Distilled) -> None:
        try:
            episode_id = self.ctx.writer.add_episode(EpisodeIn(
                channel=channel, source=episode_source(turns), gist=distilled.gist, level=0,
                salience=distilled.salience, emotion=distilled.emotion,
                cites=[t.id for t in turns], started_at=turns[0].created_at,
                ended_at=turns[-1].created_at, thread=distilled.thread,
                thread_what=distilled.thread_what), WRITER)
        except StaleCitation as refused:  # a turn forgotten since it was read
            self.rewrite_without(channel, turns, refused)
            return
        if self.threads is not None:
            self.threads.resolve(channel, episode_id, turns, distilled.closes)
        self.episodes += 1
        if distilled.how == "llm":
            self.by_llm += 1
        else:
            self.offline += 1
        if not privacy.cites_sensitive(self.ctx.store, [t.id for t in turns]):
            # a sensitive gist never enters the continuity summary (runtime.memories.privacy);
            # one holding the separator's "…" would not be told apart from the next one
            gist = distilled.gist.replace(derived.GIST_SEPARATOR.strip(), "...")
            self.recent.setdefault(channel, []).append((f"episode:{episode_id}", gist))
            del self.recent[channel][:-3]

    def rewrite_without(self, channel: str, turns: Sequence[Turn],
                        refused: StaleCitation) -> None:
        """The episode of ``turns`` was refused: it cites turns forgotten since
        they were read (``runtime.memories.cited``; its gist may quote them). The
        turns still stored get an offline episode of their own words alone: left
        uncited, the watermark would pass them and the janitor prune them."""
        self.stale += 1
        kept = [t for t in turns if f"turn:{t.id}" not in refused.refs]
        log.info("distil: a segment cites %d turns forgotten since it was read; %s",
                 len(refused.refs), "written again without them" if kept else "skipped",
                 extra={"channel": channel})
        if kept and len(kept) < len(turns):
            self.write(channel, kept, offline_distil(kept, self.params))

    def enqueue(self, channel: str, turns: Sequence[Turn], error: str) -> None:
        entry = PendingEntry(
            key=f"{QUEUE_KIND}:{channel}:{turns[0].id}", kind=QUEUE_KIND,
            payload={"channel": channel, "turn_ids": [t.id for t in turns]},
            attempts=1, enqueued_at=self.ctx.clock.now(), last_error=error)
        self.queued += 1
        self.keys.add(entry.key)
        for dropped in self.queue.push(entry):  # past the cap: do it offline now
            self.keys.discard(dropped.key)
            self.rescue(dropped)

    def rescue(self, entry: PendingEntry) -> None:
        channel = str(entry.payload.get("channel", ""))
        turns = self.load(channel, entry.payload.get("turn_ids", []))
        if turns:
            self.write(channel, turns, offline_distil(turns, self.params))

    def distil_segment(self, channel: str, turns: Sequence[Turn]) -> None:
        if self.down:
            self.enqueue(channel, turns, "unavailable")
            return
        try:
            distilled = self.distiller.distil(turns, self.open_threads(channel))
        except InvalidOutput:
            self.enqueue(channel, turns, "invalid_output")
            return
        except AllProvidersFailed:
            self.down = True
            self.enqueue(channel, turns, "unavailable")
            return
        self.write(channel, turns, distilled)

    def compact(self, channel: str) -> None:
        """Move the channel's watermark up to its position, but below its oldest
        queued segment, with a continuity summary: the channel's last gists
        (never a sensitive one), word for word, citing their episodes. Forgetting
        one of those episodes, or a turn a gist copied (its episode goes with
        it), rewrites the summary without that gist
        (:mod:`runtime.memories.derived`); one forgotten before the summary is
        written has it refused (:mod:`runtime.memories.cited`), and it is
        written again without that gist."""
        target = self.position(channel)
        held = [min(p.entry.payload["turn_ids"]) for p in self.queue.entries()
                if p.entry.kind == QUEUE_KIND and p.entry.payload.get("channel") == channel
                and p.entry.payload.get("turn_ids")]
        if held:
            target = min(target, min(held) - 1)
        if target <= self.watermark(channel):
            return
        last = self.ctx.store.scalar("SELECT max(created_at) FROM transcript WHERE"
                                     " channel = ? AND id <= ?", (channel, target))
        when = ("" if last is None else " up to " + datetime.fromtimestamp(
            float(last), self.distiller.zone).strftime("%Y-%m-%d %H:%M"))
        while True:
            recent = self.recent.get(channel, [])
            # the shape runtime.memories.derived.compaction_without takes a gist out of
            summary = _clip(f"Conversation on {channel}{when}: " + derived.GIST_SEPARATOR.join(
                gist for _, gist in recent), 1200) if recent else (
                f"Conversation on {channel}{when}: nothing new to remember.")
            shown = len(summary.partition(": ")[2].split(derived.GIST_SEPARATOR))
            refs = [ref for ref, _ in recent][:shown]  # the gists clipping left in it
            try:
                self.ctx.writer.compact(channel, summary, target, WRITER, refs)
                return
            except StaleCitation as refused:  # an episode forgotten since it was written
                log.info("distil: a compaction summary quotes %d episodes forgotten meanwhile;"
                         " written again without them", len(refused.refs),
                         extra={"channel": channel})
                kept = [(ref, gist) for ref, gist in recent if ref not in refused.refs]
                if len(kept) == len(recent):
                    raise
                self.recent[channel] = kept

    def load(self, channel: str, ids: Sequence[int]) -> list[Turn]:
        """The turns among ``ids`` that still exist and may be distilled, minus
        those a leaf episode of the channel already cites."""
        ids = [int(i) for i in ids][:1000]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.ctx.store.rows(
            "SELECT id, channel, source, role, speaker, content, created_at, disabled"
            f" FROM transcript WHERE id IN ({marks}) AND channel = ? ORDER BY id",
            (*ids, channel))
        done = self.cited(channel, min(ids), max(ids))
        return [_turn(r) for r in rows if self.eligible(r) and r["id"] not in done]

    # -- the two phases -----------------------------------------------------

    def retry_queue(self) -> bool:
        """Retry queued segments, oldest first; False when out of time."""
        for item in self.queue.entries():
            if self.ctx.out_of_time():
                return False
            entry = item.entry
            if entry.kind != QUEUE_KIND:
                continue
            channel = str(entry.payload.get("channel", ""))
            turns = self.load(channel, entry.payload.get("turn_ids", []))
            if not turns:  # forgotten, disabled or distilled meanwhile
                self.queue.remove(item)
                continue
            try:
                distilled = self.distiller.distil(turns, self.open_threads(channel))
            except InvalidOutput:
                if entry.attempts + 1 >= self.params.max_attempts:
                    distilled = offline_distil(turns, self.params)
                else:
                    self.queue.update(item, entry.model_copy(
                        update={"attempts": entry.attempts + 1,
                                "last_error": "invalid_output"}))
                    continue
            except AllProvidersFailed:
                self.down = True
                return True  # still down: leave the queue as it is
            self.write(channel, turns, distilled)
            self.queue.remove(item)
            self.keys.discard(entry.key)
            self.retried += 1
        return True

    def channel(self, channel: str) -> bool:
        """Distil the channel's closed windows, then compact; False when out of time."""
        finished = self._windows(channel)
        self.compact(channel)
        return finished

    def _windows(self, channel: str) -> bool:
        p = self.params
        since_compaction = 0
        limit = p.page_rows
        while True:
            pos = self.position(channel)
            rows = self.ctx.store.rows(
                "SELECT id, channel, source, role, speaker, content, created_at, disabled"
                " FROM transcript WHERE channel = ? AND id > ? ORDER BY id LIMIT ?",
                (channel, pos, limit))
            if not rows:
                return True
            full_page = len(rows) == limit
            turns = [_turn(r) for r in rows if self.eligible(r)]
            windows = split_windows(turns, p.gap_s, p.max_turns)
            end = rows[-1]["id"]
            if windows and len(windows[-1]) < p.max_turns and (
                    full_page or self.ctx.clock.now() - windows[-1][-1].created_at < p.gap_s):
                end = windows.pop()[0].id - 1  # may still grow: wait for it
            if end <= pos:
                if not full_page:
                    return True
                limit *= 2  # one window spans the whole page: read further
                continue
            limit = p.page_rows
            for i, window in enumerate(windows):
                if self.ctx.out_of_time():
                    return False
                through = windows[i + 1][0].id - 1 if i + 1 < len(windows) else end
                self.window(channel, window)
                set_state(self.ctx.store, JOB, _position_key(channel), through)
                since_compaction += 1
                if since_compaction >= p.batch_windows:
                    self.compact(channel)
                    since_compaction = 0
            set_state(self.ctx.store, JOB, _position_key(channel), end)
            if not full_page:
                return True

    def window(self, channel: str, window: list[Turn]) -> None:
        self.windows += 1
        done = self.cited(channel, window[0].id, window[-1].id)
        fresh = [t for t in window if t.id not in done]
        if not fresh:
            return  # distilled before a crash
        segments = ([fresh] if self.distiller.offline or self.down
                    else chunks(fresh, self.params.evidence_per_call))
        for segment in segments:
            if f"{QUEUE_KIND}:{channel}:{segment[0].id}" in self.keys:
                continue  # queued before a crash
            self.distil_segment(channel, segment)


def _turn(row: dict[str, Any]) -> Turn:
    return Turn(row["id"], row["source"], row["role"], row["speaker"], row["content"],
                float(row["created_at"]))


def distil(ctx: JobContext, params: DistilParams | None = None) -> JobResult:
    """Distil every channel's closed transcript windows into leaf episodes."""
    params = params or DistilParams()
    zone = household_zone(ctx.settings.household.timezone)
    run = _Run(ctx, params, MemoryProfiles.load(ctx.settings.memory.profiles_file),
               PendingQueue.in_data_dir(ctx.settings.store.resolved_dir, params.queue_cap),
               Distiller(ctx.llm, params, zone))
    run.keys = run.queue.keys()
    run.threads = ThreadKeeper(ctx)
    finished = run.retry_queue()
    if finished:
        channels = [r[0] for r in ctx.store.conn.execute(
            "SELECT DISTINCT channel FROM transcript ORDER BY channel")]
        for channel in channels:
            if not run.channel(channel):
                finished = False
                break
    pending = len(run.queue)
    detail = (f"distil: {run.episodes} episodes from {run.windows} windows "
              f"({run.by_llm} by LLM, {run.offline} offline), {run.queued} queued, "
              f"{run.retried} retried, {pending} pending, "
              f"{run.threads.resolved} threads resolved"
              + (f", {run.stale} refused (citing forgotten turns)" if run.stale else ""))
    log.info(detail)
    return JobResult(items=run.episodes, detail=detail, more=not finished)
