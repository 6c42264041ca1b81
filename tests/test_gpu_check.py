"""The GPU check (scripts/gpu-check, issue 47) tested here, where there is no GPU: everything but CUDA.

The GGUF writer's real geometries read back by `gguf` and by the probe's shape reader (small variants written,
the full ones as shapes); llama.cpp loading what it writes; the bundle's trimming and size rule; the log parser on
the lines CUDA builds print; the probe's NVML path with a real H100's figures; the driver's JSON and figure from
a dry run on this CPU.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fake_pynvml import FakeGpu, FakeNvml
from kvjudge.probe import RuntimeSettings, discover_devices, kv_cache_bytes, read_model_shape
from kvjudge.probe.certify import measure_allocations
from kvjudge.probe.core import max_context_tokens, place
from kvjudge.probe.kv_math import CTX_PAD, compute_buffer_bytes
from kvjudge.probe.trial import is_device_buffer, parse_log
from kvjudge.testing.gguf_geometry import (
    GEMMA_3_4B,
    GEOMETRIES,
    LLAMA_31_8B,
    Q8_0_BLOCK_BYTES,
    write_geometry,
)
from kvjudge.testing.gpu_check import boundary_bytes, verdict_of
from kvjudge.testing.gpu_memory import nvml_memory, peak_delta

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
H100_TOTAL = 81559 * MIB  # nvidia-smi on an H100 80GB HBM3


def _bundle_module():
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "scripts" / "gpu_bundle.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


gpu_bundle = _bundle_module()


# -- the GGUF writer --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", list(GEOMETRIES))
def test_small_variants_read_back_as_their_geometry(tmp_path: Path, key: str) -> None:
    import gguf

    geometry = GEOMETRIES[key].scaled()
    path = write_geometry(tmp_path / f"{key}.gguf", geometry)
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors) == [name for name, _, _ in geometry.tensors()]
    for name, shape, quantized in geometry.tensors():
        tensor = tensors[name]
        assert tuple(int(d) for d in tensor.shape) == shape
        assert tensor.tensor_type == (gguf.GGMLQuantizationType.Q8_0 if quantized else gguf.GGMLQuantizationType.F32)
    # The probe's reader gives what the geometry says it would (the shape the GPU check predicts from).
    shape = read_model_shape(path)
    expected = geometry.model_shape()
    for field in ("arch", "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "n_swa",
                  "swa_layers", "swa_source", "n_ctx_train", "n_vocab", "weight_bytes", "repack_bytes"):
        assert getattr(shape, field) == getattr(expected, field), field
    assert shape.file_bytes > shape.weight_bytes


def test_q8_0_weights_are_finite_and_sized_like_trained_ones(tmp_path: Path) -> None:
    import gguf
    from gguf.quants import dequantize

    path = write_geometry(tmp_path / "m.gguf", LLAMA_31_8B.scaled())
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    assert tensor.n_bytes % Q8_0_BLOCK_BYTES == 0
    values = dequantize(tensor.data, tensor.tensor_type)
    assert np.isfinite(values).all()
    assert 0.01 < float(values.std()) < 0.03
    norms = next(t for t in reader.tensors if t.name == "output_norm.weight")
    assert np.array_equal(norms.data, np.ones(norms.data.shape, dtype=np.float32))


def test_the_real_geometries_have_their_models_published_figures() -> None:
    llama = LLAMA_31_8B.model_shape()
    # Llama-3.1-8B: 8.03 B parameters, 128 KiB of f16 KV per token (32 layers x 8 KV heads x 128 x K and V).
    assert 8.0e9 < llama.weight_bytes * 32 / Q8_0_BLOCK_BYTES < 8.1e9
    assert kv_cache_bytes(llama, 1024) == 1024 * 128 * 1024
    gemma = GEMMA_3_4B.model_shape()
    assert gemma.swa_source == "rule:gemma3/6"
    assert [il for il, windowed in enumerate(gemma.swa_layers) if not windowed] == [5, 11, 17, 23, 29]
    # Windowed layers stop growing at the window once the cache is not full-size.
    grows = kv_cache_bytes(gemma, 65536, swa_full=False) - kv_cache_bytes(gemma, 32768, swa_full=False)
    assert grows == (65536 - 32768) * 5 * 4 * 256 * 2 * 2


def test_llama_cpp_loads_what_the_writer_writes_and_allocates_the_predicted_kv(tmp_path: Path) -> None:
    geometry = GEMMA_3_4B.scaled(n_vocab=4096)
    path = write_geometry(tmp_path / "gemma.gguf", geometry)
    shape = read_model_shape(path)
    contexts = [(RuntimeSettings(), 1024), (RuntimeSettings(swa_full=False), 2048)]
    for (settings, n_ctx), result in zip(contexts, measure_allocations(path, contexts)):
        assert result["created"], result.get("error")
        # Two caches (global, windowed), each printed to 0.01 MiB.
        assert [int(c["layers"]) for c in result["kv_caches"]] == [1, 5]
        predicted = kv_cache_bytes(shape, n_ctx, swa_full=settings.swa_full)
        assert abs(result["kv_bytes"] - predicted) <= 2 * 0.005 * MIB + 1
        assert result["model_buffers_mib"]  # the load's own buffers come with every context


# -- the bundle ---------------------------------------------------------------------------------------------------

def _fake_sdist(path: Path) -> Path:
    files = {
        "CMakeLists.txt": gpu_bundle.COMMON_FORCED_ON + "\nadd_subdirectory(vendor/llama.cpp)\n",
        "pyproject.toml": "[project]\n", "README.md": "r", "llama_cpp/__init__.py": "",
        "docs/index.md": "d", "examples/x.py": "", "tests/test_x.py": "",
        "vendor/llama.cpp/CMakeLists.txt": "", "vendor/llama.cpp/src/llama.cpp": "",
        "vendor/llama.cpp/models/ggml-vocab-llama.gguf": "m" * 1000, "vendor/llama.cpp/docs/build.md": "",
        "vendor/llama.cpp/tools/server/server.cpp": "", "vendor/llama.cpp/common/common.cpp": "",
        "vendor/llama.cpp/ggml/src/ggml.c": "", "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu": "",
        "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c": "", "vendor/llama.cpp/ggml/src/ggml-vulkan/v.cpp": "",
        "vendor/llama.cpp/ggml/src/ggml-metal/m.m": "",
        "vendor/llama.cpp/vendor/miniaudio/CMakeLists.txt": "", "vendor/llama.cpp/vendor/miniaudio/miniaudio.h": "",
        "vendor/llama.cpp/vendor/nlohmann/json.hpp": "",
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_the_trimmed_source_keeps_the_library_cpu_and_cuda_and_leaves_out_the_rest(tmp_path: Path) -> None:
    archive = tmp_path / "src.tar.xz"
    figures = gpu_bundle.trim_source(_fake_sdist(tmp_path / "sdist.tar.gz"), archive)
    with tarfile.open(archive, "r:xz") as trimmed:
        names = {m.name.removeprefix("src/") for m in trimmed if m.isfile()}
        cmake = trimmed.extractfile("src/CMakeLists.txt").read().decode()
    assert names == {
        "CMakeLists.txt", "pyproject.toml", "README.md", "llama_cpp/__init__.py",
        "vendor/llama.cpp/CMakeLists.txt", "vendor/llama.cpp/src/llama.cpp", "vendor/llama.cpp/ggml/src/ggml.c",
        "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu", "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c",
        "vendor/llama.cpp/vendor/miniaudio/CMakeLists.txt", "vendor/llama.cpp/vendor/nlohmann/json.hpp",
    }
    assert gpu_bundle.COMMON_OFF in cmake and gpu_bundle.COMMON_FORCED_ON not in cmake
    assert figures["files_kept"] == len(names) and figures["files_dropped"] == 10


def test_the_bundle_is_refused_over_what_a_device_call_carries(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    with (tmp_path / "wheels" / "big.whl").open("wb") as handle:
        handle.truncate(gpu_bundle.LIMIT_BYTES - MIB)  # sparse: sized, not written
    assert gpu_bundle.check_size(tmp_path) == gpu_bundle.LIMIT_BYTES - MIB
    with (tmp_path / "source.tar.xz").open("wb") as handle:
        handle.truncate(2 * MIB)
    with pytest.raises(SystemExit, match="over the 60 MiB a device call carries"):
        gpu_bundle.check_size(tmp_path)


def test_the_bundle_carries_the_pinned_binding_and_no_large_wheel_the_image_has() -> None:
    assert gpu_bundle.pinned_llama_version() == "0.3.36"
    names = {gpu_bundle.requirement_name(r) for r in gpu_bundle.runtime_requirements()}
    assert "gguf" in names and names.isdisjoint(gpu_bundle.NOT_CARRIED)
    assert {"numpy", "scipy", "matplotlib"} <= gpu_bundle.ON_IMAGE


def test_the_bundle_target_is_in_the_makefile_and_its_folder_ignored() -> None:
    assert "gpu-bundle:" in (ROOT / "Makefile").read_text()
    assert "/gpu-bundle/" in (ROOT / ".gitignore").read_text().splitlines()


# -- llama.cpp's log on CUDA ----------------------------------------------------------------------------------

# The lines llama.cpp 0.3.36's vendored source prints with CUDA (llama-model.cpp, llama-kv-cache.cpp,
# llama-context.cpp format strings, with a CUDA build's buffer names).
CUDA_LOG = """\
load_tensors: offloaded 33/33 layers to GPU
load_tensors:   CPU_Mapped model buffer size =   532.31 MiB
load_tensors:        CUDA0 model buffer size =  7605.33 MiB
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =  2048.00 MiB
llama_kv_cache: size = 2048.00 MiB ( 16384 cells,  32 layers,  1/1 seqs), K (f16): 1024.00 MiB, V (f16): 1024.00 MiB
llama_context:      CUDA0 compute buffer size =  1104.00 MiB
llama_context:  CUDA_Host compute buffer size =    40.01 MiB
"""


def test_the_log_parser_reads_cuda_buffers_and_tells_device_from_host() -> None:
    parsed = parse_log(CUDA_LOG)
    assert parsed["kv_bytes"] == 2048 * MIB
    assert parsed["kv_caches"][0]["cells"] == 16384 and parsed["kv_caches"][0]["type_k"] == "f16"
    assert parsed["buffers_mib"]["compute"] == {"CUDA0": 1104.0, "CUDA_Host": 40.01}
    assert parsed["buffers_mib"]["model"] == {"CPU_Mapped": 532.31, "CUDA0": 7605.33}
    assert parsed["device_bytes"] == round((7605.33 + 2048 + 1104) * MIB)
    assert [name for name in ("CUDA0", "CUDA_Host", "CPU_Mapped", "CPU") if is_device_buffer(name)] == ["CUDA0"]


# -- NVML with a real H100's figures --------------------------------------------------------------------------

def _h100(used: int) -> FakeNvml:
    return FakeNvml(gpus=[FakeGpu("NVIDIA H100 80GB HBM3", "GPU-5f1b0c4e", total=H100_TOTAL, used=used,
                                  reserved=0)])


def test_nvml_view_of_an_h100() -> None:
    view = nvml_memory(nvml=_h100(used=512 * MIB))
    assert view is not None
    assert (view["name"], view["uuid"], view["total_bytes"]) == ("NVIDIA H100 80GB HBM3", "GPU-5f1b0c4e", H100_TOTAL)
    assert view["free_bytes"] == H100_TOTAL - 512 * MIB and view["used_bytes"] == 512 * MIB


@pytest.mark.parametrize("kv_type, flash", [("f16", False), ("q8_0", True)])
def test_on_a_whole_h100_the_8b_geometry_holds_its_trained_context(kv_type: str, flash: bool) -> None:
    shape = LLAMA_31_8B.model_shape()
    settings = RuntimeSettings(type_k=kv_type, type_v=kv_type, flash_attn=flash, gpu_layers=-1)
    placement = place(shape, discover_devices(nvml=_h100(used=512 * MIB)), settings, None)
    assert placement.on_gpu and placement.offloaded_layers == 32
    assert max_context_tokens(shape, settings, placement) == LLAMA_31_8B.n_ctx_train


@pytest.mark.parametrize("geometry", [LLAMA_31_8B, GEMMA_3_4B], ids=lambda g: g.key)
def test_the_ballast_puts_the_boundary_at_the_target_context(geometry) -> None:
    # What certify_one does on the card: leave free what TARGET_CTX needs plus half a step; the probe then
    # predicts exactly TARGET_CTX from NVML's free memory.
    shape = geometry.model_shape()
    settings = RuntimeSettings(gpu_layers=-1)
    whole = place(shape, discover_devices(nvml=_h100(used=0)), settings, None)
    keep_free = boundary_bytes(shape, settings, whole, 16384)
    ballasted = place(shape, discover_devices(nvml=_h100(used=H100_TOTAL - keep_free)), settings, None)
    assert max_context_tokens(shape, settings, ballasted) == 16384
    # The compute buffer the probe plans for (an estimate) is the logits' at this size: n_vocab x 512 x 4 bytes.
    assert compute_buffer_bytes(shape, 16384, RuntimeSettings(flash_attn=True)) >= shape.n_vocab * 512 * 4


def test_nvml_peaks_are_read_per_trial_and_verdicts_named() -> None:
    segments = [{"label": "start", "peak_used_bytes": 100}, {"label": "trial 1: n_ctx 16384", "peak_used_bytes": 900},
                {"label": "trial 2: n_ctx 16640", "peak_used_bytes": 950}]
    assert peak_delta(segments, 100, 16384) == 800
    assert peak_delta(segments, 100, 512) is None and peak_delta(segments, None, 16384) is None
    assert [verdict_of(16384, c) for c in (16384, 16128, None, 16640)] == [
        "exact", "over_promise", "over_promise", "under_promise"]


# -- the driver, on this CPU --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    out = tmp_path_factory.mktemp("gpu-check-out")
    proc = subprocess.run([sys.executable, "-m", "kvjudge.testing.gpu_check", "--dry-run", "--out", str(out),
                           "--models", "llama32-1b", "--judge-pairs", "1"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), out, proc.stderr


def test_the_dry_run_prints_one_json_line_and_writes_it_with_a_figure(dry_run) -> None:
    line, out, progress = dry_run
    assert json.loads((out / "gpu-check.json").read_text()) == line
    assert (out / "gpu-check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "predicting and certifying" in progress
    assert {"check", "mode", "date", "device", "llama_cpp_python", "build_seconds", "target_ctx", "models",
            "skipped", "judge", "seconds"} <= set(line)
    assert line["mode"] == "dry-run" and line["device"] is None and line["skipped"] == []
    assert [m["errors"] for m in line["models"]] == [[]]


def test_the_dry_run_certifies_the_prediction_for_each_kv_type(dry_run) -> None:
    line, _, _ = dry_run
    (model,) = line["models"]
    assert model["key"] == "llama32-1b-small" and model["file_bytes"] > 0
    assert [k["kv_type"] for k in model["kv"]] == ["f16", "q8_0"]
    for kv in model["kv"]:
        assert kv["predicted_max_context"] == line["target_ctx"] // CTX_PAD * CTX_PAD
        assert kv["verdict"] == "exact" and kv["certified"] is True
        assert kv["certified_n_ctx"] == kv["predicted_max_context"]
        assert [t["outcome"] for t in kv["trials"]] == ["ok", "over_budget"]
        assert kv["max_ok_input"] > 0 and kv["safe_context"] <= kv["certified_n_ctx"]
        assert kv["nvml_used_delta_at_certified"] is None  # no GPU: nothing pretends to be measured
        assert kv["predicted_max_context_whole"] >= kv["predicted_max_context"]
    for row in model["log"]:
        assert row["created"] and row["n_ctx"] == line["target_ctx"] // CTX_PAD * CTX_PAD
        assert abs(row["kv_log_bytes"] - row["kv_predicted_bytes"]) <= 0.005 * MIB + 1
        assert row["compute_device_bytes"] == 0 and row["compute_host_bytes"] > 0
        assert row["model_host_bytes"] >= row["weight_bytes"] * 0.99


def test_the_dry_run_judges_a_sample_pair_in_process(dry_run) -> None:
    judge = dry_run[0]["judge"]
    assert judge["ran"] is True and judge["verdicts"] == 1
    assert judge["cost"]["calls"] == 2  # both orders
    assert judge["nvml_peak_delta_bytes"] is None and judge["used_gpu"] is None


def test_the_driver_refuses_an_unknown_model_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kvjudge.testing.gpu_check", "--dry-run", "--out", str(tmp_path),
                           "--models", "llama-70b"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gpu-check: unknown model 'llama-70b'; use one of llama31-8b, gemma3-4b, llama32-1b"]
    assert list(tmp_path.iterdir()) == []
