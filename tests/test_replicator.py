"""Litestream replication of the store, with the real litestream binary.

Replicas are a ``file:///`` directory or an S3 bucket on moto's server (started
by the test on a free loopback port). Writers are threads, each with its own
:class:`Store` connection writing with ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from device.replicator import (
    MONITOR_INTERVAL_S,
    PID_NAME,
    ReplicaError,
    Replicator,
    binary,
    child_env,
    config_path,
    log_path,
    meta_dir,
    public_url,
    restore_if_missing,
    restore_into,
    write_config,
)
from runtime.config import CONFIG_DIR, Settings, load_settings
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from tests.waiting import wait_for

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")
BUCKET = "reverie-test"


# -- helpers shared with test_backup ---------------------------------------------


def replica_settings(tmp_path: Path, url: str | None = None, **replica: Any) -> Settings:
    overrides: dict[str, Any] = {
        "store": {"data_dir": str(tmp_path / "data")},
        "replica": {"url": f"file://{tmp_path / 'replica'}" if url is None else url,
                    "sync_interval_s": 0.5,
                    **replica},
    }
    return load_settings(env={}, overrides=overrides)


def open_store(settings: Settings) -> Store:
    return Store(settings.store.path, KINDS)


def write_turns(store: Store, prefix: str, n: int, pause_s: float = 0.0) -> list[str]:
    """Insert ``n`` transcript rows through the store's write path."""
    written = []
    for i in range(n):
        content = f"{prefix}-{i}"
        store.insert("test", "transcript", {"channel": "kitchen", "source": "voice",
                                            "role": "user", "content": content,
                                            "created_at": time.time()})
        written.append(content)
        if pause_s:
            time.sleep(pause_s)
    return written


