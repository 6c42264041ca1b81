"""How the token budget estimates text it has no backend figure for.

The default heuristic is chars/4 over UTF-8 bytes, rounded up. Users who want a
closer estimate can pick one of the counters of :mod:`kvjudge.tokens` (tiktoken's cl100k, or the GGUF
model's own tokenizer) through ``[context.estimation] counter``.

A message sent through a chat API costs more than its text: the chat template wraps it in markup
(``<|im_start|>user\n … <|im_end|>\n``). ``[context.estimation] template = "model"`` (or ``"chatml"``)
counts those tokens from the model's own template, with its own tokenizer, and adds them to every message
the estimate covers: a reply added since the backend's last report, and a turn dropped by pruning.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from kvjudge.errors import ConfigError, KvjudgeError
from kvjudge.settings import Settings
from kvjudge.tokens import (
    TIKTOKEN_ENCODING,
    CharsPerToken,
    MessageOverhead,
    ModelTokenizer,
    TiktokenCounter,
    TokenCounter,
    make_counter,
    template_overhead,
)

DEFAULT_CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class TokenEstimation:
    """A token estimate for text: ``ceil(utf8_bytes / 4)`` unless another counter is chosen; per message, plus
    the chat template's tokens around it when ``template`` was measured (none by default)."""

    counter: TokenCounter = field(default_factory=lambda: CharsPerToken(DEFAULT_CHARS_PER_TOKEN))
    template: MessageOverhead = field(default_factory=MessageOverhead)

    @classmethod
    def chars(cls, chars_per_token: float = DEFAULT_CHARS_PER_TOKEN) -> TokenEstimation:
        """``ceil(utf8_bytes / chars_per_token)`` (the default heuristic)."""
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
    def from_settings(cls, settings: Settings, model_path: str | os.PathLike[str] | None = None) -> TokenEstimation:
        """From ``[context.estimation]``: ``chars_per_token = N`` or ``counter = "chars"|"tiktoken"|"model"``,
        and ``template = "model"|"chatml"`` to count the chat template's tokens per message.

        ``counter = "model"`` and ``template`` use the tokenizer (and template) of ``model_path``.
        """
        chosen = settings.context.estimation
        chars_per_token, counter, template = chosen.chars_per_token, chosen.counter, chosen.template
        where = f"{settings.source or 'the settings'}: [context.estimation]"
        if chars_per_token is not None and counter not in (None, "chars"):
            raise ConfigError(f"{where} sets both chars_per_token and counter = {counter!r}; keep one of them")
        if model_path is None and (counter == "model" or template is not None):
            key, value = ("counter", counter) if counter == "model" else ("template", template)
            raise ConfigError(f"{where} {key} = \"{value}\" needs a model; pass --model")
        try:
            n = DEFAULT_CHARS_PER_TOKEN if chars_per_token is None else float(chars_per_token)
            estimation = cls(make_counter(counter or "chars", model_path, chars_per_token=n))
            if template is not None:
                tokenizer = estimation.counter if isinstance(estimation.counter, ModelTokenizer) \
                    else ModelTokenizer(model_path)  # type: ignore[arg-type]
                estimation = estimation.with_template(template_overhead(tokenizer, template))
            return estimation
        except KvjudgeError as exc:
            raise ConfigError(f"{where}: {exc}") from exc

    def with_template(self, template: MessageOverhead) -> TokenEstimation:
        """The same text estimate, plus ``template``'s tokens around every message."""
        return dataclasses.replace(self, template=template)

    @property
    def name(self) -> str:
        """The counter's stable name, e.g. ``chars/4``, with the template's figures when counted
        (``chars/4+template:chatml(user 14, assistant 14)``)."""
        return self.counter.name if self.template.template == "none" else f"{self.counter.name}+{self.template.name}"

    def estimate(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        return self.counter.count(text) if text else 0

    def message(self, role: str, text: str) -> int:
        """Estimated tokens of one chat message: its text and the template's tokens around it.

        A blank message is never sent (``build_messages`` leaves it out): no template tokens for it.
        """
        return self.estimate(text) + (self.template.of(role) if text.strip() else 0)

    def turn(self, user: str, assistant: str) -> int:
        """A turn's estimate: ``message("user", user) + message("assistant", assistant)`` (each rounded up on its
        own; without a template, ``estimate(user) + estimate(assistant)``)."""
        return self.message("user", user) + self.message("assistant", assistant)
