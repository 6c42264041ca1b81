"""Tiny GGUF models written with ``gguf.GGUFWriter`` that llama.cpp really loads (random f32 weights).

Used to check the KV math on shapes the bundled models do not have: a llama-style GQA model whose key
length differs from ``n_embd / n_head``, and a ``deci`` model with a different KV head count per layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _tensor(writer, rng, name: str, shape: tuple[int, ...], omit: tuple[str, ...] = ()) -> None:
    if name in omit:
        return
    # gguf shapes are listed fastest-dimension first (ne0, ne1); numpy arrays are the reverse.
    writer.add_tensor(name, (rng.standard_normal(tuple(reversed(shape))) * 0.02).astype(np.float32))


def _vocab(writer, n_vocab: int) -> None:
    writer.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(n_vocab - 3)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def write_llama_gqa(path: Path, *, n_layer: int = 4, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                    head_dim: int = 32, n_ff: int = 128, n_vocab: int = 256, n_ctx_train: int = 4096,
                    seed: int = 0, omit: tuple[str, ...] = (), sliding_window: int = 0,
                    swa_pattern: list[bool] | int | None = None) -> Path:
    """A llama model with grouped-query attention and ``head_dim`` ≠ ``n_embd / n_head``.

    ``omit`` leaves tensors out: the header still reads, but llama.cpp refuses to load the model.
    ``sliding_window`` / ``swa_pattern`` write the window keys (for header-reading tests only).
    """
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-gqa")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if sliding_window:
        writer.add_sliding_window(sliding_window)
    if isinstance(swa_pattern, list):
        writer.add_array("llama.attention.sliding_window_pattern", swa_pattern)
    elif swa_pattern is not None:
        writer.add_uint32("llama.attention.sliding_window_pattern", swa_pattern)
    _vocab(writer, n_vocab)
    _tensor(writer, rng, "token_embd.weight", (n_embd, n_vocab), omit)
    _tensor(writer, rng, "output_norm.weight", (n_embd,), omit)
    _tensor(writer, rng, "output.weight", (n_embd, n_vocab), omit)
    for i in range(n_layer):
        _tensor(writer, rng, f"blk.{i}.attn_norm.weight", (n_embd,), omit)
        _tensor(writer, rng, f"blk.{i}.attn_q.weight", (n_embd, head_dim * n_head), omit)
        _tensor(writer, rng, f"blk.{i}.attn_k.weight", (n_embd, head_dim * n_head_kv), omit)
        _tensor(writer, rng, f"blk.{i}.attn_v.weight", (n_embd, head_dim * n_head_kv), omit)
        _tensor(writer, rng, f"blk.{i}.attn_output.weight", (head_dim * n_head, n_embd), omit)
        _tensor(writer, rng, f"blk.{i}.ffn_norm.weight", (n_embd,), omit)
        _tensor(writer, rng, f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), omit)
        _tensor(writer, rng, f"blk.{i}.ffn_up.weight", (n_embd, n_ff), omit)
        _tensor(writer, rng, f"blk.{i}.ffn_down.weight", (n_ff, n_embd), omit)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_deci_per_layer(path: Path, *, heads_kv: tuple[int, ...] = (1, 2, 4, 2), n_head: int = 4,
                         n_embd: int = 64, n_ff: int = 128, n_vocab: int = 256, n_ctx_train: int = 4096,
                         seed: int = 1) -> Path:
    """A ``deci`` (Nemotron-NAS) model: a different KV head count in every layer, from per-layer arrays."""
    import gguf

    rng = np.random.default_rng(seed)
    n_layer = len(heads_kv)
    head_dim = n_embd // n_head
    writer = gguf.GGUFWriter(str(path), "deci")
    writer.add_name("tiny-deci-per-layer")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length([n_ff] * n_layer)
    writer.add_head_count([n_head] * n_layer)
    writer.add_head_count_kv(list(heads_kv))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _vocab(writer, n_vocab)
    _tensor(writer, rng, "token_embd.weight", (n_embd, n_vocab))
    _tensor(writer, rng, "output_norm.weight", (n_embd,))
    _tensor(writer, rng, "output.weight", (n_embd, n_vocab))
    for i, kv in enumerate(heads_kv):
        _tensor(writer, rng, f"blk.{i}.attn_norm.weight", (n_embd,))
        _tensor(writer, rng, f"blk.{i}.attn_q.weight", (n_embd, head_dim * n_head))
        _tensor(writer, rng, f"blk.{i}.attn_k.weight", (n_embd, head_dim * kv))
        _tensor(writer, rng, f"blk.{i}.attn_v.weight", (n_embd, head_dim * kv))
        _tensor(writer, rng, f"blk.{i}.attn_output.weight", (head_dim * n_head, n_embd))
        _tensor(writer, rng, f"blk.{i}.ffn_norm.weight", (n_embd,))
        _tensor(writer, rng, f"blk.{i}.ffn_gate.weight", (n_embd, n_ff))
        _tensor(writer, rng, f"blk.{i}.ffn_up.weight", (n_embd, n_ff))
        _tensor(writer, rng, f"blk.{i}.ffn_down.weight", (n_ff, n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
