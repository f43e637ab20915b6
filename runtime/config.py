"""Typed settings for Reverie.

Settings are read once, at the edge (the command line, a benchmark, a test),
and handed to services as plain values. They are layered, each layer over the
one before:

1. the packaged defaults, ``reverie.toml`` of the ``configs`` package shipped
   in the wheel (:data:`CONFIG_DIR`): one SQLite file under a data directory,
   no network services;
2. one configuration file: the path given, else ``$REVERIE_CONFIG``, else the
   user's file (:func:`default_user_config_path`, written by ``reverie init``)
   when it exists. Its sections merge into the defaults: a setting it does not
   name keeps its default;
3. the environment: ``REVERIE_<SECTION>__<FIELD>`` (for example
   ``REVERIE_RECALL__MAX_ITEMS=10``), ``REVERIE_DATA_DIR`` (the data
   directory), and one language-model provider from ``REVERIE_LLM_*``
   (:func:`env_provider`), put before the configured ones;
4. explicit ``overrides`` from the caller.

Any broken file or value raises :class:`ConfigError` naming the field (or the
environment variable) at fault.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runtime.time.clock import household_zone

log = logging.getLogger(__name__)

PACKAGED_FILES = ("reverie.toml", "profiles.toml", "fact_kinds.toml", "topics.toml")


def _packaged_config_dir() -> Path:
    """The directory of the ``configs`` package, found through the import system
    (so from the installed wheel, wherever it lives).

    A source checkout whose editable install predates ``configs`` being a
    package does not map it; there, the ``configs`` directory beside ``runtime``
    is used. A zipped install (no real directory) is refused."""
    try:
        found = resources.files("configs").joinpath(PACKAGED_FILES[0])
    except ModuleNotFoundError:
        found = None
    candidates = [found.parent] if isinstance(found, Path) else []
    candidates.append(Path(__file__).resolve().parent.parent / "configs")
    for directory in candidates:
        if all((directory / name).is_file() for name in PACKAGED_FILES):
            return directory
    raise ImportError("reverie's packaged configuration (the 'configs' package: "
                      f"{', '.join(PACKAGED_FILES)}) is missing or not a directory on disk; "
                      "reinstall reverie")


#: The packaged default configuration files (``reverie.toml``, ``profiles.toml``,
#: ``fact_kinds.toml``), from the installed ``configs`` package.
CONFIG_DIR = _packaged_config_dir()
DEFAULT_CONFIG = CONFIG_DIR / "reverie.toml"
ENV_PREFIX = "REVERIE_"
# A language-model provider from the environment (see env_provider).
LLM_ENV = {
    "base_url": "REVERIE_LLM_BASE_URL",
    "model": "REVERIE_LLM_MODEL",
    "api_key_env": "REVERIE_LLM_API_KEY_ENV",
    "name": "REVERIE_LLM_NAME",
    "timeout_s": "REVERIE_LLM_TIMEOUT_S",
}
# Used as api_key_env when REVERIE_LLM_API_KEY_ENV is unset and this is set.
LLM_KEY_VAR = "REVERIE_LLM_API_KEY"
ENV_VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A household's id (issue 26, many households on one cluster): its store's
# directory is named by it and by nothing else (runtime.store.households).
HOUSEHOLD_ID = r"^[a-z0-9][a-z0-9-]{0,62}$"
# The hub's own household: the configured store, and every message's household
# unless it names another.
HUB_HOUSEHOLD = "home"


class ConfigError(ValueError):
    """A configuration file or value is unusable; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSettings(_Section):
    data_dir: Path = Field(default=Path("~/.local/share/reverie"))
    file: str = "reverie.db"
    busy_timeout_ms: int = Field(default=5000, ge=0)
    # FULL: a commit is on disk when it returns (survives a power cut); NORMAL: it
    # survives a crash, but the last commits can be lost when the power goes.
    synchronous: Literal["FULL", "NORMAL"] = "FULL"

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
    # weight of a candidate's normalised keyword score beside its cosine similarity
    # in relevance (runtime.recall.hybrid)
    lexical_weight: float = Field(default=0.5, ge=0.0, le=5.0)
    weight_relevance: float = Field(default=1.0, ge=0.0)
    weight_recency: float = Field(default=0.05, ge=0.0)
    weight_salience: float = Field(default=0.10, ge=0.0)
    # an open thread's episode ranks higher until resolved (hot: all of it;
    # simmering: half); mood-congruent episodes rise a little (runtime.memories.mood)
    weight_thread: float = Field(default=0.10, ge=0.0, le=1.0)
    weight_mood: float = Field(default=0.05, ge=0.0, le=1.0)
    context_turns: int = Field(default=2, ge=0, le=5)
    # share of the best neighbouring turn's keyword score (above its own) a turn
    # borrows, within context_turns (runtime.recall.hybrid; 0: none). This and the next
    # three: chosen leave-one-conversation-out on LoCoMo (docs/benchmarks.md)
    neighbour_keywords: float = Field(default=0.3, ge=0.0, le=2.0)
    # added to a turn's relevance when the query names its speaker
    speaker_bonus: float = Field(default=0.1, ge=0.0, le=1.0)
    # multiplies temporal recall's bonuses (runtime.recall.temporal.bonus)
    weight_temporal: float = Field(default=2.0, ge=0.0, le=5.0)
    # pseudo-relevance feedback: weight of a second keyword search for the words
    # the best keyword hits share (runtime.recall.hybrid; 0: none)
    keyword_feedback: float = Field(default=0.3, ge=0.0, le=1.0)
    # a query that knows the conversation (issue 25; runtime.recall.hybrid): the
    # recent turns of the conversation a query is part of (the turns the caller
    # excludes: the prompt's history) join it, this weight beside the message's
    # 1 in the query vector and in the keyword search (0: the message alone)
    context_query: float = Field(default=0.0, ge=0.0, le=1.0)
    # at most this many of those turns, said at most context_window_s before the query
    context_query_turns: int = Field(default=4, ge=0, le=20)
    context_window_s: float = Field(default=1800.0, ge=0.0)
    # the earlier conversation the present one continues (issue 25;
    # runtime.recall.continuation): the best turn near the whole conversation's
    # vector (its turns' and the message's, averaged) from a conversation not yet
    # represented is taken right after the best item; this many such (0: none)
    continuation_slots: int = Field(default=0, ge=0, le=10)
    # a turn longer than this many tokens (about 4 characters each) is injected
    # as an excerpt of that length: the stretch that holds most of the query's
    # words, cited by the turn's ref (runtime.recall.excerpt; 0: whole turns)
    excerpt_tokens: int = Field(default=0, ge=0)
    # a budget that covers the ground: once an item from a conversation is in,
    # another from the same one (same channel, within diversity_gap_s) scores
    # this share of the best score less (runtime.recall.hybrid; 0: none)
    diversity: float = Field(default=0.0, ge=0.0, le=1.0)
    diversity_gap_s: float = Field(default=1800.0, ge=0.0)
    # the best this many items are taken as they rank before the term applies
    diversity_after: int = Field(default=0, ge=0, le=200)
    # ... and by similarity (MMR): a candidate scores this share of the best
    # score times its highest cosine to an item already chosen less (0: none)
    diversity_similarity: float = Field(default=0.0, ge=0.0, le=2.0)
    # long turns as passages (issue 25; runtime.recall.passages): a turn longer
    # than passage_tokens (about 4 characters each) is also indexed as passages of
    # that length, overlapping by up to passage_overlap, for vectors and keywords;
    # recall scores them, cites the turn and injects its best passage
    passages: bool = False
    passage_tokens: int = Field(default=200, ge=20, le=2000)
    passage_overlap: int = Field(default=50, ge=0, le=1000)
    # a store of long turns (issue 25; runtime.recall.policy): when at least this
    # share of the store's last long_store_window recallable turns are longer than
    # long_turn_tokens (about 4 characters each; MiniLM reads 256 word pieces),
    # recall uses the [recall] values in long_store in place of the ones above
    # (0: never). A property of the store, read at query time, not of a data set.
    # Values chosen by leave-one-out over LoCoMo and RealMem (docs/benchmarks.md)
    long_store_share: float = Field(default=0.1, ge=0.0, le=1.0)
    long_turn_tokens: int = Field(default=256, ge=1)
    long_store_window: int = Field(default=500, ge=1, le=100_000)
    long_store: dict[str, float | int | bool] = Field(default_factory=lambda: {
        "excerpt_tokens": 100, "diversity": 0.5, "diversity_similarity": 0.5,
        "relative_floor": 0.3, "lexical_weight": 0.75, "continuation_slots": 2})
    # multiply an episode's / a fact's final score (a turn's stays as it is), so
    # that the layers take part in recall with their own weights (issue 7; both
    # chosen leave-one-conversation-out on LoCoMo with --subconscious)
    weight_episodes: float = Field(default=0.6, ge=0.0, le=2.0)
    weight_facts: float = Field(default=0.6, ge=0.0, le=2.0)
    fallback_items: int = Field(default=20, ge=1, le=200)
    # at most this many seared memories in one recall (clanka: "a couple")
    max_seared: int = Field(default=2, ge=0, le=20)
    # temporal recall (runtime.recall.temporal): a time the query names ranks its memories first
    temporal: bool = True

    @field_validator("long_store")
    @classmethod
    def _long_store_keys(cls, value: dict[str, float | int | bool]) -> dict[str, Any]:
        """[recall] keys, each checked as [recall] checks it. Not the switch's own
        keys, nor how turns are cut (the store is cut once, at writing)."""
        fixed = {"long_store", "long_store_share", "long_turn_tokens", "long_store_window",
                 "passage_tokens", "passage_overlap"}
        bad = sorted(set(value) - (set(cls.model_fields) - fixed))
        if bad:
            raise ValueError(f"not a [recall] key long_store may set: {', '.join(bad)}")
        checked = cls.model_validate(value)
        return {key: getattr(checked, key) for key in value}


