"""Talking to one OpenAI-compatible model server (llama.cpp's ``llama-server``, llama-cpp-python's server, vLLM, a
router in front of replicas): the probe and the judge both need it; neither knows runs.

One module per job: :mod:`~kvjudge.server_client.client` (the requests, retries, tokenize and completions),
:mod:`~kvjudge.server_client.identify` (who a server is), :mod:`~kvjudge.server_client.failures` and
:mod:`~kvjudge.server_client.refusals` (what a failed exchange means), :mod:`~kvjudge.server_client.auth` (the API
key from an environment variable), :mod:`~kvjudge.server_client.usage` (what an answer says it cost, cached prompt
tokens included), :mod:`~kvjudge.server_client.transport` (the transport interface, and httpx behind it) and
:mod:`~kvjudge.server_client.lean` (the lean transport for plain-http servers, kept because it saves a tenth of a
full ``eval``'s wall time: ``benchmarks/http_client.py``).
"""

from kvjudge.server_client.auth import Credentials, credentials_from
from kvjudge.server_client.client import (
    AFFINITY_HEADER,
    IDENTIFY_TIMEOUT_S,
    TOKENIZE_ROUTES,
    Answer,
    RetryPolicy,
    ServerClient,
    ServerTokenCounter,
    normalize_url,
)
from kvjudge.server_client.failures import CONNECT_TIMEOUT_S
from kvjudge.server_client.identify import KINDS, ServerInfo
from kvjudge.server_client.refusals import context_refusal
from kvjudge.server_client.usage import Usage, usage_of

__all__ = ["AFFINITY_HEADER", "CONNECT_TIMEOUT_S", "IDENTIFY_TIMEOUT_S", "KINDS", "TOKENIZE_ROUTES", "Answer",
           "Credentials", "RetryPolicy", "ServerClient", "ServerInfo", "ServerTokenCounter", "Usage",
           "context_refusal", "credentials_from", "normalize_url", "usage_of"]
