"""Which tokenizer counts a served model's prompts here: a local copy of the served GGUF when one is named or the
served file is readable here and tokenizes like the server (and llama-cpp-python, the local extra, is installed);
else none (the server's tokenize endpoint counts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvjudge.errors import ServerError
from kvjudge.server_client import ServerClient, ServerInfo

# Text whose tokenization decides whether a local GGUF is the served model's tokenizer.
_TOKENIZER_CHECK = "kvjudge tokenizer check: def f(x): return x ** 2  # ü, ß, 東京, <<<END RUN A>>>\n"


def local_tokenizer(info: ServerInfo, client: ServerClient, model_path: str | Path | None = None) -> Any:
    """A local tokenizer for the served model: ``model_path`` (a copy of the served GGUF), else the served file
    itself when it is readable here and tokenizes like the server. None: count with the server."""
    from kvjudge._llama import local_inference_available
    from kvjudge.tokens import ModelTokenizer

    if model_path is not None:
        return ModelTokenizer(model_path)
    # Without the local extra (a judge-pool install) no local file can be read as a tokenizer: the server counts.
    if not local_inference_available() or not info.model_path or not Path(info.model_path).is_file():
        return None
    candidate = ModelTokenizer(info.model_path)
    try:
        served = client.tokenize(_TOKENIZER_CHECK)
        offset = len(client.tokenize(""))
    except ServerError:
        return None
    # A file of the same name on this host is only the served model if it tokenizes the same way.
    return candidate if served[offset:] == candidate.tokenize(_TOKENIZER_CHECK) else None


__all__ = ["local_tokenizer"]
