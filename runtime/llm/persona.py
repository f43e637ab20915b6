"""Persona bootstrap files: who the assistant is, loaded from Markdown on disk.

Exactly five files are recognised, by exact, case-sensitive name and in this
order: ``AGENTS.md``, ``SOUL.md``, ``USER.md``, ``IDENTITY.md``, ``RULES.md``.
Any other name (``CLAUDE.md``, ``soul.md``, ``README.md``) is ignored. Each is
looked up first in the project directory, then in the global directory
(``~/.config/reverie`` by default): a usable project file wins, the global one
is the fallback. All five are optional.

A file is *skipped* (and the global file, if any, used instead) when it is
missing, empty or whitespace-only, or unusable: not a regular file (a
directory, a FIFO), unreadable, or not valid UTF-8. Unusable files are logged
once per state as a warning; nothing here raises because of a file's contents.

Each file is capped at ``MAX_FILE_BYTES`` (16 KiB) of UTF-8; a longer file is
cut at a character boundary below the cap and ends with a truncation marker
naming the file and its size, so the model (and whoever reads the prompt) can
tell. A persona is a few paragraphs; the cap only stops an accident (a pasted
log, a wrong symlink) from filling the context window.

``PersonaLoader`` caches by file signature (device, inode, mtime in ns, size,
mode): a file whose signature is unchanged is not read again. Caveat: an edit
that keeps the size and lands within the filesystem's mtime granularity (1-2 s
on FAT/ext3, nanoseconds on ext4/btrfs/APFS) is not seen until the next change.
The loader is not thread-safe; use one per thread or actor.
"""

from __future__ import annotations

import codecs
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runtime.config import PersonaSettings

log = logging.getLogger(__name__)

BOOTSTRAP_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "IDENTITY.md", "RULES.md")
PROJECT_MARKERS = (".git", ".agent")
# Per-file cap, in bytes of UTF-8 (16 KiB).
MAX_FILE_BYTES = 16 * 1024
# UTF-8, a leading byte-order mark dropped (files saved by Windows editors).
_DECODER = codecs.getincrementaldecoder("utf-8-sig")

Scope = Literal["project", "global"]
# (st_dev, st_ino, st_mtime_ns, st_size, st_mode): mode so a chmod or a file
# turned into a directory counts as a change; inode so a rename-over counts.
Signature = tuple[int, int, int, int, int]


