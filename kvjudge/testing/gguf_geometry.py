"""GGUF files with the shape of real models and random weights, written fast (the GPU check's models).

Only the geometry decides what llama.cpp allocates (weights, KV cache, compute buffers), so a model of a real
shape with random weights measures the probe as a real download would, and nothing large travels: the files are
written at the disk's speed from a small pool of random quantized blocks, reused at shifting offsets (the 1.2 GiB
Llama-3.2-1B shape in 9 s on the shared 2-core development machine; the 8B shape is 7.9 GiB).

A Q8_0 block is 34 bytes for 32 weights: an f16 scale, then 32 int8 values. The scale is fixed, so every weight is
finite and of the size a trained model's are (standard deviation ~0.02); norms are f32 ones. The vocabulary is a
synthetic SentencePiece one (byte tokens, ASCII pieces, then fillers up to the real ``n_vocab``): it tokenizes any
text, and the judge's labels (" A", "B", …) are one token each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvjudge.probe.gguf_shape import ModelShape

Q8_0_BLOCK = 32
Q8_0_BLOCK_BYTES = 34
# Weights of standard deviation ~0.02 from int8 values uniform in [-127, 127] (their deviation ~73).
Q8_0_SCALE = 0.02 / 73.0
POOL_BLOCKS = 1 << 20          # 34 MiB of random blocks, reused at shifting offsets
WRITE_CHUNK_BLOCKS = 1 << 18   # bytes written per call: ~8.5 MiB


@dataclass(frozen=True)
class Geometry:
    """The facts of a transformer that decide its memory on llama.cpp."""

    key: str                   # short name used in file names and the check's JSON
    arch: str                  # llama.cpp architecture ("llama", "gemma3")
    like: str                  # the real model this geometry copies
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int = 0    # 0: no windowed layers (gemma3's per-layer rule then applies: 5 local, 1 global)
    tied_output: bool = False  # no output.weight: llama.cpp reuses token_embd
    rope_base: float = 10000.0

    def scaled(self, *, n_layer: int = 6, width: int = 8, n_vocab: int = 512, n_ctx_train: int = 4096) -> Geometry:
        """A small variant with the same structure (GQA ratio, head size relation, window, tied output): for tests.

        Widths are divided by ``width`` (heads keep their ratio; a head keeps at least 32 values, a Q8_0 block)."""
        heads = max(1, self.n_head // width)
        ratio = max(1, self.n_head // self.n_head_kv)
        return dataclasses.replace(
            self, key=f"{self.key}-small", n_layer=n_layer, n_embd=max(64, self.n_embd // width // 32 * 32),
            n_head=heads, n_head_kv=max(1, heads // ratio), head_dim=max(32, self.head_dim // width // 32 * 32),
            n_ff=max(64, self.n_ff // width // 32 * 32), n_vocab=n_vocab, n_ctx_train=n_ctx_train,
            sliding_window=min(self.sliding_window, 256))

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...], bool]]:
        """``(name, shape fastest-dimension first, quantized)`` of every tensor llama.cpp loads for this arch."""
        q_width, kv_width = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        yield "token_embd.weight", (self.n_embd, self.n_vocab), True
        yield "output_norm.weight", (self.n_embd,), False
        if not self.tied_output:
            yield "output.weight", (self.n_embd, self.n_vocab), True
        for i in range(self.n_layer):
            yield f"blk.{i}.attn_norm.weight", (self.n_embd,), False
            yield f"blk.{i}.attn_q.weight", (self.n_embd, q_width), True
            yield f"blk.{i}.attn_k.weight", (self.n_embd, kv_width), True
            yield f"blk.{i}.attn_v.weight", (self.n_embd, kv_width), True
            yield f"blk.{i}.attn_output.weight", (q_width, self.n_embd), True
            if self.arch == "gemma3":
                yield f"blk.{i}.attn_q_norm.weight", (self.head_dim,), False
                yield f"blk.{i}.attn_k_norm.weight", (self.head_dim,), False
                yield f"blk.{i}.post_attention_norm.weight", (self.n_embd,), False
                yield f"blk.{i}.post_ffw_norm.weight", (self.n_embd,), False
            yield f"blk.{i}.ffn_norm.weight", (self.n_embd,), False
            yield f"blk.{i}.ffn_gate.weight", (self.n_embd, self.n_ff), True
            yield f"blk.{i}.ffn_up.weight", (self.n_embd, self.n_ff), True
            yield f"blk.{i}.ffn_down.weight", (self.n_ff, self.n_embd), True

    def weight_bytes(self) -> int:
        """Bytes of tensor data in Q8_0 (what the probe's shape reader reports as ``weight_bytes``)."""
        return sum(tensor_bytes(shape, quantized) for _, shape, quantized in self.tensors())


    def model_shape(self) -> ModelShape:
        """The shape the probe's reader gives a file of this geometry, without writing it (``file_bytes`` is the
        weights' alone: the header is left out). Checked against the reader on written files by the tests."""
        from kvjudge.probe.gguf_shape import SWA_PATTERN_BY_ARCH, ModelShape

        every = SWA_PATTERN_BY_ARCH.get(self.arch) if self.sliding_window else None
        if not self.sliding_window:
            swa_layers, source = (False,) * self.n_layer, "none"
        elif every is None:
            swa_layers, source = (True,) * self.n_layer, "rule:all"
        else:
            swa_layers = tuple(il % every < every - 1 for il in range(self.n_layer))
            source = f"rule:{self.arch}/{every}"
        weights = self.weight_bytes()
        return ModelShape(path=f"<{self.key}>", arch=self.arch, name=f"{self.like} geometry, random weights",
                          n_layer=self.n_layer, n_embd=self.n_embd, n_head=(self.n_head,) * self.n_layer,
                          n_head_kv=(self.n_head_kv,) * self.n_layer, head_dim_k=self.head_dim,
                          head_dim_v=self.head_dim, n_swa=self.sliding_window, swa_layers=swa_layers,
                          swa_source=source, n_ctx_train=self.n_ctx_train, n_vocab=self.n_vocab,
                          weight_bytes=weights, file_bytes=weights)


# The models the GPU check writes (from each model's published config).
LLAMA_31_8B = Geometry(key="llama31-8b", arch="llama", like="Llama-3.1-8B", n_layer=32, n_embd=4096, n_head=32,
                       n_head_kv=8, head_dim=128, n_ff=14336, n_vocab=128256, n_ctx_train=131072,
                       rope_base=500000.0)
GEMMA_3_4B = Geometry(key="gemma3-4b", arch="gemma3", like="Gemma-3-4B", n_layer=34, n_embd=2560, n_head=8,
                      n_head_kv=4, head_dim=256, n_ff=10240, n_vocab=262144, n_ctx_train=131072, sliding_window=1024,
                      tied_output=True, rope_base=1000000.0)
LLAMA_32_1B = Geometry(key="llama32-1b", arch="llama", like="Llama-3.2-1B", n_layer=16, n_embd=2048, n_head=32,
                       n_head_kv=8, head_dim=64, n_ff=8192, n_vocab=128256, n_ctx_train=131072, tied_output=True,
                       rope_base=500000.0)
GEOMETRIES: dict[str, Geometry] = {g.key: g for g in (LLAMA_31_8B, GEMMA_3_4B, LLAMA_32_1B)}


def tensor_bytes(shape: tuple[int, ...], quantized: bool) -> int:
    n = int(np.prod(shape))
    return n // Q8_0_BLOCK * Q8_0_BLOCK_BYTES if quantized else n * 4


def block_pool(seed: int = 0, blocks: int = POOL_BLOCKS) -> np.ndarray:
    """``blocks`` Q8_0 blocks (rows of 34 bytes): the fixed f16 scale, then 32 random int8 values."""
    rng = np.random.default_rng(seed)
    pool = np.empty((blocks, Q8_0_BLOCK_BYTES), dtype=np.uint8)
    pool[:, :2] = np.frombuffer(np.float16(Q8_0_SCALE).tobytes(), dtype=np.uint8)
    pool[:, 2:] = rng.integers(-127, 128, size=(blocks, Q8_0_BLOCK), dtype=np.int8).view(np.uint8)
    return pool


def _vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece vocabulary of exactly ``n_vocab`` tokens: specials, 256 byte tokens, ASCII pieces (with and
    without the word-start mark), fillers. Token types: 1 normal, 2 unknown, 3 control, 6 byte."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    printable = [chr(c) for c in range(33, 127)]
    words = printable + [f"\u2581{c}" for c in printable] + ["\u2581"]
    if n_vocab < len(pieces) + len(words):
        raise ValueError(f"n_vocab {n_vocab} is too small for the synthetic vocabulary (needs "
                         f"{len(pieces) + len(words)})")
    pieces += words
    types += [1] * len(words)
    pieces += [f"\u2581t{i}" for i in range(n_vocab - len(pieces))]
    types += [1] * (n_vocab - len(types))
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(n_vocab - 259)]
    return pieces, scores, types


