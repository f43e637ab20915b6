"""Backups through the Litestream replica: verify it, restore from it.

:func:`verify` restores the replica's latest state into an owner-only
temporary file (removed afterwards), runs ``PRAGMA integrity_check`` on it and
compares it, table by table, with the live store opened read-only (one read
transaction, so one consistent snapshot). For every ordinary table (not
SQLite's, not Litestream's ``_litestream_*``, not the shadow tables of
full-text indexes) it compares the row count and the newest row (highest
rowid, or primary key for a ``WITHOUT ROWID`` table) with all its columns.

A table is

``ok``
    equal on both sides;
``behind``
    the replica holds the live store's rows up to its own newest one, which is
    identical in both, and lacks only rows newer than that (appends after the
    restore point);
``changed``
    other differences (rows deleted or updated after the restore point). They
    are explained by lag only when the live write log records a change to that
    table after the replica's last write-log entry, or when the table is
    outside the write log (derived data: vectors, the fact-kind copy);
    otherwise the replica does not match this store.

The replica passes when every table is ``ok``, or the differences are
explained by lag and the lag is within ``replica.max_lag_s``.

The lag is the age of the oldest change missing from the replica: the time of
the oldest live write-log entry the replica lacks (the store's clock), but
never older than the replica's restore point (the timestamp of its newest LTX
file, to the second) less the 1 s Litestream takes to read the WAL; when no
write-log entry is missing, the age of the restore point itself.

:func:`restore` restores to the latest state or to a point in time
(``-timestamp``, RFC 3339). Litestream v0.5 restores to the last transaction
whose LTX file was created *before* that instant: to the transaction for
L0 files (kept 5 minutes), to the compaction interval beyond that (L1 30 s,
L2 5 min, L3 1 h, then daily snapshots).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw

from device.replicator import (
    MONITOR_INTERVAL_S,
    ReplicaError,
    data_dir,
    db_path,
    meta_dir,
    public_url,
    restore_into,
    restore_plan,
    write_config,
)
from runtime.config import Settings
from runtime.store.database import WRITABLE
from runtime.store.files import make_private

log = logging.getLogger(__name__)

_SKIP_PREFIXES = ("sqlite_", "_litestream_")


class BackupError(RuntimeError):
    """A backup operation was refused or failed; the message says why."""


@dataclass
class VerifyResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    lag_s: float | None = None
    txid: str | None = None                 # the replica's restore point
    restore_point_at: float | None = None   # its newest LTX file's time (to the second)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- verify -------------------------------------------------------------------


def verify(settings: Settings, *, now: float | None = None) -> VerifyResult:
    """Restore the latest replica to a temporary file and compare it with the
    live store (see the module doc). Raises :class:`BackupError` only when
    there is nothing to compare (no replica configured, no live store); a bad
    replica is a result with ``ok`` False and the reasons in ``problems``."""
    now = time.time() if now is None else now
    rs = settings.replica
    if not rs.enabled:
        raise BackupError("no replica configured (replica.url is empty)")
    live_path = db_path(settings)
    if not live_path.exists():
        raise BackupError(f"no live store at {live_path}")
    url = public_url(rs.url)
    cfg = write_config(settings)
    work = Path(tempfile.mkdtemp(prefix=".verify-", dir=data_dir(settings)))  # 0700
    try:
        copy = work / "replica.db"
        # The plan names the restore point (its TXID and time) and the restore
        # stops exactly there. Litestream may compact away the plan's files in
        # between: then once more with a new plan.
        for attempt in (1, 2):
            try:
                plan = restore_plan(settings, config=cfg)
            except ReplicaError as e:
                return VerifyResult(False, [f"the replica at {url} cannot be read: {e}"])
            if plan is None:
                return VerifyResult(False, [f"the replica at {url} holds no backup"])
            txid = str(plan.get("max_txid") or "") or None
            point = _restore_point(plan)
            try:
                restore_into(settings, copy, txid=txid, config=cfg)
                break
            except ReplicaError as e:
                if attempt == 2:
                    return VerifyResult(False, [f"the replica at {url} cannot be restored: {e}"],
                                        txid=txid, restore_point_at=point)
        result = _compare(live_path, copy, now=now, point=point, max_lag_s=rs.max_lag_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.txid, result.restore_point_at = txid, point
    if result.ok:
        log.info("replica verified", extra={"txid": txid, "lag_s": result.lag_s})
    else:
        log.warning("replica verification failed", extra={"problems": len(result.problems)})
    return result


def _restore_point(plan: dict[str, Any]) -> float | None:
    stamps = [f.get("timestamp") for f in plan.get("files") or []]
    times = [datetime.fromisoformat(s).timestamp() for s in stamps if s]
    return max(times) if times else None


def _tables(conn: apsw.Connection) -> dict[str, tuple[str, ...]]:
    """Ordinary tables and the key their newest row is found by."""
    out: dict[str, tuple[str, ...]] = {}
    for _schema, name, kind, _ncol, without_rowid, _strict in conn.execute(
            "PRAGMA main.table_list"):
        if kind != "table" or str(name).startswith(_SKIP_PREFIXES):
            continue
        if without_rowid:
            cols = sorted((int(pk), str(col)) for _cid, col, _t, _nn, _d, pk
                          in conn.execute(f'PRAGMA main.table_info("{_ident(name)}")') if pk)
            out[str(name)] = tuple(col for _pk, col in cols)
        else:
            out[str(name)] = ("rowid",)
    return out


def _ident(name: str) -> str:
    return name.replace('"', '""')


def _cols(key: tuple[str, ...]) -> list[str]:
    return [k if k == "rowid" else f'"{_ident(k)}"' for k in key]


def _side(conn: apsw.Connection, table: str, key: tuple[str, ...]) -> dict[str, Any]:
    """A table's row count, newest key and newest row (all columns)."""
    t = _ident(table)
    cols = _cols(key)
    order = ", ".join(f"{c} DESC" for c in cols)
    count = int(next(conn.execute(f'SELECT count(*) FROM "{t}"'))[0])
    newest = list(conn.execute(
        f'SELECT {", ".join(cols)}, * FROM "{t}" ORDER BY {order} LIMIT 1'))
    if not newest:
        return {"rows": count, "key": None, "row": None}
    row = tuple(newest[0])
    return {"rows": count, "key": row[:len(key)], "row": row[len(key):]}


