"""The user's own configuration file, written by ``reverie init``.

A user never edits the packaged ``configs/reverie.toml``: ``reverie init``
writes ``~/.config/reverie/reverie.toml`` (``$XDG_CONFIG_HOME/reverie/`` when
that is set, or ``$REVERIE_CONFIG``), which :func:`runtime.config.load_settings`
layers over the packaged defaults. The file is generated from the packaged
defaults, every setting commented out at its default value (``#key = value``:
remove the ``#`` to change it), under a header saying where persona files go
and how to add a language model. Section headers are left active, so
uncommenting a setting is enough.

The file is created with mode 0600. Directories created for it are 0700; an
existing directory is left as it is (a warning says when other users can list
it), because it may be shared with other things.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from runtime.config import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    LLM_ENV,
    LLM_KEY_VAR,
    ConfigError,
    default_user_config_path,
)
from runtime.store.files import write_private

log = logging.getLogger(__name__)

__all__ = [
    "UserConfigExists",
    "default_user_config_path",
    "user_config_text",
    "write_user_config",
]

FILE_MODE = 0o600
DIR_MODE = 0o700
# A commented-out setting in the generated file: "#key = value".
SETTING_LINE = re.compile(r"^#(?=[A-Za-z_][A-Za-z0-9_-]*\s*=)")


class UserConfigExists(FileExistsError):
    """The file is there already and ``force`` was not given; nothing was written."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} already exists; not overwritten "
                         "(reverie init --force replaces it)")
        self.path = path


def _header() -> list[str]:
    return [
        "# Reverie: your configuration (written by `reverie init`).",
        "#",
        "# Settings are layered: the packaged defaults, then this file, then the",
        "# environment. Every setting below is commented out at its default value;",
        "# remove the leading '#' to change one. A setting left commented keeps the",
        "# packaged default, also in later versions. Unknown names are errors.",
        "#",
        "# This file is read from $REVERIE_CONFIG if that is set, else",
        "# $XDG_CONFIG_HOME/reverie/reverie.toml, else ~/.config/reverie/reverie.toml.",
        "# Any setting can also come from the environment: REVERIE_<SECTION>__<FIELD>",
        "# (e.g. REVERIE_RECALL__MAX_ITEMS=10); REVERIE_DATA_DIR is the data directory.",
        f"# The packaged defaults: {DEFAULT_CONFIG}",
        "#",
        "# Persona: the assistant's bootstrap files are AGENTS.md, SOUL.md, USER.md,",
        "# IDENTITY.md and RULES.md (exact names, all optional). Put them in the global",
        "# directory, [persona] global_dir (default ~/.config/reverie, beside this",
        "# file); a file of the same name in [persona] project_dir wins over the",
        "# global one. They are re-read when they change (by modification time).",
        "#",
        "# Language model: with none configured, a built-in offline provider answers",
        "# from recalled memories. Add an OpenAI-compatible endpoint (Ollama,",
        "# llama.cpp server, vLLM, OpenAI) at the end of the [llm] section below:",
        "#",
        "#   [[llm.providers]]",
        '#   name = "ollama"',
        '#   base_url = "http://127.0.0.1:11434/v1"',
        '#   model = "llama3.2"',
        '#   api_key_env = "OPENAI_API_KEY"   # the NAME of the variable holding the key',
        "#",
        "# or from the environment, tried before the ones configured here:",
        f"#   {LLM_ENV['base_url']}, {LLM_ENV['model']} (required),",
        f"#   {LLM_ENV['api_key_env']} (the NAME of the variable holding the key;",
        f"#   default {LLM_KEY_VAR} when that is set), {LLM_ENV['name']} (default",
        f'#   "env"), {LLM_ENV["timeout_s"]}.',
        "# Never put an API key in this file.",
        "",
    ]


def _memory_section() -> list[str]:
    return [
        "[memory]",
        "# Source memory profiles and fact kinds: by default the packaged",
        f"# {CONFIG_DIR / 'profiles.toml'} and {CONFIG_DIR / 'fact_kinds.toml'}.",
        "# To change one, copy it beside this file and name it here (a relative",
        "# path is relative to this file):",
        '#profiles_file = "profiles.toml"',
        '#fact_kinds_file = "fact_kinds.toml"',
        "",
    ]


