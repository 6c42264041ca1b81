"""Pins every behaviour of llama-cpp-python and gguf that ``kvjudge._llama`` relies on.

The real library on the bundled models and on GGUF files written by ``gguf_factory``. When an upgrade of
either library breaks one of these, the adapter is the one place to change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gguf_factory import write_llama_gqa
from kvjudge import _llama
from kvjudge.probe import kv_cache_bytes, read_model_shape
from kvjudge.tokens import ModelTokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_versions_are_the_ones_pinned_and_written_against() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {line.split("==")[0]: line.split("==")[1]
            for line in [*project["dependencies"], *project["optional-dependencies"]["local"]] if "==" in line}
    assert pins["llama-cpp-python"] == _llama.LLAMA_CPP_PYTHON_VERSION == version("llama-cpp-python")
    assert pins["gguf"] == _llama.GGUF_VERSION == version("gguf")


# -- gguf: the header reader ------------------------------------------------------------------------------

def test_the_header_reader_reads_what_the_stock_reader_reads_without_long_array_contents(tmp_path: Path) -> None:
    from gguf import GGUFReader, GGUFValueType

    n_vocab = _llama.LONG_ARRAY + 904  # token strings, scores (f32) and types (i32): three long arrays
    path = write_llama_gqa(tmp_path / "long-vocab.gguf", n_vocab=n_vocab, n_layer=2)
    stock, header = GGUFReader(str(path), "r"), _llama.header_reader(str(path))
    assert list(header.fields) == list(stock.fields)
    long_arrays = set()
    for name, field in stock.fields.items():
        ours = header.fields[name]
        assert ours.types == field.types and ours.offset == field.offset, name
        if field.types[0] == GGUFValueType.ARRAY and len(field.data) > _llama.LONG_ARRAY:
            long_arrays.add(name)
            assert _llama.array_length(ours) == _llama.array_length(field) == len(field.data)
            assert ours.data == []  # stepped over: no values were built
        else:
            assert ours.contents() == field.contents(), name
    assert long_arrays == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    assert [(t.name, list(t.shape), t.tensor_type, t.data_offset, t.n_bytes) for t in header.tensors] == \
           [(t.name, list(t.shape), t.tensor_type, t.data_offset, t.n_bytes) for t in stock.tensors]
    shape = read_model_shape(path)
    assert shape.n_vocab == n_vocab and shape.n_layer == 2


def test_the_header_reader_raises_on_a_cut_off_header(tmp_path: Path) -> None:
    path = write_llama_gqa(tmp_path / "whole.gguf", n_vocab=_llama.LONG_ARRAY + 10, n_layer=1)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:2000])  # inside the token strings
    with pytest.raises((ValueError, IndexError, KeyError, OSError, TypeError)):
        _llama.header_reader(str(cut))


# -- the low-level model, context and batch: in a child process (llama.cpp's log is process-wide) ----------

_CHILD = r"""
import json, resource, sys
from kvjudge import _llama
from kvjudge.probe.trial import parse_log

model_path, broken_path = sys.argv[1], sys.argv[2]
seen = {}
log = []
_llama.capture_native_log(log)
model = _llama.open_model(model_path)
params = _llama.context_params()
params.n_ctx, params.n_batch, params.n_ubatch = 256, 64, 64
params.flash_attn_type = _llama.flash_attention_type(False)
log.clear()
context = _llama.open_context(model, params)
text = "".join(log)
seen["kv_bytes"] = parse_log(text)["kv_bytes"]
seen["flash_attn_disabled"] = "flash_attn            = disabled" in text
seen["tokens"] = _llama.tokenize(model, "hello world", add_bos=True)
seen["n_vocab"] = _llama.n_vocab(model)
decoder = _llama.Decoder(context, 64)
decoder.decode(seen["tokens"], n_past=0)
logits = _llama.last_logits(context, seen["n_vocab"])
seen["logits"] = [len(logits), bool(abs(logits).max() > 0), bool((logits == logits).all())]
n_past = len(seen["tokens"])
try:
    while True:  # fill the 256 cells: the decode that finds none free must fail
        decoder.decode([int(logits.argmax())] * 64, n_past=n_past)
        n_past += 64
except RuntimeError as exc:
    seen["full"] = [n_past, str(exc)]
