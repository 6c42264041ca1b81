"""A replica of the simulated judge as a GPU pool serves one: a prefix cache of its own with a capacity, the cached
share of each prompt reported as vLLM reports it, an API key it may ask for, and faults a test turns on (HTTP 503
while it "restarts", a stop and a start on the same port).

The prefix cache is vLLM's automatic prefix caching in miniature: a prompt's token ids cut into blocks of
``block_size``, each full block known by the hash of its tokens and of every block before it, kept in
least-recently-used order up to ``capacity_tokens``; a prompt is served from the cache for its longest run of
leading blocks held, never its last token (the model must compute it to answer), and its full blocks are kept after
it. The answer says so in ``usage.prompt_tokens_details.cached_tokens`` (what ``vllm serve
--enable-prompt-tokens-details`` adds; without it vLLM sends ``null``, as :class:`SimJudgeServer` does).

``usage`` adds up what the replica itself answered (calls, prompt, cached prompt and completion tokens): the figures
a ledger's totals must equal. A test runs several replicas, alone or behind a router::

    with SimReplica(key, Settings(), ReplicaSettings(capacity_tokens=200_000, api_key="k")) as replica:
        replica.url, replica.usage, replica.refuse("/v1/completions"), replica.kill()
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.testing.sim_judge import (
    AnswerKey,
    SimJudge,
    SimJudgeServer,
    _Api,
    _chat_text,
    _Handler,
    _Server,
    Settings,
)

VLLM_BLOCK_SIZE = 16  # vLLM's default --block-size on GPUs
#: A replica's KV cache as one GPU holds it: an 8B judge (Llama-3.1-8B: 32 layers × 8 KV heads × 128 dims × K and V
#: in bf16 = 128 KiB per token) on an 80 GB GPU at vLLM's --gpu-memory-utilization 0.9 leaves about 52 GB for KV
#: after the 16 GB of weights and the activations: about 400k tokens, shared by every request in flight.
GPU_KV_TOKENS = 400_000


class PrefixCache:
    """Blocks of token ids by chained hash, least recently used first out (thread-safe)."""

    def __init__(self, capacity_tokens: int, block_size: int = VLLM_BLOCK_SIZE) -> None:
        if capacity_tokens < 0 or block_size < 1:
            raise UsageError(f"a prefix cache needs capacity >= 0 and block size >= 1, got {capacity_tokens}, "
                             f"{block_size}")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def _hashes(self, ids: Sequence[int]) -> list[bytes]:
        hashes, parent = [], b""
        size = self.block_size
        for start in range(0, len(ids) - size + 1, size):
            parent = hashlib.sha256(parent + repr(list(ids[start:start + size])).encode()).digest()
            hashes.append(parent)
        return hashes

    def serve(self, ids: Sequence[int]) -> int:
        """The prompt's tokens served from the cache; its full blocks are kept for the prompts after it."""
        hashes = self._hashes(ids)
        usable = max(0, (len(ids) - 1) // self.block_size)  # never the last token: the model computes it to answer
        with self._lock:
            hit = 0
            while hit < min(usable, len(hashes)) and hashes[hit] in self._blocks:
                hit += 1
            for digest in hashes:
                self._blocks[digest] = None
                self._blocks.move_to_end(digest)
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)
        return hit * self.block_size

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()


@dataclass(frozen=True)
class ReplicaSettings:
    """What the replica adds to a simulated judge: its cache's capacity (0: no prefix caching, details ``null``;
    default :data:`GPU_KV_TOKENS`, one GPU's), the API key it asks for (None: none), its block size, and the window
    it reports in ``/v1/models`` and ``/tokenize`` (None: the one it holds; a larger one: a replica that holds less
    than the pool was probed with, as after a restart with other flags), and ``latency_s``, the seconds each
    completion takes before it is answered (a GPU's time per call; calls in flight at once overlap, as a batching
    server's do)."""

    capacity_tokens: int = GPU_KV_TOKENS
    api_key: str | None = None
    block_size: int = VLLM_BLOCK_SIZE
    reported_window: int | None = None
    latency_s: float = 0.0


