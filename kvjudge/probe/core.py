"""The probe: devices + model shape + KV math → ``max_context_tokens``; certification → ``max_ok_input`` and
``safe_context``; all of it cached per fingerprint (model sha256, llama-cpp-python version, device identity,
runtime settings, memory budget).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.errors import ProbeError
from kvjudge.probe.cache import CapabilityCache, CapabilityEntry, utc_now
from kvjudge.probe.certify import certify as run_certification
from kvjudge.probe.certify import certify_size
from kvjudge.probe.devices import Device, DeviceReport, discover_devices
from kvjudge.probe.gguf_shape import ModelShape, read_model_shape
from kvjudge.probe.kv_math import (
    CTX_PAD,
    GPU_RUNTIME_MARGIN,
    HOST_RUNTIME_MARGIN,
    MIB,
    check_kv_types,
    compute_buffer_bytes,
    kv_breakdown,
    kv_bytes_per_token,
    output_buffer_bytes,
)
from kvjudge.probe.settings import RuntimeSettings, parse_size

ProgressFn = Callable[[str], None]


def llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Placement:
    """Where the model goes and how much of that device's memory it may use."""

    device: Device
    usable_bytes: int              # on ``device`` (capped by the memory budget)
    host_usable_bytes: int         # host RAM for what stays on the host when layers are offloaded
    offloaded_layers: int          # layers on the GPU (0 when on the host)
    memory_budget: int | None

    @property
    def on_gpu(self) -> bool:
        return self.device.kind == "gpu"

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device.name, "kind": self.device.kind, "identity": self.device.identity,
                "usable_bytes": self.usable_bytes, "offloaded_layers": self.offloaded_layers,
                "memory_budget": self.memory_budget}


def place(shape: ModelShape, devices: DeviceReport, settings: RuntimeSettings,
          memory_budget: int | None) -> Placement:
    """The model goes on the first GPU when layers are offloaded and a GPU was seen, else on the host."""
    host = devices.host
    if settings.gpu_layers != 0 and devices.gpus:
        gpu = devices.gpus[0]
        layers = shape.n_layer if settings.gpu_layers < 0 else min(settings.gpu_layers, shape.n_layer)
        usable = gpu.free_bytes if memory_budget is None else min(gpu.free_bytes, memory_budget)
        return Placement(gpu, usable, host.free_bytes, layers, memory_budget)
    usable = host.free_bytes if memory_budget is None else min(host.free_bytes, memory_budget)
    return Placement(host, usable, host.free_bytes, 0, memory_budget)


@dataclass(frozen=True)
class Footprint:
    """Bytes a context of ``n_ctx`` needs: on the placement device, and on the host when layers are split."""

    n_ctx: int
    weights: int
    repack: int            # estimate (CPU only)
    kv: int                # exact, llama.cpp's allocation
    compute: int           # estimate, see kv_math.compute_buffer_bytes
    output: int
    margin: int
    device_bytes: int
    host_bytes: int        # 0 when everything is on the host (then device_bytes is the host figure)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"compute_is_estimate": True}


