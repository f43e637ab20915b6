"""What is written from a memory, forgotten with it.

The portrait's versions (:mod:`runtime.memories.portrait`) and the digests
(:mod:`runtime.memories.digests`) are text written from facts and episodes, and each
names what it rests on (``fact:N``, ``episode:N``). Read-time filters hide a
portrait line or a digest once one of its sources is disabled, marked
sensitive or forgotten. Forgetting (the user's "delete for good") goes
further: every portrait version and every digest citing the forgotten memory
is forgotten too, the row and its content in the write log. That includes
digests already pruned after their roll-up, whose text the log still held.
The latest portrait version is replaced at once by one without the forgotten
memory's lines; the next synthesis run writes the rest from what remains.

The reflection (:mod:`runtime.mind.dmn`) quotes the episodes and facts its
findings rest on, word for word, in facts that recall returns and in an
episode that tells them (its ``provenance`` names the findings). Those are
forgotten with their source too, and what cites them in turn: the episode
telling a finding goes with the finding, even one forgotten by hand.

A turn is quoted too (issue 24): an episode's gist copies its words (the
offline gist word for word, a model's in its own words), a fact extracted from
it says what it said, and a daily digest written by a language model was given
the day's user lines. What cannot be told apart from the turn's words is
forgotten whole, never rewritten: forgetting a turn forgets the episodes citing
it (the leaf and the roll-ups above it: they cite their children's turns), the
facts whose provenance names it, and the digests a language model wrote from
its line (they cite it, ``turn:N``) or for a period holding it; and then, each
in turn, what was written from those (a model's weekly given a daily note that
went cites it, ``digest:N``). An episode forgotten by hand takes the roll-ups
above it the same way: their gists were written from its gist.

Two kinds of row keep other text beside a memory's and are rewritten instead,
the row kept: a turn's stored tool results (the pull-mode ``recall`` tool's
answer is one ``- [ref] text`` line per memory: the lines of a forgotten ref
go) and the compaction summaries (:mod:`runtime.mind.distil` joins the last
gists of a channel with " … " and cites their episodes in ``refs``, in order:
the gist of a forgotten episode goes by its place, and so do gists quoting a
forgotten text, as in the rows written before ``refs`` was kept; the header and
the watermark stay). The write-log entries of a rewritten row are scrubbed
like a forgotten row's (:meth:`Store.forget_history`).

:func:`forget_citing` is called by the services that forget facts
(:class:`runtime.memories.facts.GraphService`), episodes
(:class:`runtime.memories.episodes.EpisodeService`) and turns
(:class:`runtime.memories.transcript.TranscriptService`, before the turn's row
goes: its citations lead to its episodes), inside their write transaction:
a cascade, like the schema's own ``ON DELETE CASCADE``. So forgetting an
episode may write tables the Graph actor otherwise writes alone, forgetting a
fact the episodes table, and forgetting any of them the Transcript actor's
``tool_calls`` and ``compactions``; SQLite serialises the writers. The
vectors of cascaded facts and episodes stay in the index until its next
compaction: recall joins every hit against the rows, so none is returned.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from runtime.memories.cited import stale
from runtime.memories.portrait import PortraitIn, PortraitService
from runtime.store.database import Store
from runtime.store.job_state import get_state, set_state

log = logging.getLogger(__name__)

#: Per table, SQL listing the refs a row cites (``r.value``), over its column
#: named in braces: the live column, or the column in a write-log snapshot.
_REFS = {
    # lines: [{"section", "text", "refs": [...]}]
    "portraits": "SELECT r.value AS ref FROM json_each({lines}) l,"
                 " json_each(l.value, '$.refs') r",
    # refs: [...]
    "digests": "SELECT r.value AS ref FROM json_each({refs}) r",
    # provenance: [...] (the reflection's episode: the findings it tells)
    "episodes": "SELECT r.value AS ref FROM json_each({provenance}) r",
}
_COLUMN = {"portraits": "lines", "digests": "refs", "episodes": "provenance"}
#: The reflection (runtime.mind.dmn): the source of its findings and episodes, and
#: the job-state key of the findings it has not told in an episode yet.
REFLECTION = "dmn"
UNTOLD = "unsummarised"
#: A finding is matched in a ``dmn`` episode's gist on its first characters;
#: so is a forgotten text (a gist, a turn's sentence) in a compaction summary.
QUOTED = 80
#: The shortest sentence of a forgotten text looked for in a compaction summary:
#: a shorter one ("Oh no.") would match gists that never quoted it.
MIN_QUOTE = 12
#: What is left of a tool result or a summary whose every part was forgotten.
FORGOTTEN = "(forgotten)"
#: distil's separator between the gists of a compaction summary.
GIST_SEPARATOR = " … "


def citing(store: Store, table: str, ref: str) -> tuple[list[int], list[int]]:
    """The rows of ``table`` whose refs include ``ref``: (live ids, ids that are
    gone but whose write-log entries still hold a citing snapshot)."""
    column = _COLUMN[table]
    live_refs = _REFS[table].format(**{column: f"t.{column}"})
    live = [int(r[0]) for r in store.conn.execute(
        f"SELECT t.id FROM {table} t WHERE instr(t.{column}, ?) > 0"
        f" AND EXISTS ({live_refs} WHERE r.value = ?) ORDER BY t.id", (ref, ref))]
    logged: set[int] = set()
    for side in ("before", "after"):
        snapshot = _REFS[table].format(**{column: f"json_extract(w.{side}, '$.{column}')"})
        logged.update(int(r[0]) for r in store.conn.execute(
            f"SELECT DISTINCT w.row_id FROM write_log w WHERE w.table_name = ?"
            f" AND instr(w.{side}, ?) > 0 AND EXISTS ({snapshot} WHERE r.value = ?)",
            (table, ref, ref)))
    return live, sorted(logged - set(live))


@dataclass(frozen=True)
class _Gone:
    """A memory just forgotten (or about to be: a turn), and what it said."""

    ref: str
    text: str = ""
    parent: int | None = None   # an episode's roll-up parent, which quotes its gist


def forget_citing(store: Store, ref: str, writer: str, text: str = "",
                  parent: int | None = None) -> int:
    """Forget everything written from ``ref`` (a fact or an episode just
    forgotten, or a turn about to be: its citations are read first), with its
    write-log content; ``text`` is what it said (a gist, a turn's content, a
    fact's value), ``parent`` a forgotten episode's roll-up parent. Return how
    many rows went or were rewritten.

    - The portrait versions and digests citing it (a digest that goes is
      followed: a model's weekly given it as colour cites it), and the
      episodes whose provenance names it (the reflection's, telling a
      finding). When the latest portrait
      version goes, a new one takes its place with its other lines: the prompt
      shows what it showed a moment before (the read-time filter had already
      dropped the forgotten memory's lines), not nothing until the next
      synthesis run.
    - The reflection's findings citing it (facts of source ``dmn``, which quote
      the episodes and facts they rest on), the ``dmn`` episodes telling them,
      and the told-later list in the reflection's state.
    - For a turn: the episodes citing it, the facts whose provenance names it,
      and the digests a language model wrote for a period holding it.
    - For an episode: the roll-up episode above it (its gist was written from
      this one's), and so on up.
    - Rewritten, not forgotten: the lines naming it in stored tool results, and
      in compaction summaries the gist citing it and the gists quoting its text.

    What goes is followed in turn: a digest citing a ``dmn`` episode goes too."""
    forgotten = 0
    todo, done = [_Gone(ref, text, parent)], set()
    with store.write_transaction():
        while todo:
            gone = todo.pop()
            if gone.ref in done:
                continue
            done.add(gone.ref)
            ref = gone.ref
            if gone.parent is not None:
                todo.append(_forget_episode(store, gone.parent, writer))
            if ref.startswith("turn:"):
                todo.extend(_quoting_turn(store, int(ref[5:]), writer))
            replacement = _latest_without(store, ref)
            for table in _REFS:
                live, logged = citing(store, table, ref)
                for row_id in live:
                    if table == "episodes":  # the reflection's episode telling a finding
                        todo.append(_forget_episode(store, row_id, writer))
                    else:
                        store.forget(writer, table, row_id)
                for row_id in logged:
                    store.forget_history(table, row_id)
                if table == "digests":  # a digest given one as colour goes in turn
                    todo.extend(_Gone(f"digest:{row_id}") for row_id in (*live, *logged))
                forgotten += len(live) + len(logged)
            if replacement is not None:
                _portraits(store).add(replacement, writer)
            findings = _findings_citing(store, ref)
            for fact_id, value in findings.items():
                _forget_fact(store, fact_id, writer)
                todo.append(_Gone(f"fact:{fact_id}", value))
            told = _telling(store, list(findings.values()))
            _drop_untold(store, list(findings.values()),
                         [ref, *(f"fact:{fact_id}" for fact_id in findings)])
            for episode_id in told:
                todo.append(_forget_episode(store, episode_id, writer))
            forgotten += len(findings) + len(told)
            forgotten += _scrub_tool_results(store, ref, writer)
            forgotten += _rewrite_compactions(store, ref, gone.text, writer)
    if forgotten:
        log.info("forgot %d memories and summaries made from a forgotten memory", forgotten)
    return forgotten


def _quoting_turn(store: Store, turn_id: int, writer: str) -> list[_Gone]:
    """Forget what quotes the turn ``turn_id`` (still stored) without being told
    apart from it: the episodes citing it, the facts resting on it, the digests a
    language model wrote for a period holding it. Return the memories that went
    (their own quoting is the caller's next step)."""
    gone: list[_Gone] = []
    for row in store.rows("SELECT DISTINCT episode_id FROM episode_citations"
                          " WHERE transcript_id = ? ORDER BY episode_id", (turn_id,)):
        episode_id = int(row["episode_id"])
        gone.append(_forget_episode(store, episode_id, writer))
    ref = f"turn:{turn_id}"
    for row in store.rows("SELECT id, value FROM facts f WHERE EXISTS ("
                          " SELECT 1 FROM json_each(f.provenance) j WHERE j.value = ?)"
                          " ORDER BY id", (ref,)):
        _forget_fact(store, int(row["id"]), writer)
        gone.append(_Gone(f"fact:{row['id']}", str(row["value"])))
    at = store.scalar("SELECT created_at FROM transcript WHERE id = ?", (turn_id,))
    if at is not None:
        for row in store.rows("SELECT id FROM digests WHERE how = 'llm' AND starts_at <= ?"
                              " AND ? < ends_at", (at, at)):
            store.forget(writer, "digests", int(row["id"]))
        for side in ("before", "after"):  # pruned ones: their text is in the log
            for row in store.rows(
                    f"SELECT DISTINCT row_id FROM write_log WHERE table_name = 'digests'"
                    f" AND json_extract({side}, '$.how') = 'llm'"
                    f" AND json_extract({side}, '$.starts_at') <= ?"
                    f" AND ? < json_extract({side}, '$.ends_at')", (at, at)):
                store.forget_history("digests", int(row["row_id"]))
    return gone


def _forget_episode(store: Store, episode_id: int, writer: str) -> _Gone:
    """Forget an episode (as :class:`runtime.memories.episodes.EpisodeService`
    does, less the cascade: the caller follows it); return it as gone, with its
    gist and its roll-up parent. It goes because of what it quotes, not for its
    own sake: the episodes it rolled up that are still stored come back as
    apexes (no longer tombstoned), so the next roll-up round writes a parent of
    them again, without what was forgotten, and the janitor does not purge
    them as the children of a parent that is gone."""
    children = [int(r[0]) for r in store.conn.execute(
        "SELECT id FROM episodes WHERE parent_id = ?", (episode_id,))]
    row = store.forget(writer, "episodes", episode_id)
    if row is None:
        return _Gone(f"episode:{episode_id}")
    for child in children:
        store.update(writer, "episodes", child, {"tombstoned_at": None})
    parent = row["parent_id"]
    return _Gone(f"episode:{episode_id}", str(row["gist"]),
                 None if parent is None else int(parent))


def _scrub_tool_results(store: Store, ref: str, writer: str) -> int:
    """Take the lines naming ``ref`` (``- [fact:12] ...``: the pull-mode recall
    tool's answer) out of every stored tool result, and their content out of the
    write log (that of tool calls gone with a pruned turn too)."""
    mark = f"[{ref}]"
    rewritten = 0
    for row in store.rows("SELECT id, result FROM tool_calls WHERE instr(result, ?) > 0",
                          (mark,)):
        kept = [line for line in str(row["result"]).split("\n") if mark not in line]
        store.update(writer, "tool_calls", row["id"], {"result": "\n".join(kept) or FORGOTTEN})
        store.forget_history("tool_calls", int(row["id"]))
        rewritten += 1
    for row in store.rows("SELECT DISTINCT row_id FROM write_log WHERE table_name ="
                          " 'tool_calls' AND (instr(before, ?) > 0 OR instr(after, ?) > 0)",
                          (mark, mark)):
        store.forget_history("tool_calls", int(row["row_id"]))
    return rewritten


def quotes(text: str) -> list[str]:
    """What of a forgotten ``text`` a summary would hold if it copied it: its
    start and each of its sentences (at least :data:`MIN_QUOTE` characters, at
    most :data:`QUOTED`: a copied sentence may be clipped after that)."""
    flat = " ".join(text.split())
    found = [flat[:QUOTED]] if len(flat) >= MIN_QUOTE else []
    for sentence in re.split(r"(?<=[.!?;])\s+", flat):
        sentence = sentence.rstrip(".!?;…").strip()[:QUOTED]
        if len(sentence) >= MIN_QUOTE and sentence not in found:
            found.append(sentence)
    return found


def _quoting(found: list[str], flat: str) -> Callable[[str], bool]:
    """Whether a part of a summary quotes the forgotten text whose quotes are
    ``found`` (``flat``: the text, spaces folded)."""
    def quoting(part: str) -> bool:
        clipped = part.endswith("…") and part[:-1].rstrip()
        return bool(found) and (any(q in part for q in found) or bool(
            clipped and len(clipped) >= MIN_QUOTE and clipped in flat))
    return quoting


def _head_body(summary: str) -> tuple[str, str]:
    head, sep, body = summary.partition(": ")
    if not sep or not head.startswith("Conversation on "):
        return "", summary
    return head, body


def summary_without(summary: str, text: str) -> str:
    """``summary`` (a compaction's: "Conversation on CHANNEL up to WHEN: " and
    gists joined by " … ", clipped) less the gists quoting ``text``; the header
    and the other gists as they were. The same summary when none quotes it."""
    return compaction_without(summary, [], "", text)[0]


def compaction_without(summary: str, refs: list[str], ref: str,
                       text: str) -> tuple[str, list[str]]:
    """A compaction's ``summary`` and ``refs`` (the episode of each gist, in
    order; ``[]`` for a row from before they were kept) less the gists of the
    forgotten ``ref`` and those quoting its ``text``. When the refs do not line
    up with the gists (one gist holding the separator), a summary citing ``ref``
    keeps none of them: no rule can tell which part is its gist."""
    found = quotes(text)
    quoting = _quoting(found, " ".join(text.split()))
    head, body = _head_body(summary)
    parts = body.split(GIST_SEPARATOR)

    def joined(kept: list[str]) -> str:
        rest = GIST_SEPARATOR.join(kept) or FORGOTTEN
        return f"{head}: {rest}" if head else rest

    if refs and len(refs) == len(parts):
        keep = [i for i, (part, cited) in enumerate(zip(parts, refs))
                if cited != ref and not quoting(part)]
        if len(keep) == len(parts):
            return summary, refs
        return joined([parts[i] for i in keep]), [refs[i] for i in keep]
    if ref and ref in refs:
        return joined([]), []
    kept = [p for p in parts if not quoting(p)]
    if len(kept) == len(parts):
        return summary, refs
    return joined(kept), refs


def _rewrite_compactions(store: Store, ref: str, text: str, writer: str) -> int:
    """Rewrite the compaction summaries that copy the gist of ``ref`` (their
    ``refs`` name it) or quote its ``text`` without them, and scrub their
    write-log entries. A compaction row is kept (its watermark says how far the
    channel is consolidated); only its summary (and refs) change."""
    found = quotes(text)
    # a summary quoting it holds one of its quotes, or (clipped) its first characters
    looked_for = [*found, " ".join(text.split())[:MIN_QUOTE]] if found else []
    where = " OR ".join(["instr(refs, ?) > 0 AND EXISTS (SELECT 1 FROM json_each(refs) r"
                         " WHERE r.value = ?)", *("instr(summary, ?) > 0" for _ in looked_for)])
    rewritten = 0
    for row in store.rows(f"SELECT id, summary, refs FROM compactions WHERE {where} ORDER BY id",
                          (ref, ref, *looked_for)):
        refs = [str(r) for r in json.loads(row["refs"] or "[]")]
        new, kept = compaction_without(str(row["summary"]), refs, ref, text)
        if new != row["summary"] or kept != refs:
            store.update(writer, "compactions", row["id"],
                         {"summary": new, "refs": json.dumps(kept)})
            store.forget_history("compactions", int(row["id"]))
            rewritten += 1
    return rewritten


def _findings_citing(store: Store, ref: str) -> dict[int, str]:
    """The reflection's findings whose provenance names ``ref``: id -> text."""
    return {int(r["id"]): str(r["value"]) for r in store.rows(
        "SELECT id, value FROM facts f WHERE source = ? AND EXISTS ("
        " SELECT 1 FROM json_each(f.provenance) j WHERE j.value = ?) ORDER BY id",
        (REFLECTION, ref))}


def _forget_fact(store: Store, fact_id: int, writer: str) -> None:
    """Forget a fact (as :class:`runtime.memories.facts.GraphService` does, less
    the cascade: the caller follows it)."""
    for row in store.rows("SELECT id FROM facts WHERE superseded_by = ?", (fact_id,)):
        store.update(writer, "facts", row["id"], {"superseded_by": None})
    store.forget(writer, "facts", fact_id)


def _telling(store: Store, texts: list[str]) -> list[int]:
    """The ``dmn`` episodes quoting one of these findings (a gist joins them,
    clipped at its end: matched on each one's start)."""
    ids: set[int] = set()
    for text in texts:
        ids.update(int(r[0]) for r in store.conn.execute(
            "SELECT id FROM episodes WHERE source = ? AND instr(gist, ?) > 0",
            (REFLECTION, text[:QUOTED])))
    return sorted(ids)


def _drop_untold(store: Store, texts: list[str], refs: list[str]) -> None:
    """Take these findings (by their text or their fact's ref) out of the
    reflection's list of those not told yet (``{"ref", "text"}`` entries; plain
    texts from an older version)."""
    untold = get_state(store, REFLECTION, UNTOLD)
    if not isinstance(untold, list):
        return

    def gone(entry: object) -> bool:
        if isinstance(entry, dict):
            return entry.get("ref") in refs or entry.get("text") in texts
        return entry in texts

    if any(gone(e) for e in untold):
        set_state(store, REFLECTION, UNTOLD, [e for e in untold if not gone(e)])


def _latest_without(store: Store, ref: str) -> PortraitIn | None:
    """The latest portrait version less its lines citing ``ref`` (and those citing
    another memory no longer stored: the portrait's owner refuses a version
    citing one, :mod:`runtime.memories.cited`), if it cites ``ref`` and has
    other lines; else None."""
    latest = _portraits(store).latest()
    if latest is None or not any(ref in line.refs for line in latest.lines):
        return None
    gone = {ref, *stale(store, (r for line in latest.lines for r in line.refs))}
    kept = [line for line in latest.lines if not gone.intersection(line.refs)]
    if not kept:
        return None
    return PortraitIn.model_validate({"lines": kept, "signature": latest.signature,
                                      "how": latest.how})


def _portraits(store: Store) -> PortraitService:
    return PortraitService(store)
