import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from runtime.config import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    ConfigError,
    ProviderSettings,
    load_settings,
)


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


# --------------------------------------------------------------------------- packaged defaults

PACKAGED = ("reverie.toml", "profiles.toml", "fact_kinds.toml")


def test_packaged_dir_is_the_configs_package() -> None:
    import configs

    assert CONFIG_DIR == Path(configs.__file__).parent
    assert DEFAULT_CONFIG == CONFIG_DIR / "reverie.toml"
    assert all((CONFIG_DIR / name).is_file() for name in PACKAGED)


def _copy_sources(dest: Path) -> Path:
    """The files a wheel is built from, copied so the build leaves the checkout alone."""
    repo = Path(__file__).resolve().parent.parent
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("runtime", "actors", "device", "configs"):
        shutil.copytree(repo / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, dest / name)
    return dest


@pytest.mark.timeout(600)
def test_wheel_ships_the_packaged_defaults_and_finds_them_installed(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    out = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out), str(src)], check=True, timeout=300)
    (wheel,) = out.glob("reverie-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {f"configs/{name}" for name in PACKAGED} <= names
    assert "configs/__init__.py" in names

    # Installed elsewhere, run from elsewhere: the defaults come from the install.
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, timeout=300)
    home = tmp_path / "home"
    user = home / ".config" / "reverie" / "reverie.toml"
    user.parent.mkdir(parents=True)
    user.write_text("[recall]\nmax_items = 7\n")  # names no profiles_file/fact_kinds_file
    script = (
        "import json\n"
        "from runtime.config import CONFIG_DIR, load_settings\n"
        f"s = load_settings(env={{'HOME': {str(home)!r}}})\n"
        "print(json.dumps([str(CONFIG_DIR), str(s.memory.profiles_file),\n"
        "                  str(s.memory.fact_kinds_file), s.recall.max_items]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REVERIE_CONFIG")}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    config_dir, profiles, kinds, max_items = json.loads(run.stdout)
    assert Path(config_dir) == site / "configs"
    assert Path(profiles) == site / "configs" / "profiles.toml"
    assert Path(kinds) == site / "configs" / "fact_kinds.toml"
    assert max_items == 7


# --------------------------------------------------------------------------- which file


def _user_file(base: Path, text: str) -> Path:
    path = base / "reverie" / "reverie.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_config_without_memory_paths_layers_over_the_packaged_defaults(
        tmp_path: Path) -> None:
    _user_file(tmp_path / "home" / ".config",
               '[recall]\nmax_items = 7\n[channels.kitchen]\nseed = false\n')
    s = load_settings(env={"HOME": str(tmp_path / "home")})
    assert s.recall.max_items == 7
    assert s.recall.max_tokens == 2000  # not named: the default
    assert s.memory.profiles_file == CONFIG_DIR / "profiles.toml"
    assert s.memory.fact_kinds_file == CONFIG_DIR / "fact_kinds.toml"
    # a new channel adds to the packaged ones instead of replacing them
    assert set(s.channels) == {"chat", "voice", "cli", "dmn", "kitchen"}
    assert s.channels["dmn"].background and not s.channels["kitchen"].seed