def _key_sql(key: tuple[str, ...]) -> str:
    """Rows whose key is greater than the given one."""
    cols = _cols(key)
    if len(cols) == 1:
        return f"{cols[0]} > ?"
    return f"({', '.join(cols)}) > ({', '.join('?' for _ in cols)})"


def _key_eq_sql(key: tuple[str, ...]) -> str:
    return " AND ".join(f"{c} = ?" for c in _cols(key))


def _unreplicated(live: apsw.Connection, replica: apsw.Connection) -> dict[str, float]:
    """Per table, the time of the oldest live write-log entry the replica lacks."""
    try:
        last = next(replica.execute("SELECT coalesce(max(id), 0) FROM write_log"))[0]
        rows = live.execute("SELECT table_name, min(at) FROM write_log WHERE id > ?"
                            " GROUP BY table_name", (last,))
        return {str(name): float(at) for name, at in rows}
    except apsw.SQLError:  # no write log (not a Reverie store)
        return {}


def _compare(live_path: Path, copy: Path, *, now: float, point: float | None,
             max_lag_s: float) -> VerifyResult:
    problems: list[str] = []
    tables: dict[str, dict[str, Any]] = {}
    replica = apsw.Connection(str(copy))
    live = apsw.Connection(str(live_path), flags=apsw.SQLITE_OPEN_READONLY)
    live.setbusytimeout(5000)
    try:
        live.execute("BEGIN")  # one snapshot of the live store
        try:
            live_tables, rep_tables = _tables(live), _tables(replica)
            pending = _unreplicated(live, replica)
            for name in sorted(set(live_tables) | set(rep_tables)):
                if name not in rep_tables:
                    tables[name] = {"status": "missing"}
                    problems.append(f"{name}: the table is missing from the replica")
                    continue
                if name not in live_tables:
                    tables[name] = {"status": "extra"}
                    problems.append(f"{name}: the replica has this table, the live store not")
                    continue
                tables[name] = _compare_table(live, replica, name, live_tables[name])
        finally:
            live.execute("COMMIT")
    finally:
        live.close()
        replica.close()
        for suffix in ("-wal", "-shm"):  # a read-only open of a stopped store makes them
            make_private(Path(f"{live_path}{suffix}"))

    differing = {n: t for n, t in tables.items() if t["status"] in ("behind", "changed")}
    lag: float | None = 0.0
    if differing:
        floor = None if point is None else point - MONITOR_INTERVAL_S
        oldest = min(pending.values()) if pending else None
        if oldest is not None:
            lag = now - (oldest if floor is None else max(oldest, floor))
        elif point is not None:
            lag = now - point
        else:
            lag = None
    if lag is not None:
        lag = round(max(0.0, lag), 3)
    for name, t in differing.items():
        what = (f"{t['missing']} rows missing from the replica" if t["status"] == "behind"
                else f"rows changed since the replica's restore point (live {t['live_rows']} "
                     f"rows, replica {t['replica_rows']})")
        explained = t["status"] == "behind" or name in pending or name not in WRITABLE
        if not explained:
            problems.append(f"{name}: {what}, and no later write explains it: the replica "
                            "does not match this store")
            continue
        age = lag
        if name in pending and lag is not None:
            floor = None if point is None else point - MONITOR_INTERVAL_S
            age = round(max(0.0, now - (pending[name] if floor is None
                                         else max(pending[name], floor))), 3)
        t["age_s"] = age
        if age is None or age > max_lag_s:
            how_old = "of unknown age" if age is None else f"the oldest is {age:.0f} s old"
            problems.append(f"{name}: {what}; {how_old} (max_lag_s {max_lag_s:g}): "
                            "the replica is stale")
    return VerifyResult(not problems, problems, tables, lag)


