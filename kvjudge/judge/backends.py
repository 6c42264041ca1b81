"""Model backends for the judge: the :class:`Backend` protocol and in-process llama-cpp-python here;
OpenAI-compatible servers in :mod:`kvjudge.judge.servers`.

Every backend answers by forced choice (:mod:`kvjudge.judge.labels`). The protocol is the only way the judge talks
to a backend: whatever a caller may want to know of one (its window, whether it is fixed and vouched for, the
counter its counts are kept under, prefix tokens it saved, the servers behind it) is a member of it, so no caller
asks what kind of backend it holds.

A backend failure is a :class:`~kvjudge.errors.JudgeError`; a prompt longer than the context is a
:class:`~kvjudge.judge.labels.PromptOverflow`. The verdict code turns them into the outcomes ``error`` and
``overflow``, never into a score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvjudge._llama import (
    backend_version,
    chat_template_inputs,
    last_logits,
    load_llama,
    quiet_native_output,
    require_local_inference,
    rewind,
)
from kvjudge.errors import JudgeError, ModelError
from kvjudge.judge.labels import SPELLINGS, LabelScore, PromptOverflow, ResultFn, renormalise, score_in_turn
from kvjudge.judge.ledger import CallCost, Ledger
from kvjudge.judge.prompt import Framing, Prompt, TemplateText, choose_framing
from kvjudge.judge.scale import Scale
from kvjudge.tokens import model_counter_name, tokenize_exact

__all__ = ["Backend", "LlamaBackend", "PromptOverflow"]


class Backend(Protocol):
    """What the judge needs from a model runtime, and all a caller may ask of one."""

    #: The judge window in tokens (None: an in-process backend not sized yet).
    n_ctx: int | None
    #: Tokens the window keeps free beyond the prompt's counted length (a server tokenizes the prompt whole).
    slack_tokens: int
    #: True: the window is the server's and only checked by :meth:`resize`; False: :meth:`resize` loads one.
    window_fixed: bool
    #: The fixed window was vouched for by a certified capability entry (an in-process window is certified size by
    #: size by the window planner: False here).
    certified: bool
    #: Calls answered, and prompt tokens whose KV cache was reused rather than evaluated (0 where unknown).
    calls: int
    tokens_saved: int
    #: Every answered call's cost, as its answerer measured it (:mod:`kvjudge.judge.ledger`), added up.
    ledger: Ledger
    #: The most levels a scale may have to be read whole (a server's top-logprobs limit; None: every token is read).
    label_limit: int | None

    @property
    def counter_name(self) -> str:
        """The name body counts are kept under in the store's count cache (the same tokenizer, the same name)."""
        ...

    @property
    def model_path(self) -> Path | None:
        """The judge model's GGUF on this machine (None: none known, e.g. a server without a local copy)."""
        ...

    @property
    def servers(self) -> list[str]:
        """The URLs of the servers behind the backend (empty in-process)."""
        ...

    def manifest(self) -> dict[str, Any]:
        """Model sha256, backend name and version, n_ctx, threads, batch size (recorded in every verdict)."""
        ...

    def count(self, text: str) -> int:
        """Tokens of ``text`` with the model's own tokenizer (as one segment of a prompt)."""
        ...

    def count_prompt(self, segments: Sequence[str]) -> int:
        """Tokens of a whole prompt as the backend evaluates it (with the BOS the model adds, where known)."""
        ...

    def framing(self, choice: str = "auto") -> Framing:
        """The prompt framing for ``--template choice`` (auto | chat | raw)."""
        ...

    def resize(self, n_ctx: int, *, source: str | None = None) -> None:
        """Make the context window ``n_ctx`` tokens (a server's window is fixed: only checks it fits)."""
        ...

    def measure_prefill(self, n_tokens: int = 256) -> float:
        """Prompt tokens per second of the model here (in-process only; a server raises JudgeError)."""
        ...

    def score(self, segments: Sequence[str], shared: int = 0, scale: Scale | None = None) -> LabelScore:
        """Forced-choice label probabilities for the prompt ``"".join(segments)``: of the letters A and B, or of the
        levels of ``scale`` (too little mass on them is a JudgeError, :meth:`~kvjudge.judge.scale.Scale.read`).

        The first ``shared`` segments are the same in every call (the instructions): a backend may keep
        their KV cache and evaluate only the rest.
        """
        ...

    def score_many(self, groups: Iterable[Sequence[Prompt]], on_result: ResultFn) -> None:
        """Score every prompt of every group (a pair's orders: one after the other, on one server where there are
        several), taking groups as they are needed — so the caller prepares the next while calls are in flight.
        ``on_result`` hears of each prompt once, in the caller's thread; a failure is reported, never raised."""
        ...

    def stats(self) -> dict[str, Any]:
        """Figures for a summary: calls, prefix tokens saved; servers, those dropped, requests sent elsewhere."""
        ...

    def close(self) -> None:
        """Release the model (idempotent)."""
        ...


