"""The Home Assistant add-on folder (configs/home-assistant-addon/): config.yaml
against the rules of the Supervisor's add-on schema, the options against their
own schema, and run.py's mapping of the options to ``REVERIE_*`` (read back by
:func:`runtime.config.load_settings`, the code the runtime reads them with).

The rules below are written here in our own words from the Supervisor's public
source, home-assistant/supervisor at commit
090ef31ec024952c2469ed5a7c9f3ce8c1a5499e (2026-08-21): ``_SCHEMA_APP_CONFIG``
in supervisor/apps/validate.py (the add-on schema; "addons" was renamed "apps"
there), ``RE_SCHEMA_ELEMENT`` in supervisor/apps/options.py (the option types),
``docker_ports`` and ``network_port`` in supervisor/validate.py, ``RE_SLUG`` and
``MappingType`` in supervisor/apps/const.py, ``AppStartup``, ``AppBootConfig``
and ``ARCH_ALL`` in supervisor/const.py. None of its code is used or copied.

What this checks: the required keys and their types, the allowed values of
``arch``, ``startup`` and ``boot``, ``timeout``'s range, the port keys and
numbers, ``map``'s folder names, every option type against the element grammar
(types, ranges, ``list(a|b)``, ``?``, nested lists and dicts), and each default
in ``options`` against its type. What it does not: it does not run voluptuous
or the Supervisor; ``version`` is only required to be a string (the Supervisor
parses it with AwesomeVersion); ``url`` options are only checked for a scheme
and a host; keys this file does not use are refused here rather than checked
(the Supervisor drops unknown keys silently); the migrations and warnings the
Supervisor applies before validating (old ``startup`` names, string ``devices``)
are not modelled; and nothing here builds the image or starts the add-on.
"""

from __future__ import annotations

import importlib.util
import re
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from runtime.config import load_settings

ADDON = Path(__file__).resolve().parent.parent / "configs" / "home-assistant-addon"

# --- the add-on schema's rules, in our words (see the module's docstring) ---
SLUG = re.compile(r"[-_.A-Za-z0-9]+")
ARCHES = {"aarch64", "amd64"}  # ARCH_ALL; armhf, armv7 and i386 are deprecated there
STARTUPS = {"initialize", "system", "services", "application", "once"}
BOOTS = {"auto", "manual", "manual_only"}
PORT_KEY = re.compile(r"\d+(?:/tcp|/udp)?")
FOLDERS = {"data", "config", "ssl", "local_apps", "addons", "backup", "share", "media",
           "homeassistant_config", "all_app_configs", "all_addon_configs", "app_config",
           "addon_config"}
FOLDER_ENTRY = re.compile(r"(?P<type>[a-z_]+)(?::(?:rw|ro))?")
# An option's type: one name, an optional (min,max), an optional trailing '?'.
ELEMENT = re.compile(
    r"(?:bool|email|url|port"
    r"|device(?:\(subsystem=[a-z]+\))?"
    r"|(?:str|password)(?:\((?P<smin>\d+)?,(?P<smax>\d+)?\))?"
    r"|int(?:\((?P<imin>-?\d+)?,(?P<imax>-?\d+)?\))?"
    r"|float(?:\((?P<fmin>-?\d*\.?\d+)?,(?P<fmax>-?\d*\.?\d+)?\))?"
    r"|match\((?P<match>.*)\)"
    r"|list\((?P<choices>.+)\))\??")
REQUIRED = {"name": str, "version": str, "slug": str, "description": str, "arch": list}
BOOLEANS = {"init", "advanced", "ingress", "host_network", "apparmor", "hassio_api",
            "homeassistant_api", "auth_api", "stdin", "journald"}
CHECKED = set(REQUIRED) | BOOLEANS | {"startup", "boot", "timeout", "ports",
                                      "ports_description", "map", "options", "schema", "url"}


