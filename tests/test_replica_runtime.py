"""Litestream through ``reverie run``: REVERIE_REPLICA__URL=file:///…, imported turns
survive deleting the database, and ``reverie backup verify`` passes on the live runtime."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.reverie_process import reverie as run_cli
from tests.reverie_process import start_runtime
from tests.reverie_process import status as status_json
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def reverie(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, *args, cwd=ROOT)


def status(env: dict[str, str]) -> dict[str, Any]:
    return status_json(env, cwd=ROOT)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def test_imported_turns_survive_losing_the_database(ray_instance: str, tmp_path: Path,
                                                     model_cache: Path) -> None:
    data, replica = tmp_path / "data", tmp_path / "replica"
    (tmp_path / "reverie.toml").write_text("")
    env = {**os.environ, "REVERIE_DATA_DIR": str(data),
           "REVERIE_CONFIG": str(tmp_path / "reverie.toml"),
           "REVERIE_RUNTIME__NAMESPACE": "test-replica",
           "REVERIE_EMBEDDER__CACHE_DIR": str(model_cache),
           "REVERIE_PERSONA__GLOBAL_DIR": str(tmp_path / "persona"),
           "REVERIE_REPLICA__URL": f"file://{replica}"}
    lines = tmp_path / "turns.jsonl"
    lines.write_text("".join(json.dumps({"content": f"Replicated memory {i} about the boat.",
                                         "created_at": 1_700_000_000 + i}) + "\n"
                             for i in range(25)))
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    try:
        imported = reverie(env, "import", str(lines), "--channel", "chat")
        assert imported.returncode == 0, imported.stderr
        # the replicator (a thread of `reverie run`) reports once Litestream runs
        assert wait_for(lambda: status(env)["replica"]["running"] is True, 60), \
            status(env)["replica"]
        # the replica catches up; then verify passes on the live runtime
        assert wait_for(lambda: reverie(env, "backup", "verify").returncode == 0, 90), \
            reverie(env, "backup", "verify").stderr
        verified = reverie(env, "backup", "verify", "--json")
        assert json.loads(verified.stdout)["ok"] is True
        # restoring over the live store is refused while the runtime runs
        refused = reverie(env, "backup", "restore")
        assert refused.returncode == 2 and "running" in refused.stderr
    finally:
        stop(proc)
    db = data / "reverie.db"
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        path.unlink(missing_ok=True)
    proc = start_runtime(env, "--address", ray_instance, cwd=ROOT)
    try:
        assert db.exists() and (db.stat().st_mode & 0o777) == 0o600
        assert status(env)["counts"]["transcript"] == 25
        found = reverie(env, "recall", "Replicated memory 7 about the boat")
        assert found.returncode == 0 and "memory 7" in found.stdout
        assert wait_for(lambda: reverie(env, "backup", "verify").returncode == 0, 90)
    finally:
        stop(proc)
