"""``reverie init``'s library side: where the user's configuration lives, and the
commented file it writes (real files in tmp_path)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import CONFIG_DIR, ConfigError, Settings, load_settings
from runtime.llm.persona import BOOTSTRAP_FILES
from runtime.user_config import (
    UserConfigExists,
    default_user_config_path,
    user_config_text,
    write_user_config,
)

SETTING = re.compile(r"^#(?=[A-Za-z_][A-Za-z0-9_-]*\s*=)")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 000: modes must be set explicitly, not left to the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# --------------------------------------------------------------------------- where


def test_default_user_config_path_order(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert default_user_config_path({"HOME": home}) == \
        tmp_path / "home" / ".config" / "reverie" / "reverie.toml"
    assert default_user_config_path({"HOME": home, "XDG_CONFIG_HOME": str(tmp_path / "x")}) == \
        tmp_path / "x" / "reverie" / "reverie.toml"
    # a relative XDG_CONFIG_HOME is invalid by the spec: ignored
    assert default_user_config_path({"HOME": home, "XDG_CONFIG_HOME": "x"}) == \
        tmp_path / "home" / ".config" / "reverie" / "reverie.toml"
    assert default_user_config_path({"HOME": home, "XDG_CONFIG_HOME": str(tmp_path / "x"),
                                     "REVERIE_CONFIG": str(tmp_path / "mine.toml")}) == \
        tmp_path / "mine.toml"
    # no HOME in the mapping: the account's home directory
    assert default_user_config_path({}) == Path.home() / ".config" / "reverie" / "reverie.toml"


# --------------------------------------------------------------------------- writing


def test_init_writes_a_private_file_in_a_private_directory(tmp_path: Path,
                                                            open_umask: None) -> None:
    target = tmp_path / "home" / ".config" / "reverie" / "reverie.toml"
    written = write_user_config(target)
    assert written == target
    assert mode(target) == 0o600
    for directory in (target.parent, target.parent.parent, target.parent.parent.parent):
        assert mode(directory) == 0o700, directory
    assert target.read_text() == user_config_text()


def test_written_file_is_all_defaults_and_is_what_load_settings_reads(tmp_path: Path) -> None:
    home = tmp_path / "home"
    target = write_user_config(default_user_config_path({"HOME": str(home)}))
    env = {"HOME": str(home)}
    assert load_settings(target, env={}) == load_settings(env={}) == load_settings(env=env)
    # what the user changes in it is what they get, without naming anything else
    target.write_text(target.read_text().replace("#max_items = 20", "max_items = 9"))
    settings = load_settings(env=env)
    assert settings.recall.max_items == 9
    assert settings.memory.profiles_file == CONFIG_DIR / "profiles.toml"


def test_every_commented_setting_is_a_real_setting_at_its_default(tmp_path: Path) -> None:
    """Uncommenting every '#key = value' line changes nothing: the names exist
    (unknown ones are errors) and the values are the defaults."""
    target = write_user_config(tmp_path / "reverie.toml")
    lines = target.read_text().splitlines()
    uncommented = [SETTING.sub("", line) for line in lines]
    assert sum(a != b for a, b in zip(lines, uncommented)) > 30
    target.write_text("\n".join(uncommented) + "\n")
    # the [memory] and [mqtt] file lines name copies beside the file
    for name in ("profiles.toml", "fact_kinds.toml", "topics.toml"):
        shutil.copy2(CONFIG_DIR / name, tmp_path / name)
    mine = load_settings(target, env={})
    default = load_settings(env={})
    assert mine.memory.profiles_file == tmp_path / "profiles.toml"
    assert mine.mqtt.topics_file == tmp_path / "topics.toml"
    assert mine.model_copy(update={
        "memory": default.memory,
        "mqtt": mine.mqtt.model_copy(update={"topics_file": default.mqtt.topics_file}),
    }) == default
    # and every section of the settings is shown in the file
    sections = set(tomllib.loads(target.read_text()))
    assert sections >= set(Settings.model_fields) - {"log_level"}


def test_provider_example_uncommented_in_place_gives_a_provider(tmp_path: Path) -> None:
    target = write_user_config(tmp_path / "reverie.toml")
    text = target.read_text()
    start = text.index("\n# [[llm.providers]]") + 1
    block = text[start:text.index("\n\n", start)]
    assert "base_url" in block
    target.write_text(text.replace(block, "\n".join(line.removeprefix("# ")
                                                    for line in block.splitlines())))
    (provider,) = load_settings(target, env={}).llm.providers
    assert (provider.name, provider.api_key_env) == ("ollama", "OPENAI_API_KEY")
    assert load_settings(target, env={}).llm.offline_fallback is True


def test_header_says_where_persona_files_go_and_how_to_add_a_model() -> None:
    text = user_config_text()
    header = text[:text.index("\n\n")]
    for name in BOOTSTRAP_FILES:
        assert name in header
    for words in ("~/.config/reverie", "global_dir", "project_dir", "[[llm.providers]]",
                  "REVERIE_LLM_BASE_URL", "REVERIE_LLM_MODEL", "REVERIE_LLM_API_KEY_ENV",
                  "REVERIE_CONFIG", "XDG_CONFIG_HOME", "Never put an API key"):
        assert words in header, words
    # [memory] says where the packaged profiles and fact kinds are, to copy from
    memory = text[text.index("\n[memory]\n"):text.index("\n[llm]\n")]
    assert str(CONFIG_DIR / "profiles.toml") in memory
    assert str(CONFIG_DIR / "fact_kinds.toml") in memory


# --------------------------------------------------------------------------- overwriting


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    target = tmp_path / "reverie.toml"
    target.write_text("# mine\n[recall]\nmax_items = 3\n")
    target.chmod(0o644)
    with pytest.raises(UserConfigExists, match=r"already exists.*--force") as info:
        write_user_config(target)
    assert isinstance(info.value, FileExistsError)
    assert info.value.path == target
    assert target.read_text() == "# mine\n[recall]\nmax_items = 3\n"
    assert mode(target) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reverie.toml"]


def test_force_replaces_and_makes_it_private(tmp_path: Path, open_umask: None) -> None:
    target = tmp_path / "reverie.toml"
    target.write_text("# mine\n")
    target.chmod(0o644)
    assert write_user_config(target, force=True) == target
    assert target.read_text() == user_config_text()
    assert mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reverie.toml"]  # no temp left


def test_symlink_is_never_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text("# not yours to change\n")
    link = tmp_path / "reverie.toml"
    link.symlink_to(elsewhere)
    with pytest.raises(UserConfigExists):
        write_user_config(link)
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "nothing-here")
    with pytest.raises(UserConfigExists):
        write_user_config(dangling)
    assert not (tmp_path / "nothing-here").exists()
    write_user_config(link, force=True)  # replaces the link itself
    assert not link.is_symlink() and mode(link) == 0o600
    assert elsewhere.read_text() == "# not yours to change\n"


def test_existing_directory_is_left_alone_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    caplog.set_level(logging.WARNING, logger="runtime.user_config")
    target = write_user_config(shared / "reverie.toml")
    assert mode(shared) == 0o755
    assert mode(target) == 0o600
    assert any("other users" in r.getMessage() and str(shared) in r.getMessage()
               for r in caplog.records)


def test_a_directory_in_the_way_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "reverie.toml").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        write_user_config(tmp_path / "reverie.toml", force=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot write"):
        write_user_config(tmp_path / "file" / "reverie.toml")
