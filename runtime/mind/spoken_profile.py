"""The user's spoken instructions about their profile, applied by the ``facts`` job.

"Remove sailing from my interests", "add Go to my skills", "my goal is to run
a marathon", "I finally earned the CKA": said in a turn, these are **applied**
to the profile (``runtime.memories.user_profile``), never recorded as if they were facts
(the facts job reads a turn for facts less these sentences: :func:`facts_text`).

The offline rules (English; one sentence at a time, :func:`spoken_ops`):

- ``remove|delete|drop X from|off|out of my FIELD`` → ``FIELD_remove``;
- ``add X to my FIELD`` → ``FIELD`` (an upsert);
- ``my (new|main) goal is (to) X`` → ``goals``;
- ``I (have|'ve) (just|finally) finished|completed|achieved|earned|passed|reached X``
  → ``goals_done`` of the active goal X names, if one does: "I earned the
  CKA" finishes the goal "earn the CKA"; "I finished the dishes" names no goal
  and changes nothing (and, being an event, stays for the fact rules).

An item to remove or finish is matched against the active items of its field
(:func:`resolve`): the same text but for case, parentheticals and status words,
or one containing the other word for word; an instruction naming nothing
active is skipped. FIELD is one of goals, skills, interests, certifications
(and directives, for removal).

Which turns: user turns, not disabled, not sensitive, from a source whose
memory profile feeds facts, each read once (a cursor in ``job_state``, key
``profile`` of the ``facts`` job). The profile is the household's one user
profile: whoever says it. Written through the job writer
(``ctx.writer.update_profile``: the Graph actor, or ``runtime.memory.Memory``),
source ``spoken``, writer ``facts``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from runtime.memories.profiles import MemoryProfiles
from runtime.memories.user_profile import ProfileOp, norm
from runtime.mind.contract import JobContext
from runtime.store.database import Store
from runtime.store.job_state import get_state, set_state

log = logging.getLogger(__name__)

JOB = "facts"
KEY = "profile"
WRITER = "facts"
SOURCE = "spoken"
BATCH = 500
_LISTS = r"(?P<field>goals|skills|interests|certifications|directives)"
_ITEM = r"(?P<item>[^.!?;]+?)"
_REMOVE = re.compile(
    rf"\b(?:remove|delete|drop|take)\s+{_ITEM}\s+(?:from|off|out of)\s+my\s+{_LISTS}\b", re.I)
_ADD = re.compile(
    rf"\badd\s+{_ITEM}\s+to\s+my\s+(?P<field>goals|skills|interests|certifications)\b", re.I)
_GOAL = re.compile(r"\bmy\s+(?:new\s+|main\s+)?goal\s+is\s+(?:to\s+)?(?P<item>[^.!?;]+)",
                   re.I)
_DONE = re.compile(
    r"\bI\s*(?:have\s+|['\u2019]ve\s+)?(?:just\s+|finally\s+)?(?:finished|completed|achieved|"
    r"earned|passed|reached)\s+(?P<item>[^.!?;,]+)", re.I)
_PREFILTER = ("goal", "from my", "off my", "out of my", "to my", "finished", "completed",
              "achieved", "earned", "passed", "reached")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?;])\s+|\n+", text) if s.strip()]


def _clean(item: str) -> str:
    return " ".join(item.strip(" ,:'\"").split())


def is_instruction(sentence: str) -> bool:
    """Whether ``sentence`` is an instruction to change the profile (to remove,
    add, or set a goal)."""
    return any(p.search(sentence) for p in (_REMOVE, _ADD, _GOAL))


def facts_text(text: str) -> str:
    """``text`` less its profile instructions: what fact extraction may read ("" when
    nothing is left). A sentence saying something was finished stays: it is also an
    event."""
    if not any(p.search(text) for p in (_REMOVE, _ADD, _GOAL)):
        return text
    return " ".join(s for s in _sentences(text) if not is_instruction(s))


def _contains(whole: str, part: str) -> bool:
    return bool(part) and f" {part} " in f" {whole} "


def resolve(spoken: str, active: Sequence[str]) -> list[str]:
    """The active items ``spoken`` names: the same match key, else those whose key
    contains it word for word (or is contained in it)."""
    key = norm(spoken)
    if not key:
        return []
    same = [a for a in active if norm(a) == key]
    return same or [a for a in active if _contains(norm(a), key) or _contains(key, norm(a))]


def spoken_ops(text: str, active: dict[str, list[str]]) -> list[ProfileOp]:
    """The profile operations ``text`` asks for, given the active items by field."""
    ops: list[ProfileOp] = []
    for sentence in _sentences(text):
        if m := _REMOVE.search(sentence):
            field = m.group("field").lower()
            ops += [ProfileOp(field=field, op="remove", value=a)
                    for a in resolve(_clean(m.group("item")), active.get(field, []))]
        elif m := _ADD.search(sentence):
            item = _clean(m.group("item"))
            if norm(item):
                ops.append(ProfileOp(field=m.group("field").lower(), value=item[:500]))
        elif m := _GOAL.search(sentence):
            item = _clean(m.group("item"))
            if norm(item):
                ops.append(ProfileOp(field="goals", value=item[:500]))
        elif m := _DONE.search(sentence):
            ops += [ProfileOp(field="goals", op="done", value=a)
                    for a in resolve(_clean(m.group("item")), active.get("goals", []))]
    return ops


def _active(store: Store) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for row in store.rows("SELECT field, value FROM profile_items WHERE status = 'active'"
                          " ORDER BY id"):
        out.setdefault(str(row["field"]), []).append(str(row["value"]))
    return out


def apply_spoken(ctx: JobContext) -> int:
    """Apply the instructions of the user turns said since the last run; the
    number of operations applied (one refused, e.g. already done, is skipped)."""
    profiles = MemoryProfiles.load(ctx.settings.memory.profiles_file)
    after = int(get_state(ctx.store, JOB, KEY, 0))
    end = int(ctx.store.scalar("SELECT coalesce(max(id), 0) FROM transcript"))
    like = " OR ".join("content LIKE ?" for _ in _PREFILTER)
    applied = 0
    while after < end and not ctx.out_of_time():
        rows = ctx.store.rows(
            "SELECT id, source, content FROM transcript WHERE id > ? AND id <= ?"
            f" AND role = 'user' AND disabled = 0 AND sensitive = 0 AND ({like})"
            " ORDER BY id LIMIT ?", (after, end, *(f"%{w}%" for w in _PREFILTER), BATCH))
        for turn in rows:
            if profiles.for_source(turn["source"]).facts:
                for op in spoken_ops(str(turn["content"]), _active(ctx.store)):
                    try:
                        ctx.writer.update_profile([op], SOURCE, WRITER)
                        applied += 1
                    except ValueError as exc:  # nothing left to change: skipped
                        log.info("facts job: profile instruction skipped: %s",
                                 type(exc).__name__)
            after = int(turn["id"])
            set_state(ctx.store, JOB, KEY, after)
        if len(rows) < BATCH:
            after = end
            set_state(ctx.store, JOB, KEY, after)
    return applied
