"""The Embedder actor: owns the one ONNX session, shared by every other actor."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from actors.common import EMBEDDER, accept, setup_logging
from actors.handles import EmbedderClient
from actors.messages import MAX_BATCH, Embed, Embedded
from runtime.config import Settings
from runtime.embedder import make_embedder

log = logging.getLogger(__name__)


class EmbedderActor:
    def __init__(self, settings: Settings) -> None:
        setup_logging(settings, EMBEDDER)
        self.embedder = make_embedder(settings.embedder)
        self.embedder.embed(["warm up"])  # export/load the model now, not on first use

    def info(self) -> tuple[str, int]:
        return self.embedder.name, self.embedder.dim

    def embed(self, msg: Embed) -> Embedded:
        msg = accept(Embed, msg)
        return Embedded.of(self.embedder.name, self.embedder.embed(msg.texts))

    def ping(self) -> str:
        return "ok"


class RemoteEmbedder:
    """The :class:`runtime.embedder.Embedder` protocol, answered by the Embedder actor.

    Texts go in calls of at most ``batch`` (at most ``MAX_BATCH``, what one
    ``Embed`` may carry): a job's many texts neither exceed a message nor hold
    the actor, which embeds one call at a time, for long against recall."""

    def __init__(self, client: EmbedderClient, batch: int = MAX_BATCH) -> None:
        self.client = client
        self.batch = max(1, min(batch, MAX_BATCH))
        self.name, self.dim = client.info()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        texts = list(texts)
        parts = [self.client.embed(Embed(texts=texts[i:i + self.batch])).array()
                 for i in range(0, len(texts), self.batch)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
