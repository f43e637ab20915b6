"""Forget means gone, everywhere (issue 24, items 1-3 and 6).

One running runtime (``reverie run`` on the test session's Ray) for the module.
A secret word is planted in every kind of memory and of row written from
memory, through the real paths: a conversation imported with ``reverie
import``, then the real jobs (consolidate: a leaf episode with an extractive
gist and a compaction summary; facts; synthesis: a portrait and digests; dmn: a
reflection finding and the episode telling it, which names it), a language
model's daily note citing the turn whose line it was given (written through
the Graph actor: the runtime has no model), a user-managed fact, the
recall tool's answer (``- [ref] text`` lines, runtime.recall.pull) stored in
another turn's tool call, and a client tool's result as the voice layer keeps
it. Then it is forgotten through the command line, and every table the
database has (listed from ``sqlite_master``, so a new table is scanned without
anyone adding it, FTS5 shadow tables included, and the FTS5 vocabularies),
the hnswlib files, and after the runtime stops every file of the data
directory, are read byte for byte for it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import apsw
import pytest

from actors.handles import GraphClient, RecallClient, TranscriptClient
from actors.messages import AppendTurns, Recall, WriteDigests
from runtime.memories.digests import DigestBatch, DigestIn
from runtime.memories.transcript import ToolCallIn, TurnIn
from runtime.recall.pull import tool_result
from tests.reverie_process import reverie, runtime_env, start_runtime

NS = "test-forget-everywhere"
ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400.0
# a word no tokenizer stems and nothing else says: letters only, no final s/e/y
SECRET = "Quorvex" + "".join(random.choice("bdgkmptvz") for _ in range(5))
KITCHEN = "kitchen"


@dataclass
class Running:
    env: dict[str, str]
    data: Path
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=120) == 0


@pytest.fixture(scope="module")
def running(ray_instance: str, tmp_path_factory: pytest.TempPathFactory,
            model_cache: Path) -> Iterator[Running]:
    data = tmp_path_factory.mktemp("forget-everywhere-data")
    env = runtime_env(data, NS, model_cache)
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    run = Running(env, data, proc)
    yield run
    run.stop()


def cli(run: Running, *args: str) -> str:
    done = reverie(run.env, *args, cwd=ROOT)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def db(run: Running) -> apsw.Connection:
    """A plain connection to the runtime's database, beside the runtime."""
    conn = apsw.Connection(str(run.data / "reverie.db"))
    conn.setbusytimeout(10_000)
    return conn


def rows(run: Running, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    conn = db(run)
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def holds(value: object, word: str = SECRET) -> bool:
    if value is None:
        return False
    data = value if isinstance(value, bytes) else str(value).encode()
    return word.lower().encode() in data.lower()


def traces(run: Running, word: str = SECRET) -> dict[str, int]:
    """Where ``word`` is in the database: rows per table, every table of
    ``sqlite_master`` (virtual FTS5 tables and their shadow tables too), and
    the terms of every FTS5 index (its data blobs compress terms by prefix, so
    a byte scan alone could miss one)."""
    found: dict[str, int] = {}
    conn = db(run)
    try:
        tables = [(str(n), str(s or "")) for n, s in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for name, sql in tables:
            quoted = '"' + name.replace('"', '""') + '"'
            hits = sum(1 for row in conn.execute(f"SELECT * FROM {quoted}")
                       if any(holds(v, word) for v in row))
            if hits:
                found[name] = hits
            if "using fts5" in sql.lower():
                vocab = f"temp.vocab_{name}"
                conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {vocab}"
                             f" USING fts5vocab(main, {quoted}, 'row')")
                terms = conn.execute(f"SELECT count(*) FROM {vocab} WHERE term LIKE ?",
                                     (f"%{word.lower()}%",)).fetchone()[0]
                if terms:
                    found[f"{name} (terms)"] = int(terms)
    finally:
        conn.close()
    return found


def files_holding(root: Path) -> list[str]:
    """The files under ``root`` whose bytes hold the secret (any case)."""
    assert root.is_dir()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and holds(p.read_bytes()))