class ProviderSettings(_Section):
    """One OpenAI-compatible chat-completions endpoint (Ollama, llama.cpp, vLLM, OpenAI)."""

    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    # The NAME of the environment variable holding the API key; never the key itself.
    api_key_env: str | None = Field(default=None, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    # A CA bundle for an https endpoint whose certificate the system does not
    # trust (a server on the LAN with its own CA); the system's CAs otherwise.
    ca_file: Path | None = None
    # The model reads images: a client's images (the memory layer) are sent to
    # it; otherwise they are left out, with a log line.
    vision: bool = False

    @model_validator(mode="after")
    def _https_for_ca(self) -> ProviderSettings:
        if self.ca_file is not None and not self.base_url.startswith("https://"):
            raise ValueError("ca_file is set but base_url is not https://")
        return self


class LLMSettings(_Section):
    providers: list[ProviderSettings] = Field(default_factory=list)
    offline_fallback: bool = True
    max_tokens: int = Field(default=512, ge=1, le=32768)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)


class HouseholdSettings(_Section):
    """The household: its time zone names the prompt's clock and memory dates."""

    # An IANA zone name ("Europe/Lisbon"); empty: the system's zone.
    timezone: str = ""
    # The household's people, by the names speakers are given (compared
    # case-insensitively): a speaker among them (or among the people
    # ``[mqtt.people]`` maps sensors onto) is known (runtime.memories.privacy).
    people: list[str] = Field(default_factory=list, max_length=100)
    # Which household these settings are (set by runtime.store.households for
    # the households it serves; the hub's own is "home").
    id: str = Field(default=HUB_HOUSEHOLD, pattern=HOUSEHOLD_ID)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        value = value.strip()
        household_zone(value)  # ValueError: unknown time zone
        return value


