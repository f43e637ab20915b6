"""The closed set of fact kinds and their decay policies (``configs/fact_kinds.toml``)."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from runtime.config import ConfigError, read_named_tables

log = logging.getLogger(__name__)


class UnknownFactKind(ValueError):
    """A fact was written with a kind outside the closed set."""


class FactKindPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    half_life_days: float | None = Field(default=None, gt=0)
    superseded_half_life_days: float = Field(default=7.0, gt=0)
    system: bool = False
    # every fact of this kind is sensitive (runtime.memories.privacy)
    sensitive: bool = False


class FactKinds:
    def __init__(self, kinds: dict[str, FactKindPolicy]) -> None:
        if not kinds:
            raise ConfigError("fact kinds: the set is empty")
        self._kinds = dict(kinds)

    @classmethod
    def load(cls, path: Path) -> FactKinds:
        return cls(read_named_tables(path, "kinds", FactKindPolicy, named=True))

    @property
    def names(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def policy(self, name: str) -> FactKindPolicy:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownFactKind(
                f"unknown fact kind {name!r}; known kinds: {', '.join(self.names)}"
            ) from None
