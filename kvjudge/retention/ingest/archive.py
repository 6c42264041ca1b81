"""Zip archives read member by member into memory, never extracted: inspect's ``.eval`` logs.

Python's :mod:`zipfile` reads the central directory and the stored and deflated members older inspect logs
hold. Newer inspect logs compress every member with zstd (zip method 93), which :mod:`zipfile` reads only from
Python 3.14 on, and then only up to a member's first zstd frame (inspect splits members over 200 MiB into several
frames). Those members are read here with ``zstandard`` (python-zstandard, the binding inspect itself compresses
with), across frames, and checked against the archive's CRC-32 and size like any other member.

A hostile archive is refused with one line naming the file and the member:

- a name that is absolute (``/x``, ``C:x``, ``\\\\x``) or climbs (a ``..`` component) — nothing is ever written
  to disk, but such a name is a crafted archive, not a log;
- a member that is encrypted, truncated, fails its CRC-32, or inflates beyond the size the central directory
  declares for it;
- a zip bomb: a member may inflate to at most ``max(INFLATION_RATIO × its stored size, INFLATION_FLOOR)``.
  Real log members (JSON of messages and events) deflate or zstd-compress 3–20× (inspect notes ``.eval`` files
  are 5–8× smaller than the same log as ``.json``); 200× is ten times the most compressible of them, while a
  bomb needs 1000× and more (deflate's ceiling is 1032:1, zstd's far higher). The floor lets small, very
  repetitive members through. Reading stops at the bound, so memory never exceeds it.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

import zstandard

from kvjudge.errors import IngestError

ZIP_ZSTANDARD = 93
INFLATION_RATIO = 200
INFLATION_FLOOR = 32 << 20
_CHUNK = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # the zip local file header (APPNOTE 4.3.7), 30 bytes
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, zstandard.ZstdError)


class Archive:
    """One zip archive, opened for reading members by name (a context manager)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise IngestError(f"{path}: not a complete zip archive ({exc}); was it cut short while copying, or "
                              f"is the log still being written?") from None
        self._members: dict[str, zipfile.ZipInfo] = {}
        for info in self._zip.infolist():
            self._check_name(info.filename)
            if info.filename in self._members:
                raise IngestError(f"{path}: member {info.filename!r} appears twice; which one is the log's is "
                                  f"ambiguous")
            self._members[info.filename] = info

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def names(self) -> list[str]:
        """Every member's name, in archive order."""
        return list(self._members)

    def has(self, name: str) -> bool:
        return name in self._members

    def where(self, name: str) -> str:
        return f"{self.path}:{name}"

    def read(self, name: str) -> bytes:
        """The member's bytes, inflated within the bound (see the module docstring) and checked."""
        info = self._members[name]
        bound = max(INFLATION_RATIO * info.compress_size, INFLATION_FLOOR)
        if info.file_size > bound:
            raise self._bomb(name, info, info.file_size, "declares")
        if info.flag_bits & 0x1:
            raise IngestError(f"{self.where(name)}: the member is encrypted; kvjudge reads plain archives only")
        chunks: list[bytes] = []
        total = 0
        try:
            with self._open(info) as handle:
                while chunk := handle.read(_CHUNK):
                    total += len(chunk)
                    if total > bound:
                        raise self._bomb(name, info, total, "inflates to more than")
                    if total > info.file_size:
                        raise IngestError(f"{self.where(name)}: inflates beyond the {info.file_size} bytes the "
                                          f"archive declares for it; the archive is corrupt or crafted")
                    chunks.append(chunk)
        except _READ_ERRORS as exc:
            raise IngestError(f"{self.where(name)}: cannot be read ({exc}); is the archive complete?") from None
        data = b"".join(chunks)
        if total != info.file_size or zlib.crc32(data) != info.CRC:
            raise IngestError(f"{self.where(name)}: {total} of {info.file_size} bytes, CRC-32 "
                              f"{'matches' if zlib.crc32(data) == info.CRC else 'does not match'}; the archive is "
                              f"truncated or corrupt")
        return data

    def _bomb(self, name: str, info: zipfile.ZipInfo, size: int, verb: str) -> IngestError:
        return IngestError(f"{self.where(name)}: {verb} {size} bytes from {info.compress_size} stored, beyond "
                           f"{INFLATION_RATIO}× its stored size (and {INFLATION_FLOOR >> 20} MiB); refused as a zip "
                           f"bomb — no real log member compresses that well")

    def _check_name(self, name: str) -> None:
        posix = PurePosixPath(name.replace("\\", "/"))
        if posix.is_absolute() or (len(name) > 1 and name[1] == ":") or ".." in posix.parts:
            raise IngestError(f"{self.path}: member {name!r} has an absolute or climbing path; refused (a log's "
                              f"members are relative names such as samples/1_epoch_1.json)")

    def _open(self, info: zipfile.ZipInfo) -> IO[bytes]:
        if info.compress_type != ZIP_ZSTANDARD:
            return self._zip.open(info)
        return _ZstdMember(self.path, info)


class _ZstdMember:
    """A zstd member's inflated bytes as a stream: its local header is read to find the data, which is then
    decompressed across frames."""

    def __init__(self, path: Path, info: zipfile.ZipInfo) -> None:
        self._file = path.open("rb")
        try:
            self._file.seek(info.header_offset)
            header = self._file.read(_LOCAL_HEADER.size)
            if len(header) != _LOCAL_HEADER.size or not header.startswith(b"PK\x03\x04"):
                raise zipfile.BadZipFile("bad local file header")
            fields = _LOCAL_HEADER.unpack(header)
            self._file.seek(fields[10] + fields[11], 1)  # past the name and the extra field
            self._reader = zstandard.ZstdDecompressor().stream_reader(
                _Slice(self._file, info.compress_size), read_across_frames=True)
        except BaseException:
            self._file.close()
            raise

    def read(self, size: int) -> bytes:
        return self._reader.read(size)

    def __enter__(self) -> _ZstdMember:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


class _Slice:
    """The next ``length`` bytes of ``handle`` as a readable stream."""

    def __init__(self, handle: IO[bytes], length: int) -> None:
        self._handle = handle
        self._left = length

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        size = self._left if size < 0 else min(size, self._left)
        data = self._handle.read(size)
        self._left -= len(data)
        return data


def iter_members(archive: Archive, prefix: str, suffix: str) -> Iterator[str]:
    """The names under ``prefix`` ending in ``suffix``, in archive order."""
    return (name for name in archive.names() if name.startswith(prefix) and name.endswith(suffix))
