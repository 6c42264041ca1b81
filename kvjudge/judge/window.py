"""The judge window, decided here alone: as large as the pairs need, never larger than this device (or the judge
servers' certified entries) is known to hold.

``n_ctx`` = framing + both views + the answer, rounded up to a multiple of 256, capped by the certified
``safe_context`` when the model's entry is certified, else by the analytic ``max_context_tokens`` (the full
side of a still-grades check may always go up to the analytic bound: it must read the full runs). When the
chosen size has not run on this device yet, that size alone is certified (one trial in a child process),
announced first with an estimated duration from the measured prefill speed; ``certify=False``
(``--no-certify``) skips it and the window is labelled as not certified. Nothing here certifies the model's
whole trained context. A pool of judge servers gets one window for all of them (:func:`served_window`): the
smallest certified ``safe_context`` of their capability entries, or ``--n-ctx``, which may only lower it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import CapabilityMissing, JudgeError
from kvjudge.judge.pack import ANSWER_TOKENS
from kvjudge.probe import CapabilityEntry, CapabilityLookup, lookup_served
from kvjudge.probe.core import ran_at

if TYPE_CHECKING:
    from pathlib import Path

    from kvjudge.judge.backends import Backend
    from kvjudge.server_client import Credentials, ServerInfo

WINDOW_STEP = 256
BOUNDS: tuple[str, str] = ("certified", "analytic")
# Tokens evaluated to measure prefill speed when no trial has been timed for this model yet.
_SPEED_SAMPLE_TOKENS = 256

Say = Callable[[str], None]


def check_requested(requested: int | None) -> None:
    """``--n-ctx`` too small for any judge prompt is a one-line error."""
    if requested is not None and requested < 64:
        raise JudgeError(f"--n-ctx {requested} is too small for a judge prompt; use at least 512")


def window_tokens(prompt_tokens: int) -> int:
    """The n_ctx a prompt of ``prompt_tokens`` needs: with the answer, rounded up to a multiple of 256."""
    return -(-(prompt_tokens + ANSWER_TOKENS) // WINDOW_STEP) * WINDOW_STEP


@dataclass(frozen=True)
class Window:
    """A sized judge window and why it has that size."""

    n_ctx: int
    needed: int              # the n_ctx the pairs need (rounded up)
    cap: int | None          # the bound it was held to (None: none known)
    cap_source: str          # what that bound is
    measured: bool           # a prompt of this window's size (or larger) really ran on this device

    @property
    def cut(self) -> bool:
        """The pairs need more than the window holds: some views are further reduced to fit."""
        return self.needed > self.n_ctx

    @property
    def source(self) -> str:
        """One phrase for the manifest's ``n_ctx_source``."""
        checked = "measured on this device" if self.measured else "not certified"
        held = f"capped by {self.cap_source}" if self.cut else f"within {self.cap_source}"
        return f"sized to the pair ({self.needed} needed), {held}; {checked}"

    def to_json(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "needed": self.needed, "cap": self.cap, "cap_source": self.cap_source,
                "measured": self.measured, "cut": self.cut}


def _measured_speed(entry: CapabilityEntry) -> float | None:
    """Prompt tokens per second of the trials that ran (a lower bound: a trial's time includes loading)."""
    rates = [t["prompt_tokens"] / t["seconds"] for t in entry.trials or ()
             if t.get("outcome") == "ok" and t.get("prompt_tokens") and t.get("seconds")]
    return max(rates) if rates else None


