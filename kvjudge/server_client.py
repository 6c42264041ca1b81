"""One OpenAI-compatible model server over HTTP: llama.cpp's ``llama-server``, llama-cpp-python's server, vLLM.

What the probe and the judge both need from a served model: who it is (:meth:`ServerClient.identify`), its
tokenizer (:meth:`ServerClient.tokenize`) and one completion with logprobs (:meth:`ServerClient.complete`,
:meth:`ServerClient.chat`). Every failure is one of three errors, because callers treat them differently:

- :class:`~kvjudge.errors.ServerUnavailable`: connection refused or reset, a time-out, HTTP 429 or 5xx. Transient:
  retried here with exponential back-off and jitter (connection errors, 429, 5xx; a time-out is not retried on
  the same server — the same prompt would take as long again). Never a figure, never a score.
- :class:`~kvjudge.errors.ContextRefused`: the server refused the prompt as longer than its context — a measured
  overflow (llama.cpp, llama-cpp-python and vLLM each word it differently; the context size is read from it).
- :class:`~kvjudge.errors.ServerError`: any other refusal, or an answer that is not JSON.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import ContextRefused, ServerError, ServerUnavailable, UsageError
from kvjudge.settings import DEFAULT_TIMEOUT_S

CONNECT_TIMEOUT_S = 10.0
# Identification is small: a dead server should not hold up `cache show` or a lookup for minutes.
IDENTIFY_TIMEOUT_S = 15.0

if TYPE_CHECKING:
    import httpx

KINDS = ("llama.cpp", "llama-cpp-python", "vllm", "openai-compatible")
#: Where each family tokenizes, in the order they are tried: llama-cpp-python's route, then llama.cpp's and vLLM's.
TOKENIZE_ROUTES = ("/extras/tokenize", "/tokenize")

# How each server family words a context-length refusal, and where it puts the numbers.
_CONTEXT_PATTERNS = (
    re.compile(r"context_length_exceeded|exceed_context_size|maximum context length|exceeds? (?:the )?"
               r"(?:available )?context|context window|context size|too many tokens", re.IGNORECASE),
)
_N_CTX_PATTERNS = (
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),       # vLLM, llama-cpp-python
    re.compile(r"context window of (\d+)", re.IGNORECASE),               # llama-cpp-python (raw)
)
_PROMPT_PATTERNS = (
    re.compile(r"\((\d+) in (?:the messages|your prompt|the prompt)", re.IGNORECASE),
    re.compile(r"Requested tokens \((\d+)\)", re.IGNORECASE),
)


@dataclass(frozen=True)
class RetryPolicy:
    """Tries per request on transient failures, and the back-off between them (random exponential: jitter)."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"a request needs at least one try, got {self.attempts}")


@dataclass(frozen=True)
class ServerInfo:
    """Who a server is: what identifies a served model in the capability cache and in every verdict.

    ``n_ctx`` is the context the server says it serves (None when it does not say: llama-cpp-python's server);
    ``n_ctx_source`` says where it came from. ``model_path`` is the served file when the server names one.
    """

    url: str
    model_id: str
    kind: str
    version: str | None
    n_ctx: int | None
    n_ctx_source: str | None
    model_path: str | None = None
    n_ctx_train: int | None = None
    chat_template: str | None = None   # the template's source, where the server publishes it (llama.cpp)
    models: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "model_id": self.model_id, "kind": self.kind, "version": self.version,
                "n_ctx": self.n_ctx, "n_ctx_source": self.n_ctx_source, "model_path": self.model_path,
                "n_ctx_train": self.n_ctx_train, "chat_template": bool(self.chat_template),
                "models": list(self.models)}


def normalize_url(url: str) -> str:
    """``http://host:port`` without a trailing ``/`` or ``/v1`` (the API paths are added per request)."""
    text = (url or "").strip().rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    if not re.match(r"^https?://[^/\s]+", text):
        raise UsageError(f"server URL {url!r} is not an http(s) URL; pass e.g. http://gpu-box:8080")
    return text


def _detail(content: bytes) -> tuple[str, dict[str, Any]]:
    """The error message of a refusal's body (OpenAI's ``{"error": {"message": …}}``, FastAPI's ``detail``), and
    its error object."""
    try:
        body = json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")[:300].replace("\n", " "), {}
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error), error
    if isinstance(body, dict) and "message" in body:
        return str(body["message"]), body
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"]), body
    return str(body)[:300], {}