def conversation(start: float) -> list[dict[str, object]]:
    """Two days ago in the kitchen: Ana's worry about her sister (the secret),
    and a harmless exchange an hour later."""
    said = [
        ("Ana", "user", f"Remember this: I am so scared and sad, the doctor said on 3 May "
                        f"my sister {SECRET} is very ill with Lyme in Braga?"),
        ("Ben", "user", "Oh no, I am so sorry and afraid to hear that, Ana."),
        ("Ana", "user", f"My sister {SECRET} lives in Porto."),
        ("Ben", "user", "We should visit her soon."),
    ]
    lines: list[dict[str, object]] = [
        {"channel": KITCHEN, "speaker": s, "role": r, "content": c, "created_at": start + 60 * i}
        for i, (s, r, c) in enumerate(said)]
    lines += [{"channel": KITCHEN, "speaker": "Ben", "role": "user",
               "content": "The blue bicycle needs a new chain before the Sintra ride.",
               "created_at": start + 3 * 3600}]
    return lines


@dataclass
class Planted:
    said: int        # the turn saying the secret first
    recalled: int    # an assistant turn whose recall tool call answered with it
    told: int        # an assistant turn whose client tool result says it
    harmless: str    # a line of the recall tool's answer that is about something else
    by_model: int    # a language model's daily note given that turn's line (it cites it)


@pytest.fixture(scope="module")
def planted(running: Running, tmp_path_factory: pytest.TempPathFactory) -> Planted:
    history = tmp_path_factory.mktemp("forget-everywhere-import") / "history.jsonl"
    history.write_text("\n".join(json.dumps(x) for x in conversation(time.time() - 2 * DAY)))
    cli(running, "import", str(history))
    for job in ("consolidate", "facts", "synthesis", "dmn"):
        cli(running, "jobs", "run", job, "--wait")
    cli(running, "remember", f"{SECRET}'s insurance number is in the red folder")
    [(said,)] = rows(running, "SELECT id FROM transcript WHERE content LIKE ? ORDER BY id"
                     " LIMIT 1", (f"%{SECRET} is very ill%",))

    # the recall tool's answer in a pull channel's turn, as runtime.recall.pull writes it
    RecallClient(NS).sync()  # what the jobs wrote is indexed
    found = RecallClient(NS).recall(Recall(query=f"Ana's sister {SECRET} bicycle chain",
                                           max_items=20))
    shown = [i for i in found.items if holds(i.text)]
    other = [i for i in found.items if "bicycle" in i.text and not holds(i.text)]
    assert shown and other, [i.ref for i in found.items]
    answer, _ = tool_result([*shown, *other])
    harmless = next(line for line in answer.splitlines() if "bicycle" in line)
    transcript = TranscriptClient(NS)
    ids = transcript.append(AppendTurns(
        turns=[TurnIn(channel="chat", source="assistant", role="assistant",
                      content="Here is what I remember about the family."),
               TurnIn(channel="chat", source="assistant", role="assistant",
                      content="I read your notes for this week.")],
        tool_calls=[[ToolCallIn(name="recall", arguments={"query": "Ana's sister"},
                                result=answer)],
                    [ToolCallIn(name="read_notes", arguments={"week": "this"},
                                result=f"Friday: call the clinic about {SECRET}.")]])).ids
    transcript.flush()
    # a language model's daily note, as the digest step writes one (runtime.mind.digest_job):
    # it was given the turn's line, and cites it; its day is one the runtime has no note of
    # (the jobs above run offline), so only that citation ties it to the turn
    [by_model] = GraphClient(NS).write_digests(WriteDigests(batch=DigestBatch(digests=[
        DigestIn(period="day", key="2020-01-06", starts_at=1578268800.0, ends_at=1578355200.0,
                 text=f"Ana worried about her sister {SECRET}.", refs=[f"turn:{said}"],
                 how="llm")]))).digest_ids
    RecallClient(NS).sync()
    return Planted(said=int(str(said)), recalled=ids[0], told=ids[1], harmless=harmless,
                   by_model=by_model)


