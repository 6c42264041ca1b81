"""The transport interface a :class:`~kvjudge.server_client.ServerClient` sends through (httpx's ``BaseTransport``
style: one request in, one response out, ``close``), and the httpx transport that carries every request a lean
one does not (:mod:`kvjudge.server_client.lean`). A transport raises only
:class:`~kvjudge.errors.ServerUnavailable` (``connection`` or ``timeout``); what an answer means is decided above
it (:mod:`kvjudge.server_client.failures`), the same whichever transport carried it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvjudge.errors import ServerUnavailable
from kvjudge.server_client.failures import CONNECT_TIMEOUT_S, no_answer, unreachable

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class Request:
    """One request to a server: a GET, or a POST of ``body`` as JSON; ``headers`` beyond the transport's own."""

    method: str
    path: str
    body: dict[str, Any] | None
    timeout_s: float
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    content: bytes


class Transport(Protocol):
    """Sends a :class:`Request` to one server and returns its :class:`Response` (thread-safe)."""

    def handle(self, request: Request) -> Response: ...

    def close(self) -> None: ...


class HttpxTransport:
    """Requests over an httpx client, made on first use (its import and set-up take a tenth of a second: a command
    that talks to no server, or only over a lean transport, never pays for it). ``transport``: httpx's own, for a
    test's mock; ``headers``: sent with every request (the credentials)."""

    def __init__(self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _made(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(base_url=self.url, transport=self._transport, headers=self._headers,
                                            timeout=httpx.Timeout(self.timeout_s,
                                                                  connect=min(self.timeout_s, CONNECT_TIMEOUT_S)))
            return self._client

    def handle(self, request: Request) -> Response:
        client = self._made()
        import httpx  # loaded by _made already

        timeout = httpx.Timeout(request.timeout_s, connect=min(request.timeout_s, CONNECT_TIMEOUT_S))
        try:
            response = client.request(request.method, request.path, json=request.body, timeout=timeout,
                                      headers=dict(request.headers) or None)
        except httpx.ConnectTimeout as exc:
            raise ServerUnavailable(f"cannot reach the server {self.url} (connect timed out); is it running?",
                                    "connection") from exc
        except httpx.TimeoutException as exc:
            raise no_answer(self.url, request.path, request.timeout_s) from exc
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from exc
        return Response(response.status_code, response.content)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