def user_config_text() -> str:
    """The commented user configuration: the packaged defaults, every setting
    commented out, under a header (see the module's docstring)."""
    lines = DEFAULT_CONFIG.read_text(encoding="utf-8").splitlines()
    start = 0  # the packaged file's own header is replaced by ours
    while start < len(lines) and (not lines[start].strip() or lines[start].startswith("#")):
        start += 1
    out = _header()
    section: str | None = None
    for line in lines[start:]:
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            section = stripped.split("]")[0] + "]"
            if section == "[memory]":
                out.extend(_memory_section())
                continue
        if section == "[memory]":
            continue
        if not stripped or stripped.startswith("#"):
            out.append(line)
        elif stripped.startswith("[") and not stripped.startswith("[["):
            out.append(line)  # a table header stays active: uncommenting a setting is enough
        else:
            out.append("#" + line)  # a setting, or an array-of-tables header
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


def _make_private_dirs(directory: Path) -> list[Path]:
    """Create ``directory`` and missing parents with mode 0700; the ones created."""
    missing: list[Path] = []
    d = directory
    while not d.exists() and not d.is_symlink() and d != d.parent:
        missing.append(d)
        d = d.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else: not ours to change
        os.chmod(d, DIR_MODE)  # whatever the umask
        created.append(d)
    return created


def _write(fd: int, text: str, mode: int = FILE_MODE) -> None:
    os.fchmod(fd, mode)  # whatever the umask
    data = text.encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_user_config(path: Path | str, force: bool = False) -> Path:
    """Write the commented user configuration to ``path``; its absolute path.

    The file is 0600; directories created for it are 0700. Without ``force``
    an existing file (or symlink) is never touched: :class:`UserConfigExists`.
    With ``force`` it is replaced atomically (a symlink itself is replaced, not
    its target). Other failures raise :class:`ConfigError` naming the path.
    """
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise ConfigError(f"{target}: is a directory; give the path of a file")
    if not force and (target.exists() or target.is_symlink()):
        raise UserConfigExists(target)
    _write_new(target, user_config_text(), force, FILE_MODE, "the configuration")
    log.info("user configuration written to %s", target)
    return target


def _write_new(target: Path, text: str, force: bool, mode: int, what: str) -> None:
    """Write ``text`` to the absolute ``target`` with ``mode``: a new file, or with
    ``force`` an atomic replacement. Missing directories are made 0700; a warning
    when an existing one can be listed by other users."""
    if not force and (target.exists() or target.is_symlink()):
        raise UserConfigExists(target)
    try:
        created = _make_private_dirs(target.parent)
        if force:
            write_private(target, text)  # atomic; a symlink itself is replaced
            os.chmod(target, mode)
        else:
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                raise UserConfigExists(target) from None
            try:
                _write(fd, text, mode)
            except BaseException:
                os.close(fd)
                target.unlink(missing_ok=True)
                raise
            os.close(fd)
    except OSError as exc:
        if isinstance(exc, UserConfigExists):
            raise
        raise ConfigError(f"{target}: cannot write {what}: "
                          f"{exc.strerror or exc}") from None
    if target.parent not in created:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(target.parent.stat().st_mode) & 0o077:
                log.warning("%s can be listed by other users; the file itself is "
                            "%o. chmod 700 it if it is yours alone", target.parent, mode)


