"""Runtime settings that change the KV-cache footprint, and the memory-size parser."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from kvjudge.errors import UsageError

# The KV types llama.cpp accepts for its cache, by the names its log and CLI use.
KV_TYPE_NAMES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


@dataclass(frozen=True)
class RuntimeSettings:
    """What changes the KV footprint of a context; every field is part of the capability fingerprint.

    ``swa_full=True`` is llama-cpp-python's default (a full-size cache for sliding-window layers);
    ``gpu_layers`` counts layers offloaded to the first GPU (``-1`` = all).
    """

    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    swa_full: bool = True
    n_seq: int = 1
    gpu_layers: int = 0
    n_ubatch: int = 512

    def __post_init__(self) -> None:
        for label, name in (("type_k", self.type_k), ("type_v", self.type_v)):
            if name not in KV_TYPE_NAMES:
                raise UsageError(f"unknown KV cache type {name!r} for {label}; use one of {', '.join(KV_TYPE_NAMES)}")
        if self.n_seq < 1:
            raise UsageError(f"n_seq must be at least 1, got {self.n_seq}")
        if self.gpu_layers < -1:
            raise UsageError(f"gpu_layers must be -1 (all), 0 or a positive count, got {self.gpu_layers}")
        if self.n_ubatch < 1:
            raise UsageError(f"n_ubatch must be positive, got {self.n_ubatch}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in a size such as ``6GiB``, ``512MiB``, ``1.5GB`` or ``1048576``.

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) powers of 1000.
    Zero, negative or unparseable sizes raise :class:`UsageError`.
    """
    if isinstance(text, bool):
        raise UsageError(f"memory size must be a size such as 6GiB, got {text!r}")
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise UsageError(f"cannot read memory size {text!r}; write it like 6GiB, 512MiB or 1.5GB")
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise UsageError(f"unknown unit {unit!r} in memory size {text!r}; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"memory size {text!r} rounds to zero bytes; give a larger size")
    return size


def format_size(n_bytes: int | None) -> str:
    """``1.50 GiB``-style text for a byte count (``-`` for None)."""
    if n_bytes is None:
        return "-"
    if abs(n_bytes) < 1024:
        return f"{n_bytes} B"
    value = float(n_bytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            break
    return f"{value:.2f} {unit}"
