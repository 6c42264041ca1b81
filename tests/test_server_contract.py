"""Contract test of vLLM's answer shapes, built from vLLM's documented JSON (vLLM cannot run on this machine).

The shapes are those of vLLM's OpenAI-compatible server (``vllm/entrypoints/openai/protocol.py``): a model card
with ``max_model_len`` and ``owned_by: "vllm"`` (and a ``created`` stamped at every request), completions
``logprobs.top_logprobs`` as a list of ``{token: logprob}`` maps, chat ``logprobs.content[i].top_logprobs`` as a
list of ``{"token", "logprob", "bytes"}``, ``/tokenize`` answering ``{"count", "max_model_len", "tokens"}``, and its
refusals worded as vLLM words them (context length; ``Requested sample logprobs of N, which is greater than max
allowed: 20``). An httpx MockTransport answers kvjudge's real client with them as vLLM would; everything on
kvjudge's side is the production code path.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from typing import Any

import httpx
import pytest

from kvjudge.errors import ContextRefused
from kvjudge.judge import PromptOverflow, ServerBackend
from kvjudge.judge.prompt import TemplateText
from kvjudge.judge.server_logprobs import VLLM_MAX_LOGPROBS
from kvjudge.server_client import ServerClient, Usage, context_refusal, usage_of
from kvjudge.testing.sim_judge import AnswerKey, Settings, SimJudge, SimJudgeServer

URL = "http://vllm-box:8000"
MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
MAX_MODEL_LEN = 4096
_created = itertools.count(1_717_000_000)


def _models() -> dict[str, Any]:
    return {"object": "list", "data": [{
        "id": MODEL, "object": "model", "created": next(_created), "owned_by": "vllm", "root": MODEL,
        "parent": None, "max_model_len": MAX_MODEL_LEN,
        "permission": [{"id": "modelperm-0", "object": "model_permission", "created": next(_created),
                        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                        "organization": "*", "group": None, "is_blocking": False}]}]}


COMPLETION = {
    "id": "cmpl-0", "object": "text_completion", "created": 1_717_000_100, "model": MODEL,
    "choices": [{"index": 0, "text": " A",
                 "logprobs": {"text_offset": [0], "token_logprobs": [-0.31], "tokens": [" A"],
                              "top_logprobs": [{" A": -0.31, " B": -1.46, " The": -4.2}]},
                 "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}],
    "usage": {"prompt_tokens": 812, "total_tokens": 813, "completion_tokens": 1, "prompt_tokens_details": None}}

CHAT = {
    "id": "chatcmpl-0", "object": "chat.completion", "created": 1_717_000_200, "model": MODEL,
    "choices": [{"index": 0,
                 "message": {"role": "assistant", "reasoning_content": None, "content": "B", "tool_calls": []},
                 "logprobs": {"content": [{"token": "B", "logprob": -0.2, "bytes": [66], "top_logprobs": [
                     {"token": "B", "logprob": -0.2, "bytes": [66]}, {"token": "A", "logprob": -1.8, "bytes": [65]},
                     {"token": "The", "logprob": -5.0, "bytes": [84, 104, 101]}]}]},
                 "finish_reason": "length", "stop_reason": None}],
    "usage": {"prompt_tokens": 830, "total_tokens": 831, "completion_tokens": 1, "prompt_tokens_details": None}}


def _error(message: str) -> httpx.Response:
    return httpx.Response(400, json={"object": "error", "message": message, "type": "BadRequestError",
                                     "param": None, "code": 400})


class VllmAnswers:
    """What vLLM answers, per its documentation; records every request body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.bodies.append({"path": path, **body})
        if path == "/v1/models":
            return httpx.Response(200, json=_models())
        if path == "/version":
            return httpx.Response(200, json={"version": "0.8.5"})
        if path == "/tokenize":
            tokens = list(range(len(body["prompt"].split())))
            return httpx.Response(200, json={"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens})
        if path in ("/v1/completions", "/v1/chat/completions"):
            asked = body.get("logprobs") if path == "/v1/completions" else body.get("top_logprobs")
            if asked is not None and asked > VLLM_MAX_LOGPROBS:
                return _error(f"Requested sample logprobs of {asked}, which is greater than max allowed: "
                              f"{VLLM_MAX_LOGPROBS}")
            text = body["prompt"] if path == "/v1/completions" else body["messages"][-1]["content"]
            prompt = len(text.split())
            if prompt + body["max_tokens"] > MAX_MODEL_LEN:
                return _error(f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                              f"requested {prompt + body['max_tokens']} tokens ({prompt} in the messages, "
                              f"{body['max_tokens']} in the completion). Please reduce the length of the messages "
                              f"or completion.")
            return httpx.Response(200, json=COMPLETION if path == "/v1/completions" else CHAT)
        return httpx.Response(404, json={"detail": "Not Found"})


def _backend(answers: VllmAnswers, **kwargs: Any) -> ServerBackend:
    client = ServerClient(URL, transport=httpx.MockTransport(answers))
    return ServerBackend(url=URL, client=client, **kwargs)


def test_vllm_documented_answer_shapes_contract() -> None:
    answers = VllmAnswers()
    backend = _backend(answers, top_logprobs=50)
    info = backend.info
    assert info is not None and info.kind == "vllm" and info.version == "0.8.5" and info.model_id == MODEL
    assert backend.n_ctx == MAX_MODEL_LEN and "max_model_len" in (backend.n_ctx_source or "")
    # vLLM's default cap on logprobs is respected whatever was asked.
    assert backend.top_logprobs == VLLM_MAX_LOGPROBS

    # Completions API: the first token's {token: logprob} map; " A" and " B" are the labels.
    score = backend.score(["Which run? Answer:"])
    a, b = math.exp(-0.31), math.exp(-1.46)
    assert score.probs["A"] == pytest.approx(a / (a + b)) and score.label_mass == pytest.approx(a + b)
    assert score.prompt_tokens == 812
    sent = answers.bodies[-1]
    assert sent["path"] == "/v1/completions" and sent["logprobs"] == VLLM_MAX_LOGPROBS
    assert sent["model"] == MODEL and sent["max_tokens"] == 1 and sent["temperature"] == 0.0

    # The chat framing (template segments around the question) goes to the chat completions API as one user
    # message, the server applying its template; the answer is content[0].top_logprobs, a list of objects.
    score = backend.score([TemplateText("<|im_start|>user\n"), "Which run? Answer with A or B.",
                           TemplateText("<|im_end|>\n<|im_start|>assistant\n")])
    a, b = math.exp(-1.8), math.exp(-0.2)
    assert score.probs["B"] == pytest.approx(b / (a + b)) and score.prompt_tokens == 830
    sent = answers.bodies[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["logprobs"] is True
    assert sent["top_logprobs"] == VLLM_MAX_LOGPROBS
    assert sent["messages"] == [{"role": "user", "content": "Which run? Answer with A or B."}]

    # A prompt over max_model_len is refused: an overflow outcome, with vLLM's figures read from its words.
    with pytest.raises(PromptOverflow) as over:
        backend.score(["word " * MAX_MODEL_LEN])
    refusal = over.value.__cause__
    assert isinstance(refusal, ContextRefused)
    assert refusal.n_ctx == MAX_MODEL_LEN and refusal.prompt_tokens == MAX_MODEL_LEN

    # vLLM stamps `created` on every /v1/models answer: the manifest (and so the cache key) must not carry it.
    again = _backend(answers)
    assert again.manifest() == _backend(answers).manifest()
    assert "created" not in json.dumps(again.manifest())

    # Its tokenizer endpoint: {"count", "tokens"} from a "prompt" (no special tokens added).
    assert backend.count("one two three") == 3
    assert answers.bodies[-1]["path"] == "/tokenize" and answers.bodies[-1]["add_special_tokens"] is False


def test_each_server_familys_context_refusal_is_a_measured_overflow() -> None:
    # llama.cpp's llama-server puts the figures in fields of its error object.
    llama_cpp = context_refusal("the request exceeds the available context size, try increasing it",
                                {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
                                 "n_ctx": 4096})
    assert llama_cpp is not None and (llama_cpp.n_ctx, llama_cpp.prompt_tokens) == (4096, 5000)
    # llama-cpp-python's server (seen from the real one in tests/test_probe_server.py).
    python = context_refusal("This model's maximum context length is 512 tokens, however you requested 1103 tokens "
                             "(1102 in your prompt; 1 for the completion). Please reduce your prompt; or completion "
                             "length.", {"code": "context_length_exceeded", "type": "invalid_request_error"})
    assert python is not None and (python.n_ctx, python.prompt_tokens) == (512, 1102)
    # Any other refusal is not an overflow.
    assert context_refusal("Requested sample logprobs of 21, which is greater than max allowed: 20", {}) is None


def test_a_plain_http_server_is_identified_and_counts_without_loading_httpx() -> None:
    # A command whose verdicts are all cached only identifies its server, and a reduction only counts with it: neither
    # should pay for httpx — the search for the tokenize route, whose first guess is refused, included.
    code = ("import sys\nfrom kvjudge.server_client import ServerClient\nclient = ServerClient(sys.argv[1])\n"
            "info = client.identify()\ntokens = client.count('Hello there, judge.')\nclient.close()\n"
            "print(info.kind, info.model_id, tokens, 'httpx' in sys.modules)")
    with SimJudgeServer(AnswerKey([]), Settings()) as server:
        done = subprocess.run([sys.executable, "-c", code, server.url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        expected = len(SimJudge.tokens("Hello there, judge."))
        assert expected > 0 and done.stdout.split() == ["vllm", server.model, str(expected), "False"]
        # /extras/tokenize refused (404), then /tokenize for "" (the offset) and for the text.
        assert dict(server.requests) == {"/v1/models": 1, "/version": 1, "/extras/tokenize": 1, "/tokenize": 2}


def test_each_server_familys_cached_prompt_tokens_are_read_and_silence_is_not_reported() -> None:
    # vLLM with --enable-prompt-tokens-details; without it, prompt_tokens_details is null.
    vllm = {"usage": {"prompt_tokens": 1200, "completion_tokens": 1, "total_tokens": 1201,
                      "prompt_tokens_details": {"cached_tokens": 1184}}}
    assert usage_of(vllm) == Usage(1200, 1184, 1)
    assert usage_of({"usage": {**vllm["usage"], "prompt_tokens_details": None}}) == Usage(1200, None, 1)
    # llama.cpp's llama-server: timings.cache_n beside the usage.
    llama_cpp = {"usage": {"prompt_tokens": 900, "completion_tokens": 1}, "timings": {"cache_n": 640, "prompt_n": 260}}
    assert usage_of(llama_cpp) == Usage(900, 640, 1)
    # llama-cpp-python's server says nothing of its cache: not reported, never 0.
    assert usage_of({"usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51}}) == Usage(50, None, 1)
    assert usage_of({}) == Usage(None, None, None)
