"""The ``facts`` job: new episodes and "remember: ..." turns become facts.

Three inputs, each with its own progress in ``job_state``:

- **"remember: ..." turns** (``remember: X``, ``remember that X``, from a
  source whose profile feeds facts): explicit, so they bypass quality gating.
  What the rules find in X is written user-managed at confidence 1.0; when
  they find nothing, X itself is a user-managed ``document`` note of the
  speaker, keyed by its topic (:func:`runtime.mind.extract_rules.note_key`), so a
  later note on the same topic supersedes it.
- **the user's profile instructions** ("remove X from my goals", "my goal is
  to ...": :mod:`runtime.mind.spoken_profile`) are applied to the profile first,
  and their sentences are not read for facts;
- **new leaf episodes**: the rules (:mod:`runtime.mind.extract_rules`) read each
  cited turn whose source feeds facts, knowing its speaker. Disabled episodes
  and turns, and "remember" turns (already handled), are skipped.

Every fact cites its turn (``turn:N``), its episode (``episode:N``) and the
rule that produced it (``rule:<name>``); it is valid from when the turn was
said. Before it is written it must pass the word-for-word support check
(:mod:`runtime.mind.support`); those that fail are counted, not written.

A "remember: ..." turn answered by the Turns actor was stored during the turn
(:mod:`runtime.mind.remember`): a fact citing it exists, so the job skips it.

Near-duplicates reinforce: subjects match an existing subject regardless of
case, keys are normalised by the rules, and a value equal to the current
one but for case, punctuation or articles is written as the current value,
so the graph reinforces it. A different value for the same subject and key
supersedes (the graph closes the old window) or is kept as a losing claim.

Progress: a cursor per input (``after``: the last unit fully done; ``at`` and
``done``: the unit in progress and how many of its facts are written) is
saved after every fact, so a crash resumes without writing a fact twice (the
one exception: a crash between the writer's commit and the cursor's save
counts that one fact's claim twice; it never adds a row). The run stops
between units when :meth:`JobContext.out_of_time` says so, with ``more``.

With a real language model configured (a provider other than the offline
one), each episode's eligible turns go to it in chunks of at most 12, with a
JSON prompt (:data:`PROMPT`) asking for facts in the closed kind set, each
citing one of the chunk's turns. The answer is validated
(:class:`LLMFacts`): any invalid answer, an error of every provider, or an
answer from the offline provider makes that chunk fall back to the rules;
the job never crashes on it. LLM facts cite ``rule:llm`` and pass the same
support check. Resuming after a crash skips the facts already written by
count, which assumes the model answers the same twice; when it does not, a
fact may be skipped or reinforced once more (never a duplicate row).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.llm.providers import ChatMessage, FallbackChain, LLMError, LLMRequest
from runtime.memories import privacy
from runtime.memories.cited import StaleCitation
from runtime.memories.facts import FactIn
from runtime.memories.profiles import MemoryProfiles
from runtime.mind.contract import JobContext, JobResult
from runtime.mind.extract_rules import KIND_NOTE, Candidate, extract, note_key, remembered, slug
from runtime.mind.spoken_profile import apply_spoken, facts_text
from runtime.mind.support import missing_terms, turn_text
from runtime.store.database import Row, Store
from runtime.store.job_state import get_state, set_state

log = logging.getLogger(__name__)

JOB = "facts"
WRITER = "facts"
USER_SUBJECT = "user"
BATCH = 100  # units read from the store at a time

Extractor = Callable[[str, str], list[Candidate]]

EVIDENCE_PER_CALL = 12  # turns per LLM call
LLM_KINDS = ("user_specific", "behavioral_pattern", "place", "document")
PROMPT = (
    'You extract durable facts about people from a conversation. Answer only with'
    ' JSON: {"facts": [{"kind": K, "subject": S, "key": KEY, "value": V,'
    ' "confidence": C, "turn": T}]}, where K is one of ' + ", ".join(LLM_KINDS) + ';'
    ' S is the person the fact is about (the speaker\'s name when they say "I"); KEY a'
    ' short snake_case attribute ("lives_in", "occupation", "sister"); V the value,'
    ' using names, places and dates exactly as written in the turn; C a number from 0'
    ' to 1; T the id of the one turn that states it. Only facts stated in the turns;'
    ' no guesses. {"facts": []} when there are none.')


class LLMFact(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kind: str
    subject: str = Field(min_length=1, max_length=200)
    key: str = Field(min_length=1, max_length=120)
    value: str = Field(min_length=1, max_length=500)
    confidence: float = Field(ge=0.0, le=1.0)
    turn: int


class LLMFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    facts: list[LLMFact] = Field(max_length=50)


def _real_llm(llm: FallbackChain) -> bool:
    return any(not getattr(p, "last_resort", False) for p in llm.providers)


def parse_llm_facts(text: str, turn_ids: set[int]) -> list[LLMFact] | None:
    """The facts of a model's answer, or None when the answer is not valid
    (not JSON, wrong shape, a kind outside :data:`LLM_KINDS`, a turn it was
    not given)."""
    body = text.strip()
    fenced = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        parsed = LLMFacts.model_validate(json.loads(body))
    except (ValueError, ValidationError):
        return None
    if any(f.kind not in LLM_KINDS or f.turn not in turn_ids for f in parsed.facts):
        return None
    return parsed.facts


@dataclass
class Planned:
    """A fact ready to write, and the turn text it must be supported by."""

    fact: FactIn
    evidence: str


@dataclass
class Tally:
    units: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    unsupported: int = 0
    refused: int = 0
    stale: int = 0  # citing a memory forgotten since it was read (runtime.memories.cited)
    llm_fallbacks: int = 0  # chunks the model failed on, read by the rules instead

    @property
    def written(self) -> int:
        return sum(self.actions.values())

    def detail(self) -> str:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(self.actions.items())) or "none"
        return (f"{self.units['episode']} episodes, {self.units['remember']} remember turns; "
                f"{self.written} facts ({acts}); {self.unsupported} unsupported, "
                f"{self.refused} refused"
                + (f", {self.stale} citing forgotten memories" if self.stale else "")
                + (f"; {self.llm_fallbacks} LLM fallbacks" if self.llm_fallbacks else ""))


def _norm_value(value: str) -> str:
    words = re.findall(r"\w+", value.lower().replace("\u2019", "'"))
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def _speaker(turn: Row) -> str:
    return " ".join(str(turn["speaker"] or USER_SUBJECT).split())


class FactsJob:
    """The job with its extractor (the rules unless a test gives another)."""

    def __init__(self, extractor: Extractor = extract) -> None:
        self.extractor = extractor

    def __call__(self, ctx: JobContext) -> JobResult:
        profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
        tally = Tally()
        applied = apply_spoken(ctx)  # the user's profile instructions: runtime.mind.spoken_profile
        more = self._remember_turns(ctx, profiles, tally)
        if not more:
            more = self._episodes(ctx, profiles, tally)
        detail = tally.detail() + (f"; profile: {applied} applied" if applied else "")
        log.info("facts job: %s", detail)
        return JobResult(items=tally.written + applied, detail=detail, more=more)

    # -- inputs -----------------------------------------------------------

    def _remember_turns(self, ctx: JobContext, profiles: MemoryProfiles, tally: Tally) -> bool:
        cursor = get_state(ctx.store, JOB, "turns", {"after": 0, "at": None, "done": 0})
        end = int(ctx.store.scalar("SELECT coalesce(max(id), 0) FROM transcript"))
        while True:
            rows = ctx.store.rows(
                "SELECT * FROM transcript WHERE id > ? AND id <= ? AND disabled = 0"
                " AND content LIKE '%remember%' ORDER BY id LIMIT ?",
                (cursor["after"], end, BATCH))
            for turn in rows:
                if ctx.out_of_time():
                    return True
                by_turn = cursor.get("at") != turn["id"] and stored_from_turn(
                    ctx.store, turn["id"])  # stored during the turn (not a crashed run's)
                planned = [] if by_turn else self._plan_remember(turn, profiles)
                if planned:
                    tally.units["remember"] += 1
                cursor = self._write_unit(ctx, "turns", cursor, turn["id"], planned, tally)
            if len(rows) < BATCH:
                break
        if cursor["after"] < end:  # the turns after the last match: nothing to do
            cursor = {"after": end, "at": None, "done": 0}
            set_state(ctx.store, JOB, "turns", cursor)
        return False

    def _episodes(self, ctx: JobContext, profiles: MemoryProfiles, tally: Tally) -> bool:
        cursor = get_state(ctx.store, JOB, "episodes", {"after": 0, "at": None, "done": 0})
        while True:
            rows = ctx.store.rows(
                "SELECT id, disabled FROM episodes WHERE id > ? AND level = 0"
                " ORDER BY id LIMIT ?", (cursor["after"], BATCH))
            for episode in rows:
                if ctx.out_of_time():
                    return True
                planned = [] if episode["disabled"] else self._plan_episode(
                    ctx, episode["id"], profiles, tally)
                tally.units["episode"] += 1
                cursor = self._write_unit(ctx, "episodes", cursor, episode["id"], planned,
                                          tally)
            if len(rows) < BATCH:
                return False

    # -- planning ---------------------------------------------------------

    def _plan_remember(self, turn: Row, profiles: MemoryProfiles) -> list[Planned]:
        text = remembered(turn["content"])
        if text is None or not profiles.for_source(turn["source"]).facts:
            return []
        who = _speaker(turn)
        cands = self.extractor(text, who) or [Candidate(
            KIND_NOTE, who, note_key(text), text, 1.0, "remember")]
        return [self._planned(c, turn, None, user_managed=True) for c in cands]

    def _plan_episode(self, ctx: JobContext, episode_id: int, profiles: MemoryProfiles,
                      tally: Tally) -> list[Planned]:
        turns = [{**t, "content": facts_text(t["content"])} for t in ctx.store.rows(
            "SELECT t.* FROM episode_citations c JOIN transcript t ON t.id = c.transcript_id"
            " WHERE c.episode_id = ? AND t.disabled = 0 ORDER BY t.id", (episode_id,))
            if profiles.for_source(t["source"]).facts
            and remembered(t["content"]) is None  # explicit: written from the turn itself
            and facts_text(t["content"])]  # less profile instructions: applied, not facts
        use_llm = _real_llm(ctx.llm)
        out: list[Planned] = []
        for start in range(0, len(turns), EVIDENCE_PER_CALL):
            chunk = turns[start:start + EVIDENCE_PER_CALL]
            found = self._llm_chunk(ctx.llm, chunk, episode_id) if use_llm else None
            if found is None:
                if use_llm:
                    tally.llm_fallbacks += 1
                found = [self._planned(cand, turn, episode_id, user_managed=False)
                         for turn in chunk
                         for cand in self.extractor(turn["content"], _speaker(turn))]
            out.extend(found)
        return out

    def _llm_chunk(self, llm: FallbackChain, turns: list[Row],
                   episode_id: int) -> list[Planned] | None:
        """Facts the model finds in ``turns``, or None when it gave no valid answer."""
        lines = "\n".join(f"[{t['id']}] {_speaker(t)}: {' '.join(t['content'].split())}"
                          for t in turns)
        request = LLMRequest(messages=[ChatMessage(role="system", content=PROMPT),
                                       ChatMessage(role="user", content=lines)],
                             temperature=0.0)
        try:
            completion = llm.complete(request)
        except LLMError as exc:
            log.warning("facts job: language model failed (%s); using the rules", exc.kind)
            return None
        if completion.provider == "offline":
            return None
        facts = parse_llm_facts(completion.text, {t["id"] for t in turns})
        if facts is None:
            log.warning("facts job: invalid answer from %s; using the rules", completion.provider)
            return None
        by_id = {t["id"]: t for t in turns}
        out = []
        for f in facts:
            key = slug(f.key)
            if not key:
                continue
            cand = Candidate(f.kind, " ".join(f.subject.split()), key[:120],
                             " ".join(f.value.split()), f.confidence, "llm")
            out.append(self._planned(cand, by_id[f.turn], episode_id, user_managed=False))
        return out

    @staticmethod
    def _planned(cand: Candidate, turn: Row, episode_id: int | None,
                 user_managed: bool) -> Planned:
        provenance = [f"turn:{turn['id']}"]
        if episode_id is not None:
            provenance.insert(0, f"episode:{episode_id}")
        provenance.append(f"rule:{cand.rule}")
        fact = FactIn(kind=cand.kind, subject=cand.subject, key=cand.key, value=cand.value,
                      confidence=1.0 if user_managed else cand.confidence,
                      source=turn["source"], provenance=provenance,
                      valid_from=turn["created_at"], user_managed=user_managed,
                      # codes, health, money: proposed sensitive; the graph adds
                      # its turn's mark and speaker (runtime.memories.privacy)
                      sensitive=privacy.proposed(cand.key, cand.value) is not None)
        return Planned(fact, turn_text(turn["speaker"], turn["content"]))

    # -- writing ----------------------------------------------------------

    def _write_unit(self, ctx: JobContext, name: str, cursor: dict[str, int | None],
                    unit: int, planned: list[Planned], tally: Tally) -> dict[str, int | None]:
        """Write one unit's facts, skipping those a crashed run already wrote;
        save the cursor after each fact and when the unit is done."""
        skip = int(cursor["done"] or 0) if cursor.get("at") == unit else 0
        for index, item in enumerate(planned):
            if index < skip:
                continue
            missing = missing_terms(item.fact.subject, item.fact.value, [item.evidence])
            if missing:
                tally.unsupported += 1
                log.info("facts job: unsupported fact skipped (%d terms missing)", len(missing))
            else:
                self._write(ctx, item.fact, tally)
            cursor = {"after": cursor["after"], "at": unit, "done": index + 1}
            set_state(ctx.store, JOB, name, cursor)
        cursor = {"after": unit, "at": None, "done": 0}
        set_state(ctx.store, JOB, name, cursor)
        return cursor

    def _write(self, ctx: JobContext, fact: FactIn, tally: Tally) -> None:
        fact = _canonical(ctx.store, fact)
        try:
            _, decision = ctx.writer.add_fact(fact, WRITER)
        except StaleCitation:  # its turn or episode forgotten since it was read: skipped
            tally.stale += 1
            log.info("facts job: a fact cites a memory forgotten since it was read; skipped")
            return
        except ValueError as exc:  # UnknownFactKind, MutedSource: a rule's mistake
            tally.refused += 1
            log.warning("facts job: fact refused: %s", type(exc).__name__)
            return
        tally.actions[decision.action] += 1


def _canonical(store: Store, fact: FactIn) -> FactIn:
    """The fact with the subject spelled as stored and, when its value equals
    the current one but for case, punctuation or articles, the current value
    (so that the graph reinforces it)."""
    subject = store.scalar(
        "SELECT subject FROM facts WHERE subject = ? COLLATE NOCASE ORDER BY id LIMIT 1",
        (fact.subject,)) or fact.subject
    value = fact.value
    current = store.scalar(
        "SELECT value FROM facts WHERE subject = ? AND key = ? AND valid_to IS NULL"
        " ORDER BY id DESC LIMIT 1", (subject, fact.key))
    if current is not None and _norm_value(current) == _norm_value(value):
        value = current
    if subject == fact.subject and value == fact.value:
        return fact
    return fact.model_copy(update={"subject": subject, "value": value})


def remember_facts(turn: Row, profiles: MemoryProfiles) -> list[FactIn]:
    """What a "remember: ..." turn asks for, as this job writes it (its rules,
    user-managed, citing the turn), less what the turn does not support: the
    Turns actor stores these during the turn (``runtime.mind.remember``)."""
    return [p.fact for p in FactsJob()._plan_remember(turn, profiles)
            if not missing_terms(p.fact.subject, p.fact.value, [p.evidence])]


def stored_from_turn(store: Store, turn_id: int) -> bool:
    """Whether a fact citing turn ``turn_id`` exists already (stored during the
    turn itself): the job then does not store it a second time."""
    return store.scalar(
        "SELECT 1 FROM facts, json_each(facts.provenance) j WHERE j.value = ? LIMIT 1",
        (f"turn:{turn_id}",)) is not None


def run(ctx: JobContext) -> JobResult:
    """The ``facts`` job (a :data:`runtime.mind.contract.JobFn`) with the offline rules."""
    return FactsJob()(ctx)
