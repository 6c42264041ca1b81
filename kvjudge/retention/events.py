"""The events of a run's log, and their canonical JSON form.

An event is a frozen dataclass with a class-level ``kind``. Stored, it is one row of the append-only
``events`` table: ``(lsn, run, kind, payload)`` where ``payload`` is :func:`canonical_json` of the
event's fields. Events carry blob *refs* (``sha256:<hex>``), never bodies, so the fold never reads text.

Kinds, in the order a run meets them:

- ``RunStarted``, ``BranchOpened``, ``TransitionRecorded``, ``VerifierRecorded``, ``GradeRecorded`` —
  the history of the run as ingested;
- ``StateChanged`` — a lifecycle step (running → grading → graded | ungraded → archived; ungraded → graded
  directly after a grade attached later, ``kvjudge grade``);
- ``Reduced`` / ``BranchReduced`` / ``Dropped`` — later facts about earlier records, written by reduction;
- ``TierStarted`` / ``Tiered`` / ``Rehydrated`` — the move of bodies to cold storage and back;
- ``TextRepaired`` — ingest stored U+FFFD in place of text that was not Unicode (``--repair-text``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, ClassVar

from kvjudge.errors import StoreError


# What json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) builds on
# every call, built once; the encoder keeps no state between calls. Without the check for circular references
# (JSON values from documents and events have none; one made in code would end in RecursionError rather than
# ValueError): it keeps a dict of every container met, a third of the cost of encoding an event.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                              check_circular=False)
# The C encoder JSONEncoder.encode makes on every call, made once (another third): the same function, the same
# arguments, so the same bytes. Python without the json accelerator has none; then JSONEncoder.encode.
_C_ENCODE = None if c_make_encoder is None else c_make_encoder(
    None, _CANONICAL.default, encode_basestring, None, ":", ",", True, False, False)


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept as is: one byte form per value."""
    if _C_ENCODE is None:
        return _CANONICAL.encode(value)
    return "".join(_C_ENCODE(value, 0))


@dataclass(frozen=True)
class Event:
    """Base of every event: ``run`` is the run id the event belongs to."""

    kind: ClassVar[str] = "Event"
    #: Fields added after the kind was first written: left out of the payload while None, so that logs written
    #: before them keep their exact bytes.
    optional: ClassVar[tuple[str, ...]] = ()
    run: str

    def payload(self) -> dict[str, Any]:
        """The event's fields as plain JSON values (a new dict; the values are the event's own, not copies)."""
        # Read from the instance's __dict__ (its fields, set in order by __init__, and the cached JSON below):
        # a getattr per field costs as much again.
        optional = self.optional
        return {name: value for name, value in self.__dict__.items()
                if name != _CACHED_JSON and (value is not None or name not in optional)}

    def to_json(self) -> str:
        """The canonical JSON stored in the log (its ``kind`` lives in its own column)."""
        # Computed once per event (an import hashes it and writes it); events are frozen, so it cannot go stale.
        # Kept in the instance's __dict__ by hand: functools.cached_property takes a lock on every first read.
        cached = self.__dict__.get(_CACHED_JSON)
        if cached is None:
            cached = self.__dict__[_CACHED_JSON] = canonical_json(self.payload())
        return cached


_CACHED_JSON = "_canonical"  # where Event.to_json keeps an event's JSON (a name no field has)


@dataclass(frozen=True)
class RunStarted(Event):
    """A run begins. ``agent`` (the model or harness that produced it), ``metadata`` (scalar facts the harness
    recorded: exit status, cost, API calls, …), ``content_hash`` (the hash of the run as imported, see
    :func:`content_hash`) and ``trial`` (which of several runs of one agent on one task this is: a Harbor trial,
    an inspect epoch, a repeated SWE-bench run) came later: they are optional, and left out of the payload when unset so that logs
    written before them keep their exact bytes."""

    kind: ClassVar[str] = "RunStarted"
    optional: ClassVar[tuple[str, ...]] = ("agent", "metadata", "content_hash", "trial")
    tenant: str
    task_id: str | None
    task_prompt_ref: str | None
    agent: str | None = None
    metadata: dict[str, Any] | None = None
    content_hash: str | None = None
    trial: str | None = None


@dataclass(frozen=True)
class BranchOpened(Event):
    kind: ClassVar[str] = "BranchOpened"
    branch: str
    status: str  # "live" | "dead"
    parent: str | None
    fork_at: int | None


@dataclass(frozen=True)
class TransitionRecorded(Event):
    """One step of a branch. ``tool_call`` = {name, arguments_ref}; ``tool_output`` = {name, output_ref, exit_code}."""

    kind: ClassVar[str] = "TransitionRecorded"
    branch: str
    seq: int
    role: str
    text_ref: str | None
    tool_call: dict[str, Any] | None
    tool_output: dict[str, Any] | None
    usage: dict[str, Any] | None
    context: dict[str, Any] | None


@dataclass(frozen=True)
class VerifierRecorded(Event):
    kind: ClassVar[str] = "VerifierRecorded"
    result: dict[str, Any]


