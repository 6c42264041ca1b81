"""The one door for judge backends: every kind of :class:`~kvjudge.judge.backends.Backend` kvjudge can open — its
own (in-process llama-cpp-python, a pool of OpenAI-compatible servers), then those other packages add through the
``kvjudge.backends`` entry-point group (each entry point names a :class:`BackendKind`).

``[judge] backend`` / ``--backend`` name one; unset, the judge is the servers' pool when servers are configured and
in-process llama-cpp-python otherwise (what kvjudge chose before there was a choice). ``--backend``'s help, the
backends section of ``docs/judging.md`` (a test compares them) and the unknown-backend error are made from
:func:`kinds`. An entry point that cannot be loaded, or that reuses a name, is left out and said in
:func:`load_problems` (judging commands print it), never a traceback.

The smallest backend kind another package can add — a baseline that needs no model — is in ``docs/judging.md``
("Adding a backend"; a test installs exactly that code through a real entry point and judges a pair with it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvjudge.errors import UsageError
from kvjudge.plugins import load_group
from kvjudge.settings import Settings

if TYPE_CHECKING:
    from kvjudge.judge.backends import Backend
    from kvjudge.server_client import Credentials

ENTRY_POINT_GROUP = "kvjudge.backends"
LLAMA = "llama"
SERVERS = "servers"


def _silent(_message: str) -> None:
    return None


@dataclass(frozen=True)
class BackendOpening:
    """What a backend kind is opened from: the settings (``[judge]`` and the rest, flags applied), the window bound
    asked for (``--n-ctx``; None: the kind's own), the capability cache file, the servers' credentials, where notes
    go, and the local judge GGUF — resolved only when a kind asks for it (the bundled model is fetched then)."""

    settings: Settings
    n_ctx: int | None = None
    capabilities: str | Path | None = None
    credentials: Credentials | None = None
    say: Callable[[str], None] = _silent
    local_model: Callable[[], Path] | None = field(default=None, repr=False)

    def model_path(self) -> Path:
        """The judge GGUF on this machine (``[judge] model``, else the bundled judge model)."""
        if self.local_model is not None:
            return self.local_model()
        from kvjudge import models

        named = self.settings.judge.model
        return models.resolve_model(named) if named else models.judge_model_path()


@dataclass(frozen=True)
class BackendKind:
    """One kind of judge backend: its name (``--backend NAME``), what it is in one line, what it is opened from (in
    words, for the help and the docs) and ``open(opening)``, which returns a :class:`~kvjudge.judge.backends.Backend`
    (not yet sized: the window planner sizes it, unless its window is fixed). ``serves``: its figures come from
    the ``[judge] servers``' capability entries (``kvjudge probe --server``), not from a local model's."""

    name: str
    summary: str
    needs: str
    open: Callable[[BackendOpening], Backend]
    serves: bool = False


def _open_llama(opening: BackendOpening) -> Backend:
    from kvjudge._llama import require_local_inference
    from kvjudge.judge.backends import LlamaBackend

    require_local_inference("the in-process judge (--backend llama)")  # before the bundled judge model is fetched
    return LlamaBackend(model_path=opening.model_path(), n_threads=opening.settings.judge.threads)


def _open_servers(opening: BackendOpening) -> Backend:
    from kvjudge.judge.servers import open_servers

    chosen = opening.settings.judge
    return open_servers(chosen.server_urls, n_ctx=opening.n_ctx, tokenizer_model=chosen.tokenizer_model,
                        parallel=chosen.parallel, timeout_s=chosen.timeout, cache_path=opening.capabilities,
                        staleness_days=opening.settings.probe.staleness_days,
                        on_drop=lambda url, why: opening.say(f"judge server {url} dropped: {why}"),
                        credentials=opening.credentials)


#: kvjudge's own kinds; those other packages add come after them.
_OWN = (
    BackendKind(LLAMA, "a GGUF judged in-process by llama-cpp-python, its KV cache of the instructions reused",
                "a GGUF: --model PATH or [judge] model, else the bundled judge model; [judge] threads",
                _open_llama),
    BackendKind(SERVERS, "a pool of OpenAI-compatible servers of one model (llama.cpp, llama-cpp-python, vLLM), "
                         "read through their top logprobs",
                "server URLs: --server URL (repeat for a pool) or [judge] servers / server; [judge] parallel, "
                "timeout, tokenizer_model, api_key_env", _open_servers, serves=True),
)


@functools.cache
def _loaded() -> tuple[tuple[BackendKind, ...], tuple[str, ...]]:
    added, problems = load_group(ENTRY_POINT_GROUP, "judge backend", BackendKind, {kind.name for kind in _OWN})
    return (*_OWN, *added), tuple(problems)


def kinds() -> tuple[BackendKind, ...]:
    """Every backend kind: kvjudge's own, then those added through ``kvjudge.backends``."""
    return _loaded()[0]


def load_problems() -> tuple[str, ...]:
    """One line per entry point of ``kvjudge.backends`` left out (it did not load, or reused a name)."""
    return _loaded()[1]


def names() -> tuple[str, ...]:
    """The ``--backend`` choices."""
    return tuple(kind.name for kind in kinds())


def default_name(settings: Settings) -> str:
    """The kind when none is named: the servers' pool where servers are configured, else in-process."""
    return SERVERS if settings.judge.server_urls else LLAMA


def chosen(settings: Settings) -> BackendKind:
    """The kind ``[judge] backend`` names (else :func:`default_name`); an unknown name is one line listing them."""
    name = settings.judge.backend or default_name(settings)
    found = next((kind for kind in kinds() if kind.name == name), None)
    if found is None:
        raise UsageError(unknown_message(name))
    return found


def unknown_message(name: str) -> str:
    listed = "; ".join(f"{kind.name} ({kind.summary})" for kind in kinds())
    return (f"unknown judge backend {name!r}; the backends kvjudge can open are: {listed}. Name one with --backend "
            f"or [judge] backend (another package adds one through the {ENTRY_POINT_GROUP!r} entry points)")


def help_text() -> str:
    """``--backend``'s help: every choice with its one line."""
    return ("judge backend (default: [judge] backend, else servers when servers are named, else llama): "
            + "; ".join(f"{kind.name}: {kind.summary}" for kind in kinds()))


def docs_section() -> str:
    """The backends list of ``docs/judging.md`` (between its ``backends:begin``/``backends:end`` markers)."""
    return "\n".join(f"- `{kind.name}` — {kind.summary}; opened from {kind.needs}." for kind in kinds())
