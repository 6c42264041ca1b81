"""Folded run state and the fold itself.

``fold`` is a pure function of the log: it reads refs, never bodies, and never the clock. The store keeps
its result in projection tables only as a cache; dropping them and folding again from LSN 0 yields
byte-identical :meth:`RunState.canonical_bytes`. Where a body went (reduced, dropped, tiered) is recorded
*only* by events, so the fold alone explains every missing body.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvjudge.retention import events as ev
from kvjudge.retention.events import canonical_json
from kvjudge.retention.lifecycle import RUNNING, is_reducible

LOCAL, REDUCED, DROPPED, TIERED = "local", "reduced", "dropped", "tiered"


@dataclass(frozen=True)
class Transition:
    """One step of a branch; text lives in blobs named by ref."""

    seq: int
    role: str
    text_ref: str | None = None
    tool_call: dict[str, Any] | None = None  # {"name", "arguments_ref"}
    tool_output: dict[str, Any] | None = None  # {"name", "output_ref", "exit_code"}
    usage: dict[str, Any] | None = None
    context: dict[str, Any] | None = None

    def refs(self) -> list[str]:
        """The blob refs this transition names, in reading order."""
        found = [self.text_ref]
        if self.tool_call:
            found.append(self.tool_call.get("arguments_ref"))
        if self.tool_output:
            found.append(self.tool_output.get("output_ref"))
        return [ref for ref in found if ref]


@dataclass(frozen=True)
class Branch:
    """A line of attempts; a dead branch is one the run abandoned."""

    id: str
    status: str  # "live" | "dead"
    parent: str | None
    fork_at: int | None
    transitions: tuple[Transition, ...] = ()
    summary_ref: str | None = None  # the extract a dead branch is read as (BranchReduced)

    def refs(self) -> list[str]:
        return [ref for transition in self.transitions for ref in transition.refs()]


@dataclass(frozen=True)
class BodyLocation:
    """Where the body of ``ref`` is, as the log says, and the LSN of the event that says so."""

    ref: str
    status: str  # local | reduced | dropped | tiered
    summary_ref: str | None
    lsn: int
    target: str | None = None
    manifest_ref: str | None = None


@dataclass(frozen=True)
class RunState:
    """The folded projection of one run."""

    id: str
    tenant: str
    task_id: str | None
    task_prompt_ref: str | None
    state: str
    lifecycle: tuple[str, ...]
    branches: tuple[Branch, ...]
    verifier: tuple[dict[str, Any], ...]
    grades: tuple[dict[str, Any], ...]
    bodies: Mapping[str, BodyLocation]
    reduced: bool = False
    # {"status": started|tiered|rehydrated, "target", "manifest_ref", "lsn"} (+ "endpoint", "unreduced" when set)
    tier: dict[str, Any] | None = None
    # One entry per TextRepaired event: {"lsn", "paths", "refs", "code_units"}.
    text_repairs: tuple[dict[str, Any], ...] = ()
    agent: str | None = None  # the model or harness that produced the run (RunStarted.agent)
    metadata: dict[str, Any] | None = None  # scalar facts the harness recorded: exit_status, cost, api_calls, …
    trial: str | None = None  # which of several runs of one agent on one task (RunStarted.trial)

    @property
    def is_reducible(self) -> bool:
        return is_reducible(self.state)

    def refs(self) -> list[str]:
        """Every ref the run names (transitions, task prompt, summaries), sorted."""
        return sorted(self.bodies)

    def branch(self, branch_id: str) -> Branch:
        for branch in self.branches:
            if branch.id == branch_id:
                return branch
        raise KeyError(branch_id)

    def to_dict(self) -> dict[str, Any]:
        # What dataclasses.asdict gives, built without its deep copies (this runs for every write of a run).
        data = dict(vars(self))
        data["lifecycle"] = list(self.lifecycle)
        data["branches"] = [{**vars(branch), "transitions": [dict(vars(t)) for t in branch.transitions]}
                            for branch in self.branches]
        data["verifier"] = list(self.verifier)
        data["grades"] = list(self.grades)
        data["bodies"] = {ref: dict(vars(loc)) for ref, loc in sorted(self.bodies.items())}
        for name, default in _ADDED_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    def canonical_bytes(self) -> bytes:
        """One byte form per state: canonical JSON of every field."""
        return canonical_json(self.to_dict()).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> RunState:
        """Inverse of :meth:`canonical_bytes`."""
        data = json.loads(raw)
        return cls(
            id=data["id"], tenant=data["tenant"], task_id=data["task_id"], task_prompt_ref=data["task_prompt_ref"],
            state=data["state"], lifecycle=tuple(data["lifecycle"]),
            branches=tuple(
                Branch(id=b["id"], status=b["status"], parent=b["parent"], fork_at=b["fork_at"],
                       transitions=tuple(Transition(**t) for t in b["transitions"]), summary_ref=b["summary_ref"])
                for b in data["branches"]),
            verifier=tuple(data["verifier"]), grades=tuple(data["grades"]),
            bodies={ref: BodyLocation(**loc) for ref, loc in data["bodies"].items()},
            reduced=data["reduced"], tier=data["tier"],
            text_repairs=tuple(data.get("text_repairs", _ADDED_FIELDS["text_repairs"])),
            agent=data.get("agent"), metadata=data.get("metadata"), trial=data.get("trial"),
        )


def resolve(state: RunState, ref: str) -> str | None:
    """The ref a reader sees for ``ref``: itself, its summary (following chains), or None when dropped."""
    seen = set()
    current: str | None = ref
    while current is not None:
        location = state.bodies.get(current)
        if location is None or location.status not in (REDUCED, DROPPED):
            return current
        if location.status == DROPPED or current in seen:
            return None
        seen.add(current)
        current = location.summary_ref
    return None


def branch_view(state: RunState, branch_index: int) -> list[str]:
    """Refs a reader sees for one branch (with repeats), in reading order."""
    branch = state.branches[branch_index]
    if branch.status == "dead" and branch.summary_ref is not None:
        seen = resolve(state, branch.summary_ref)
        return [seen] if seen else []
    return [seen for ref in branch.refs() if (seen := resolve(state, ref)) is not None]


def view_refs(state: RunState) -> list[str]:
    """Every ref a reader of the run sees (task prompt, then each branch), with repeats."""
    refs: list[str] = []
    if state.task_prompt_ref:
        seen = resolve(state, state.task_prompt_ref)
        if seen:
            refs.append(seen)
    for index in range(len(state.branches)):
        refs.extend(branch_view(state, index))
    return refs


def agent_of(state: RunState) -> str:
    """The agent a run belongs to: its ``agent`` field, else the run-id prefix before ``/``, else the tenant."""
    if state.agent:
        return str(state.agent)
    if "/" in state.id:
        return state.id.split("/", 1)[0]
    return str(state.tenant)


def best_grade(run: Any) -> dict[str, Any] | None:
    """The run's held-out grade with the best score — the one it is scored by (None when it has none); ``run`` is
    a :class:`RunState` or anything else with its ``grades`` (a listing's row)."""
    scored = [g for g in run.grades if isinstance(g.get("score"), (int, float))]
    return max(scored, key=lambda g: float(g["score"])) if scored else None


# Fields added to RunState after schema version 1, with their defaults. A field at its default is left out
# of the canonical bytes, so a state folded by an older kvjudge (projections, manifests) keeps its bytes.
_ADDED_FIELDS: dict[str, Any] = {"text_repairs": (), "agent": None, "metadata": None, "trial": None}


@dataclass
class RunFolder:
    """Mutable working copy of one run during a fold (frozen into a RunState at the end)."""


    id: str
    tenant: str = ""
    task_id: str | None = None
    task_prompt_ref: str | None = None
    state: str = RUNNING
    lifecycle: list[str] = field(default_factory=list)
    branches: dict[str, dict[str, Any]] = field(default_factory=dict)
    verifier: list[dict[str, Any]] = field(default_factory=list)
    grades: list[dict[str, Any]] = field(default_factory=list)
    bodies: dict[str, BodyLocation] = field(default_factory=dict)
    reduced: bool = False
    tier: dict[str, Any] | None = None
    text_repairs: list[dict[str, Any]] = field(default_factory=list)
    agent: str | None = None
    metadata: dict[str, Any] | None = None
    trial: str | None = None

    @classmethod
    def thaw(cls, state: RunState) -> RunFolder:
        return cls(
            id=state.id, tenant=state.tenant, task_id=state.task_id, task_prompt_ref=state.task_prompt_ref,
            state=state.state, lifecycle=list(state.lifecycle),
            branches={b.id: {"branch": b, "transitions": list(b.transitions)} for b in state.branches},
            verifier=list(state.verifier), grades=list(state.grades), bodies=dict(state.bodies),
            reduced=state.reduced, tier=dict(state.tier) if state.tier else None,
            text_repairs=list(state.text_repairs), agent=state.agent,
            metadata=dict(state.metadata) if state.metadata is not None else None, trial=state.trial,
        )

    def freeze(self) -> RunState:
        branches = tuple(
            dataclasses.replace(entry["branch"], transitions=tuple(entry["transitions"]))
            for entry in self.branches.values()
        )
        return RunState(
            id=self.id, tenant=self.tenant, task_id=self.task_id, task_prompt_ref=self.task_prompt_ref,
            state=self.state, lifecycle=tuple(self.lifecycle), branches=branches, verifier=tuple(self.verifier),
            grades=tuple(self.grades), bodies=dict(sorted(self.bodies.items())), reduced=self.reduced,
            tier=self.tier, text_repairs=tuple(self.text_repairs), agent=self.agent, metadata=self.metadata,
            trial=self.trial,
        )

    def _name(self, ref: str | None, lsn: int) -> None:
        # A ref named again keeps whatever the log already says about it.
        if ref and ref not in self.bodies:
            self.bodies[ref] = BodyLocation(ref=ref, status=LOCAL, summary_ref=None, lsn=lsn)

    def apply(self, lsn: int, event: ev.Event) -> None:
        if isinstance(event, ev.TransitionRecorded):  # first: most of a run's events
            transition = Transition(seq=event.seq, role=event.role, text_ref=event.text_ref,
                                    tool_call=event.tool_call, tool_output=event.tool_output,
                                    usage=event.usage, context=event.context)
            self.branches[event.branch]["transitions"].append(transition)
            for ref in transition.refs():
                self._name(ref, lsn)
        elif isinstance(event, ev.RunStarted):
            self.tenant, self.task_id, self.task_prompt_ref = event.tenant, event.task_id, event.task_prompt_ref
            self.agent, self.metadata, self.trial = event.agent, event.metadata, event.trial
            self.state = RUNNING
            self.lifecycle = [RUNNING]
            self._name(event.task_prompt_ref, lsn)
        elif isinstance(event, ev.BranchOpened):
            branch = Branch(id=event.branch, status=event.status, parent=event.parent, fork_at=event.fork_at)
            self.branches[event.branch] = {"branch": branch, "transitions": []}
        elif isinstance(event, ev.VerifierRecorded):
            self.verifier.append(event.result)
        elif isinstance(event, ev.GradeRecorded):
            for replaced in event.replaces or ():
                if replaced in self.grades:
                    self.grades.remove(replaced)
            self.grades.append(event.grade)
        elif isinstance(event, ev.StateChanged):
            self.state = event.state
            self.lifecycle.append(event.state)
        elif isinstance(event, ev.Reduced):
            self.bodies[event.original] = BodyLocation(ref=event.original, status=REDUCED,
                                                       summary_ref=event.summary, lsn=lsn)
            self._name(event.summary, lsn)
            self.reduced = True
        elif isinstance(event, ev.BranchReduced):
            entry = self.branches[event.branch]
            entry["branch"] = dataclasses.replace(entry["branch"], summary_ref=event.summary)
            self._name(event.summary, lsn)
            self.reduced = True
        elif isinstance(event, ev.Dropped):
            self.bodies[event.original] = BodyLocation(ref=event.original, status=DROPPED, summary_ref=None, lsn=lsn)
            self.reduced = True
        elif isinstance(event, ev.TierStarted):
            self.tier = _tier_entry("started", event.target, event.manifest_ref, lsn, endpoint=event.endpoint,
                                    unreduced=event.unreduced)
        elif isinstance(event, ev.Tiered):
            started = self.tier if self.tier and self.tier["manifest_ref"] == event.manifest_ref else {}
            self.tier = _tier_entry("tiered", event.target, event.manifest_ref, lsn, endpoint=event.endpoint,
                                    unreduced=started.get("unreduced"))
            for ref in event.refs:
                current = self.bodies.get(ref)
                # Only a body that is here can move; reduced/dropped refs have none.
                if current is not None and current.status == LOCAL:
                    self.bodies[ref] = BodyLocation(ref=ref, status=TIERED, summary_ref=None, lsn=lsn,
                                                    target=event.target, manifest_ref=event.manifest_ref)
        elif isinstance(event, ev.Rehydrated):
            if self.tier is not None:
                self.tier = {**self.tier, "status": "rehydrated", "lsn": lsn}
            for ref in event.refs:
                current = self.bodies.get(ref)
                if current is not None and current.status == TIERED:
                    self.bodies[ref] = BodyLocation(ref=ref, status=LOCAL, summary_ref=None, lsn=lsn)
        elif isinstance(event, ev.TextRepaired):
            self.text_repairs.append({"lsn": lsn, "paths": list(event.paths), "refs": list(event.refs),
                                      "code_units": event.code_units})
        else:  # pragma: no cover - EVENT_TYPES and this function are kept in step by test_fold_handles_every_kind
            raise TypeError(f"fold has no rule for {type(event).__name__}")


def _tier_entry(status: str, target: str, manifest_ref: str, lsn: int, *, endpoint: str | None,
                unreduced: dict[str, Any] | None) -> dict[str, Any]:
    """``RunState.tier``. ``endpoint`` and ``unreduced`` appear only when set, so a log written before they
    existed folds to the same bytes as it did then."""
    entry: dict[str, Any] = {"status": status, "target": target, "manifest_ref": manifest_ref, "lsn": lsn}
    if endpoint is not None:
        entry["endpoint"] = endpoint
    if unreduced is not None:
        entry["unreduced"] = unreduced
    return entry


def fold(events: Iterable[tuple[int, ev.Event]]) -> dict[str, RunState]:
    """Fold ``(lsn, event)`` pairs (in LSN order) into one RunState per run id. Pure."""
    builders: dict[str, RunFolder] = {}
    for lsn, event in events:
        builder = builders.get(event.run)
        if builder is None:
            builder = builders[event.run] = RunFolder(id=event.run)
        builder.apply(lsn, event)
    return {run_id: builder.freeze() for run_id, builder in builders.items()}


def fold_onto(state: RunState | None, run_id: str, events: Iterable[tuple[int, ev.Event]]) -> RunState:
    """Fold more events of one run onto an already folded state (None: start empty)."""
    builder = RunFolder.thaw(state) if state is not None else RunFolder(id=run_id)
    for lsn, event in events:
        if event.run != run_id:
            raise ValueError(f"event for run {event.run!r} folded onto run {run_id!r}")
        builder.apply(lsn, event)
    return builder.freeze()
