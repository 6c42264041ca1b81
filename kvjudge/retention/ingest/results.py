"""Evaluation results as held-out grades (``kvjudge ingest … --results [AGENT=]FILE`` and ``kvjudge grade``).

Shapes, as the harnesses write them:

- the SWE-bench summary report ``<model>.<run_id>.json``: ``resolved_ids``, ``unresolved_ids``,
  ``empty_patch_ids``, ``error_ids``, ``incomplete_ids``, … (``<model>`` is the predictions'
  ``model_name_or_path`` with ``/`` → ``__``);
- SWE-bench per-instance ``logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json``:
  ``{"<instance_id>": {"resolved": bool, …}}`` (a directory is searched for them);
- OpenHands' evaluation output ``output.swebench_eval.jsonl`` (one line per instance: ``instance_id``,
  ``metadata`` with ``agent_class`` and ``llm_config.model``, ``test_result.report`` with ``resolved``,
  ``empty_generation``, ``failed_apply_patch``, ``error_eval``, ``test_timeout``), and an ``output.jsonl``
  whose lines carry that report as ``report`` (OpenHands' ``update_output_with_eval.py``). Read line by line.

A resolved instance is ``{"grader": "swe-bench", "score": 1.0, "label": "resolved"}``; unresolved (an empty
patch, a patch that did not apply) scores 0.0. An evaluation error (SWE-bench ``error_ids``, OpenHands
``error_eval`` or ``test_timeout``) is not a grade: those runs stay ungraded.

**Two ways a result names its run.** ``ResultsFile.grades`` maps an *instance* (task id) to a grade, and a run
takes it by its task id and agent: the agent is ``AGENT=`` when given, else read from the model name in the
file's name or path, else any agent — and then an instance answered by runs of two agents is refused as
ambiguous. ``ResultsFile.run_grades`` maps a *run id* to a grade and is matched first, exactly: a shape whose
lines name their agent (OpenHands' ``metadata``) fills it with the run ids the run parser gives those runs, so
no binding is needed; such an id names no trial, and grades each trial of the run (``<id>/<trial>``, imported with
``--trial``). Results that name no trial (these, and instance grades) are refused where they fit two trials of one
agent: they are one trial's results (:meth:`ResultsIndex.ambiguities`). A reader for results that are per trial or per sample (Harbor ``result.json`` rewards,
inspect scores) adds its shape to :func:`_read` and fills ``run_grades`` with the ids its run parser gives
(None for an evaluation error); nothing else changes.

Harness results read that way: a Harbor trial's ``result.json`` (a job directory: every trial's), and an inspect
eval log (``.eval`` or ``.json``: every sample's scores) — graded as their import would grade them (see
:mod:`.harbor` and :mod:`.inspect_log`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest import harbor, inspect_log, inspect_reader
from kvjudge.retention.ingest.model import DocumentError
from kvjudge.retention.ingest.openhands import agent_from_metadata, run_id_for
from kvjudge.retention.ingest.swebench import RESOLVED, UNRESOLVED, openhands_report_grade

REPORT_NAME = "report.json"
#: What a ``--results`` directory is searched for: per-instance SWE-bench reports and OpenHands evaluation output.
RESULT_PATTERNS = (REPORT_NAME, "*.swebench_eval.jsonl")


@dataclass
class ResultsFile:
    """One results source: instance id → grade and run id → grade (None: evaluated with an error), and whose
    runs its instance grades apply to."""

    path: Path
    agent: str | None  # AGENT=FILE, or inferred from the file's name and path (see ResultsIndex.bind_agents)
    grades: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    named: bool = False  # True when the agent was given as AGENT=FILE
    run_grades: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # matched by exact run id first

    def tagged_by(self, agent: str) -> bool:
        """The harness names report files and folders after the model with "/" → "__"."""
        tag = agent.replace("/", "__")
        return self.path.name.startswith(tag + ".") or tag in self.path.parts


def parse_results_arg(value: str) -> tuple[str | None, Path]:
    """``AGENT=FILE`` or ``FILE`` (a path that exists as given wins over splitting at ``=``)."""
    if "=" in value and not os.path.exists(value):
        agent, _, path = value.partition("=")
        if agent and path:
            return agent, Path(path)
    return None, Path(value)


def load_results(values: Iterable[str]) -> list[ResultsFile]:
    """Read every ``--results`` value (files, or directories holding per-instance ``report.json`` files)."""
    loaded: list[ResultsFile] = []
    for value in values:
        agent, path = parse_results_arg(value)
        if path.is_dir():
            reports = sorted({p for pattern in RESULT_PATTERNS for p in path.rglob(pattern) if p.is_file()})
            reports += sorted(p / harbor.RESULT for p in path.rglob("*") if p.is_dir() and harbor.is_trial_dir(p))
            reports += sorted(p for p in path.rglob("*" + inspect_reader.EVAL_SUFFIX) if p.is_file())
            if not reports:
                raise IngestError(f"--results {path}: no {' or '.join(RESULT_PATTERNS)} files, Harbor trials or inspect "
                                  f"logs under this directory; pass a SWE-bench summary report, per-instance "
                                  f"{REPORT_NAME} files, OpenHands evaluation output, Harbor result.json files or "
                                  f"inspect logs")
            loaded.extend(_read(report, agent) for report in reports)
        elif path.is_file():
            loaded.append(_read(path, agent))
        else:
            raise IngestError(f"--results {path} does not exist; pass a SWE-bench report file or a directory of "
                              f"{REPORT_NAME} files")
    return loaded


def _read(path: Path, agent: str | None) -> ResultsFile:
    if path.suffix == inspect_reader.EVAL_SUFFIX or inspect_reader.is_json_log(path):
        return _inspect_results(path, agent)
    if path.name.endswith(".jsonl"):
        return _read_openhands(path, agent)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise IngestError(f"--results {path}: not readable JSON ({exc}); pass a SWE-bench report") from None
    results = ResultsFile(path=path, agent=agent, named=agent is not None)
    if isinstance(data, dict) and isinstance(data.get("resolved_ids"), list):
        for key, grade in (("resolved_ids", RESOLVED), ("unresolved_ids", UNRESOLVED),
                           ("empty_patch_ids", UNRESOLVED), ("error_ids", None)):
            ids = data.get(key, [])
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise IngestError(f"--results {path}: $.{key} must be a list of instance ids")
            for instance in ids:
                _put(results, instance, grade, key)
        return results
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "resolved" in v for v in data.values()):
        for instance, report in data.items():
            resolved = report["resolved"]
            if not isinstance(resolved, bool):
                raise IngestError(f"--results {path}: $[{json.dumps(instance)}].resolved must be true or false")
            _put(results, instance, RESOLVED if resolved else UNRESOLVED, "resolved")
        return results
    if isinstance(data, dict) and {"task_name", "trial_name", "agent_info"} <= data.keys():
        try:
            trial = harbor.read_result(data)
        except DocumentError as exc:
            raise IngestError(f"--results {path}: {exc.path}: {exc.message}") from None
        results.run_grades[agent_run_id(trial.run_id, trial.agent, agent)] = trial.grade
        return results
    raise IngestError(f"--results {path}: neither a SWE-bench summary report (resolved_ids, unresolved_ids, …) nor "
                      f'a per-instance report ({{"<instance_id>": {{"resolved": …}}}})')


def _inspect_results(path: Path, agent: str | None) -> ResultsFile:
    """Every sample's grade of an inspect log, by run id (a sample not scored grades nothing)."""
    results = ResultsFile(path=path, agent=agent, named=agent is not None)
    for spec, fields in inspect_reader.sample_scores(path):
        if not fields["scores"]:
            continue
        try:
            grade, _ = inspect_log.score_grade(fields["scores"], "$.scores")
        except DocumentError as exc:
            raise IngestError(f"--results {fields['where']}: {exc.path}: {exc.message}") from None
        run_id = inspect_log.sample_run_id(spec, fields["id"], fields["epoch"], agent)
        results.run_grades[run_id] = grade
    return results