@dataclass(frozen=True)
class GradeRecorded(Event):
    """A held-out grade. ``replaces`` (optional, left out of the payload when unset): the grades this one stands in
    for (``kvjudge grade --replace``); they stay in the log, the fold drops them from the run's grades."""

    kind: ClassVar[str] = "GradeRecorded"
    optional: ClassVar[tuple[str, ...]] = ("replaces",)
    grade: dict[str, Any]
    replaces: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StateChanged(Event):
    kind: ClassVar[str] = "StateChanged"
    state: str


@dataclass(frozen=True)
class Reduced(Event):
    """``original``'s body is replaced, for every reader, by the summary blob ``summary``."""

    kind: ClassVar[str] = "Reduced"
    original: str
    summary: str
    counter: str
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True)
class BranchReduced(Event):
    """A dead branch's text is read as the one summary blob ``summary`` (its transitions stay)."""

    kind: ClassVar[str] = "BranchReduced"
    branch: str
    summary: str
    counter: str
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True)
class Dropped(Event):
    """``original``'s body is gone with nothing in its place (raw text on a dead branch)."""

    kind: ClassVar[str] = "Dropped"
    original: str


@dataclass(frozen=True)
class TierStarted(Event):
    """A move of the run's local bodies to ``target`` began; ``manifest_ref`` names what it carries.

    ``endpoint`` is the S3 endpoint the move writes to (None: a ``file://`` target, or a log written before
    kvjudge recorded endpoints). ``unreduced`` is set when the run was moved although it was not known to be
    within its token ceiling (``kvjudge tier --unreduced``): ``{"tokens", "ceiling", "counter"}``, ``ceiling``
    None when no probe figure was known.
    """

    kind: ClassVar[str] = "TierStarted"
    optional: ClassVar[tuple[str, ...]] = ("endpoint", "unreduced")
    target: str
    manifest_ref: str
    endpoint: str | None = None
    unreduced: dict[str, Any] | None = None


@dataclass(frozen=True)
class Tiered(Event):
    """The bodies of ``refs`` live at ``target`` (at ``endpoint`` for S3; remote commit acknowledged); local
    copies may go."""

    kind: ClassVar[str] = "Tiered"
    optional: ClassVar[tuple[str, ...]] = ("endpoint",)
    target: str
    manifest_ref: str
    refs: list[str]
    endpoint: str | None = None


@dataclass(frozen=True)
class Rehydrated(Event):
    """The bodies of ``refs`` are local again."""

    kind: ClassVar[str] = "Rehydrated"
    refs: list[str]


@dataclass(frozen=True)
class TextRepaired(Event):
    """Ingest replaced ``code_units`` bad code units (lone surrogates, bytes not UTF-8) with U+FFFD.

    ``paths`` are the JSON paths of the repaired strings in the source document; ``refs`` the bodies
    that hold repaired text.
    """

    kind: ClassVar[str] = "TextRepaired"
    paths: list[str]
    refs: list[str]
    code_units: int


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (RunStarted, BranchOpened, TransitionRecorded, VerifierRecorded, GradeRecorded, StateChanged,
                Reduced, BranchReduced, Dropped, TierStarted, Tiered, Rehydrated, TextRepaired)
}

#: Kinds that reduction appends; everything else in a run's log must be untouched by it.
REDUCTION_KINDS = frozenset({"Reduced", "BranchReduced", "Dropped"})


class ContentHasher:
    """The hash of a run as imported: sha256 over each event's kind and canonical payload, in order.

    ``RunStarted.content_hash`` itself is left out, so the hash can be recorded in the run's first event.
    Events carry refs to bodies, never the bodies, so the hash covers every body through its ref.
    Fed in parts (``update``), and ``copy`` lets one prefix be finished in more than one way.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, events: Iterable[Event]) -> ContentHasher:
        lines = []
        for event in events:
            if isinstance(event, RunStarted):
                data = event.payload()
                data.pop("content_hash", None)
                text = canonical_json(data)
            else:
                text = event.to_json()
            lines.append(f"{event.kind} {text}\n")
        self._digest.update("".join(lines).encode("utf-8"))  # one update: the same bytes in the same order
        return self

    def copy(self) -> ContentHasher:
        other = ContentHasher()
        other._digest = self._digest.copy()
        return other

    def hexdigest(self) -> str:
        return "sha256:" + self._digest.hexdigest()


def content_hash(events: Iterable[Event]) -> str:
    """:class:`ContentHasher` over ``events``."""
    return ContentHasher().update(events).hexdigest()


def event_from(kind: str, payload: str | dict[str, Any]) -> Event:
    """Rebuild an event from its stored ``kind`` and JSON payload."""
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise StoreError(f"the log holds an event of unknown kind {kind!r}; upgrade kvjudge to read this store")
    data = json.loads(payload) if isinstance(payload, str) else payload
    try:
        return cls(**data)
    except TypeError as exc:
        raise StoreError(f"a {kind} event in the log has unexpected fields ({exc}); the store is damaged") from exc
