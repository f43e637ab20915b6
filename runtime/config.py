"""Typed settings for Reverie.

Settings are read once, at the edge (the command line, a benchmark, a test),
from a TOML file plus environment overrides, and handed to services as plain
values. The default file is ``configs/reverie.toml``: one SQLite file under a
data directory, no network services.

Environment overrides use ``REVERIE_<SECTION>__<FIELD>`` (for example
``REVERIE_RECALL__MAX_ITEMS=10``). ``REVERIE_DATA_DIR`` chooses the data
directory. Any broken file or value raises :class:`ConfigError` naming the
field at fault.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "reverie.toml"
ENV_PREFIX = "REVERIE_"


class ConfigError(ValueError):
    """A configuration file or value is unusable; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSettings(_Section):
    data_dir: Path = Field(default=Path("~/.local/share/reverie"))
    file: str = "reverie.db"
    busy_timeout_ms: int = Field(default=5000, ge=0)

    @property
    def resolved_dir(self) -> Path:
        return self.data_dir.expanduser()

    @property
    def path(self) -> Path:
        return self.resolved_dir / self.file


class EmbedderSettings(_Section):
    kind: str = "onnx-minilm"
    batch_size: int = Field(default=32, ge=1, le=1024)
    threads: int = Field(default=0, ge=0, le=64)
    max_length: int = Field(default=256, ge=8, le=512)
    cache_dir: Path | None = None


class RecallSettings(_Section):
    max_items: int = Field(default=20, ge=1, le=200)
    max_tokens: int = Field(default=2000, ge=50)
    candidates: int = Field(default=60, ge=5, le=1000)
    relative_floor: float = Field(default=0.45, ge=0.0, le=1.0)
    min_cosine: float = Field(default=0.30, ge=-1.0, le=1.0)
    weight_relevance: float = Field(default=1.0, ge=0.0)
    weight_recency: float = Field(default=0.05, ge=0.0)
    weight_salience: float = Field(default=0.10, ge=0.0)
    context_turns: int = Field(default=1, ge=0, le=5)
    fallback_items: int = Field(default=20, ge=1, le=200)


class ProviderSettings(_Section):
    """One OpenAI-compatible chat-completions endpoint (Ollama, llama.cpp, vLLM, OpenAI)."""

    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    # The NAME of the environment variable holding the API key; never the key itself.
    api_key_env: str | None = None
    timeout_s: float = Field(default=30.0, gt=0, le=600)


class LLMSettings(_Section):
    providers: list[ProviderSettings] = Field(default_factory=list)
    offline_fallback: bool = True
    max_tokens: int = Field(default=512, ge=1, le=32768)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)


class PersonaSettings(_Section):
    # Global bootstrap files (AGENTS.md, SOUL.md, USER.md, IDENTITY.md, RULES.md);
    # files in the project directory take priority over these.
    global_dir: Path = Path("~/.config/reverie")
    project_dir: Path | None = None


class RuntimeSettings(_Section):
    """The actor runtime: one local Ray node by default."""

    namespace: str = Field(default="reverie", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    num_cpus: int | None = Field(default=None, ge=1)
    object_store_mb: int = Field(default=128, ge=64)
    dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = Field(default=8265, ge=0, le=65535)
    max_restarts: int = Field(default=-1, ge=-1)
    max_pending_calls: int = Field(default=1000, ge=1)
    history_turns: int = Field(default=8, ge=0, le=100)


class ChannelSettings(_Section):
    """A conversation channel. ``seed``: turn-zero recall runs on its user turns;
    ``background``: no user is present (jobs), never seeded."""

    seed: bool = True
    background: bool = False


def _default_channels() -> dict[str, ChannelSettings]:
    return {
        "chat": ChannelSettings(), "voice": ChannelSettings(), "cli": ChannelSettings(),
        "dmn": ChannelSettings(seed=False, background=True),
    }


class MemorySettings(_Section):
    profiles_file: Path = CONFIG_DIR / "profiles.toml"
    fact_kinds_file: Path = CONFIG_DIR / "fact_kinds.toml"


class Settings(_Section):
    store: StoreSettings = StoreSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    recall: RecallSettings = RecallSettings()
    memory: MemorySettings = MemorySettings()
    llm: LLMSettings = LLMSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    channels: dict[str, ChannelSettings] = Field(default_factory=_default_channels)
    persona: PersonaSettings = PersonaSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name in ("profiles_file", "fact_kinds_file"):
            path: Path = getattr(self.memory, name)
            if not path.expanduser().is_file():
                raise ValueError(f"memory.{name}: no such file: {path}")
        return self


def _set_path(tree: dict[str, Any], dotted: list[str], value: str) -> None:
    node = tree
    for part in dotted[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(dotted)}: {part} is not a section")
        node = child
    node[dotted[-1]] = value


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX):]
        if rest == "DATA_DIR":
            _set_path(tree, ["store", "data_dir"], value)
        elif rest == "CONFIG":
            continue
        elif "__" in rest:
            _set_path(tree, [p.lower() for p in rest.split("__")], value)
        elif rest == "LOG_LEVEL":
            tree["log_level"] = value.upper()
    return tree


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _format_error(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"{origin}: {field}: {e['msg']}")
    return "; ".join(lines)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _resolve_relative_files(data: dict[str, Any], base: Path) -> None:
    """Paths to other config files are relative to the file that names them."""
    memory = data.get("memory")
    if not isinstance(memory, dict):
        return
    for name in ("profiles_file", "fact_kinds_file"):
        value = memory.get(name)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            memory[name] = str(base / value)


def load_settings(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Load settings from ``path`` (default: ``$REVERIE_CONFIG`` or the shipped
    file), then the environment, then explicit ``overrides``."""
    env = os.environ if env is None else env
    if path is None:
        path = Path(env["REVERIE_CONFIG"]) if env.get("REVERIE_CONFIG") else DEFAULT_CONFIG
    data = read_toml(path)
    _resolve_relative_files(data, path.parent)
    data = _merge(data, _env_overrides(env))
    if overrides:
        data = _merge(data, overrides)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, str(path))) from None
    log.debug("settings loaded from %s", path)
    return settings
