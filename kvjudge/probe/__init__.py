"""kvjudge.probe: how much context a model really holds on this device.

Devices (NVML, psutil + cgroups) + the GGUF header + llama.cpp's KV allocation rules give
``max_context_tokens``; certification (real runs in child processes) gives ``max_ok_input`` and
``safe_context``; the capability cache keeps them per fingerprint. A served model (an OpenAI-compatible server)
is probed with real requests instead (:func:`probe_server`) and cached beside the local entries.
"""

from kvjudge.probe.cache import CapabilityCache, CapabilityEntry, default_cache_path
from kvjudge.probe.core import (
    CapabilityLookup,
    ProbeReport,
    ensure_capability,
    lookup_capability,
    max_context_tokens,
    memory_needed,
    probe,
)
from kvjudge.probe.devices import Device, DeviceReport, discover_devices
from kvjudge.probe.gguf_shape import ModelShape, read_model_shape
from kvjudge.probe.kv_math import KvBreakdown, kv_breakdown, kv_cache_bytes
from kvjudge.probe.served import ServedProbeReport, lookup_served, probe_server
from kvjudge.probe.settings import RuntimeSettings

__all__ = [
    "CapabilityCache", "CapabilityEntry", "CapabilityLookup", "Device", "DeviceReport", "KvBreakdown", "ModelShape",
    "ProbeReport", "RuntimeSettings", "ServedProbeReport", "default_cache_path", "discover_devices",
    "ensure_capability", "kv_breakdown", "kv_cache_bytes", "lookup_capability", "lookup_served",
    "max_context_tokens", "memory_needed", "probe", "probe_server", "read_model_shape",
]
