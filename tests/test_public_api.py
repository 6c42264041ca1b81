"""The public surface: ``import kvjudge`` offers the library API (loaded on first use, so importing it stays cheap),
each subpackage's ``__all__`` is its public API, and neither grows or shrinks by accident: a name added or removed
fails here until :data:`SURFACE` says so. Every public class and function says what it is."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import kvjudge

PACKAGE = Path(kvjudge.__file__).parent

# The public names of each package with an ``__all__``, sorted. Change a list here in the same commit that changes
# the package's surface (and ARCHITECTURE.md's "The library API" for the top level).
SURFACE: dict[str, list[str]] = {
    "kvjudge": [
        "CapabilityEntry", "CopyReport", "IngestReport", "Judge", "JudgeTarget", "KvjudgeError", "Ledger",
        "PairSelection", "ProbeReport", "ResolvedBudget", "RunsReduction", "ServedProbeReport", "Settings", "Store",
        "TokenBudget", "Verdict", "__version__", "agent_of", "attach_grades", "best_of_n", "budget_from_settings",
        "candidates_of", "copy_store", "effective_ceiling", "evaluate", "ingest_paths", "judge_batch", "jury_verdicts",
        "make_protocol", "probe_model", "probe_server", "rank", "reduce_run", "reduce_runs", "same_task_pairs",
        "sample_runs_path", "score_runs",
    ],
    "kvjudge.budget": [
        "BudgetSource", "CeilingBound", "ConversationTurn", "MemMessage", "MemoryProvider", "ResolvedBudget",
        "SessionContext", "TokenBudget", "TokenEstimation", "TurnMetrics", "budget_from_settings",
        "effective_ceiling", "resolve_budget",
    ],
    "kvjudge.probe": [
        "CapabilityCache", "CapabilityEntry", "CapabilityLookup", "Device", "DeviceReport", "KvBreakdown",
        "ModelShape", "ProbeReport", "RuntimeSettings", "ServedProbeReport", "default_cache_path", "discover_devices",
        "ensure_capability", "kv_breakdown", "kv_cache_bytes", "lookup_capability", "lookup_served",
        "max_context_tokens", "memory_needed", "probe", "probe_server", "read_model_shape",
    ],
    "kvjudge.retention": [
        "ColdStore", "Evidence", "GradeReport", "IngestReport", "ReductionPlan", "ReductionResult", "RehydrateResult",
        "RunInColdStorage", "RunState", "Store", "TierResult", "VerifyReport", "apply_plan", "attach_grades",
        "find_evidence", "fold", "ingest_paths", "measure", "open_cold_store", "plan_reduction", "reduce_run",
        "rehydrate_run", "run_tokens", "tier_run", "tier_runs", "verify",
    ],
    "kvjudge.retention.store": [
        "BlobStore", "EventRecorder", "Explanation", "FallbackReader", "JobView", "Judgments", "RunListing",
        "RunQueries", "Store", "StoreLocation", "TokenCounts", "Transactions", "WorkClaims", "default_store_path",
    ],
    "kvjudge.retention.store.postgres": ["open_postgres", "postgres_parts"],
    "kvjudge.retention.cold": [
        "BlobBody", "ColdStore", "ColdTarget", "LocalDirColdStore", "ManifestWrite", "ObjectInfo", "S3ColdStore",
        "open_cold_store",
    ],
    "kvjudge.retention.ingest": [
        "Companion", "DocumentError", "Format", "IngestReport", "ParseContext", "ParsedRun", "Source",
        "StagedInputs", "Walk", "detect_format", "formats", "ingest_paths", "ingest_sources", "staged_inputs", "walk",
    ],
    "kvjudge.retention.tiering": [
        "ColdReader", "ColdStores", "Manifest", "RehydrateResult", "TierGate", "TierOutcome", "TierPlan",
        "TierResult", "default_cold_target", "fallback_reader", "plan_all", "recover", "rehydrate_run",
        "resolve_cold_target", "resolve_endpoint", "tier_requested", "tier_run", "tier_runs", "verify_checks",
    ],
    "kvjudge.judge.protocols": [
        "Criterion", "DEFAULT_RUBRIC", "JudgeProtocol", "LetterProtocol", "MAX_REPEATS", "PAIRWISE", "POINTWISE",
        "PROTOCOLS", "PairwiseScaleProtocol", "PointwiseProtocol", "Rubric", "Scale", "letter_scale", "make_protocol",
    ],
    "kvjudge.report": ["Report", "Written", "build_report", "check_output", "write_report"],
    "kvjudge.server_client": ["AFFINITY_HEADER", "Answer", "CONNECT_TIMEOUT_S", "Credentials", "IDENTIFY_TIMEOUT_S", "KINDS",
                              "RetryPolicy", "ServerClient", "ServerInfo", "ServerTokenCounter", "TOKENIZE_ROUTES", "Usage",
                              "context_refusal", "credentials_from", "normalize_url", "usage_of"],
    "kvjudge.judge": [
        "Backend", "CallCost", "Criterion", "DEFAULT_MARGIN", "DEFAULT_RUBRIC", "Framing", "Judge", "JudgeProtocol",
        "JuryVerdict", "LabelScore", "Ledger", "LlamaBackend", "OUTCOMES", "PROTOCOLS", "Pick", "Prompt",
        "PromptOverflow", "Rubric", "RunEvidence", "RunScore", "SCORED", "STRATEGIES", "Scale", "ServerBackend",
        "ServerPool", "StillGrades", "StillGradesCheck", "TEMPLATE_CHOICES", "Verdict", "Window", "WindowPlanner",
        "brier", "candidates_of", "check_still_grades", "cohen_kappa", "escape", "expected_calibration_error",
        "judge_batch", "judge_pair", "jury_verdicts", "letter_scale", "make_protocol", "open_servers",
        "reliability_bins", "render_view", "roc_auc", "score_figures", "score_runs", "still_grades",
        "summarize_verdicts",
    ],
}
# Packages without a public surface of their own: the CLI's commands, and test material.
NO_SURFACE = {"kvjudge.commands", "kvjudge.testing"}


def _packages() -> list[str]:
    return sorted(".".join(("kvjudge", *init.parent.relative_to(PACKAGE).parts)) for init in PACKAGE.rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def test_every_package_has_its_surface_in_the_snapshot() -> None:
    assert set(_packages()) == set(SURFACE) | NO_SURFACE
    for name in NO_SURFACE:
        assert not hasattr(importlib.import_module(name), "__all__"), name


def test_each_public_surface_is_the_snapshot() -> None:
    changed = {}
    for name, expected in SURFACE.items():
        found = sorted(importlib.import_module(name).__all__)
        if found != sorted(expected):
            changed[name] = {"added": sorted(set(found) - set(expected)),
                             "removed": sorted(set(expected) - set(found))}
    assert changed == {}, "a public surface changed: update SURFACE (and the docs) if it is meant to"


def test_every_public_name_resolves_and_no_submodule_takes_its_place() -> None:
    for name in SURFACE:
        names = importlib.import_module(name).__all__
        assert len(names) == len(set(names)), name
    # A public name that is also a submodule's (``kvjudge.retention.verify``) must stay the name even when the
    # submodule is imported before it is first asked for (the import system sets the package's attribute to the
    # module then): in a fresh process, each such submodule is imported first.
    code = ("import importlib, inspect, sys\n"
            "for package, names in SURFACE.items():\n"
            "    for public in names:\n"
            "        try:\n"
            "            importlib.import_module(f'{package}.{public}')\n"
            "        except ImportError:\n"
            "            pass\n"
            "for package, names in SURFACE.items():\n"
            "    for public in names:\n"
            "        value = getattr(importlib.import_module(package), public)\n"
            "        if inspect.ismodule(value):\n"
            "            print(f'{package}.{public}')\n")
    result = subprocess.run([sys.executable, "-c", f"SURFACE = {SURFACE!r}\n{code}"], capture_output=True,
                            text=True, check=True)
    assert result.stdout.split() == []


def test_every_public_class_and_function_has_a_docstring() -> None:
    undocumented = []
    for name in SURFACE:
        package = importlib.import_module(name)
        assert (package.__doc__ or "").strip(), name
        for public in package.__all__:
            value = getattr(package, public)
            if not (inspect.isclass(value) or inspect.isfunction(value)) or not value.__module__.startswith("kvjudge"):
                continue  # constants and type aliases (ColdTarget is str) are described where they are defined
            doc = value.__doc__ or ""
            # A dataclass without a docstring gets its signature as one: that says nothing.
            if not doc.strip() or (inspect.isclass(value) and doc.startswith(f"{value.__name__}(")):
                undocumented.append(f"{name}.{public}")
    assert undocumented == []


def test_the_top_level_names_are_the_library_calls_the_commands_make() -> None:
    # One implementation: what a notebook calls is what the command calls, not a copy beside it.
    from kvjudge.commands import _judging, eval, ingest, probe, rank, reduce, score, select, store

    assert kvjudge.probe_model is probe.probe and kvjudge.probe_server is probe.probe_server
    assert kvjudge.reduce_runs is reduce.reduce_runs
    assert kvjudge.copy_store is store.copy_store
    assert kvjudge.judge_batch is _judging.judge_batch and kvjudge.same_task_pairs is _judging.same_task_pairs
    assert kvjudge.evaluate is eval.evaluate and kvjudge.rank is rank.rank
    assert kvjudge.IngestReport is ingest.IngestReport
    assert kvjudge.ingest_paths is importlib.import_module("kvjudge.retention.ingest").ingest_paths
    assert kvjudge.JudgeTarget is _judging.JudgeTarget and kvjudge.Store is _judging.Store
    assert kvjudge.score_runs is score.score_runs and kvjudge.best_of_n is select.best_of_n
    assert kvjudge.candidates_of is select.candidates_of and kvjudge.Ledger is _judging.Ledger
    assert kvjudge.make_protocol is importlib.import_module("kvjudge.judge.protocols").make_protocol


def test_importing_kvjudge_loads_only_its_errors() -> None:
    heavy = ("llama_cpp", "httpx", "matplotlib", "scipy", "boto3", "numpy", "jinja2", "rich")
    code = "import sys, kvjudge; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert {name for name in loaded if name.startswith("kvjudge")} == {"kvjudge", "kvjudge.errors"}
    assert [name for name in heavy if name in loaded] == []
    # A name of the API loads its own module and what that needs, not the rest: the store and ingest no model,
    # HTTP client or S3 client.
    code = "import sys, kvjudge; kvjudge.Store, kvjudge.ingest_paths; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert {"kvjudge.retention.store.runstore", "kvjudge.retention.ingest.importer"} <= loaded
    assert [name for name in heavy if name in loaded] == []
    assert "kvjudge.judge" not in loaded and "kvjudge.target" not in loaded


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'probe_modle'"):
        kvjudge.probe_modle  # noqa: B018
    assert "probe_model" in dir(kvjudge)
