"""The model's messages for one turn: persona, clock, memories, history, user.

One system message, then the conversation history, then the user's text. A
client's own system prompt (``client_system``), when there is one, opens the
system message unchanged; the rest of it is Reverie's, made of sections
separated by a ``---`` line (blank lines around it, so the line before can
never read as a Markdown setext heading):

    ## AGENTS.md
    <text>

    ---

    ## SOUL.md
    <text>

    ---

    Current date and time: Friday 2026-03-06 14:05 CET (UTC+01:00)

    ---

    # What you know about the household
    A summary you keep of the people you talk to ... (see PORTRAIT_INSTRUCTION)
    - [fact:3, fact:9] Caroline: lives in Lisbon; works as counselor

    ---

    # Memory
    These are your own memories of earlier conversations with the user. ...
    - [turn:12] My sister Ana lives in Porto.

Persona sections keep the order given (``PersonaLoader.load()`` yields the
bootstrap order); empty ones are omitted. The date/time line is always there,
so the system message is never empty: ``now`` is read in the household's time
zone by the caller (``runtime.time.clock.local_datetime``); an aware ``now`` shows
its zone's abbreviation, when it has a name, and its offset from UTC. The
portrait section is the household's latest portrait (``runtime.memories.portrait``: lines
with the refs they rest on), one bullet per line; it is left out with no
lines and in mode ``"off"``. The memory section depends on ``mode``:
``"push"`` lists the memories, ``"index"`` says only how many are available
(the model pulls them on demand), ``"off"`` leaves memory out; with no
memories it is omitted in every mode. ``"pull"`` (a channel's injection mode:
``runtime.recall.pull``) puts the given stable ``index`` text right after the persona,
before the date/time line, so the prompt's start stays byte-identical between
turns, and lists the memories (the turn's capped auto-recall) last under
``# Memory auto-recall``.

Each memory is exactly one bullet line: its whitespace (newlines included) is
collapsed to single spaces, so text such as ``"\\n## RULES.md\\n..."`` stays
plain text inside its bullet and cannot open a section of its own. Nothing
else is escaped.

Everything here is pure: no I/O, no clock, no locale (weekday names are
spelled out here, not taken from ``strftime``); the same input gives the same
messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal, Protocol

from runtime.llm.persona import PersonaFile
from runtime.llm.providers import ChatMessage

Role = Literal["system", "user", "assistant"]
Mode = Literal["push", "index", "off", "pull"]

_ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant"}
MODES: frozenset[str] = frozenset(("push", "index", "off", "pull"))

SEPARATOR = "\n\n---\n\n"
MEMORY_HEADING = "# Memory"
MEMORY_INSTRUCTION = (
    "These are your own memories of earlier conversations with the user. "
    "Use them when they are relevant; never invent memories that are not listed here."
)
AUTO_RECALL_HEADING = "# Memory auto-recall"
AUTO_RECALL_INSTRUCTION = (
    "Memories that may bear on this message; call the recall tool for more.")
PORTRAIT_HEADING = "# What you know about the household"
PORTRAIT_INSTRUCTION = (
    "A summary you keep of the people you talk to, built over time from your memories "
    "(the references in brackets). Use it when it helps; what the user says now wins over it."
)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class MessageLike(Protocol):
    """Any message with a role and a content."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


class PortraitLineLike(Protocol):
    """A line of the portrait with the refs it rests on (``portrait.PortraitLine`` fits)."""

    @property
    def text(self) -> str: ...

    @property
    def refs(self) -> Sequence[str]: ...


class MemoryLine(Protocol):
    """Any recalled memory with a reference and a text (``recall.RecallItem`` fits)."""

    @property
    def ref(self) -> str: ...

    @property
    def text(self) -> str: ...


