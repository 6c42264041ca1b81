"""The retention ceiling and its hardware bound.

A pairwise judge reads two episodes into one KV cache, so a run may keep at most half of what the judge
model's context can hold on this device: ``effective = min(configured, max_context_tokens // 2)``.
The configured value alone is never an answer: without a probe figure this is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjudge.config import Config
from kvjudge.errors import CapabilityMissing, ConfigError, UsageError

DEFAULT_CEILING = 200_000


@dataclass(frozen=True)
class CeilingBound:
    """The effective ceiling and how it was reached."""

    configured: int
    hardware_bound: int  # max_context_tokens // 2
    effective: int

    @property
    def winner(self) -> str:
        """``"hardware"`` when the device bound is tighter, else ``"configured"`` (ties go to configured)."""
        return "hardware" if self.hardware_bound < self.configured else "configured"


def effective_ceiling(configured: int, max_context_tokens: int | None) -> CeilingBound:
    """``min(configured, max_context_tokens // 2)``; raises :class:`CapabilityMissing` without a probe figure."""
    if configured is None or configured <= 0:
        raise UsageError(f"the configured ceiling must be a positive number of tokens, got {configured!r}")
    if max_context_tokens is None:
        raise CapabilityMissing(
            "no max_context_tokens is known for the judge model on this device, so the retention ceiling "
            "cannot be bounded; run `kvjudge probe --model JUDGE_MODEL` (or pass --capabilities FILE)"
        )
    if max_context_tokens <= 0:
        raise UsageError(f"max_context_tokens must be positive, got {max_context_tokens!r}")
    bound = max_context_tokens // 2
    return CeilingBound(configured=configured, hardware_bound=bound, effective=min(configured, bound))


def configured_ceiling(config: Config, tenant: str | None = None) -> int:
    """``[retention.tenants.NAME] ceiling``, else ``[retention] ceiling``, else 200 000."""
    value = config.get("retention.ceiling", int, DEFAULT_CEILING)
    if tenant is not None:
        tenants = config.section("retention.tenants")
        if tenant in tenants:
            per_tenant = tenants[tenant]
            if not isinstance(per_tenant, dict):
                raise ConfigError(f"{config.source}: [retention.tenants.{tenant}] must be a table")
            value = config.get(f"retention.tenants.{tenant}.ceiling", int, value)
    if value <= 0:
        raise ConfigError(f"{config.source}: the retention ceiling must be positive, got {value}")
    return value
