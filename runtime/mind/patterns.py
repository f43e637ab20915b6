"""The ``patterns`` job: behavioural patterns in what the household says.

Only user turns (``role = 'user'``, not disabled) from a source whose profile
has the ``patterns`` switch are read (``configs/profiles.toml``: ``user``; never
``dmn``, ``assistant`` or synced items). Each turn is an occurrence at its time
in the household's zone (``household.timezone``); the leaf episodes that cite
a supporting turn are cited with it. Three shapes, per speaker:

- **routines**: a topic that comes up in the same part of the week (weekday or
  weekend; morning, afternoon, evening or night) in at least ``min_weeks``
  distinct weeks, and mostly there (``routine_share`` of its occurrences):
  "asks about weather on weekday mornings";
- **recurring topics**: a topic said on at least ``min_days`` days in at least
  ``min_weeks`` weeks, when no routine of it already explains it;
- **people**: a known person mentioned on as many days and weeks. People are
  the names the fact rules (:mod:`runtime.mind.extract_rules`) found as relations
  and the facts job wrote (``<Name> relation_to_<speaker>``, ``<speaker>
  husband: <Name>``...); they are matched word for word.

Topics are deterministic: the content words of a user turn (lower case; stop
words, conversational filler, relation words, past-tense verbs and people's
names out; a plural ``s`` folded), shown as they were said. Words always said
in the same turns are one topic ("chess club"). Occurrences are counted once
per turn. (Transcript rows cited by a live episode are never pruned, so the
turns still hold what the episodes were made of.)

A pattern is a ``behavioral_pattern`` fact about its speaker, keyed
``pattern_<shape>_...``, whose value names its support in words (``(in five
different weeks)``: numbers in digits would not appear in the cited turns,
which the support check requires), with a confidence:

    strength = weeks / (weeks + 2)  (at most 0.95)
               * 0.5 ** (max(0, days of silence - grace_days) / fade_half_life_days)

Writes go through the graph's normal path (``ctx.writer``): a new pattern is
inserted; more support changes the value, so the new claim supersedes the old
one (its window closes: history kept); the same value said again at another
strength is a claim that reinforces it, moving its confidence (the mean of its
claims) towards the new strength: up when it is seen again, down while it is
silent (such a claim also moves its ``confirmed_at``, from which recall's
decay counts: the graph has no write that lowers a confidence without one). A
claim is written only when the strength moved by a step (:data:`STEP`), so
runs at the same time write nothing; a new value that loses to the claim in
force (support the user took back) is tried once. At most ``max_live``
patterns per speaker and shape are in force: a new one waits for room,
strongest first. A pattern whose strength falls below ``floor`` is retired:
disabled (``ctx.writer.change``), its row and history kept; new support later
supersedes it with a new, enabled claim. A pattern the user disabled, forgot,
edited or pinned is never written again.

The job reads the whole history of user turns each time it has something to
do: new turns since the last run, or a new day (silence fades by the day).
Otherwise it ends ok with nothing done. Its bookkeeping (``job_state``) is
only the last turn and day seen and, per pattern, the last claim it wrote and
whether it retired it; a crash between a write and that bookkeeping costs at
most one extra claim.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from runtime.memories import privacy
from runtime.memories.cited import StaleCitation
from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.memories.refs import Ref
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.extract_rules import MULTI_RELATIONS, NAME, SINGLE_RELATIONS, slug
from runtime.store.database import Row, Store
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import DAY, household_zone

log = logging.getLogger(__name__)

JOB = "patterns"
WRITER = "patterns"
KIND = "behavioral_pattern"
KEY_PREFIX = "pattern_"
USER_SUBJECT = "user"
STEP = 0.05  # a claim is written when the strength moved by at least this much
PAGE = 2000  # transcript rows read at a time


@dataclass(frozen=True)
class PatternParams:
    min_weeks: int = 3            # distinct weeks a pattern needs
    min_days: int = 4             # distinct days a recurring topic or person needs
    routine_share: float = 0.5    # of a topic's occurrences in the routine's slot
    grace_days: float = 7.0       # silence that costs nothing (a weekly routine's gap)
    fade_half_life_days: float = 14.0
    floor: float = 0.3            # below: retired
    max_confidence: float = 0.95
    max_live: int = 5             # patterns in force per speaker and shape (strongest first)
    evidence_turns: int = 3       # supporting turns cited (the latest)


# -- topics ------------------------------------------------------------------

_STOP = frozenset("""
a about above after again against all almost also although always am an and another any
anybody anyone anything anyway anyways are aren't around as ask asked asking at away back
be became because been before being below best better between big bit both but by can
can't cannot come comes coming could couldn't did didn't do does doesn't doing don't done
down during each else enough even ever every everyone everything few find first for from
get gets getting give given go goes going gone gonna good got gotta great had hadn't has
hasn't have haven't having he he'd he'll he's hello her here here's hers herself hey hi
him himself his how how's however i i'd i'll i'm i've if in into is isn't it it's its
itself just keep kind know knows last later least less let let's like likes little look
looking lot lots made make makes making many may maybe me mean might mine more most much
must my myself need needs never new next nice no nope not nothing now of off oh ok okay
on once one ones only or other others our ours ourselves out over own please pretty put
quite rather re really right said same say says see seem seems set shall she she'd she'll
she's should shouldn't show since so some somebody someone something sometimes soon sorry
still such sure take tell telling than thank thanks that that's the their theirs them
themselves then there there's these they they'd they'll they're they've thing things think
this those though thought through to today tomorrow tonight too took toward try trying
two under until up upon us use used very via want wanted wants was wasn't way we we'd
we'll we're we've well went were weren't what what's whatever when where where's whether
which while who who's whom whose why will with within without won't would wouldn't yeah
yes yesterday yet you you'd you'll you're you've your yours yourself yourselves
morning mornings afternoon evening evenings night nights week weekend day days time
times monday tuesday wednesday thursday friday saturday sunday minute minutes hour hours
lol haha hmm um uh ah wow cool alright reverie assistant remember again
love loves loved hate hates hated enjoy enjoys enjoyed prefer prefers liked play played
talk talked tell told call called stuff
""".split()) | frozenset(w for r in (*SINGLE_RELATIONS, *MULTI_RELATIONS) for w in r.split())
_WORD = re.compile(r"[A-Za-z][A-Za-z'\u2019-]*[A-Za-z]|[A-Za-z]")
_QUESTION_START = frozenset(
    "what what's whats when where which who whom whose why how how's is are can could "
    "would will should do does did shall may".split())
_NOT_PLURAL = ("ss", "us", "is", "ous", "news", "ics")
_PAST = re.compile(r"^.{3,}[^e]ed$")  # "phoned", "watched": what was done, not a topic


def _fold(word: str) -> str:
    """A word's topic form: lower case, possessive and a plain plural folded."""
    w = word.lower().replace("\u2019", "'")
    if w.endswith("'s"):
        w = w[:-2]
    w = w.strip("'-")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith(_NOT_PLURAL):
        return w[:-1]
    return w


