"""Owner-only files: the household's memory is readable by its owner alone.

Whatever the process umask, the data directory is 0700 and every file Reverie
writes in it is 0600. Files are created with those modes from the start (never
created readable and narrowed afterwards), and :func:`make_private` narrows
files left by older versions or created by libraries.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) and make it 0700; return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist; make it 0600 if it does."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away, never added
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, as a 0600 file.

    The temporary file is created 0600 in the same directory, flushed to disk
    and renamed over ``path``: a reader sees the old or the new content, never
    a part, and never a moment where the content is readable by others."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), FILE_MODE)  # mkstemp makes it 0600 already; be explicit
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_private(path: Path) -> None:
    """Make an existing file 0600 (a file that does not exist is left alone)."""
    try:
        os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        return
