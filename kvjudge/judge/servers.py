"""Judge servers: OpenAI-compatible servers (llama.cpp, llama-cpp-python, vLLM) as judge backends, alone or pooled.

:class:`ServerBackend` asks one server for one token at temperature 0 with the top-N logprobs — through the
completions API (``logprobs.top_logprobs``) for the raw framing, or, for the chat framing, the chat completions
API (``logprobs.content[0].top_logprobs``): the server applies the chat template to the user message itself —
and reads the labels from them. A label missing from the top N is an error, never a guess; vLLM's cap on
``logprobs`` (20 by default) is respected.

:class:`ServerPool` spreads many calls over several servers of the same model: ``parallel`` requests in flight
per server, each request retried with back-off on connection errors, 429 and 5xx (see
:mod:`kvjudge.server_client`). It takes the calls as they are prepared (the caller prepares the next pair while
requests are in flight), and sends the two orders of a pair to the same server one after the other, so that the
server's prompt cache can reuse what they share (instructions and the block of text common to both runs). A server that stops accepting connections is dropped and its requests go to the
others (as is one whose calls keep failing after their retries); a request that failed on every live server is an
``error`` outcome, never a score. Neither the cache keys nor the manifest name a server, so a pool's verdicts are
keyed exactly as one server's.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge._llama import chat_template_inputs
from kvjudge.errors import (
    AuthRefused,
    CapabilityMissing,
    ContextRefused,
    JudgeError,
    ServerError,
    ServerUnavailable,
    UsageError,
)
from kvjudge.judge.affinity import affinity_key
from kvjudge.judge.labels import (
    LABELS,
    SPELLINGS,
    LabelScore,
    PromptOverflow,
    ResultFn,
    renormalise,
    score_in_turn,
)
from kvjudge.judge.ledger import CallCost, Ledger
from kvjudge.judge.prompt import Framing, Prompt, TemplateText, choose_framing, user_message
from kvjudge.judge.scale import Scale
from kvjudge.settings import DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S
from kvjudge.server_client import (
    Answer,
    Credentials,
    RetryPolicy,
    ServerClient,
    ServerInfo,
    ServerTokenCounter,
    normalize_url,
    usage_of,
)
from kvjudge.server_client.failures import retryable

if TYPE_CHECKING:
    from kvjudge.tokens import ModelTokenizer

DEFAULT_TOP_LOGPROBS = 20
VLLM_MAX_LOGPROBS = 20  # vLLM refuses more unless started with a larger --max-logprobs
# A server whose calls failed this many times in a row (each after its retries) is dropped from the pool.
DROP_AFTER_FAILURES = 3
# Text whose tokenization decides whether a local GGUF is the served model's tokenizer.
_TOKENIZER_CHECK = "kvjudge tokenizer check: def f(x): return x ** 2  # ü, ß, 東京, <<<END RUN A>>>\n"


def top_logprobs(answer: Any) -> dict[str, float]:
    """The first generated token's top logprobs, ``{token text: logprob}``, from either answer shape.

    Completions API: ``choices[0].logprobs.top_logprobs[0]`` is a ``{token: logprob}`` map (vLLM,
    llama-cpp-python, OpenAI). Chat completions API (and llama.cpp's newer completions): ``choices[0].logprobs
    .content[0].top_logprobs`` is a list of ``{"token", "logprob", …}``. Raises JudgeError when neither is there.
    """
    try:
        choice = answer["choices"][0]
        logprobs = choice["logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise JudgeError(f"the judge server's answer has no logprobs ({type(exc).__name__}: {exc}); does it "
                         f"support `logprobs`?") from exc
    if not isinstance(logprobs, Mapping):
        raise JudgeError("the judge server's answer has no logprobs; does it support `logprobs`?")
    content = logprobs.get("content")
    if isinstance(content, list):
        if not content:
            reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
            raise JudgeError(f"the judge server generated no token to read (finish_reason {reason!r}); the model "
                             f"ended its answer at once")
        entries = content[0].get("top_logprobs") if isinstance(content[0], Mapping) else None
        if not isinstance(entries, list):
            raise JudgeError("the judge server's answer has no top_logprobs for its first token")
        return {str(e["token"]): float(e["logprob"]) for e in entries if isinstance(e, Mapping) and "token" in e}
    tops = logprobs.get("top_logprobs")
    if isinstance(tops, list) and tops and isinstance(tops[0], Mapping):
        return {str(token): float(value) for token, value in tops[0].items()}
    raise JudgeError("the judge server's answer has no top logprobs for its first token; does it support "
                     "`logprobs`?")


def label_score(top: Mapping[str, float], *, top_n: int, prompt_tokens: int, server: str | None = None,
                scale: Scale | None = None) -> LabelScore:
    """Label probabilities from a top-logprobs map (each label's spellings summed; a missing label is an error).
    On a ``scale`` a level missing from the top N has probability 0 there, and too little mass is an error."""
    if scale is not None:
        levels = {level: 0.0 for level in scale.levels}
        for token, logprob in top.items():
            for level in scale.levels:
                if token in scale.spellings(level) and math.isfinite(logprob):
                    levels[level] += math.exp(logprob)
        probs, mass = scale.read(levels)
        return LabelScore(probs=probs, label_mass=mass, prompt_tokens=prompt_tokens, server=server)
    raw = {label: 0.0 for label in LABELS}
    seen: set[str] = set()
    for token, logprob in top.items():
        for label, spellings in SPELLINGS.items():
            if token in spellings and math.isfinite(logprob):
                raw[label] += math.exp(logprob)
                seen.add(label)
    missing = [label for label in LABELS if label not in seen]
    if missing:
        raise JudgeError(f"label(s) {', '.join(missing)} not among the server's top {top_n} next tokens; the model "
                         f"did not answer the forced choice")
    probs, mass = renormalise(raw)
    return LabelScore(probs=probs, label_mass=mass, prompt_tokens=prompt_tokens, server=server)


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


def local_tokenizer(info: ServerInfo, client: ServerClient, model_path: str | Path | None = None) -> Any:
    """A local tokenizer for the served model: ``model_path`` (a copy of the served GGUF), else the served file
    itself when it is readable here and tokenizes like the server. None: count with the server."""
    from kvjudge.tokens import ModelTokenizer

    if model_path is not None:
        return ModelTokenizer(model_path)
    if not info.model_path or not Path(info.model_path).is_file():
        return None
    candidate = ModelTokenizer(info.model_path)
    try:
        served = client.tokenize(_TOKENIZER_CHECK)
        offset = len(client.tokenize(""))
    except ServerError:
        return None
    # A file of the same name on this host is only the served model if it tokenizes the same way.
    return candidate if served[offset:] == candidate.tokenize(_TOKENIZER_CHECK) else None


def _timed(call: Callable[[Sequence[str], Scale | None, str | None], LabelScore], segments: Sequence[str],
           scale: Scale | None, affinity: str | None) -> tuple[LabelScore, float]:
    started = time.perf_counter()
    return call(segments, scale, affinity), time.perf_counter() - started


@dataclass
class _Job:
    """One prompt of a group: ``group`` and ``position`` name it to the caller; ``then`` is the group's next prompt,
    sent when this one is settled, to the server that settled it (``prefer``) while that server is live."""

    group: int
    position: int
    segments: Sequence[str]
    affinity: str | None = None
    scale: Scale | None = None
    then: _Job | None = None
    prefer: str | None = None
    tried: set[str] = field(default_factory=set)
    last_failure: str = ""


def _chain(group: int, prompts: Sequence[Prompt]) -> _Job | None:
    """The group's prompts as jobs, each followed by the next."""
    first: _Job | None = None
    key = affinity_key(prompts) if prompts else None
    for position in reversed(range(len(prompts))):
        first = _Job(group, position, prompts[position].segments, key, prompts[position].scale, then=first)
    return first


InFlight = dict["Future[tuple[LabelScore, float]]", "tuple[_Job, ServerBackend]"]


class ServerPool:
    """Several servers of one model as one judge backend (the Backend protocol, plus :meth:`score_many`).

    Every server must serve the same model id with the same backend kind and version (so every answer carries
    the same manifest). ``n_ctx`` is the judge's window on all of them.
    """

    window_fixed = True

    def __init__(self, backends: Sequence[ServerBackend], *, parallel: int = DEFAULT_PARALLEL,
                 tokenizer: ModelTokenizer | None = None, dropped: Mapping[str, str] | None = None) -> None:
        if not backends:
            raise JudgeError("no judge server is reachable; start one or check the URLs")
        if parallel < 1:
            raise UsageError(f"--parallel must be at least 1, got {parallel}")
        identities = {(b.info.model_id, b.info.kind, b.info.version) for b in backends if b.info is not None}
        if len(identities) != 1:
            listing = "; ".join(f"{b.url}: {b.info.model_id} ({b.info.kind} {b.info.version})" for b in backends
                                if b.info is not None)
            raise UsageError(f"the judge servers serve different models or versions ({listing}); a pool must serve "
                             f"one model with one server version")
        windows = {b.n_ctx for b in backends}
        if len(windows) != 1:
            raise UsageError(f"the judge servers were opened with different n_ctx ({sorted(windows)}); open them "
                             f"with one window")
        for backend in backends:
            backend.tokenizer = tokenizer if tokenizer is not None else backend.tokenizer
        self.backends = list(backends)
        self.parallel = parallel
        self.n_ctx = backends[0].n_ctx
        self.slack_tokens = backends[0].slack_tokens
        self.dropped: dict[str, str] = dict(dropped or {})
        self.resent = 0
        self.failed_tries = Ledger()  # tries that failed on a server before another answered (no tokens)
        self._failures: dict[str, int] = {}  # calls in a row that failed transiently, per server
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.backends]

    @property
    def servers(self) -> list[str]:
        return self.urls

    @property
    def model_path(self) -> Path | None:
        tokenizer = self.backends[0].tokenizer
        return None if tokenizer is None else tokenizer.path

    @property
    def counter_name(self) -> str:
        return self.backends[0].counter_name

    @property
    def live(self) -> list[ServerBackend]:
        return [b for b in self.backends if b.url not in self.dropped]

    @property
    def calls(self) -> int:
        return sum(b.calls for b in self.backends)

    @property
    def ledger(self) -> Ledger:
        """Every answered call of the pool's servers, and the tries that failed before a server answered."""
        total = Ledger()
        for backend in self.backends:
            total.merge(backend.ledger)
        total.merge(self.failed_tries)
        return total

    @property
    def tokens_saved(self) -> int:
        return sum(b.tokens_saved for b in self.backends)

    @property
    def label_limit(self) -> int:
        return self.backends[0].label_limit

    def manifest(self) -> dict[str, Any]:
        return self.backends[0].manifest()

    def framing(self, choice: str = "auto") -> Framing:
        return self.backends[0].framing(choice)

    def resize(self, n_ctx: int, *, source: str | None = None) -> None:
        self.backends[0].resize(n_ctx, source=source)

    @property
    def certified(self) -> bool:
        """The window was vouched for by every server's certified capability entry."""
        return self.backends[0].certified

    def measure_prefill(self, n_tokens: int = 256) -> float:
        raise JudgeError("the prefill speed of judge servers is not measured here")

    def count_prompt(self, segments: Sequence[str]) -> int:
        return sum(self.count(segment) for segment in segments)

    def _drop(self, url: str, reason: str) -> None:
        with self._lock:
            self.dropped.setdefault(url, reason)

    def count(self, text: str) -> int:
        """Tokens of ``text`` (the local tokenizer, else the first live server that answers)."""
        failures: list[str] = []
        for backend in self.live:
            if backend.tokenizer is not None:
                return backend.tokenizer.count(text)
            try:
                return backend.client.count(text)
            except ServerUnavailable as exc:
                failures.append(str(exc))
                if exc.reason == "connection":
                    self._drop(backend.url, str(exc))
            except ServerError as exc:
                raise JudgeError(f"cannot count tokens: {exc}") from exc
        raise JudgeError(f"no judge server could count tokens ({'; '.join(failures) or 'none is live'})")

    def score(self, segments: Sequence[str], shared: int = 0, scale: Scale | None = None) -> LabelScore:
        """One call through the pool (failover included)."""
        results: list[tuple[LabelScore | None, JudgeError | None]] = []
        self.score_many([[Prompt(segments, shared, scale)]],
                        lambda _g, _p, score, error, _url, _s: results.append((score, error)))
        score, error = results[0]
        if error is not None:
            raise error
        assert score is not None
        return score

    def score_many(self, groups: Iterable[Sequence[Prompt]], on_result: ResultFn) -> None:
        """Score every prompt of every group; ``on_result(group, position, score, error, server, seconds)`` is called
        once per prompt, in this thread.

        Up to ``parallel`` requests per live server are in flight; groups are taken from ``groups`` while fewer than
        that many requests wait to be sent, so preparing the next groups overlaps the requests in flight. A group's
        prompts go one after the other to the server that answered the first (while it is live). A request whose
        server cannot be reached (after the client's retries) goes to a live server that has not tried it; the
        unreachable server is dropped. When every live server has tried it, it fails with the last failure: an
        error, never a score.
        """
        source: Iterator[tuple[int, Sequence[Prompt]]] = iter(enumerate(groups))
        more = True
        ready: deque[_Job] = deque()
        in_flight: InFlight = {}
        busy: dict[str, int] = {b.url: 0 for b in self.backends}
        workers = max(1, self.parallel * len(self.backends))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvjudge-judge") as executor:
            while True:
                self._dispatch(executor, ready, in_flight, busy)
                done = [future for future in in_flight if future.done()]
                if not done and more and len(ready) < workers:
                    pulled = next(source, None)  # prepares the group: the requests in flight go on meanwhile
                    if pulled is None:
                        more = False
                    elif (first := _chain(*pulled)) is not None:
                        ready.append(first)
                    continue
                if not done and in_flight:
                    done = list(wait(list(in_flight), return_when=FIRST_COMPLETED)[0])
                for future in done:
                    job, backend = in_flight.pop(future)
                    busy[backend.url] -= 1
                    self._settle(job, backend, future, ready, on_result)
                if done:
                    continue
                if ready:  # nothing could be sent: no live server is left that has not tried them
                    job = ready.popleft()
                    self._finish(job, None, JudgeError(self._gave_up(job)), None, 0.0, ready, on_result)
                    continue
                if not more:
                    return

    def _dispatch(self, executor: ThreadPoolExecutor, ready: deque[_Job], in_flight: InFlight,
                  busy: dict[str, int]) -> None:
        # Round-robin over the live servers, one request at a time, so the first server does not take every slot.
        live = {b.url for b in self.live}
        progress = True
        while ready and progress:
            progress = False
            for backend in self.live:
                if busy[backend.url] >= self.parallel:
                    continue
                job = next((j for j in ready if backend.url not in j.tried
                            and (j.prefer in (None, backend.url) or j.prefer not in live)), None)
                if job is None:
                    continue
                ready.remove(job)
                busy[backend.url] += 1
                in_flight[executor.submit(_timed, backend.request_score, job.segments, job.scale,
                                          job.affinity)] = (job, backend)
                progress = True

    def _finish(self, job: _Job, score: LabelScore | None, failure: JudgeError | None, url: str | None,
                seconds: float, ready: deque[_Job], on_result: ResultFn) -> None:
        """Report ``job``'s outcome, and put the group's next prompt first in line, for the same server."""
        on_result(job.group, job.position, score, failure, url, seconds)
        if job.then is not None:
            job.then.prefer = url
            ready.appendleft(job.then)

    def _settle(self, job: _Job, backend: ServerBackend, future: Future[tuple[LabelScore, float]],
                ready: deque[_Job], on_result: ResultFn) -> None:
        try:
            score, seconds = future.result()
        except AuthRefused:
            raise  # the credentials: a setting to fix, for every call alike (the command stops with one line)
        except ServerUnavailable as exc:
            job.tried.add(backend.url)
            job.last_failure = str(exc)
            for _ in range(backend.retry.attempts if retryable(exc) else 1):
                self.failed_tries.failed_try()
            self._failures[backend.url] = self._failures.get(backend.url, 0) + 1
            if exc.reason == "connection":
                self._drop(backend.url, str(exc))
            elif self._failures[backend.url] >= DROP_AFTER_FAILURES:
                # Alive but failing every call (5xx, 429, time-outs after retries): stop feeding it.
                self._drop(backend.url, f"{DROP_AFTER_FAILURES} calls in a row failed; last: {exc}")
            if any(b.url not in job.tried for b in self.live):
                self.resent += 1
                job.prefer = None
                ready.appendleft(job)  # first in line: it has waited longest
            else:
                self._finish(job, None, JudgeError(self._gave_up(job)), None, 0.0, ready, on_result)
            return
        except JudgeError as exc:  # a refusal, an overflow, a missing label: the same on every server
            self._finish(job, None, exc, backend.url, 0.0, ready, on_result)
            return
        except Exception as exc:  # noqa: BLE001 - a bug or a runtime crash is an outcome, never a score
            failure = JudgeError(f"the judge backend failed ({type(exc).__name__}: {exc})")
            self._finish(job, None, failure, backend.url, 0.0, ready, on_result)
            return
        self._failures[backend.url] = 0
        self._finish(job, score, None, backend.url, seconds, ready, on_result)

    def _gave_up(self, job: _Job) -> str:
        tried = ", ".join(sorted(job.tried)) or "none"
        return (f"every judge server failed this call (tried: {tried}; last: "
                f"{job.last_failure or 'no live server left'})")

    def stats(self) -> dict[str, Any]:
        """For the summary: the servers, those dropped and why, requests sent elsewhere, calls answered."""
        return {"servers": self.urls, "dropped": dict(self.dropped), "resent": self.resent,
                "calls": {b.url: b.calls for b in self.backends}, "parallel": self.parallel,
                "ledger": self.ledger.to_json()}

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


# The n_ctx sources that mean every server's entry vouched for the window.
CERTIFIED_SOURCES = ("capability cache (measured on the server)", "--n-ctx (within the certified context)")


def _vouched_n_ctx(entry: Any) -> int | None:
    """The judge window a served entry vouches for: its certified ``safe_context``."""
    return int(entry.safe_context) if entry is not None and entry.certified and entry.safe_context else None


def _pool_n_ctx(infos: Sequence[ServerInfo], requested: int | None, cache_path: str | Path | None,
                staleness_days: float | None, credentials: Credentials | None = None) -> tuple[int, str]:
    """The judge window on every server: the certified one from each server's capability entry (the smallest),
    or ``requested``, which may only lower it (and without an entry stays within the reported context)."""
    from kvjudge.probe import lookup_served

    if requested is not None and requested < 64:
        raise JudgeError(f"--n-ctx {requested} is too small for a judge prompt; use at least 512")
    vouched: list[int] = []
    for info in infos:
        found = lookup_served(info.url, cache_path=cache_path, staleness_days=staleness_days, identified=info,
                              credentials=credentials)
        entry = found.entry
        window = _vouched_n_ctx(entry)
        if entry is not None and not entry.stale and window is not None:
            vouched.append(window)
            continue
        if requested is None:
            state = "stale" if entry is not None and entry.stale else "not certified" if entry is not None else \
                "missing"
            why = f": {found.reason}" if entry is None and found.reason not in ("", "no entry") else ""
            raise CapabilityMissing(f"no {'fresh ' if state == 'stale' else ''}probe figure for the model served at "
                                    f"{info.url} (entry {state}{why}); run `kvjudge probe --server {info.url}`, or "
                                    f"pass --n-ctx N to judge within its reported context")
        if info.n_ctx is not None and requested > info.n_ctx:
            raise JudgeError(f"--n-ctx {requested} is over the {info.n_ctx} tokens served at {info.url}")
    if requested is None:
        return min(vouched), "capability cache (measured on the server)"
    if vouched and requested > min(vouched):
        raise JudgeError(f"--n-ctx {requested} is over the certified context {min(vouched)} of the judge servers; "
                         f"use --n-ctx {min(vouched)} or less")
    certified = len(vouched) == len(infos)
    return requested, "--n-ctx (within the certified context)" if certified else "--n-ctx (not certified)"


def open_servers(urls: Sequence[str], *, n_ctx: int | None = None, tokenizer_model: str | Path | None = None,
                 parallel: int = DEFAULT_PARALLEL, timeout_s: float = DEFAULT_TIMEOUT_S, top_logprobs: int = DEFAULT_TOP_LOGPROBS, retry: RetryPolicy | None = None,
                 cache_path: str | Path | None = None, staleness_days: float | None = None,
                 on_drop: Callable[[str, str], None] | None = None,
                 credentials: Credentials | None = None) -> ServerPool:
    """A :class:`ServerPool` over ``urls``: each identified, checked to serve one model, windowed from the
    capability cache (``kvjudge probe --server``) or ``n_ctx``. A server unreachable now is dropped (``on_drop``
    hears of it); none reachable is an error."""
    if not urls:
        raise UsageError("name at least one judge server (--server URL or [judge] servers)")
    if len({normalize_url(url) for url in urls}) != len(urls):
        raise UsageError(f"a judge server is named twice ({', '.join(urls)}); use --parallel for more requests "
                         f"per server")
    retry = retry or RetryPolicy()
    infos: list[ServerInfo] = []
    dropped: dict[str, str] = {}
    for url in urls:
        client = ServerClient(url, timeout_s=timeout_s, retry=retry, credentials=credentials)
        try:
            infos.append(client.identify())
        except ServerUnavailable as exc:
            dropped[client.url] = str(exc)
            if on_drop is not None:
                on_drop(client.url, str(exc))
        except ServerError as exc:
            raise JudgeError(f"cannot use the judge server {client.url}: {exc}") from exc
        finally:
            client.close()
    if not infos:
        raise JudgeError(f"no judge server is reachable ({'; '.join(dropped.values())})")
    window, source = _pool_n_ctx(infos, n_ctx, cache_path, staleness_days, credentials)
    backends = [ServerBackend(url=info.url, n_ctx=window, n_ctx_source=source, info=info,
                              top_logprobs=top_logprobs, timeout_s=timeout_s, retry=retry, credentials=credentials)
                for info in infos]
    first = backends[0]
    assert first.info is not None
    tokenizer = local_tokenizer(first.info, first.client, tokenizer_model)
    return ServerPool(backends, parallel=parallel, tokenizer=tokenizer, dropped=dropped)
