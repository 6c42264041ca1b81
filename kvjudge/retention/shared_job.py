"""One job shared by several processes (on one host, or many on a store server): each claims a unit of work before
sending its calls, renews its leases while it works, writes a finished unit's result in the transaction that
releases its claim, and waits for what others hold until it is done or their leases expire.

:class:`Sharing` is how a process takes part (the store's claims, its worker id, the lease); :meth:`Sharing.job`
opens a :class:`SharedJob` over a job's units (each named by the key of its result), which a caller drives:

1. :meth:`SharedJob.take` claims one unit just before its calls are prepared (False: another worker holds it or
   it is done; the caller leaves it);
2. :meth:`SharedJob.finish` marks it done (its result written in the same transaction) or free again after a
   failure (a worker tries a unit at most once in a job; another may try it);
3. :meth:`SharedJob.wait` blocks until the units left to others are done or some of them are free again (a killed
   worker's lease expired), and returns those it then claimed for the caller to do.

A lease keeper (a thread) renews this worker's claims every third of the lease; a worker killed stops renewing, and
its units are taken over once its leases expire — or at once by a worker of the same host that finds its process
gone (a command run again after a crash does not wait out the lease). At most a killed worker's claimed units are
sent again.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import StoreError, UsageError
from kvjudge.retention.store.interfaces import JobView, WorkClaims
from kvjudge.settings import DEFAULT_LEASE_S

#: How often a worker waiting for others looks at the job again.
POLL_S = 0.25


def worker_id() -> str:
    """This process as a worker: host, pid and a random part (a pid is reused; a host name is not unique)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def dead_here(worker: str) -> bool:
    """True when ``worker`` ran on this host and its process is gone (a crash, a kill): its claims need not wait for
    their leases. A worker of another host, or one alive, is never presumed dead."""
    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def check_lease(lease_seconds: float, timeout_seconds: float | None) -> None:
    """A lease shorter than a call's time-out would expire under a live call: refused in one line."""
    if lease_seconds <= 0:
        raise UsageError(f"the lease must be a positive number of seconds, got {lease_seconds:g}; set --lease or "
                         f"[store] lease_seconds")
    if timeout_seconds is not None and lease_seconds < timeout_seconds:
        raise UsageError(f"a lease of {lease_seconds:g} s is shorter than a call's time-out ({timeout_seconds:g} s): "
                         f"a claim would expire under a live call; raise --lease or lower --timeout")


@dataclass
class Sharing:
    """How this process takes part in shared jobs: the store's claims, its worker id, the lease, and what each job
    it took part in ended as (for the command's summary). ``on_view`` hears of the job's progress."""

    claims: WorkClaims
    lease_seconds: float = DEFAULT_LEASE_S
    worker: str = field(default_factory=worker_id)
    poll_seconds: float = POLL_S
    on_view: Callable[[JobView], None] | None = None
    jobs: list[SharedJob] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.claims.available():
            raise StoreError("this store's schema has no claims table, which processes sharing its work need; pass "
                             "--no-cache to work alone, or move its runs into a store this kvjudge created")

    def job(self, kind: str, units: Sequence[str], *, cached: Iterable[str] = ()) -> SharedJob:
        """A job of ``units`` (keys of their results); ``cached``: those whose results were stored before it
        began (done, by no one of this job)."""
        job = SharedJob(self, kind, list(dict.fromkeys(units)), set(cached))
        self.jobs.append(job)
        return job

    def summary(self) -> dict[str, Any]:
        """What this worker did and what its jobs hold (the last view of each, added up)."""
        views = [job.view() for job in self.jobs]
        totals = {name: sum(getattr(v, name) for v in views)
                  for name in ("units", "done", "done_here", "claimed", "claimed_here", "free")}
        return {"worker": self.worker, "lease_seconds": self.lease_seconds, **totals,
                "workers": max((v.workers for v in views), default=0),
                "taken_over": sum(job.taken_over for job in self.jobs)}

    def costs(self) -> list[dict[str, Any]]:
        """What every try of every unit of this worker's jobs cost, whoever sent the calls (units whose results
        were stored before the job began left out: they were paid for by an earlier one)."""
        return [cost for job in self.jobs for cost in self.claims.costs(job.open_units)]