def write_geometry(path: str | Path, geometry: Geometry, *, seed: int = 0, pool: np.ndarray | None = None) -> Path:
    """Write ``geometry`` as a Q8_0 GGUF with random weights to ``path``; returns the path."""
    import gguf

    path = Path(path)
    pool = block_pool(seed) if pool is None else pool
    writer = gguf.GGUFWriter(str(path), geometry.arch)
    writer.add_name(f"{geometry.like} geometry, random weights")
    writer.add_context_length(geometry.n_ctx_train)
    writer.add_embedding_length(geometry.n_embd)
    writer.add_block_count(geometry.n_layer)
    writer.add_feed_forward_length(geometry.n_ff)
    writer.add_head_count(geometry.n_head)
    writer.add_head_count_kv(geometry.n_head_kv)
    writer.add_key_length(geometry.head_dim)
    writer.add_value_length(geometry.head_dim)
    writer.add_rope_dimension_count(geometry.head_dim)
    writer.add_rope_freq_base(geometry.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if geometry.sliding_window:
        writer.add_sliding_window(geometry.sliding_window)
    pieces, scores, types = _vocabulary(geometry.n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    specs = list(geometry.tensors())
    for name, shape, quantized in specs:
        numpy_shape = tuple(reversed(shape))
        # With a raw type, gguf reads the shape as bytes only when the dtype is uint8: pass the element shape
        # with any other dtype.
        raw_type = gguf.GGMLQuantizationType.Q8_0 if quantized else None
        writer.add_tensor_info(name, numpy_shape, np.dtype(np.float32), tensor_bytes(shape, quantized),
                               raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    out = writer.fout[0]
    offset = 0
    for index, (_, shape, quantized) in enumerate(specs):
        writer.write_padding(out, out.tell())
        if not quantized:
            np.ones(int(np.prod(shape)), dtype=np.float32).tofile(out)
            continue
        remaining = int(np.prod(shape)) // Q8_0_BLOCK
        offset = (offset + 7919 * (index + 1)) % len(pool)  # each tensor starts elsewhere in the pool
        while remaining:
            take = min(remaining, WRITE_CHUNK_BLOCKS, len(pool) - offset)
            pool[offset:offset + take].tofile(out)
            remaining -= take
            offset = (offset + take) % len(pool)
    writer.write_padding(out, out.tell())
    writer.close()
    return path
