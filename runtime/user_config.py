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


def _write(fd: int, text: str) -> None:
    os.fchmod(fd, FILE_MODE)  # whatever the umask
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
    text = user_config_text()
    try:
        created = _make_private_dirs(target.parent)
        if force:
            write_private(target, text)  # atomic; a symlink itself is replaced
        else:
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            except FileExistsError:
                raise UserConfigExists(target) from None
            try:
                _write(fd, text)
            except BaseException:
                os.close(fd)
                target.unlink(missing_ok=True)
                raise
            os.close(fd)
    except OSError as exc:
        if isinstance(exc, UserConfigExists):
            raise
        raise ConfigError(f"{target}: cannot write the configuration: "
                          f"{exc.strerror or exc}") from None
    if target.parent not in created:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(target.parent.stat().st_mode) & 0o077:
                log.warning("%s can be listed by other users; the configuration file itself "
                            "is private (0600). chmod 700 it if it is yours alone",
                            target.parent)
    log.info("user configuration written to %s", target)
    return target
