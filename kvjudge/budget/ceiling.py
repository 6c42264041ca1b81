"""The retention ceiling and its hardware bound.

A pairwise judge reads two episodes into one KV cache, so a run may keep at most half of what the judge
model's context can hold on this device: ``effective = min(configured, max_context_tokens // 2)``.
The configured value alone is never an answer: without a probe figure this is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjudge.errors import CapabilityMissing, UsageError
from kvjudge.settings import RetentionSettings

DEFAULT_CEILING = RetentionSettings().ceiling  # [retention] ceiling when the config names none


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
