"""What a server says one call cost: prompt tokens, the prompt tokens it served from its prefix cache, completion
tokens. A figure the server does not report is None ("not reported"), never 0.

Where each family reports the cached share of a prompt:

- vLLM: ``usage.prompt_tokens_details.cached_tokens``, only when the server was started with
  ``--enable-prompt-tokens-details`` (otherwise ``prompt_tokens_details`` is null);
- llama.cpp's ``llama-server``: ``timings.cache_n`` (the prompt tokens taken from the slot's cache) on its
  OpenAI-compatible answers, and in newer builds ``usage.prompt_tokens_details.cached_tokens`` too;
- llama-cpp-python's server and OpenAI-compatible servers that say nothing: not reported.

llama.cpp's native ``tokens_cached`` is not read: it counts every token left in the slot (generated ones too), not
the part of this prompt that was reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    """One answer's token figures as the server reported them (None: not reported)."""

    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(answer: Any) -> Usage:
    """The usage figures of a completions or chat completions answer."""
    if not isinstance(answer, Mapping):
        return Usage(None, None, None)
    usage = answer.get("usage") if isinstance(answer.get("usage"), Mapping) else {}
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    timings = answer.get("timings")
    if cached is None and isinstance(timings, Mapping):
        cached = _int(timings.get("cache_n"))
    return Usage(_int(usage.get("prompt_tokens")), cached, _int(usage.get("completion_tokens")))
