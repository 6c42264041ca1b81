"""Model shape from the GGUF header (no weights loaded) and bad model files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_factory import write_deci_per_layer, write_llama_gqa
from kvjudge.errors import ModelError
from kvjudge.probe import read_model_shape


def test_default_model_shape(default_model: Path) -> None:
    shape = read_model_shape(default_model)
    assert (shape.arch, shape.n_layer, shape.n_embd, shape.n_ctx_train, shape.n_vocab) == \
        ("gemma3", 18, 640, 32768, 262144)
    assert shape.n_head == (4,) * 18 and shape.n_head_kv == (1,) * 18
    # Gemma's head size (256) is not n_embd / n_head (160): it must come from key_length / value_length.
    assert (shape.head_dim_k, shape.head_dim_v) == (256, 256)
    assert shape.n_swa == 512 and shape.swa_source == "rule:gemma3/6"
    assert [i for i, swa in enumerate(shape.swa_layers) if not swa] == [5, 11, 17]
    assert 0 < shape.weight_bytes < shape.file_bytes == default_model.stat().st_size


def test_judge_model_shape(judge_model: Path) -> None:
    shape = read_model_shape(judge_model)
    assert (shape.arch, shape.n_layer, shape.n_vocab) == ("qwen2", 24, 151936)
    assert set(shape.n_head_kv) == {2} and shape.head_dim_k == 64
    assert not shape.uses_swa and shape.swa_source == "none"


def test_per_layer_kv_heads_and_explicit_key_length(tmp_path: Path) -> None:
    deci = read_model_shape(write_deci_per_layer(tmp_path / "deci.gguf", heads_kv=(1, 2, 4, 2)))
    assert deci.n_head_kv == (1, 2, 4, 2) and deci.n_head == (4, 4, 4, 4)
    assert [deci.n_embd_k_gqa(i) for i in range(4)] == [16, 32, 64, 32]
    llama = read_model_shape(write_llama_gqa(tmp_path / "llama.gguf", n_embd=64, n_head=4, head_dim=32))
    assert llama.head_dim_k == 32 != llama.n_embd // llama.n_head[0]
    assert llama.n_head_kv == (2,) * 4 and llama.n_vocab == 256


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        read_model_shape(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="is a directory"):
        read_model_shape(tmp_path)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_text("this is a text file, not weights\n")
    with pytest.raises(ModelError, match="not a GGUF"):
        read_model_shape(path)


@pytest.mark.parametrize("keep", [16, 200, 2000])
def test_truncated_header(tmp_path: Path, keep: int) -> None:
    whole = write_llama_gqa(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:keep])
    with pytest.raises(ModelError, match="truncated") as error:
        read_model_shape(cut)
    assert "\n" not in str(error.value)


def test_truncated_tensor_data(tmp_path: Path) -> None:
    whole = write_llama_gqa(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:-4096])
    with pytest.raises(ModelError, match="truncated"):
        read_model_shape(cut)


def test_sliding_window_layers_from_the_file_or_the_rule(tmp_path: Path) -> None:
    listed = read_model_shape(write_llama_gqa(tmp_path / "a.gguf", sliding_window=128,
                                              swa_pattern=[True, False, True, True]))
    assert (listed.n_swa, listed.swa_layers, listed.swa_source) == (128, (True, False, True, True), "file")
    every = read_model_shape(write_llama_gqa(tmp_path / "b.gguf", sliding_window=128, swa_pattern=2))
    assert every.swa_layers == (True, False, True, False) and every.swa_source == "file:2"
    unnamed = read_model_shape(write_llama_gqa(tmp_path / "c.gguf", sliding_window=128))
    assert unnamed.swa_layers == (True,) * 4 and unnamed.swa_source == "rule:all"
    none = read_model_shape(write_llama_gqa(tmp_path / "d.gguf"))
    assert not none.uses_swa and none.swa_source == "none"
