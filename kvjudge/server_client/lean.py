"""A lean HTTP/1.1 transport for plain-http servers: one keep-alive connection per thread, a request written in one
piece and its answer read with a few lines of parsing (what :class:`~kvjudge.server_client.ServerClient` sends by the
thousand: a served tokenizer's counts, and a command's few identification requests)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from kvjudge.server_client.failures import CONNECT_TIMEOUT_S, no_answer, unreachable
from kvjudge.server_client.transport import Request, Response


class _Connection:
    """One keep-alive HTTP/1.1 connection: the socket and a buffered reader of its answers."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def exchange(self, request: bytes, timeout_s: float) -> tuple[int, bytes, bool]:
        """Send ``request`` whole and read its answer: ``(status, body, the server will close)``."""
        self.sock.settimeout(timeout_s)
        self.sock.sendall(request)
        line = self.reader.readline(_MAX_LINE)
        if not line:  # closed before an answer began: an idle keep-alive connection the server let go
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        status, close = _status_line(line)
        while 100 <= status < 200:  # an interim answer (none is asked for; skipped if a server sends one)
            self._headers()
            status, close = _status_line(self.reader.readline(_MAX_LINE))
        headers = self._headers()
        close = close if b"connection" not in headers else headers[b"connection"].lower() != b"keep-alive"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            body = self._chunked()
        elif b"content-length" in headers:
            length = int(headers[b"content-length"])
            body = self.reader.read(length)
            if len(body) != length:
                raise http.client.IncompleteRead(body, length - len(body))
        else:  # the answer runs to the end of the connection
            body, close = self.reader.read(), True
        return status, body, close

    def _headers(self) -> dict[bytes, bytes]:
        headers: dict[bytes, bytes] = {}
        while (line := self.reader.readline(_MAX_LINE)) not in (b"\r\n", b"\n"):
            if not line:
                raise http.client.IncompleteRead(b"")
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return headers

    def _chunked(self) -> bytes:
        parts = []
        while size := int(self.reader.readline(_MAX_LINE).split(b";")[0], 16):
            parts.append(self.reader.read(size))
            self.reader.readline(_MAX_LINE)  # the chunk's CRLF
        while self.reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(parts)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


_MAX_LINE = 65_536


def _status_line(line: bytes) -> tuple[int, bool]:
    """``(status, the server will close)`` from an HTTP status line (an HTTP/1.0 server closes unless told)."""
    version, _, rest = line.partition(b" ")
    if not version.startswith(b"HTTP/") or not rest[:3].isdigit():
        raise http.client.BadStatusLine(line.decode("latin-1", "replace").strip())
    return int(rest[:3]), version == b"HTTP/1.0"


class LeanHTTP:
    """GETs and JSON POSTs to one plain-http server over one keep-alive HTTP/1.1 connection per thread: a request
    written in one piece and its answer read with a few lines of parsing — a fraction of the client-side work of an
    httpx request, or of ``http.client``'s (whose header parsing goes through the email package), and no httpx to
    import — for requests sent by the thousand (a served tokenizer's counts) and a command's few identification
    requests. A connection the server closed while idle is opened again once, at once; every other failure is a
    ServerUnavailable as httpx's would be (``connection``, or ``timeout`` for an answer that did not come in time)."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.url = url
        self.host, self.port = parts.hostname or "", parts.port or 80
        host = self.host.encode("idna")  # as http.client writes it (an IPv6 address in brackets)
        host = b"[" + host + b"]" if b":" in host else host
        self._host_header = b"Host: " + host + f":{self.port}\r\n".encode() + b"".join(
            f"{name}: {value}\r\n".encode("latin-1") for name, value in (headers or {}).items())
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[_Connection] = []

    def handle(self, request: Request) -> Response:
        """One request (the :class:`~kvjudge.server_client.transport.Transport` interface)."""
        if request.headers:
            raise ValueError("the lean transport sends only its own headers")
        status, content = self.request(request.method, request.path, request.body, request.timeout_s)
        return Response(status, content)

    def request(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, bytes]:
        """``(status, content)`` of one request to ``path`` (a POST sends ``body`` as JSON)."""
        if method == "GET":
            request = f"GET {path} HTTP/1.1\r\n".encode() + self._host_header + b"Accept: application/json\r\n\r\n"
        else:
            data = json.dumps(body).encode("utf-8")
            request = (f"{method} {path} HTTP/1.1\r\n".encode() + self._host_header
                       + f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        for reused in (True, False):
            conn: _Connection | None = getattr(self._local, "conn", None)
            if conn is None:
                reused = False
                try:
                    conn = _Connection(self.host, self.port, min(timeout_s, CONNECT_TIMEOUT_S))
                except OSError as exc:
                    raise unreachable(self.url, exc) from exc
                self._local.conn = conn
                with self._lock:
                    self._open.append(conn)
            try:
                status, content, close = conn.exchange(request, timeout_s)
            except (ConnectionResetError, BrokenPipeError) as exc:  # RemoteDisconnected among them
                self._drop(conn)
                if reused:
                    continue  # the server closed the idle connection: once more, on a new one
                raise unreachable(self.url, exc) from exc
            except socket.timeout as exc:
                self._drop(conn)
                raise no_answer(self.url, path, timeout_s) from exc
            except (OSError, ValueError, http.client.HTTPException) as exc:
                self._drop(conn)
                raise unreachable(self.url, exc) from exc
            if close:
                self._drop(conn)
            return status, content
        raise AssertionError("unreachable")

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, []
        for conn in opened:
            conn.close()


def direct(url: str) -> bool:
    """True for a plain-http server reached without a proxy (httpx would honour the proxy settings)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and ("http" not in urllib.request.getproxies()
                                        or bool(urllib.request.proxy_bypass(parts.hostname or "")))