@dataclass
class WindowPlanner:
    """Sizes the window of one backend for batches of pairs, certifying that size only when it must.

    ``requested`` (``--n-ctx``) is an upper bound, itself checked against what the device holds. ``capabilities``
    is where an in-process model's entry is read and recorded (the judge target hands over its own, so the window
    and the ceiling read one entry: ``--capabilities``, ``[probe] memory_budget`` and ``staleness_days``).
    """

    backend: Backend
    requested: int | None = None
    certify: bool = True
    capabilities: CapabilityLookup = field(default_factory=CapabilityLookup)
    say: Say | None = None
    progress: Say | None = None

    def __post_init__(self) -> None:
        check_requested(self.requested)

    def _say(self, message: str) -> None:
        if self.say is not None:
            self.say(message)

    def cap(self, bound: str = "certified") -> tuple[int, str]:
        """The largest window the pairs may get, and what bounds it: what :meth:`plan` holds any batch to."""
        if bound not in BOUNDS:
            raise JudgeError(f"window bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
        if self.backend.window_fixed:  # a server's context is what it is
            cap = self.requested or self.backend.n_ctx
            if cap is None:
                raise JudgeError("the judge server reports no context size; pass --n-ctx N")
            if not self.backend.servers:  # another kind of backend with a window of its own (backend_registry)
                return cap, "the backend's certified window" if self.backend.certified else "the backend's window"
            source = "the servers' certified safe_context" if self.backend.certified else "the server's context"
            return cap, source
        return self._local(bound)[:2]

    def plan(self, needed_tokens: int, *, bound: str = "certified") -> Window:
        """The window for prompts of up to ``needed_tokens`` tokens (without the answer)."""
        needed = window_tokens(needed_tokens)
        if self.backend.window_fixed:
            cap, source = self.cap(bound)
            # A pool windowed from every server's certified entry (kvjudge probe --server) has run that size.
            return Window(min(needed, cap), needed, cap, source, measured=self.backend.certified)
        return self._plan_local(needed, bound)

    def _local(self, bound: str) -> tuple[int, str, CapabilityEntry, bool]:
        """The in-process cap, what bounds it, the capability entry behind it and whether that entry is certified."""
        if bound not in BOUNDS:
            raise JudgeError(f"window bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
        model = self.backend.model_path
        if model is None:
            raise JudgeError("an in-process judge needs its model file; pass --model PATH")
        entry = self.capabilities.find(model)
        if entry is None or entry.stale:  # the analytic figure: no model run
            entry = self.capabilities.ensure(model, certify=False)
        certified = entry.certified and not entry.stale and bool(entry.safe_context)
        if bound == "certified" and certified:
            cap, cap_source = int(entry.safe_context), "the certified safe_context"
        else:
            cap, cap_source = int(entry.max_context_tokens), "the analytic max_context_tokens"
        if self.requested is not None:
            if self.requested > cap:
                raise JudgeError(f"--n-ctx {self.requested} is over {cap_source} ({cap}) for {model.name} on "
                                 f"this device; use --n-ctx {cap} or less")
            cap, cap_source = self.requested, "--n-ctx"
        return cap, cap_source, entry, certified

    def _plan_local(self, needed: int, bound: str) -> Window:
        cap, cap_source, entry, certified = self._local(bound)
        model = self.backend.model_path
        assert model is not None
        n_ctx = min(needed, cap)
        measured = ran_at(entry, n_ctx) or (certified and n_ctx <= int(entry.safe_context))
        if not measured and self.certify:
            speed = _measured_speed(entry) or self.backend.measure_prefill(_SPEED_SAMPLE_TOKENS)
            self._say(f"certifying {model.name} at n_ctx {n_ctx} only (one trial in a child process): about "
                      f"{n_ctx / speed:.0f} s at the measured prefill speed of {speed:.0f} tokens/s; "
                      f"--no-certify skips this")
            started = time.perf_counter()
            self.capabilities.ensure(model, n_ctx=n_ctx, progress=self.progress)
            self._say(f"certified n_ctx {n_ctx} in {time.perf_counter() - started:.0f} s")
            measured = True
        return Window(n_ctx, needed, cap, cap_source, measured)

    def open(self, needed_tokens: int, *, bound: str = "certified") -> Window:
        """Plan the window and load the backend with it."""
        window = self.plan(needed_tokens, bound=bound)
        self.backend.resize(window.n_ctx, source=window.source)
        return window


# The n_ctx sources that mean every server's entry vouched for the window.
CERTIFIED_SOURCES = ("capability cache (measured on the server)", "--n-ctx (within the certified context)")


def default_planner(backend: Backend) -> WindowPlanner | None:
    """The planner of a judge given none: None when the backend's window was chosen by its caller (a server's
    context, ``LlamaBackend(n_ctx=...)``): pairs are fitted into that window and nothing sizes it."""
    return None if backend.n_ctx is not None else WindowPlanner(backend)


def _vouched_n_ctx(entry: Any) -> int | None:
    """The judge window a served entry vouches for: its certified ``safe_context``."""
    return int(entry.safe_context) if entry is not None and entry.certified and entry.safe_context else None


def served_window(infos: Sequence[ServerInfo], requested: int | None, cache_path: str | Path | None,
                staleness_days: float | None, credentials: Credentials | None = None) -> tuple[int, str]:
    """The judge window on every server: the certified one from each server's capability entry (the smallest),
    or ``requested``, which may only lower it (and without an entry stays within the reported context)."""
    check_requested(requested)
    vouched: list[int] = []
    for info in infos:
        found = lookup_served(info.url, cache_path=cache_path, staleness_days=staleness_days, identified=info,
                              credentials=credentials)
        entry = found.entry
        window = _vouched_n_ctx(entry)
        if entry is not None and not entry.stale and window is not None:
            vouched.append(window)
            continue
        if requested is None:
            state = "stale" if entry is not None and entry.stale else "not certified" if entry is not None else \
                "missing"
            why = f": {found.reason}" if entry is None and found.reason not in ("", "no entry") else ""
            raise CapabilityMissing(f"no {'fresh ' if state == 'stale' else ''}probe figure for the model served at "
                                    f"{info.url} (entry {state}{why}); run `kvjudge probe --server {info.url}`, or "
                                    f"pass --n-ctx N to judge within its reported context")
        if info.n_ctx is not None and requested > info.n_ctx:
            raise JudgeError(f"--n-ctx {requested} is over the {info.n_ctx} tokens served at {info.url}")
    if requested is None:
        return min(vouched), "capability cache (measured on the server)"
    if vouched and requested > min(vouched):
        raise JudgeError(f"--n-ctx {requested} is over the certified context {min(vouched)} of the judge servers; "
                         f"use --n-ctx {min(vouched)} or less")
    certified = len(vouched) == len(infos)
    return requested, "--n-ctx (within the certified context)" if certified else "--n-ctx (not certified)"