def _compare_table(live: apsw.Connection, replica: apsw.Connection, name: str,
                   key: tuple[str, ...]) -> dict[str, Any]:
    lv, rp = _side(live, name, key), _side(replica, name, key)
    info: dict[str, Any] = {
        "live_rows": lv["rows"], "replica_rows": rp["rows"],
        "live_newest": None if lv["key"] is None else list(lv["key"]),
        "replica_newest": None if rp["key"] is None else list(rp["key"]),
        "missing": 0,
    }
    if lv == rp:
        info["status"] = "ok"
        return info
    t = _ident(name)
    if rp["key"] is None:
        newer = lv["rows"]
        same_newest = True
    else:
        newer = int(next(live.execute(
            f'SELECT count(*) FROM "{t}" WHERE {_key_sql(key)}', rp["key"]))[0])
        at = list(live.execute(f'SELECT * FROM "{t}" WHERE {_key_eq_sql(key)}', rp["key"]))
        same_newest = bool(at) and tuple(at[0]) == rp["row"]
    if same_newest and lv["rows"] - newer == rp["rows"]:
        info["status"], info["missing"] = "behind", newer
    else:
        info["status"] = "changed"
    return info


# -- restore --------------------------------------------------------------------


def _rfc3339(text: str) -> str:
    """``text`` (RFC 3339, with a zone) as UTC with microseconds, as Litestream parses it."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError as e:
        raise BackupError(f"timestamp {text!r} is not RFC 3339 "
                          "(e.g. 2026-01-31T18:30:00Z)") from e
    if when.tzinfo is None:
        raise BackupError(f"timestamp {text!r} needs a zone (Z or +hh:mm)")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def restore(settings: Settings, *, timestamp: str | None = None, to: Path | None = None,
            runtime_running: bool) -> Path:
    """Restore the replica (its latest state, or the state at ``timestamp``,
    RFC 3339) into ``to``, or over the live store; return the path written.

    Over the live store only while the runtime is stopped; the old database
    is kept as ``<db>.before-restore-<time>`` (0600, with its ``-wal`` if it
    had one) and Litestream's local state for it is reset. Any other existing
    file is never overwritten. The restored file is 0600 and passes
    ``PRAGMA integrity_check`` before it is renamed into place."""
    rs = settings.replica
    if not rs.enabled:
        raise BackupError("no replica configured (replica.url is empty)")
    live = db_path(settings)
    target = live if to is None else Path(os.path.abspath(Path(to).expanduser()))
    over_live = target == live or (target.exists() and live.exists()
                                   and os.path.samefile(target, live))
    if over_live and runtime_running:
        raise BackupError("the runtime is running: stop it before restoring over the live "
                          "store, or restore into another file (--to)")
    wal = Path(f"{target}-wal")
    if not over_live and (target.exists() or wal.exists()):
        raise BackupError(f"{target} exists: restore into a new file, or over the live store "
                          "with the runtime stopped")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory")
    ts = _rfc3339(timestamp) if timestamp else None
    cfg = write_config(settings)
    try:
        plan = restore_plan(settings, timestamp=ts, config=cfg)
    except ReplicaError as e:
        raise BackupError(f"the replica at {public_url(rs.url)} cannot be read: {e}") from e
    if plan is None:
        at = f" from before {timestamp}" if timestamp else ""
        raise BackupError(f"the replica at {public_url(rs.url)} holds no backup{at}")

    aside: Path | None = None
    if over_live and (target.exists() or wal.exists()):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = target.with_name(f"{target.name}.before-restore-{stamp}")
        _move_db(target, aside)
    try:
        restore_into(settings, target, timestamp=ts,
                     txid=None if ts else str(plan["max_txid"]), config=cfg)
    except ReplicaError as e:
        if aside is not None:
            _move_db(aside, target)
        raise BackupError(f"restore from {public_url(rs.url)} failed: {e}") from e
    if over_live:
        # Litestream's local state described the replaced database.
        shutil.rmtree(meta_dir(settings), ignore_errors=True)
    log.info("restored from the replica",
             extra={"replica": public_url(rs.url), "path": str(target),
                    "timestamp": ts, "kept": None if aside is None else str(aside)})
    return target


def _move_db(src: Path, dst: Path) -> None:
    """Rename a database with its ``-wal`` (the shared-memory file is dropped:
    SQLite rebuilds it), owner-only."""
    if src.exists():
        os.replace(src, dst)
        make_private(dst)
    wal = Path(f"{src}-wal")
    if wal.exists():
        os.replace(wal, Path(f"{dst}-wal"))
        make_private(Path(f"{dst}-wal"))
    Path(f"{src}-shm").unlink(missing_ok=True)