def context_refusal(message: str, error: dict[str, Any] | None = None) -> ContextRefused | None:
    """A :class:`ContextRefused` when ``message`` (and the error object) says the prompt exceeds the context."""
    error = error or {}
    code = f"{error.get('code', '')} {error.get('type', '')}"
    if not any(p.search(message) or p.search(code) for p in _CONTEXT_PATTERNS):
        return None
    n_ctx = error.get("n_ctx") if isinstance(error.get("n_ctx"), int) else None  # llama.cpp's own fields
    prompt = error.get("n_prompt_tokens") if isinstance(error.get("n_prompt_tokens"), int) else None
    for pattern in _N_CTX_PATTERNS:
        if n_ctx is None and (match := pattern.search(message)):
            n_ctx = int(match.group(1))
    for pattern in _PROMPT_PATTERNS:
        if prompt is None and (match := pattern.search(message)):
            prompt = int(match.group(1))
    return ContextRefused(message, n_ctx=n_ctx, prompt_tokens=prompt)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ServerUnavailable) and exc.reason != "timeout"


class ServerClient:
    """HTTP to one server (thread-safe: the judge's pool sends from several threads)."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy = RetryPolicy(),
                 transport: httpx.BaseTransport | None = None) -> None:
        if timeout_s <= 0:
            raise UsageError(f"the request time-out must be positive, got {timeout_s}")
        self.url = normalize_url(url)
        self.timeout_s = float(timeout_s)
        self.retry = retry
        self.requests_sent = 0  # every try, retries included
        self._transport = transport
        self._http: httpx.Client | None = None  # made on first use (its import and set-up take a tenth of a second)
        self._http_lock = threading.Lock()
        # Where nothing stands between (plain http, no proxy, no transport of a test's), the identification requests
        # and tokenize requests (one per text counted; the search for the route, refusals included) go over a lean
        # keep-alive connection per thread: a command that only identifies a server, counts with it or finds its
        # verdicts cached never loads httpx (a tenth of a second to import, another to make its client).
        self._lean = _LeanHTTP(self.url) if transport is None and _direct(self.url) else None
        self._tokenize_route: str | None = None
        self._token_offset: int | None = None
        self._model_id: str | None = None
        self._kind: str | None = None  # the server family, once identify has found it

    # -- transport -------------------------------------------------------------------------------------------
    def _client(self) -> httpx.Client:
        """The httpx client, made on first use (from several threads: once)."""
        with self._http_lock:
            if self._http is None:
                import httpx  # here, not above: a command that talks to no server (a listing) never pays for it

                self._http = httpx.Client(base_url=self.url, transport=self._transport, timeout=httpx.Timeout(
                    self.timeout_s, connect=min(self.timeout_s, CONNECT_TIMEOUT_S)))
            return self._http

    def _once(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float | None) -> Any:
        if self._lean is not None and (method == "GET" or path in TOKENIZE_ROUTES):
            self.requests_sent += 1
            status, content = self._lean.request(method, path, body,
                                                 self.timeout_s if timeout_s is None else timeout_s)
            return self._answer(path, status, content)
        client = self._client()
        import httpx  # loaded by _client already

        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(
            timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        self.requests_sent += 1
        try:
            response = client.request(method, path, json=body, timeout=timeout)
        except httpx.ConnectTimeout as exc:
            raise ServerUnavailable(f"cannot reach the server {self.url} (connect timed out); is it running?",
                                    "connection") from exc
        except httpx.TimeoutException as exc:
            raise _no_answer(self.url, path, self.timeout_s if timeout_s is None else timeout_s) from exc
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from exc
        return self._answer(path, response.status_code, response.content)

    def _answer(self, path: str, status: int, content: bytes) -> Any:
        """The JSON of a server's answer (``status``, ``content``), or the error its status says."""
        if status == 429 or status >= 500:
            message, _ = _detail(content)
            raise ServerUnavailable(f"the server {self.url}{path} answered HTTP {status} ({message})",
                                    f"http {status}")
        if status >= 400:
            message, error = _detail(content)
            refusal = context_refusal(message, error)
            if refusal is not None:
                raise refusal
            raise ServerError(f"the server {self.url}{path} refused the request: HTTP {status} ({message})")
        try:
            return json.loads(content)
        except ValueError as exc:
            raise ServerError(f"the server {self.url}{path} did not answer JSON ({exc}); is it an "
                              f"OpenAI-compatible server?") from exc

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
                timeout_s: float | None = None) -> Any:
        """One request; transient failures are retried (``retry``) with exponential back-off and jitter."""
        # The first try goes without tenacity (its loop costs about a tenth of a millisecond of CPU a request, and
        # counting sends requests by the thousand); after a transient failure tenacity takes over as from that try.
        try:
            return self._once(method, path, body, timeout_s)
        except ServerUnavailable as exc:
            if not retry or not _retryable(exc) or self.retry.attempts == 1:
                raise
            failed: ServerUnavailable | None = exc
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

        def attempt() -> Any:
            nonlocal failed
            if failed is not None:  # tenacity's first try is the one that failed above
                first, failed = failed, None
                raise first
            return self._once(method, path, body, timeout_s)

        retrying = Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.retry.attempts),
                            wait=wait_random_exponential(multiplier=self.retry.backoff_s,
                                                         max=self.retry.max_backoff_s), reraise=True)
        return retrying(attempt)

    def _optional(self, path: str, timeout_s: float) -> Any:
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
        info = self._identify(timeout_s)
        self._kind = info.kind
        return info

    def _identify(self, timeout_s: float) -> ServerInfo:
        models = self.request("GET", "/v1/models", timeout_s=timeout_s)
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
            raise ServerError(f"{self.url}/v1/models lists no model; is this an OpenAI-compatible server?")
        card = data[0]
        ids = tuple(str(item.get("id")) for item in data if isinstance(item, dict))
        model_id = str(card["id"])
        self._model_id = model_id
        meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
        n_ctx_train = meta.get("n_ctx_train") if isinstance(meta.get("n_ctx_train"), int) else None
        if "max_model_len" in card or card.get("owned_by") == "vllm":
            version = self._optional("/version", timeout_s)
            return ServerInfo(self.url, model_id, "vllm", (version or {}).get("version") if isinstance(version, dict)
                              else None, card.get("max_model_len"), "vLLM max_model_len", models=ids)
        props = self._optional("/props", timeout_s)
        if isinstance(props, dict) and ("default_generation_settings" in props or "n_ctx" in props):
            settings = props.get("default_generation_settings") or {}
            n_ctx = settings.get("n_ctx") or props.get("n_ctx")
            build = props.get("build_info")
            return ServerInfo(self.url, model_id, "llama.cpp", str(build) if build else None,
                              int(n_ctx) if n_ctx else None, "llama.cpp /props n_ctx (per slot)" if n_ctx else None,
                              model_path=props.get("model_path"), n_ctx_train=n_ctx_train,
                              chat_template=str(props.get("chat_template") or "") or None,
                              models=ids)
        api = self._optional("/openapi.json", timeout_s)
        info = api.get("info") if isinstance(api, dict) else None
        if isinstance(info, dict) and "llama.cpp Python" in str(info.get("title", "")):
            # llama-cpp-python names the model by the path it loaded; it does not report its context size.
            return ServerInfo(self.url, model_id, "llama-cpp-python", str(info.get("version") or "") or None,
                              None, None, model_path=model_id, models=ids)
        return ServerInfo(self.url, model_id, "openai-compatible", None, None, None, n_ctx_train=n_ctx_train,
                          models=ids)

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
    def complete(self, prompt: str, *, model: str | None = None, max_tokens: int = 1, logprobs: int | None = None,
                 timeout_s: float | None = None) -> dict[str, Any]:
        """``/v1/completions`` at temperature 0 (``logprobs``: top-N per token)."""
        body: dict[str, Any] = {"model": model or self._model_id, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0.0, "seed": 0}
        if logprobs is not None:
            body["logprobs"] = logprobs
        return self.request("POST", "/v1/completions", body, timeout_s=timeout_s)

    def chat(self, messages: list[dict[str, str]], *, model: str | None = None, max_tokens: int = 1,
             top_logprobs: int | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """``/v1/chat/completions`` at temperature 0 (the server applies its chat template)."""
        body: dict[str, Any] = {"model": model or self._model_id, "messages": messages, "max_tokens": max_tokens,
                                "temperature": 0.0, "seed": 0}
        if top_logprobs is not None:
            body.update({"logprobs": True, "top_logprobs": top_logprobs})
        return self.request("POST", "/v1/chat/completions", body, timeout_s=timeout_s)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._lean is not None:
            self._lean.close()


def _unreachable(url: str, exc: Exception) -> ServerUnavailable:
    """The error for a server that could not be reached (refused, reset, closed), whichever transport tried."""
    return ServerUnavailable(f"cannot reach the server {url} ({type(exc).__name__}: {exc}); is it running?",
                             "connection")


def _no_answer(url: str, path: str, timeout_s: float) -> ServerUnavailable:
    """The error for an answer that did not come within ``timeout_s``, whichever transport waited."""
    return ServerUnavailable(f"the server {url} did not answer {path} within {timeout_s:.0f} s "
                             f"(raise --timeout for long prompts)", "timeout")


def _direct(url: str) -> bool:
    """True for a plain-http server reached without a proxy (httpx would honour the proxy settings)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and ("http" not in urllib.request.getproxies()
                                        or bool(urllib.request.proxy_bypass(parts.hostname or "")))


class _Connection:
    """One keep-alive HTTP/1.1 connection: the socket and a buffered reader of its answers."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def exchange(self, request: bytes, timeout_s: float) -> tuple[int, bytes, bool]:
        """Send ``request`` whole and read its answer: ``(status, body, the server will close)``."""
        self.sock.settimeout(timeout_s)
        self.sock.sendall(request)
        line = self.reader.readline(_MAX_LINE)
        if not line:  # closed before an answer began: an idle keep-alive connection the server let go
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        status, close = _status_line(line)
        while 100 <= status < 200:  # an interim answer (none is asked for; skipped if a server sends one)
            self._headers()
            status, close = _status_line(self.reader.readline(_MAX_LINE))
        headers = self._headers()
        close = close if b"connection" not in headers else headers[b"connection"].lower() != b"keep-alive"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            body = self._chunked()
        elif b"content-length" in headers:
            length = int(headers[b"content-length"])
            body = self.reader.read(length)
            if len(body) != length:
                raise http.client.IncompleteRead(body, length - len(body))
        else:  # the answer runs to the end of the connection
            body, close = self.reader.read(), True
        return status, body, close

    def _headers(self) -> dict[bytes, bytes]:
        headers: dict[bytes, bytes] = {}
        while (line := self.reader.readline(_MAX_LINE)) not in (b"\r\n", b"\n"):
            if not line:
                raise http.client.IncompleteRead(b"")
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return headers

    def _chunked(self) -> bytes:
        parts = []
        while size := int(self.reader.readline(_MAX_LINE).split(b";")[0], 16):
            parts.append(self.reader.read(size))
            self.reader.readline(_MAX_LINE)  # the chunk's CRLF
        while self.reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(parts)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


_MAX_LINE = 65_536


def _status_line(line: bytes) -> tuple[int, bool]:
    """``(status, the server will close)`` from an HTTP status line (an HTTP/1.0 server closes unless told)."""
    version, _, rest = line.partition(b" ")
    if not version.startswith(b"HTTP/") or not rest[:3].isdigit():
        raise http.client.BadStatusLine(line.decode("latin-1", "replace").strip())
    return int(rest[:3]), version == b"HTTP/1.0"


class _LeanHTTP:
    """GETs and JSON POSTs to one plain-http server over one keep-alive HTTP/1.1 connection per thread: a request
    written in one piece and its answer read with a few lines of parsing — a fraction of the client-side work of an
    httpx request, or of ``http.client``'s (whose header parsing goes through the email package), and no httpx to
    import — for requests sent by the thousand (a served tokenizer's counts) and a command's few identification
    requests. A connection the server closed while idle is opened again once, at once; every other failure is a
    ServerUnavailable as httpx's would be (``connection``, or ``timeout`` for an answer that did not come in time)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.url = url
        self.host, self.port = parts.hostname or "", parts.port or 80
        host = self.host.encode("idna")  # as http.client writes it (an IPv6 address in brackets)
        host = b"[" + host + b"]" if b":" in host else host
        self._host_header = b"Host: " + host + f":{self.port}\r\n".encode()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[_Connection] = []

    def request(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, bytes]:
        """``(status, content)`` of one request to ``path`` (a POST sends ``body`` as JSON)."""
        if method == "GET":
            request = f"GET {path} HTTP/1.1\r\n".encode() + self._host_header + b"Accept: application/json\r\n\r\n"
        else:
            data = json.dumps(body).encode("utf-8")
            request = (f"{method} {path} HTTP/1.1\r\n".encode() + self._host_header
                       + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        for reused in (True, False):
            conn: _Connection | None = getattr(self._local, "conn", None)
            if conn is None:
                reused = False
                try:
                    conn = _Connection(self.host, self.port, min(timeout_s, CONNECT_TIMEOUT_S))
                except OSError as exc:
                    raise _unreachable(self.url, exc) from exc
                self._local.conn = conn
                with self._lock:
                    self._open.append(conn)
            try:
                status, content, close = conn.exchange(request, timeout_s)
            except (ConnectionResetError, BrokenPipeError) as exc:  # RemoteDisconnected among them
                self._drop(conn)
                if reused:
                    continue  # the server closed the idle connection: once more, on a new one
                raise _unreachable(self.url, exc) from exc
            except socket.timeout as exc:
                self._drop(conn)
                raise _no_answer(self.url, path, timeout_s) from exc
            except (OSError, ValueError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise _unreachable(self.url, exc) from exc
            if close:
                self._drop(conn)
            return status, content
        raise AssertionError("unreachable")

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, []
        for conn in opened:
            conn.close()


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