# --------------------------------------------------------------------------- the systemd unit
#
# ``reverie init --service`` writes a systemd unit that runs ``reverie run``
# unattended. By default a user unit, ``$XDG_CONFIG_HOME/systemd/user/
# reverie.service`` (``~/.config/systemd/user/``): it runs as the user, whose
# home holds the configuration, the data and the model cache. With ``system``
# a system unit for ``/etc/systemd/system/reverie.service`` that runs as the
# user named in it (never as root). Nothing is enabled or started here; the
# caller prints the ``systemctl`` commands (:func:`service_commands`).
#
# What the unit does, and why:
# - ``Restart=on-failure``: a crash restarts it after RestartSec; a refusal to
#   run exposed (exit 3: a non-loopback Ray node, a Ray directory that is not
#   private, a replica that cannot be restored) is a misconfiguration that a
#   restart cannot mend, so it is not restarted (RestartPreventExitStatus), and
#   a crash loop stops after StartLimitBurst starts in StartLimitIntervalSec.
# - SIGTERM goes to ``reverie run`` alone (KillMode=mixed): it stops the HTTP
#   server, saves the vector indexes, stops the actors and shuts Ray down
#   itself (actors/node.py, actors/supervisor.py: up to 30 + 60 + 30 + 10 s in
#   the worst case). With the default KillMode=control-group every Ray process
#   would get SIGTERM at once and the actors would die before the supervisor
#   stops them. TimeoutStopSec leaves room for that; what is left after the
#   main process exits gets SIGKILL.
# - ``UMask=0077``: whatever the process creates is owner-only (the data
#   directory, the store, the tokens), also where the code does not chmod.
# - ``NoNewPrivileges=yes``: nothing it runs can gain privileges (setuid).
# - No ``PrivateTmp``: Ray's sockets are in ``<tmp>/reverie-<uid>/ray``, and
#   the ``reverie`` commands of a shell (status, say, recall) join the node
#   through them; a private /tmp would hide them from every other process.
# - The system unit adds ``ProtectSystem=full`` (/usr, /boot, /etc read-only)
#   and kernel/cgroup protections. Not ``strict``: Ray writes under /tmp (its
#   session directories, object spilling) and in the user's home, and those
#   paths are not all known before it starts. The user unit has none of these:
#   in a user manager they need unprivileged user namespaces, which some
#   distributions (Ubuntu 24.04) restrict, and the unit would not start.
# - ``EnvironmentFile=-<config dir>/reverie.env`` (optional, ``-``): where the
#   API key of the language model goes (``OPENAI_API_KEY=...``, chmod 600),
#   since a service does not see the variables of a login shell and the
#   configuration file must never hold a key.

SERVICE_NAME = "reverie.service"
SERVICE_MODE = 0o644  # a unit holds no secret; systemd reads system units as root
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
STOP_TIMEOUT_S = 180  # the supervisor's stop (up to ~130 s) and Ray's shutdown
EXIT_EXPOSED = 3  # actors.node.EXIT_EXPOSED (runtime/ does not import actors)
# The environment a unit carries over from the shell that ran `reverie init
# --service`: where the configuration and the data are, when the user chose.
CARRIED_ENV = ("REVERIE_CONFIG", "REVERIE_DATA_DIR")


def default_service_path(system: bool = False, env: Mapping[str, str] | None = None) -> Path:
    """Where ``reverie init --service`` writes the unit: the user unit directory
    (``$XDG_CONFIG_HOME/systemd/user``, else ``~/.config/systemd/user``), or
    ``/etc/systemd/system`` with ``system``."""
    if system:
        return SYSTEM_UNIT_DIR / SERVICE_NAME
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME", "")
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".config"
    return base / "systemd" / "user" / SERVICE_NAME


def _unit_value(value: str, command: bool = False) -> str:
    """A value in a unit file, quoted where systemd would split or expand it:
    ``%`` (a specifier) everywhere, ``$`` only in a command line (Environment=
    gives ``$`` no meaning)."""
    if any(c in value for c in "\n\r\0"):
        raise ConfigError(f"{value!r}: a line break cannot go into a systemd unit")
    if any(c in value for c in ' \t"\'\\$%;'):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        return '"' + (escaped.replace("$", "$$") if command else escaped) + '"'
    return value


def _unit_path(path: Path) -> str:
    """An absolute path at the start of a command line (ExecStart), quoted if needed."""
    text = str(path)
    if not path.is_absolute():
        raise ConfigError(f"{text}: a systemd unit needs an absolute path")
    return _unit_value(text, command=True)