def topics(text: str, exclude: frozenset[str] = frozenset()) -> dict[str, str]:
    """The topics of a turn: topic form -> the word as it was said (first seen).
    ``exclude``: topic forms left out (people's names)."""
    out: dict[str, str] = {}
    for match in _WORD.finditer(text):
        said = match.group(0).strip("'\u2019-")
        if said.lower().endswith(("'s", "\u2019s")):
            said = said[:-2]
        form = _fold(said)
        if (len(form) < 3 or form in _STOP or said.lower() in _STOP or form in exclude
                or "'" in form or _PAST.search(form)):
            continue
        out.setdefault(form, said)
    return out


def is_question(text: str) -> bool:
    words = text.strip().lower().split()
    return "?" in text or (bool(words) and words[0].strip(",") in _QUESTION_START)


# -- time of the week ----------------------------------------------------------


def part_of_day(hour: int) -> str:
    if 5 <= hour < 12:
        return "morning"
    if 12 <= hour < 17:
        return "afternoon"
    if 17 <= hour < 22:
        return "evening"
    return "night"


@dataclass(frozen=True)
class When:
    """An occurrence's place in the household's week."""

    day: int    # local date ordinal
    week: int   # ordinal of the local week's Monday
    daytype: str  # "weekday" | "weekend"
    part: str   # morning | afternoon | evening | night

    @classmethod
    def of(cls, ts: float, zone: tzinfo) -> When:
        local = datetime.fromtimestamp(ts, tz=zone)
        day = local.date().toordinal()
        return cls(day, day - local.weekday(), "weekend" if local.weekday() >= 5 else "weekday",
                   part_of_day(local.hour))