def test_the_secret_is_planted_in_every_kind_of_row(running: Running, planted: Planted) -> None:
    """The test below means something only if each place holds the secret first."""
    where = traces(running)
    for table in ("transcript", "episodes", "facts", "compactions", "tool_calls", "digests",
                  "portraits", "write_log", "transcript_fts (terms)", "episodes_fts (terms)",
                  "facts_fts (terms)"):
        assert where.get(table), (table, where)
    reflection = rows(running, "SELECT count(*) FROM facts WHERE source = 'dmn'"
                      " AND value LIKE ?", (f"%{SECRET}%",))
    told = rows(running, "SELECT count(*) FROM episodes WHERE source = 'dmn'"
                " AND gist LIKE ?", (f"%{SECRET}%",))
    assert reflection[0][0] and told[0][0]
    # the rows that quote what they were made from say what it was (issue 24)
    assert rows(running, "SELECT count(*) FROM episodes WHERE source = 'dmn'"
                " AND provenance LIKE '%fact:%'")[0][0]
    assert rows(running, "SELECT count(*) FROM compactions WHERE summary LIKE ?"
                " AND refs LIKE '%episode:%'", (f"%{SECRET}%",))[0][0]
    assert rows(running, "SELECT how FROM digests WHERE id = ?", (planted.by_model,)) == [
        ("llm",)]


def test_forgetting_a_turn_forgets_what_quotes_it(running: Running, planted: Planted) -> None:
    """``reverie forget turn:N``: the episodes citing it, the facts resting on
    it, the reflection on them, the digests and portrait lines written from
    them, the compaction summary's gist that copied it, the recall tool's
    answer lines that showed them: no row holds a word only that turn said.
    The compaction row stays (its watermark), and so does the turn that made
    the recall, with its other lines."""
    only_there = "Lyme"  # said in that turn alone
    assert traces(running, only_there)
    episodes = [e for (e,) in rows(running, "SELECT episode_id FROM episode_citations"
                                   " WHERE transcript_id = ?", (planted.said,))]
    compactions = rows(running, "SELECT id, watermark FROM compactions ORDER BY id")
    assert episodes and compactions
    out = cli(running, "forget", f"turn:{planted.said}")
    assert out.strip() == f"turn {planted.said} deleted"
    assert traces(running, only_there) == {}
    for episode in episodes:
        assert not rows(running, "SELECT 1 FROM episodes WHERE id = ?", (episode,))
    assert rows(running, "SELECT id, watermark FROM compactions ORDER BY id") == compactions
    assert not rows(running, "SELECT 1 FROM digests WHERE id = ?", (planted.by_model,))
    assert not rows(running, "SELECT 1 FROM facts WHERE source = 'dmn' AND value LIKE ?",
                    (f"%{SECRET}%",))
    [(result,)] = rows(running, "SELECT result FROM tool_calls WHERE transcript_id = ?",
                       (planted.recalled,))
    assert planted.harmless in str(result).splitlines()
    for episode in episodes:
        assert f"[episode:{episode}]" not in str(result)


def test_forget_matching_leaves_no_trace_in_the_database(running: Running,
                                                         planted: Planted) -> None:
    """``reverie forget --matching WORD --yes`` finds the rest (turns, facts,
    tool results) and forgets them with what was written from them: no table
    of the database, no FTS5 index, no hnswlib file holds the word."""
    out = cli(running, "forget", "--matching", SECRET, "--yes")
    assert "deleted" in out, out
    assert traces(running) == {}
    assert files_holding(running.data / "index") == []  # what is saved of it so far
    # what did not hold the secret is still there: the harmless line and the turns
    [(result,)] = rows(running, "SELECT result FROM tool_calls WHERE transcript_id = ?",
                       (planted.recalled,))
    assert planted.harmless in str(result).splitlines()
    assert rows(running, "SELECT 1 FROM transcript WHERE content LIKE '%Sintra ride%'")
    assert cli(running, "forget", "--matching", SECRET, "--yes").startswith("nothing matches")


WAL = "reverie.db-wal"


def test_no_file_of_the_data_directory_holds_it_after_the_runtime_stops(
        running: Running, planted: Planted) -> None:
    """After the forget has answered and the runtime stopped, every file of the
    data directory, read byte for byte (the WAL apart: the next test)."""
    if traces(running):  # the test above failed: nothing to check here
        pytest.skip("the forget left traces in the database")
    running.stop()
    assert list((running.data / "index").iterdir()), "the hnswlib files are saved on stop"
    assert [f for f in files_holding(running.data) if f != WAL] == [], \
        sorted(os.listdir(running.data))


def test_the_wal_holds_none_of_it_after_the_runtime_stops(running: Running,
                                                          planted: Planted) -> None:
    """The WAL too (item 5: a forget checkpoints and truncates it)."""
    assert running.proc.poll() is not None, "the test above stops the runtime"
    assert WAL not in files_holding(running.data)
