"""A simulated judge of known quality: a small vLLM-shaped OpenAI-compatible server whose verdicts follow held-out
truth with a set accuracy and a set position bias, and which decides a pair only when each run's decisive evidence
is visible in the view the prompt quotes.

kvjudge cannot show on a laptop that it reads a capable judge right (the bundled judge model has no signal), so
the test suite and the benchmarks judge through this server instead: ``kvjudge probe --server URL`` certifies it
(its context refusals included) and ``kvjudge judge / eval / rank --server URL`` judge through it exactly as through
vLLM. It reads nothing but the requests it is sent: no store, no run files; the truth comes from an answer key.

Starting it::

    python -m kvjudge.testing.sim_judge --key KEY.json [--port 0] [--accuracy 0.8] [--bias 0.5] [--seed 0]
        [--confidence 0.85] [--evidence-share 1.0] [--max-model-len 32768] [--model NAME] [--json]

prints one line naming its URL (with ``--json``: ``{"url", "model", "max_model_len", …}``) once it listens, and
serves until SIGTERM or SIGINT. In a test, :class:`SimJudgeServer` runs it in a thread
(``with SimJudgeServer(key, Settings(accuracy=0.8)) as judge: judge.url``). The standard library's threading HTTP
server does the serving: a thread per connection, HTTP/1.1 keep-alive, nothing to install beyond kvjudge's own
dependencies (fastapi and uvicorn are test extras only), and it is listening within milliseconds.


The answer key's format is :mod:`kvjudge.testing.sim_key`'s, what the judge answers :mod:`kvjudge.testing.sim_model`'s
(both re-exported here, the simulated judge's front); this module serves it.

**Endpoints** (vLLM's shapes): ``GET /v1/models`` (with ``max_model_len``), ``GET /version``, ``POST /tokenize``
(``{"count", "max_model_len", "tokens"}``), ``POST /v1/completions`` (``logprobs.top_logprobs``: a list of
``{token: logprob}``) and ``POST /v1/chat/completions`` (``logprobs.content[0].top_logprobs``: a list of
``{"token", "logprob", "bytes"}``). A prompt over ``max_model_len`` is refused with vLLM's words; more than
``max_logprobs`` logprobs likewise. The tokenizer is a small deterministic one (words, numbers, punctuation and
whitespace runs; about four characters a token on code); a prompt counts one BOS token more.

**What it was sent.** ``SimJudgeServer(key, settings, prompts=[])`` appends to that list every text a request
asks it to read — each completions prompt, each chat request's messages as its template renders them, each
``/tokenize`` text — so a test can check what a judge is shown (that no grade reaches it, say). Off by default:
a long benchmark would keep every prompt.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.testing.sim_key import AnswerKey, KeyEntry, changed_lines, key_entry, write_key
from kvjudge.testing.sim_model import (
    DEFAULT_MAX_LOGPROBS,
    DEFAULT_MAX_MODEL_LEN,
    LABEL_MASS,
    Decision,
    Settings,
    SimJudge,
    common_pieces,
    draw,
    quoted_views,
    scale_decision,
    scale_distribution,
    scale_levels,
    scale_noise,
    sharpened,
)

VERSION = "kvjudge-sim-judge 1"


# ----------------------------------------------------------------------------------------------- HTTP
class _Refusal(Exception):
    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        super().__init__(payload)
        self.status = status
        self.payload = payload


def _bad_request(message: str, status: int = 400) -> _Refusal:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return _Refusal(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the judge's client reuses its connections
    # Headers and body go out in one write where the answer fits this buffer (handle_one_request flushes it): one
    # send a request, for a judge meant to cost its caller nothing. A larger answer is a second write, which with
    # Nagle's algorithm on would wait for the client's delayed ACK (~40 ms).
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    @staticmethod
    def _body(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise _bad_request(f"the request body is not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise _bad_request("the request body must be a JSON object")
        return body

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        self.server.count(path)
        routes = {("GET", "/v1/models"): self.server.api.models, ("GET", "/version"): self.server.api.version,
                  ("GET", "/health"): self.server.api.health, ("POST", "/tokenize"): self.server.api.tokenize,
                  ("POST", "/v1/completions"): self.server.api.completions,
                  ("POST", "/v1/chat/completions"): self.server.api.chat}
        handler = routes.get((method, path))
        try:
            # The body is read before anything is refused: left unread on a kept-alive connection, it would be
            # taken for the start of the next request.
            raw = self._raw_body()
            if handler is None:
                raise _Refusal(404, {"detail": "Not Found"})
            payload = handler(self._body(raw) if method == "POST" else {})
        except _Refusal as refusal:
            self._send(refusal.status, refusal.payload)
            return
        self._send(200, payload)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        self._route("POST")


class _Api:
    """The endpoints' answers, in vLLM's shapes; every text sent to be read is appended to ``prompts`` when it
    is a list."""

    def __init__(self, judge: SimJudge, prompts: list[str] | None = None) -> None:
        self.judge = judge
        self.settings = judge.settings
        self.created = int(time.time())
        self.prompts = prompts
        self._lock = threading.Lock()

    def _received(self, text: str) -> None:
        if self.prompts is not None:
            with self._lock:
                self.prompts.append(text)

    def health(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {}

    def version(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"version": VERSION}

    def models(self, _body: dict[str, Any]) -> dict[str, Any]:
        model = self.judge.model
        return {"object": "list", "data": [{
            "id": model, "object": "model", "created": int(time.time()), "owned_by": "kvjudge-sim-judge",
            "root": model, "parent": None, "max_model_len": self.settings.max_model_len}]}

    def _model(self, body: dict[str, Any]) -> None:
        asked = body.get("model")
        if asked is not None and asked != self.judge.model:
            raise _bad_request(f"The model `{asked}` does not exist.", 404)

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        if "messages" in body:
            text = _chat_text(body["messages"])
        else:
            text = body.get("prompt", body.get("content"))
        if not isinstance(text, str):
            raise _bad_request("tokenize needs a \"prompt\" string")
        self._received(text)
        tokens = SimJudge.token_ids(text, bos=bool(body.get("add_special_tokens", True)))
        return {"count": len(tokens), "max_model_len": self.settings.max_model_len, "tokens": tokens}

    def _limits(self, prompt_tokens: int, max_tokens: Any, asked_logprobs: Any) -> int:
        if asked_logprobs is not None and (not isinstance(asked_logprobs, int) or asked_logprobs < 0):
            raise _bad_request(f"logprobs must be a non-negative integer, got {asked_logprobs!r}")
        if asked_logprobs is not None and asked_logprobs > self.settings.max_logprobs:
            raise _bad_request(f"Requested sample logprobs of {asked_logprobs}, which is greater than max allowed: "
                               f"{self.settings.max_logprobs}")
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad_request(f"max_tokens must be at least 1, got {max_tokens!r}")
        limit = self.settings.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise _bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                               f"in the completion). Please reduce the length of the messages or completion.")
        return max_tokens

    def _usage(self, prompt_tokens: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 1, "completion_tokens": 1,
                "prompt_tokens_details": None}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            raise _bad_request("prompt must be a string or a list of token ids")
        if isinstance(prompt, str):
            self._received(prompt)
        prompt_tokens = self.judge.prompt_tokens(prompt)
        asked = body.get("logprobs")
        self._limits(prompt_tokens, body.get("max_tokens"), asked)
        decision = self.judge.decide(prompt if isinstance(prompt, str) else "")
        top = self.judge.label_logprobs(decision.p_first, (" A", " B"), max(1, asked or 0), decision.levels)
        token, logprob = top[0]
        logprobs = None if asked is None else {"text_offset": [0], "token_logprobs": [logprob], "tokens": [token],
                                               "top_logprobs": [dict(top[:asked]) if asked else {}]}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.judge.model,
                "choices": [{"index": 0, "text": token, "logprobs": logprobs, "finish_reason": "length",
                             "stop_reason": None, "prompt_logprobs": None}],
                "usage": self._usage(prompt_tokens)}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise _bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects")
        self._received(_chat_text(messages))
        prompt_tokens = len(SimJudge.token_ids(_chat_text(messages), bos=True))
        asked = body.get("top_logprobs") if body.get("logprobs") else None
        self._limits(prompt_tokens, body.get("max_tokens"), asked)
        user = [m["content"] for m in messages if m.get("role") == "user"]
        decision = self.judge.decide(user[-1] if user else "")
        top = self.judge.label_logprobs(decision.p_first, ("A", "B"), max(1, asked or 0), decision.levels)
        token, logprob = top[0]

        def entry(text: str, value: float) -> dict[str, Any]:
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        logprobs = None if asked is None else {"content": [{**entry(token, logprob),
                                                            "top_logprobs": [entry(t, v) for t, v in top[:asked]]}]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.judge.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                                     "content": token, "tool_calls": []},
                             "logprobs": logprobs, "finish_reason": "length", "stop_reason": None}],
                "usage": self._usage(prompt_tokens)}


def _chat_text(messages: Any) -> str:
    """The prompt a chat request becomes (a ChatML-style template: the model's own turn markers)."""
    if not isinstance(messages, list):
        raise _bad_request("messages must be a list")
    turns = "".join(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>\n" for m in messages
                    if isinstance(m, dict))
    return turns + "<|im_start|>assistant\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a judge pool opens many connections at once

    def __init__(self, address: tuple[str, int], judge: SimJudge, *, verbose: bool = False,
                 prompts: list[str] | None = None) -> None:
        self.api = _Api(judge, prompts)
        self.verbose = verbose
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def count(self, path: str) -> None:
        with self._lock:
            self.requests[path] += 1


@dataclass
class SimJudgeServer:
    """The server in a background thread of this process (for a test or a benchmark): ``url`` once started.

    ``key`` is an :class:`AnswerKey` or the path of a key file. ``requests`` counts requests per path and
    ``judge.reasons`` the decisions by reason (decided, evidence_hidden, …). ``prompts``: a list to append every
    text the server is sent to read (prompts and tokenize texts), or None (the default) to keep none.
    """

    key: AnswerKey | str | Path
    settings: Settings = field(default_factory=Settings)
    host: str = "127.0.0.1"
    port: int = 0
    verbose: bool = False
    prompts: list[str] | None = field(default=None, repr=False)
    judge: SimJudge = field(init=False, repr=False)
    url: str = field(init=False, default="")
    _server: _Server | None = field(init=False, default=None, repr=False)
    _thread: threading.Thread | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        key = self.key if isinstance(self.key, AnswerKey) else AnswerKey.load(self.key)
        self.judge = SimJudge(key, self.settings)

    @property
    def model(self) -> str:
        return self.judge.model

    @property
    def requests(self) -> Counter[str]:
        return self._server.requests if self._server is not None else Counter()

    def start(self) -> SimJudgeServer:
        self._server = _Server((self.host, self.port), self.judge, verbose=self.verbose, prompts=self.prompts)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="sim-judge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> SimJudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m kvjudge.testing.sim_judge",
        description="A simulated judge of known quality, served as vLLM serves a model (see the module docstring "
                    "for the answer key's format and the decision rule).")
    parser.add_argument("--key", required=True, metavar="FILE", help="the answer key (JSON)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    parser.add_argument("--accuracy", type=float, default=defaults.accuracy,
                        help=f"share of decidable pairs it judges right (default {defaults.accuracy})")
    parser.add_argument("--bias", type=float, default=defaults.bias,
                        help=f"mean probability given to the run shown first (default {defaults.bias}: none)")
    parser.add_argument("--confidence", type=float, default=defaults.confidence,
                        help=f"probability given to the preferred run (default {defaults.confidence})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the per-pair draws")
    parser.add_argument("--evidence-share", type=float, default=defaults.evidence_share,
                        help="share of a run's evidence lines that must be visible to judge it (default 1.0: all)")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len,
                        help=f"the served context in tokens (default {defaults.max_model_len})")
    parser.add_argument("--max-logprobs", type=int, default=defaults.max_logprobs,
                        help=f"most logprobs a request may ask for (default {defaults.max_logprobs}, as vLLM)")
    parser.add_argument("--model", help="the served model's id (default: named after the settings and the key)")
    parser.add_argument("--sigma", type=float, default=defaults.sigma,
                        help=f"scale mode: the noise of each reading (default {defaults.sigma})")
    parser.add_argument("--sharpen", type=float, default=defaults.sharpen,
                        help="scale mode: overconfidence, readings pushed to the ends (default 1: calibrated)")
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    parser.add_argument("--json", action="store_true", help="announce the URL as one JSON line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings(accuracy=args.accuracy, bias=args.bias, confidence=args.confidence, seed=args.seed,
                            evidence_share=args.evidence_share, max_model_len=args.max_model_len,
                            max_logprobs=args.max_logprobs, model=args.model, sigma=args.sigma,
                            sharpen=args.sharpen)
        judge = SimJudge(AnswerKey.load(args.key), settings)
        server = _Server((args.host, args.port), judge, verbose=args.verbose)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}"
    if args.json:
        print(json.dumps({"url": url, "model": judge.model, "max_model_len": settings.max_model_len,
                          "runs": len(judge.key.entries)}), flush=True)
    else:
        print(f"sim judge {judge.model} ({len(judge.key.entries)} runs in the key) serving at {url}", flush=True)

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# The simulated judge's front: its server, and the key and model it serves, re-exported for tests and benchmarks.
__all__ = ["DEFAULT_MAX_LOGPROBS", "DEFAULT_MAX_MODEL_LEN", "LABEL_MASS", "VERSION", "AnswerKey", "Decision",
           "KeyEntry", "Settings", "SimJudge", "SimJudgeServer", "changed_lines", "common_pieces", "draw", "key_entry", "main",
           "quoted_views", "scale_decision", "scale_distribution", "scale_levels", "scale_noise", "sharpened",
           "write_key"]


if __name__ == "__main__":
    sys.exit(main())