def agent_run_id(run_id: str, run_agent: str, agent: str | None) -> str:
    """``run_id`` with its agent prefix replaced by ``agent`` (AGENT=FILE), as ``--agent`` names the runs."""
    return agent + run_id[len(run_agent):] if agent else run_id


def _put(results: ResultsFile, instance: str, grade: dict[str, Any] | None, key: str, *,
         run: bool = False) -> None:
    """Record ``grade`` for ``instance`` (or, with ``run``, for the run id ``instance``)."""
    grades = results.run_grades if run else results.grades
    if instance in grades and grades[instance] != grade:
        what = "run" if run else "instance"
        raise IngestError(f"--results {results.path}: {what} {instance!r} is listed twice with different outcomes "
                          f"(again in {key})")
    grades[instance] = grade


def _read_openhands(path: Path, agent: str | None) -> ResultsFile:
    """OpenHands evaluation output, line by line: each line's report grades the run its ``metadata`` names
    (``run_grades``), or with ``AGENT=`` (or no metadata) the instance (``grades``)."""
    results = ResultsFile(path=path, agent=agent, named=agent is not None)
    try:
        with path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"--results {path}:{number}"
                try:
                    data = json.loads(line)
                except ValueError as exc:
                    raise IngestError(f"{where}: not valid JSON ({exc}); pass OpenHands evaluation output "
                                      f"(output.swebench_eval.jsonl)") from None
                instance = data.get("instance_id") if isinstance(data, dict) else None
                if not isinstance(instance, str) or not instance:
                    raise IngestError(f"{where}: $.instance_id: missing (each line of OpenHands evaluation output "
                                      f"names its instance)")
                report, key = _openhands_report(data)
                if report is None:
                    raise IngestError(f"{where}: $.{key}: missing (no evaluation report in this line); pass the "
                                      f"evaluation output, output.swebench_eval.jsonl")
                try:
                    grade = openhands_report_grade(report)
                except ValueError as exc:
                    raise IngestError(f"{where}: $.{key}: {exc}") from None
                named_agent = agent_from_metadata(data.get("metadata"))
                if agent is None and named_agent is not None:
                    _put(results, run_id_for(named_agent, instance), grade, f"line {number}", run=True)
                else:
                    _put(results, instance, grade, f"line {number}")
    except OSError as exc:
        raise IngestError(f"--results {path}: cannot be read ({exc.strerror or exc})") from None
    if not results.grades and not results.run_grades:
        raise IngestError(f"--results {path}: holds no results; pass OpenHands evaluation output "
                          f"(output.swebench_eval.jsonl)")
    return results