def detect_project_dir(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding ``.git`` or ``.agent``.

    ``.git`` may be a directory or a file (worktrees, submodules). With no
    marker up to the filesystem root, ``start`` itself is returned.
    """
    start = Path(os.path.abspath(start.expanduser()))
    for candidate in (start, *start.parents):
        for marker in PROJECT_MARKERS:
            try:
                if (candidate / marker).exists():
                    return candidate
            except OSError:  # e.g. a parent we may not search
                continue
    return start


@dataclass(frozen=True)
class PersonaFile:
    name: str
    path: Path
    text: str
    scope: Scope


def truncation_marker(name: str, size: int) -> str:
    """The line that ends a file cut at ``MAX_FILE_BYTES``."""
    total = f"{size} bytes" if size > MAX_FILE_BYTES else f"over {MAX_FILE_BYTES} bytes"
    return (f"[truncated: {name} is {total}; only the first {MAX_FILE_BYTES} bytes "
            f"were loaded]")


class PersonaLoader:
    """Loads the bootstrap files of one project directory over one global directory."""

    def __init__(self, global_dir: Path, project_dir: Path | None) -> None:
        self.global_dir = global_dir
        self.project_dir = project_dir
        # path -> (signature of what was read, the file or None when skipped)
        self._cache: dict[Path, tuple[Signature, PersonaFile | None]] = {}
        # Every path the last load() consulted -> its signature then (None: absent).
        self._seen: dict[Path, Signature | None] | None = None
        self._warned: set[tuple[Path, str]] = set()

    @classmethod
    def from_settings(cls, settings: PersonaSettings) -> PersonaLoader:
        """A loader for the configured directories (``~`` expanded).

        ``project_dir`` is used as given (no marker search); ``None`` means
        global files only. Pass ``detect_project_dir(...)`` yourself to search.
        """
        project = settings.project_dir.expanduser() if settings.project_dir else None
        return cls(settings.global_dir.expanduser(), project)

    # -- public -----------------------------------------------------------

    def load(self) -> list[PersonaFile]:
        """The usable bootstrap files, in ``BOOTSTRAP_FILES`` order, project over global."""
        listings: dict[Path, frozenset[str]] = {}
        seen: dict[Path, Signature | None] = {}
        cache: dict[Path, tuple[Signature, PersonaFile | None]] = {}
        out: list[PersonaFile] = []
        for name in BOOTSTRAP_FILES:
            for scope, directory in self._dirs():
                path = directory / name
                sig = self._signature(directory, name, listings)
                if sig is None:
                    seen[path] = None
                    continue
                cached = cache.get(path) or self._cache.get(path)
                if cached is not None and cached[0] == sig:
                    entry = cached
                else:
                    entry = self._read(name, path, scope)
                sig_read, persona = entry
                # Record what was actually read: if the file changed between the
                # stat and the read, is_stale() will notice and the next load re-reads.
                seen[path] = sig_read
                cache[path] = entry
                if persona is not None:
                    if persona.scope != scope:  # same path serves both scopes
                        persona = PersonaFile(persona.name, persona.path, persona.text, scope)
                    out.append(persona)
                    break
        self._cache = cache
        self._seen = seen
        return out

    def is_stale(self) -> bool:
        """Whether a file consulted by the last ``load()`` appeared, vanished or changed.

        True before the first load. Only paths that mattered count: a global
        file shadowed by a usable project file may change without making the
        loader stale.
        """
        if self._seen is None:
            return True
        listings: dict[Path, frozenset[str]] = {}
        for path, before in self._seen.items():
            if self._signature(path.parent, path.name, listings) != before:
                return True
        return False

    # -- internals --------------------------------------------------------

    def _dirs(self) -> Iterator[tuple[Scope, Path]]:
        if self.project_dir is not None:
            yield "project", self.project_dir
        yield "global", self.global_dir

    def _listing(self, directory: Path, listings: dict[Path, frozenset[str]]) -> frozenset[str]:
        """Names in ``directory`` (for exact-case matching on case-insensitive filesystems)."""
        names = listings.get(directory)
        if names is None:
            try:
                names = frozenset(os.listdir(directory))
            except FileNotFoundError:
                names = frozenset()
            except OSError as e:  # not a directory, no permission
                self._warn_once(directory, type(e).__name__,
                                "persona directory %s cannot be listed (%s); skipped",
                                directory, e)
                names = frozenset()
            listings[directory] = names
        return names

    def _signature(self, directory: Path, name: str,
                   listings: dict[Path, frozenset[str]]) -> Signature | None:
        if name not in self._listing(directory, listings):
            return None
        try:
            return _sig(os.stat(directory / name))
        except OSError:  # vanished meanwhile, dangling symlink, loop
            return None

    def _read(self, name: str, path: Path, scope: Scope) -> tuple[Signature, PersonaFile | None]:
        """Read one file; (its signature, the file or None when skipped)."""
        try:
            sig, data = self._read_bytes(path, MAX_FILE_BYTES + 1)
        except _NotRegular as e:
            log.warning("persona file %s is not a regular file; skipped", path)
            return e.sig, None
        except OSError as e:
            log.warning("persona file %s cannot be read (%s); skipped", path, e)
            # An unreadable file still has a signature, so it is not retried
            # (nor warned about) until it changes, e.g. by a chmod.
            try:
                return _sig(os.stat(path)), None
            except OSError:
                return (-1, -1, -1, -1, -1), None
        truncated = len(data) > MAX_FILE_BYTES
        try:
            decoder = _DECODER()
            # final=False leaves a multi-byte character cut by the cap undecoded
            # instead of failing; invalid bytes still raise.
            text = decoder.decode(data[:MAX_FILE_BYTES], final=not truncated)
        except UnicodeDecodeError as e:
            # The position only: the error's own text quotes the file's bytes.
            log.warning("persona file %s is not valid UTF-8 (at byte %d); skipped", path,
                        e.start)
            return sig, None
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if not text.strip():
            log.debug("persona file %s is empty; skipped", path)
            return sig, None
        if truncated:
            size = sig[3]
            log.warning("persona file %s is %d bytes; truncated to %d", path, size,
                        MAX_FILE_BYTES)
            text = text.rstrip() + "\n\n" + truncation_marker(name, size)
        return sig, PersonaFile(name=name, path=path, text=text, scope=scope)

    def _read_bytes(self, path: Path, limit: int) -> tuple[Signature, bytes]:
        """At most ``limit`` bytes of a regular file, with the signature of what was opened.

        The only place file contents are read (tests count calls here).
        O_NONBLOCK so a FIFO under a bootstrap name cannot hang the open.
        """
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _NotRegular(_sig(st))
            chunks: list[bytes] = []
            remaining = limit
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return _sig(st), b"".join(chunks)
        finally:
            os.close(fd)

    def _warn_once(self, path: Path, key: str, msg: str, *args: object) -> None:
        if (path, key) not in self._warned:
            self._warned.add((path, key))
            log.warning(msg, *args)


class _NotRegular(OSError):
    def __init__(self, sig: Signature) -> None:
        super().__init__("not a regular file")
        self.sig = sig


def _sig(st: os.stat_result) -> Signature:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)
