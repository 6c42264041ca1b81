"""How the token budget estimates text it has no backend figure for.

The seed's heuristic is chars/4 over UTF-8 bytes, rounded up, and it stays the default. Users who want a
closer estimate can pick one of the counters of :mod:`kvjudge.tokens` (tiktoken's cl100k, or the GGUF
model's own tokenizer) through ``[context.estimation] counter``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvjudge.config import Config
from kvjudge.errors import ConfigError, KvjudgeError
from kvjudge.tokens import TIKTOKEN_ENCODING, CharsPerToken, TiktokenCounter, TokenCounter, make_counter

DEFAULT_CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class TokenEstimation:
    """A token estimate for text: ``ceil(utf8_bytes / 4)`` unless another counter is chosen."""

    counter: TokenCounter = field(default_factory=lambda: CharsPerToken(DEFAULT_CHARS_PER_TOKEN))

    @classmethod
    def chars(cls, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> TokenEstimation:
        """``ceil(utf8_bytes / chars_per_token)`` (the seed's heuristic)."""
        return cls(CharsPerToken(chars_per_token))

    @classmethod
    def tiktoken(cls, encoding_name: str = TIKTOKEN_ENCODING) -> TokenEstimation:
        """tiktoken's cl100k (offline encoding)."""
        return cls(TiktokenCounter(encoding_name))

    @classmethod
    def model(cls, model_path: str | os.PathLike[str]) -> TokenEstimation:
        """The GGUF model's own tokenizer (loaded vocab-only, on first use)."""
        return cls(make_counter("model", model_path))

    @classmethod
    def from_config(cls, config: Config, model_path: str | os.PathLike[str] | None = None) -> TokenEstimation:
        """From ``[context.estimation]``: ``chars_per_token = N`` or ``counter = "chars"|"tiktoken"|"model"``.

        ``counter = "model"`` uses the tokenizer of ``model_path``.
        """
        chars_per_token = config.get("context.estimation.chars_per_token", (int, float), None)
        counter = config.get("context.estimation.counter", str, None)
        where = f"{config.source}: [context.estimation]"
        if chars_per_token is not None and counter not in (None, "chars"):
            raise ConfigError(f"{where} sets both chars_per_token and counter = {counter!r}; keep one of them")
        if counter == "model" and model_path is None:
            raise ConfigError(f"{where} counter = \"model\" needs a model; pass --model")
        try:
            n = DEFAULT_CHARS_PER_TOKEN if chars_per_token is None else float(chars_per_token)
            return cls(make_counter(counter or "chars", model_path, chars_per_token=n))
        except KvjudgeError as exc:
            raise ConfigError(f"{where}: {exc}") from exc

    @property
    def name(self) -> str:
        """The counter's stable name, e.g. ``chars/4``."""
        return self.counter.name

    def estimate(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        return self.counter.count(text) if text else 0

    def turn(self, user: str, assistant: str) -> int:
        """A turn's estimate: ``estimate(user) + estimate(assistant)`` (each side rounded up on its own)."""
        return self.estimate(user) + self.estimate(assistant)
