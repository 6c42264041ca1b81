"""One OpenAI-compatible server over HTTP: the requests, their retries, and what the probe and the judge ask of it
(who it is, its tokenizer, one completion with logprobs).

Every failure is one of four errors, because callers treat them differently:

- :class:`~kvjudge.errors.ServerUnavailable`: connection refused or reset, a time-out, HTTP 429 or 5xx. Transient:
  retried here with exponential back-off and jitter (connection errors, 429, 5xx; a time-out is not retried on
  the same server — the same prompt would take as long again). Never a figure, never a score.
- :class:`~kvjudge.errors.AuthRefused`: HTTP 401/403, the credentials refused; never retried.
- :class:`~kvjudge.errors.ContextRefused`: the server refused the prompt as longer than its context.
- :class:`~kvjudge.errors.ServerError`: any other refusal, or an answer that is not JSON.

Every completion carries the caller's affinity key, if any, as the ``X-Session-ID`` header (what vllm-router's
``consistent_hash`` policy reads first, and SGLang's router likewise) and as the request's ``user`` field (the
OpenAI field the same policy reads from the body), so every call of one pair meets the replica that holds its prefix.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.errors import ServerError, ServerUnavailable, UsageError
from kvjudge.server_client.failures import answer_json, retryable
from kvjudge.server_client.identify import ServerInfo, identify
from kvjudge.server_client.lean import LeanHTTP, direct
from kvjudge.server_client.transport import HttpxTransport, Request, Transport
from kvjudge.settings import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    import httpx

    from kvjudge.server_client.auth import Credentials

# Identification is small: a dead server should not hold up `cache show` or a lookup for minutes.
IDENTIFY_TIMEOUT_S = 15.0
#: Where each family tokenizes, in the order they are tried: llama-cpp-python's route, then llama.cpp's and vLLM's.
TOKENIZE_ROUTES = ("/extras/tokenize", "/tokenize")
#: The header a router's session-affinity policy reads (vllm-router's consistent_hash: first of its list).
AFFINITY_HEADER = "X-Session-ID"


@dataclass(frozen=True)
class RetryPolicy:
    """Tries per request on transient failures, and the back-off between them (random exponential: jitter)."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"a request needs at least one try, got {self.attempts}")


class Answer(dict):  # type: ignore[type-arg]
    """A completion's JSON, with how many tries it took (1: no retry) and the seconds they took together."""

    tries: int = 1
    seconds: float = 0.0


def normalize_url(url: str) -> str:
    """``http://host:port`` without a trailing ``/`` or ``/v1`` (the API paths are added per request)."""
    text = (url or "").strip().rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    if not re.match(r"^https?://[^/\s]+", text):
        raise UsageError(f"server URL {url!r} is not an http(s) URL; pass e.g. http://gpu-box:8080")
    return text