class _ReplicaApi(_Api):
    """The simulated judge's answers with the cached share reported, and the replica's own usage added up."""

    def __init__(self, judge: SimJudge, replica: ReplicaSettings, usage: Counter[str],
                 sessions: Counter[tuple[str | None, str | None]]) -> None:
        super().__init__(judge)
        self.sessions = sessions
        self.cache = PrefixCache(replica.capacity_tokens, replica.block_size) if replica.capacity_tokens else None
        self.usage = usage
        self.reported_window = replica.reported_window
        self.latency_s = replica.latency_s
        self._usage_lock = threading.Lock()

    def _reported(self, answer: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        if self.reported_window is not None:
            for row in rows:
                row["max_model_len"] = self.reported_window
        return answer

    def models(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().models(body)
        return self._reported(answer, answer["data"])

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().tokenize(body)
        return self._reported(answer, [answer])

    def _account(self, answer: dict[str, Any], ids: list[int], body: dict[str, Any]) -> dict[str, Any]:
        if self.latency_s:
            time.sleep(self.latency_s)
        usage = answer["usage"]
        cached = self.cache.serve(ids) if self.cache is not None else None
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        with self._usage_lock:
            self.usage.update(calls=1, prompt_tokens=usage["prompt_tokens"], cached_tokens=cached or 0,
                              completion_tokens=usage["completion_tokens"])
            self.sessions[(body.get("_session_header"), body.get("user"))] += 1
        return answer

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().completions(body)
        prompt = body["prompt"][0] if isinstance(body["prompt"], list) and len(body["prompt"]) == 1 \
            and isinstance(body["prompt"][0], str) else body["prompt"]
        ids = SimJudge.token_ids(prompt, bos=True) if isinstance(prompt, str) else [1, *prompt]
        return self._account(answer, ids, body)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().chat(body)
        return self._account(answer, SimJudge.token_ids(_chat_text(body["messages"]), bos=True), body)


class _ReplicaServer(_Server):
    def __init__(self, address: tuple[str, int], judge: SimJudge, replica: ReplicaSettings,
                 usage: Counter[str], sessions: Counter[tuple[str | None, str | None]]) -> None:
        super().__init__(address, judge)
        self.api = _ReplicaApi(judge, replica, usage, sessions)
        self.replica = replica
        self.refusing: frozenset[str] = frozenset()  # paths answered 503 ("*": all but /health)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.connections_lock:
                self.connections.discard(request)

    def drop_connections(self) -> None:
        """Cut every open connection (kept-alive ones too): what a crashed process leaves its clients."""
        with self.connections_lock:
            open_now = list(self.connections)
        for connection in open_now:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _ReplicaHandler(_Handler):
    """The key checked and the 503 fault answered before the simulated judge's routes (``/health`` stays open,
    as vLLM's does, so a router's health check reaches it)."""

    server: _ReplicaServer

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/health":
            key = self.server.replica.api_key
            if path in self.server.refusing or "*" in self.server.refusing:
                self._raw_body()
                self._send(503, {"object": "error", "message": "the replica is restarting", "code": 503})
                return
            if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
                self._raw_body()
                self._send(401, {"error": "Unauthorized"})
                return
        self.session_header = self.headers.get("X-Session-ID")
        super()._route(method)

    def _body(self, raw: bytes) -> dict[str, Any]:  # type: ignore[override]
        body = _Handler._body(raw)
        body["_session_header"] = getattr(self, "session_header", None)  # for the replica's count of sessions
        return body


@dataclass
class SimReplica(SimJudgeServer):
    """One replica in a background thread: ``url`` once started; :meth:`stop` then :meth:`start` again restarts it
    on the same port with an empty cache; :meth:`kill` cuts its connections as a crash does; :meth:`refuse` answers
    503 while it "restarts"."""

    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    _usage: Counter[str] = field(init=False, default_factory=Counter, repr=False)
    #: (the X-Session-ID header, the ``user`` field) of every completion answered here, counted.
    sessions: Counter[tuple[str | None, str | None]] = field(init=False, default_factory=Counter, repr=False)

    def start(self) -> SimReplica:
        server = _ReplicaServer((self.host, self.port), self.judge, self.replica, self._usage, self.sessions)
        server.RequestHandlerClass = _ReplicaHandler
        self._server = server
        host, port = server.server_address[:2]
        self.port = port  # kept, so a restart listens where the router expects it
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=server.serve_forever, name="sim-replica", daemon=True)
        self._thread.start()
        return self

    def clear_cache(self) -> None:
        """Forget every cached block (as a restart does)."""
        server = self._server
        if isinstance(server, _ReplicaServer) and server.api.cache is not None:
            server.api.cache.clear()

    def kill(self) -> None:
        """Stop as a crash does: no new connection, and every open one cut mid-request (a stopped server's
        kept-alive connections would go on answering)."""
        server = self._server
        if isinstance(server, _ReplicaServer):
            server.drop_connections()
        self.stop()
        if isinstance(server, _ReplicaServer):
            server.drop_connections()  # any accepted while it was stopping

    @property
    def usage(self) -> Counter[str]:
        """What this replica answered: calls, prompt_tokens, cached_tokens, completion_tokens (over its restarts
        too: a replica stopped mid-run keeps what it answered before)."""
        return self._usage

    def refuse(self, *paths: str) -> None:
        """Answer 503 to requests for ``paths`` (``"*"``: everything but ``/health``, as a replica restarting behind
        a router that still finds it healthy); none given: answer everything again."""
        if isinstance(self._server, _ReplicaServer):
            self._server.refusing = frozenset(paths)


def replicas(key: AnswerKey, count: int, settings: Settings = Settings(),
             replica: ReplicaSettings = ReplicaSettings()) -> list[SimReplica]:
    """``count`` replicas of one simulated judge (one model id), not yet started."""
    return [SimReplica(key, settings, replica=replica) for _ in range(count)]


__all__ = ["PrefixCache", "ReplicaSettings", "SimReplica", "VLLM_BLOCK_SIZE", "replicas"]