def concurrent_writes(settings: Settings, writers: int, rows: int,
                      pause_s: float = 0.005) -> set[str]:
    """``writers`` threads, each with its own Store connection, ``rows`` rows each."""
    results: list[list[str]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with open_store(settings) as store:
                results[i] = write_turns(store, f"w{i}", rows, pause_s)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return {c for r in results for c in r}


def contents(path: Path) -> set[str]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {r[0] for r in conn.execute("SELECT content FROM transcript")}
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = apsw.Connection(str(path))
    try:
        return str(next(conn.execute("PRAGMA integrity_check"))[0])
    finally:
        conn.close()


def caught_up(rep: Replicator, since: float, timeout: float = 30.0) -> bool:
    """Wait until a replica sync that started after every commit before
    ``since`` had been read from the WAL has succeeded (the module doc of
    device.replicator: status' last_sync_at)."""
    def done() -> bool:
        last = rep.status()["last_sync_at"]
        return last is not None and last >= since + MONITOR_INTERVAL_S + 1.0
    return wait_for(done, timeout)


def restored_copy(settings: Settings, tmp_path: Path, name: str = "copy.db") -> Path:
    out = tmp_path / name
    assert restore_into(settings, out)
    return out


@pytest.fixture
def replicators() -> Iterator[Callable[..., Replicator]]:
    """Replicators stopped at teardown whatever happens (no litestream survives a test)."""
    made: list[Replicator] = []

    def make(settings: Settings, **kw: Any) -> Replicator:
        rep = Replicator(settings, **kw)
        made.append(rep)
        return rep

    yield make
    for rep in made:
        rep.stop(timeout=5)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port, a bucket, and credentials in
    variables with names of our own (no AWS_* credentials in the environment)."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "LITESTREAM_ACCESS_KEY_ID", "LITESTREAM_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("REVERIE_TEST_S3_KEY", "test-key-id-AKIA1234")
    monkeypatch.setenv("REVERIE_TEST_S3_SECRET", "test-secret-do-not-log")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    client.create_bucket(Bucket=BUCKET)
    try:
        yield {"endpoint": endpoint, "region": "us-east-1",
               "access_key_id_env": "REVERIE_TEST_S3_KEY",
               "secret_access_key_env": "REVERIE_TEST_S3_SECRET"}
    finally:
        server.stop()


# -- configuration -------------------------------------------------------------


def test_config_is_private_quoted_and_holds_no_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    yaml = pytest.importorskip("yaml")
    monkeypatch.setenv("MY_KEY", "AKIA-very-secret-id")
    monkeypatch.setenv("MY_SECRET", "very-secret-key")
    monkeypatch.setenv("REVERIE_LLM_API_KEY", "llm-secret")
    evil = 'bucket/a" x: 1\\ ${HOME} \u2028 é'
    settings = replica_settings(
        tmp_path, f"s3://user:pw@{evil}?endpoint=http://evil", endpoint="http://127.0.0.1:9",
        region="eu-west-1", access_key_id_env="MY_KEY", secret_access_key_env="MY_SECRET")
    path = write_config(settings)
    assert path == config_path(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    for secret in ("AKIA-very-secret-id", "very-secret-key", "llm-secret", "user:pw"):
        assert secret not in text
    db = yaml.safe_load(text)["dbs"][0]
    assert db["path"] == str(settings.store.path)
    assert db["replica"] == {
        "type": "s3", "bucket": "bucket", "path": 'a" x: 1\\ ${HOME} \u2028 é',
        "endpoint": "http://127.0.0.1:9", "region": "eu-west-1", "force-path-style": True,
        "sync-interval": "500ms"}
    # Litestream itself reads it the same way (one database, one s3 replica).
    done = subprocess.run([binary(settings), "databases", "-no-expand-env", "-config",
                           str(path)], capture_output=True, text=True, check=True)
    assert str(settings.store.path) in done.stdout and "s3" in done.stdout
    env = child_env(settings)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIA-very-secret-id"
    assert env["AWS_SECRET_ACCESS_KEY"] == "very-secret-key"
    assert "REVERIE_LLM_API_KEY" not in env and "MY_KEY" not in env
    assert public_url(settings.replica.url) == f"s3://{evil}"  # no user info, no query


def test_file_replica_env_has_no_credentials(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unrelated")
    settings = replica_settings(tmp_path)
    assert "AWS_ACCESS_KEY_ID" not in child_env(settings)
    assert not Replicator(replica_settings(tmp_path, url="")).enabled


# -- replication -----------------------------------------------------------------


def test_replicates_concurrent_writers_to_a_directory(
        tmp_path: Path, replicators: Callable[..., Replicator]) -> None:
    settings = replica_settings(tmp_path)
    open_store(settings).close()  # the schema exists before Litestream starts
    rep = replicators(settings)
    rep.start()
    assert wait_for(lambda: rep.status()["last_sync_at"] is not None, 20)
    expected = concurrent_writes(settings, writers=3, rows=60)
    stopped = time.time()
    assert caught_up(rep, stopped)
    status = rep.status()
    assert status["enabled"] and status["running"] and status["pid"] == rep.pid
    assert status["restarts"] == 0 and status["gaps"] == [] and status["error"] is None
    assert isinstance(status["lag_s"], float) and status["lag_s"] < 30
    assert status["url"] == settings.replica.url
    copy = restored_copy(settings, tmp_path)
    assert contents(copy) == expected
    assert integrity(copy) == "ok"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_path(settings).stat().st_mode) == 0o600
    # The replica files and Litestream's local state are owner-only too.
    replica_dir = tmp_path / "replica"
    for path in [*replica_dir.rglob("*"), *meta_dir(settings).rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    pid = rep.pid
    assert pid is not None
    rep.stop()
    assert not rep.status()["running"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone
    assert not (settings.store.resolved_dir / PID_NAME).exists()


def test_replicates_to_s3_with_credentials_from_named_variables(
        tmp_path: Path, s3: dict[str, str], replicators: Callable[..., Replicator]) -> None:
    import boto3

    settings = replica_settings(tmp_path, f"s3://{BUCKET}/hub/reverie", **s3)
    open_store(settings).close()
    rep = replicators(settings)
    rep.start()
    assert wait_for(lambda: rep.status()["last_sync_at"] is not None, 30), rep.status()
    expected = concurrent_writes(settings, writers=3, rows=40)
    assert caught_up(rep, time.time())
    copy = restored_copy(settings, tmp_path)
    assert contents(copy) == expected
    assert integrity(copy) == "ok"
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys and all(k.startswith("hub/reverie/") for k in keys)
    for path in (config_path(settings), log_path(settings)):
        text = path.read_text()
        assert "test-secret-do-not-log" not in text and "AKIA1234" not in text


def test_restore_from_a_missing_bucket_fails_loudly(tmp_path: Path,
                                                   s3: dict[str, str]) -> None:
    settings = replica_settings(tmp_path, "s3://no-such-bucket/x", **s3)
    with pytest.raises(ReplicaError, match="not starting on an empty store"):
        restore_if_missing(settings)
    assert not settings.store.path.exists()


# -- restore on boot -----------------------------------------------------------------


def test_restore_if_missing(tmp_path: Path, replicators: Callable[..., Replicator]) -> None:
    settings = replica_settings(tmp_path)
    assert restore_if_missing(settings) is False  # first run: no replica yet
    assert not settings.store.path.exists()

    store = open_store(settings)
    rep = replicators(settings)
    rep.start()
    first = set(write_turns(store, "before", 30))
    assert caught_up(rep, time.time())
    rep.stop()
    store.close()
    assert restore_if_missing(settings) is False  # the database is there
    for suffix in ("", "-wal", "-shm"):
        Path(f"{settings.store.path}{suffix}").unlink(missing_ok=True)

    assert restore_if_missing(settings) is True
    db = settings.store.path
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert contents(db) == first and integrity(db) == "ok"
    assert not [p for p in db.parent.iterdir() if p.name.startswith(".restore-")]

    # Replication resumes from the restored database: new rows reach the replica.
    store = open_store(settings)
    rep2 = replicators(settings)
    rep2.start()
    second = set(write_turns(store, "after", 10))
    assert caught_up(rep2, time.time())
    store.close()
    assert contents(restored_copy(settings, tmp_path)) == first | second


def test_restore_if_missing_refuses_an_unreadable_replica(
        tmp_path: Path, replicators: Callable[..., Replicator]) -> None:
    settings = replica_settings(tmp_path)
    store = open_store(settings)
    rep = replicators(settings)
    rep.start()
    write_turns(store, "row", 5)
    assert caught_up(rep, time.time())
    rep.stop()
    store.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{settings.store.path}{suffix}").unlink(missing_ok=True)
    for ltx in (tmp_path / "replica").rglob("*.ltx"):
        ltx.write_bytes(b"\0" * 64)
    with pytest.raises(ReplicaError, match="could not be restored"):
        restore_if_missing(settings)
    assert not settings.store.path.exists()


def test_disabled_or_not_on_boot_does_nothing(tmp_path: Path) -> None:
    assert restore_if_missing(replica_settings(tmp_path, url="")) is False
    assert restore_if_missing(replica_settings(tmp_path, restore_on_boot=False)) is False
    assert not (tmp_path / "data").exists()
    rep = Replicator(replica_settings(tmp_path, url=""))
    rep.start()
    assert rep.status()["enabled"] is False and rep.status()["running"] is False
    rep.stop()


# -- supervision ----------------------------------------------------------------------


def test_killed_litestream_is_restarted_and_the_gap_recorded(
        tmp_path: Path, replicators: Callable[..., Replicator]) -> None:
    settings = replica_settings(tmp_path)
    store = open_store(settings)
    rep = replicators(settings, backoff_s=(1.5, 6.0))
    rep.start()
    before = set(write_turns(store, "before", 10))
    assert caught_up(rep, time.time())
    pid = rep.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not rep.status()["running"], 10)
    killed_at = time.time()
    during = set(write_turns(store, "gap", 10))  # Litestream is down
    status = rep.status()
    assert status["pid"] is None and status["gaps"] and status["gaps"][-1]["to"] is None
    assert "exited" in (status["error"] or "")
    assert wait_for(lambda: rep.status()["restarts"] >= 1 and rep.status()["running"], 20)
    assert rep.pid != pid
    assert caught_up(rep, time.time())
    store.close()
    status = rep.status()
    gap = status["gaps"][-1]
    assert gap["from"] <= killed_at + 1 and gap["to"] is not None and gap["to"] > gap["from"]
    assert status["error"] is None
    assert contents(restored_copy(settings, tmp_path)) == before | during


def test_leftover_litestream_is_stopped_at_start(
        tmp_path: Path, replicators: Callable[..., Replicator]) -> None:
    settings = replica_settings(tmp_path)
    open_store(settings).close()
    cfg = write_config(settings)
    orphan = subprocess.Popen([binary(settings), "replicate", "-no-expand-env", "-config",
                               str(cfg)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        (settings.store.resolved_dir / PID_NAME).write_text(f"{orphan.pid}\n")
        rep = replicators(settings)
        rep.start()
        assert orphan.wait(timeout=15) is not None
        assert rep.pid is not None and rep.pid != orphan.pid
        assert wait_for(lambda: rep.status()["last_sync_at"] is not None, 20)
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
            orphan.wait()


def test_a_households_replica_on_s3_reaches_the_configured_endpoint(
        tmp_path: Path, s3: dict[str, str]) -> None:
    """With households on and an S3-compatible replica (``replica.endpoint``,
    ``region``, path style), the node's one Litestream for the households
    (``device/household_replicator.py``: stores registered by URL at run time)
    uploads each household to ``<hub path>/households/<id>`` on that server,
    and the household restores from it."""
    import boto3

    from device.household_replicator import HouseholdReplicator
    from runtime.store.households import Households

    settings = replica_settings(tmp_path, f"s3://{BUCKET}/hub", **s3)
    settings = settings.model_copy(update={"households": settings.households.model_copy(
        update={"enabled": True})})
    registry = Households(settings)
    registry.add("alpha")
    own = registry.settings_for("alpha")
    with open_store(own) as store:
        told = set(write_turns(store, "alpha", 12))
    replication = HouseholdReplicator(settings, registry.root)
    replication.start()
    try:
        replication.register(own.store.path, own.replica.url)
        assert replication.final_sync(own.store.path, own.replica.url, timeout_s=60) > 0
    finally:
        replication.stop()
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
    # (moto keeps the bucket of other tests of this process: only this prefix)
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="hub/households/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert keys and all(k.startswith("hub/households/alpha/") for k in keys), keys
    assert contents(restored_copy(own, tmp_path)) == told
