"""Persona bootstrap files against real files in temporary directories."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from runtime.config import PersonaSettings
from runtime.llm.persona import (
    BOOTSTRAP_FILES,
    MAX_FILE_BYTES,
    PersonaFile,
    PersonaLoader,
    Signature,
    detect_project_dir,
    truncation_marker,
)


class CountingLoader(PersonaLoader):
    """A real loader that counts how often it reads file contents (no mocks)."""

    def __init__(self, global_dir: Path, project_dir: Path | None) -> None:
        super().__init__(global_dir, project_dir)
        self.reads: list[str] = []

    def _read_bytes(self, path: Path, limit: int) -> tuple[Signature, bytes]:
        self.reads.append(path.name)
        return super()._read_bytes(path, limit)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    g, p = tmp_path / "global", tmp_path / "project"
    g.mkdir()
    p.mkdir()
    return g, p


def names(files: list[PersonaFile]) -> list[str]:
    return [f.name for f in files]


def bump_mtime(path: Path, seconds: int = 10) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


# -- loading --------------------------------------------------------------


def test_bootstrap_names_and_order() -> None:
    assert BOOTSTRAP_FILES == ("AGENTS.md", "SOUL.md", "USER.md", "IDENTITY.md", "RULES.md")


def test_project_wins_over_global_and_order_is_fixed(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    # Written in scrambled order; loaded in bootstrap order.
    (g / "RULES.md").write_text("global rules")
    (g / "SOUL.md").write_text("global soul")
    (p / "SOUL.md").write_text("project soul")
    (g / "AGENTS.md").write_text("global agents")
    (p / "USER.md").write_text("project user")
    files = PersonaLoader(g, p).load()
    assert [(f.name, f.scope, f.text) for f in files] == [
        ("AGENTS.md", "global", "global agents"),
        ("SOUL.md", "project", "project soul"),
        ("USER.md", "project", "project user"),
        ("RULES.md", "global", "global rules"),
    ]
    assert files[1].path == p / "SOUL.md"
    assert files[0].path == g / "AGENTS.md"


def test_no_project_dir_means_global_only(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("global soul")
    (p / "SOUL.md").write_text("project soul")
    assert [(f.scope, f.text) for f in PersonaLoader(g, None).load()] == [
        ("global", "global soul")]


def test_only_the_five_exact_names_load(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    for d in (g, p):
        for other in ("CLAUDE.md", "soul.md", "Rules.md", "README.md", "MEMORY.md",
                      "SOUL.md.bak", "SOUL.txt", "agents.MD"):
            (d / other).write_text(f"not me: {other}")
    assert PersonaLoader(g, p).load() == []
    (p / "IDENTITY.md").write_text("the real one")
    assert names(PersonaLoader(g, p).load()) == ["IDENTITY.md"]


def test_missing_directories_and_files_are_skipped(tmp_path: Path) -> None:
    loader = PersonaLoader(tmp_path / "nope", tmp_path / "nope-either")
    assert loader.load() == []
    assert not loader.is_stale()


def test_empty_and_blank_files_are_skipped_and_global_is_the_fallback(
        dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (p / "SOUL.md").write_text("")
    (g / "SOUL.md").write_text("global soul")
    (p / "RULES.md").write_text("  \n\t\n")
    files = PersonaLoader(g, p).load()
    assert [(f.name, f.scope) for f in files] == [("SOUL.md", "global")]


def test_text_normalised_bom_and_crlf(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    (g / "SOUL.md").write_bytes(b"\xef\xbb\xbfline one\r\nline two\r\n")
    assert PersonaLoader(g, None).load()[0].text == "line one\nline two\n"


def test_from_settings_expands_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "SOUL.md").write_text("from home")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "RULES.md").write_text("project rules")
    loader = PersonaLoader.from_settings(
        PersonaSettings(global_dir=Path("~/cfg"), project_dir=Path("~/proj")))
    assert loader.global_dir == tmp_path / "cfg"
    assert loader.project_dir == tmp_path / "proj"
    assert [(f.name, f.scope) for f in loader.load()] == [
        ("SOUL.md", "global"), ("RULES.md", "project")]
    assert PersonaLoader.from_settings(PersonaSettings()).project_dir is None


# -- workspace detection ----------------------------------------------------


@pytest.mark.parametrize("marker", [".git", ".agent"])
def test_detect_project_dir_walks_up_two_levels(tmp_path: Path, marker: str) -> None:
    root = tmp_path / "project"
    (root / marker).mkdir(parents=True)
    deep = root / "src" / "pkg"
    deep.mkdir(parents=True)
    assert detect_project_dir(deep) == root
    assert detect_project_dir(root) == root


def test_detect_project_dir_accepts_git_file(tmp_path: Path) -> None:
    # A worktree or submodule has a .git *file*.
    (tmp_path / "wt" / "a").mkdir(parents=True)
    (tmp_path / "wt" / ".git").write_text("gitdir: /elsewhere\n")
    assert detect_project_dir(tmp_path / "wt" / "a") == tmp_path / "wt"


def test_detect_project_dir_nearest_marker_wins(tmp_path: Path) -> None:
    (tmp_path / "mono" / ".git").mkdir(parents=True)
    (tmp_path / "mono" / "svc" / ".agent").mkdir(parents=True)
    (tmp_path / "mono" / "svc" / "api").mkdir()
    assert detect_project_dir(tmp_path / "mono" / "svc" / "api") == tmp_path / "mono" / "svc"


def test_detect_project_dir_falls_back_to_start(tmp_path: Path) -> None:
    if any((d / m).exists() for d in (tmp_path, *tmp_path.parents) for m in (".git", ".agent")):
        pytest.skip("a marker exists above the temporary directory")
    start = tmp_path / "a" / "b"
    start.mkdir(parents=True)
    assert detect_project_dir(start) == start


# -- cache and staleness ----------------------------------------------------


def test_unchanged_files_are_not_read_again(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("soul")
    (p / "RULES.md").write_text("rules")
    loader = CountingLoader(g, p)
    first = loader.load()
    assert sorted(loader.reads) == ["RULES.md", "SOUL.md"]
    assert not loader.is_stale()
    assert loader.load() == first
    assert sorted(loader.reads) == ["RULES.md", "SOUL.md"]  # no new reads


def test_cache_is_keyed_by_mtime_and_size_not_content(dirs: tuple[Path, Path]) -> None:
    # Without any hook: rewrite the file with same-size content and restore its
    # mtime; the loader still answers the old text, so it did not read the file.
    g, _ = dirs
    soul = g / "SOUL.md"
    soul.write_text("version A")
    st = soul.stat()
    loader = PersonaLoader(g, None)
    assert loader.load()[0].text == "version A"
    soul.write_text("version B")
    os.utime(soul, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not loader.is_stale()
    assert loader.load()[0].text == "version A"
    # The documented limit of an mtime cache; a real edit moves the mtime:
    bump_mtime(soul)
    assert loader.is_stale()
    assert loader.load()[0].text == "version B"


def test_changed_file_is_stale_and_reread(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("soul")
    rules = p / "RULES.md"
    rules.write_text("rules v1")
    loader = CountingLoader(g, p)
    assert loader.is_stale()  # never loaded
    loader.load()
    loader.reads.clear()
    rules.write_text("rules v2")
    bump_mtime(rules)
    assert loader.is_stale()
    files = loader.load()
    assert loader.reads == ["RULES.md"]  # only the changed file
    assert [f.text for f in files] == ["soul", "rules v2"]
    assert not loader.is_stale()


def test_size_change_with_same_mtime_is_seen(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    soul = g / "SOUL.md"
    soul.write_text("short")
    st = soul.stat()
    loader = PersonaLoader(g, None)
    loader.load()
    soul.write_text("a longer text")
    os.utime(soul, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert loader.is_stale()
    assert loader.load()[0].text == "a longer text"


def test_deleted_file_is_gone_and_stale(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("soul")
    (p / "USER.md").write_text("user")
    loader = PersonaLoader(g, p)
    assert names(loader.load()) == ["SOUL.md", "USER.md"]
    (p / "USER.md").unlink()
    assert loader.is_stale()
    assert names(loader.load()) == ["SOUL.md"]
    assert not loader.is_stale()


def test_deleted_project_file_falls_back_to_global(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("global soul")
    (p / "SOUL.md").write_text("project soul")
    loader = PersonaLoader(g, p)
    assert loader.load()[0].scope == "project"
    (p / "SOUL.md").unlink()
    assert loader.is_stale()
    assert [(f.scope, f.text) for f in loader.load()] == [("global", "global soul")]


def test_new_file_appearing_is_stale(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("global soul")
    loader = PersonaLoader(g, p)
    loader.load()
    assert not loader.is_stale()
    (p / "SOUL.md").write_text("project soul")  # shadows the global one
    assert loader.is_stale()
    assert [(f.scope, f.text) for f in loader.load()] == [("project", "project soul")]
    (g / "RULES.md").write_text("rules")
    assert loader.is_stale()
    assert names(loader.load()) == ["SOUL.md", "RULES.md"]


def test_shadowed_global_change_is_not_stale(dirs: tuple[Path, Path]) -> None:
    g, p = dirs
    (g / "SOUL.md").write_text("global soul")
    (p / "SOUL.md").write_text("project soul")
    loader = CountingLoader(g, p)
    loader.load()
    assert loader.reads == ["SOUL.md"]  # the global one was never read
    (g / "SOUL.md").write_text("global soul, edited")
    bump_mtime(g / "SOUL.md")
    assert not loader.is_stale()


# -- unusable files -----------------------------------------------------------


def test_non_utf8_file_is_skipped_with_warning(dirs: tuple[Path, Path],
                                               caplog: pytest.LogCaptureFixture) -> None:
    g, p = dirs
    (p / "SOUL.md").write_bytes("caf\u00e9 latin-1".encode("latin-1"))
    (g / "SOUL.md").write_text("global soul")
    (g / "RULES.md").write_text("rules")
    with caplog.at_level(logging.WARNING, logger="runtime.llm.persona"):
        files = PersonaLoader(g, p).load()
    assert [(f.name, f.scope) for f in files] == [("SOUL.md", "global"), ("RULES.md", "global")]
    assert "not valid UTF-8" in caplog.text and str(p / "SOUL.md") in caplog.text


def test_directory_with_a_bootstrap_name_is_skipped(dirs: tuple[Path, Path],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    g, p = dirs
    (p / "RULES.md").mkdir()
    (g / "RULES.md").write_text("global rules")
    (g / "SOUL.md").write_text("soul")
    with caplog.at_level(logging.WARNING, logger="runtime.llm.persona"):
        files = PersonaLoader(g, p).load()
    assert [(f.name, f.scope) for f in files] == [("SOUL.md", "global"), ("RULES.md", "global")]
    assert "not a regular file" in caplog.text


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.timeout(10)
def test_fifo_with_a_bootstrap_name_does_not_hang(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    os.mkfifo(g / "SOUL.md")
    (g / "RULES.md").write_text("rules")
    assert names(PersonaLoader(g, None).load()) == ["RULES.md"]


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0,
                    reason="root (or Windows) ignores file permissions")
def test_unreadable_file_is_skipped_then_read_after_chmod(
        dirs: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    g, _ = dirs
    soul = g / "SOUL.md"
    soul.write_text("soul")
    soul.chmod(0)
    loader = PersonaLoader(g, None)
    with caplog.at_level(logging.WARNING, logger="runtime.llm.persona"):
        assert loader.load() == []
    assert "cannot be read" in caplog.text
    assert not loader.is_stale()
    soul.chmod(0o644)  # the mode is part of the signature
    assert loader.is_stale()
    assert names(loader.load()) == ["SOUL.md"]


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_read_error_is_skipped_even_as_root(dirs: tuple[Path, Path],
                                            caplog: pytest.LogCaptureFixture) -> None:
    # Reading /proc/self/mem at offset 0 fails with EIO for every user, root
    # included: a real read error where chmod 000 cannot make one.
    g, _ = dirs
    (g / "SOUL.md").symlink_to("/proc/self/mem")
    (g / "RULES.md").write_text("rules")
    loader = CountingLoader(g, None)
    with caplog.at_level(logging.WARNING, logger="runtime.llm.persona"):
        assert names(loader.load()) == ["RULES.md"]
    assert "cannot be read" in caplog.text
    # The failure is remembered: not retried (nor warned about) while unchanged.
    caplog.clear()
    loader.reads.clear()
    assert names(loader.load()) == ["RULES.md"]
    assert loader.reads == [] and caplog.text == ""


def test_dangling_symlink_is_missing(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    (g / "SOUL.md").symlink_to(g / "nowhere.md")
    loader = PersonaLoader(g, None)
    assert loader.load() == []
    (g / "nowhere.md").write_text("now it exists")
    assert loader.is_stale()
    assert [f.text for f in loader.load()] == ["now it exists"]


def test_global_dir_that_is_a_file_is_skipped(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    g = tmp_path / "global"
    g.write_text("not a directory")
    loader = PersonaLoader(g, None)
    with caplog.at_level(logging.WARNING, logger="runtime.llm.persona"):
        assert loader.load() == []
        assert loader.load() == []
    assert caplog.text.count("cannot be listed") == 1  # warned once


# -- size cap -----------------------------------------------------------------


def test_oversized_file_is_truncated_with_marker(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    body = "x" * (MAX_FILE_BYTES + 5000)
    (g / "SOUL.md").write_text(body)
    text = PersonaLoader(g, None).load()[0].text
    marker = truncation_marker("SOUL.md", len(body))
    assert text == "x" * MAX_FILE_BYTES + "\n\n" + marker
    assert "SOUL.md" in marker and str(len(body)) in marker and str(MAX_FILE_BYTES) in marker


def test_file_exactly_at_the_cap_is_whole(dirs: tuple[Path, Path]) -> None:
    g, _ = dirs
    (g / "SOUL.md").write_text("y" * MAX_FILE_BYTES)
    assert PersonaLoader(g, None).load()[0].text == "y" * MAX_FILE_BYTES


def test_truncation_never_splits_a_character(dirs: tuple[Path, Path]) -> None:
    # "é" is two bytes in UTF-8; an odd prefix puts the cap inside one.
    g, _ = dirs
    body = "a" + "\u00e9" * MAX_FILE_BYTES
    (g / "SOUL.md").write_text(body)
    text = PersonaLoader(g, None).load()[0].text
    kept, _, marker = text.partition("\n\n")
    assert kept == "a" + "\u00e9" * ((MAX_FILE_BYTES - 1) // 2)
    assert len(kept.encode()) <= MAX_FILE_BYTES
    assert marker == truncation_marker("SOUL.md", len(body.encode()))
