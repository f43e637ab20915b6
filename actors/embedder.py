"""The Embedder actor: owns the one ONNX session, shared by every other actor."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from actors.common import EMBEDDER, accept, setup_logging
from actors.handles import EmbedderClient
from actors.messages import Embed, Embedded
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
    """The :class:`runtime.embedder.Embedder` protocol, answered by the Embedder actor."""

    def __init__(self, client: EmbedderClient) -> None:
        self.client = client
        self.name, self.dim = client.info()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        return self.client.embed(Embed(texts=list(texts))).array()