class ServerClient:
    """HTTP to one server (thread-safe: the judge's pool sends from several threads). ``credentials``: the API key
    sent with every request (:class:`~kvjudge.server_client.auth.Credentials`)."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy = RetryPolicy(),
                 transport: httpx.BaseTransport | None = None, credentials: Credentials | None = None) -> None:
        if timeout_s <= 0:
            raise UsageError(f"the request time-out must be positive, got {timeout_s}")
        self.url = normalize_url(url)
        self.timeout_s = float(timeout_s)
        self.retry = retry
        self.credentials = credentials
        self.requests_sent = 0  # every try, retries included
        headers = credentials.headers() if credentials is not None else {}
        self._http: Transport = HttpxTransport(self.url, self.timeout_s, headers, transport)
        # Where nothing stands between (plain http, no proxy, no transport of a test's), identification and tokenize
        # requests (one per text counted) go over a lean keep-alive connection per thread: on a full `eval` it saves
        # a tenth of the wall time, and more of a re-run whose verdicts are cached (benchmarks/http_client.py).
        self._lean: Transport | None = LeanHTTP(self.url, headers) if transport is None and direct(self.url) else None
        self._tokenize_route: str | None = None
        self._token_offset: int | None = None
        self._model_id: str | None = None
        self._kind: str | None = None  # the server family, once identify has found it

    # -- transport -------------------------------------------------------------------------------------------
    def _once(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float | None,
              headers: dict[str, str] | None) -> Any:
        lean = self._lean is not None and not headers and (method == "GET" or path in TOKENIZE_ROUTES)
        transport = self._lean if lean and self._lean is not None else self._http
        self.requests_sent += 1
        response = transport.handle(Request(method, path, body, self.timeout_s if timeout_s is None else timeout_s,
                                            headers or {}))
        return answer_json(self.url, path, response.status, response.content, self.credentials)

    def exchange(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
                 timeout_s: float | None = None, headers: dict[str, str] | None = None) -> tuple[Any, int]:
        """One request and the tries it took; transient failures are retried (``retry``) with exponential back-off
        and jitter."""
        # The first try goes without tenacity (its loop costs about a tenth of a millisecond of CPU a request, and
        # counting sends requests by the thousand); after a transient failure tenacity takes over as from that try.
        try:
            return self._once(method, path, body, timeout_s, headers), 1
        except ServerUnavailable as exc:
            if not retry or not retryable(exc) or self.retry.attempts == 1:
                raise
            failed: ServerUnavailable | None = exc
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

        tries = 1

        def attempt() -> Any:
            nonlocal failed, tries
            if failed is not None:  # tenacity's first try is the one that failed above
                first, failed = failed, None
                raise first
            tries += 1
            return self._once(method, path, body, timeout_s, headers)

        retrying = Retrying(retry=retry_if_exception(retryable), stop=stop_after_attempt(self.retry.attempts),
                            wait=wait_random_exponential(multiplier=self.retry.backoff_s,
                                                         max=self.retry.max_backoff_s), reraise=True)
        return retrying(attempt), tries

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
                timeout_s: float | None = None) -> Any:
        """One request's JSON (:meth:`exchange` without the count of tries)."""
        return self.exchange(method, path, body, retry=retry, timeout_s=timeout_s)[0]

    def optional(self, path: str, timeout_s: float) -> Any:
        """A GET that some server families do not have: None when it is missing or refused."""
        try:
            return self.request("GET", path, retry=False, timeout_s=timeout_s)
        except ServerError as exc:
            if isinstance(exc, ServerUnavailable) and exc.reason == "connection":
                raise
            return None

    # -- identity --------------------------------------------------------------------------------------------
    def identify(self, *, timeout_s: float = IDENTIFY_TIMEOUT_S) -> ServerInfo:
        """The served model and the server family, version and context size (no prompt is run)."""
        info = identify(self, timeout_s)
        self._model_id, self._kind = info.model_id, info.kind
        return info

    # -- tokenizer -------------------------------------------------------------------------------------------
    def _tokenize_once(self, route: str, text: str) -> list[Any]:
        if route == "/extras/tokenize":  # llama-cpp-python (adds BOS; the offset removes it)
            body: dict[str, Any] = {"input": text}
        elif route == "/tokenize":  # llama.cpp ("content") and vLLM ("prompt"): the text once, when the kind is known
            body = {"add_special": False, "add_special_tokens": False}
            if self._kind != "vllm":
                body["content"] = text
            if self._kind != "llama.cpp":
                body["prompt"] = text
            if self._model_id is not None:
                body["model"] = self._model_id
        else:
            raise UsageError(f"unknown tokenize route {route}")
        answer = self.request("POST", route, body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise ServerError(f"the server {self.url}{route} answered no token list")
        return tokens  # ids, or {"id", "piece"} objects (llama.cpp with pieces)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the served model's own tokenizer (the route is found once)."""
        return [t if isinstance(t, int) else int(t.get("id", -1)) if isinstance(t, dict) else -1
                for t in self._tokens(text)]

    def _tokens(self, text: str) -> list[Any]:
        """The server's token list for ``text``, as it answered it."""
        routes = [self._tokenize_route] if self._tokenize_route else list(TOKENIZE_ROUTES)
        last: ServerError | None = None
        for route in routes:
            try:
                tokens = self._tokenize_once(route, text)
            except ServerUnavailable:
                raise
            except ServerError as exc:
                last = exc
                continue
            self._tokenize_route = route
            return tokens
        raise ServerError(f"the server {self.url} has no tokenize endpoint ({last}); pass a local copy of the "
                          f"served GGUF (--tokenizer-model / --model) so kvjudge can count tokens")

    def count(self, text: str) -> int:
        """Tokens of ``text`` as one piece of a prompt (without the BOS some servers add to every tokenization)."""
        if self._token_offset is None:
            self._token_offset = len(self._tokens(""))
        return max(0, len(self._tokens(text)) - self._token_offset)  # only how many: no id is looked at

    # -- completions -----------------------------------------------------------------------------------------
    def _generate(self, path: str, body: dict[str, Any], affinity: str | None, timeout_s: float | None) -> Answer:
        headers = None
        if affinity is not None:
            body["user"] = affinity
            headers = {AFFINITY_HEADER: affinity}
        started = time.perf_counter()
        answer, tries = self.exchange("POST", path, body, timeout_s=timeout_s, headers=headers)
        result = Answer(answer if isinstance(answer, dict) else {})
        result.tries, result.seconds = tries, time.perf_counter() - started
        return result

    def complete(self, prompt: str, *, model: str | None = None, max_tokens: int = 1, logprobs: int | None = None,
                 timeout_s: float | None = None, affinity: str | None = None) -> Answer:
        """``/v1/completions`` at temperature 0 (``logprobs``: top-N per token; ``affinity``: the session key)."""
        body: dict[str, Any] = {"model": model or self._model_id, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0.0, "seed": 0}
        if logprobs is not None:
            body["logprobs"] = logprobs
        return self._generate("/v1/completions", body, affinity, timeout_s)

    def chat(self, messages: list[dict[str, str]], *, model: str | None = None, max_tokens: int = 1,
             top_logprobs: int | None = None, timeout_s: float | None = None, affinity: str | None = None) -> Answer:
        """``/v1/chat/completions`` at temperature 0 (the server applies its chat template)."""
        body: dict[str, Any] = {"model": model or self._model_id, "messages": messages, "max_tokens": max_tokens,
                                "temperature": 0.0, "seed": 0}
        if top_logprobs is not None:
            body.update({"logprobs": True, "top_logprobs": top_logprobs})
        return self._generate("/v1/chat/completions", body, affinity, timeout_s)

    def close(self) -> None:
        self._http.close()
        if self._lean is not None:
            self._lean.close()


class ServerTokenCounter:
    """A :class:`~kvjudge.tokens.TokenCounter` that asks the server (when no local copy of the GGUF exists)."""

    def __init__(self, client: ServerClient, model_id: str) -> None:
        self.client = client
        self._name = f"server:{model_id}"

    @property
    def name(self) -> str:
        return self._name

    def count(self, text: str) -> int:
        return self.client.count(text)
