"""What a server's refusal means: its message and error object read from the body, and whether it is a context
refusal (a measured overflow: llama.cpp, llama-cpp-python and vLLM each word it differently; the context size and
the prompt's length are read from it)."""

from __future__ import annotations

import json
import re
from typing import Any

from kvjudge.errors import ContextRefused

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


def detail(content: bytes) -> tuple[str, dict[str, Any]]:
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