class HouseholdsSettings(_Section):
    """Many households on one runtime (``runtime/store/households.py``): off,
    the hub serves its one household (``home``, the configured store) as before.
    On, the owners also serve every household registered under ``root``
    (``<root>/<id>/``, 0700: its store, its HTTP token, its index), at most
    ``max_open`` of them open at a time per owner actor (least recently used
    closed first)."""

    enabled: bool = False
    root: Path | None = None  # None: <data dir>/households
    max_open: int = Field(default=64, ge=1, le=100_000)


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
    ``background``: no user is present (jobs), never seeded. ``injection``: how
    memory reaches the model, ``push`` (the recalled memories in the prompt) or
    ``pull`` (a stable index, a recall tool and a capped auto-recall:
    ``runtime.recall.pull``); pull needs a seeded foreground channel."""

    seed: bool = True
    background: bool = False
    injection: Literal["push", "pull"] = "push"
    # answers are read aloud: no sensitive memory for an unknown speaker (runtime.memories.privacy)
    spoken: bool = False
    # the memory layer on /v1/chat/completions and /api/chat (actors.http.layer):
    # the client's system prompt, history and tools kept, Reverie's memory added;
    # false: only the last user message is used, the transcript is the history
    passthrough: bool = True

    @model_validator(mode="after")
    def _pull_is_seeded(self) -> ChannelSettings:
        if self.injection == "pull" and (not self.seed or self.background):
            raise ValueError('injection = "pull" needs seed = true and background = false')
        return self


def _default_channels() -> dict[str, ChannelSettings]:
    return {
        "chat": ChannelSettings(), "voice": ChannelSettings(spoken=True), "cli": ChannelSettings(),
        "dmn": ChannelSettings(seed=False, background=True),
    }


JOB_NAME = r"^[a-z][a-z0-9_-]{0,39}$"
JOB_TARGET = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# Every job name of the design (runtime.mind.registry lists the ones that exist yet).
JOB_NAMES = ("consolidate", "facts", "decay", "patterns", "synthesis", "dmn", "sync", "geo",
             "research")


class JobsSettings(_Section):
    """The subconscious: background jobs, checked every ``check_every_s``, fired
    once the household has been idle ``idle_after_s`` (see ``runtime.mind.idle``)."""

    check_every_s: float = Field(default=300.0, gt=0)
    idle_after_s: float = Field(default=1800.0, ge=0)
    budget_s: float = Field(default=600.0, gt=0)  # one run's time budget
    # More jobs, by name: "package.module:function" (a JobFn), run after the
    # built-in ones. A name may not shadow a built-in or a reserved job name.
    extra: dict[str, str] = Field(default_factory=dict)
    # Jobs switched off: neither listed nor run.
    disabled: list[str] = Field(default_factory=list)

    @field_validator("extra")
    @classmethod
    def _valid_extra(cls, value: dict[str, str]) -> dict[str, str]:
        for name, target in value.items():
            if not re.match(JOB_NAME, name):
                raise ValueError(f"{name!r}: a job name is lower-case letters, digits, - or _")
            if name in JOB_NAMES:
                raise ValueError(f"{name!r} is a built-in job name")
            if not re.match(JOB_TARGET, target):
                raise ValueError(f"{name}: {target!r} is not 'package.module:function'")
        return value

    @model_validator(mode="after")
    def _known_disabled(self) -> JobsSettings:
        unknown = [n for n in self.disabled if n not in JOB_NAMES and n not in self.extra]
        if unknown:
            raise ValueError(f"disabled: no job named {', '.join(map(repr, unknown))}")
        return self


ADAPTERS = ("owntracks", "ha_tracker", "ha_person", "ha_binary_sensor", "zigbee2mqtt",
            "espresense")


class MqttTopic(_Section):
    """One subscription of the topic mapping (``configs/topics.toml``)."""

    pattern: str = Field(min_length=1, max_length=200)  # an MQTT filter: + and # allowed
    adapter: Literal["owntracks", "ha_tracker", "ha_person", "ha_binary_sensor",
                     "zigbee2mqtt", "espresense"]
    # Whose it is. Empty: the adapter's own id (the OwnTracks user, the ESPresense
    # id, the Home Assistant entity), renamed through ``people`` below.
    person: str = Field(default="", max_length=80)
    room: str = Field(default="", max_length=80)  # where a fixed sensor is
    # The topic's ids this entry reads (id -> person, "" keeps ``person``);
    # when given, any other id under the pattern is rejected as unknown-topic.
    names: dict[str, str] = Field(default_factory=dict)


class MqttSettings(_Section):
    """The MQTT bridge (``device/``): location and presence in, Home Assistant out.

    No ``host``: the runtime runs without the bridge and says so."""

    host: str = Field(default="", max_length=255)
    port: int = Field(default=1883, ge=1, le=65535)
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None  # client certificate (with key_file)
    key_file: Path | None = None
    username: str | None = None
    # The NAME of the environment variable holding the password, never the password.
    password_env: str | None = Field(default=None, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    client_id: str = Field(default="reverie", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    topic_prefix: str = Field(default="reverie", pattern=r"^[A-Za-z0-9_./-]{1,64}$")
    keepalive_s: int = Field(default=30, ge=5, le=3600)
    reconnect_min_s: float = Field(default=0.5, gt=0, le=60)
    reconnect_max_s: float = Field(default=30.0, gt=0, le=3600)
    max_payload_bytes: int = Field(default=16384, ge=256, le=1_048_576)
    # Fixes and presence older than this, or further ahead, are refused.
    max_age_s: float = Field(default=30 * 86400.0, gt=0)
    max_ahead_s: float = Field(default=600.0, ge=0)
    discovery: bool = True  # Home Assistant MQTT discovery
    discovery_prefix: str = Field(default="homeassistant", pattern=r"^[A-Za-z0-9_./-]{1,64}$")
    topics_file: Path = CONFIG_DIR / "topics.toml"
    # id -> person: the names sensors use, mapped onto the household's people.
    people: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _coherent(self) -> MqttSettings:
        files = [n for n in ("ca_file", "cert_file", "key_file") if getattr(self, n)]
        if files and not self.tls:
            raise ValueError(f"{', '.join(files)} set but tls = false")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file go together")
        if self.password_env and not self.username:
            raise ValueError("password_env is set but username is not")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.host.strip())


class GpsSettings(_Section):
    """A GPS receiver on the hub, read through gpsd. Off unless ``enabled``."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=2947, ge=1, le=65535)
    poll_s: float = Field(default=5.0, gt=0, le=3600)
    person: str = Field(default="hub", min_length=1, max_length=80)  # whose fixes these are
    min_mode: int = Field(default=2, ge=2, le=3)  # 2: a 2D fix is enough; 3: 3D only


