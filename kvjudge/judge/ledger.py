"""What judging cost, call by call: the :class:`CallCost` of one answered call and the :class:`Ledger` that adds
them up per verdict and per command.

A call's figures are the ones its answerer measured: a server's own ``usage`` (prompt, cached prompt and completion
tokens, :mod:`kvjudge.server_client.usage`), the in-process backend's own KV reuse. Cached prompt tokens a server
did not report are None ("not reported"), never 0; a ledger adds up the cached tokens of the calls that reported
them and says how many did. A retry is a try that failed before the call was answered (on the same server, or on
another one of a pool); it costs no tokens, and a call is counted once, when it is answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallCost:
    """One answered call: its prompt tokens, those served from a prefix cache (None: not reported), completion
    tokens, the tries that failed before it was answered, and the seconds it took (its tries included)."""

    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    retries: int = 0
    seconds: float = 0.0


@dataclass
class Ledger:
    """Calls and their tokens added up (a verdict's, a command's). ``cached_calls``: the calls whose cached prompt
    tokens were reported; ``cached_tokens`` is None while none was."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    cached_calls: int = 0
    completion_tokens: int = 0
    retries: int = 0
    seconds: float = 0.0

    def add(self, cost: CallCost) -> None:
        """Count one answered call."""
        reported = cost.cached_tokens is not None
        self.merge(Ledger(1, cost.prompt_tokens, cost.cached_tokens, int(reported), cost.completion_tokens,
                          cost.retries, cost.seconds))

    def failed_try(self, seconds: float = 0.0) -> None:
        """Count a try that failed (the call is counted once, by :meth:`add`, when some server answers it)."""
        self.retries += 1
        self.seconds += seconds

    def merge(self, other: Ledger) -> None:
        """Add ``other``'s figures to these."""
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.retries += other.retries
        self.seconds += other.seconds
        self.cached_calls += other.cached_calls
        if other.cached_tokens is not None:
            self.cached_tokens = (self.cached_tokens or 0) + other.cached_tokens

    @classmethod
    def of(cls, costs: Iterable[CallCost | None]) -> Ledger:
        """The ledger of ``costs`` (a verdict's calls; None: a call read from a cache, which cost nothing)."""
        ledger = cls()
        for cost in costs:
            if cost is not None:
                ledger.add(cost)
        return ledger

    @property
    def cached_share(self) -> float | None:
        """The share of prompt tokens served from a prefix cache, over the calls that reported it (None: none did)."""
        if self.cached_tokens is None or not self.cached_calls:
            return None
        reported = self.prompt_tokens if self.cached_calls == self.calls else None
        return None if not reported else self.cached_tokens / reported

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_tokens,
                "cached_reported_calls": self.cached_calls, "completion_tokens": self.completion_tokens,
                "retries": self.retries, "call_seconds": round(self.seconds, 3),
                "cached_share": None if self.cached_share is None else round(self.cached_share, 4)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        """The ledger :meth:`to_json` wrote."""
        return cls(calls=data["calls"], prompt_tokens=data["prompt_tokens"],
                   cached_tokens=data["cached_prompt_tokens"], cached_calls=data["cached_reported_calls"],
                   completion_tokens=data["completion_tokens"], retries=data["retries"],
                   seconds=data["call_seconds"])

    def line(self) -> str:
        """One line for a command's summary."""
        if self.cached_tokens is None:
            cached = "cached prompt tokens not reported"
        elif self.cached_share is not None:
            cached = f"{self.cached_tokens:,} from the prefix cache, {self.cached_share:.1%}"
        else:
            cached = f"{self.cached_tokens:,} from the prefix cache, reported by {self.cached_calls} calls"
        return (f"cost: {self.calls:,} calls, {self.prompt_tokens:,} prompt tokens ({cached}), "
                f"{self.completion_tokens:,} completion tokens, {self.retries} retries, {self.seconds:.1f} s of calls")


def plan_line(calls: int, cached: int, window: int | None, what: str = "verdict") -> str:
    """The line said before long work: the calls about to be sent and the tokens they may take, and the way out
    (``cached``: how many of ``what`` — verdict, score — were read from the cache)."""
    bound = f", at most {calls * window:,} prompt tokens ({window:,}-token window)" if window else ""
    return (f"about to send up to {calls:,} judge calls{bound}; {cached:,} {what}s from the cache; "
            f"Ctrl-C stops: every finished {what} stays cached")


__all__ = ["CallCost", "Ledger", "plan_line"]