@dataclass
class LlamaBackend:
    """In-process llama-cpp-python with prefix KV reuse.

    Opened without ``n_ctx`` it holds only the tokenizer (``vocab_only``: no weights), enough to render,
    count and size the window for the pairs; :meth:`resize` then loads the weights with that context.
    Every prompt is tokenized segment by segment (the same segment always gives the same ids), so the
    shared prefix (template opening and instructions) is a token prefix too: its KV cache is kept and only
    the rest is evaluated. ``tokens_saved`` counts the prompt tokens that reuse skipped.
    """

    model_path: Path  # type: ignore[assignment]  # always known here (the protocol's is Optional)
    n_ctx: int | None = None
    n_threads: int | None = None
    n_batch: int = 512
    model_sha256: str | None = None
    n_ctx_source: str | None = None  # where n_ctx came from (the window planner, --n-ctx, the demo)
    reuse_prefix: bool = True  # False: evaluate every prompt whole (the benchmark's no-reuse baseline)
    tokens_evaluated: int = 0
    tokens_saved: int = 0
    calls: int = 0
    loads: int = 0
    slack_tokens: int = 0  # the prompt is tokenized segment by segment, exactly as counted
    window_fixed: bool = False
    certified: bool = False
    ledger: Ledger = field(default_factory=Ledger)
    label_limit: int | None = None  # the whole distribution is read from the logits
    _vocab: Any = field(default=None, repr=False)
    _llama: Any = field(default=None, repr=False)
    _label_ids: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _scale_ids: dict[tuple[str, ...], dict[str, tuple[int, ...]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        from kvjudge.models import file_sha256

        require_local_inference("the in-process judge (--backend llama)")
        self.model_path = Path(self.model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model file {self.model_path} does not exist; pass a GGUF path with --model")
        self.model_sha256 = self.model_sha256 or file_sha256(self.model_path)
        try:
            with quiet_native_output():  # a vocab-only load warns about its context size on the C-level stderr
                self._vocab = load_llama(model_path=str(self.model_path), vocab_only=True, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot read the tokenizer of {self.model_path} ({exc}); check the file") from exc
        self._label_ids = self._one_token_ids(SPELLINGS)
        if self.n_ctx is not None:
            requested, self.n_ctx = self.n_ctx, None
            self.resize(requested, source=self.n_ctx_source)

    def _one_token_ids(self, spellings: dict[str, tuple[str, ...]]) -> dict[str, tuple[int, ...]]:
        """Each label's token ids: the spellings that are one token (one that takes two cannot be a one-token
        answer); a label without one is a ModelError."""
        found: dict[str, tuple[int, ...]] = {}
        for label, spelled in spellings.items():
            ids: set[int] = set()
            for spelling in spelled:
                tokens = self._vocab.tokenize(spelling.encode(), add_bos=False, special=False)
                if len(tokens) == 1:
                    ids.add(tokens[0])
            if not ids:
                raise ModelError(f"{self.model_path.name} has no single-token spelling of the label {label!r}; "
                                 f"this model cannot be used as a forced-choice judge on it")
            found[label] = tuple(sorted(ids))
        return found

    def _ids_of(self, scale: Scale) -> dict[str, tuple[int, ...]]:
        if scale.levels not in self._scale_ids:
            self._scale_ids[scale.levels] = self._one_token_ids({level: scale.spellings(level)
                                                                 for level in scale.levels})
        return self._scale_ids[scale.levels]

    @property
    def chat_template(self) -> str | None:
        """The GGUF's own chat template (``tokenizer.chat_template``), None for a model without one."""
        if self._vocab is None:
            raise JudgeError("the judge backend is closed; open a new one")
        return self._vocab.metadata.get("tokenizer.chat_template") or None

    def framing(self, choice: str = "auto") -> Framing:
        """The prompt framing for ``--template choice`` (``auto``: the chat template when the model has one)."""
        if self._vocab is None:
            raise JudgeError("the judge backend is closed; open a new one")
        template, bos, eos = chat_template_inputs(self._vocab)
        return choose_framing(choice, template, bos_token=bos, eos_token=eos, model_name=self.model_path.name)

    def resize(self, n_ctx: int, *, source: str | None = None) -> None:
        """Load the weights with context ``n_ctx`` (reloads only when it changes)."""
        if n_ctx < 64:
            raise JudgeError(f"n_ctx {n_ctx} is too small for a judge prompt; use at least 512")
        if source is not None:
            self.n_ctx_source = source
        if self._llama is not None and n_ctx == self.n_ctx:
            return
        if self._llama is not None:
            self._llama.close()
            self._llama = None
        try:
            self._llama = load_llama(model_path=str(self.model_path), n_ctx=n_ctx, n_batch=min(self.n_batch, n_ctx),
                                n_threads=self.n_threads, logits_all=False, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load {self.model_path} with n_ctx={n_ctx} ({exc}); "
                             f"try a smaller --n-ctx or check the file") from exc
        self.n_ctx = n_ctx
        self.n_threads = self._llama.n_threads
        self.loads += 1

    def measure_prefill(self, n_tokens: int = 256) -> float:
        """Prompt tokens per second of this model here, timed on ``n_tokens`` of filler text."""
        import time

        if self._llama is None or (self.n_ctx or 0) < n_tokens + 64:
            self.resize(max(512, n_tokens + 64), source="prefill speed sample")
        ids = self.tokenize("The quick brown fox jumps over the lazy dog; pytest collected 12 items. " * 64)[:n_tokens]
        llama = self._llama
        rewind(llama, 0)
        started = time.perf_counter()
        llama.eval(ids)
        seconds = time.perf_counter() - started
        rewind(llama, 0)
        return len(ids) / max(seconds, 1e-6)

    def manifest(self) -> dict[str, Any]:
        return {"model_sha256": self.model_sha256, "model": self.model_path.name, "backend": "llama-cpp-python",
                "backend_version": backend_version(), "n_ctx": self.n_ctx, "n_ctx_source": self.n_ctx_source,
                "threads": self.n_threads, "n_batch": min(self.n_batch, self.n_ctx or self.n_batch)}

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of one segment (long text in pieces, exactly as ModelTokenizer does).

        :class:`TemplateText` is tokenized with special tokens parsed, in one call; everything else never is.
        """
        if self._vocab is None:
            raise JudgeError("the judge backend is closed; open a new one")
        if isinstance(text, TemplateText):
            ids = list(self._vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))
        else:
            ids = tokenize_exact(self._vocab, text, add_bos=add_bos)
        bos = self._vocab.token_bos()
        if add_bos and len(ids) >= 2 and ids[0] == ids[1] == bos:
            ids = ids[1:]  # the template wrote its own BOS: one is enough
        return ids

    @property
    def counter_name(self) -> str:
        assert self.model_sha256 is not None
        return model_counter_name(self.model_sha256)

    @property
    def servers(self) -> list[str]:
        return []

    def count(self, text: str) -> int:
        return len(self.tokenize(text))

    def prompt_tokens(self, segments: Sequence[str]) -> list[int]:
        """The exact token ids evaluated for ``segments`` (BOS, if the model wants one, on the first)."""
        ids: list[int] = []
        for index, segment in enumerate(segments):
            ids.extend(self.tokenize(segment, add_bos=index == 0))
        return ids

    def count_prompt(self, segments: Sequence[str]) -> int:
        return len(self.prompt_tokens(segments))

    def score_many(self, groups: Iterable[Sequence[Prompt]], on_result: ResultFn) -> None:
        """One call at a time, in order (the model runs here)."""
        score_in_turn(self.score, groups, on_result)

    def stats(self) -> dict[str, Any]:
        return {"calls": self.calls, "tokens_evaluated": self.tokens_evaluated, "tokens_saved": self.tokens_saved,
                "loads": self.loads, "ledger": self.ledger.to_json()}

    def score(self, segments: Sequence[str], shared: int = 0, scale: Scale | None = None) -> LabelScore:
        import time

        import numpy as np

        started = time.perf_counter()
        if self._vocab is None:
            raise JudgeError("the judge backend is closed; open a new one")
        label_ids = self._label_ids if scale is None else self._ids_of(scale)
        if self._llama is None or self.n_ctx is None:
            raise JudgeError("the judge backend has no window yet; size it with resize(n_ctx) first")
        prefix = self.prompt_tokens(segments[:shared])
        tokens = prefix + [t for i, s in enumerate(segments[shared:]) for t in self.tokenize(s, add_bos=shared == 0 and i == 0)]
        if len(tokens) + 1 > self.n_ctx:  # +1: the answer token must fit too
            raise PromptOverflow(f"the judge prompt has {len(tokens)} tokens, over n_ctx {self.n_ctx} minus the answer")
        if len(prefix) >= len(tokens):
            raise JudgeError("the shared prefix covers the whole judge prompt; nothing is left to evaluate")
        llama = self._llama
        # Reuse exactly the shared prefix, never "whatever matched last time": the rest is then always
        # evaluated from the same position in the same batches, so a verdict does not depend on the
        # previous call (llama.cpp's numerics vary slightly with batch composition).
        keep = len(prefix) if (self.reuse_prefix and prefix and llama.n_tokens >= len(prefix)
                               and list(llama.input_ids[: len(prefix)]) == prefix) else 0
        try:
            keep = rewind(llama, keep)  # 0 when the cache cannot drop a suffix (a windowed SWA cache)
            if keep == 0 and prefix and self.reuse_prefix:
                llama.eval(prefix)  # on its own, so the prefix KV is the same whoever computed it
                llama.eval(tokens[len(prefix):])
            else:
                llama.eval(tokens[keep:])
        except Exception as exc:  # llama-cpp-python raises RuntimeError/ValueError/AssertionError here
            llama.n_tokens = 0
            raise JudgeError(f"llama.cpp failed to evaluate the judge prompt ({exc})") from exc
        logits = last_logits(llama, llama.n_vocab()).astype(np.float64)
        top = float(logits.max())
        log_z = top + math.log(float(np.exp(logits - top).sum()))
        raw = {label: sum(math.exp(float(logits[i]) - log_z) for i in ids) for label, ids in label_ids.items()}
        probs, mass = renormalise(raw) if scale is None else scale.read(raw)
        self.calls += 1
        self.tokens_evaluated += len(tokens) - keep
        self.tokens_saved += keep
        # The KV reuse counted as a server counts its prefix cache: the prompt's tokens not evaluated again. Nothing
        # is generated (the next token's distribution is read from the logits): no completion token.
        cost = CallCost(len(tokens), keep, 0, 0, time.perf_counter() - started)
        self.ledger.add(cost)
        return LabelScore(probs=probs, label_mass=mass, prompt_tokens=len(tokens), reused_tokens=keep, cost=cost)

    def close(self) -> None:
        for model in (self._llama, self._vocab):
            if model is not None:
                model.close()
        self._llama = self._vocab = None