def addon_config_errors(config: Any) -> list[str]:
    """What in ``config`` (a parsed config.yaml) breaks the rules above; [] if nothing."""
    if not isinstance(config, dict):
        return ["the file is not a mapping"]
    errors = []
    for key, kind in REQUIRED.items():
        if not isinstance(config.get(key), kind):
            errors.append(f"{key}: required, a {kind.__name__}")
    if isinstance(config.get("slug"), str) and not SLUG.fullmatch(config["slug"]):
        errors.append("slug: letters, digits, '-', '_' and '.' only")
    if isinstance(config.get("arch"), list) and (
            not config["arch"] or not set(config["arch"]) <= ARCHES):
        errors.append(f"arch: one or more of {sorted(ARCHES)}")
    if config.get("startup", "application") not in STARTUPS:
        errors.append(f"startup: one of {sorted(STARTUPS)}")
    if config.get("boot", "auto") not in BOOTS:
        errors.append(f"boot: one of {sorted(BOOTS)}")
    for key in BOOLEANS & set(config):
        if not isinstance(config[key], bool):
            errors.append(f"{key}: a boolean")
    timeout = config.get("timeout", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 10 <= timeout <= 300:
        errors.append("timeout: an integer from 10 to 300")
    ports = config.get("ports", {})
    if not isinstance(ports, dict):
        errors.append("ports: a mapping")
    else:
        for key, port in ports.items():
            if not isinstance(key, str) or not PORT_KEY.fullmatch(key):
                errors.append(f"ports: {key!r} is not '<number>/tcp' or '<number>/udp'")
            if port is not None and not (isinstance(port, int) and 1 <= port <= 65535):
                errors.append(f"ports: {key}: a port number or null")
    described = config.get("ports_description", {})
    if not isinstance(described, dict) or not all(
            isinstance(k, str) and PORT_KEY.fullmatch(k) and isinstance(v, str)
            for k, v in described.items()):
        errors.append("ports_description: '<number>/tcp' -> text")
    for entry in config.get("map", []):
        folder = (entry.get("type") if isinstance(entry, dict) else
                  m["type"] if isinstance(entry, str) and (m := FOLDER_ENTRY.fullmatch(entry))
                  else None)
        if folder not in FOLDERS:
            errors.append(f"map: {entry!r} names no folder the Supervisor maps")
    if not isinstance(config.get("options", {}), dict):
        errors.append("options: a mapping")
    schema = config.get("schema", {})
    if schema is not False:
        if not isinstance(schema, dict):
            errors.append("schema: a mapping (or false)")
        else:
            errors += [f"schema: {e}" for e in _schema_errors(schema, "")]
    if "url" in config and not re.match(r"https?://[^/\s]+", str(config["url"])):
        errors.append("url: an http(s) URL")
    errors += [f"{key}: not a key this test checks" for key in sorted(set(config) - CHECKED)]
    return errors


def _schema_errors(schema: dict[str, Any], where: str) -> list[str]:
    errors = []
    for key, element in schema.items():
        name = f"{where}{key}"
        if isinstance(element, dict):
            errors += _schema_errors(element, f"{name}.")
        elif isinstance(element, list):  # one element: a type or a dict, not a list
            if len(element) != 1 or isinstance(element[0], list):
                errors.append(f"{name}: a list holds exactly one type")
            elif isinstance(element[0], dict):
                errors += _schema_errors(element[0], f"{name}[].")
            elif not (isinstance(element[0], str) and ELEMENT.fullmatch(element[0])):
                errors.append(f"{name}: unknown type {element[0]!r}")
        elif not (isinstance(element, str) and ELEMENT.fullmatch(element)):
            errors.append(f"{name}: unknown type {element!r}")
    return errors


def option_errors(value: Any, element: Any, name: str) -> list[str]:
    """Does the default ``value`` fit its schema ``element``? (the Supervisor checks
    the user's options the same way before it starts the add-on)"""
    if isinstance(element, list):
        if not isinstance(value, list):
            return [f"{name}: a list"]
        return [e for item in value for e in option_errors(item, element[0], name)]
    if isinstance(element, dict):
        if not isinstance(value, dict):
            return [f"{name}: a mapping"]
        return [e for k, v in value.items()
                for e in option_errors(v, element.get(k), f"{name}.{k}")]
    m = ELEMENT.fullmatch(str(element))
    if m is None:
        return [f"{name}: not in the schema"]
    kind = str(element).rstrip("?")
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "port":
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    elif kind.startswith("list("):
        ok = str(value) in m["choices"].split("|")
    elif kind == "url":
        ok = isinstance(value, str) and re.match(r"[a-z][a-z0-9+.-]*://[^/\s]+", value) is not None
    elif kind.startswith("int"):
        ok = isinstance(value, int) and not isinstance(value, bool) and (
            m["imin"] is None or value >= int(m["imin"])) and (
            m["imax"] is None or value <= int(m["imax"]))
    elif kind.startswith(("str", "password")):
        ok = isinstance(value, str) and (m["smin"] is None or len(value) >= int(m["smin"]))
    else:
        ok = value is not None
    return [] if ok else [f"{name}: {value!r} is not a {element}"]


# --- the add-on's own files ------------------------------------------------------

@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reverie_addon_run", ADDON / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_yaml_follows_the_supervisor_schema(config: dict[str, Any]) -> None:
    assert addon_config_errors(config) == []
    for option, value in config["options"].items():
        assert option in config["schema"], option
        assert option_errors(value, config["schema"][option], option) == []


def test_the_checker_refuses_what_the_supervisor_refuses(config: dict[str, Any]) -> None:
    """The checks can fail: each broken copy is refused for the reason planted."""
    def broken(**changes: Any) -> list[str]:
        return addon_config_errors({**config, **changes})

    assert broken(slug="my reverie") == ["slug: letters, digits, '-', '_' and '.' only"]
    assert broken(arch=["armv7"]) and broken(arch=[])
    assert broken(startup="after") and broken(boot="sometimes")
    assert broken(timeout=600) and broken(timeout="180")
    assert broken(ports={"8765": 70000}) and broken(ports={"http": 8765})
    assert broken(map=["homeassistant"]) and broken(init="yes")
    assert broken(schema={"x": "string"}) and broken(schema={"x": [["str"]]})
    assert broken(privileged=["NET_ADMIN"])  # a key not checked here is not let through
    missing = dict(config)
    del missing["description"]
    assert addon_config_errors(missing) == ["description: required, a str"]
    assert option_errors("TRACE", "list(DEBUG|INFO|WARNING|ERROR)", "log_level")
    assert option_errors(0, "port?", "mqtt_port") and option_errors("x", "bool", "wyoming")


def test_ports_are_the_services_ports(config: dict[str, Any], run_py: ModuleType) -> None:
    assert config["ports"] == {f"{run_py.HTTP_PORT}/tcp": 8765,
                               f"{run_py.WYOMING_PORT}/tcp": 10700}
    assert set(config["ports_description"]) == set(config["ports"])
    assert config["timeout"] >= 130  # the supervisor's stop takes up to ~130 s


def test_every_option_is_mapped(config: dict[str, Any], run_py: ModuleType) -> None:
    handled = set(run_py.PLAIN) | {"http_token", "mqtt_password", "wyoming",
                                   "wyoming_allowed_peers"}
    assert set(config["schema"]) == handled


def test_options_become_the_settings_the_runtime_reads(
        tmp_path: Path, config: dict[str, Any], run_py: ModuleType) -> None:
    data, conf = tmp_path / "data", tmp_path / "config"
    conf.mkdir()
    token = "t" * 40
    assert config["options"]["wyoming"] is False  # no authentication: off until chosen
    options = {**config["options"], "http_token": token, "wyoming": True,
               "llm_base_url": "http://192.168.1.5:11434/v1", "llm_model": "llama3.2",
               "llm_api_key": "sk-secret", "timezone": "Europe/Lisbon",
               "mqtt_host": "core-mosquitto", "mqtt_port": 1884,
               "mqtt_username": "reverie", "mqtt_password": "pw"}
    env = run_py.prepare(options, data, conf)
    assert all(token not in value for value in env.values())  # the token stays in its file
    settings = load_settings(env=env)
    assert settings.store.resolved_dir == data / "reverie"
    assert (settings.http.host, settings.http.port) == ("0.0.0.0", 8765)
    assert settings.wyoming.enabled
    assert (settings.wyoming.host, settings.wyoming.port) == ("0.0.0.0", 10700)
    assert settings.wyoming.allowed_peers == ["172.30.32.0/23"]
    assert settings.household.timezone == "Europe/Lisbon"
    assert settings.log_level == "INFO"
    assert (settings.mqtt.host, settings.mqtt.port, settings.mqtt.username) == (
        "core-mosquitto", 1884, "reverie")
    assert env[settings.mqtt.password_env or ""] == "pw"
    assert settings.persona.global_dir == conf
    provider = settings.llm.providers[0]
    assert (provider.base_url, provider.model) == ("http://192.168.1.5:11434/v1", "llama3.2")
    assert env["REVERIE_LLM_API_KEY"] == "sk-secret"
    token_file = data / "reverie" / "http-token"
    assert token_file.read_text() == token + "\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "reverie").stat().st_mode) == 0o700

    # Wyoming off: not enabled, nothing listens for it
    off = load_settings(env=run_py.prepare({**options, "wyoming": False}, data, conf))
    assert not off.wyoming.enabled

    # the user's own reverie.toml in the add-on folder is the configuration then
    (conf / "reverie.toml").write_text("[recall]\nmax_items = 7\n")
    mine = load_settings(env=run_py.prepare(options, data, conf))
    assert mine.recall.max_items == 7
    assert mine.wyoming.allowed_peers == []


@pytest.mark.parametrize("bad", [
    {"http_token": "short"},
    {"http_token": None},
    {"http_token": "x" * 20 + " " + "y" * 20},
    {"wyoming_allowed_peers": ["kitchen"]},
])
def test_a_bad_option_stops_the_start_and_says_which(
        tmp_path: Path, config: dict[str, Any], run_py: ModuleType, bad: dict[str, Any]) -> None:
    options = {**config["options"], "http_token": "t" * 40, **bad}
    with pytest.raises(run_py.OptionError) as err:
        run_py.prepare(options, tmp_path / "data", tmp_path / "config")
    assert str(err.value).split(":")[0] == next(iter(bad))
    assert "kitchen" in str(err.value) or "x" * 20 not in str(err.value)  # no token in it


def test_dockerfile_builds_what_run_py_needs() -> None:
    dockerfile = (ADDON / "Dockerfile").read_text(encoding="utf-8")
    lines = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("FROM ") and "alpine" not in lines[0]  # Ray needs glibc
    assert "COPY run.py /run.py" in lines
    assert lines[-1] == 'CMD ["python", "/run.py"]'
    model = (ADDON.parent.parent / "tools" / "model-package.txt").read_text().split()[-1]
    assert model in dockerfile  # the same weights the Makefile installs
