"""What the store offers, as a few small protocols, each with the rows it owns: the event recorder (the log), the
blob store (bodies), run queries (the projection of each run, read by name), the caches (token counts,
judgments) and the claims several processes sharing one job take on its units. A caller takes the narrowest one it needs; :class:`~kvjudge.retention.store.Store` composes one of
each, implemented on SQLite in this package. ``tests/store_cases.py`` holds one reusable test case per protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvjudge.retention import events as ev
from kvjudge.retention.state import DROPPED, REDUCED, TIERED, BodyLocation, RunState

#: A reader for bodies that are not local (tiering plugs the cold store in): ref → bytes or None.
FallbackReader = Callable[[str], "bytes | None"]


@dataclass(frozen=True)
class RunListing:
    """What a listing shows of one run, read from the projection (the run's state is not decoded).

    ``agent`` as :func:`~kvjudge.retention.state.agent_of` names it; ``bodies_gone`` counts bodies reduced or
    dropped; ``tokens`` is the run's visible text under the counter asked for, from stored counts only (None:
    not asked, or a body it shows was never counted)."""

    id: str
    tenant: str
    agent: str
    task_id: str | None
    trial: str | None
    state: str
    grades: tuple[dict[str, Any], ...]
    reduced: bool
    branches: int
    transitions: int
    bodies: int
    bodies_gone: int
    bodies_tiered: int
    tokens: int | None = None


@dataclass(frozen=True)
class Explanation:
    """What the log says about a ref: whether its body is here and, if not, which event says why.

    ``status`` is ``local`` when any run still reads the body here, else the status the log gives
    (``reduced``, ``dropped``, ``tiered``), or ``unknown`` when no run names the ref.
    """

    ref: str
    body_present: bool
    status: str
    summary_ref: str | None
    run: str | None
    lsn: int | None
    event: str | None  # kind of the explaining event ("Reduced", "Dropped", "Tiered", …)
    target: str | None
    locations: tuple[tuple[str, BodyLocation], ...]

    @property
    def explained(self) -> bool:
        """True when the body is here or the log says where it went."""
        return self.body_present or self.status in (REDUCED, DROPPED, TIERED)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "body_present": self.body_present, "status": self.status,
                "summary_ref": self.summary_ref, "run": self.run, "lsn": self.lsn, "event": self.event,
                "target": self.target, "explained": self.explained}


class OpenBody(Protocol):
    """A body open for reading in chunks (a context manager; closed after)."""

    def read(self, size: int = -1, /) -> bytes:
        ...

    def close(self) -> None:
        ...

    def __enter__(self) -> OpenBody:
        ...

    def __exit__(self, *exc: object) -> object:
        ...


class BodyReading(Protocol):
    """Bodies read in chunks by several threads at once (tiering's uploads): each thread reads through a
    connection of its own. ``Store.body_readers()`` gives one; close it after."""

    def open(self, ref: str) -> OpenBody | None:
        """The body of ``ref`` opened for reading, None when it is not here."""
        ...

    def close(self) -> None:
        ...


class Transactions(Protocol):
    """One unit of work over the store's parts: what is written inside commits together or not at all."""

    def transaction(self, label: str, *, durable: bool = True) -> contextlib.AbstractContextManager[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; nested calls join the outer one; fault point ``<label>.txn``."""
        ...


class EventRecorder(Protocol):
    """The append-only log (its rows: the events). Appending checks each event against the state the run is in
    and keeps the projection in step, in the same transaction."""

    def append(self, run_id: str, event: ev.Event, *, label: str = "append") -> int:
        """Append one event (its own transaction, or the caller's); returns its LSN."""
        ...

    def append_many(self, run_id: str, events: Sequence[ev.Event], *, label: str = "append") -> list[int]:
        """Append events of one run atomically; returns their LSNs."""
        ...

    def mark(self, run_id: str, state: str) -> int:
        """Append a lifecycle step (RunStateError when it is not a legal one); returns its LSN."""
        ...

    def iter_events(self, run_id: str | None = None, *, kind: str | None = None) -> Iterator[tuple[int, ev.Event]]:
        """``(lsn, event)`` of one run (or every run, grouped by run) in LSN order; only ``kind`` when given."""
        ...

    def events_after(self, lsn: int, limit: int = 1000) -> list[tuple[int, str, ev.Event]]:
        """``(lsn, run, event)`` of every run after ``lsn`` in LSN order, at most ``limit``: a follower of the log
        reads on from the last LSN it saw (LSNs grow in commit order; they need not be contiguous)."""
        ...

    def logged_runs(self) -> list[str]:
        """Every run the log names, sorted (whatever the projection says)."""
        ...

    def event_kind(self, lsn: int) -> str | None:
        """The kind of the event at ``lsn`` (None: no such event)."""
        ...

    def event_range(self, run_id: str) -> tuple[int, int]:
        """The first and last LSN of ``run_id``'s events; StoreError when the log has none."""
        ...

    def missing_log_triggers(self) -> list[str]:
        """The append-only guards the log lacks (none on an intact store)."""
        ...


class BlobStore(Protocol):
    """Bodies under their content-addressed refs (its rows: the blobs). A body is never rewritten under its ref;
    a deleted body keeps its row, and the log says why it is gone."""

    #: Reader for bodies that are not local (e.g. the cold store); set by tiering.
    fallback: FallbackReader | None

    def put(self, body: bytes, expected_ref: str | None = None, *, label: str = "put_blob") -> str:
        """Store ``body`` under its sha256 ref (idempotent) and return the ref; IntegrityError when it does not hash
        to ``expected_ref``."""
        ...

    def put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Store bodies whose refs the caller computed from these very bytes; returns the bytes really stored."""
        ...

    def get(self, ref: str) -> bytes | None:
        """The local body of ``ref``, or None when it is not (or no longer) here."""
        ...

    def text(self, ref: str) -> str | None:
        """The body of ``ref`` as text: local, else through :attr:`fallback`, else None."""
        ...

    def has_body(self, ref: str) -> bool:
        """True when the body of ``ref`` is here."""
        ...

    def known(self, ref: str) -> bool:
        """True when the ref has a row (its body may be gone)."""
        ...

    def stat(self, ref: str) -> tuple[int, bool] | None:
        """``(size, body present)`` of ``ref``, None when the store never held it."""
        ...

    def iter_bodies(self) -> Iterator[tuple[str, bytes]]:
        """Every (ref, body) still present, streamed in ref order."""
        ...

    def put_absent(self, rows: Iterable[tuple[str, int]]) -> int:
        """Record refs whose bodies are not here, each with its size (a copied store's reduced, dropped and tiered
        bodies: the rows a blob store keeps once a body goes); a ref with a row already is left as it is. Joins the
        caller's transaction (or opens one); returns the rows written."""
        ...

    def release(self, refs: Iterable[str], *, label: str = "delete_body", scrub: bool = True,
                durable: bool = True) -> list[str]:
        """Delete the local bodies of ``refs`` that no run still reads locally; returns those deleted. Only after
        the event explaining the loss has committed."""
        ...


class RunQueries(Protocol):
    """Each run's folded state and what follows from it, read by name (its rows: the projection). Nothing here
    decodes a body."""

    def run(self, run_id: str) -> RunState:
        """The folded state of ``run_id``; StoreError when there is no such run."""
        ...

    def has_run(self, run_id: str) -> bool:
        ...

    def run_ids(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None) -> list[str]:
        """Run ids, sorted, filtered by the columns given."""
        ...

    def iter_runs(self, tenant: str | None = None, **filters: str | None) -> Iterator[RunState]:
        """Folded states one at a time; ``filters`` as :meth:`run_ids`."""
        ...

    def listing(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None, counter: str | None = None) -> list[RunListing]:
        """What a listing shows of each run (with each run's tokens under ``counter`` when named)."""
        ...

    def state_digests(self, run_ids: Iterable[str]) -> dict[str, str]:
        """sha256 of each run's folded state as stored, by id (runs the store lacks are absent)."""
        ...

    def projected_bytes(self, run_id: str) -> bytes | None:
        """The projection's canonical bytes for ``run_id``."""
        ...

    def refold(self, run_id: str) -> RunState:
        """Fold one run from LSN 0 straight from the log (ignoring the projection)."""
        ...

    def run_ids_with_tier_status(self, status: str) -> list[str]:
        """Run ids whose state has ``tier.status == status``, sorted."""
        ...

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there."""
        ...

    def explain(self, ref: str) -> Explanation:
        """Whether ``ref``'s body is here, and if not, which event of which run says where it went."""
        ...

    def local_body_bytes(self, run_id: str) -> int:
        """Bytes of the bodies of ``run_id`` the log says are local (what a move would upload)."""
        ...

    def tiered_bodies_here(self, run_id: str) -> list[str]:
        """Refs the log of ``run_id`` says are tiered whose bodies are still here (a move to finish)."""
        ...

    def runs_with_tiered_bodies_here(self) -> list[str]:
        """Runs holding a body here that their log says is tiered, sorted."""
        ...

    def unnamed_bodies(self) -> int:
        """Stored bodies no run names (e.g. summaries put before a crash)."""
        ...


class TokenCounts(Protocol):
    """The token-count cache (its rows: one count per body and counter, never recounted)."""

    def cached_counts(self, refs: Iterable[str], counter: str) -> dict[str, int]:
        """Stored counts of ``refs`` under ``counter`` (refs never counted are absent)."""
        ...

    def put_counts(self, counter: str, counts: Mapping[str, int], *, label: str = "put_counts") -> None:
        """Record counts (first write wins) and the run totals they complete."""
        ...

    def iter_counts(self) -> Iterator[tuple[str, str, int]]:
        """Every stored count as ``(ref, counter, tokens)``, streamed in (ref, counter) order."""
        ...


class Judgments(Protocol):
    """The judge's cache (its rows: payloads by key; a cache, not history)."""

    def get_judgment(self, key: str) -> dict[str, Any] | None:
        ...

    def get_judgments(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The cached payloads of ``keys`` that are cached, by key."""
        ...

    def put_judgment(self, key: str, payload: dict[str, Any]) -> None:
        """Cache ``payload`` under ``key`` (replacing an older one)."""
        ...

    def iter_judgments(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every cached ``(key, payload)`` (verdicts, orders, pointwise scores, run facts), streamed in key
        order."""
        ...


@dataclass(frozen=True)
class JobView:
    """What one job holds now, as one worker sees it: its units, those done (``done_here`` by this worker), those
    claimed under a live lease (``claimed_here`` by this worker), those free, and the workers holding claims."""

    units: int
    done: int
    done_here: int
    claimed: int
    claimed_here: int
    free: int
    workers: int

    def to_dict(self) -> dict[str, int]:
        return {"units": self.units, "done": self.done, "done_here": self.done_here, "claimed": self.claimed,
                "claimed_here": self.claimed_here, "free": self.free, "workers": self.workers}


class WorkClaims(Protocol):
    """Claims on units of work, so several processes share one job (its rows: one per unit, keyed by the key of
    the unit's result). A worker claims a unit before sending its calls, under a lease it renews; another worker
    skips what is claimed and live, takes what is free or expired, and never what is done."""

    def available(self) -> bool:
        """True when the store can hold claims (a schema with the claims table)."""
        ...

    def claim(self, units: Sequence[str], kind: str, worker: str, lease_seconds: float, *, limit: int = 1,
              skip: Iterable[str] = ()) -> list[str]:
        """Take up to ``limit`` free units of ``units`` in their order (none of ``skip``); returns those taken."""
        ...

    def renew(self, worker: str, lease_seconds: float) -> int:
        """Extend every live claim of ``worker``; returns how many. Safe from another thread (a lease keeper's)."""
        ...

    def close_renewer(self) -> None:
        """Let go of what :meth:`renew` holds for the calling thread (its connection), when that thread stops."""
        ...

    def finish(self, unit: str, worker: str, cost: Mapping[str, Any] | None, *, done: bool) -> bool:
        """Release ``unit`` in the caller's transaction (the one writing its result): done, or free again after a
        failure; ``cost`` kept with it. False when the claim was no longer ``worker``'s."""
        ...

    def release(self, units: Iterable[str], worker: str) -> int:
        """Give back ``worker``'s unfinished claims on ``units``; returns how many."""
        ...

    def view(self, units: Sequence[str], worker: str) -> JobView:
        """What the job of ``units`` holds now, as ``worker`` sees it."""
        ...

    def finished(self, units: Iterable[str]) -> set[str]:
        """Of ``units``, those some worker finished (their results are stored)."""
        ...

    def holders(self, units: Iterable[str]) -> set[str]:
        """The workers holding unfinished claims on ``units`` (their leases live or not)."""
        ...

    def expire(self, worker: str) -> int:
        """End every unfinished claim of ``worker`` now (a worker known dead); returns how many."""
        ...

    def costs(self, units: Sequence[str]) -> list[dict[str, Any]]:
        """What each try of each unit cost, as recorded with it."""
        ...
