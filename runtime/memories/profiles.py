"""Per-source memory profiles: which transcript sources may become memory.

One allowlist (``configs/profiles.toml``) gives each source five switches.
Exact names win over ``prefix:*`` patterns; a source that matches nothing is
fully muted, so a new channel writes no memory until it is opted in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from runtime.config import read_named_tables

log = logging.getLogger(__name__)


class MemoryProfile(BaseModel):
    """The five switches for one transcript source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episodes: bool = False
    facts: bool = False
    geo: bool = False
    patterns: bool = False
    location: bool = False

    @property
    def remembered(self) -> bool:
        """Its rows are memory: recallable and embedded."""
        return self.episodes or self.facts

    @property
    def muted(self) -> bool:
        return not (self.episodes or self.facts or self.geo or self.patterns or self.location)


MUTED = MemoryProfile()


@dataclass(frozen=True)
class ResolvedProfile:
    source: str
    profile: MemoryProfile
    tag: str | None  # the part after "prefix:" for wildcard sources (e.g. the agent name)


class MemoryProfiles:
    def __init__(self, sources: Mapping[str, MemoryProfile]) -> None:
        self._exact = {k: v for k, v in sources.items() if not k.endswith(":*")}
        self._prefixes = sorted(
            ((k[:-1], v) for k, v in sources.items() if k.endswith(":*")),
            key=lambda kv: -len(kv[0]),
        )

    @classmethod
    def load(cls, path: Path) -> MemoryProfiles:
        return cls(read_named_tables(path, "sources", MemoryProfile))

    def resolve(self, source: str) -> ResolvedProfile:
        if source in self._exact:
            return ResolvedProfile(source, self._exact[source], None)
        for prefix, profile in self._prefixes:
            if source.startswith(prefix) and len(source) > len(prefix):
                return ResolvedProfile(source, profile, source[len(prefix):])
        return ResolvedProfile(source, MUTED, None)

    def for_source(self, source: str) -> MemoryProfile:
        return self.resolve(source).profile