context.close()
try:
    _llama.open_model(broken_path)
except ValueError as exc:
    seen["broken_model"] = str(exc)
# An allocation beyond RLIMIT_DATA fails inside llama.cpp as on a host out of memory (certification uses this).
resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))
params.n_ctx = 1 << 22
log.clear()
try:
    _llama.open_context(model, params)
except ValueError as exc:
    seen["over_limit"] = [str(exc), parse_log("".join(log))["oom_in_log"]]
print(json.dumps(seen))
"""


@pytest.mark.model
def test_model_context_batch_and_log_as_certification_uses_them(default_model: Path, tmp_path: Path) -> None:
    broken = write_llama_gqa(tmp_path / "broken.gguf", omit=("output_norm.weight",))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(default_model), str(broken)], capture_output=True,
                          text=True, timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # The log carries the KV allocation, which the KV math predicts to the byte.
    assert seen["kv_bytes"] == kv_cache_bytes(read_model_shape(default_model), 256)
    assert seen["flash_attn_disabled"] is True
    tokenizer = ModelTokenizer(default_model)
    assert seen["tokens"] == tokenizer.tokenize("hello world", add_bos=True)
    assert seen["tokens"][0] == tokenizer.llama.token_bos()
    assert seen["logits"] == [seen["n_vocab"], True, True] and seen["n_vocab"] == tokenizer.llama.n_vocab()
    assert seen["full"][0] == len(seen["tokens"]) + 3 * 64 and "llama_decode returned" in seen["full"][1]
    assert "broken_model" in seen
    assert seen["over_limit"] == ["Failed to create llama_context", True]


# -- llama_cpp.Llama: output, KV cache, logits, chat templates ---------------------------------------------

@pytest.fixture(scope="module")
def llama(default_model: Path) -> Any:
    from llama_cpp import Llama

    loaded = Llama(model_path=str(default_model), n_ctx=512, n_batch=64, logits_all=False, verbose=False)
    yield loaded
    loaded.close()


def _pos_max(llama: Any) -> int:
    import llama_cpp

    return llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(llama.ctx), 0)


def test_quiet_native_output_silences_c_level_stderr_and_only_inside(capfd: pytest.CaptureFixture[str]) -> None:
    with _llama.quiet_native_output():
        os.write(2, b"from C inside\n")
        os.write(1, b"stdout inside\n")
    os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert out == "" and err == "after\n"


@pytest.mark.model
def test_a_vocab_only_load_is_silent(default_model: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    assert ModelTokenizer(default_model).count("hello") > 0
    assert capfd.readouterr() == ("", "")


@pytest.mark.model
@pytest.mark.parametrize("which", ["default_model", "judge_model"])
def test_the_judge_backends_tokenizer_loads_silently(which: str, request: pytest.FixtureRequest,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    """The judge opens the model's vocabulary alone before it knows its window: llama.cpp's warning about that
    context (n_ctx_train 0) must not reach the user's terminal between the demo's steps."""
    from kvjudge.judge import LlamaBackend

    model = request.getfixturevalue(which)
    capfd.readouterr()
    backend = LlamaBackend(model_path=model)
    assert backend.count("hello world") > 0
    assert capfd.readouterr() == ("", "")


@pytest.mark.model
def test_rewind_keeps_exactly_the_prefix_and_evaluation_continues_there(llama: Any) -> None:
    tokens = llama.tokenize(b"The quick brown fox jumps over the lazy dog. " * 4, add_bos=True)
    keep = len(tokens) // 2
    llama.reset()
    llama.eval(tokens[:keep])
    llama.eval(tokens[keep:])
    assert _pos_max(llama) == len(tokens) - 1 and llama.n_tokens == len(tokens)
    first = _llama.last_logits(llama, llama.n_vocab()).copy()
    assert _llama.rewind(llama, keep) == keep
    assert _pos_max(llama) == keep - 1 and llama.n_tokens == keep
    assert list(llama.input_ids[:keep]) == tokens[:keep]
    llama.eval(tokens[keep:])
    assert np.array_equal(_llama.last_logits(llama, llama.n_vocab()), first)
    assert _llama.rewind(llama, 0) == 0 and _pos_max(llama) == -1 and llama.n_tokens == 0


@pytest.mark.model
def test_last_logits_are_the_last_positions_and_scores_stay_empty(llama: Any, default_model: Path) -> None:
    from llama_cpp import Llama

    tokens = llama.tokenize(b"def add(a, b):\n    return", add_bos=True)
    llama.reset()
    llama.eval(tokens)
    ours = _llama.last_logits(llama, llama.n_vocab()).copy()
    assert ours.shape == (llama.n_vocab(),) and np.isfinite(ours).all()
    assert not llama.scores[len(tokens) - 1].any()  # why the adapter reads them itself
    every = Llama(model_path=str(default_model), n_ctx=512, n_batch=64, logits_all=True, verbose=False)
    try:
        every.eval(tokens)
        assert np.allclose(every.scores[len(tokens) - 1], ours, rtol=1e-4, atol=1e-3)
        assert int(every.scores[len(tokens) - 1].argmax()) == int(ours.argmax())
    finally:
        every.close()


@pytest.mark.model
def test_end_of_generation_ids_hold_the_eos_token(llama: Any) -> None:
    ids = _llama.end_of_generation_ids(llama)
    assert llama.token_eos() in ids and 0 < len(ids) < 100


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another one?"}]


def _prompt_tokens(llama: Any, render: _llama.ChatRenderer) -> int:
    prompt, added_special = render(MESSAGES)
    return len(llama.tokenize(prompt.encode(), add_bos=not added_special, special=True))


@pytest.mark.model
def test_chatml_renders_what_create_chat_completion_sends(llama: Any) -> None:
    render = _llama.chat_renderer(llama, "chatml")
    prompt, _ = render(MESSAGES)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n")
    llama.chat_format = "chatml"
    llama.reset()
    sent = llama.create_chat_completion(messages=MESSAGES, max_tokens=1, temperature=0.0)["usage"]["prompt_tokens"]
    assert _prompt_tokens(llama, render) == sent


@pytest.mark.model
def test_the_models_own_template_renders_what_create_chat_completion_sends(judge_model: Path,
                                                                           llama: Any) -> None:
    from llama_cpp import Llama

    with pytest.raises(LookupError):  # the default model is a base model: no template
        _llama.chat_renderer(llama, "model")
    with pytest.raises(ValueError, match="unknown chat template"):
        _llama.chat_renderer(llama, "llama-9")
    judge = Llama(model_path=str(judge_model), n_ctx=256, n_batch=64, verbose=False)
    try:
        assert judge.chat_format == "chat_template.default"  # llama-cpp-python uses the GGUF's template
        render = _llama.chat_renderer(judge, "model")
        prompt, _ = render(MESSAGES)
        assert "<|im_start|>user\nAnother one?<|im_end|>\n" in prompt and prompt.endswith("<|im_start|>assistant\n")
        sent = judge.create_chat_completion(messages=MESSAGES, max_tokens=1, temperature=0.0)["usage"]
        assert _prompt_tokens(judge, render) == sent["prompt_tokens"]
    finally:
        judge.close()


# A template using what llama-cpp-python's formatter adds to plain Jinja: the generation tag, loop controls, tojson.
_FEATURES_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% generation %}<{{ m.role }}>{{ m.content | tojson }}{% endgeneration %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token if false }}"
)


@pytest.mark.model
def test_a_chat_template_renders_without_llama_cpp_as_its_formatter_renders_it(judge_model: Path) -> None:
    # A judge-pool install frames prompts from a served model's template with kvjudge.judge.chat_template alone.
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from kvjudge.judge.chat_template import render_chat_template

    with _llama.quiet_native_output():
        judge = _llama.load_llama(model_path=str(judge_model), vocab_only=True, verbose=False)
    source, bos, eos = _llama.chat_template_inputs(judge)
    assert source
    unicode = [*MESSAGES, {"role": "user", "content": 'quotes " and ü, 東京'}]
    for template in (source, _FEATURES_TEMPLATE):
        for messages in (MESSAGES, unicode, MESSAGES[:1]):
            theirs = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=messages).prompt
            assert render_chat_template(template, messages, bos_token=bos, eos_token=eos) == theirs
    assert '"quotes \\" and ü, 東京"' in render_chat_template(_FEATURES_TEMPLATE, unicode)
    with pytest.raises(ValueError, match="no system"):
        render_chat_template("{{ raise_exception('no system') }}", MESSAGES)
