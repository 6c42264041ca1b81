"""Model backends for the judge: in-process llama-cpp-python, or an OpenAI-compatible server.

Both answer one question — given a prompt made of text segments, what probability does the model put
on each answer label as its next token? — by forced choice: no sampling, no free-text parsing. The
probabilities are renormalised over the labels, so only their ratio matters. A label may be spelled
by several tokens (``" A"`` after ``"Answer:"``, or a bare ``"A"``); their probabilities are summed.

A backend failure is a :class:`~kvjudge.errors.JudgeError`; a prompt longer than the context is a
:class:`PromptOverflow`. The verdict code turns them into the outcomes ``error`` and ``overflow``,
never into a score.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvjudge.errors import JudgeError, ModelError
from kvjudge.tokens import split_for_tokenizer

# The answer labels and the spellings whose probabilities count for each.
LABELS: tuple[str, str] = ("A", "B")
_SPELLINGS: dict[str, tuple[str, ...]] = {label: (f" {label}", label) for label in LABELS}


class PromptOverflow(JudgeError):
    """The prompt does not fit the backend's context (an outcome of its own: ``overflow``)."""


@dataclass(frozen=True)
class LabelScore:
    """What one forced-choice call returned.

    ``probs`` maps each label to its probability renormalised over the labels (they sum to 1);
    ``label_mass`` is how much of the full next-token distribution the labels held (a low figure
    means the model wanted to say something else — worth knowing, not an error).
    """

    probs: dict[str, float]
    label_mass: float
    prompt_tokens: int
    reused_tokens: int = 0


@runtime_checkable
class Backend(Protocol):
    """What the judge needs from a model runtime."""

    n_ctx: int

    def manifest(self) -> dict[str, Any]:
        """Model sha256, backend name and version, n_ctx, threads, batch size (recorded in every verdict)."""
        ...

    def count(self, text: str) -> int:
        """Tokens of ``text`` with the model's own tokenizer (as one segment of a prompt)."""
        ...

    def score(self, segments: Sequence[str], shared: int = 0) -> LabelScore:
        """Forced-choice label probabilities for the prompt ``"".join(segments)``.

        The first ``shared`` segments are the same in every call (the instructions): a backend may keep
        their KV cache and evaluate only the rest.
        """
        ...

    def close(self) -> None:
        """Release the model (idempotent)."""
        ...


def _renormalise(raw: dict[str, float]) -> tuple[dict[str, float], float]:
    """Label probabilities (summed over spellings, from the full distribution) → renormalised, mass."""
    mass = sum(raw.values())
    if not mass > 0 or not math.isfinite(mass):
        raise JudgeError(f"the model gave the answer labels no probability ({raw}); check the model and prompt")
    return {label: raw[label] / mass for label in LABELS}, mass


