"""Owner-only files whatever the umask: runtime.store.files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.store.files import make_private, private_dir, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_private_dir_is_0700_new_or_existing(tmp_path: Path, umask: int) -> None:
    fresh = private_dir(tmp_path / "a" / "b")
    assert fresh.is_dir() and mode(fresh) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    assert mode(private_dir(loose)) == 0o700


def test_write_private_replaces_atomically_as_0600(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "index.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    write_private(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'
    assert mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]  # no temporary left


def test_write_private_failure_leaves_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "index.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_private(target, "\udcff")  # a lone surrogate cannot be encoded
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_make_private_narrows_existing_and_ignores_missing(tmp_path: Path, umask: int) -> None:
    f = tmp_path / "turn.hnsw"
    f.write_bytes(b"x")
    os.chmod(f, 0o666)
    make_private(f)
    assert mode(f) == 0o600
    make_private(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