# -- counting -------------------------------------------------------------------


@dataclass
class Tally:
    """What supports one candidate pattern."""

    weeks: set[int] = field(default_factory=set)
    days: set[int] = field(default_factory=set)
    count: int = 0
    questions: int = 0
    first_at: float = math.inf
    last_at: float = -math.inf
    turns: list[int] = field(default_factory=list)  # the latest supporting turns
    sources: Counter[str] = field(default_factory=Counter)
    said: Counter[str] = field(default_factory=Counter)  # how the topic was written
    ids: set[int] = field(default_factory=set)  # every supporting turn
    order: int = 0  # the topic's place among the latest turn's topics

    def add(self, turn: Row, when: When, said: str, question: bool, keep: int,
            order: int = 0) -> None:
        self.ids.add(turn["id"])
        self.order = order
        self.weeks.add(when.week)
        self.days.add(when.day)
        self.count += 1
        self.questions += int(question)
        self.first_at = min(self.first_at, turn["created_at"])
        self.last_at = max(self.last_at, turn["created_at"])
        self.turns.append(turn["id"])
        if len(self.turns) > keep:
            del self.turns[0]
        self.sources[turn["source"]] += 1
        self.said[said] += 1

    @property
    def shown(self) -> str:
        return max(self.said, key=lambda s: (self.said[s], s)) if self.said else ""


@dataclass(frozen=True)
class Candidate:
    subject: str
    key: str
    value: str
    strength: float
    first_at: float
    turns: tuple[int, ...]
    source: str
    shape: str


_NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight",
                 "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
                 "sixteen", "seventeen", "eighteen", "nineteen", "twenty")


def in_words(n: int) -> str:
    """A count as the value says it (numbers in words: the support check reads
    digits as dates that the cited turns would have to contain)."""
    return _NUMBER_WORDS[n] if 0 <= n < len(_NUMBER_WORDS) else "more than twenty"


def _weeks(n: int) -> str:
    return "in one week" if n == 1 else f"in {in_words(n)} different weeks"


def strength(weeks: int, last_at: float, now: float, p: PatternParams) -> float:
    """How sure the pattern is now: its support, faded by its silence."""
    base = min(p.max_confidence, weeks / (weeks + 2.0)) if weeks > 0 else 0.0
    silent = max(0.0, (now - last_at) / DAY - p.grace_days)
    return base * 0.5 ** (silent / p.fade_half_life_days)


def _step(x: float) -> float:
    return math.floor(round(x / STEP, 6)) * STEP


# -- people ------------------------------------------------------------------------

_NAME_FULL = re.compile(rf"^{NAME}$")


def known_people(store: Store) -> set[str]:
    """Names of people the facts about the household relate to the speakers
    (what the relation rules found and the facts job wrote)."""
    singles = sorted({v.replace(" ", "_") for v in SINGLE_RELATIONS.values()})
    marks = ",".join("?" for _ in singles)
    names: set[str] = set()
    for row in store.rows(
            "SELECT subject FROM facts WHERE kind = 'user_specific' AND disabled = 0"
            " AND key LIKE 'relation\\_to\\_%' ESCAPE '\\'"):
        names.add(str(row["subject"]))
    for row in store.rows(
            f"SELECT value FROM facts WHERE kind = 'user_specific' AND disabled = 0"
            f" AND key IN ({marks})", singles):
        names.add(str(row["value"]))
    return {" ".join(n.split()) for n in names if _NAME_FULL.match(" ".join(n.split()))}


# -- the job ------------------------------------------------------------------------


@dataclass
class Outcome:
    new: int = 0
    reinforced: int = 0
    superseded: int = 0
    faded: int = 0
    retired: int = 0
    refused: int = 0

    @property
    def items(self) -> int:
        return self.new + self.reinforced + self.superseded + self.faded + self.retired

    def detail(self, turns: int, candidates: int) -> str:
        return (f"{turns} user turns read, {candidates} patterns seen; {self.new} new, "
                f"{self.superseded} with more support, {self.reinforced} reinforced, "
                f"{self.faded} faded, {self.retired} retired"
                + (f", {self.refused} refused" if self.refused else ""))