def test_user_config_lookup_order(tmp_path: Path) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    _user_file(home / ".config", "[recall]\nmax_items = 3\n")
    _user_file(xdg, "[recall]\nmax_items = 4\n")
    explicit = _user_file(tmp_path / "explicit", "[recall]\nmax_items = 5\n")
    named = _user_file(tmp_path / "named", "[recall]\nmax_items = 6\n")

    def max_items(env: dict[str, str], path: Path | None = None) -> int:
        return load_settings(path, env=env).recall.max_items

    assert max_items({}) == 20  # no home in env: the packaged defaults only
    assert max_items({"HOME": str(home)}) == 3
    assert max_items({"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)}) == 4
    assert max_items({"HOME": str(home), "XDG_CONFIG_HOME": "relative/xdg"}) == 3
    assert max_items({"HOME": str(home), "XDG_CONFIG_HOME": str(xdg),
                      "REVERIE_CONFIG": str(named)}) == 6
    assert max_items({"HOME": str(home), "REVERIE_CONFIG": str(named)}, explicit) == 5
    assert max_items({"HOME": str(tmp_path / "nobody")}) == 20  # no user file: defaults
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_settings(env={"HOME": str(home), "REVERIE_CONFIG": str(tmp_path / "gone.toml")})


def test_unreadable_user_config_is_a_config_error(tmp_path: Path) -> None:
    path = _user_file(tmp_path / "home" / ".config", "[recall]\nmax_items = 3\n")
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        load_settings(path, env={})


# --------------------------------------------------------------------------- LLM from env

LLM_URL = "http://127.0.0.1:11434/v1"


def test_llm_provider_from_the_environment_comes_first(tmp_path: Path) -> None:
    cfg = tmp_path / "r.toml"
    cfg.write_text('[[llm.providers]]\nname = "configured"\nbase_url = "http://10.0.0.2/v1"\n'
                   'model = "m"\n')
    s = load_settings(cfg, env={"REVERIE_LLM_BASE_URL": LLM_URL,
                                "REVERIE_LLM_MODEL": "llama3.2",
                                "REVERIE_LLM_API_KEY_ENV": "MY_KEY",
                                "REVERIE_LLM_TIMEOUT_S": "12.5"})
    first, second = s.llm.providers
    assert first == ProviderSettings(name="env", base_url=LLM_URL, model="llama3.2",
                                     api_key_env="MY_KEY", timeout_s=12.5)
    assert second.name == "configured"


def test_llm_provider_from_the_environment_name_and_key_variable() -> None:
    base = {"REVERIE_LLM_BASE_URL": LLM_URL, "REVERIE_LLM_MODEL": "m"}
    (p,) = load_settings(env={**base, "REVERIE_LLM_NAME": "ollama"}).llm.providers
    assert (p.name, p.api_key_env, p.timeout_s) == ("ollama", None, 30.0)
    # the key put straight in REVERIE_LLM_API_KEY: that variable is named, the key never copied
    (p,) = load_settings(env={**base, "REVERIE_LLM_API_KEY": "sk-abc"}).llm.providers
    assert p.api_key_env == "REVERIE_LLM_API_KEY"
    assert "sk-abc" not in repr(p)
    (p,) = load_settings(env={**base, "REVERIE_LLM_API_KEY": "sk-abc",
                              "REVERIE_LLM_API_KEY_ENV": "OTHER"}).llm.providers
    assert p.api_key_env == "OTHER"
    # nothing set: no provider
    assert load_settings(env={"REVERIE_LLM_API_KEY": "sk-abc"}).llm.providers == []
    assert load_settings(env={"REVERIE_LLM_BASE_URL": " "}).llm.providers == []


@pytest.mark.parametrize(("extra", "variable"), [
    ({"REVERIE_LLM_MODEL": "m"}, "REVERIE_LLM_BASE_URL"),
    ({"REVERIE_LLM_BASE_URL": LLM_URL}, "REVERIE_LLM_MODEL"),
    ({"REVERIE_LLM_API_KEY_ENV": "K"}, "REVERIE_LLM_BASE_URL"),
    ({"REVERIE_LLM_BASE_URL": "ftp://host/v1", "REVERIE_LLM_MODEL": "m"},
     "REVERIE_LLM_BASE_URL"),
    ({"REVERIE_LLM_BASE_URL": "http:///v1", "REVERIE_LLM_MODEL": "m"},
     "REVERIE_LLM_BASE_URL"),
    ({"REVERIE_LLM_BASE_URL": LLM_URL, "REVERIE_LLM_MODEL": "m",
      "REVERIE_LLM_TIMEOUT_S": "soon"}, "REVERIE_LLM_TIMEOUT_S"),
    ({"REVERIE_LLM_BASE_URL": LLM_URL, "REVERIE_LLM_MODEL": "m",
      "REVERIE_LLM_TIMEOUT_S": "0"}, "REVERIE_LLM_TIMEOUT_S"),
    ({"REVERIE_LLM_BASE_URL": LLM_URL, "REVERIE_LLM_MODEL": "m",
      "REVERIE_LLM_API_KEY_ENV": "sk-live-0123456789"}, "REVERIE_LLM_API_KEY_ENV"),
])
def test_bad_llm_environment_names_the_variable(extra: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env=extra)
    message = str(info.value)
    assert message.startswith(f"{variable}:")
    assert "sk-live-0123456789" not in message  # a key in the wrong place is never echoed


def test_key_in_place_of_a_variable_name_is_refused_in_the_file_too(tmp_path: Path) -> None:
    cfg = tmp_path / "r.toml"
    cfg.write_text('[[llm.providers]]\nname = "x"\nbase_url = "http://h/v1"\nmodel = "m"\n'
                   'api_key_env = "sk-live-0123456789"\n')
    with pytest.raises(ConfigError, match=r"llm\.providers\.0\.api_key_env") as info:
        load_settings(cfg, env={})
    assert "sk-live-0123456789" not in str(info.value)


@pytest.mark.parametrize(("mqtt", "message"), [
    ({"ca_file": "/etc/ca.pem"}, "tls = false"),
    ({"tls": True, "cert_file": "/etc/c.pem"}, "go together"),
    ({"password_env": "PW"}, "username is not"),
    ({"port": 0}, "mqtt.port"),
])
def test_incoherent_mqtt_settings_are_refused(mqtt: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env={}, overrides={"mqtt": {"host": "127.0.0.1", **mqtt}})


def test_replica_url_must_be_file_or_s3() -> None:
    with pytest.raises(ConfigError, match="replica"):
        load_settings(env={"REVERIE_REPLICA__URL": "ftp://x/y"})
    assert load_settings(env={"REVERIE_REPLICA__URL": "s3://bucket/p"}).replica.enabled


def test_http_tokens_bind_a_known_person_on_a_foreground_channel() -> None:
    """``[http.tokens.NAME]``: a person of the household (any case) on a
    foreground channel; anything else is refused naming the token."""
    people = {"household": {"people": ["Ana", "Rui"]}}
    s = load_settings(env={}, overrides={**people, "http": {"tokens": {
        "ana-tablet": {"person": "ana"}, "hall": {"channel": "voice"}}}})
    assert s.http.tokens["ana-tablet"].person == "ana"
    assert s.http.tokens["ana-tablet"].channel == "chat"
    assert s.http.tokens["hall"].person is None
    for tokens, says in (({"x": {"person": "Zed"}}, r"http\.tokens\.x\.person"),
                         ({"x": {"channel": "dmn"}}, r"http\.tokens\.x\.channel"),
                         ({"x": {"channel": "nowhere"}}, r"http\.tokens\.x\.channel"),
                         ({"../x": {}}, "names a file")):
        with pytest.raises(ConfigError, match=says):
            load_settings(env={}, overrides={**people, "http": {"tokens": tokens}})
