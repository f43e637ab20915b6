"""Schema migrations: named steps, each applied once and recorded.

A step runs inside one transaction together with its row in
``schema_migrations``, so a crash leaves it either applied and recorded or
neither. Steps are append-only: never edit one that has shipped; add a new one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import apsw

log = logging.getLogger(__name__)

_FTS_TOKENIZE = "tokenize = 'porter unicode61 remove_diacritics 2'"

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_transcript",
        """
        CREATE TABLE transcript (
            id          INTEGER PRIMARY KEY,
            channel     TEXT NOT NULL,
            source      TEXT NOT NULL,
            role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
            speaker     TEXT,
            content     TEXT NOT NULL,
            created_at  REAL NOT NULL,
            lat         REAL,
            lon         REAL,
            accuracy_m  REAL,
            place       TEXT,
            external_id TEXT,
            citations   TEXT NOT NULL DEFAULT '[]',
            memory      INTEGER NOT NULL DEFAULT 0  -- its source's profile made it memory
        );
        CREATE INDEX transcript_channel_time ON transcript (channel, created_at, id);

        -- Compaction summaries persist; the newest per channel is the watermark:
        -- raw rows with id <= watermark are summarised and may be pruned.
        CREATE TABLE compactions (
            id         INTEGER PRIMARY KEY,
            channel    TEXT NOT NULL,
            summary    TEXT NOT NULL,
            watermark  INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX compactions_channel ON compactions (channel, watermark);

        -- A turn's tool calls are reaped with the turn.
        CREATE TABLE tool_calls (
            id            INTEGER PRIMARY KEY,
            transcript_id INTEGER NOT NULL REFERENCES transcript (id) ON DELETE CASCADE,
            name          TEXT NOT NULL,
            arguments     TEXT NOT NULL DEFAULT '{}',
            result        TEXT,
            created_at    REAL NOT NULL
        );
        CREATE INDEX tool_calls_turn ON tool_calls (transcript_id);
        """,
    ),
    (
        "0002_episodes",
        """
        CREATE TABLE episodes (
            id               INTEGER PRIMARY KEY,
            channel          TEXT NOT NULL,
            source           TEXT NOT NULL,
            level            INTEGER NOT NULL CHECK (level IN (0, 1, 2)),
            gist             TEXT NOT NULL,
            salience         INTEGER NOT NULL DEFAULT 5 CHECK (salience BETWEEN 1 AND 10),
            emotion          TEXT,
            memory_level     TEXT NOT NULL DEFAULT 'normal'
                             CHECK (memory_level IN ('faint', 'normal', 'vivid', 'seared')),
            weight           REAL NOT NULL DEFAULT 1.0,
            started_at       REAL,
            ended_at         REAL,
            last_relevant_at REAL NOT NULL,
            created_at       REAL NOT NULL,
            parent_id        INTEGER REFERENCES episodes (id) ON DELETE SET NULL,
            tombstoned_at    REAL
        );
        CREATE INDEX episodes_apex ON episodes (channel, level) WHERE parent_id IS NULL;

        -- Which transcript rows an episode was distilled from. No foreign key on
        -- transcript_id: pruning checks for live citations itself.
        CREATE TABLE episode_citations (
            episode_id    INTEGER NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
            transcript_id INTEGER NOT NULL,
            PRIMARY KEY (episode_id, transcript_id)
        ) WITHOUT ROWID;
        CREATE INDEX episode_citations_turn ON episode_citations (transcript_id);
        """,
    ),
    (
        "0003_facts",
        """
        -- The closed kind set, synchronised from configs/fact_kinds.toml on open;
        -- the foreign key rejects any write with a kind outside it.
        CREATE TABLE fact_kinds (
            name   TEXT PRIMARY KEY,
            system INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;

        CREATE TABLE facts (
            id            INTEGER PRIMARY KEY,
            kind          TEXT NOT NULL REFERENCES fact_kinds (name),
            subject       TEXT NOT NULL,
            key           TEXT NOT NULL,
            value         TEXT NOT NULL,
            confidence    REAL NOT NULL DEFAULT 0.7 CHECK (confidence BETWEEN 0 AND 1),
            source        TEXT NOT NULL,
            provenance    TEXT NOT NULL DEFAULT '[]',
            valid_from    REAL NOT NULL,
            valid_to      REAL,
            recorded_at   REAL NOT NULL,
            confirmed_at  REAL NOT NULL,
            superseded_by INTEGER REFERENCES facts (id),
            disabled      INTEGER NOT NULL DEFAULT 0,
            memory_level  TEXT NOT NULL DEFAULT 'normal'
                          CHECK (memory_level IN ('faint', 'normal', 'vivid', 'seared')),
            user_managed  INTEGER NOT NULL DEFAULT 0,
            weight        REAL NOT NULL DEFAULT 1.0,
            CHECK (valid_to IS NULL OR valid_to >= valid_from)
        );
        CREATE INDEX facts_current ON facts (subject, key) WHERE valid_to IS NULL;
        CREATE INDEX facts_kind ON facts (kind);
        """,
    ),
    (
        "0004_vectors_and_write_log",
        """
        -- One embedding per memory item; the row id is the hnswlib label.
        CREATE TABLE vectors (
            id      INTEGER PRIMARY KEY AUTOINCREMENT,  -- labels are never reused
            kind    TEXT NOT NULL CHECK (kind IN ('turn', 'episode', 'fact')),
            item_id INTEGER NOT NULL,
            model   TEXT NOT NULL,
            vec     BLOB NOT NULL,
            UNIQUE (kind, item_id)
        );
        CREATE TRIGGER transcript_vector_gone AFTER DELETE ON transcript BEGIN
            DELETE FROM vectors WHERE kind = 'turn' AND item_id = old.id;
        END;
        CREATE TRIGGER episode_vector_gone AFTER DELETE ON episodes BEGIN
            DELETE FROM vectors WHERE kind = 'episode' AND item_id = old.id;
        END;
        CREATE TRIGGER fact_vector_gone AFTER DELETE ON facts BEGIN
            DELETE FROM vectors WHERE kind = 'fact' AND item_id = old.id;
        END;

        -- Every write: who, when, what, before and after (JSON).
        CREATE TABLE write_log (
            id         INTEGER PRIMARY KEY,
            at         REAL NOT NULL,
            writer     TEXT NOT NULL,
            op         TEXT NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
            table_name TEXT NOT NULL,
            row_id     INTEGER,
            before     TEXT,
            after      TEXT
        );
        CREATE INDEX write_log_row ON write_log (table_name, row_id);
        """,
    ),
    (
        "0005_fts",
        f"""
        CREATE VIRTUAL TABLE transcript_fts USING fts5 (
            content, speaker, content = 'transcript', content_rowid = 'id', {_FTS_TOKENIZE}
        );
        CREATE TRIGGER transcript_fts_ai AFTER INSERT ON transcript BEGIN
            INSERT INTO transcript_fts (rowid, content, speaker)
            VALUES (new.id, new.content, coalesce(new.speaker, ''));
        END;
        CREATE TRIGGER transcript_fts_ad AFTER DELETE ON transcript BEGIN
            INSERT INTO transcript_fts (transcript_fts, rowid, content, speaker)
            VALUES ('delete', old.id, old.content, coalesce(old.speaker, ''));
        END;
        CREATE TRIGGER transcript_fts_au AFTER UPDATE OF content, speaker ON transcript BEGIN
            INSERT INTO transcript_fts (transcript_fts, rowid, content, speaker)
            VALUES ('delete', old.id, old.content, coalesce(old.speaker, ''));
            INSERT INTO transcript_fts (rowid, content, speaker)
            VALUES (new.id, new.content, coalesce(new.speaker, ''));
        END;

        CREATE VIRTUAL TABLE episodes_fts USING fts5 (
            gist, content = 'episodes', content_rowid = 'id', {_FTS_TOKENIZE}
        );
        CREATE TRIGGER episodes_fts_ai AFTER INSERT ON episodes BEGIN
            INSERT INTO episodes_fts (rowid, gist) VALUES (new.id, new.gist);
        END;
        CREATE TRIGGER episodes_fts_ad AFTER DELETE ON episodes BEGIN
            INSERT INTO episodes_fts (episodes_fts, rowid, gist)
            VALUES ('delete', old.id, old.gist);
        END;
        CREATE TRIGGER episodes_fts_au AFTER UPDATE OF gist ON episodes BEGIN
            INSERT INTO episodes_fts (episodes_fts, rowid, gist)
            VALUES ('delete', old.id, old.gist);
            INSERT INTO episodes_fts (rowid, gist) VALUES (new.id, new.gist);
        END;

        CREATE VIRTUAL TABLE facts_fts USING fts5 (
            subject, key, value, content = 'facts', content_rowid = 'id', {_FTS_TOKENIZE}
        );
        CREATE TRIGGER facts_fts_ai AFTER INSERT ON facts BEGIN
            INSERT INTO facts_fts (rowid, subject, key, value)
            VALUES (new.id, new.subject, new.key, new.value);
        END;
        CREATE TRIGGER facts_fts_ad AFTER DELETE ON facts BEGIN
            INSERT INTO facts_fts (facts_fts, rowid, subject, key, value)
            VALUES ('delete', old.id, old.subject, old.key, old.value);
        END;
        CREATE TRIGGER facts_fts_au AFTER UPDATE OF subject, key, value ON facts BEGIN
            INSERT INTO facts_fts (facts_fts, rowid, subject, key, value)
            VALUES ('delete', old.id, old.subject, old.key, old.value);
            INSERT INTO facts_fts (rowid, subject, key, value)
            VALUES (new.id, new.subject, new.key, new.value);
        END;
        """,
    ),
    (
        "0006_turn_request_ids",
        """
        -- A caller-chosen id per turn: a retried append returns the first row.
        ALTER TABLE transcript ADD COLUMN request_id TEXT;
        CREATE UNIQUE INDEX transcript_request ON transcript (request_id)
            WHERE request_id IS NOT NULL;
        """,
    ),
    (
        "0007_ids_never_reused",
        """
        -- Transcript, episode and fact ids are never handed out again once used
        -- (AUTOINCREMENT): the indexer looks only past the last id it checked,
        -- so a reused id would never be indexed. The three tables are rebuilt
        -- (rows, ids, indexes, triggers and foreign keys kept; migrate() runs
        -- this with foreign keys off and checks them before committing), and
        -- sqlite_sequence is seeded past every id the write log has seen, so an
        -- id deleted before this step is not reused either.
        -- Also: turns and episodes can be disabled (hidden, reversibly), and
        -- facts count the claims that asserted them (confidence is their mean).
        CREATE TABLE transcript_new (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            channel     TEXT NOT NULL,
            source      TEXT NOT NULL,
            role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
            speaker     TEXT,
            content     TEXT NOT NULL,
            created_at  REAL NOT NULL,
            lat         REAL,
            lon         REAL,
            accuracy_m  REAL,
            place       TEXT,
            external_id TEXT,
            citations   TEXT NOT NULL DEFAULT '[]',
            memory      INTEGER NOT NULL DEFAULT 0,  -- its source's profile made it memory
            request_id  TEXT,
            disabled    INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO transcript_new (id, channel, source, role, speaker, content, created_at,
                                    lat, lon, accuracy_m, place, external_id, citations,
                                    memory, request_id)
        SELECT id, channel, source, role, speaker, content, created_at, lat, lon, accuracy_m,
               place, external_id, citations, memory, request_id FROM transcript;
        DROP TABLE transcript;
        ALTER TABLE transcript_new RENAME TO transcript;
        CREATE INDEX transcript_channel_time ON transcript (channel, created_at, id);
        CREATE UNIQUE INDEX transcript_request ON transcript (request_id)
            WHERE request_id IS NOT NULL;

        CREATE TABLE episodes_new (
            id               INTEGER PRIMARY KEY AUTOINCREMENT,
            channel          TEXT NOT NULL,
            source           TEXT NOT NULL,
            level            INTEGER NOT NULL CHECK (level IN (0, 1, 2)),
            gist             TEXT NOT NULL,
            salience         INTEGER NOT NULL DEFAULT 5 CHECK (salience BETWEEN 1 AND 10),
            emotion          TEXT,
            memory_level     TEXT NOT NULL DEFAULT 'normal'
                             CHECK (memory_level IN ('faint', 'normal', 'vivid', 'seared')),
            weight           REAL NOT NULL DEFAULT 1.0,
            started_at       REAL,
            ended_at         REAL,
            last_relevant_at REAL NOT NULL,
            created_at       REAL NOT NULL,
            parent_id        INTEGER REFERENCES episodes (id) ON DELETE SET NULL,
            tombstoned_at    REAL,
            disabled         INTEGER NOT NULL DEFAULT 0
        );
        INSERT INTO episodes_new (id, channel, source, level, gist, salience, emotion,
                                  memory_level, weight, started_at, ended_at, last_relevant_at,
                                  created_at, parent_id, tombstoned_at)
        SELECT id, channel, source, level, gist, salience, emotion, memory_level, weight,
               started_at, ended_at, last_relevant_at, created_at, parent_id, tombstoned_at
        FROM episodes;
        DROP TABLE episodes;
        ALTER TABLE episodes_new RENAME TO episodes;
        CREATE INDEX episodes_apex ON episodes (channel, level) WHERE parent_id IS NULL;

        CREATE TABLE facts_new (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            kind          TEXT NOT NULL REFERENCES fact_kinds (name),
            subject       TEXT NOT NULL,
            key           TEXT NOT NULL,
            value         TEXT NOT NULL,
            confidence    REAL NOT NULL DEFAULT 0.7 CHECK (confidence BETWEEN 0 AND 1),
            source        TEXT NOT NULL,
            provenance    TEXT NOT NULL DEFAULT '[]',
            valid_from    REAL NOT NULL,
            valid_to      REAL,
            recorded_at   REAL NOT NULL,
            confirmed_at  REAL NOT NULL,
            superseded_by INTEGER REFERENCES facts (id),
            disabled      INTEGER NOT NULL DEFAULT 0,
            memory_level  TEXT NOT NULL DEFAULT 'normal'
                          CHECK (memory_level IN ('faint', 'normal', 'vivid', 'seared')),
            user_managed  INTEGER NOT NULL DEFAULT 0,
            weight        REAL NOT NULL DEFAULT 1.0,
            claims        INTEGER NOT NULL DEFAULT 1 CHECK (claims >= 1),
            CHECK (valid_to IS NULL OR valid_to >= valid_from)
        );
        INSERT INTO facts_new (id, kind, subject, key, value, confidence, source, provenance,
                               valid_from, valid_to, recorded_at, confirmed_at, superseded_by,
                               disabled, memory_level, user_managed, weight)
        SELECT id, kind, subject, key, value, confidence, source, provenance, valid_from,
               valid_to, recorded_at, confirmed_at, superseded_by, disabled, memory_level,
               user_managed, weight FROM facts;
        DROP TABLE facts;
        ALTER TABLE facts_new RENAME TO facts;
        CREATE INDEX facts_current ON facts (subject, key) WHERE valid_to IS NULL;
        CREATE INDEX facts_kind ON facts (kind);
        CREATE INDEX facts_superseded ON facts (superseded_by) WHERE superseded_by IS NOT NULL;

        -- The triggers went with the old tables: the same ones again.
        CREATE TRIGGER transcript_vector_gone AFTER DELETE ON transcript BEGIN
            DELETE FROM vectors WHERE kind = 'turn' AND item_id = old.id;
        END;
        CREATE TRIGGER episode_vector_gone AFTER DELETE ON episodes BEGIN
            DELETE FROM vectors WHERE kind = 'episode' AND item_id = old.id;
        END;
        CREATE TRIGGER fact_vector_gone AFTER DELETE ON facts BEGIN
            DELETE FROM vectors WHERE kind = 'fact' AND item_id = old.id;
        END;
        CREATE TRIGGER transcript_fts_ai AFTER INSERT ON transcript BEGIN
            INSERT INTO transcript_fts (rowid, content, speaker)
            VALUES (new.id, new.content, coalesce(new.speaker, ''));
        END;
        CREATE TRIGGER transcript_fts_ad AFTER DELETE ON transcript BEGIN
            INSERT INTO transcript_fts (transcript_fts, rowid, content, speaker)
            VALUES ('delete', old.id, old.content, coalesce(old.speaker, ''));
        END;
        CREATE TRIGGER transcript_fts_au AFTER UPDATE OF content, speaker ON transcript BEGIN
            INSERT INTO transcript_fts (transcript_fts, rowid, content, speaker)
            VALUES ('delete', old.id, old.content, coalesce(old.speaker, ''));
            INSERT INTO transcript_fts (rowid, content, speaker)
            VALUES (new.id, new.content, coalesce(new.speaker, ''));
        END;
        CREATE TRIGGER episodes_fts_ai AFTER INSERT ON episodes BEGIN
            INSERT INTO episodes_fts (rowid, gist) VALUES (new.id, new.gist);
        END;
        CREATE TRIGGER episodes_fts_ad AFTER DELETE ON episodes BEGIN
            INSERT INTO episodes_fts (episodes_fts, rowid, gist)
            VALUES ('delete', old.id, old.gist);
        END;
        CREATE TRIGGER episodes_fts_au AFTER UPDATE OF gist ON episodes BEGIN
            INSERT INTO episodes_fts (episodes_fts, rowid, gist)
            VALUES ('delete', old.id, old.gist);
            INSERT INTO episodes_fts (rowid, gist) VALUES (new.id, new.gist);
        END;
        CREATE TRIGGER facts_fts_ai AFTER INSERT ON facts BEGIN
            INSERT INTO facts_fts (rowid, subject, key, value)
            VALUES (new.id, new.subject, new.key, new.value);
        END;
        CREATE TRIGGER facts_fts_ad AFTER DELETE ON facts BEGIN
            INSERT INTO facts_fts (facts_fts, rowid, subject, key, value)
            VALUES ('delete', old.id, old.subject, old.key, old.value);
        END;
        CREATE TRIGGER facts_fts_au AFTER UPDATE OF subject, key, value ON facts BEGIN
            INSERT INTO facts_fts (facts_fts, rowid, subject, key, value)
            VALUES ('delete', old.id, old.subject, old.key, old.value);
            INSERT INTO facts_fts (rowid, subject, key, value)
            VALUES (new.id, new.subject, new.key, new.value);
        END;

        -- Never hand out an id a row once had, even one deleted before this step.
        DELETE FROM sqlite_sequence WHERE name IN ('transcript', 'episodes', 'facts');
        INSERT INTO sqlite_sequence (name, seq)
        SELECT t.name, max(
            coalesce((SELECT max(w.row_id) FROM write_log w WHERE w.table_name = t.name), 0),
            CASE t.name
                WHEN 'transcript' THEN coalesce((SELECT max(id) FROM transcript), 0)
                WHEN 'episodes' THEN coalesce((SELECT max(id) FROM episodes), 0)
                ELSE coalesce((SELECT max(id) FROM facts), 0)
            END)
        FROM (SELECT 'transcript' AS name UNION ALL SELECT 'episodes' UNION ALL SELECT 'facts') t;
        """,
    ),
    (
        "0008_job_runs_and_state",
        """
        -- One row per run of a background job: when, how it ended, how much it did.
        CREATE TABLE job_runs (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            job        TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at   REAL,
            outcome    TEXT CHECK (outcome IN ('ok', 'failed')),  -- NULL while running
            items      INTEGER NOT NULL DEFAULT 0,
            error      TEXT  -- the exception's type and a short message; never memory content
        );
        CREATE INDEX job_runs_job ON job_runs (job, started_at);

        -- Each job's own bookkeeping (how far it got, what it already did): a job
        -- owns its keys and keeps them small; it is not memory.
        CREATE TABLE job_state (
            job        TEXT NOT NULL,
            key        TEXT NOT NULL,
            value      TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (job, key)
        ) WITHOUT ROWID;
        """,
    ),
    (
        "0009_household_activity_and_reminders",
        """
        -- The idle gate's inputs (written by the Cron actor only), kept so that a
        -- restart does not forget them. One row: the last user activity.
        CREATE TABLE household_activity (
            id      INTEGER PRIMARY KEY CHECK (id = 1),
            last_at REAL NOT NULL
        );
        -- Each person's last reported presence.
        CREATE TABLE presence (
            person TEXT PRIMARY KEY,
            state  TEXT NOT NULL CHECK (state IN ('home', 'away')),
            at     REAL NOT NULL
        ) WITHOUT ROWID;

        -- Reminders: appended to the transcript of their channel (source
        -- 'scheduled', muted) once due; fired_at and turn_id are set once.
        CREATE TABLE reminders (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            text       TEXT NOT NULL,
            channel    TEXT NOT NULL,
            due_at     REAL NOT NULL,
            created_at REAL NOT NULL,
            fired_at   REAL,
            turn_id    INTEGER
        );
        CREATE INDEX reminders_pending ON reminders (due_at) WHERE fired_at IS NULL;
        """,
    ),
    (
        "0010_location_history_and_presence_places",
        """
        -- The location history (the edge: OwnTracks, Home Assistant, gpsd),
        -- written only by the Transcript actor, which back-fills user turns from
        -- it. Sensor data, not memory: not in the write log. A fix delivered
        -- twice (MQTT QoS 1 redelivers) is stored once.
        CREATE TABLE location_fixes (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            person     TEXT NOT NULL,
            lat        REAL NOT NULL CHECK (lat BETWEEN -90 AND 90),
            lon        REAL NOT NULL CHECK (lon BETWEEN -180 AND 180),
            accuracy_m REAL CHECK (accuracy_m IS NULL OR accuracy_m >= 0),
            at         REAL NOT NULL,
            source     TEXT NOT NULL,
            device     TEXT NOT NULL DEFAULT '',
            place      TEXT,
            event      TEXT,
            stored_at  REAL NOT NULL,
            UNIQUE (person, source, device, at, lat, lon)
        );
        CREATE INDEX location_fixes_time ON location_fixes (at);
        CREATE INDEX location_fixes_person_time ON location_fixes (person, at);
        -- The user turns still without a location, by time: what a fix back-fills.
        CREATE INDEX transcript_unlocated ON transcript (created_at)
            WHERE lat IS NULL AND role = 'user';

        -- Presence: where (room or zone), from which source, and since when the
        -- state or place last changed (``at`` stays the last report).
        ALTER TABLE presence ADD COLUMN place TEXT;
        ALTER TABLE presence ADD COLUMN source TEXT;
        ALTER TABLE presence ADD COLUMN since REAL;
        UPDATE presence SET since = at;
        """,
    ),
    (
        "0011_write_log_append_only",
        """
        -- The write log is append-only. Two changes to it are sanctioned, each
        -- allowed in one exact shape:
        -- * a forget (Store.forget) erases content: an UPDATE may only replace a
        --   row's before/after with the marker {"id": <its row_id>, "forgotten":
        --   true}; every other column stays as it was;
        -- * the janitor's retention rule (runtime.mind.janitor.expire_write_log)
        --   deletes the history of pruned transcript rows and episodes: a DELETE
        --   is allowed only for rows of those tables (and the rows that went with
        --   them by cascade), and only while the connection's function
        --   write_log_expiry_allowed() says so. The Store registers it (false
        --   except inside Store.expiring_write_log()); on any other connection
        --   (the sqlite3 shell) it does not exist, so a DELETE fails there too.
        -- INSERT OR REPLACE would delete the row it replaces without firing the
        -- delete trigger: an insert may not reuse an id.
        CREATE TRIGGER write_log_no_update BEFORE UPDATE ON write_log
        WHEN NOT coalesce((
            new.id IS old.id AND new.at IS old.at AND new.writer IS old.writer
            AND new.op IS old.op AND new.table_name IS old.table_name
            AND new.row_id IS old.row_id
            AND (new.before IS old.before OR (
                old.before IS NOT NULL AND json_valid(new.before)
                AND json_type(new.before) = 'object'
                AND json_type(new.before, '$.forgotten') = 'true'
                AND json_extract(new.before, '$.id') IS old.row_id
                AND (SELECT count(*) FROM json_each(new.before)) = 2))
            AND (new.after IS old.after OR (
                old.after IS NOT NULL AND json_valid(new.after)
                AND json_type(new.after) = 'object'
                AND json_type(new.after, '$.forgotten') = 'true'
                AND json_extract(new.after, '$.id') IS old.row_id
                AND (SELECT count(*) FROM json_each(new.after)) = 2))
        ), 0)
        BEGIN
            SELECT RAISE(ABORT, 'write_log is append-only: an update may only forget');
        END;

        CREATE TRIGGER write_log_no_delete BEFORE DELETE ON write_log
        WHEN NOT coalesce((
            old.table_name IN ('transcript', 'tool_calls', 'episodes', 'episode_citations')
            AND write_log_expiry_allowed()
        ), 0)
        BEGIN
            SELECT RAISE(ABORT, 'write_log is append-only: only the retention rule deletes');
        END;

        CREATE TRIGGER write_log_no_replace BEFORE INSERT ON write_log
        WHEN new.id IS NOT NULL AND EXISTS (SELECT 1 FROM write_log WHERE id = new.id)
        BEGIN
            SELECT RAISE(ABORT, 'write_log is append-only: an entry is never replaced');
        END;
        """,
    ),
    (
        "0012_portraits",
        """
        -- The portrait of the household (the synthesis job, runtime.memories.portrait): one
        -- row per version, never rewritten; the latest is what the prompt sees.
        -- lines: JSON [{"section", "text", "refs": ["fact:N", "episode:N"]}];
        -- signature: the facts it was made from; how: offline, llm or fallback.
        -- Written by the Graph actor only, through the write log.
        CREATE TABLE portraits (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            created_at REAL NOT NULL,
            signature  TEXT NOT NULL,
            how        TEXT NOT NULL CHECK (how IN ('offline', 'llm', 'fallback')),
            lines      TEXT NOT NULL CHECK (json_valid(lines))
        );
        """,
    ),
    (
        "0013_reminder_prompts_and_repeats",
        """
        -- Reminders (0009) become scheduled prompts too, and may repeat (written by
        -- the Cron actor only; runtime.mind.reminders). kind: 'say' appends the text,
        -- 'ask' runs it as a turn the assistant answers. repeat: NULL (once) or
        -- the rule ('day', 'week', 'weekday', 'N days', 'N hours'), stepped from
        -- anchor_at (the first occurrence: its local wall time and phase). A
        -- repeating row stays unfired: each firing moves due_at to the next
        -- occurrence and counts occurrence (which, with the id, derives the
        -- transcript request id of each firing). outcome: the last firing's
        -- ('said', 'answered', 'unanswered', 'refused'); error: the last failed
        -- attempt, cleared by the next firing.
        ALTER TABLE reminders ADD COLUMN kind TEXT NOT NULL DEFAULT 'say'
            CHECK (kind IN ('say', 'ask'));
        ALTER TABLE reminders ADD COLUMN repeat TEXT;
        ALTER TABLE reminders ADD COLUMN anchor_at REAL;
        ALTER TABLE reminders ADD COLUMN occurrence INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE reminders ADD COLUMN last_fired_at REAL;
        ALTER TABLE reminders ADD COLUMN outcome TEXT;
        ALTER TABLE reminders ADD COLUMN error TEXT;
        ALTER TABLE reminders ADD COLUMN cancelled_at REAL;
        UPDATE reminders SET occurrence = 1, last_fired_at = fired_at, outcome = 'said'
            WHERE fired_at IS NOT NULL;
        DROP INDEX reminders_pending;
        CREATE INDEX reminders_pending ON reminders (due_at)
            WHERE fired_at IS NULL AND cancelled_at IS NULL;
        """,
    ),
    (
        "0014_job_run_details",
        """
        -- A run's result line (runtime.mind.contract.JobResult.detail: what it did, by
        -- count and reason, e.g. sync's skipped items per connector), shown by
        -- `reverie jobs`. One line, bounded (runtime.mind.registry.MAX_DETAIL); never memory
        -- content. NULL: a failed run, a run from before this column, or no detail.
        ALTER TABLE job_runs ADD COLUMN detail TEXT;
        """,
    ),
    (
        "0015_privacy_and_person",
        """
        -- Privacy in a shared home (issue 12): a memory may be sensitive (codes,
        -- health, money): set by the user, or proposed by extraction for the fact
        -- kinds configured as sensitive. Sensitive memories personalise answers to
        -- their owner but never enter generated artefacts (portrait, digests, dmn),
        -- are never spoken to an unknown voice speaker, never quoted by the
        -- offline provider. ``person``: whose memory it is (the speaker it came
        -- from; NULL: the household's), so recall can be scoped to a person.
        ALTER TABLE transcript ADD COLUMN sensitive INTEGER NOT NULL DEFAULT 0
            CHECK (sensitive IN (0, 1));
        ALTER TABLE episodes ADD COLUMN sensitive INTEGER NOT NULL DEFAULT 0
            CHECK (sensitive IN (0, 1));
        ALTER TABLE episodes ADD COLUMN person TEXT;
        ALTER TABLE facts ADD COLUMN sensitive INTEGER NOT NULL DEFAULT 0
            CHECK (sensitive IN (0, 1));
        ALTER TABLE facts ADD COLUMN person TEXT;
        """,
    ),
    (
        "0016_threads_and_mood",
        """
        -- Open threads (issue 12, clanka; runtime.memories.threads): a leaf episode may hold
        -- something left unresolved (a plan or promise not kept yet, a question
        -- left unanswered). thread: NULL (none) | 'simmering' | 'hot';
        -- thread_what: the words that opened it; it is open until
        -- thread_resolved_at is set (by the episode thread_resolved_by that closed
        -- it). thread_escalated_at: the last time the decay job raised it.
        ALTER TABLE episodes ADD COLUMN thread TEXT CHECK (thread IN ('simmering', 'hot'));
        ALTER TABLE episodes ADD COLUMN thread_what TEXT;
        ALTER TABLE episodes ADD COLUMN thread_opened_at REAL;
        ALTER TABLE episodes ADD COLUMN thread_escalated_at REAL;
        ALTER TABLE episodes ADD COLUMN thread_resolved_at REAL;
        ALTER TABLE episodes ADD COLUMN thread_resolved_by INTEGER;
        CREATE INDEX episodes_open_threads ON episodes (channel, id)
            WHERE thread IS NOT NULL AND thread_resolved_at IS NULL;

        -- The companion's mood (runtime.memories.mood), carried between conversations:
        -- one row per reading, history kept, the newest is current.
        CREATE TABLE mood (
            id           INTEGER PRIMARY KEY,
            valence      REAL NOT NULL CHECK (valence BETWEEN -1 AND 1),
            energy       REAL NOT NULL CHECK (energy BETWEEN 0 AND 1),
            warmth       REAL NOT NULL CHECK (warmth BETWEEN 0 AND 1),
            why          TEXT NOT NULL,
            how          TEXT NOT NULL CHECK (how IN ('offline', 'llm')),
            through_turn INTEGER NOT NULL DEFAULT 0,  -- the last transcript row it read
            created_at   REAL NOT NULL
        );
        """,
    ),
    (
        "0017_digests",
        """
        -- Digests (issue 12, runtime.memories.digests; the synthesis job): daily notes roll
        -- up into weekly and then monthly digests, grounded in episodes. One row
        -- per period: key '2026-06-30' (day), '2026-W27' (ISO week), '2026-06'
        -- (month), local to the household's time zone; starts_at/ends_at: its
        -- span. refs: JSON ["episode:N", ...], the episodes it was made from.
        -- how: offline, llm or fallback. Monthlies are kept forever; dailies and
        -- weeklies are deleted after their roll-up and a retention. Written by
        -- the Graph actor only, through the write log.
        CREATE TABLE digests (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            period     TEXT NOT NULL CHECK (period IN ('day', 'week', 'month')),
            key        TEXT NOT NULL,
            starts_at  REAL NOT NULL,
            ends_at    REAL NOT NULL,
            text       TEXT NOT NULL,
            refs       TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(refs)),
            how        TEXT NOT NULL CHECK (how IN ('offline', 'llm', 'fallback')),
            created_at REAL NOT NULL,
            UNIQUE (period, key)
        );
        """,
    ),
    (
        "0018_user_profile",
        """
        -- The user profile with a lifecycle (issue 12, runtime.memories.user_profile): one row
        -- per item of a field (a scalar such as name has at most one active item;
        -- a list such as goals many). Never deleted: an item leaves the profile
        -- by its status (done, removed, replaced) with ended_at, and a restated
        -- item supersedes the old one (replaced, replaced_by). norm: the match
        -- key (case, parentheticals and status words removed). Directives carry a
        -- scope (a channel or a person; NULL: everywhere) and a severity. Written
        -- by the Graph actor only, through the write log.
        CREATE TABLE profile_items (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            field       TEXT NOT NULL,
            value       TEXT NOT NULL,
            norm        TEXT NOT NULL,
            scope       TEXT,
            severity    TEXT CHECK (severity IN ('hard', 'soft')),
            status      TEXT NOT NULL DEFAULT 'active'
                        CHECK (status IN ('active', 'done', 'removed', 'replaced')),
            source      TEXT NOT NULL,
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL,
            ended_at    REAL,
            replaced_by INTEGER REFERENCES profile_items (id)
        );
        CREATE INDEX profile_items_active ON profile_items (field, norm)
            WHERE status = 'active';
        """,
    ),
    # 0016 (threads and mood), 0017 (digests), 0018 (user profile): issue 12 slices
    (
        "0019_job_run_write_mark",
        """
        -- The newest write_log id when a run started (runtime.mind.registry.write_mark): a
        -- job that found nothing to do, with nothing written since, is checked
        -- again later (runtime.mind.registry.QUIET_JOBS). NULL: a run from before this column.
        ALTER TABLE job_runs ADD COLUMN write_mark INTEGER;
        """,
    ),
    (
        "0020_transcript_time",
        """
        -- Turns by the time they were said, whatever the channel: temporal
        -- recall's pull-in (runtime.recall.temporal.pull_in) and the digests ask
        -- for a span; without it each such question read every turn (at 100k
        -- turns, 15-30 ms of a recall that names a day).
        CREATE INDEX transcript_time ON transcript (created_at);
        """,
    ),
    (
        "0021_passages",
        f"""
        -- Long turns as overlapping passages (runtime.recall.passages; recall.passages):
        -- derived data like the vectors, written by the indexer (not the write log),
        -- searched by FTS5 and by their own vectors; recall cites their turn.
        CREATE TABLE passages (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,  -- its vector's hnswlib label
            transcript_id INTEGER NOT NULL,
            seq           INTEGER NOT NULL,  -- 0, 1, ... through the turn
            start         INTEGER NOT NULL,  -- character offsets in the turn's content
            stop          INTEGER NOT NULL,
            content       TEXT NOT NULL,
            model         TEXT,  -- the embedding model (NULL: not embedded yet)
            vec           BLOB,
            UNIQUE (transcript_id, seq)
        );
        CREATE INDEX passages_unembedded ON passages (id) WHERE vec IS NULL;
        CREATE VIRTUAL TABLE passages_fts USING fts5 (
            content, content = 'passages', content_rowid = 'id', {_FTS_TOKENIZE}
        );
        CREATE TRIGGER passages_fts_ai AFTER INSERT ON passages BEGIN
            INSERT INTO passages_fts (rowid, content) VALUES (new.id, new.content);
        END;
        CREATE TRIGGER passages_fts_ad AFTER DELETE ON passages BEGIN
            INSERT INTO passages_fts (passages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        END;
        -- a turn forgotten or deleted takes its passages; an edited one's are cut again
        CREATE TRIGGER transcript_passages_gone AFTER DELETE ON transcript BEGIN
            DELETE FROM passages WHERE transcript_id = old.id;
        END;
        CREATE TRIGGER transcript_passages_stale AFTER UPDATE OF content ON transcript BEGIN
            DELETE FROM passages WHERE transcript_id = old.id;
        END;
        """,
    ),
    (
        "0023_derived_provenance",
        """
        -- What a derived row was made from, besides what the schema links
        -- (runtime.memories.cited, runtime.memories.derived; issue 24):
        -- an episode's memories other than its turns and children, JSON ["fact:N", ...]
        -- (the reflection's episode: the findings it tells); a compaction's refs, JSON
        -- ["episode:N", ...], one per gist of its summary, in order. '[]': none, or a row
        -- from before this column (matched on its text instead).
        ALTER TABLE episodes ADD COLUMN provenance TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE compactions ADD COLUMN refs TEXT NOT NULL DEFAULT '[]';
        """,
    ),
]


def applied(conn: apsw.Connection) -> list[str]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " name TEXT PRIMARY KEY, applied_at REAL NOT NULL) WITHOUT ROWID"
    )
    return [row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY name")]


def migrate(conn: apsw.Connection,
            steps: Sequence[tuple[str, str]] = MIGRATIONS) -> list[str]:
    """Apply every step of ``steps`` not yet recorded, in order; return the names applied.

    Steps run with foreign keys off (the only way SQLite lets a table be
    rebuilt: with them on, dropping the old table would cascade into its
    children), each in its own transaction that checks every foreign key
    before it commits. ``steps`` is all of :data:`MIGRATIONS` except in tests
    that build a database as an older version left it."""
    if conn.in_transaction:
        raise RuntimeError("migrate() must run outside a transaction")
    done = set(applied(conn))
    known = {name for name, _ in MIGRATIONS}
    unknown = done - known
    if unknown:
        raise RuntimeError(
            f"database has migrations this code does not know: {sorted(unknown)}; "
            "it was written by a newer Reverie"
        )
    pending = [(name, sql) for name, sql in steps if name not in done]
    if not pending:
        return []
    foreign_keys = _scalar(conn, "PRAGMA foreign_keys")
    conn.execute("PRAGMA foreign_keys = OFF")
    done_now: list[str] = []
    try:
        for name, sql in pending:
            # The write lock is taken before the step is checked again: processes
            # that open a new store at once (the actors start side by side) apply
            # each step once, the later ones finding it recorded.
            conn.execute("BEGIN IMMEDIATE")
            try:
                if list(conn.execute("SELECT 1 FROM schema_migrations WHERE name = ?",
                                     (name,))):
                    conn.execute("COMMIT")
                    continue
                conn.execute(sql)
                broken = list(conn.execute("PRAGMA foreign_key_check"))
                if broken:
                    raise RuntimeError(
                        f"migration {name} would break foreign keys: {broken[:5]}")
                conn.execute(
                    "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                    (name, time.time()),
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # some errors end the transaction themselves
                    conn.execute("ROLLBACK")
                raise
            done_now.append(name)
            log.info("migration applied", extra={"migration": name})
    finally:
        conn.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
    return done_now


def _scalar(conn: apsw.Connection, sql: str) -> object:
    for row in conn.execute(sql):
        return row[0]
    return None