class PatternsJob:
    def __init__(self, params: PatternParams | None = None) -> None:
        self.p = params or PatternParams()

    def __call__(self, ctx: JobContext) -> JobResult:
        zone = household_zone(ctx.settings.household.timezone)
        now = ctx.clock.now()
        today = datetime.fromtimestamp(now, tz=zone).date().toordinal()
        last_turn = int(ctx.store.scalar("SELECT coalesce(max(id), 0) FROM transcript"))
        seen = get_state(ctx.store, JOB, "seen", {"turn": -1, "day": None})
        if seen.get("turn") == last_turn and seen.get("day") == today:
            return JobResult(items=0, detail="nothing new")
        profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
        people = known_people(ctx.store)
        tallies, read = self._count(ctx.store, profiles, zone, people)
        candidates = self._candidates(tallies, now)
        published: dict[str, Any] = get_state(ctx.store, JOB, "published", {})
        outcome = Outcome()
        more = self._apply(ctx, candidates, published, now, outcome)
        if not more:
            set_state(ctx.store, JOB, "seen", {"turn": last_turn, "day": today})
        detail = outcome.detail(read, len(candidates))
        log.info("patterns job: %s", detail)
        return JobResult(items=outcome.items, detail=detail, more=more)

    # -- reading ------------------------------------------------------------

    def _count(self, store: Store, profiles: MemoryProfiles, zone: tzinfo,
               people: set[str]) -> tuple[dict[tuple[str, ...], Tally], int]:
        """Tallies by (speaker, shape, ...): ("S", "slot", topic, daytype, part),
        ("S", "topic", topic), ("S", "person", name). Two passes over the turns:
        the first finds the topics said in enough distinct weeks, the second
        tallies only those (a household's vocabulary is large, its habits few)."""
        name_forms = frozenset(_fold(w) for n in people for w in n.split())
        mention = (re.compile(r"(?<!\w)(" + "|".join(
            re.escape(n) for n in sorted(people, key=len, reverse=True)) + r")(?!\w)")
            if people else None)
        weeks: dict[tuple[str, str], set[int]] = defaultdict(set)
        for _, speaker, when, found in self._turns(store, profiles, zone, name_forms):
            for form in found:
                weeks[(speaker, form)].add(when.week)
        kept = {k for k, w in weeks.items() if len(w) >= self.p.min_weeks}
        del weeks
        tallies: dict[tuple[str, ...], Tally] = defaultdict(Tally)
        keep = self.p.evidence_turns
        read = 0
        for turn, speaker, when, found in self._turns(store, profiles, zone, name_forms):
            read += 1
            question = is_question(turn["content"])
            for order, (form, said) in enumerate(found.items()):
                if (speaker, form) not in kept:
                    continue
                tallies[(speaker, "topic", form)].add(turn, when, said, question, keep, order)
                tallies[(speaker, "slot", form, when.daytype, when.part)].add(
                    turn, when, said, question, keep, order)
            if mention is not None:
                for name in {m.group(1) for m in mention.finditer(turn["content"])}:
                    if name.casefold() != speaker.casefold():
                        tallies[(speaker, "person", name)].add(turn, when, name, question,
                                                               keep)
        return tallies, read

    @staticmethod
    def _turns(store: Store, profiles: MemoryProfiles, zone: tzinfo, names: frozenset[str]
               ) -> Iterator[tuple[Row, str, When, dict[str, str]]]:
        """Each user turn that counts as behaviour: the row, its speaker, when, its topics."""
        after = 0
        while True:
            rows = store.rows(
                "SELECT id, source, speaker, content, created_at FROM transcript"
                " WHERE id > ? AND role = 'user' AND disabled = 0"
                f" AND {privacy.SHAREABLE} ORDER BY id LIMIT ?",
                (after, PAGE))
            for turn in rows:
                if not profiles.for_source(turn["source"]).patterns:
                    continue
                speaker = " ".join(str(turn["speaker"] or USER_SUBJECT).split())
                own = frozenset(_fold(w) for w in speaker.split())
                yield (turn, speaker, When.of(turn["created_at"], zone),
                       topics(turn["content"], names | own))
            if len(rows) < PAGE:
                return
            after = rows[-1]["id"]

    def _candidates(self, tallies: dict[tuple[str, ...], Tally],
                    now: float) -> dict[tuple[str, str], Candidate]:
        """Every pattern the tallies support, by (subject, key)."""
        p = self.p
        out: dict[tuple[str, str], Candidate] = {}
        routine_topics: set[tuple[str, str]] = set()

        def put(subject: str, key: str, value: str, tally: Tally, shape: str) -> None:
            out[(subject, key)] = Candidate(
                subject, key[:200], value, strength(len(tally.weeks), tally.last_at, now, p),
                tally.first_at, tuple(tally.turns),
                max(tally.sources, key=lambda s: (tally.sources[s], s)), shape)

        def together(keys: list[tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
            """Topics said in exactly the same turns are one topic ("dog food")."""
            groups: dict[tuple[Any, ...], list[tuple[str, ...]]] = defaultdict(list)
            for key in keys:
                groups[(*key[:2], *key[3:], frozenset(tallies[key].ids))].append(key)
            return [sorted(g, key=lambda k: (tallies[k].order, k)) for g in groups.values()]

        def name(group: list[tuple[str, ...]]) -> tuple[str, str]:
            return ("_".join(slug(k[2]) for k in group),
                    " ".join(tallies[k].shown for k in group))

        slots = [k for k in sorted(tallies) if k[1] == "slot"]
        for group in sorted(together(slots), key=lambda g: g[0]):
            speaker, _, form, daytype, part = group[0]
            tally = tallies[group[0]]
            total = tallies[(speaker, "topic", form)].count
            if len(tally.weeks) < p.min_weeks or tally.count < p.routine_share * total:
                continue
            verb = "asks about" if tally.questions * 2 >= tally.count else "talks about"
            routine_topics.update((speaker, k[2]) for k in group)
            key, shown = name(group)
            put(speaker, f"{KEY_PREFIX}routine_{key}_{daytype}_{part}",
                f"{verb} {shown} on {daytype} {part}s ({_weeks(len(tally.weeks))})",
                tally, "routine")
        plain = [k for k in sorted(tallies) if k[1] == "topic"]
        for group in sorted(together(plain), key=lambda g: g[0]):
            speaker = group[0][0]
            tally = tallies[group[0]]
            if len(tally.weeks) < p.min_weeks or len(tally.days) < p.min_days:
                continue
            if any((speaker, k[2]) in routine_topics for k in group):
                continue  # a routine says it better
            key, shown = name(group)
            put(speaker, f"{KEY_PREFIX}topic_{key}",
                f"often talks about {shown} ({_weeks(len(tally.weeks))})", tally, "topic")
        for person in sorted(k for k in tallies if k[1] == "person"):
            speaker, _, what = person
            tally = tallies[person]
            if len(tally.weeks) >= p.min_weeks and len(tally.days) >= p.min_days:
                put(speaker, f"{KEY_PREFIX}person_{slug(what)}",
                    f"often mentions {what} ({_weeks(len(tally.weeks))})", tally, "person")
        return out

    # -- writing -----------------------------------------------------------

    def _apply(self, ctx: JobContext, candidates: dict[tuple[str, str], Candidate],
               published: dict[str, Any], now: float, outcome: Outcome) -> bool:
        """Publish, reinforce, fade and retire; False when done, True when out of time."""
        p = self.p
        # New patterns: the strongest few per speaker and shape.
        fresh: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
        for (subject, key), found in candidates.items():
            if _state_key(subject, key) not in published and found.strength >= p.floor:
                fresh[(subject, found.shape)].append(found)
        live: Counter[tuple[str, str]] = Counter(
            (_split_state_key(k)[0], r.get("shape", "")) for k, r in published.items()
            if r.get("fact") and not r.get("retired") and not r.get("suppressed"))
        allowed = {(c.subject, c.key) for (subject, shape), group in fresh.items()
                   for c in sorted(group, key=lambda c: (-c.strength, c.key))[
                       :max(0, p.max_live - live[(subject, shape)])]}
        keys = sorted(set(candidates) | {_split_state_key(k) for k in published})
        for subject, key in keys:
            if ctx.out_of_time():
                return True
            state_key = _state_key(subject, key)
            record = published.get(state_key)
            cand = candidates.get((subject, key))
            if record is None and (subject, key) not in allowed:
                continue
            if record is not None and record.get("suppressed"):
                continue
            new_record = self._one(ctx, subject, key, cand, record, now, outcome)
            if new_record != record:
                published[state_key] = new_record
                set_state(ctx.store, JOB, "published", published)
        return False

    def _one(self, ctx: JobContext, subject: str, key: str, cand: Candidate | None,
             record: dict[str, Any] | None, now: float, outcome: Outcome) -> dict[str, Any]:
        p = self.p
        current = ctx.store.row(
            "SELECT * FROM facts WHERE subject = ? AND key = ? AND valid_to IS NULL"
            " ORDER BY id DESC LIMIT 1", (subject, key))
        record = dict(record or {})
        if record.get("fact") is not None and current is None:
            return {**record, "suppressed": True}  # forgotten by the user: never brought back
        if current is not None and current["disabled"] and not record.get("retired"):
            return {**record, "suppressed": True}  # disabled by the user
        if current is not None and (current["user_managed"]
                                    or current["memory_level"] == "seared"):
            return {**record, "suppressed": True}  # the user's own words
        power = 0.0 if cand is None else cand.strength
        if power < p.floor:
            if current is not None and not current["disabled"] and record.get("fact"):
                ctx.writer.change(Ref("fact", int(current["id"])), "disable", WRITER)
                outcome.retired += 1
                return {**record, "retired": True, "claim": _step(power)}
            return record
        assert cand is not None
        if current is not None and current["value"] == cand.value:
            if current["disabled"]:  # retired, and strong enough again
                ctx.writer.change(Ref("fact", int(current["id"])), "enable", WRITER)
                record["retired"] = False
            claim = _step(power)
            if claim == record.get("claim"):
                return record
            written = self._write(ctx, cand, None, outcome)
            if written is None:
                return record
            fact_id = written[0]
            if claim < float(record.get("claim") or 0.0):
                outcome.faded += 1
            else:
                outcome.reinforced += 1
            return {**record, "fact": fact_id, "claim": claim}
        if record.get("lost") == cand.value:
            return record  # this claim lost once: not again on every run
        written = self._write(ctx, cand, cand.first_at if current is None else None, outcome)
        if written is None:
            return record
        fact_id, action = written
        if action == "keep":  # a stronger claim is in force (the support fell): keep it
            outcome.refused += 1
            return {**record, "lost": cand.value}
        if current is None:
            outcome.new += 1
        else:
            outcome.superseded += 1
        return {"fact": fact_id, "claim": _step(power), "retired": False, "shape": cand.shape}

    def _write(self, ctx: JobContext, cand: Candidate, valid_from: float | None,
               outcome: Outcome) -> tuple[int, str] | None:
        cites = _evidence(ctx.store, cand.turns)
        fact = FactIn(kind=KIND, subject=cand.subject, key=cand.key, value=cand.value,
                      confidence=round(min(1.0, max(0.0, cand.strength)), 4),
                      source=cand.source, provenance=[*cites, f"rule:{JOB}"],
                      valid_from=valid_from)
        try:
            fact_id, decision = ctx.writer.add_fact(fact, WRITER)
        except StaleCitation:  # an evidence turn forgotten since it was read: next run
            log.info("patterns job: a pattern cites a turn forgotten since it was read;"
                     " skipped")
            return None
        except ValueError as exc:  # a muted source, an unknown kind: a setup mistake
            outcome.refused += 1
            log.warning("patterns job: pattern refused: %s", type(exc).__name__)
            return None
        return fact_id, decision.action


def _state_key(subject: str, key: str) -> str:
    return f"{key}\x1f{subject}"


def _split_state_key(text: str) -> tuple[str, str]:
    key, _, subject = text.partition("\x1f")
    return subject, key


def _evidence(store: Store, turn_ids: Iterable[int]) -> list[str]:
    """``turn:N`` refs, newest first, and the live leaf episodes citing them."""
    ids = sorted(set(turn_ids), reverse=True)
    if not ids:
        return []
    marks = ",".join("?" for _ in ids)
    episodes = [r["id"] for r in store.rows(
        f"SELECT DISTINCT e.id FROM episode_citations c JOIN episodes e ON e.id = c.episode_id"
        f" WHERE c.transcript_id IN ({marks}) AND e.level = 0 AND e.disabled = 0"
        f" ORDER BY e.id DESC", ids)]
    return [f"turn:{i}" for i in ids] + [f"episode:{e}" for e in episodes]


def run(ctx: JobContext) -> JobResult:
    """The ``patterns`` job (a :data:`runtime.mind.contract.JobFn`)."""
    return PatternsJob()(ctx)
