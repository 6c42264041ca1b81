"""A model's shape from its GGUF header, read with the ``gguf`` library without loading the weights.

Everything the KV math needs comes from the file: per-layer KV head counts (scalar or array), key and value
head sizes from ``*.attention.key_length`` / ``value_length`` (not ``n_embd / n_head``, which is wrong for
Gemma), and which layers use a sliding window. Where the file names no per-layer pattern the
per-architecture rule of llama.cpp applies (Gemma 3: five local layers, then one global).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjudge._llama import array_length, header_reader
from kvjudge.errors import ModelError

GGUF_MAGIC = b"GGUF"

# llama.cpp's per-architecture sliding-window rule for files that give a window but no pattern:
# layer ``il`` is windowed when ``il % n < n - 1`` (n = 2: even layers local; n = 6: five local, one global).
SWA_PATTERN_BY_ARCH: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "cohere2": 4,
    "gpt-oss": 2,
}


@dataclass(frozen=True)
class ModelShape:
    """The facts of a GGUF model that decide its memory footprint."""

    path: str
    arch: str
    name: str | None
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]        # per layer
    n_head_kv: tuple[int, ...]     # per layer (a scalar in the file is repeated)
    head_dim_k: int
    head_dim_v: int
    n_swa: int                     # sliding-window size, 0 when the model has none
    swa_layers: tuple[bool, ...]   # per layer: does this layer use the window?
    swa_source: str                # "file", "rule:<arch>/<n>", or "none"
    n_ctx_train: int
    n_vocab: int
    weight_bytes: int              # bytes of tensor data (what the weights occupy when mapped)
    file_bytes: int
    repack_bytes: int = 0          # estimate: weights the CPU backend copies into interleaved layouts

    @property
    def uses_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    def n_embd_k_gqa(self, layer: int) -> int:
        return self.head_dim_k * self.n_head_kv[layer]

    def n_embd_v_gqa(self, layer: int) -> int:
        return self.head_dim_v * self.n_head_kv[layer]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "arch": self.arch, "name": self.name, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": list(self.n_head), "n_head_kv": list(self.n_head_kv), "head_dim_k": self.head_dim_k,
            "head_dim_v": self.head_dim_v, "n_swa": self.n_swa,
            "swa_layers": [i for i, swa in enumerate(self.swa_layers) if swa], "swa_source": self.swa_source,
            "n_ctx_train": self.n_ctx_train, "n_vocab": self.n_vocab, "weight_bytes": self.weight_bytes,
            "file_bytes": self.file_bytes, "repack_bytes": self.repack_bytes,
        }


def _field_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def _per_layer(value: Any, n_layer: int, key: str, path: Path) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelError(f"{path}: {key} has {len(value)} entries for {n_layer} layers; the file is inconsistent")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def _open_reader(path: Path) -> Any:
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError as exc:
        raise ModelError(f"model file {path} does not exist; check the path") from exc
    except IsADirectoryError as exc:
        raise ModelError(f"{path} is a directory; pass the path of a .gguf file") from exc
    except OSError as exc:
        raise ModelError(f"cannot read model file {path}: {exc.strerror}; check its permissions") from exc
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with 'GGUF'); pass a .gguf model")
    try:
        return header_reader(str(path))
    except (ValueError, IndexError, KeyError, OSError, TypeError) as exc:
        # The gguf reader runs off the end of a cut-off header with assorted errors.
        raise ModelError(f"{path} is a truncated or damaged GGUF ({type(exc).__name__}: {exc}); "
                         f"download or assemble it again") from exc


def read_model_shape(path: str | os.PathLike[str]) -> ModelShape:
    """Read architecture, layers, heads, KV heads, head sizes, sliding window, training context, vocabulary
    size and weight bytes from the GGUF header. Raises :class:`ModelError` for a missing, non-GGUF or
    truncated file."""
    path = Path(path).expanduser()
    reader = _open_reader(path)
    file_bytes = path.stat().st_size
    data_end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if data_end > file_bytes:
        raise ModelError(f"{path} is truncated: its tensors need {data_end} bytes but the file has {file_bytes}; "
                         f"download or assemble it again")
    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{path} has no general.architecture; it is not a model GGUF")

    def need(key: str) -> Any:
        value = _field_value(reader, f"{arch}.{key}")
        if value is None:
            raise ModelError(f"{path} lacks {arch}.{key}; kvjudge cannot size this model's KV cache")
        return value

    n_layer = int(need("block_count"))
    n_embd = int(need("embedding_length"))
    n_head = _per_layer(need("attention.head_count"), n_layer, "attention.head_count", path)
    kv_raw = _field_value(reader, f"{arch}.attention.head_count_kv")
    n_head_kv = _per_layer(kv_raw, n_layer, "attention.head_count_kv", path) if kv_raw is not None else n_head
    first_heads = next((h for h in n_head if h > 0), 0)
    default_head_dim = n_embd // first_heads if first_heads else 0
    key_length = _field_value(reader, f"{arch}.attention.key_length")
    value_length = _field_value(reader, f"{arch}.attention.value_length")
    head_dim_k = int(key_length) if key_length is not None else default_head_dim
    head_dim_v = int(value_length) if value_length is not None else default_head_dim

    n_swa = int(_field_value(reader, f"{arch}.attention.sliding_window") or 0)
    pattern = _field_value(reader, f"{arch}.attention.sliding_window_pattern")
    if n_swa <= 0:
        swa_layers, swa_source = (False,) * n_layer, "none"
    elif isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelError(f"{path}: sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        swa_layers, swa_source = tuple(bool(v) for v in pattern), "file"
    else:
        every = int(pattern) if pattern is not None else SWA_PATTERN_BY_ARCH.get(arch)
        if every is None:
            # llama.cpp windows every layer of an architecture that names a window but no pattern.
            swa_layers, swa_source = (True,) * n_layer, "rule:all"
        else:
            swa_layers = tuple(every == 0 or il % every < every - 1 for il in range(n_layer))
            swa_source = f"file:{every}" if pattern is not None else f"rule:{arch}/{every}"

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab_size = _field_value(reader, f"{arch}.vocab_size")
    n_vocab = int(vocab_size) if vocab_size is not None else (array_length(tokens) if tokens is not None else 0)
    name = _field_value(reader, "general.name")
    return ModelShape(
        path=str(path), arch=arch, name=name if isinstance(name, str) else None, n_layer=n_layer, n_embd=n_embd,
        n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v, n_swa=n_swa,
        swa_layers=swa_layers, swa_source=swa_source, n_ctx_train=int(need("context_length")), n_vocab=n_vocab,
        weight_bytes=sum(int(t.n_bytes) for t in reader.tensors), file_bytes=file_bytes,
        repack_bytes=_repack_bytes(reader),
    )


# ggml's CPU backend (x86, AVX2) keeps a second, interleaved copy of layer matrices in these types whose
# row count is a multiple of 8 (its "CPU_REPACK" buffer). Matches the log for both bundled models.
_REPACKED_TYPES = ("Q4_0", "Q4_K", "IQ4_NL")


def _repack_bytes(reader: Any) -> int:
    total = 0
    for tensor in reader.tensors:
        dims = [int(d) for d in tensor.shape]
        if (tensor.name.startswith("blk.") and tensor.tensor_type.name in _REPACKED_TYPES
                and len(dims) == 2 and dims[1] % 8 == 0):
            total += int(tensor.n_bytes)
    return total