class ReplicaSettings(_Section):
    """Litestream replication of the store (``device/replicator.py``). No ``url``: none.

    ``url``: ``file:///path/to/dir`` or ``s3://bucket/path``. For S3 (and
    S3-compatible servers: MinIO, Garage, moto), ``endpoint`` and ``region``,
    and the NAMES of the environment variables holding the credentials (never
    the credentials themselves)."""

    url: str = Field(default="", max_length=1000)
    endpoint: str = Field(default="", max_length=1000)
    region: str = Field(default="", max_length=100)
    access_key_id_env: str = Field(default="AWS_ACCESS_KEY_ID",
                                   pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    secret_access_key_env: str = Field(default="AWS_SECRET_ACCESS_KEY",
                                       pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    force_path_style: bool = True      # S3-compatible servers on a host:port
    sync_interval_s: float = Field(default=1.0, gt=0, le=3600)
    # What the replica keeps (device/replicator.py): a snapshot every
    # snapshot_interval_s, each kept retention_s; forgotten text leaves the
    # replica within retention_s + 2 x snapshot_interval_s (36 h by default).
    snapshot_interval_s: float = Field(default=6 * 3600.0, ge=1, le=7 * 86400)
    retention_s: float = Field(default=24 * 3600.0, ge=1, le=90 * 86400)
    restore_on_boot: bool = True       # a missing database is restored before start
    max_lag_s: float = Field(default=60.0, gt=0)  # `backup verify` tolerates this much
    binary: str = ""                   # the litestream binary; empty: the packaged one

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("file:///", "s3://")):
            raise ValueError("a replica url is file:///absolute/path or s3://bucket/path")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.url)


