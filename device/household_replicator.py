"""Litestream for the households one node serves (issue 26): one daemon, many stores.

The hub's own store keeps its :class:`device.replicator.Replicator` (one
``litestream replicate`` with one database in its configuration). The other
households' stores on a node are replicated by *one* more ``litestream
replicate`` per node, started with no database in its configuration; each
household's store is added to it and taken out of it through Litestream's
control socket (``POST /register`` with the household's replica URL, ``POST
/stop``, which waits for a final sync, then ``POST /unregister``). Measured
(Litestream 0.5.17 on this machine, ``docs/scaling.md``): the daemon is
≈ 32 MiB RSS and costs ≈ 0.34 MiB and ≈ 0.07 % of a core idle per database
it replicates, where a process per household would be ≈ 32 MiB each.

Which stores are registered: those the node's Transcript owner has open
(its LRU, ``actors/households.py``): registered when it opens one, stopped
(a final sync) and unregistered when it closes one, so the daemon's work is
bounded by ``households.max_open`` like the rest. A household another owner
writes while the Transcript owner has it closed is caught up by Litestream at
its next registration (it finds the database changed behind it and
uploads it: measured, every row restored). A move closes the household in
every owner first, then registers it once more and stops it: the final sync
(:meth:`HouseholdReplicator.final_sync`).

The daemon is a child of the Transcript owner's process (in its own process
group, output to ``<root>/litestream.log``, 0600); it is restarted when it dies,
and what was registered is registered again. Its configuration
(``<root>/litestream.yml``, 0600) holds no database and no secret: S3
credentials reach it through its environment as for the hub's
(:func:`device.replicator.child_env`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from device.replicator import (
    SHUTDOWN_SYNC_TIMEOUT_S,
    WAL_RESET_DUE,
    ReplicaError,
    _terminate,
    _yaml,
    binary,
    child_env,
    control_request,
    reset_wal,
    retention_values,
)
from runtime.config import Settings
from runtime.store.files import private_dir, write_private

log = logging.getLogger(__name__)


def litestream_url(url: str, settings: Settings) -> str:
    """A household's replica URL as the daemon's ``/register`` reads it: an
    ``s3://`` one carries the settings' ``endpoint``, ``region`` and path
    style in its query (Litestream's URL parameters ``endpoint``, ``region``,
    ``forcePathStyle``), as the hub's replica gets them in its configuration
    (:func:`device.replicator.replica_config`). Credentials never: they reach
    the daemon through its environment."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        return url
    rs = settings.replica
    query = dict(parse_qsl(parts.query))
    if rs.endpoint:
        query["endpoint"] = rs.endpoint
    if rs.region:
        query["region"] = rs.region
    query["forcePathStyle"] = "true" if rs.force_path_style else "false"
    return urlunsplit(parts._replace(query=urlencode(query)))

CONFIG_NAME = "litestream.yml"
LOG_NAME = "litestream.log"
SOCKET_NAME = "litestream.sock"
_SOCKET_MAX = 100
CONTROL_TIMEOUT_S = 30.0
RESTART_AFTER_S = 2.0


def socket_path(root: Path) -> Path:
    """The daemon's control socket: in ``root``, or in an owner-only directory
    of the temporary directory when that path is too long for a Unix socket."""
    path = root / SOCKET_NAME
    if len(os.fsencode(path)) <= _SOCKET_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(root)).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"reverie-{os.getuid()}-h-{digest}"
    with contextlib.suppress(FileExistsError):
        short.mkdir(mode=0o700)
    if short.lstat().st_uid != os.getuid():
        raise ReplicaError(f"{short}: not a directory of this user; remove it")
    os.chmod(short, 0o700)
    return short / SOCKET_NAME


def render_config(settings: Settings, sock: Path) -> str:
    """The daemon's configuration: no database (they are registered at run
    time), the hub's retention, the control socket."""
    lines = ["logging: {level: \"warn\", type: \"text\"}",
             f"socket: {{enabled: true, path: {_yaml(str(sock))}}}",
             f"shutdown-sync-timeout: {_yaml(f'{round(SHUTDOWN_SYNC_TIMEOUT_S * 1000)}ms')}"]
    values = retention_values(settings)
    lines.append(f"snapshot: {{interval: {_yaml(values['snapshot_interval'])}, "
                 f"retention: {_yaml(values['snapshot_retention'])}}}")
    lines.append(f"l0-retention: {_yaml(values['l0_retention'])}")
    lines.append("l0-retention-check-interval: "
                 f"{_yaml(values['l0_retention_check_interval'])}")
    lines.append("levels:")
    lines.extend(f"  - interval: {_yaml(values[f'l{n}_interval'])}" for n in (1, 2, 3))
    lines.append("dbs: []")
    return "\n".join(lines) + "\n"


