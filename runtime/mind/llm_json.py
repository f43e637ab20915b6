"""Asking a language model for one JSON object: :func:`ask_json`, validated,
asked once more when invalid, None (never an error) when the model fails.

Used by the ``synthesis`` job (the portrait, :mod:`runtime.mind.synthesis`;
the digests, :mod:`runtime.mind.digest_job`) and the ``dmn`` job
(:mod:`runtime.mind.dmn`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from runtime.llm.providers import (
    AllProvidersFailed,
    ChatMessage,
    Completion,
    FallbackChain,
    LLMRequest,
    parse_json_answer,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
_RETRY = ("That answer was not a valid JSON object for the schema ({why}). Answer again "
          "with only the JSON object.")


def _offline_answer(llm: FallbackChain, completion: Completion) -> bool:
    provider = next((p for p in llm.providers if p.name == completion.provider), None)
    return provider is None or bool(getattr(provider, "last_resort", False))


def ask_json(llm: FallbackChain, system: str, evidence: str, model: type[M],
             check: Callable[[M], str | None], max_tokens: int, what: str) -> M | None:
    """Ask the chain's language model for one ``model`` object: validated
    (``check`` answers why an answer is wrong, or None), asked once more when
    invalid; None when it stays invalid, no real provider answered, or only the
    offline provider did. Never raises for the model's failures."""
    messages = [ChatMessage(role="system", content=system),
                ChatMessage(role="user", content=evidence)]
    for attempt in range(2):
        try:
            completion = llm.complete(LLMRequest(messages=messages, temperature=0.2,
                                                 max_tokens=max_tokens))
        except AllProvidersFailed as exc:
            log.warning("%s: language model unavailable (%s)", what, exc.kind)
            return None
        if _offline_answer(llm, completion):
            log.warning("%s: language model unavailable; offline", what)
            return None
        try:
            out = parse_json_answer(completion.text, model)
            why = check(out)
        except ValueError as exc:
            why = str(exc)
        if why is None:
            return out
        log.warning("%s: invalid model output (%s), attempt %d", what, why, attempt + 1)
        messages = [*messages, ChatMessage(role="assistant", content=completion.text[:4000]),
                    ChatMessage(role="user", content=_RETRY.format(why=why))]
    return None
