"""``reverie init --service``: the systemd unit that runs ``reverie run``
unattended. The command runs as a subprocess with its home and XDG directories
in tmp_path; the unit it writes is checked by ``systemd-analyze verify`` (the
systemd tool that loads a unit as the manager would and reports what it cannot
parse or execute). Nothing is enabled or started."""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.config import ConfigError
from runtime.user_config import service_unit_text

SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or (
    "/usr/bin/systemd-analyze" if os.access("/usr/bin/systemd-analyze", os.X_OK) else None)
REVERIE = Path(sys.executable).parent / "reverie"

needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian's `systemd` package); "
           "the unit cannot be verified here")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REVERIE_", "XDG_"))}
    runtime_dir = tmp_path / "run"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               XDG_RUNTIME_DIR=str(runtime_dir))
    env.update(extra)
    return env


def _init(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REVERIE), "init", "--service", *args], env=_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=120)


def _verify(unit: Path, tmp_path: Path, user: bool) -> None:
    """``systemd-analyze verify`` passes and warns about nothing in the unit (a
    setting it cannot parse is only a warning: exit 0, a line on stderr)."""
    assert SYSTEMD_ANALYZE is not None
    cmd = [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    done = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = [line for line in done.stderr.splitlines()
            if str(unit) in line or "reverie.service" in line]
    assert ours == [], done.stderr


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


@needs_systemd_analyze
def test_init_service_writes_a_user_unit_that_verifies(tmp_path: Path) -> None:
    done = _init(tmp_path)
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "reverie.service"
    assert f"wrote {unit}" in done.stdout
    # it says how to start it, and starts nothing itself
    assert "systemctl --user enable --now reverie.service" in done.stdout
    assert "nothing was enabled or started" in done.stdout
    _verify(unit, tmp_path, user=True)
    _verify(unit, tmp_path, user=False)

    settings = _settings(unit.read_text())
    exec_start = shlex.split(settings["ExecStart"][0])
    assert exec_start[1:] == ["run"]
    executable = Path(exec_start[0])
    assert executable.is_absolute() and executable.is_file() and os.access(executable, os.X_OK)
    assert executable == REVERIE  # this venv's reverie, not whatever is on PATH
    assert settings["Restart"] == ["on-failure"]
    assert settings["UMask"] == ["0077"]
    assert settings["KillMode"] == ["mixed"]  # SIGTERM to reverie run alone; it stops Ray
    assert settings["NoNewPrivileges"] == ["yes"]
    assert "PrivateTmp" not in settings  # the CLI reaches Ray's sockets in <tmp>/reverie-<uid>
    assert settings["EnvironmentFile"] == [f"-{tmp_path / 'config' / 'reverie' / 'reverie.env'}"]
    assert settings["WantedBy"] == ["default.target"]


@needs_systemd_analyze
def test_a_second_run_never_silently_replaces_a_changed_unit(tmp_path: Path) -> None:
    unit = tmp_path / "config" / "systemd" / "user" / "reverie.service"
    assert _init(tmp_path).returncode == 0
    original = unit.read_text()

    again = _init(tmp_path)  # the same text: left as it is, not an error
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert unit.read_text() == original

    changed = original.replace("RestartSec=5", "RestartSec=30")
    unit.write_text(changed)
    refused = _init(tmp_path)
    assert refused.returncode == 2, refused.stdout  # EXIT_BAD_INPUT, as `reverie init` does
    assert "already exists" in refused.stderr and "--force" in refused.stderr
    assert unit.read_text() == changed

    forced = _init(tmp_path, "--force")
    assert forced.returncode == 0, forced.stderr
    assert unit.read_text() == original
    _verify(unit, tmp_path, user=True)


@needs_systemd_analyze
def test_chosen_data_dir_and_config_go_into_the_unit_quoted(tmp_path: Path) -> None:
    """REVERIE_DATA_DIR and REVERIE_CONFIG set by the user are carried into the unit,
    quoted so that a space, a % or a $ survives systemd's parsing (Environment=
    expands specifiers, not variables: a % is doubled, a $ is not)."""
    data = tmp_path / "my data %h $HOME"
    config = tmp_path / "conf dir" / "reverie.toml"
    target = tmp_path / "out" / "reverie.service"
    done = _init(tmp_path, "--path", str(target), REVERIE_DATA_DIR=str(data),
                 REVERIE_CONFIG=str(config))
    assert done.returncode == 0, done.stderr
    _verify(target, tmp_path, user=True)
    text = target.read_text()
    assert f'Environment="REVERIE_DATA_DIR={tmp_path}/my data %%h $HOME"' in text
    assert f'Environment="REVERIE_CONFIG={config}"' in text
    assert f'EnvironmentFile=-{tmp_path}/conf dir/reverie.env\n' in text
    # written elsewhere than the user unit directory: the output says where to put it
    assert "install -m 0644" in done.stdout


@needs_systemd_analyze
def test_the_system_unit_verifies_and_runs_as_a_user(tmp_path: Path) -> None:
    entry = pwd.getpwuid(os.getuid())
    group = grp.getgrgid(entry.pw_gid).gr_name
    text = service_unit_text(REVERIE, env_file=tmp_path / "reverie.env", system=True,
                             user=entry.pw_name, group=group)
    unit = tmp_path / "reverie.service"
    unit.write_text(text)
    _verify(unit, tmp_path, user=False)
    settings = _settings(text)
    assert settings["User"] == [entry.pw_name]
    assert settings["ProtectSystem"] == ["full"]
    assert settings["WantedBy"] == ["multi-user.target"]
    assert settings["After"] == ["network-online.target"]
    with pytest.raises(ConfigError):  # a name the unit would misread is refused
        service_unit_text(REVERIE, env_file=tmp_path / "reverie.env", system=True,
                          user="ana smith")


def test_system_unit_is_refused_as_root_and_without_service(tmp_path: Path) -> None:
    lone = subprocess.run([str(REVERIE), "init", "--system"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert lone.returncode == 2 and "--system goes with --service" in lone.stderr
    assert not (tmp_path / "config" / "reverie" / "reverie.toml").exists()
    if os.geteuid() != 0:
        pytest.skip("not root: the refusal to write a unit running as root is not reachable")
    done = _init(tmp_path, "--system", "--path", str(tmp_path / "reverie.service"))
    assert done.returncode == 2
    assert "never as root" in done.stderr
    assert not (tmp_path / "reverie.service").exists()