@dataclass
class LlamaBackend:
    """In-process llama-cpp-python with prefix KV reuse.

    Every prompt is tokenized segment by segment (the same segment always gives the same ids), so the
    instruction prefix shared by every call is a token prefix too: the KV cache for it is kept and only
    the rest is evaluated. ``tokens_saved`` counts the prompt tokens that reuse skipped.
    """

    model_path: Path
    n_ctx: int
    n_threads: int | None = None
    n_batch: int = 512
    model_sha256: str | None = None
    n_ctx_source: str | None = None  # where n_ctx came from (capability cache, --n-ctx)
    reuse_prefix: bool = True  # False: evaluate every prompt whole (the benchmark's no-reuse baseline)
    tokens_evaluated: int = 0
    tokens_saved: int = 0
    calls: int = 0
    _llama: Any = field(default=None, repr=False)
    _label_ids: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        from llama_cpp import Llama

        from kvjudge.models import file_sha256

        self.model_path = Path(self.model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model file {self.model_path} does not exist; pass a GGUF path with --model")
        if self.n_ctx < 64:
            raise JudgeError(f"n_ctx {self.n_ctx} is too small for a judge prompt; use at least 512")
        self.model_sha256 = self.model_sha256 or file_sha256(self.model_path)
        try:
            self._llama = Llama(model_path=str(self.model_path), n_ctx=self.n_ctx, n_batch=min(self.n_batch, self.n_ctx),
                                n_threads=self.n_threads, logits_all=False, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load {self.model_path} with n_ctx={self.n_ctx} ({exc}); "
                             f"try a smaller --n-ctx or check the file") from exc
        self.n_threads = self._llama.n_threads
        self.n_batch = self._llama.n_batch
        for label, spellings in _SPELLINGS.items():
            ids: set[int] = set()
            for spelling in spellings:
                tokens = self._llama.tokenize(spelling.encode(), add_bos=False, special=False)
                if len(tokens) == 1:  # a spelling that takes two tokens cannot be a one-token answer
                    ids.add(tokens[0])
            if not ids:
                raise ModelError(f"{self.model_path.name} has no single-token spelling of the label {label!r}; "
                                 f"this model cannot be used as a forced-choice judge")
            self._label_ids[label] = tuple(sorted(ids))

    def manifest(self) -> dict[str, Any]:
        import llama_cpp

        return {"model_sha256": self.model_sha256, "model": self.model_path.name, "backend": "llama-cpp-python",
                "backend_version": llama_cpp.__version__, "n_ctx": self.n_ctx, "n_ctx_source": self.n_ctx_source,
                "threads": self.n_threads, "n_batch": self.n_batch}

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of one segment (long text in word-boundary pieces, as ModelTokenizer does)."""
        if self._llama is None:
            raise JudgeError("the judge backend is closed; open a new one")
        ids: list[int] = []
        for index, piece in enumerate(split_for_tokenizer(text)):
            ids.extend(self._llama.tokenize(piece.encode("utf-8"), add_bos=add_bos and index == 0, special=False))
        return ids

    def count(self, text: str) -> int:
        return len(self.tokenize(text))

    def prompt_tokens(self, segments: Sequence[str]) -> list[int]:
        """The exact token ids evaluated for ``segments`` (BOS, if the model wants one, on the first)."""
        ids: list[int] = []
        for index, segment in enumerate(segments):
            ids.extend(self.tokenize(segment, add_bos=index == 0))
        return ids

    def score(self, segments: Sequence[str], shared: int = 0) -> LabelScore:
        import llama_cpp
        import numpy as np

        if self._llama is None:
            raise JudgeError("the judge backend is closed; open a new one")
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
            if not llama._ctx.kv_cache_seq_rm(-1, keep, -1):
                # Some caches (a windowed SWA cache) cannot drop a suffix: start over rather than read stale KV.
                llama._ctx.kv_cache_seq_rm(-1, 0, -1)
                keep = 0
            llama.n_tokens = keep
            if keep == 0 and prefix and self.reuse_prefix:
                llama.eval(prefix)  # on its own, so the prefix KV is the same whoever computed it
                llama.eval(tokens[len(prefix):])
            else:
                llama.eval(tokens[keep:])
        except Exception as exc:  # llama-cpp-python raises RuntimeError/ValueError/AssertionError here
            llama.n_tokens = 0
            raise JudgeError(f"llama.cpp failed to evaluate the judge prompt ({exc})") from exc
        n_vocab = llama.n_vocab()
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(n_vocab,))
        logits = logits.astype(np.float64)
        top = float(logits.max())
        log_z = top + math.log(float(np.exp(logits - top).sum()))
        raw = {label: sum(math.exp(float(logits[i]) - log_z) for i in ids) for label, ids in self._label_ids.items()}
        probs, mass = _renormalise(raw)
        self.calls += 1
        self.tokens_evaluated += len(tokens) - keep
        self.tokens_saved += keep
        return LabelScore(probs=probs, label_mass=mass, prompt_tokens=len(tokens), reused_tokens=keep)

    def close(self) -> None:
        if self._llama is not None:
            self._llama.close()
            self._llama = None


@dataclass
class ServerBackend:
    """An OpenAI-compatible completions server (llama.cpp server, llama-cpp-python's server, vLLM).

    Asks ``/v1/completions`` for one token at temperature 0 with the top-N logprobs and reads the labels
    from them. A label missing from the top N is an error, never a guess. Token counts come from the
    server's own tokenizer endpoint (``/extras/tokenize`` or ``/tokenize``), or from ``model_path``.
    """

    url: str
    n_ctx: int | None = None
    model_path: Path | None = None
    top_logprobs: int = 20
    timeout_s: float = 600.0
    # The prompt is sent as one string and tokenized by the server, which may merge tokens across the
    # segment boundaries we counted separately: keep a little room.
    slack_tokens: int = 16
    calls: int = 0
    tokens_saved: int = 0  # the server's own prompt cache may reuse KV; it does not tell us
    _info: dict[str, Any] = field(default_factory=dict, repr=False)
    _tokenizer: Any = field(default=None, repr=False)
    _tokenize_route: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        models = self._request("GET", "/v1/models")
        data = models.get("data") or []
        if not data:
            raise JudgeError(f"{self.url}/v1/models lists no model; is this an OpenAI-compatible server?")
        self._info = dict(data[0])
        if self.n_ctx is None:
            # vLLM reports max_model_len; llama.cpp's server reports n_ctx under /props.
            self.n_ctx = self._info.get("max_model_len") or self._props_n_ctx()
        if not self.n_ctx:
            raise JudgeError(f"the server at {self.url} does not report its context size; pass --n-ctx N")
        if self.model_path is not None:
            from kvjudge.tokens import ModelTokenizer

            self._tokenizer = ModelTokenizer(self.model_path)

    def _props_n_ctx(self) -> int | None:
        try:
            props = self._request("GET", "/props")
        except JudgeError:
            return None
        settings = props.get("default_generation_settings") or {}
        return settings.get("n_ctx") or props.get("n_ctx")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        payload = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=payload, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace").replace("\n", " ")
            raise JudgeError(f"the judge server {self.url}{path} answered HTTP {exc.code} ({detail})") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JudgeError(f"cannot reach the judge server {self.url} ({reason}); is it running?") from exc
        except ValueError as exc:
            raise JudgeError(f"the judge server {self.url}{path} did not answer JSON ({exc})") from exc

    def manifest(self) -> dict[str, Any]:
        sha = None
        if self._tokenizer is not None:
            sha = self._tokenizer.sha256
        return {"model_sha256": sha, "model": self._info.get("id"), "backend": "openai-server",
                "backend_version": {k: self._info.get(k) for k in ("id", "owned_by", "created") if k in self._info},
                "server": self.url, "n_ctx": self.n_ctx, "threads": None, "n_batch": None,
                "top_logprobs": self.top_logprobs}

    def count(self, text: str) -> int:
        if self._tokenizer is not None:
            return self._tokenizer.count(text)
        routes = [self._tokenize_route] if self._tokenize_route else ["/extras/tokenize", "/tokenize"]
        last: JudgeError | None = None
        for route in routes:
            body = {"input": text} if route == "/extras/tokenize" else {"content": text, "prompt": text}
            try:
                answer = self._request("POST", route, body)
            except JudgeError as exc:
                last = exc
                continue
            if "tokens" in answer:
                self._tokenize_route = route
                return len(answer["tokens"])
            if "count" in answer:
                self._tokenize_route = route
                return int(answer["count"])
        raise JudgeError(f"the server at {self.url} has no tokenize endpoint ({last}); pass --model PATH "
                         f"of the same GGUF so the judge can count tokens")

    def score(self, segments: Sequence[str], shared: int = 0) -> LabelScore:
        prompt = "".join(segments)
        answer = self._request("POST", "/v1/completions", {
            "model": self._info.get("id"), "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "logprobs": self.top_logprobs, "seed": 0})
        try:
            choice = answer["choices"][0]
            top = choice["logprobs"]["top_logprobs"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"the judge server's answer has no top logprobs ({exc}); does it support `logprobs`?") from exc
        raw: dict[str, float] = {label: 0.0 for label in LABELS}
        seen: set[str] = set()
        for token, logprob in top.items():
            for label, spellings in _SPELLINGS.items():
                if token in spellings:
                    raw[label] += math.exp(float(logprob))
                    seen.add(label)
        missing = [label for label in LABELS if label not in seen]
        if missing:
            raise JudgeError(f"label(s) {', '.join(missing)} not among the server's top {self.top_logprobs} "
                             f"next tokens; the model did not answer the forced choice")
        probs, mass = _renormalise(raw)
        usage = answer.get("usage") or {}
        self.calls += 1
        return LabelScore(probs=probs, label_mass=mass, prompt_tokens=int(usage.get("prompt_tokens") or 0))

    def close(self) -> None:
        self._tokenizer = None



def capability_n_ctx(entry: Any) -> int | None:
    """The n_ctx a capability entry vouches for: certified ``safe_context``, else ``max_ok_input`` rounded
    down to 256 (None when the entry has neither)."""
    if entry is None:
        return None
    if entry.certified and entry.safe_context:
        return int(entry.safe_context)
    if entry.max_ok_input:
        return int(entry.max_ok_input) // 256 * 256 or None
    return None


@dataclass(frozen=True)
class BackendChoice:
    """How a backend was chosen (for the CLI's report): where n_ctx came from."""

    n_ctx: int
    n_ctx_source: str


def resolve_n_ctx(model_path: Path, requested: int | None,
                  progress: Any = None) -> BackendChoice:
    """n_ctx for ``model_path`` on this device from the capability cache; ``requested`` may only lower it.

    With no request and no certified entry the probe runs first (with progress) rather than guess.
    With a request and no entry, the analytic bound (no model run) checks it is not beyond what fits.
    """
    from kvjudge.probe import ensure_capability, lookup_capability

    if requested is not None and requested < 64:
        raise JudgeError(f"--n-ctx {requested} is too small for a judge prompt; use at least 512")
    entry = lookup_capability(model_path)
    vouched = capability_n_ctx(entry)
    if requested is None:
        if vouched is None or entry.stale:
            entry = ensure_capability(model_path, certify=True, progress=progress)
            vouched = capability_n_ctx(entry)
        if vouched is None:
            raise JudgeError(f"the probe could not certify a context size for {model_path.name}; "
                             f"run `kvjudge probe --model {model_path}` and see why, or pass --n-ctx N")
        return BackendChoice(vouched, "capability cache (measured)")
    if vouched is not None:
        if requested > vouched:
            raise JudgeError(f"--n-ctx {requested} is over the certified context {vouched} for {model_path.name} "
                             f"on this device; use --n-ctx {vouched} or less")
        return BackendChoice(requested, "--n-ctx (within the certified context)")
    entry = ensure_capability(model_path, certify=False, progress=progress)
    if requested > entry.max_context_tokens:
        raise JudgeError(f"--n-ctx {requested} is over the {entry.max_context_tokens} tokens that fit "
                         f"{model_path.name} on this device (estimated); use a smaller --n-ctx")
    return BackendChoice(requested, "--n-ctx (within the estimated bound; not certified)")


def open_backend(*, model: str | Path | None = None, server: str | None = None, n_ctx: int | None = None,
                 threads: int | None = None, config: Any = None, progress: Any = None) -> Backend:
    """The judge's backend from CLI-style choices and the config's ``[judge]`` section.

    ``server`` (or ``[judge] server``) selects the OpenAI-compatible server; otherwise llama-cpp-python
    loads ``model`` (or ``[judge] model``, else the default judge model) with n_ctx from the capability
    cache (see :func:`resolve_n_ctx`).
    """
    from kvjudge.models import judge_model_path, resolve_model

    def setting(key: str, kind: type, value: Any) -> Any:
        if value is not None or config is None:
            return value
        return config.get(f"judge.{key}", kind)

    # An explicit --model means in-process, even when the config names a server.
    server = server if model is not None else setting("server", str, server)
    model = setting("model", str, model)
    threads = setting("threads", int, threads)
    if server:
        return ServerBackend(url=server, n_ctx=n_ctx, model_path=resolve_model(model) if model else None)
    path = resolve_model(model) if model else judge_model_path()
    choice = resolve_n_ctx(path, n_ctx, progress=progress)
    return LlamaBackend(model_path=path, n_ctx=choice.n_ctx, n_threads=threads, n_ctx_source=choice.n_ctx_source)
