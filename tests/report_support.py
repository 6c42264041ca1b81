"""Small stores for the report's tests, their judgment caches seeded with chosen verdicts through the judge's own
packing and cache keys, so ``kvjudge report``, ``eval`` and ``rank`` read the same verdicts without model time:

- :func:`seeded_store`: three agents on four tasks, graded, one run full of markup payloads, verdicts right,
  wrong, tie and inconsistent;
- :func:`hostile_store`: runs whose ids, agents and task name are markup payloads too (and whose text is);
- :func:`report_in_process`: the seeded store's report built in this process (a :class:`~kvjudge.report.Report`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from helpers import store_from_runs

from kvjudge.judge import Judge, LlamaBackend, Verdict, WindowPlanner, judge_batch
from kvjudge.report import Report, build_report
from kvjudge.retention import Store
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.testing.filler import filler
from kvjudge.testing.judgments import seed_judgments
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import make_counter

N_CTX = 1024
AGENTS = ("alpha", "beta", "gamma")
TASKS = ("csv-quoting", "lru-cache", "slugify", "clamp")
# Text a browser would run or follow if the page wrote it as markup.
PAYLOADS = ('<script>window.pwned = "script";</script>',
            '</textarea></pre><img src="x" onerror="window.pwned = \'img\'">',
            '<a href="javascript:window.pwned = \'link\'">click me</a> and [markdown](javascript:window.pwned=1)',
            '<svg onload="window.pwned = \'svg\'"></svg><style>body { display: none }</style>')
PAYLOAD_RUN = "gamma/clamp"
REDUCED_RUN = "alpha/lru-cache"  # a long log, reduced in the store before judging: its Reduced events show
REDUCE_TO = 120                  # tokens (chars/4), far under the log
# Who passes each task (grade 1.0); the others fail (0.0). On slugify every agent fails: equal grades.
PASSES = {"csv-quoting": {"alpha"}, "lru-cache": {"beta", "gamma"}, "slugify": set(), "clamp": {"alpha", "gamma"}}
# Names a page would run or follow if it wrote them as markup (in text, attributes, <option>, SVG <text>, JSON), and
# an entity that must not be read as one. Run id → agent; the first run passes, the others fail.
HOSTILE_TASK = "</option></select><svg onload=\"window.pwned = 'task'\"></svg> &amp; <b>bold</b>"
HOSTILE_RUNS = {
    '<script>window.pwned = "run id"</script>': '<img src="x" onerror="window.pwned = \'agent\'">',
    '"><img src=x onerror="window.pwned = \'run attribute\'">': "</text></svg><script>window.pwned = 'svg'</script>",
    "javascript:window.pwned = 'link'": "</script><script>window.pwned = 'json'</script>",
}


def report_runs() -> list[dict[str, Any]]:
    """One run per agent per task, ids ``<agent>/<task>``; the payload run carries every payload in its text."""
    runs = []
    for task in TASKS:
        for number, agent in enumerate(AGENTS):
            passed = agent in PASSES[task]
            outputs = [f"$ pytest -q tests/test_{task.replace('-', '_')}.py\n"
                       + ("3 passed" if passed else f"{number + 1} failed, {2 - number} passed")]
            if f"{agent}/{task}" == PAYLOAD_RUN:
                outputs.append("\n".join(PAYLOADS))
            if f"{agent}/{task}" == REDUCED_RUN:
                outputs.insert(0, "$ pip install -e .\n" + filler(7, 600))
            run = make_run(f"{agent}/{task}", outputs, passed=passed, prompt=f"Fix the {task} bug.",
                           final="3 passed" if passed else "1 failed")
            run["task"]["id"] = task
            run["agent"] = agent
            run["branches"][0]["transitions"][-1]["tool_output"]["exit_code"] = 0 if passed else 1
            runs.append(run)
    return runs


def _choice(truth_a: bool, truth_b: bool, index: int) -> tuple[float, float]:
    """A spread of verdicts: mostly right, some wrong, a tie and an inconsistent one (by pair index)."""
    if index % 5 == 3:
        return 0.52, 0.49                         # tie
    if index % 5 == 4:
        return 0.9, 0.1                           # inconsistent: each order prefers the run shown first
    better_a = truth_a > truth_b or (truth_a == truth_b and index % 2 == 0)
    if index % 3 == 2:
        better_a = not better_a                   # wrong on purpose
    return (0.8, 0.7) if better_a else (0.2, 0.3)


def _seed(store: Store, model: Path, choices: dict[tuple[str, str], tuple[float, float]]) -> None:
    backend = LlamaBackend(model_path=model)
    try:
        judge = Judge(backend, planner=WindowPlanner(backend, requested=N_CTX, certify=False))
        seed_judgments(judge, store, choices)
    finally:
        backend.close()


def seeded_store(path: Path, model: Path, *, leave_out: int = 0) -> tuple[str, list[tuple[str, str]]]:
    """The report store at ``path`` with every same-task pair's verdict cached except the last ``leave_out``
    (left for the report to judge); returns the store path and the pairs in the order the commands list them."""
    with store_from_runs(path, report_runs()) as store:
        assert reduce_run(store, REDUCED_RUN, REDUCE_TO, make_counter("chars")).plan.fits
        runs = {state.id: state for state in store.runs.iter_runs()}
        pairs = sorted((a, b) for a in runs for b in runs if a < b and runs[a].task_id == runs[b].task_id)
        pairs.sort(key=lambda pair: runs[pair[0]].task_id)
        passes = {run_id: run_id.split("/")[0] in PASSES[runs[run_id].task_id] for run_id in runs}
        choices = {pair: _choice(passes[pair[0]], passes[pair[1]], index) for index, pair in enumerate(pairs)}
        _seed(store, model, dict(list(choices.items())[:len(choices) - leave_out]))
        return str(store.path), pairs


def hostile_store(path: Path, model: Path) -> tuple[str, list[tuple[str, str]]]:
    """A store at ``path`` of the :data:`HOSTILE_RUNS` on :data:`HOSTILE_TASK` (the first run's text carries every
    payload), every pair's verdict cached and right; returns the store path and the pairs."""
    runs = []
    for number, (run_id, agent) in enumerate(HOSTILE_RUNS.items()):
        passed = number == 0
        outputs = ["$ pytest -q\n" + ("3 passed" if passed else "2 failed, 1 passed")]
        if passed:
            outputs.append("\n".join(PAYLOADS))
        run = make_run(run_id, outputs, passed=passed, prompt=f"Fix {HOSTILE_TASK}.",
                       final="3 passed" if passed else "2 failed")
        run["task"]["id"] = HOSTILE_TASK
        run["agent"] = agent
        runs.append(run)
    with store_from_runs(path, runs) as store:
        ids = sorted(store.runs.run_ids())
        pairs = [(a, b) for a in ids for b in ids if a < b]
        first = next(iter(HOSTILE_RUNS))
        _seed(store, model, {(a, b): (0.8, 0.7) if a == first else (0.2, 0.3) if b == first else (0.6, 0.4)
                             for a, b in pairs})
        return str(store.path), pairs


def report_in_process(root: Path, model: Path, *, task: str | None = None,
                      adapt: Callable[[Sequence[Verdict]], Sequence[Verdict]] = list) -> tuple[Report, list[Verdict]]:
    """:func:`seeded_store` at ``root / "store.sqlite"``, its pairs (those of ``task``, else all) judged here
    from the cache, and their report (``adapt`` may stand other verdicts in for them); the report and the verdicts."""
    root.mkdir(parents=True, exist_ok=True)
    store_path, pairs = seeded_store(root / "store.sqlite", model)
    with Store.open(store_path) as store:
        backend = LlamaBackend(model_path=model)
        try:
            judge = Judge(backend, planner=WindowPlanner(backend, requested=N_CTX, certify=False))
            chosen = [p for p in pairs if task is None or store.runs.run(p[0]).task_id == task]
            verdicts = list(adapt(judge_batch(judge, store, chosen)))
            return build_report(store, judge, verdicts, ceiling_note="no probe figure"), verdicts
        finally:
            backend.close()
