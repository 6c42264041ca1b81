"""The GPU check's view of device memory: NVML's figures, a sampler of NVML's used memory while trials run in
child processes, and a ballast that leaves a chosen amount of the card free.

The ballast is what makes certification on a large card short and still real: the probe predicts from NVML's free
memory, so holding all but a few GiB moves the boundary to a context of a few thousand tokens, where a real load
and a full prompt take seconds, and an allocation past it really fails on the card.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


def nvml_memory(index: int = 0, nvml: Any = None) -> dict[str, Any] | None:
    """NVML's view of GPU ``index``: name, UUID, total, free, used (and reserved where the driver says), the
    driver version and the compute capability; None when NVML sees no GPU."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        if nvml.nvmlDeviceGetCount() <= index:
            return None
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        view: dict[str, Any] = {"name": _text(nvml.nvmlDeviceGetName(handle)),
                                "uuid": _text(nvml.nvmlDeviceGetUUID(handle))}
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            view["reserved_bytes"] = int(memory.reserved)
        except (nvml.NVMLError, AttributeError, TypeError):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            view["reserved_bytes"] = None
        view.update(total_bytes=int(memory.total), free_bytes=int(memory.free), used_bytes=int(memory.used))
        try:
            view["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        except (nvml.NVMLError, AttributeError):
            view["driver"] = None
        try:
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            view["compute_capability"] = f"{major}.{minor}"
        except (nvml.NVMLError, AttributeError):
            view["compute_capability"] = None
        return view
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class UsedSampler:
    """Samples NVML's used memory of one GPU every ``period_s`` in a thread; :meth:`mark` starts a new segment
    (the certification's progress callback marks each trial), and each segment keeps its peak."""

    index: int = 0
    period_s: float = 0.02
    segments: list[dict[str, Any]] = field(default_factory=list)
    baseline_bytes: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _handle: Any = field(default=None, repr=False)
    _nvml: Any = field(default=None, repr=False)

    def start(self) -> UsedSampler:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        self.baseline_bytes = self._used()
        self.mark("start")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            used = self._used()
            segment = self.segments[-1]
            segment["peak_used_bytes"] = max(segment["peak_used_bytes"], used)

    def mark(self, label: str) -> None:
        """A new segment from now on (a trial starting)."""
        used = self._used() if self._handle is not None else 0
        self.segments.append({"label": label, "at_s": round(time.monotonic(), 3), "peak_used_bytes": used})

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        return self.segments


class Ballast:
    """GPU memory held by this process (a PyTorch allocation) so that only what a measurement needs stays free."""

    def __init__(self) -> None:
        self.held_bytes = 0
        self._tensor: Any = None

    def hold(self, n_bytes: int) -> int:
        """Hold ``n_bytes`` (rounded down to 2 MiB), releasing what was held before; returns the bytes held."""
        import torch

        self.release()
        n_bytes = max(0, n_bytes) // (2 << 20) * (2 << 20)
        if n_bytes:
            self._tensor = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        self.held_bytes = n_bytes
        return n_bytes

    def release(self) -> None:
        if self._tensor is None:
            return
        import torch

        self._tensor = None
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        self.held_bytes = 0


def peak_delta(segments: list[dict[str, Any]], baseline: int | None, n_ctx: int) -> int | None:
    """The peak used memory above ``baseline`` while the trial at ``n_ctx`` ran (its segment is marked by the
    certification's progress line ``trial K: n_ctx N``); None without a sampler or such a segment."""
    found = [s for s in segments if s["label"].endswith(f"n_ctx {n_ctx}")]
    if not found or baseline is None:
        return None
    return int(found[-1]["peak_used_bytes"]) - baseline
