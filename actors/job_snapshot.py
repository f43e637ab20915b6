"""A job run off the hub reads a snapshot of the household's store, restored for the run.

A job's actor goes to a helper node when one offers the job resource
(``actors.cluster.placement``). The Cron actor, on the hub, tells it the hub's
Ray node id; a job actor on another node (:func:`off_hub`) does not open the
store at its configured path (a helper has no such file, and SQLite's WAL does
not work across machines over a shared filesystem). Instead, when a replica is
configured (``replica.url``), :func:`snapshot`:

1. makes an owner-only scratch directory (0700, ``reverie-snapshot-<pid>-…``)
   in the node's temporary directory (``TMPDIR``), and removes what runs killed
   before their end left there (directories of processes that are gone);
2. asks the Cron actor for the hub's newest write-log id and its ``job_state``
   rows (``HubJobState``);
3. restores the replica's latest state into the scratch directory
   (``device.replicator.restore_into``: ``litestream restore``, integrity
   check, 0600), again every ``RESTORE_AGAIN_S`` until the copy holds that
   write-log id, so the run sees every memory written before it started; past
   ``replica.max_lag_s`` the run fails ("the replica is behind the hub");
4. opens the copy read-only (``SQLITE_OPEN_READONLY``) for the run, with the
   job's settings pointing at the scratch directory (anything a job keeps
   beside the store goes there too, and goes with it);
5. routes the run's ``job_state`` (``runtime.store.job_state.route``): reads
   from the hub's rows, each write a ``SaveJobState`` message to the Cron
   actor, which writes it on the hub; and puts the hub's retry queue of the
   language model (``runtime.llm.queue``: distil's failed segments, references
   only) in the scratch directory, sent back (``SaveLLMQueue``) when the run
   changed it, so a segment queued on a helper is retried later wherever the
   next run goes;
6. at the run's end, closes the copy and deletes the scratch directory.

Memory writes go through the owners as on the hub (``RemoteWriter``). Without
a replica, a job off the hub opens the store at its path when that path is
there (a shared filesystem, as before) and refuses otherwise, and the run is
recorded failed with the reason: never a run on an empty store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import apsw

from actors.common import open_store
from actors.handles import CronClient
from actors.messages import QueueFile, SaveJobState, SaveLLMQueue
from device.replicator import (
    ReplicaError,
    config_path,
    db_path,
    public_url,
    render_config,
    restore_into,
)
from runtime.config import Settings
from runtime.llm.queue import QUEUE_DIR
from runtime.store import job_state
from runtime.store.database import Store
from runtime.store.files import private_dir, write_private
from runtime.time.clock import Clock

log = logging.getLogger(__name__)

PREFIX = "reverie-snapshot-"
_OWN = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
#: The pause before the replica is restored again when it lacked the hub's newest write.
RESTORE_AGAIN_S = 1.0
_QUEUE_FILE = re.compile(r"^(\d{12}|counters)\.json$")


def off_hub(hub_node: str | None) -> bool:
    """True when this process runs on another Ray node than ``hub_node`` (None: the hub)."""
    if hub_node is None:
        return False
    import ray

    return bool(ray.get_runtime_context().get_node_id() != hub_node)


def no_store_reason(settings: Settings) -> str:
    return (f"no household store at {settings.store.path} on this node and no replica"
            " configured (replica.url): a job off the hub reads a snapshot restored from"
            " the household's replica (docs/scaling.md)")


def scratch_root() -> Path:
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(root: Path | None = None) -> int:
    """Remove the scratch directories of this user's processes that are gone (a
    run killed at its hard limit has no ``finally``); how many went."""
    root = root or scratch_root()
    gone = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        found = _OWN.match(entry.name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not entry.is_dir(follow_symlinks=False):
            continue
        if not _alive(int(found.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)
            gone += 1
    return gone


def settings_in(settings: Settings, scratch: Path) -> Settings:
    """``settings`` with the data directory moved to ``scratch`` (the store's file name kept)."""
    store = settings.store.model_copy(update={"data_dir": scratch})
    return settings.model_copy(update={"store": store})


def newest_write(path: Path) -> int:
    """The newest write-log id of the database at ``path`` (read-only)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        newest = conn.execute("SELECT coalesce(max(id), 0) FROM write_log").fetchall()[0][0]
        return int(newest or 0)
    finally:
        conn.close()


def restore_caught_up(local: Settings, want: int) -> float:
    """Restore the replica into ``local``'s store path until the copy holds the
    write-log id ``want``; the seconds it took. Raises :class:`ReplicaError`."""
    cfg = config_path(local)
    write_private(cfg, render_config(local))
    dest = db_path(local)
    started = time.monotonic()
    deadline = started + local.replica.max_lag_s
    while True:
        have = -1  # the replica holds no backup yet
        if restore_into(local, dest, config=cfg, if_replica_exists=True):
            have = newest_write(dest)
            if have >= want:
                return time.monotonic() - started
        if time.monotonic() >= deadline:
            held = "no backup" if have < 0 else f"the write log up to {have}"
            raise ReplicaError(
                f"the replica at {public_url(local.replica.url)} is behind the hub: it holds"
                f" {held}, the hub up to {want}, still after {local.replica.max_lag_s:.0f} s"
                " (replica.max_lag_s)")
        dest.unlink(missing_ok=True)
        time.sleep(RESTORE_AGAIN_S)


def read_queue(directory: Path) -> list[QueueFile]:
    """The files of the language model's retry queue in ``directory`` (its
    entries and counters, by name; references, never memory content)."""
    out: list[QueueFile] = []
    if not directory.is_dir():
        return out
    for path in sorted(directory.iterdir()):
        if _QUEUE_FILE.match(path.name):
            try:
                out.append(QueueFile(name=path.name, data=path.read_text(encoding="utf-8")))
            except FileNotFoundError:
                continue
    return out


def replace_queue(directory: Path, files: list[QueueFile]) -> None:
    """Make the retry queue in ``directory`` exactly ``files``: each written
    owner-only and atomically, then the others removed."""
    private_dir(directory)
    keep = {f.name for f in files}
    for f in files:
        write_private(directory / f.name, f.data)
    for path in directory.iterdir():
        if _QUEUE_FILE.match(path.name) and path.name not in keep:
            path.unlink(missing_ok=True)


def _never(*_: object) -> int:
    return 0


def open_read_only(local: Settings, clock: Clock) -> Store:
    """The restored copy as a :class:`Store` whose connection is read-only.

    The Store is opened as usual first (WAL, migrations: none on a copy of the
    hub's own schema), then its connection is replaced by a read-only one."""
    store = open_store(local, clock)
    store.conn.close()
    conn = apsw.Connection(str(store.path), flags=apsw.SQLITE_OPEN_READONLY)
    conn.setbusytimeout(store.busy_timeout_ms)
    conn.create_scalar_function("write_log_expiry_allowed", _never, 0)
    store.conn = conn
    return store


def _send_queue(cron: CronClient, queue: Path, seeded: list[QueueFile]) -> None:
    """The retry queue back to the hub, when the run changed it."""
    left = read_queue(queue)
    if left != seeded:
        cron.save_llm_queue(SaveLLMQueue(files=left))


@contextlib.contextmanager
def snapshot(settings: Settings, clock: Clock, cron: CronClient | None = None
             ) -> Iterator[tuple[Settings, Store]]:
    """A read-only copy of the household's store for one run off the hub, and
    the run's settings (data directory: the copy's owner-only scratch
    directory); both gone when the block ends (see the module's docstring)."""
    if not settings.replica.enabled:
        raise FileNotFoundError(no_store_reason(settings))
    swept = sweep()
    if swept:
        log.info("removed %d snapshot directories left by killed runs", swept)
    cron = cron or CronClient(settings.runtime.namespace, household=settings.household.id)
    scratch = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=scratch_root()))
    try:
        local = settings_in(settings, scratch)
        hub = cron.hub_job_state()
        took = restore_caught_up(local, hub.write_log_id)
        log.info("snapshot restored in %.2f s (write log up to %d)", took, hub.write_log_id)
        store = open_read_only(local, clock)
        try:
            def send(job: str, key: str, value: str, at: float) -> None:
                cron.save_job_state(SaveJobState(job=job, key=key, value=value, at=at))

            job_state.route(store, send, {(r.job, r.key): r.value for r in hub.rows})
            queue = scratch / QUEUE_DIR
            if hub.llm_queue:
                replace_queue(queue, hub.llm_queue)
            try:
                yield local, store
            except BaseException:
                with contextlib.suppress(Exception):  # the run's own error is what is told
                    _send_queue(cron, queue, hub.llm_queue)
                raise
            _send_queue(cron, queue, hub.llm_queue)
        finally:
            store.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
