"""One OpenAI-compatible server (llama.cpp, llama-cpp-python, vLLM) as a judge backend.

:class:`ServerBackend` asks the server for one token at temperature 0 with the top-N logprobs — through the
completions API (``logprobs.top_logprobs``) for the raw framing, or, for the chat framing, the chat completions
API (``logprobs.content[0].top_logprobs``): the server applies the chat template to the user message itself —
and reads the labels from them (:mod:`kvjudge.judge.server_logprobs`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge._llama import chat_template_inputs
from kvjudge.errors import ContextRefused, JudgeError, ServerError, ServerUnavailable, UsageError
from kvjudge.judge.labels import LabelScore, PromptOverflow, ResultFn, score_in_turn
from kvjudge.judge.ledger import CallCost, Ledger
from kvjudge.judge.prompt import Framing, Prompt, TemplateText, choose_framing, user_message
from kvjudge.judge.scale import Scale
from kvjudge.judge.server_logprobs import DEFAULT_TOP_LOGPROBS, VLLM_MAX_LOGPROBS, label_score, top_logprobs
from kvjudge.judge.window import CERTIFIED_SOURCES
from kvjudge.server_client import (
    Answer,
    Credentials,
    RetryPolicy,
    ServerClient,
    ServerInfo,
    ServerTokenCounter,
    usage_of,
)
from kvjudge.settings import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from kvjudge.tokens import ModelTokenizer


@dataclass
class ServerBackend:
    """One OpenAI-compatible server as a judge backend.

    ``n_ctx``: the judge's window on it (None: what the server reports, when it reports one). ``model_path``: a
    local copy of the served GGUF to count tokens with and read the chat template from (else the server's
    tokenize endpoint, and the template llama.cpp publishes). A prompt with chat-template segments
    (:class:`~kvjudge.judge.prompt.TemplateText`) goes to the chat completions API as one user message (the
    server applies its own template); any other prompt to the completions API.
    """

    url: str
    n_ctx: int | None = None
    model_path: Path | None = None
    top_logprobs: int = DEFAULT_TOP_LOGPROBS
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    n_ctx_source: str | None = None
    info: ServerInfo | None = None
    # The prompt is sent as one string and tokenized by the server (which adds its BOS and may merge tokens
    # across the segment boundaries counted separately): keep a little room.
    slack_tokens: int = 16
    calls: int = 0
    tokens_saved: int = 0  # prompt tokens the server reported it served from its prefix cache (0: none reported)
    window_fixed: bool = True
    credentials: Credentials | None = field(default=None, repr=False)
    ledger: Ledger = field(default_factory=Ledger)
    tokenizer: ModelTokenizer | None = field(default=None, repr=False)
    client: ServerClient = field(default=None, repr=False)  # type: ignore[assignment]  # built from url when None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.client is None:
            self.client = ServerClient(self.url, timeout_s=self.timeout_s, retry=self.retry,
                                       credentials=self.credentials)
        self.url = self.client.url
        if self.info is None:
            try:
                self.info = self.client.identify()
            except ServerError as exc:
                raise JudgeError(f"cannot use the judge server: {exc}") from exc
        if self.info.kind == "vllm":
            self.top_logprobs = min(self.top_logprobs, VLLM_MAX_LOGPROBS)
        if self.n_ctx is None:
            self.n_ctx, self.n_ctx_source = self.info.n_ctx, self.info.n_ctx_source
        if not self.n_ctx:
            raise JudgeError(f"the server at {self.url} does not report its context size; run `kvjudge probe "
                             f"--server {self.url}` or pass --n-ctx N")
        if self.tokenizer is None and self.model_path is not None:
            from kvjudge.tokens import ModelTokenizer

            self.tokenizer = ModelTokenizer(self.model_path)

    @property
    def model_sha256(self) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.sha256

    @property
    def certified(self) -> bool:
        """The window was vouched for by the server's certified capability entry."""
        return (self.n_ctx_source or "").startswith(CERTIFIED_SOURCES)

    @property
    def counter_name(self) -> str:
        """The local tokenizer's name, else the served model's (what ``kvjudge runs`` and reduction count with)."""
        if self.tokenizer is not None:
            return self.tokenizer.name
        assert self.info is not None
        return ServerTokenCounter(self.client, self.info.model_id).name

    @property
    def servers(self) -> list[str]:
        return [self.url]

    def manifest(self) -> dict[str, Any]:
        """What judged (never where): equal for every server of a pool, so cache keys do not depend on the URL."""
        info = self.info
        assert info is not None
        return {"model_sha256": self.model_sha256, "model": info.model_id, "backend": "openai-server",
                "backend_version": {"kind": info.kind, "version": info.version},
                "n_ctx": self.n_ctx, "n_ctx_source": self.n_ctx_source, "threads": None, "n_batch": None,
                "top_logprobs": self.top_logprobs}

    def count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.tokenize(text, special=isinstance(text, TemplateText)))
        try:
            return self.client.count(text)
        except ServerError as exc:
            raise JudgeError(f"cannot count tokens: {exc}") from exc

    def count_prompt(self, segments: Sequence[str]) -> int:
        return sum(self.count(segment) for segment in segments)

    def measure_prefill(self, n_tokens: int = 256) -> float:
        raise JudgeError(f"the prefill speed of the server {self.url} is not measured here")

    def framing(self, choice: str = "auto") -> Framing:
        """The prompt framing for ``--template choice``: the served model's chat template from the local GGUF,
        else from llama.cpp's ``/props``; ``auto`` without one is raw."""
        template, bos, eos = None, "", ""
        if self.tokenizer is not None:
            template, bos, eos = chat_template_inputs(self.tokenizer.llama)
        elif self.info is not None and self.info.chat_template:
            template = self.info.chat_template
        if choice == "chat" and template is None:
            raise UsageError(f"--template chat needs the served model's chat template, which {self.url} does not "
                             f"publish: pass --tokenizer-model PATH (a local copy of the served GGUF), or use "
                             f"--template raw")
        return choose_framing(choice, template, bos_token=bos, eos_token=eos,
                              model_name=f"the model served at {self.url}")

    def resize(self, n_ctx: int, *, source: str | None = None) -> None:
        """A server's context is what it is: only check the window fits it."""
        if self.n_ctx is not None and n_ctx > self.n_ctx:
            raise JudgeError(f"the pairs need a {n_ctx}-token window but the judge window on {self.url} is "
                             f"{self.n_ctx}; pass a smaller --n-ctx")

    @property
    def label_limit(self) -> int:
        """The most levels a scale may have: the top logprobs asked for (each level must be able to appear)."""
        return self.top_logprobs

    def request_score(self, segments: Sequence[str], scale: Scale | None = None,
                      affinity: str | None = None) -> LabelScore:
        """One forced-choice call (``scale``: the levels to read, None: the letters A/B; ``affinity``: the session
        key of its group). Raises PromptOverflow on a context refusal, ServerUnavailable when the server cannot be
        reached after its retries (the pool sends the call elsewhere), AuthRefused when it refuses the credentials,
        JudgeError otherwise."""
        assert self.info is not None
        try:
            answer: Answer
            if any(isinstance(segment, TemplateText) for segment in segments):
                # The chat framing: the server applies its own template to the user message.
                message = user_message(segments)
                answer = self.client.chat([{"role": "user", "content": message}], model=self.info.model_id,
                                          top_logprobs=self.top_logprobs, affinity=affinity)
            else:
                answer = self.client.complete("".join(segments), model=self.info.model_id,
                                              logprobs=self.top_logprobs, affinity=affinity)
        except ContextRefused as exc:
            raise PromptOverflow(f"the judge server {self.url} refused the prompt as longer than its context "
                                 f"({exc})") from exc
        except ServerUnavailable:
            raise
        except ServerError as exc:
            raise JudgeError(str(exc)) from exc
        usage = usage_of(answer)
        prompt_tokens = usage.prompt_tokens or 0
        score = label_score(top_logprobs(answer), top_n=self.top_logprobs, prompt_tokens=prompt_tokens,
                            server=self.url, scale=scale)
        cost = CallCost(prompt_tokens, usage.cached_tokens, usage.completion_tokens or 0, answer.tries - 1,
                        answer.seconds)
        with self._lock:  # the pool calls from several threads
            self.calls += 1
            self.tokens_saved += usage.cached_tokens or 0
            self.ledger.add(cost)
        return dataclasses.replace(score, cost=cost, reused_tokens=usage.cached_tokens or 0)

    def score(self, segments: Sequence[str], shared: int = 0, scale: Scale | None = None) -> LabelScore:
        try:
            return self.request_score(segments, scale)
        except ServerUnavailable as exc:
            raise JudgeError(f"the judge server failed: {exc}") from exc

    def score_many(self, groups: Iterable[Sequence[Prompt]], on_result: ResultFn) -> None:
        """One request at a time (a pool of servers sends them concurrently)."""
        score_in_turn(self.score, groups, on_result)

    def stats(self) -> dict[str, Any]:
        return {"servers": [self.url], "dropped": {}, "resent": 0, "calls": {self.url: self.calls}, "parallel": 1,
                "ledger": self.ledger.to_json()}

    def close(self) -> None:
        self.client.close()


__all__ = ["ServerBackend"]
