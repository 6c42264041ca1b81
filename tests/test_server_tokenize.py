"""Counting through a server's tokenizer: each text once per request, over one keep-alive connection per thread.

A small HTTP/1.1 server here answers ``/tokenize`` as vLLM does (a word per token) and records what it was sent
and how many connections were opened to it; the client under test is kvjudge's own.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvjudge.errors import ServerError, ServerUnavailable
from kvjudge.server_client import RetryPolicy, ServerClient


class Tokenizer(ThreadingHTTPServer):
    """vLLM's ``/v1/models`` and ``/tokenize``; ``close_after``: close a connection after that many answers;
    ``status``: answer every tokenize with this status instead."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies: list[dict[str, Any]] = []
        self.connections = 0
        self.close_after = 0
        self.status = 200
        self.message = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Tokenizer

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1
        self.answered = 0

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.answered += 1
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_after and self.answered >= self.server.close_after:
            self.close_connection = True  # closed without saying so, as an idle keep-alive connection may be

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._send(200, {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]})

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if self.path != "/tokenize":
            self._send(404, {"detail": "Not Found"})
        elif self.server.status != 200:
            self._send(self.server.status, {"object": "error", "message": self.server.message, "code": 400})
        else:
            tokens = list(range(len(body["prompt"].split())))
            self._send(200, {"count": len(tokens), "max_model_len": 4096, "tokens": tokens})


@pytest.fixture
def server() -> Any:
    tokenizer = Tokenizer()
    thread = threading.Thread(target=tokenizer.serve_forever, daemon=True)
    thread.start()
    yield tokenizer
    tokenizer.shutdown()
    tokenizer.server_close()


def test_counts_go_over_one_connection_with_the_text_once(server: Tokenizer) -> None:
    client = ServerClient(server.url)
    client.identify()
    texts = [" ".join(["word"] * n) for n in range(1, 41)]
    assert [client.count(text) for text in texts] == list(range(1, 41))
    assert server.connections <= 2  # identification, then counting (the route found once, then kept open)
    counted = [body for body in server.bodies if body.get("prompt", "").startswith("word")]
    assert len(counted) == 40 and all("content" not in body for body in counted)  # vLLM reads "prompt" only
    assert client.requests_sent == len(server.bodies) + 2  # + /v1/models, /version (GETs)
    client.close()


def test_a_connection_the_server_closed_is_opened_again_at_once(server: Tokenizer) -> None:
    server.close_after = 3
    client = ServerClient(server.url, retry=RetryPolicy(attempts=1))  # a retry would hide a failed request
    assert [client.count("a b c") for _ in range(10)] == [3] * 10
    assert server.connections >= 4
    client.close()


def test_refusals_over_the_counting_connection_are_the_errors_they_always_were(server: Tokenizer) -> None:
    client = ServerClient(server.url, retry=RetryPolicy(attempts=2, backoff_s=0.01, max_backoff_s=0.01))
    assert client.count("a b") == 2  # the route is found
    server.status, server.message = 503, "busy"
    with pytest.raises(ServerUnavailable, match="HTTP 503") as unavailable:
        client.count("a b")
    assert unavailable.value.reason == "http 503"
    server.status, server.message = 400, "the request is malformed"
    with pytest.raises(ServerError, match="the request is malformed"):
        client.count("a b")
    client.close()


class Canned(threading.Thread):
    """A raw socket server that reads one request per connection and answers it with the next canned bytes as
    they are, then closes: the framings HTTP/1.1 allows besides a plain Content-Length, written out by hand."""

    def __init__(self, answers: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.answers = answers
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def run(self) -> None:
        for answer in self.answers:
            conn, _ = self.listener.accept()
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(answer)
        self.listener.close()


def _tokens(count: int) -> bytes:
    return json.dumps({"count": count, "tokens": list(range(count))}).encode()


def test_answers_framed_every_way_http_allows_are_read_whole() -> None:
    three, five = _tokens(3), _tokens(5)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (five[:7], five[7:])) + b"0\r\n\r\n"
    server = Canned([
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + three,  # no length: to the connection's end
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(five), five),
        b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n" + three,  # cut short: the connection closes early
    ])
    server.start()
    client = ServerClient(server.url, retry=RetryPolicy(attempts=1))
    client._tokenize_route, client._kind, client._token_offset = "/tokenize", "vllm", 0  # no identification here
    assert [client.count("a"), client.count("b"), client.count("c")] == [5, 3, 5]
    with pytest.raises(ServerUnavailable, match="cannot reach the server"):
        client.count("d")
    client.close()
