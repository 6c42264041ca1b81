"""A small stand-in for the ``pynvml`` calls the probe makes (no GPU on this host).

It mirrors nvidia-ml-py's surface: ``NVMLError``, ``nvmlInit``/``nvmlShutdown``, ``nvmlDeviceGetCount``,
``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName`` (bytes, as older bindings return), ``nvmlDeviceGetUUID``,
``nvmlDeviceGetMemoryInfo(handle, version=None)`` with ``nvmlMemory_v2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
nvmlMemory_v2 = 0x02000028


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total: int
    used: int
    reserved: int = 0
    v2: bool = True          # the driver has nvmlDeviceGetMemoryInfo_v2
    broken: bool = False     # every query fails


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: NVMLError | None = None
    inits: int = 0
    shutdowns: int = 0

    # The module-level API, bound to this instance.
    NVMLError = NVMLError
    nvmlMemory_v2 = nvmlMemory_v2

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        if gpu.broken:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return gpu

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:
        return handle.name.encode()

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> SimpleNamespace:
        if version is not None:
            if not handle.v2:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found")
            # v2: used excludes what the driver reserves; free = total - reserved - used.
            return SimpleNamespace(version=version, total=handle.total, reserved=handle.reserved,
                                   used=handle.used, free=handle.total - handle.reserved - handle.used)
        # v1 counts the reserved memory as used.
        used = handle.used + handle.reserved
        return SimpleNamespace(total=handle.total, used=used, free=handle.total - used)


def no_driver() -> FakeNvml:
    return FakeNvml(init_error=NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"))