class MemorySettings(_Section):
    profiles_file: Path = CONFIG_DIR / "profiles.toml"
    fact_kinds_file: Path = CONFIG_DIR / "fact_kinds.toml"
    # a new episode or fact at least this cosine-similar to a live one of its kind
    # is refused as a near-duplicate (runtime.memories.duplicates); above 1: never refused
    duplicate_similarity: float = Field(default=0.92, ge=0.5, le=1.01)


class HttpToken(_Section):
    """A bearer token bound to an audience (``[http.tokens.<name>]``; the token
    itself is in ``<data dir>/http-tokens/<name>``, written on first run): what
    a caller with it is told follows the privacy rules for ``person`` (one of
    the household's people; none: the household as a whole) on ``channel``
    (``actors/http/audience.py``)."""

    person: str | None = Field(default=None, min_length=1, max_length=200)
    channel: str = Field(default="chat", min_length=1, max_length=200)


class HttpSettings(_Section):
    """The HTTP server (``actors/http/server.py``): REST, OpenAI-compatible chat, OpenAPI.

    Loopback by default; every request needs the bearer token kept in
    ``<data dir>/http-token`` (generated on first run, 0600)."""

    enabled: bool = True
    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: int = Field(default=8765, ge=0, le=65535)  # 0: a free port
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)
    # alias -> upstream model name, for the OpenAI-compatible `model` field
    models: dict[str, str] = Field(default_factory=dict)
    # OAuth for /mcp (actors/http/oauth.py): how long an access / refresh token lives
    mcp_access_token_seconds: int = Field(default=3600, ge=60, le=86400)
    mcp_refresh_token_seconds: int = Field(default=30 * 86400, ge=3600, le=365 * 86400)
    # name -> the audience its token is bound to (the admin token sees everything)
    tokens: dict[str, HttpToken] = Field(default_factory=dict, max_length=100)

    @field_validator("tokens")
    @classmethod
    def _token_names(cls, value: dict[str, HttpToken]) -> dict[str, HttpToken]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):
                raise ValueError(f"{name[:80]!r}: a token's name is letters, digits, - and _"
                                 " (at most 64), as it names a file")
        return value


class WyomingSatellite(_Section):
    """One satellite or device of ``[wyoming.satellites]``: where it is and, where
    known, who speaks to it (the turn's speaker, so the privacy tier's rules apply)."""

    room: str = Field(default="", max_length=80)
    person: str | None = Field(default=None, min_length=1, max_length=200)


class WyomingSettings(_Section):
    """The Wyoming handle service (``actors/http/wyoming.py``, in the HTTP actor).

    Off by default. Wyoming has no authentication: a host outside loopback needs
    ``allowed_peers`` (addresses or networks), or the service refuses to start."""

    enabled: bool = False
    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: int = Field(default=10800, ge=0, le=65535)  # 0: a free port
    # The peers (IP addresses or networks, "192.168.1.20", "192.168.1.0/24") that
    # may connect; any other is closed at once. Empty: loopback peers only.
    allowed_peers: list[str] = Field(default_factory=list)
    languages: list[str] = Field(default_factory=lambda: ["en"])  # [] : any language
    # Announce the service over mDNS (_wyoming._tcp) so Home Assistant discovers it;
    # only for a host outside loopback (a loopback address helps no other machine).
    zeroconf: bool = False
    # satellite_id or device_id (from the transcript's context) -> room and person
    satellites: dict[str, WyomingSatellite] = Field(default_factory=dict)

    @field_validator("allowed_peers")
    @classmethod
    def _peers(cls, value: list[str]) -> list[str]:
        import ipaddress

        for peer in value:
            try:
                ipaddress.ip_network(peer, strict=False)
            except ValueError:
                raise ValueError(f"{peer!r} is not an IP address or network") from None
        return value