def footprint(shape: ModelShape, n_ctx: int, settings: RuntimeSettings, placement: Placement) -> Footprint:
    """Weights + KV + compute buffer + output buffer + the runtime margin, split by device."""
    kv = kv_breakdown(shape, n_ctx, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                      swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
    compute = compute_buffer_bytes(shape, n_ctx, settings)
    output = output_buffer_bytes(shape, settings)
    if not placement.on_gpu:
        total = shape.weight_bytes + shape.repack_bytes + kv.total + compute + output + HOST_RUNTIME_MARGIN
        return Footprint(kv.layout.n_ctx, shape.weight_bytes, shape.repack_bytes, kv.total, compute, output,
                         HOST_RUNTIME_MARGIN, total, 0)
    # llama.cpp offloads the last ``offloaded_layers`` layers; their share of the weights and their KV go along.
    first_gpu = shape.n_layer - placement.offloaded_layers
    fraction = placement.offloaded_layers / shape.n_layer
    gpu_weights = int(shape.weight_bytes * fraction)
    gpu_kv = sum(kv.layer_bytes[first_gpu:])
    device_bytes = gpu_weights + gpu_kv + compute + GPU_RUNTIME_MARGIN
    host_repack = int(shape.repack_bytes * (1 - fraction))
    host_bytes = (shape.weight_bytes - gpu_weights) + host_repack + (kv.total - gpu_kv) + output + HOST_RUNTIME_MARGIN
    return Footprint(kv.layout.n_ctx, shape.weight_bytes, host_repack, kv.total, compute, output,
                     GPU_RUNTIME_MARGIN, device_bytes, host_bytes)


def fits(fp: Footprint, placement: Placement) -> bool:
    if fp.device_bytes > placement.usable_bytes:
        return False
    return not (placement.on_gpu and fp.host_bytes > placement.host_usable_bytes)


def max_context_tokens(shape: ModelShape, settings: RuntimeSettings, placement: Placement) -> int:
    """The largest multiple of 256, not above the training context, whose footprint fits (0 when none does)."""
    lo, hi = 0, shape.n_ctx_train // CTX_PAD  # in units of 256 tokens; footprint grows with n_ctx
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(footprint(shape, mid * CTX_PAD, settings, placement), placement):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


def fingerprint_components(model_sha256: str, placement: Placement, settings: RuntimeSettings) -> dict[str, Any]:
    """What the capability fingerprint is made of."""
    return {"model_sha256": model_sha256, "llama_cpp_python": llama_cpp_version(),
            "device": placement.device.identity, **settings.as_dict(), "memory_budget": placement.memory_budget}


def fingerprint_of(components: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(components, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ProbeReport:
    """Everything one probe found; ``as_dict`` is the ``kvjudge probe --json`` object."""

    devices: DeviceReport
    shape: ModelShape
    sha256: str
    settings: RuntimeSettings
    placement: Placement
    max_context_tokens: int
    footprint_at_max: Footprint
    kv_bytes_per_token: float
    entry: CapabilityEntry
    cached: bool                      # the certification came from the cache, not from this run
    n_ctx: int | None = None
    kv_cache_bytes: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def certified(self) -> bool:
        return self.entry.certified

    def as_dict(self) -> dict[str, Any]:
        entry = self.entry
        data: dict[str, Any] = {
            "devices": self.devices.as_list(),
            "device_notes": list(self.devices.notes),
            "placement": self.placement.as_dict(),
            "model": {"path": self.shape.path, "sha256": self.sha256, "arch": self.shape.arch,
                      "name": self.shape.name, "n_layer": self.shape.n_layer, "n_ctx_train": self.shape.n_ctx_train,
                      "n_head_kv": list(self.shape.n_head_kv), "head_dim_k": self.shape.head_dim_k,
                      "head_dim_v": self.shape.head_dim_v, "n_swa": self.shape.n_swa,
                      "swa_layers": [i for i, s in enumerate(self.shape.swa_layers) if s],
                      "swa_source": self.shape.swa_source, "n_vocab": self.shape.n_vocab,
                      "weight_bytes": self.shape.weight_bytes},
            "settings": self.settings.as_dict(),
            "memory_budget": self.placement.memory_budget,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_context_tokens": self.max_context_tokens,
            "footprint_at_max": self.footprint_at_max.as_dict(),
            "max_ok_input": entry.max_ok_input,
            "safe_context": entry.safe_context,
            "certified": entry.certified,
            "certified_at": entry.certified_at,
            "method": entry.method,
            "cached": self.cached,
            "trials": entry.trials,
            "fingerprint": entry.fingerprint,
            "notes": list(self.notes),
        }
        if self.n_ctx is not None:
            data["n_ctx"] = self.n_ctx
            data["kv_cache_bytes"] = self.kv_cache_bytes
        return data


def _budget(memory_budget: int | str | None) -> int | None:
    """The budget given (a size or bytes), else None (no cap). The caller reads ``[probe] memory_budget``."""
    return None if memory_budget is None else parse_size(memory_budget)


def _find_entry(cache: CapabilityCache, ctx: _Context, budget_named: bool) -> CapabilityEntry | None:
    """The entry under this fingerprint; when no budget was named anywhere, else the most recent entry that
    matches in everything but the budget (so a later lookup finds what ``probe --memory-budget`` recorded)."""
    exact = cache.get(ctx.fingerprint)
    if exact is not None or budget_named:
        return exact
    rest = {k: v for k, v in ctx.components.items() if k != "memory_budget"}
    matches = [e for e in cache.entries()
               if {k: v for k, v in e.components.items() if k != "memory_budget"} == rest]
    matches.sort(key=lambda e: (e.certified, e.age_reference() or ""), reverse=True)
    return matches[0] if matches else None


@dataclass(frozen=True)
class _Context:
    model_path: Path
    shape: ModelShape
    sha256: str
    devices: DeviceReport
    placement: Placement
    components: dict[str, Any]
    fingerprint: str


def _context(model_path: str | os.PathLike[str] | None, settings: RuntimeSettings,
             memory_budget: int | str | None, devices: DeviceReport | None) -> _Context:
    from kvjudge.models import file_sha256, resolve_model

    path = resolve_model(model_path)
    shape = read_model_shape(path)
    check_kv_types(shape, settings.type_k, settings.type_v, settings.flash_attn)
    sha = file_sha256(path)
    report = devices if devices is not None else discover_devices()
    placement = place(shape, report, settings, _budget(memory_budget))
    components = fingerprint_components(sha, placement, settings)
    return _Context(path, shape, sha, report, placement, components, fingerprint_of(components))


def probe(model_path: str | os.PathLike[str] | None = None, *, settings: RuntimeSettings = RuntimeSettings(),
          memory_budget: int | str | None = None, n_ctx: int | None = None, certify: bool = True,
          cache_path: str | os.PathLike[str] | None = None, refresh: bool = False,
          progress: ProgressFn | None = None, devices: DeviceReport | None = None,
          trial_timeout_s: float | None = None, staleness_days: float | None = None) -> ProbeReport:
    """Probe ``model_path`` (None: the default model) on this host and record the result in the cache.

    With ``certify`` the model really runs in child processes (see :mod:`kvjudge.probe.certify`); a fresh
    certified cache entry with the same fingerprint is reused unless ``refresh``. Without ``certify`` only the
    analytic figure is computed and stored as an estimate (a certified entry is never downgraded).
    """
    ctx = _context(model_path, settings, memory_budget, devices)
    shape, placement = ctx.shape, ctx.placement
    best = max_context_tokens(shape, settings, placement)
    if best == 0:
        need = footprint(shape, CTX_PAD, settings, placement)
        raise ProbeError(f"{shape.name or shape.arch} does not fit: even a {CTX_PAD}-token context needs "
                         f"{need.device_bytes / MIB:.0f} MiB but {placement.device.name} offers "
                         f"{placement.usable_bytes / MIB:.0f} MiB; raise --memory-budget or free memory")
    cache = CapabilityCache(cache_path, staleness_days=staleness_days)
    existing = cache.get(ctx.fingerprint)
    notes: list[str] = []
    cached = False
    if existing is not None and existing.certified and not existing.stale and not refresh:
        entry = dataclasses.replace(existing, max_context_tokens=best, model_path=str(ctx.model_path))
        entry = cache.put(entry)
        cached = True
    elif certify:

        result = run_certification(ctx.model_path, shape, settings, placement, start_n_ctx=best,
                                   progress=progress, timeout_s=trial_timeout_s)
        notes.extend(result.notes)
        now = utc_now()
        entry = CapabilityEntry(
            fingerprint=ctx.fingerprint, model_sha256=ctx.sha256, model_path=str(ctx.model_path),
            device=placement.device.identity, max_context_tokens=best, max_ok_input=result.max_ok_input,
            safe_context=result.safe_context, certified=result.certified,
            certified_at=now if result.certified else None,
            method="measured" if result.certified else "estimated", trials=[t.as_dict() for t in result.trials],
            probed_at=now, settings=settings.as_dict(), memory_budget=placement.memory_budget,
            components=ctx.components)
        entry = cache.put(entry)
    elif existing is not None and existing.certified and not existing.stale:
        entry, cached = existing, True
    else:
        entry = cache.put(CapabilityEntry(
            fingerprint=ctx.fingerprint, model_sha256=ctx.sha256, model_path=str(ctx.model_path),
            device=placement.device.identity, max_context_tokens=best, max_ok_input=None, safe_context=None,
            certified=False, certified_at=None, method="estimated", trials=[], probed_at=utc_now(),
            settings=settings.as_dict(), memory_budget=placement.memory_budget, components=ctx.components))
    kv_at_n = None
    if n_ctx is not None:
        kv_at_n = kv_breakdown(shape, n_ctx, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                               swa_full=settings.swa_full, n_ubatch=settings.n_ubatch,
                               flash_attn=settings.flash_attn).total
    return ProbeReport(devices=ctx.devices, shape=shape, sha256=ctx.sha256, settings=settings,
                       placement=placement, max_context_tokens=best,
                       footprint_at_max=footprint(shape, best, settings, placement),
                       kv_bytes_per_token=kv_bytes_per_token(shape, settings), entry=entry, cached=cached,
                       n_ctx=n_ctx, kv_cache_bytes=kv_at_n, notes=tuple(notes))


def memory_needed(model_path: str | os.PathLike[str] | None, n_ctx: int, *,
                  settings: RuntimeSettings = RuntimeSettings()) -> int:
    """Bytes the probe plans for an ``n_ctx``-token context of ``model_path`` on the device it would use.

    Passing this as ``memory_budget`` makes ``n_ctx`` the analytic ``max_context_tokens``: the demo uses it
    to keep certification on a CPU to a small context.
    """
    if n_ctx <= 0:
        from kvjudge.errors import UsageError

        raise UsageError(f"n_ctx must be a positive number of tokens, got {n_ctx}")
    ctx = _context(model_path, settings, None, None)
    return footprint(ctx.shape, n_ctx, settings, ctx.placement).device_bytes


def lookup_capability(model_path: str | os.PathLike[str] | None, *, cache_path: str | os.PathLike[str] | None = None,
                      settings: RuntimeSettings = RuntimeSettings(), memory_budget: int | str | None = None,
                      staleness_days: float | None = None) -> CapabilityEntry | None:
    """The cached entry for this model on this device with these settings (``stale`` set), or None.

    Never probes. An entry recorded under another fingerprint (another file, device, version or settings)
    is not returned. ``memory_budget`` None (none named) finds the most recent entry recorded under any budget for
    the same model, device and settings.
    """
    ctx = _context(model_path, settings, memory_budget, None)
    cache = CapabilityCache(cache_path, staleness_days=staleness_days)
    return _find_entry(cache, ctx, budget_named=ctx.placement.memory_budget is not None)


def ensure_capability(model_path: str | os.PathLike[str] | None, *,
                      cache_path: str | os.PathLike[str] | None = None,
                      settings: RuntimeSettings = RuntimeSettings(), memory_budget: int | str | None = None,
                      certify: bool = True, progress: ProgressFn | None = None,
                      staleness_days: float | None = None, n_ctx: int | None = None) -> CapabilityEntry:
    """The cached entry, probing (and, with ``certify``, certifying) when it is missing, stale, or not
    certified while certification is asked for.

    With ``n_ctx`` only that size is certified (one trial, see :func:`certify_context`), and only when no
    fresh trial at that size or larger has run: what the judge needs, never the whole trained context.
    """
    entry = lookup_capability(model_path, cache_path=cache_path, settings=settings, memory_budget=memory_budget,
                              staleness_days=staleness_days)
    if n_ctx is not None:
        if entry is not None and not entry.stale and ran_at(entry, n_ctx):
            return entry
        if certify:
            return certify_context(model_path, n_ctx, cache_path=cache_path, settings=settings,
                                   memory_budget=memory_budget if entry is None else entry.memory_budget,
                                   progress=progress, staleness_days=staleness_days)
        if entry is not None and not entry.stale:
            return entry
    if entry is not None and not entry.stale and (entry.certified or not certify):
        return entry
    if memory_budget is None and entry is not None:
        memory_budget = entry.memory_budget  # re-probe under the budget the entry was recorded with
    report = probe(model_path, settings=settings, memory_budget=memory_budget, certify=certify,
                   cache_path=cache_path, refresh=entry is not None and entry.stale, progress=progress,
                   staleness_days=staleness_days)
    return report.entry


@dataclass(frozen=True)
class CapabilityLookup:
    """Where a local model's capability entries are read and written, under which memory budget and staleness
    limit: one value, so every lookup of one judge (its target, its window planner, the demo's probe) reads the
    same entry. The judge target builds it from ``--capabilities`` and ``[probe] memory_budget`` /
    ``staleness_days``; the default is the cache in the cache dir, no budget named, the default staleness."""

    cache_path: str | os.PathLike[str] | None = None
    memory_budget: int | str | None = None
    staleness_days: float | None = None
    settings: RuntimeSettings = RuntimeSettings()

    def find(self, model_path: str | os.PathLike[str] | None) -> CapabilityEntry | None:
        """:func:`lookup_capability` (never probes)."""
        return lookup_capability(model_path, cache_path=self.cache_path, settings=self.settings,
                                 memory_budget=self.memory_budget, staleness_days=self.staleness_days)

    def ensure(self, model_path: str | os.PathLike[str] | None, *, certify: bool = True, n_ctx: int | None = None,
               progress: ProgressFn | None = None) -> CapabilityEntry:
        """:func:`ensure_capability` (probes, or certifies ``n_ctx`` only, when it must)."""
        return ensure_capability(model_path, cache_path=self.cache_path, settings=self.settings,
                                 memory_budget=self.memory_budget, certify=certify, progress=progress,
                                 staleness_days=self.staleness_days, n_ctx=n_ctx)

    def probe(self, model_path: str | os.PathLike[str] | None, *, certify: bool = True,
              progress: ProgressFn | None = None) -> ProbeReport:
        """:func:`probe` under this lookup's cache, budget and staleness (a fresh certified entry is reused)."""
        return probe(model_path, settings=self.settings, memory_budget=self.memory_budget, certify=certify,
                     cache_path=self.cache_path, progress=progress, staleness_days=self.staleness_days)


def ran_at(entry: CapabilityEntry, n_ctx: int) -> bool:
    """A trial at ``n_ctx`` or larger ran in full on this entry's device (memory only grows with n_ctx)."""
    return any(t.get("outcome") == "ok" and int(t.get("n_ctx") or 0) >= n_ctx for t in entry.trials)


def certify_context(model_path: str | os.PathLike[str] | None, n_ctx: int, *,
                    cache_path: str | os.PathLike[str] | None = None, settings: RuntimeSettings = RuntimeSettings(),
                    memory_budget: int | str | None = None, progress: ProgressFn | None = None,
                    staleness_days: float | None = None, trial_timeout_s: float | None = None) -> CapabilityEntry:
    """Certify one context size: one trial at ``n_ctx``, recorded in the entry (its trials, and
    ``max_ok_input`` when the prompt ran). A whole certification already in the entry is kept; a size-only
    one never marks the entry ``certified`` (that is the boundary search of :func:`probe`).

    Raises ProbeError when ``n_ctx`` is over the analytic bound or the trial did not run.
    """
    ctx = _context(model_path, settings, memory_budget, None)
    best = max_context_tokens(ctx.shape, settings, ctx.placement)
    if n_ctx > best:
        raise ProbeError(f"n_ctx {n_ctx} is over the {best} tokens that fit {ctx.model_path.name} on "
                         f"{ctx.placement.device.name} (analytic); use a smaller context")
    cache = CapabilityCache(cache_path, staleness_days=staleness_days)
    existing = cache.get(ctx.fingerprint)
    fresh = existing is not None and not existing.stale
    trial = certify_size(ctx.model_path, settings, ctx.placement, n_ctx, progress=progress, timeout_s=trial_timeout_s)
    trials = [*(existing.trials if fresh and existing else []), trial.as_dict()]
    ran = [int(t.get("prompt_tokens") or 0) for t in trials if t.get("outcome") == "ok"]
    whole = existing if fresh and existing is not None and existing.certified else None
    now = utc_now()
    entry = cache.put(CapabilityEntry(
        fingerprint=ctx.fingerprint, model_sha256=ctx.sha256, model_path=str(ctx.model_path),
        device=ctx.placement.device.identity, max_context_tokens=best, max_ok_input=max(ran) if ran else None,
        safe_context=whole.safe_context if whole else None, certified=whole is not None,
        certified_at=whole.certified_at if whole else None, method="measured" if ran else "estimated",
        trials=trials, probed_at=now, settings=settings.as_dict(), memory_budget=ctx.placement.memory_budget,
        components=ctx.components))
    if trial.outcome != "ok":
        raise ProbeError(f"{ctx.model_path.name} did not run at n_ctx {n_ctx} on {ctx.placement.device.name} "
                         f"({trial.outcome.replace('_', ' ')}: {trial.detail or 'no detail'}); pass a smaller "
                         f"--n-ctx, or run `kvjudge probe --model {ctx.model_path}` to find what fits")
    return entry


def current_components(entry: CapabilityEntry, devices: DeviceReport | None = None) -> dict[str, Any]:
    """The fingerprint components ``entry`` would have if probed now (raises ModelError when its file is gone).

    An entry whose stored components differ (the file changed, another device, another llama-cpp-python)
    needs a refresh.
    """
    settings = RuntimeSettings(**entry.settings)
    ctx = _context(entry.model_path, settings, entry.memory_budget, devices)
    return ctx.components