def _openhands_report(data: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The line's evaluation report and its JSON path: ``test_result.report`` (evaluation output) or ``report``
    (an output.jsonl updated with its evaluation)."""
    test_result = data.get("test_result")
    if isinstance(test_result, dict) and isinstance(test_result.get("report"), dict):
        return test_result["report"], "test_result.report"
    if isinstance(data.get("report"), dict):
        return data["report"], "report"
    return None, "test_result.report"


class ResultsIndex:
    """Every loaded results file, looked up per run: by its exact run id first, else by (agent, task id)."""

    def __init__(self, files: list[ResultsFile]) -> None:
        self.files = files
        self._used: set[tuple[int, str]] = set()
        self._used_runs: set[tuple[int, str]] = set()
        self._takers: dict[tuple[int, str], set[str]] = {}  # (file, instance) → agents of the runs it graded
        # (file, what a result names without a trial) → the runs with a trial it graded: one trial's result fits
        # another trial of the same agent too, so more than one is ambiguous.
        self._trial_takers: dict[tuple[int, str], set[str]] = {}
        # instance (run id) → the files that grade it, in file order: a lookup per run, not a scan of every file.
        self._files_of: dict[str, list[int]] = {}
        self._files_of_run: dict[str, list[int]] = {}
        for index, results in enumerate(files):
            for instance in results.grades:
                self._files_of.setdefault(instance, []).append(index)
            for run_id in results.run_grades:
                self._files_of_run.setdefault(run_id, []).append(index)

    def needs_agents(self) -> bool:
        """True when a file without ``AGENT=`` grades instances: which runs it grades depends on every agent of
        the import (:meth:`bind_agents`), so they must be known before the first grade is given."""
        return any(results.agent is None and results.grades for results in self.files)

    def bind_agents(self, agents: Iterable[str], *, strict: bool = True) -> None:
        """Give each file without ``AGENT=`` the one agent of this import its name or path names, if any; a name
        that fits several agents is refused (not ``strict``: the file stays unbound, for a file whose grades name
        their runs, which no binding changes)."""
        known = sorted(set(agents))
        for results in self.files:
            if results.agent is None:
                tagged = [agent for agent in known if results.tagged_by(agent)]
                if len(tagged) > 1 and not strict:
                    continue
                if len(tagged) > 1:
                    raise IngestError(f"--results {results.path}: its name fits the runs of {', '.join(tagged)}; say "
                                      f"whose results these are: --results AGENT={results.path}")
                results.agent = tagged[0] if tagged else None

    def grade_for(self, agent: str | None, task_id: str | None, run_id: str | None = None,
                  trial: str | None = None) -> dict[str, Any] | None:
        """The held-out grade of run ``run_id`` (results naming it exactly win; then results naming it without
        its ``trial``, ``<agent>/<instance>`` of ``<agent>/<instance>/<trial>``), else of the run of ``agent`` on
        ``task_id`` (None: no result, or an evaluation error)."""
        found: list[tuple[ResultsFile, dict[str, Any] | None]] = []
        name = run_id or ""
        what = f"run {name!r}"
        files = self._files_of_run.get(name, [])
        untried = trial is not None and not files and name.endswith("/" + trial)
        if untried:  # OpenHands' evaluation output names the run without a trial: it grades each trial of it
            name = name[: -len(trial) - 1]
            files = self._files_of_run.get(name, [])
        for index in files:
            results = self.files[index]
            found.append((results, results.run_grades[name]))
            self._used_runs.add((index, name))
            if untried:
                self._trial_takers.setdefault((index, f"run {name!r}"), set()).add(run_id or "")
        if not found and task_id is not None:
            what = f"instance {task_id!r} of {agent or 'a run'}"
            for index in self._files_of.get(task_id, ()):
                results = self.files[index]
                if results.agent in (None, agent):
                    found.append((results, results.grades[task_id]))
                    self._used.add((index, task_id))
                    self._takers.setdefault((index, task_id), set()).add(agent or "")
                    if trial is not None:
                        self._trial_takers.setdefault((index, what), set()).add(run_id or "")
        grades = {json.dumps(grade, sort_keys=True): grade for _, grade in found if grade is not None}
        if len(grades) > 1:
            where = ", ".join(str(results.path) for results, _ in found)
            raise IngestError(f"the results disagree about {what} ({where}); pass only the results of this "
                              f"evaluation")
        return next(iter(grades.values()), None)

    def sole_run_result(self) -> tuple[int, str] | None:
        """``(file, run id)`` when these results hold exactly one result, and it names a run (one Harbor trial's
        ``result.json``, say), else None: what ``kvjudge grade RUN`` may bind to the one run named."""
        named = [(index, run_id) for index, results in enumerate(self.files) for run_id in results.run_grades]
        if len(named) != 1 or any(results.grades for results in self.files):
            return None
        return named[0]

    def take(self, index: int, run_id: str) -> dict[str, Any] | None:
        """The grade file ``index`` gives run ``run_id``, counted as used (for a result bound to a run by hand)."""
        self._used_runs.add((index, run_id))
        return self.files[index].run_grades[run_id]

    def ambiguities(self) -> list[str]:
        """Instances a results file that names no agent gave to runs of more than one agent, and results naming
        no trial that fit several trials of one agent."""
        out = []
        for (index, instance), agents in sorted(self._takers.items()):
            results = self.files[index]
            if len(agents) > 1 and results.agent is None:
                out.append(f"--results {results.path}: instance {instance!r} matches runs of {len(agents)} agents "
                           f"({', '.join(sorted(agents))}); say whose results these are: "
                           f"--results AGENT={results.path}")
        for (index, what), runs in sorted(self._trial_takers.items()):
            if len(runs) > 1:
                out.append(f"--results {self.files[index].path}: {what} names no trial and fits {len(runs)} trials "
                           f"({', '.join(sorted(runs))}); attach one trial's results at a time: kvjudge grade "
                           f"--all --trial LABEL, or name its runs")
        return out

    def unmatched(self) -> list[tuple[str, str]]:
        """(instance or run id, file) of results that graded no run of this import."""
        return [(name, str(results.path)) for index, results in enumerate(self.files)
                for names, used in ((results.grades, self._used), (results.run_grades, self._used_runs))
                for name in sorted(names) if (index, name) not in used]

    def bindings(self) -> list[dict[str, Any]]:
        """Per results file: whose runs it graded (``agent`` None: any agent's, or the runs it names) and how many."""
        graded_by = Counter(index for index, instance in self._used if self.files[index].grades[instance] is not None)
        graded_by.update(index for index, run_id in self._used_runs
                         if self.files[index].run_grades[run_id] is not None)
        out = []
        for index, results in enumerate(self.files):
            graded = graded_by[index]
            agent_from = "AGENT=" if results.named else "file name" if results.agent else \
                "run ids" if results.run_grades else None
            out.append({"results": str(results.path), "agent": results.agent, "agent_from": agent_from,
                        "graded": graded})
        return out

    def evaluation_errors(self) -> int:
        """Results that are evaluation errors (their runs stay ungraded)."""
        return sum(1 for results in self.files for grades in (results.grades, results.run_grades)
                   for grade in grades.values() if grade is None)
