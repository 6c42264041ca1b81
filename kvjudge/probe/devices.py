"""The memory a model can be placed in: NVIDIA GPUs through NVML, host RAM through psutil and cgroups.

A missing NVIDIA driver or library is not an error: the report lists the devices seen and, in ``notes``,
why others were not. ``memory_budget`` caps the usable memory of the device the model is placed on by hand.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.probe.settings import format_size

# cgroup v1 reports "no limit" as a huge page-aligned number; anything at or above this is unlimited.
_CGROUP_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class Device:
    """One memory pool: a GPU or the host's RAM."""

    kind: str                    # "gpu" | "host"
    index: int | None            # GPU index; None for the host
    name: str
    identity: str                # stable across runs: the GPU UUID, or CPU model + RAM + hostname
    total_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None   # GPU memory the driver keeps for itself (NVML v2), else None
    limit_bytes: int | None = None      # cgroup memory limit (host), None when unlimited
    source: str = ""                    # how it was read ("nvml v2", "nvml v1", "psutil+cgroup v2", ...)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceReport:
    """The devices seen, and why others were not."""

    devices: tuple[Device, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def host(self) -> Device:
        return next(d for d in self.devices if d.kind == "host")

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == "gpu")

    def as_list(self) -> list[dict[str, Any]]:
        return [d.as_dict() for d in self.devices]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def nvml_devices(nvml: Any = None) -> tuple[list[Device], list[str]]:
    """NVIDIA GPUs through ``pynvml`` (``nvml`` may be a stand-in module with the same calls)."""
    notes: list[str] = []
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return [], ["no NVIDIA GPUs probed: nvidia-ml-py (pynvml) is not installed"]
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return [], [f"no NVIDIA GPUs seen: NVML is unavailable ({exc}); no NVIDIA driver on this host"]
    devices: list[Device] = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(nvml.nvmlDeviceGetName(handle))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                reserved: int | None
                try:
                    # v2 separates what the driver reserves from what is used; older drivers lack it.
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                    reserved, source = int(memory.reserved), "nvml v2"
                except (nvml.NVMLError, AttributeError, TypeError):
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                    reserved, source = None, "nvml v1"
                devices.append(Device(kind="gpu", index=index, name=name, identity=uuid,
                                      total_bytes=int(memory.total), free_bytes=int(memory.free),
                                      reserved_bytes=reserved, source=source))
            except nvml.NVMLError as exc:
                notes.append(f"GPU {index} skipped: NVML could not read it ({exc})")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    if not devices and not notes:
        notes.append("no NVIDIA GPUs seen: NVML reports none")
    return devices, notes


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_memory(root: str | os.PathLike[str] = "/sys/fs/cgroup",
                  self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> tuple[int | None, int | None, str]:
    """``(limit, usage, version)`` of this process's memory cgroup; limit None when unlimited.

    cgroup v2: ``memory.max`` / ``memory.current`` in the process's own group (or the root one);
    cgroup v1: ``memory/memory.limit_in_bytes`` / ``memory.usage_in_bytes``.
    """
    root = Path(root)
    relative = ""
    try:
        for line in Path(self_cgroup).read_text().splitlines():
            if line.startswith("0::"):
                relative = line[3:].strip().lstrip("/")
    except OSError:
        pass
    for base in ([root / relative] if relative else []) + [root]:
        if (base / "memory.max").exists() or (base / "memory.current").exists():
            return _read_int(base / "memory.max"), _read_int(base / "memory.current"), "v2"
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        limit = _read_int(v1 / "memory.limit_in_bytes")
        if limit is not None and limit >= _CGROUP_V1_UNLIMITED:
            limit = None
        return limit, _read_int(v1 / "memory.usage_in_bytes"), "v1"
    return None, None, "none"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def host_device(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> Device:
    """Host RAM from psutil, capped by the cgroup memory limit when one is set."""
    import psutil

    memory = psutil.virtual_memory()
    total, free = int(memory.total), int(memory.available)
    limit, usage, version = cgroup_memory(cgroup_root, self_cgroup)
    if limit is not None:
        total = min(total, limit)
        free = min(free, max(0, limit - (usage or 0)))
    cpu = _cpu_model()
    # Total RAM (before the cgroup cap) and hostname make the identity stable across runs on one machine.
    identity = f"host:{cpu}|{int(memory.total)}|{socket.gethostname()}"
    return Device(kind="host", index=None, name=f"{cpu} ({os.cpu_count() or 1} CPUs)", identity=identity,
                  total_bytes=total, free_bytes=free, limit_bytes=limit,
                  source=f"psutil+cgroup {version}" if version != "none" else "psutil")


def discover_devices(*, nvml: Any = None, cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> DeviceReport:
    """Every memory pool this host offers: NVIDIA GPUs (when NVML works) and host RAM."""
    gpus, notes = nvml_devices(nvml)
    host = host_device(cgroup_root, self_cgroup)
    return DeviceReport(devices=(*gpus, host), notes=tuple(notes))


def describe(device: Device) -> str:
    """One line: name, free of total."""
    return f"{device.name}: {format_size(device.free_bytes)} free of {format_size(device.total_bytes)}"
