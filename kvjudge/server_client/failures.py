"""How a failed exchange with a server is told to the caller: the transient errors (unreachable, no answer in time)
whichever transport met them, and an answer's status and body turned into its JSON or the error it means (429 and
5xx transient, 401/403 credentials refused, a context refusal, any other refusal, an answer that is not JSON)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kvjudge.errors import ServerError, ServerUnavailable
from kvjudge.server_client.auth import auth_refused
from kvjudge.server_client.refusals import context_refusal, detail

if TYPE_CHECKING:
    from kvjudge.server_client.auth import Credentials

CONNECT_TIMEOUT_S = 10.0


def unreachable(url: str, exc: Exception) -> ServerUnavailable:
    """The error for a server that could not be reached (refused, reset, closed), whichever transport tried."""
    return ServerUnavailable(f"cannot reach the server {url} ({type(exc).__name__}: {exc}); is it running?",
                             "connection")


def no_answer(url: str, path: str, timeout_s: float) -> ServerUnavailable:
    """The error for an answer that did not come within ``timeout_s``, whichever transport waited."""
    return ServerUnavailable(f"the server {url} did not answer {path} within {timeout_s:.0f} s "
                             f"(raise --timeout for long prompts)", "timeout")


def retryable(exc: BaseException) -> bool:
    """A transient failure worth another try on the same server (a time-out is not: it would take as long again)."""
    return isinstance(exc, ServerUnavailable) and exc.reason != "timeout"


def answer_json(url: str, path: str, status: int, content: bytes, credentials: Credentials | None) -> Any:
    """The JSON of a server's answer (``status``, ``content``), or the error its status says."""
    if status in (401, 403):
        raise auth_refused(url, status, credentials)
    if status == 429 or status >= 500:
        message, _ = detail(content)
        message = credentials.redact(message) if credentials is not None else message
        raise ServerUnavailable(f"the server {url}{path} answered HTTP {status} ({message})", f"http {status}")
    if status >= 400:
        message, error = detail(content)
        message = credentials.redact(message) if credentials is not None else message
        refusal = context_refusal(message, error)
        if refusal is not None:
            raise refusal
        raise ServerError(f"the server {url}{path} refused the request: HTTP {status} ({message})")
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ServerError(f"the server {url}{path} did not answer JSON ({exc}); is it an "
                          f"OpenAI-compatible server?") from exc