SYNC_KINDS = ("caldav", "ical", "imap", "carddav")
_SYNC_SCHEMES = {"caldav": ("http", "https"), "carddav": ("http", "https"),
                 "ical": ("http", "https", "webcal"), "imap": ("imap", "imaps")}


class ConnectorSettings(_Section):
    """One capability-sync connector (``[[sync.connectors]]``, ``runtime.mind.sync``).

    Its items become memories of source ``sync:<name>``. The password is never
    in the file: ``password_env`` names the environment variable holding it."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,39}$")
    kind: Literal["caldav", "ical", "imap", "carddav"]
    url: str = Field(min_length=1, max_length=2000)
    username: str | None = Field(default=None, min_length=1, max_length=320)
    # The NAME of the environment variable holding the password, never the password.
    password_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # imap: the folders read (default: INBOX only); nothing else is ever opened.
    folders: list[str] | None = None
    # caldav/carddav: the calendars or address books read, by display name or
    # the last part of their URL (empty: all of them).
    collections: list[str] = Field(default_factory=list)
    max_excerpt_chars: int = Field(default=500, ge=0, le=3000)  # mail text, event notes
    max_item_bytes: int = Field(default=1_048_576, ge=4096, le=64 * 1_048_576)
    max_download_bytes: int = Field(default=16 * 1_048_576, ge=65536, le=512 * 1_048_576)
    timeout_s: float = Field(default=20.0, gt=0, le=300)
    ca_file: Path | None = None  # a CA bundle for a server with its own certificate
    # Send the password in clear (http://, or imap:// without STARTTLS) to a host
    # that is not loopback. Off: such a connector is refused before it connects.
    allow_plaintext: bool = False
    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _no_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError("password: never put the secret in the file; name the "
                             "environment variable that holds it in password_env")
        return data

    @field_validator("folders")
    @classmethod
    def _folder_names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or any(not f.strip() for f in value)):
            raise ValueError("folders: name at least one folder, none empty")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> ConnectorSettings:
        parts = urlsplit(self.url)
        if parts.scheme not in _SYNC_SCHEMES[self.kind]:
            raise ValueError(f"url: {self.kind} urls start with "
                             f"{' or '.join(s + '://' for s in _SYNC_SCHEMES[self.kind])}")
        if not parts.hostname:
            raise ValueError("url: no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("url: no credentials in the url; use username and password_env")
        if self.folders is not None and self.kind != "imap":
            raise ValueError(f"folders: only for imap, not {self.kind}")
        if self.collections and self.kind not in ("caldav", "carddav"):
            raise ValueError(f"collections: only for caldav and carddav, not {self.kind}")
        if self.password_env and not self.username:
            raise ValueError("password_env is set but username is not")
        if self.kind == "imap" and not (self.username and self.password_env):
            raise ValueError("imap needs username and password_env")
        return self


class SyncSettings(_Section):
    """Capability sync (the ``sync`` job): calendars, mail and contacts."""

    # Calendar events are expanded (recurrences too) within this window around now.
    calendar_days_back: int = Field(default=30, ge=0, le=3650)
    calendar_days_ahead: int = Field(default=90, ge=1, le=3650)
    connectors: list[ConnectorSettings] = Field(default_factory=list)

    @field_validator("connectors")
    @classmethod
    def _unique_names(cls, value: list[ConnectorSettings]) -> list[ConnectorSettings]:
        names = [c.name for c in value]
        doubles = sorted({n for n in names if names.count(n) > 1})
        if doubles:
            raise ValueError(f"connector names must be unique: {', '.join(doubles)}")
        return value


class ResearchSettings(_Section):
    """Proactive research (the ``research`` job, ``runtime.mind.research``): RSS and
    Atom feeds scored against the household's interests; the relevant items
    become ``discovery`` facts of source ``research``."""

    feeds: list[str] = Field(default_factory=list, max_length=100)  # http(s) URLs
    # The job runs at most this often, whatever the Cron gate allows (6 h).
    every_s: float = Field(default=21600.0, ge=60.0, le=30 * 86400.0)
    max_items_per_feed: int = Field(default=30, ge=1, le=500)
    max_new_per_run: int = Field(default=5, ge=1, le=100)  # discoveries written per run
    # weight x cosine to the closest interest an item needs (see runtime.mind.research)
    threshold: float = Field(default=0.25, ge=-1.0, le=1.0)
    timeout_s: float = Field(default=15.0, gt=0, le=120)  # each request
    max_feed_bytes: int = Field(default=2_097_152, ge=4096, le=64 * 1_048_576)
    max_item_chars: int = Field(default=1000, ge=50, le=20_000)  # item text scored
    excerpt_chars: int = Field(default=280, ge=0, le=2000)  # item text stored

    @field_validator("feeds")
    @classmethod
    def _feed_urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in (u.strip() for u in value):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url[:100]!r}: a feed is an http:// or https:// URL")
            if parts.username is not None or parts.password is not None:
                raise ValueError(f"{parts.hostname}: no credentials in a feed URL")
            if len(url) > 2000:
                raise ValueError(f"{parts.hostname}: a feed URL is at most 2000 characters")
            if url in out:
                raise ValueError(f"{parts.hostname}: the same feed is listed twice")
            out.append(url)
        return out


class ThreadSettings(_Section):
    """Open threads (``runtime.memories.threads``): when one left open is escalated, and
    how close a closing sentence must be to resolve one offline."""

    escalate_after_days: float = Field(default=3.0, gt=0, le=3650)
    resolve_similarity: float = Field(default=0.45, ge=-1.0, le=1.0)  # cosine


class ClusterSettings(_Section):
    """Hub plus helper nodes (``reverie run --cluster``, ``reverie join``): off unless
    ``reverie run --cluster`` asks for it. The household's certificates and Ray token
    live in ``dir`` (default ``<data dir>/cluster``, owner-only; made by
    ``reverie cluster init``). Helpers offer ``job_slots`` of the custom Ray
    resource ``job_resource``; job actors ask for one when a node offers it."""

    dir: Path | None = None
    node_ip: str = ""  # the routable address this node binds ("": the machine's own)
    port: int = Field(default=6379, ge=1, le=65535)  # the head's GCS port
    job_resource: str = Field(default="reverie_jobs", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
    job_slots: int = Field(default=2, ge=1, le=64)


class Settings(_Section):
    store: StoreSettings = StoreSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    recall: RecallSettings = RecallSettings()
    memory: MemorySettings = MemorySettings()
    llm: LLMSettings = LLMSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    channels: dict[str, ChannelSettings] = Field(default_factory=_default_channels)
    persona: PersonaSettings = PersonaSettings()
    household: HouseholdSettings = HouseholdSettings()
    households: HouseholdsSettings = HouseholdsSettings()
    jobs: JobsSettings = JobsSettings()
    mqtt: MqttSettings = MqttSettings()
    gps: GpsSettings = GpsSettings()
    replica: ReplicaSettings = ReplicaSettings()
    http: HttpSettings = HttpSettings()
    wyoming: WyomingSettings = WyomingSettings()
    sync: SyncSettings = SyncSettings()
    research: ResearchSettings = ResearchSettings()
    threads: ThreadSettings = ThreadSettings()
    cluster: ClusterSettings = ClusterSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name in ("profiles_file", "fact_kinds_file"):
            path: Path = getattr(self.memory, name)
            if not path.expanduser().is_file():
                raise ValueError(f"memory.{name}: no such file: {path}")
        if self.mqtt.enabled and not self.mqtt.topics_file.expanduser().is_file():
            raise ValueError(f"mqtt.topics_file: no such file: {self.mqtt.topics_file}")
        people = {" ".join(n.split()).casefold()
                  for n in (*self.household.people, *self.mqtt.people.values())}
        for name, bound in self.http.tokens.items():
            channel = self.channels.get(bound.channel)
            if channel is None or channel.background:
                raise ValueError(f"http.tokens.{name}.channel: {bound.channel!r} is not a "
                                 "foreground channel of [channels]")
            if bound.person is not None and " ".join(
                    bound.person.split()).casefold() not in people:
                raise ValueError(f"http.tokens.{name}.person: not one of household.people")
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
    except OSError as exc:  # a directory, no permission
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


_Model = TypeVar("_Model", bound=BaseModel)


def read_named_tables(path: Path, key: str, model: type[_Model], *,
                      named: bool = False) -> dict[str, _Model]:
    """The ``[<key>.<name>]`` tables of the TOML file at ``path``, each validated
    as ``model`` (with its ``name`` field set to the table's name when ``named``),
    by name. A broken file or table is a :class:`ConfigError` naming the file,
    the table and the field (``fact_kinds.toml: kinds.event.half_life_days: ...``)."""
    data = read_toml(path)
    table = data.get(key)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {key}: expected a table of [{key}.<name>]")
    parsed: dict[str, _Model] = {}
    for name, body in table.items():
        if named:
            if not isinstance(body, dict):
                raise ConfigError(f"{path}: {key}.{name}: expected a table")
            body = {"name": name, **body}
        try:
            parsed[name] = model.model_validate(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise ConfigError(f"{path}: {key}.{name}.{field}: {err['msg']}") from None
    return parsed


def _resolve_relative_files(data: dict[str, Any], base: Path) -> None:
    """Paths to other config files are relative to the file that names them."""
    for section, names in (("memory", ("profiles_file", "fact_kinds_file")),
                           ("mqtt", ("topics_file",))):
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        for name in names:
            value = table.get(name)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                table[name] = str(base / value)


def _home(env: Mapping[str, str]) -> Path | None:
    home = env.get("HOME", "")
    return Path(home) if home and os.path.isabs(home) else None


def _user_config_in(env: Mapping[str, str]) -> Path | None:
    """The user's configuration file as ``env`` alone says, or None when it names
    no home (``load_settings(env={})`` stays independent of the real user)."""
    if env.get("REVERIE_CONFIG"):
        return Path(env["REVERIE_CONFIG"]).expanduser()
    xdg = env.get("XDG_CONFIG_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "reverie" / "reverie.toml"
    home = _home(env)
    return home / ".config" / "reverie" / "reverie.toml" if home else None


def default_user_config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the user's configuration lives: ``$REVERIE_CONFIG`` if set, else
    ``$XDG_CONFIG_HOME/reverie/reverie.toml``, else ``~/.config/reverie/reverie.toml``
    (``~`` from ``HOME`` in ``env``, else the account's home directory)."""
    env = os.environ if env is None else env
    found = _user_config_in(env)
    return found if found is not None else Path.home() / ".config" / "reverie" / "reverie.toml"


def _env_value(env: Mapping[str, str], var: str) -> str:
    return env.get(var, "").strip()


def env_provider(env: Mapping[str, str]) -> dict[str, Any] | None:
    """One language-model provider from the environment, or None when none is set.

    ``REVERIE_LLM_BASE_URL`` and ``REVERIE_LLM_MODEL`` are required;
    ``REVERIE_LLM_API_KEY_ENV`` is the *name* of the variable holding the key
    (default: ``REVERIE_LLM_API_KEY`` when that is set, else no key);
    ``REVERIE_LLM_NAME`` (default ``env``) and ``REVERIE_LLM_TIMEOUT_S`` are
    optional. A bad or missing value raises :class:`ConfigError` naming the
    variable, never quoting its value (it could be a key put in the wrong place).
    """
    values = {field: _env_value(env, var) for field, var in LLM_ENV.items()}
    if not any(values.values()):
        return None
    for field in ("base_url", "model"):
        if not values[field]:
            others = ", ".join(LLM_ENV[f] for f, v in values.items() if v)
            raise ConfigError(f"{LLM_ENV[field]}: not set, but {others} is; a provider from "
                              "the environment needs REVERIE_LLM_BASE_URL and REVERIE_LLM_MODEL")
    if values["api_key_env"]:
        if not re.match(ENV_VAR_NAME, values["api_key_env"]):
            raise ConfigError(f"{LLM_ENV['api_key_env']}: must be the NAME of the environment "
                              "variable that holds the API key (letters, digits, _), "
                              "not the key itself")
    elif _env_value(env, LLM_KEY_VAR):
        values["api_key_env"] = LLM_KEY_VAR
    raw = {field: value for field, value in values.items() if value}
    raw.setdefault("name", "env")
    try:
        provider = ProviderSettings.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            field = str(e["loc"][0]) if e["loc"] else ""
            problems.append(f"{LLM_ENV.get(field, 'REVERIE_LLM_*')}: {e['msg']}")
        raise ConfigError("; ".join(problems)) from None
    if not urlsplit(provider.base_url).hostname:
        raise ConfigError(f"{LLM_ENV['base_url']}: the URL has no host")
    if provider.api_key_env and not env.get(provider.api_key_env):
        log.warning("llm provider %s from the environment: the variable named for its API "
                    "key is not set; requests go without a key", provider.name)
    log.debug("llm provider %s from the environment", provider.name)
    return raw


def _read_layer(path: Path) -> dict[str, Any]:
    data = read_toml(path)
    _resolve_relative_files(data, path.parent)
    return data


def load_settings(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Load settings: the packaged defaults, then one file (``path``, else
    ``$REVERIE_CONFIG``, else the user's file when it exists), then the
    environment, then explicit ``overrides`` (see the module's docstring).

    ``env`` (default: ``os.environ``) is the only environment read: with an
    ``env`` naming neither ``REVERIE_CONFIG``, ``XDG_CONFIG_HOME`` nor ``HOME``,
    no user file is looked for."""
    env = os.environ if env is None else env
    if path is None:
        user = _user_config_in(env)
        if env.get("REVERIE_CONFIG") or (user is not None and user.is_file()):
            path = user
    data = _read_layer(DEFAULT_CONFIG)
    origin = DEFAULT_CONFIG
    if path is not None and path.expanduser() != DEFAULT_CONFIG:
        origin = path.expanduser()
        data = _merge(data, _read_layer(origin))
    data = _merge(data, _env_overrides(env))
    provider = env_provider(env)
    if provider is not None:
        llm = data.get("llm", {})
        if isinstance(llm, dict):
            configured = llm.get("providers", [])
            providers = [provider, *configured] if isinstance(configured, list) else configured
            data["llm"] = {**llm, "providers": providers}
    if overrides:
        data = _merge(data, overrides)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, str(origin))) from None
    log.debug("settings loaded from %s", origin)
    return settings