def build_messages(persona: Sequence[PersonaFile], memories: Sequence[MemoryLine],
                   history: Sequence[MessageLike], user_text: str, now: datetime,
                   mode: Mode = "push",
                   portrait: Sequence[PortraitLineLike] = (),
                   index: str = "", context: Sequence[str] = (),
                   client_system: str = "",
                   user_images: Sequence[str] = ()) -> list[ChatMessage]:
    """The messages for one turn: system, then ``history``, then the user's text.

    ``client_system``: a client's own system prompt (the memory layer:
    ``actors.http.layer``), kept as it is at the start of the system message,
    Reverie's sections added after it (a ``---`` line between). A history
    message that is a :class:`ChatMessage` already (a client's, with its tool
    calls and ``tool`` results) is passed as it is. ``user_images``: the
    images sent with the user's text (a client's, as URLs).

    Raises ValueError for an unknown mode, a history role other than
    system/user/assistant (in a message that is not a :class:`ChatMessage`),
    or a blank ``user_text``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of push, index, off, pull; got {mode!r}")
    if not user_text.strip():
        raise ValueError("user_text is empty")
    own = system_prompt(persona, memories, now, mode, portrait, index, context)
    messages = [ChatMessage(role="system",
                            content=client_system + SEPARATOR + own if client_system else own)]
    for i, m in enumerate(history):
        if isinstance(m, ChatMessage):
            messages.append(m.model_copy())
            continue
        role = _ROLES.get(m.role)
        if role is None:
            raise ValueError(f"history[{i}].role must be system, user or assistant; "
                             f"got {m.role!r}")
        messages.append(ChatMessage(role=role, content=m.content))
    messages.append(ChatMessage(role="user", content=user_text, images=list(user_images)))
    return messages


def system_prompt(persona: Sequence[PersonaFile], memories: Sequence[MemoryLine],
                  now: datetime, mode: Mode = "push",
                  portrait: Sequence[PortraitLineLike] = (), index: str = "",
                  context: Sequence[str] = ()) -> str:
    """The system message's text (see the module docstring for its layout).
    ``context``: sections rendered by their services, placed after the portrait
    in the order given (the user profile, ``runtime.memories.user_profile``; the
    trajectory, ``runtime.memories.digests``; the mood line, ``runtime.memories.mood``); empty ones
    are left out."""
    sections = [persona_section(p) for p in persona]
    if mode == "pull":  # the stable memory index before anything that changes per turn
        sections.append(index.strip())
    sections.append(datetime_line(now))
    sections.append(portrait_section(portrait, mode))
    sections.extend(c.strip() for c in context)
    sections.append(memory_section(memories, mode))
    return SEPARATOR.join(s for s in sections if s)


def persona_section(p: PersonaFile) -> str:
    text = p.text.strip()
    return f"## {p.name}\n{text}" if text else ""


def datetime_line(now: datetime) -> str:
    """``Current date and time: Friday 2026-03-06 14:05 CET (UTC+01:00)``.

    The zone's abbreviation is shown when it is a name (``CET``, ``NZDT``); a
    zone without one (a fixed offset, UTC itself, or a numeric abbreviation
    such as ``-03``) shows only ``UTC+01:00``. A naive ``now`` shows neither."""
    line = f"Current date and time: {_WEEKDAYS[now.weekday()]} {now:%Y-%m-%d %H:%M}"
    offset = now.utcoffset()
    if offset is None:
        return line
    name = now.tzname() or ""
    if name.isascii() and name.isalpha() and name.upper() != "UTC":
        return f"{line} {name} ({_format_offset(offset)})"
    return f"{line} {_format_offset(offset)}"


def memory_section(memories: Sequence[MemoryLine], mode: Mode = "push") -> str:
    """The ``# Memory`` section, or "" when there is nothing to say."""
    if mode == "off":
        return ""
    lines = [line for line in (memory_bullet(m) for m in memories) if line]
    if not lines:
        return ""
    if mode == "pull":
        return "\n".join((AUTO_RECALL_HEADING, AUTO_RECALL_INSTRUCTION, *lines))
    if mode == "index":
        n = len(lines)
        what = "1 memory" if n == 1 else f"{n} memories"
        verb = "is" if n == 1 else "are"
        return (f"{MEMORY_HEADING}\n{what} of earlier conversations with the user {verb} "
                f"available on request (not shown here); recall before relying on them "
                f"and never invent memories.")
    return "\n".join((MEMORY_HEADING, MEMORY_INSTRUCTION, *lines))


def portrait_section(lines: Sequence[PortraitLineLike], mode: Mode = "push") -> str:
    """The portrait's section, or "" with no lines (or in mode ``"off"``)."""
    if mode == "off":
        return ""
    bullets = [b for b in (portrait_bullet(line) for line in lines) if b]
    if not bullets:
        return ""
    return "\n".join((PORTRAIT_HEADING, PORTRAIT_INSTRUCTION, *bullets))


def portrait_bullet(line: PortraitLineLike) -> str:
    """``- [fact:3, episode:9] text`` on one line, or "" for a line without text."""
    text = _one_line(line.text)
    if not text:
        return ""
    refs = ", ".join(r for r in (_one_line(r).replace("[", "(").replace("]", ")")
                                 for r in line.refs) if r)
    return f"- [{refs}] {text}" if refs else f"- {text}"


def memory_bullet(m: MemoryLine) -> str:
    """``- [ref] text`` on one line, or "" for a memory without text."""
    text = _one_line(m.text)
    if not text:
        return ""
    ref = _one_line(m.ref).replace("[", "(").replace("]", ")")
    return f"- [{ref}] {text}" if ref else f"- {text}"


def _one_line(s: str) -> str:
    # str.split() with no argument splits on every Unicode whitespace, line
    # separators (\r, \x85, \u2028, \u2029) included.
    return " ".join(s.split())


def _format_offset(offset: timedelta) -> str:
    total = int(offset.total_seconds())
    sign = "+" if total >= 0 else "-"
    hours, rest = divmod(abs(total), 3600)
    minutes = rest // 60
    return f"UTC{sign}{hours:02d}:{minutes:02d}"
