"""The two transports a server client sends through give the same answers: the lean HTTP/1.1 one (identification
and tokenize requests to a plain-http server) and httpx (everything else), against a real server on loopback —
answers, refusals, a missing route and a refused key alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvjudge.server_client.lean import LeanHTTP
from kvjudge.server_client.transport import HttpxTransport, Request
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import ReplicaSettings, SimReplica

KEY = "sk-transport-test"
REQUESTS = [Request("GET", "/v1/models", None, 10), Request("GET", "/version", None, 10),
            Request("GET", "/no/such/route", None, 10),
            Request("POST", "/tokenize", {"prompt": "def f(x): return x ** 2  # ü 東京", "add_special_tokens": False},
                    10),
            Request("POST", "/extras/tokenize", {"input": "hello"}, 10),
            Request("POST", "/v1/completions", {"prompt": "word " * 300, "max_tokens": 1}, 10),  # over the context
            Request("POST", "/v1/completions", {"prompt": "Answer:", "max_tokens": 1, "logprobs": 2}, 10)]


def _comparable(content: bytes) -> Any:
    """The answer without what differs between two calls by design (ids, timestamps)."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("id", "created")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(content))


@pytest.mark.parametrize("with_key", [True, False])
def test_the_lean_transport_answers_as_httpx_does(with_key: bool) -> None:
    settings = Settings(max_model_len=256)
    with SimReplica(AnswerKey([]), settings, replica=ReplicaSettings(capacity_tokens=0, api_key=KEY)) as server:
        headers = {"Authorization": f"Bearer {KEY}"} if with_key else {}
        lean, full = LeanHTTP(server.url, headers), HttpxTransport(server.url, 10.0, headers)
        statuses = []
        try:
            for request in REQUESTS:
                a, b = lean.handle(request), full.handle(request)
                assert a.status == b.status, request
                assert _comparable(a.content) == _comparable(b.content), request
                statuses.append(a.status)
        finally:
            lean.close()
            full.close()
    # The cases really differ (a refused key answers everything alike).
    assert statuses == ([200, 200, 404, 200, 404, 400, 200] if with_key else [401] * len(REQUESTS))
