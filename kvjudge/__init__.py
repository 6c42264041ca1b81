"""kvjudge: probe what fits, budget tokens, reduce and tier agent runs, and judge them on your own hardware.

The library API: ``import kvjudge`` offers what the commands do, each name the same library call its command
makes (a command is parse → library call → render)::

    import kvjudge

    settings = kvjudge.Settings.load()                      # kvjudge.toml, the environment; .with_overrides({...})
    target = kvjudge.JudgeTarget.resolve(settings)          # the judge, its figures, the store, the counter
    report = target.local_capabilities.probe(target.model_path)   # `kvjudge probe` (kvjudge.probe_model)
    budget = kvjudge.budget_from_settings(settings, max_ok_input=report.entry.max_ok_input)  # `kvjudge budget`
    with target.open_store(create=True) as store:           # a kvjudge.Store
        kvjudge.ingest_paths(store, ["runs/"])              # `kvjudge ingest`
        kvjudge.reduce_runs(store, None, lambda tenant: target.ceiling(tenant).effective, target.counter)
        selection = kvjudge.same_task_pairs(store.runs.listing())    # the pairs `eval` and `rank` judge
        judge = target.open_judge()                          # `kvjudge judge`
        verdicts = kvjudge.judge_batch(judge, store, selection.pairs)
        judge.backend.close()
        figures = kvjudge.evaluate(store, verdicts, selection.runs)  # `kvjudge eval`
        ranking = kvjudge.rank(verdicts, lambda run: kvjudge.agent_of(store.runs.run(run)))  # `kvjudge rank`
        critic = target.open_judge(protocol="pointwise")    # a pointwise critic (kvjudge.make_protocol's names)
        scores = kvjudge.score_runs(critic, store, store.runs.run_ids())   # `kvjudge score`: P(success), cached
        picks = kvjudge.best_of_n(store, critic, kvjudge.candidates_of(store), "pointwise")  # `kvjudge select`
        print(critic.backend.ledger.line())                 # a kvjudge.Ledger: calls, tokens, seconds spent
        critic.backend.close()

- settings and the judge target: :class:`Settings`, :class:`JudgeTarget`;
- probe: :func:`probe_model` (a local GGUF: :func:`kvjudge.probe.probe`), :func:`probe_server`, their reports
  :class:`ProbeReport` and :class:`ServedProbeReport`, the cached :class:`CapabilityEntry`;
- budget: :func:`budget_from_settings` (a :class:`ResolvedBudget`), :class:`TokenBudget`, :func:`effective_ceiling`;
- store and ingest: :class:`Store`, :func:`ingest_paths` (an :class:`IngestReport`), :func:`attach_grades`,
  :func:`sample_runs_path` (the demo's eleven runs);
- reduce: :func:`reduce_runs` (a :class:`RunsReduction`), :func:`reduce_run` (one run);
- move a store: :func:`copy_store` (a :class:`CopyReport`: a store's runs and caches into another store);
- judge: :func:`same_task_pairs` (a :class:`PairSelection`), :class:`Judge`, :func:`judge_batch`, :class:`Verdict`;
- eval and rank: :func:`evaluate`, :func:`rank`, :func:`agent_of`;
- protocols, critics, juries: :func:`make_protocol` (letter, pairwise-scale, pointwise: a judge's ``protocol``),
  :func:`score_runs` (each run scored alone by a pointwise protocol, cached), :func:`jury_verdicts` (several
  judges' verdicts combined);
- select: :func:`candidates_of` (each task's runs), :func:`best_of_n` (one run picked per task, and what the picks
  are worth);
- cost: :class:`Ledger` (the calls, tokens and seconds a backend spent: ``judge.backend.ledger``);
- errors: :class:`KvjudgeError` (every error kvjudge raises; its message says what to do).

Importing kvjudge loads nothing but its errors: each name above is imported from its own module on first use
(start-up time is most of a short command's). The subpackages' own ``__all__`` list their public API.
"""

import importlib
from typing import Any

from kvjudge.errors import KvjudgeError

__version__ = "0.1.0"

# Each name of the API → the module that defines it (or, for an alias, ``module:name``), imported on first use.
# A name never shadows a subpackage (``kvjudge.probe`` is the package; its probe() is ``probe_model`` here).
_API = {
    "Settings": "kvjudge.settings",
    "JudgeTarget": "kvjudge.target",
    "probe_model": "kvjudge.probe.core:probe",
    "probe_server": "kvjudge.probe.served",
    "ProbeReport": "kvjudge.probe.core",
    "ServedProbeReport": "kvjudge.probe.served",
    "CapabilityEntry": "kvjudge.probe.cache",
    "budget_from_settings": "kvjudge.budget.resolve",
    "ResolvedBudget": "kvjudge.budget.resolve",
    "TokenBudget": "kvjudge.budget.token_budget",
    "effective_ceiling": "kvjudge.budget.ceiling",
    "Store": "kvjudge.retention.store.runstore",
    "ingest_paths": "kvjudge.retention.ingest.importer",
    "IngestReport": "kvjudge.retention.ingest.importer",
    "attach_grades": "kvjudge.retention.late_grades",
    "sample_runs_path": "kvjudge.demo",
    "reduce_runs": "kvjudge.retention.reduce_runs",
    "RunsReduction": "kvjudge.retention.reduce_runs",
    "reduce_run": "kvjudge.retention.reduce_apply",
    "copy_store": "kvjudge.retention.store_copy",
    "CopyReport": "kvjudge.retention.store_copy",
    "same_task_pairs": "kvjudge.judge.pairing",
    "PairSelection": "kvjudge.judge.pairing",
    "Judge": "kvjudge.judge.pipeline",
    "judge_batch": "kvjudge.judge.pipeline",
    "Verdict": "kvjudge.judge.verdict",
    "evaluate": "kvjudge.judge.evaluate",
    "rank": "kvjudge.judge.ranking",
    "agent_of": "kvjudge.retention.state",
    "make_protocol": "kvjudge.judge.protocols",
    "score_runs": "kvjudge.judge.pointwise",
    "jury_verdicts": "kvjudge.judge.jury",
    "candidates_of": "kvjudge.judge.best_of_n",
    "best_of_n": "kvjudge.judge.best_of_n",
    "Ledger": "kvjudge.judge.ledger",
}


def __getattr__(name: str) -> Any:
    """A name of the library API, imported from its module now (and kept here after)."""
    where = _API.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


__all__ = ["KvjudgeError", "__version__", *_API]