class HouseholdReplicator:
    """One ``litestream replicate`` for the households stored under ``root``
    (this node's): see the module's docstring. Thread-safe."""

    def __init__(self, settings: Settings, root: Path) -> None:
        self.settings = settings
        self.root = Path(os.path.abspath(root))
        self._lock = threading.RLock()
        self._registered: dict[str, str] = {}  # database path -> replica URL
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: Path | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    # -- the daemon ---------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            private_dir(self.root)
            self._sock = socket_path(self.root)
            write_private(self.root / CONFIG_NAME, render_config(self.settings, self._sock))
            self._spawn()
            self._thread = threading.Thread(target=self._watch, daemon=True,
                                            name="household-litestream")
            self._thread.start()

    def _spawn(self) -> None:
        assert self._sock is not None
        self._sock.unlink(missing_ok=True)
        fd = os.open(self.root / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            self._proc = subprocess.Popen(
                [binary(self.settings), "replicate", "-no-expand-env", "-config",
                 str(self.root / CONFIG_NAME)],
                stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                env=child_env(self.settings), start_new_session=True, close_fds=True)
        finally:
            os.close(fd)
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while not self._sock.exists():  # the socket is up when it answers
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise ReplicaError("the households' litestream did not start; see "
                                   f"{self.root / LOG_NAME}")
            time.sleep(0.02)
        for path, url in self._registered.items():  # after a restart: again
            self._register(path, url)

    def _watch(self) -> None:
        # wakes once every RESTART_AFTER_S, only with households and a replica on
        while not self._stopping.wait(RESTART_AFTER_S):
            self.reset_wals_if_due()
            with self._lock:
                proc = self._proc
                if proc is None or proc.poll() is None or self._stopping.is_set():
                    continue
                log.warning("the households' litestream exited (%s); restarting",
                            proc.returncode)
                try:
                    self._spawn()
                    self.restarts += 1
                except (OSError, ReplicaError) as exc:
                    log.error("cannot restart the households' litestream: %s", exc)

    def stop(self) -> None:
        """Stop the daemon: SIGTERM (it uploads what it has read), then SIGKILL."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc, SHUTDOWN_SYNC_TIMEOUT_S + 5.0)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- databases ----------------------------------------------------------

    def _call(self, url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self._sock is None:
            raise ReplicaError("the households' litestream is not running")
        answer = control_request(self._sock, "POST", url, body, timeout=timeout + 5)
        return dict(answer) if isinstance(answer, dict) else {}

    def _register(self, path: str, url: str) -> None:
        self._call("/register", {"path": path,
                                 "replica_url": litestream_url(url, self.settings)},
                   CONTROL_TIMEOUT_S)

    def register(self, db: Path, replica_url: str) -> None:
        """Replicate ``db`` to ``replica_url`` from now on (again: nothing happens)."""
        path = os.path.abspath(db)
        with self._lock:
            self._registered[path] = replica_url
            self._register(path, replica_url)

    def release(self, db: Path, timeout_s: float = CONTROL_TIMEOUT_S) -> int:
        """Stop replicating ``db``: a final sync (``/stop`` waits for it), then
        out of the daemon. The transaction id the replica then holds (0 when
        it was not registered)."""
        path = os.path.abspath(db)
        with self._lock:
            self._registered.pop(path, None)
            stopped = self._call("/stop", {"path": path, "timeout": int(timeout_s)}, timeout_s)
            gone = self._call("/unregister", {"path": path, "timeout": int(timeout_s)},
                              timeout_s)
        return int(stopped.get("txid") or gone.get("txid") or 0)

    def final_sync(self, db: Path, replica_url: str, timeout_s: float = 120.0) -> int:
        """Every write in ``db`` into its replica, now: registered (Litestream
        reads what it has not seen, uploading a snapshot when the database
        changed behind it), then stopped, which waits for the upload. Call it
        with nothing writing ``db`` (a move closes it in every owner first).
        The transaction id the replica holds."""
        self.register(db, replica_url)
        # a store just registered is not read yet: ``/stop`` alone then uploads
        # nothing (seen: "no matching backup files"). ``/sync`` with ``wait``
        # reads it and waits for the upload; safe here, as nothing writes it
        # (in 0.5.17 it races the sync loop only while writes go on:
        # device/replicator.py, Replicator.sync_now).
        path = os.path.abspath(db)
        with self._lock:
            self._call("/sync", {"path": path, "wait": True, "timeout": int(timeout_s)},
                       timeout_s)
        return self.release(db, timeout_s)

    def reset_wals_if_due(self) -> list[str]:
        """After a forget in a household's store (its owner left the marker
        :data:`device.replicator.WAL_RESET_DUE` beside it: the daemon's read
        transaction kept ``wal_checkpoint(TRUNCATE)`` from resetting the WAL):
        that store out of the daemon (a final sync, its read let go), its WAL
        checkpointed and truncated, the store registered again (Litestream
        then finds the WAL reset and takes a new snapshot). The hub's
        :class:`device.replicator.Replicator` does the same for its own store
        by stopping its daemon; here the other households' replication goes on.
        The databases whose WAL was reset."""
        done = []
        with self._lock:
            due = [(path, url) for path, url in self._registered.items()
                   if (Path(path).parent / WAL_RESET_DUE).exists()]
        for path, url in due:
            with self._lock:
                if self._registered.get(path) != url:
                    continue  # released meanwhile (its close checkpointed it)
                (Path(path).parent / WAL_RESET_DUE).unlink(missing_ok=True)
                reset = False
                try:
                    self.release(Path(path))
                    reset = reset_wal(Path(path), self.settings.store.busy_timeout_ms)
                except Exception as exc:  # the watch thread goes on; the next forget retries
                    log.warning("could not reset a household's WAL: %s", type(exc).__name__)
                try:
                    self.register(Path(path), url)
                except Exception as exc:  # registered again after the daemon's restart
                    log.error("could not register a household's store again: %s",
                              type(exc).__name__)
            log.info("a household's WAL reset after a forget", extra={"reset": reset})
            if reset:
                done.append(path)
        return done

    def registered(self) -> list[str]:
        with self._lock:
            return sorted(self._registered)
