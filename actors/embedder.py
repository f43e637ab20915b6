"""The embedding model as other actors see it: the Recall actor's ONNX session.

The Recall actor owns the one model of the runtime (``actors.recall``); a job
actor that needs vectors borrows it through :class:`RemoteEmbedder` instead of
loading a session of its own."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from actors.handles import RecallClient
from actors.messages import MAX_BATCH, Embed

log = logging.getLogger(__name__)


class RemoteEmbedder:
    """The :class:`runtime.llm.embedder.Embedder` protocol, answered by the Recall actor.

    Texts go in calls of at most ``batch`` (at most ``MAX_BATCH``, what one
    ``Embed`` may carry): a job's many texts neither exceed a message nor hold
    the actor, which answers one call at a time, for long against recall."""

    def __init__(self, client: RecallClient, batch: int = MAX_BATCH) -> None:
        self.client = client
        self.batch = max(1, min(batch, MAX_BATCH))
        self.name, self.dim = client.embedder_info()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        texts = list(texts)
        parts = [self.client.embed(Embed(texts=texts[i:i + self.batch])).array()
                 for i in range(0, len(texts), self.batch)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
