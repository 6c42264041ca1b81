"""The capability cache: updates, staleness, fingerprints, a corrupt file, and two processes writing at once."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gguf_factory import write_llama_gqa
from kvjudge.errors import CacheError
from kvjudge.probe import CapabilityCache, CapabilityEntry, RuntimeSettings, lookup_capability, probe
from kvjudge.probe.core import current_components
from kvjudge.settings import Settings
from kvjudge.target import JudgeTarget


def _entry(fingerprint: str = "f" * 64, *, max_ok_input: int | None = 3000, safe_context: int | None = 2700,
           days_old: float = 0.0) -> CapabilityEntry:
    when = (datetime.now(timezone.utc) - timedelta(days=days_old)).replace(microsecond=0).isoformat()
    return CapabilityEntry(fingerprint=fingerprint, model_sha256="a" * 64, model_path="/m.gguf", device="host:x",
                           max_context_tokens=4096, max_ok_input=max_ok_input, safe_context=safe_context,
                           certified=max_ok_input is not None, certified_at=when if max_ok_input else None,
                           method="measured" if max_ok_input else "estimated", trials=[], probed_at=when)


def test_round_trip_and_default_path(tmp_path: Path, isolated_dirs: Path) -> None:
    cache = CapabilityCache()
    assert cache.path == isolated_dirs / "cache" / "capabilities.json"
    stored = cache.put(_entry())
    assert cache.get(stored.fingerprint) == stored and not stored.stale
    assert json.loads(cache.path.read_text())["version"] == 1
    assert cache.get("0" * 64) is None


def test_update_is_a_read_modify_write_of_one_entry(tmp_path: Path) -> None:
    cache = CapabilityCache(tmp_path / "c.json")
    stored = cache.put(_entry(max_ok_input=3000))
    untouched = cache.put(_entry("e" * 64))
    seen: list[CapabilityEntry | None] = []

    def learn(current: CapabilityEntry | None) -> CapabilityEntry:
        seen.append(current)
        assert current is not None
        return dataclasses.replace(current, max_ok_input=3500, last_overflow=4800)

    after = cache.update(stored.fingerprint, learn)
    assert seen == [stored] and after is not None and not after.stale
    assert (after.max_ok_input, after.safe_context, after.last_overflow) == (3500, 2700, 4800)
    assert cache.get(stored.fingerprint) == after and cache.get(untouched.fingerprint) == untouched


def test_update_of_a_missing_entry_sees_none_and_an_entry_under_another_fingerprint_is_refused(tmp_path: Path) -> None:
    cache = CapabilityCache(tmp_path / "c.json")
    seen: list[CapabilityEntry | None] = []

    def keep_absent(current: CapabilityEntry | None) -> None:
        seen.append(current)

    assert cache.update("9" * 64, keep_absent) is None
    assert seen == [None] and cache.entries() == []
    with pytest.raises(CacheError, match="stored under"):
        cache.update("9" * 64, lambda _current: _entry("f" * 64))
    assert cache.entries() == []


def test_staleness_follows_the_configured_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    CapabilityCache(path).put(_entry(days_old=40))
    assert CapabilityCache(path).get("f" * 64).stale               # default: 30 days
    assert not CapabilityCache(path, staleness_days=60).get("f" * 64).stale
    CapabilityCache(path).put(_entry(days_old=1))
    assert not CapabilityCache(path).get("f" * 64).stale


def _tiny_model(tmp_path: Path, seed: int = 0) -> Path:
    return write_llama_gqa(tmp_path / "tiny.gguf", seed=seed)


def test_lookup_follows_the_fingerprint(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    cache = tmp_path / "caps.json"
    report = probe(model, certify=False, cache_path=cache, memory_budget="1GiB")
    assert report.entry.method == "estimated" and not report.entry.certified
    assert lookup_capability(model, cache_path=cache, memory_budget="1GiB") == report.entry
    # Another budget, other settings: another fingerprint, so no entry.
    assert lookup_capability(model, cache_path=cache, memory_budget="2GiB") is None
    assert lookup_capability(model, cache_path=cache, memory_budget="1GiB",
                             settings=RuntimeSettings(type_k="q8_0")) is None
    # No budget named anywhere: the entry recorded under any budget for the same model and settings.
    assert lookup_capability(model, cache_path=cache).fingerprint == report.entry.fingerprint
    assert current_components(report.entry) == report.entry.components
    # The file changes (same shape, other weights): its sha256 and so its fingerprint change.
    _tiny_model(tmp_path, seed=7)
    assert lookup_capability(model, cache_path=cache, memory_budget="1GiB") is None
    assert current_components(report.entry) != report.entry.components


def test_staleness_from_the_config_file(tmp_path: Path, isolated_dirs: Path) -> None:
    model = _tiny_model(tmp_path)
    cache_path = tmp_path / "caps.json"
    entry = probe(model, certify=False, cache_path=cache_path, memory_budget="1GiB").entry
    old = (datetime.now(timezone.utc) - timedelta(days=10)).isoformat()
    CapabilityCache(cache_path).put(dataclasses.replace(entry, probed_at=old))
    assert not lookup_capability(model, cache_path=cache_path, memory_budget="1GiB").stale
    config = tmp_path / "short.toml"
    config.write_text("[probe]\nstaleness_days = 7\n")
    # The probe reads no config file itself: the caller passes what its settings say (--config included).
    assert not lookup_capability(model, cache_path=cache_path, memory_budget="1GiB").stale
    days = Settings.load(config).probe.staleness_days
    assert lookup_capability(model, cache_path=cache_path, memory_budget="1GiB", staleness_days=days).stale
    target = JudgeTarget.resolve(Settings.load(config).with_overrides({"judge.model": str(model),
                                                                        "probe.memory_budget": "1GiB"}),
                                 capabilities=cache_path)
    assert target.entry is not None and target.entry.stale


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 99, "entries": {}}',
                                     '{"version": 1, "entries": {"x": {"fingerprint": "x"}}}', "\xff\xfe"])
def test_a_corrupt_file_is_an_error_and_is_never_replaced(tmp_path: Path, content: str) -> None:
    path = tmp_path / "caps.json"
    path.write_bytes(content.encode("latin-1"))
    cache = CapabilityCache(path)
    with pytest.raises(CacheError) as error:
        cache.get("x")
    message = str(error.value)
    assert str(path) in message and "kvjudge cache clear" in message and "\n" not in message
    with pytest.raises(CacheError):
        cache.put(_entry())
    with pytest.raises(CacheError):
        probe(_tiny_model(tmp_path), certify=False, cache_path=path)
    assert path.read_bytes() == content.encode("latin-1")
    assert cache.clear() == -1 and not path.exists()


_WRITER = textwrap.dedent("""
    import dataclasses
    import sys
    from kvjudge.probe import CapabilityCache, CapabilityEntry
    path, worker, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cache = CapabilityCache(path)
    for i in range(rounds):
        tokens = worker * 1000 + i
        cache.update("s" * 64, lambda e: dataclasses.replace(e, max_ok_input=max(e.max_ok_input, tokens)))
        fp = f"{worker:02d}{i:062d}"
        cache.put(CapabilityEntry(fingerprint=fp, model_sha256="b" * 64, model_path="/m", device="d",
                                  max_context_tokens=i, max_ok_input=None, safe_context=None, certified=False,
                                  certified_at=None, method="estimated", trials=[], probed_at="2026-01-01T00:00:00+00:00"))
""")


def test_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "caps.json"
    CapabilityCache(path).put(_entry("s" * 64, max_ok_input=1))
    workers, rounds = 4, 15
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w), str(rounds)])
             for w in range(workers)]
    assert [p.wait(timeout=120) for p in procs] == [0] * workers
    cache = CapabilityCache(path)
    entries = {e.fingerprint: e for e in cache.entries()}
    assert len(entries) == 1 + workers * rounds
    assert entries["s" * 64].max_ok_input == (workers - 1) * 1000 + rounds - 1
    assert not list(tmp_path.glob(".caps.json.*.tmp"))  # no stray temp files
