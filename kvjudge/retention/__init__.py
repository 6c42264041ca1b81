"""Retention: the append-only run store, content-addressed blobs, the pure fold, and reduction.

Public API (ARCHITECTURE.md says which layers use it)::

    from kvjudge.retention import Store, fold, RunState, verify, VerifyReport   # the store, a run's state, checks
    from kvjudge.retention import plan_reduction, apply_plan, reduce_run      # one run: plan (pure), then apply
    from kvjudge.retention.reduce_runs import reduce_runs, RunsReduction   # `kvjudge reduce`: a selection of runs
    from kvjudge.retention import ingest_paths, IngestReport          # getting runs in: ingest_paths(store, paths)
    from kvjudge.retention import attach_grades, GradeReport          # grades that arrive after the import
    from kvjudge.retention import find_evidence, measure, run_tokens  # a run's decisive evidence; its tokens
    from kvjudge.retention import open_cold_store, tier_run, rehydrate_run   # tiering (kvjudge.retention.tiering)

Everything else (the event types, the lifecycle's states, extracts, fault points, the tiering's parts) is
imported from the module that defines it: :mod:`.events`, :mod:`.lifecycle`, :mod:`.extract`, :mod:`.faults`,
:mod:`.tiering`, :mod:`.store`, … A module's name is never also a name here: ``reduce_runs`` is the module
:mod:`kvjudge.retention.reduce_runs` (its function of that name is also ``kvjudge.reduce_runs``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from kvjudge.retention.state import RunState, fold
from kvjudge.retention.store import Store
from kvjudge.retention.verify import VerifyReport, verify

# The modules below load on first use of one of their names (``from kvjudge.retention import tier_run``, or
# ``import kvjudge.retention.tiering``), so that importing the store, the log or ingest loads no more than those
# (tiering alone brings the HTTP and S3 clients; ingest, every harness's parser): ``kvjudge ingest`` starts without
# tiering, and a command that only reads the store (a listing, eval, rank) without ingest. Each name is its module's.
_LOADED_ON_USE = {
    "kvjudge.retention.cold": ("ColdStore", "open_cold_store"),
    "kvjudge.retention.evidence": ("Evidence", "find_evidence", "measure"),
    "kvjudge.retention.ingest": ("IngestReport", "ingest_paths"),
    "kvjudge.retention.late_grades": ("GradeReport", "attach_grades"),
    "kvjudge.retention.reduce": ("ReductionPlan", "plan_reduction"),
    "kvjudge.retention.reduce_apply": ("ReductionResult", "RunInColdStorage", "apply_plan", "reduce_run"),
    "kvjudge.retention.stored_tokens": ("run_tokens",),
    "kvjudge.retention.tiering": ("RehydrateResult", "TierResult", "rehydrate_run", "tier_run", "tier_runs"),
}
_MODULE_OF = {name: module for module, names in _LOADED_ON_USE.items() for name in names}

if TYPE_CHECKING:
    from kvjudge.retention.cold import ColdStore, open_cold_store
    from kvjudge.retention.evidence import Evidence, find_evidence, measure
    from kvjudge.retention.ingest import IngestReport, ingest_paths
    from kvjudge.retention.late_grades import GradeReport, attach_grades
    from kvjudge.retention.reduce import ReductionPlan, plan_reduction
    from kvjudge.retention.reduce_apply import ReductionResult, RunInColdStorage, apply_plan, reduce_run
    from kvjudge.retention.stored_tokens import run_tokens
    from kvjudge.retention.tiering import RehydrateResult, TierResult, rehydrate_run, tier_run, tier_runs


def __getattr__(name: str) -> Any:
    """A name of :data:`_LOADED_ON_USE`, its module imported now (and the name kept here after)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "RunState", "Store", "VerifyReport", "fold", "verify",
    "ColdStore", "Evidence", "GradeReport", "IngestReport", "ReductionPlan", "ReductionResult", "RehydrateResult",
    "RunInColdStorage", "TierResult", "apply_plan", "attach_grades", "find_evidence",
    "ingest_paths", "measure", "open_cold_store", "plan_reduction", "reduce_run", "rehydrate_run",
    "run_tokens", "tier_run", "tier_runs",
]
