"""The capability cache: one JSON file of probe results keyed by fingerprint.

Writes are atomic (temp file, fsync, rename) and happen under a file lock, so two processes never corrupt
the file or lose each other's updates. A file that cannot be read is an error naming the path and the fix;
it is never silently replaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from kvjudge.settings import cache_dir
from kvjudge.errors import CacheError
from kvjudge.atomic import atomic_write

CACHE_FILENAME = "capabilities.json"
CACHE_VERSION = 1
DEFAULT_STALENESS_DAYS = 30.0
_LOCK_TIMEOUT_S = 60.0


def default_cache_path() -> Path:
    """``$KVJUDGE_CACHE_DIR/capabilities.json`` (or the platformdirs user cache dir)."""
    return cache_dir() / CACHE_FILENAME


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class CapabilityEntry:
    """What is known about one model on one device with one set of runtime settings, or about one served model.

    A served entry (``server`` set: url, model_id, kind, version, n_ctx_source) has ``device`` ``server:URL``,
    ``max_context_tokens`` = the served context, and ``model_sha256`` None unless the served file is readable here.
    """

    fingerprint: str
    model_sha256: str | None
    model_path: str
    device: str
    max_context_tokens: int          # analytic, from memory
    max_ok_input: int | None         # largest prompt that really ran (measured); None when not certified
    safe_context: int | None         # conservative n_ctx for planning; None when not certified
    certified: bool
    certified_at: str | None
    method: str                      # "measured" | "estimated"
    trials: list[dict] = field(default_factory=list)
    stale: bool = False              # older than the staleness limit (computed when read, never stored)
    # Beyond the contract: what the fingerprint was made of, when the analytic figure was computed, and the
    # smallest prompt seen to overflow at run time.
    probed_at: str | None = None
    settings: dict = field(default_factory=dict)
    memory_budget: int | None = None
    components: dict = field(default_factory=dict)
    last_overflow: int | None = None
    server: dict = field(default_factory=dict)

    @property
    def served(self) -> bool:
        """The entry describes a model behind an OpenAI-compatible server (probed with ``--server``)."""
        return bool(self.server)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("stale")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CapabilityEntry:
        names = {f.name for f in dataclasses.fields(cls)} - {"stale"}
        missing = [n for n in ("fingerprint", "model_sha256", "max_context_tokens", "certified") if n not in data]
        if missing:
            raise ValueError(f"an entry lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def age_reference(self) -> str | None:
        return self.certified_at or self.probed_at


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


class CapabilityCache:
    """The capability cache file. ``path`` None means :func:`default_cache_path`."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, staleness_days: float | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.staleness_days = DEFAULT_STALENESS_DAYS if staleness_days is None else float(staleness_days)
        self._lock = FileLock(str(self.path) + ".lock", timeout=_LOCK_TIMEOUT_S)

    # -- reading ---------------------------------------------------------------------------------------------
    def _unreadable(self, reason: str) -> CacheError:
        return CacheError(f"capability cache {self.path} is unreadable ({reason}); fix the file or remove it "
                          f"with `kvjudge cache clear --cache {self.path}` and probe again")

    def _read_raw(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise self._unreadable(str(exc)) from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise self._unreadable(f"not JSON: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            raise self._unreadable("no 'entries' object")
        if data.get("version") != CACHE_VERSION:
            raise self._unreadable(f"version {data.get('version')!r}, this kvjudge reads version {CACHE_VERSION}")
        for fingerprint, raw in data["entries"].items():
            if not isinstance(raw, dict):
                raise self._unreadable(f"entry {fingerprint[:16]} is not an object")
            try:
                CapabilityEntry.from_json(raw)  # every entry, so a write never carries a damaged one along
            except (TypeError, ValueError) as exc:
                raise self._unreadable(f"entry {fingerprint[:16]}: {exc}") from exc
        return data["entries"]

    def _entry(self, raw: dict[str, Any], now: datetime | None = None) -> CapabilityEntry:
        try:
            entry = CapabilityEntry.from_json(raw)
        except (TypeError, ValueError) as exc:
            raise self._unreadable(f"bad entry: {exc}") from exc
        return dataclasses.replace(entry, stale=self.is_stale(entry, now))

    def is_stale(self, entry: CapabilityEntry, now: datetime | None = None) -> bool:
        """True when the entry is older than the staleness limit (or has no readable date)."""
        when = _parse_time(entry.age_reference())
        if when is None:
            return True
        now = now or datetime.now(timezone.utc)
        return now - when > timedelta(days=self.staleness_days)

    def entries(self) -> list[CapabilityEntry]:
        """Every entry, with ``stale`` set."""
        with self._locked():
            raw = self._read_raw()
        return [self._entry(value) for value in raw.values()]

    def get(self, fingerprint: str) -> CapabilityEntry | None:
        """The entry for ``fingerprint`` (``stale`` set), or None."""
        with self._locked():
            raw = self._read_raw().get(fingerprint)
        return self._entry(raw) if raw is not None else None

    # -- writing ---------------------------------------------------------------------------------------------
    def _locked(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return _LockGuard(self._lock, self.path)

    def _write_raw(self, entries: dict[str, dict[str, Any]]) -> None:
        payload = json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True)
        try:
            atomic_write(self.path, payload.encode("utf-8"))
        except OSError as exc:
            raise CacheError(f"cannot write capability cache {self.path}: {exc.strerror}; "
                             f"check the directory's permissions or pass --cache") from exc

    def update(self, fingerprint: str,
               change: Callable[[CapabilityEntry | None], CapabilityEntry | None]) -> CapabilityEntry | None:
        """Read-modify-write one entry under the lock; ``change`` returns the new entry (None deletes it)."""
        with self._locked():
            entries = self._read_raw()
            current = self._entry(entries[fingerprint]) if fingerprint in entries else None
            new = change(current)
            if new is None:
                entries.pop(fingerprint, None)
            else:
                if new.fingerprint != fingerprint:
                    raise CacheError(f"internal: entry fingerprint {new.fingerprint[:16]} stored under {fingerprint[:16]}")
                entries[fingerprint] = new.to_json()
            self._write_raw(entries)
        return dataclasses.replace(new, stale=self.is_stale(new)) if new is not None else None

    def put(self, entry: CapabilityEntry) -> CapabilityEntry:
        """Store ``entry`` under its fingerprint, replacing what was there."""
        stored = self.update(entry.fingerprint, lambda _old: entry)
        assert stored is not None
        return stored

    def remove(self, fingerprint: str) -> bool:
        """Delete one entry; True when it existed."""
        existed: list[bool] = []

        def change(current: CapabilityEntry | None) -> None:
            existed.append(current is not None)
            return None

        self.update(fingerprint, change)
        return existed[0]

    def clear(self) -> int:
        """Remove the cache file (even an unreadable one); returns how many entries it held (-1 if unreadable)."""
        with self._locked():
            try:
                count = len(self._read_raw())
            except CacheError:
                count = -1
            self.path.unlink(missing_ok=True)
        return count


class _LockGuard:
    """The file lock, with a timeout that names the lock file."""

    def __init__(self, lock: FileLock, path: Path) -> None:
        self._lock, self._path = lock, path

    def __enter__(self) -> None:
        try:
            self._lock.acquire()
        except Timeout as exc:
            raise CacheError(f"capability cache {self._path} is locked by another process for over "
                             f"{_LOCK_TIMEOUT_S:.0f} s; wait for it or remove {self._lock.lock_file}") from exc

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
