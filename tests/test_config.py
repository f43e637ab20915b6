from pathlib import Path

import pytest

from runtime.config import DEFAULT_CONFIG, ConfigError, load_settings


def test_default_file_loads_embedded_profile() -> None:
    s = load_settings(env={})
    assert s.store.file == "reverie.db"
    assert s.recall.max_items == 20 and s.recall.max_tokens == 2000
    assert s.memory.profiles_file.is_file() and s.memory.fact_kinds_file.is_file()


def test_data_dir_and_nested_env_overrides(tmp_path: Path) -> None:
    s = load_settings(env={"REVERIE_DATA_DIR": str(tmp_path), "REVERIE_RECALL__MAX_ITEMS": "7"})
    assert s.store.path == tmp_path / "reverie.db"
    assert s.recall.max_items == 7


def test_bad_env_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"recall\.max_items"):
        load_settings(env={"REVERIE_RECALL__MAX_ITEMS": "lots"})


def test_unknown_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "r.toml"
    bad.write_text(DEFAULT_CONFIG.read_text().replace("[recall]", "[recall]\nmax_itemz = 3"))
    bad.with_name("profiles.toml").write_text((DEFAULT_CONFIG.parent / "profiles.toml").read_text())
    bad.with_name("fact_kinds.toml").write_text(
        (DEFAULT_CONFIG.parent / "fact_kinds.toml").read_text())
    with pytest.raises(ConfigError, match=r"recall\.max_itemz"):
        load_settings(bad, env={})


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("[store\nfile = ")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_settings(bad, env={})


def test_missing_file_and_missing_profiles_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_settings(tmp_path / "nope.toml", env={})
    cfg = tmp_path / "r.toml"
    cfg.write_text('[memory]\nprofiles_file = "missing.toml"\n')
    with pytest.raises(ConfigError, match=r"memory\.profiles_file"):
        load_settings(cfg, env={})


def test_wrong_type_in_file_names_section_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "r.toml"
    cfg.write_text(f'[store]\nbusy_timeout_ms = -5\n[memory]\nprofiles_file = '
                   f'"{DEFAULT_CONFIG.parent / "profiles.toml"}"\nfact_kinds_file = '
                   f'"{DEFAULT_CONFIG.parent / "fact_kinds.toml"}"\n')
    with pytest.raises(ConfigError, match=r"store\.busy_timeout_ms"):
        load_settings(cfg, env={})