class SharedJob:
    """One job's units as this worker drives them (see the module docstring). Use as a context manager: the lease
    keeper runs inside; on the way out (Ctrl-C, an error) this worker's unfinished claims are given back."""

    def __init__(self, sharing: Sharing, kind: str, units: list[str], cached: set[str]) -> None:
        self.sharing = sharing
        self.kind = kind
        self.units = units
        self.cached = cached
        self.open_units = [unit for unit in units if unit not in cached]
        self.held: set[str] = set()
        self.tried: set[str] = set()   # units this worker finished or failed: never claimed again in this job
        self.taken_over = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._reported = -math.inf

    def __enter__(self) -> SharedJob:
        self._keeper = threading.Thread(target=self._keep_leases, name="kvjudge-lease", daemon=True)
        self._keeper.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
        if self.held:
            self.sharing.claims.release(sorted(self.held), self.sharing.worker)
            self.held.clear()

    def _keep_leases(self) -> None:
        claims, every = self.sharing.claims, self.sharing.lease_seconds / 3
        try:
            while not self._stop.wait(every):
                claims.renew(self.sharing.worker, self.sharing.lease_seconds)
        finally:
            claims.close_renewer()

    def take(self, unit: str) -> bool:
        """Claim ``unit`` for this worker (False: it is done, or another worker holds it under a live lease)."""
        if unit in self.held:
            return True
        if unit in self.tried:
            return False
        sharing = self.sharing
        if sharing.claims.claim([unit], self.kind, sharing.worker, sharing.lease_seconds):
            self.held.add(unit)
            return True
        return False

    def finish(self, unit: str, cost: Mapping[str, Any] | None, *, done: bool) -> None:
        """Release ``unit`` inside the caller's transaction (the one writing its result): done, or free again after
        a failure here."""
        self.sharing.claims.finish(unit, self.sharing.worker, cost, done=done)
        self.held.discard(unit)
        self.tried.add(unit)
        self.report()

    def report(self, *, every: float = 1.0) -> None:
        """Tell ``on_view`` what the job holds, at most once per ``every`` seconds (a view is a query)."""
        now = time.monotonic()
        if self.sharing.on_view is not None and now - self._reported >= every:
            self._reported = now
            self.sharing.on_view(self.view())

    def wait(self, units: Iterable[str]) -> tuple[list[str], set[str]]:
        """Wait until each of ``units`` (left to others) is done or free again; claim the free ones this worker has
        not tried. Returns (units now claimed here, units settled: done by anyone, or tried here already). A unit
        tried here is never waited for: two items of one job may share a unit (two pairs whose views are the same
        share a verdict key), and the second must not wait on the first's unit for ever — its result is in the cache,
        or it failed here and is not tried again."""
        left = list(dict.fromkeys(units))
        claims, sharing = self.sharing.claims, self.sharing
        while True:
            done = claims.finished(left) | self.tried.intersection(left)
            open_units = [unit for unit in left if unit not in done]
            taken = claims.claim(open_units, self.kind, sharing.worker, sharing.lease_seconds,
                                 limit=len(open_units)) if open_units else []
            self.held.update(taken)
            self.taken_over += len(taken)
            if taken or not open_units:
                return taken, done
            # A worker of this host that died (a crash, then a rerun): its units are free now, not in a lease.
            dead = [holder for holder in claims.holders(open_units) if holder != sharing.worker and dead_here(holder)]
            if dead:
                for holder in dead:
                    claims.expire(holder)
                continue
            self.report()
            time.sleep(sharing.poll_seconds)

    def view(self) -> JobView:
        """What the job holds now, as this worker sees it (results stored before it began count as done)."""
        seen = self.sharing.claims.view(self.open_units, self.sharing.worker)
        return dataclasses.replace(seen, units=len(self.units), done=seen.done + len(self.units) - seen.units)
