"""Retention: the append-only run store, content-addressed blobs, the pure fold, and reduction.

Public API (ARCHITECTURE.md says which layers use it)::

    from kvjudge.retention import Store, fold, RunState, plan_reduction, apply_plan, verify
    from kvjudge.retention import reduce_runs, RunsReduction             # `kvjudge reduce`: a selection of runs
    from kvjudge.retention import ingest_paths, IngestReport          # getting runs in: ingest_paths(store, paths)
    from kvjudge.retention import attach_grades, GradeReport          # grades that arrive after the import
    from kvjudge.retention import find_evidence, measure              # a run's decisive evidence, and a view's share
    from kvjudge.retention import open_cold_store, tier_run, rehydrate_run   # tiering (kvjudge.retention.tiering)
"""

import importlib
from typing import TYPE_CHECKING, Any

from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import (
    EVENT_TYPES,
    BranchOpened,
    BranchReduced,
    Dropped,
    Event,
    GradeRecorded,
    Reduced,
    Rehydrated,
    RunStarted,
    StateChanged,
    TextRepaired,
    TierStarted,
    Tiered,
    TransitionRecorded,
    VerifierRecorded,
    canonical_json,
)
from kvjudge.retention.faults import fault_point
from kvjudge.retention.lifecycle import STATES, is_reducible
from kvjudge.retention.state import BodyLocation, Branch, RunState, Transition, fold, fold_onto
from kvjudge.retention.store import BlobStore, Explanation, RunListing, Store
from kvjudge.retention.text_check import TextError, parse_checked
from kvjudge.retention.verify import Violation, VerifyReport, verify

# The modules below load on first use of one of their names (``from kvjudge.retention import tier_run``, or
# ``import kvjudge.retention.tiering``), so that importing the store, the log or ingest loads no more than those
# (tiering alone brings the HTTP and S3 clients; ingest, every harness's parser): ``kvjudge ingest`` starts without
# tiering, and a command that only reads the store (a listing, eval, rank) without ingest. Each name is its module's.
_LOADED_ON_USE = {
    "kvjudge.retention.cold": ("ColdStore", "LocalDirColdStore", "S3ColdStore", "open_cold_store"),
    "kvjudge.retention.evidence": ("Evidence", "Visibility", "find_evidence", "measure"),
    "kvjudge.retention.extract": ("diff_extract", "head_tail_extract"),
    "kvjudge.retention.ingest": ("IngestReport", "ingest_paths"),
    "kvjudge.retention.late_grades": ("GradeReport", "attach_grades"),
    "kvjudge.retention.reduce": ("ReductionPlan", "plan_reduction", "view_refs"),
    "kvjudge.retention.reduce_apply": ("ReductionResult", "RunInColdStorage", "StalePlan", "apply_plan", "reduce_run"),
    "kvjudge.retention.reduce_runs": ("RunsReduction", "reduce_runs"),
    "kvjudge.retention.stored_tokens": ("run_tokens", "stored_tokens"),
    "kvjudge.retention.tiering": ("REHYDRATE_POINTS", "TIER_POINTS", "ColdReader", "ColdStores", "Manifest",
                                  "RehydrateResult", "TierGate", "TierPlan", "TierResult", "fallback_reader",
                                  "local_body_bytes", "plan_all", "recover", "rehydrate_run", "resolve_endpoint",
                                  "resolve_cold_target", "tier_run", "tier_runs", "verify_checks"),
}
_MODULE_OF = {name: module for module, names in _LOADED_ON_USE.items() for name in names}

if TYPE_CHECKING:
    from kvjudge.retention.cold import ColdStore, LocalDirColdStore, S3ColdStore, open_cold_store
    from kvjudge.retention.evidence import Evidence, Visibility, find_evidence, measure
    from kvjudge.retention.extract import diff_extract, head_tail_extract
    from kvjudge.retention.ingest import IngestReport, ingest_paths
    from kvjudge.retention.late_grades import GradeReport, attach_grades
    from kvjudge.retention.reduce import ReductionPlan, plan_reduction, view_refs
    from kvjudge.retention.reduce_apply import ReductionResult, RunInColdStorage, StalePlan, apply_plan, reduce_run
    from kvjudge.retention.reduce_runs import RunsReduction, reduce_runs
    from kvjudge.retention.stored_tokens import run_tokens, stored_tokens
    from kvjudge.retention.tiering import (
        REHYDRATE_POINTS,
        TIER_POINTS,
        ColdReader,
        ColdStores,
        Manifest,
        RehydrateResult,
        TierGate,
        TierPlan,
        TierResult,
        fallback_reader,
        local_body_bytes,
        plan_all,
        recover,
        rehydrate_run,
        resolve_endpoint,
        resolve_cold_target,
        tier_run,
        tier_runs,
        verify_checks,
    )


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
    "EVENT_TYPES", "STATES", "BlobStore", "BodyLocation", "Branch", "BranchOpened", "BranchReduced", "Dropped",
    "Event", "Explanation", "RunListing", "GradeRecorded", "GradeReport", "attach_grades", "Reduced", "Rehydrated", "RunStarted", "RunState", "StateChanged",
    "Store", "TextError", "TextRepaired", "TierStarted", "Tiered", "Transition", "TransitionRecorded",
    "VerifierRecorded", "canonical_json", "Evidence", "IngestReport", "Visibility", "diff_extract", "fault_point",
    "find_evidence", "fold", "fold_onto", "head_tail_extract", "measure",
    "ingest_paths", "is_reducible", "parse_checked", "ref_of",
    "ReductionPlan", "ReductionResult", "RunInColdStorage", "RunsReduction", "StalePlan", "Violation", "VerifyReport", "apply_plan",
    "plan_reduction", "reduce_run", "reduce_runs", "run_tokens", "stored_tokens", "verify", "view_refs",
    "REHYDRATE_POINTS", "TIER_POINTS", "ColdReader", "ColdStore", "ColdStores", "LocalDirColdStore", "Manifest",
    "RehydrateResult", "S3ColdStore", "TierGate", "TierPlan", "TierResult", "fallback_reader", "local_body_bytes",
    "open_cold_store", "plan_all", "recover", "rehydrate_run", "resolve_endpoint", "resolve_cold_target", "tier_run",
    "tier_runs", "verify_checks",
]