def _unit_name(name: str) -> str:
    """A user or group name for User=/Group= (never quoted: checked instead)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}", name):
        raise ConfigError(f"{name!r}: not a user or group name a systemd unit takes")
    return name


def _unit_file_path(path: Path) -> str:
    """An absolute path for a setting that takes the rest of its line as one path
    (EnvironmentFile=: no quotes there, only specifiers escaped)."""
    text = str(path)
    if not path.is_absolute() or any(c in text for c in "\n\r\0"):
        raise ConfigError(f"{text!r}: a systemd unit needs an absolute path on one line")
    return text.replace("%", "%%")


def service_unit_text(executable: Path, *, env_file: Path, system: bool = False,
                      user: str | None = None, group: str | None = None,
                      environment: Mapping[str, str] | None = None) -> str:
    """The text of the unit that runs ``<executable> run`` (see the comment above
    :data:`SERVICE_NAME` for each setting). ``user`` (and ``group``) are required
    with ``system``; ``environment`` becomes ``Environment=`` lines."""
    if system and not user:
        raise ConfigError("a system unit needs the user it runs as")
    how = ("systemctl daemon-reload && systemctl enable --now reverie.service (as root)"
           if system else "systemctl --user daemon-reload && "
           "systemctl --user enable --now reverie.service")
    lines = [
        "# Reverie: long-term memory for a voice assistant, run unattended.",
        "# Written by `reverie init --service`" + (" --system" if system else "")
        + "; docs/voice.md says what each setting is for.",
        f"# To use it: {how}",
        "",
        "[Unit]",
        "Description=Reverie: long-term memory for a voice assistant",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
    ]
    if system:  # a user manager has no network-online.target
        lines += ["Wants=network-online.target", "After=network-online.target"]
    lines += ["", "[Service]", "Type=simple"]
    if system:
        lines.append(f"User={_unit_name(user or '')}")
        if group:
            lines.append(f"Group={_unit_name(group)}")
    lines += [
        f"ExecStart={_unit_path(executable)} run",
        "Restart=on-failure",
        "RestartSec=5",
        f"RestartPreventExitStatus={EXIT_EXPOSED}",
        "# reverie run stops its actors and Ray itself on SIGTERM",
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        "UMask=0077",
        "NoNewPrivileges=yes",
    ]
    if system:
        lines += [
            "ProtectSystem=full",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectControlGroups=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
        ]
    lines.append("Environment=PYTHONUNBUFFERED=1")
    for name, value in sorted((environment or {}).items()):
        lines.append(f"Environment={_unit_value(f'{name}={value}')}")
    lines += [
        "# the language model's API key, if any: OPENAI_API_KEY=... (chmod 600)",
        f"EnvironmentFile=-{_unit_file_path(env_file)}",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if system else 'default.target'}",
    ]
    return "\n".join(lines) + "\n"


def service_commands(path: Path, system: bool = False) -> list[str]:
    """The commands that install and start the unit written at ``path`` (never run
    here: the host's services are the user's to start)."""
    if system:
        commands = []
        if path.parent != SYSTEM_UNIT_DIR or path.name != SERVICE_NAME:
            commands.append(f"sudo install -m 0644 {path} {SYSTEM_UNIT_DIR / SERVICE_NAME}")
        return [*commands, "sudo systemctl daemon-reload",
                "sudo systemctl enable --now reverie.service",
                "journalctl -u reverie.service -f"]
    commands = ["systemctl --user daemon-reload",
                "systemctl --user enable --now reverie.service",
                "journalctl --user -u reverie.service -f"]
    if path != default_service_path():
        commands.insert(0, f"install -m 0644 {path} {default_service_path()}")
    return [*commands, "loginctl enable-linger $USER   # keep it running while you are "
            "logged out (and start it at boot)"]


def write_service_unit(path: Path | str, text: str, force: bool = False) -> tuple[Path, bool]:
    """Write the unit ``text`` to ``path``; its absolute path and whether it was
    written. A file there with the same text is left as it is (False); a
    different one is never replaced without ``force`` (:class:`UserConfigExists`).
    Directories created for it are 0700, the unit 0644."""
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise ConfigError(f"{target}: is a directory; give the path of a file")
    if target.exists() and not target.is_symlink():
        try:
            if target.read_text(encoding="utf-8") == text:
                return target, False
        except (OSError, UnicodeDecodeError):
            pass
    _write_new(target, text, force, SERVICE_MODE, "the unit")
    log.info("systemd unit written to %s", target)
    return target, True
