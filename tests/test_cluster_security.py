"""The household's cluster certificates and token, and the refusals before any
port opens: ``reverie run --cluster`` and ``reverie join`` exit 3, with the
reason, without them (``actors.cluster.pki``, ``actors.node``,
``actors.cluster.join``). No Ray node is started here: the commands refuse
before Ray is imported (the listeners of a cluster that does start are checked
by connecting, in ``tests/test_cluster_listeners.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from actors.cluster.pki import (
    ClusterFiles,
    ClusterSecurityError,
    check,
    cluster_files,
    issue_node,
    make_ca,
    make_token,
)
from actors.cluster.security import NO_METRICS, _without_metrics
from runtime.config import Settings

REVERIE = [sys.executable, "-m", "actors.cli"]
NODE_IP = "192.0.2.77"


def _household(root: Path, ip: str = NODE_IP) -> ClusterFiles:
    files = ClusterFiles(root / "cluster")
    make_ca(files)
    make_token(files)
    issue_node(files, ip, files)
    return files


def test_the_household_pki_is_owner_only_and_checks(tmp_path: Path) -> None:
    files = _household(tmp_path)
    assert files.dir.stat().st_mode & 0o777 == 0o700
    for path in files.dir.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    check(files, NODE_IP)
    cert = x509.load_pem_x509_certificate(files.node_cert.read_bytes())
    ips = cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert [str(ip) for ip in ips] == [NODE_IP, "127.0.0.1"]
    with pytest.raises(ClusterSecurityError, match="has a CA already"):
        make_ca(files)  # never replaced behind the nodes' backs

    bundle = ClusterFiles(tmp_path / "helper")
    issue_node(files, "192.0.2.78", bundle)
    assert sorted(p.name for p in bundle.dir.iterdir()) == ["ca.crt", "node.crt", "node.key",
                                                            "token"]  # no CA key
    check(bundle, "192.0.2.78")
    assert bundle.token.read_text() == files.token.read_text()


def _take_foreign(files: ClusterFiles, root: Path, *names: str) -> None:
    """Replace ``names`` with those of another household's node."""
    other = _household(root / "other")
    for name in names:
        shutil.copy(getattr(other, name), getattr(files, name))


@pytest.mark.parametrize("spoil, reason", [
    (lambda f, root: f.token.unlink(), "the Ray token is missing"),
    (lambda f, root: f.node_key.unlink(), "this node's key is missing"),
    (lambda f, root: f.ca_cert.unlink(), "CA's certificate is missing"),
    (lambda f, root: f.node_key.chmod(0o640), "readable by others"),
    (lambda f, root: f.token.write_text(" \n"), "is empty"),
    (lambda f, root: shutil.rmtree(f.dir), "no cluster directory"),
    (lambda f, root: _take_foreign(f, root, "node_cert", "node_key"),
     "not signed by the household CA"),
    (lambda f, root: shutil.copy(_household(root / "other").node_key, f.node_key),
     "is not the key of"),
])
def test_check_refuses_with_the_reason(tmp_path: Path, spoil: Callable[[ClusterFiles, Path], Any],
                                       reason: str) -> None:
    files = _household(tmp_path)
    spoil(files, tmp_path)
    with pytest.raises(ClusterSecurityError, match=reason):
        check(files, NODE_IP)


def test_a_certificate_for_another_address_is_refused(tmp_path: Path) -> None:
    files = _household(tmp_path, ip="192.0.2.99")
    with pytest.raises(ClusterSecurityError, match=r"is not for 192\.0\.2\.77"):
        check(files, NODE_IP)


def test_the_agent_is_started_without_its_prometheus_port() -> None:
    command = ["raylet", "--node_ip_address=x",
               "--dashboard_agent_command=python agent.py --head"]
    changed = _without_metrics(command)
    assert changed[:2] == command[:2]
    assert changed[2] == f"--dashboard_agent_command=python agent.py --head {NO_METRICS}"
    assert _without_metrics(changed) == changed  # once


def _env(data_dir: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update({"REVERIE_DATA_DIR": str(data_dir), "REVERIE_CLUSTER__NODE_IP": NODE_IP})
    return env


def _reverie(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REVERIE, *args], env=_env(data_dir), capture_output=True,
                          text=True, timeout=120)


def test_run_cluster_and_join_refuse_without_the_household_pki(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = _reverie(data, "run", "--cluster")
    assert run.returncode == 3, run.stderr
    assert "refusing to start a cluster: no cluster directory" in run.stderr
    assert "starting Ray" not in run.stderr  # refused before Ray
    joined = _reverie(data, "join", "192.0.2.1:6379")
    assert joined.returncode == 3, joined.stderr
    assert "refusing to join: no cluster directory" in joined.stderr

    made = _reverie(data, "cluster", "init")
    assert made.returncode == 0, made.stderr
    (data / "cluster" / "token").unlink()  # TLS alone is not enough
    run = _reverie(data, "run", "--cluster")
    assert run.returncode == 3 and "the Ray token is missing" in run.stderr, run.stderr
    assert not (data / "runtime.json").exists()


def test_cluster_dir_follows_the_configuration(make_settings: Callable[..., Settings],
                                               tmp_path: Path) -> None:
    settings = make_settings()
    assert cluster_files(settings).dir == settings.store.resolved_dir / "cluster"
    settings = make_settings(cluster={"dir": str(tmp_path / "elsewhere")})
    assert cluster_files(settings).dir == tmp_path / "elsewhere"
