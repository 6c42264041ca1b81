"""kvjudge.probe: how much context a model really holds on this device.

Devices (NVML, psutil + cgroups) + the GGUF header + llama.cpp's KV allocation rules give
``max_context_tokens``; certification (real runs in child processes) gives ``max_ok_input`` and
``safe_context``; the capability cache keeps them per fingerprint. A served model (an OpenAI-compatible server)
is probed with real requests instead (:func:`probe_server`) and cached beside the local entries.
"""

from kvjudge.probe.cache import CapabilityCache, CapabilityEntry, default_cache_path
from kvjudge.probe.certify import Certification, Trial
from kvjudge.probe.core import (
    CapabilityLookup,
    Footprint,
    Placement,
    ProbeReport,
    certify_context,
    ensure_capability,
    footprint,
    lookup_capability,
    max_context_tokens,
    memory_needed,
    probe,
    ran_at,
)
from kvjudge.probe.devices import Device, DeviceReport, discover_devices
from kvjudge.probe.gguf_shape import ModelShape, read_model_shape
from kvjudge.probe.kv_math import KvBreakdown, compute_buffer_bytes, kv_breakdown, kv_cache_bytes
from kvjudge.probe.served import ServedLookup, ServedProbeReport, lookup_served, probe_server, served_status
from kvjudge.probe.settings import KV_TYPE_NAMES, RuntimeSettings, format_size, parse_size

__all__ = [
    "KV_TYPE_NAMES", "CapabilityCache", "CapabilityEntry", "CapabilityLookup", "Certification", "Device",
    "DeviceReport", "Footprint", "KvBreakdown", "ModelShape", "Placement", "ProbeReport", "RuntimeSettings",
    "ServedLookup", "ServedProbeReport", "Trial", "certify_context", "compute_buffer_bytes", "default_cache_path",
    "discover_devices", "ensure_capability", "footprint", "format_size", "kv_breakdown", "kv_cache_bytes",
    "lookup_capability", "lookup_served", "max_context_tokens", "memory_needed", "parse_size", "probe",
    "probe_server", "ran_at", "read_model_shape", "served_status",
]
