"""Devices (NVML through a fake of the pynvml calls, host RAM capped by cgroups), sizes, placement."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fake_pynvml import FakeGpu, FakeNvml, no_driver
from kvjudge.errors import UsageError
from kvjudge.probe import RuntimeSettings, discover_devices
from kvjudge.probe.settings import parse_size
from kvjudge.probe.core import max_context_tokens, place
from kvjudge.probe.devices import DeviceReport, cgroup_memory, host_device, nvml_devices

GIB = 1024**3


def test_nvml_v2_reports_reserved_memory_and_free_excludes_it() -> None:
    nvml = FakeNvml(gpus=[FakeGpu("NVIDIA H100", "GPU-aaaa", total=80 * GIB, used=10 * GIB, reserved=GIB)])
    devices, notes = nvml_devices(nvml)
    assert notes == []
    (gpu,) = devices
    assert (gpu.kind, gpu.name, gpu.identity) == ("gpu", "NVIDIA H100", "GPU-aaaa")
    assert gpu.total_bytes == 80 * GIB and gpu.reserved_bytes == GIB and gpu.free_bytes == 69 * GIB
    assert gpu.source == "nvml v2"
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_nvml_without_v2_falls_back_to_v1() -> None:
    nvml = FakeNvml(gpus=[FakeGpu("old card", "GPU-bbbb", total=8 * GIB, used=GIB, reserved=GIB // 2, v2=False)])
    (gpu,), _ = nvml_devices(nvml)
    assert gpu.source == "nvml v1" and gpu.reserved_bytes is None
    assert gpu.free_bytes == 8 * GIB - GIB - GIB // 2


def test_missing_driver_is_a_reported_reason_not_an_error() -> None:
    report = discover_devices(nvml=no_driver())
    assert report.gpus == ()
    assert report.host.total_bytes > 0
    assert any("NVML is unavailable" in note and "Library Not Found" in note for note in report.notes)


def test_an_unreadable_gpu_is_skipped_with_a_note() -> None:
    nvml = FakeNvml(gpus=[FakeGpu("bad", "GPU-x", GIB, 0, broken=True), FakeGpu("good", "GPU-y", 2 * GIB, 0)])
    devices, notes = nvml_devices(nvml)
    assert [d.identity for d in devices] == ["GPU-y"]
    assert len(notes) == 1 and "GPU 0 skipped" in notes[0]


def test_cgroup_v2_limit_caps_host_memory(tmp_path: Path) -> None:
    group = tmp_path / "cg" / "job"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{2 * GIB}\n")
    (group / "memory.current").write_text(f"{GIB // 2}\n")
    self_cgroup = tmp_path / "self"
    self_cgroup.write_text("0::/job\n")
    assert cgroup_memory(tmp_path / "cg", self_cgroup) == (2 * GIB, GIB // 2, "v2")
    host = host_device(tmp_path / "cg", self_cgroup)
    assert host.total_bytes == 2 * GIB and host.limit_bytes == 2 * GIB
    assert host.free_bytes <= 2 * GIB - GIB // 2
    assert host.source == "psutil+cgroup v2"


def test_cgroup_v2_max_means_unlimited(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("123\n")
    missing = tmp_path / "no-self"
    assert cgroup_memory(tmp_path, missing) == (None, 123, "v2")


def test_cgroup_v1_limit_and_its_unlimited_sentinel(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    assert cgroup_memory(tmp_path, tmp_path / "none") == (3 * GIB, GIB, "v1")
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory(tmp_path, tmp_path / "none")[0] is None


def test_host_identity_is_stable_across_reads() -> None:
    assert host_device().identity == host_device().identity


@pytest.mark.parametrize(("text", "expected"), [
    ("6GiB", 6 * GIB), ("512MiB", 512 * 1024**2), ("1.5GB", 1_500_000_000), ("1048576", 1048576),
    ("2 gib", 2 * GIB), ("0.5TiB", 512 * GIB), (4096, 4096), ("10kb", 10_000),
])
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["-1GiB", "0", "0MiB", "abc", "6 parsecs", "", "GiB", "1e3GiB", "-5", "nan"])
def test_bad_sizes_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_size(text)
    assert "\n" not in str(error.value)


@given(st.integers(min_value=1, max_value=1 << 50))
def test_parse_size_reads_back_plain_byte_counts(n: int) -> None:
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


def test_model_goes_on_the_gpu_when_layers_are_offloaded(default_model: Path) -> None:
    from kvjudge.probe import read_model_shape

    shape = read_model_shape(default_model)
    gpus, _ = nvml_devices(FakeNvml(gpus=[FakeGpu("NVIDIA L4", "GPU-l4", total=24 * GIB, used=0, reserved=GIB)]))
    report = DeviceReport(devices=(*gpus, host_device()))
    on_gpu = place(shape, report, RuntimeSettings(gpu_layers=-1), memory_budget=None)
    assert on_gpu.on_gpu and on_gpu.device.identity == "GPU-l4" and on_gpu.usable_bytes == 23 * GIB
    assert on_gpu.offloaded_layers == shape.n_layer
    budgeted = place(shape, report, RuntimeSettings(gpu_layers=-1), memory_budget=2 * GIB)
    assert budgeted.usable_bytes == 2 * GIB
    on_host = place(shape, report, RuntimeSettings(gpu_layers=0), memory_budget=2 * GIB)
    assert not on_host.on_gpu and on_host.device.kind == "host"
    # A larger budget on the same GPU never gives less context.
    assert max_context_tokens(shape, RuntimeSettings(gpu_layers=-1), budgeted) <= \
        max_context_tokens(shape, RuntimeSettings(gpu_layers=-1), on_gpu)


def test_gpu_identity_enters_the_fingerprint(default_model: Path, tmp_path: Path) -> None:
    from kvjudge.probe import probe

    def report_with(uuid: str) -> DeviceReport:
        gpus, _ = nvml_devices(FakeNvml(gpus=[FakeGpu("NVIDIA L4", uuid, total=24 * GIB, used=0)]))
        return DeviceReport(devices=(*gpus, host_device()))

    settings = RuntimeSettings(gpu_layers=-1)
    cache = tmp_path / "caps.json"
    first = probe(default_model, settings=settings, certify=False, cache_path=cache, devices=report_with("GPU-1"))
    second = probe(default_model, settings=settings, certify=False, cache_path=cache, devices=report_with("GPU-2"))
    assert first.entry.device == "GPU-1" and second.entry.device == "GPU-2"
    assert first.entry.fingerprint != second.entry.fingerprint
    assert first.as_dict()["devices"][0]["identity"] == "GPU-1"


def test_partial_offload_splits_weights_and_kv_between_gpu_and_host(default_model: Path) -> None:
    from kvjudge.probe import kv_breakdown, read_model_shape
    from kvjudge.probe.core import footprint

    shape = read_model_shape(default_model)
    gpus, _ = nvml_devices(FakeNvml(gpus=[FakeGpu("NVIDIA L4", "GPU-l4", total=24 * GIB, used=0)]))
    report = DeviceReport(devices=(*gpus, host_device()))
    settings = RuntimeSettings(gpu_layers=6)
    placement = place(shape, report, settings, memory_budget=None)
    assert placement.offloaded_layers == 6
    fp = footprint(shape, 4096, settings, placement)
    kv = kv_breakdown(shape, 4096)
    # llama.cpp offloads the last layers: their KV lives on the GPU, the rest on the host.
    gpu_kv = sum(kv.layer_bytes[12:])
    assert fp.device_bytes > gpu_kv and fp.host_bytes > kv.total - gpu_kv
    whole = footprint(shape, 4096, RuntimeSettings(gpu_layers=-1), place(shape, report, RuntimeSettings(gpu_layers=-1), None))
    assert fp.device_bytes < whole.device_bytes and whole.host_bytes < fp.host_bytes
