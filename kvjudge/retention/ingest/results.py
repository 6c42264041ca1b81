"""SWE-bench evaluation results as held-out grades (``kvjudge ingest … --results [AGENT=]FILE``).

Two shapes, as the SWE-bench harness writes them:

- the summary report ``<model>.<run_id>.json``: ``resolved_ids``, ``unresolved_ids``, ``empty_patch_ids``,
  ``error_ids``, ``incomplete_ids``, … (``<model>`` is the predictions' ``model_name_or_path`` with ``/`` → ``__``);
- per-instance ``logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json``:
  ``{"<instance_id>": {"resolved": bool, …}}`` (a directory is searched for them).

Harness results are read too, matched by exact run id (``run_grades``): a Harbor trial's ``result.json`` (a job
directory: every trial's), and an inspect eval log (``.eval`` or ``.json``: every sample's scores) — graded as
their import would grade them (see :mod:`.harbor` and :mod:`.inspect_log`).

A resolved instance is ``{"grader": "swe-bench", "score": 1.0, "label": "resolved"}``; unresolved (and an
empty patch, which SWE-bench counts as unresolved) scores 0.0. An evaluation error is not a grade: those runs
stay ungraded. Results join trajectory runs by task id (the instance id) and agent: the agent is ``AGENT=`` when
given, else read from the model name in the report's file name or path, else any agent — and then an instance
answered by runs of two agents is refused as ambiguous.
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

GRADER = "swe-bench"
RESOLVED = {"grader": GRADER, "score": 1.0, "label": "resolved"}
UNRESOLVED = {"grader": GRADER, "score": 0.0, "label": "unresolved"}
REPORT_NAME = "report.json"


@dataclass
class ResultsFile:
    """One results source: instance id → grade (None: evaluated with an error), and whose runs it grades."""

    path: Path
    agent: str | None  # AGENT=FILE, or inferred from the file's name and path (see ResultsIndex.bind_agents)
    grades: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    named: bool = False  # True when the agent was given as AGENT=FILE
    run_grades: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # run id → grade (None: an error)

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
            reports = sorted(p for p in path.rglob(REPORT_NAME) if p.is_file())
            reports += sorted(p / harbor.RESULT for p in path.rglob("*") if p.is_dir() and harbor.is_trial_dir(p))
            reports += sorted(p for p in path.rglob("*" + inspect_reader.EVAL_SUFFIX) if p.is_file())
            if not reports:
                raise IngestError(f"--results {path}: no {REPORT_NAME} files, Harbor trials or inspect logs under "
                                  f"this directory; pass a SWE-bench summary report or per-instance {REPORT_NAME} "
                                  f"files")
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


def _put(results: ResultsFile, instance: str, grade: dict[str, Any] | None, key: str) -> None:
    if instance in results.grades and results.grades[instance] != grade:
        raise IngestError(f"--results {results.path}: instance {instance!r} is listed twice with different outcomes "
                          f"(again in {key})")
    results.grades[instance] = grade


class ResultsIndex:
    """Every loaded results file, looked up per run by (agent, task id)."""

    def __init__(self, files: list[ResultsFile]) -> None:
        self.files = files
        self._used: set[tuple[int, str]] = set()
        self._takers: dict[tuple[int, str], set[str]] = {}  # (file, instance) → agents of the runs it graded
        # instance → the files that grade it, in file order: a lookup per run, not a scan of every file.
        self._files_of: dict[str, list[int]] = {}
        self._run_files: dict[str, list[int]] = {}  # run id → the files that grade it by run id
        self._used_runs: set[tuple[int, str]] = set()
        for index, results in enumerate(files):
            for instance in results.grades:
                self._files_of.setdefault(instance, []).append(index)
            for run_id in results.run_grades:
                self._run_files.setdefault(run_id, []).append(index)

    def bind_agents(self, agents: Iterable[str]) -> None:
        """Give each file without ``AGENT=`` the one agent of this import its name or path names, if any."""
        known = sorted(set(agents))
        for results in self.files:
            if results.agent is None:
                tagged = [agent for agent in known if results.tagged_by(agent)]
                if len(tagged) > 1:
                    raise IngestError(f"--results {results.path}: its name fits the runs of {', '.join(tagged)}; say "
                                      f"whose results these are: --results AGENT={results.path}")
                results.agent = tagged[0] if tagged else None

    def grade_for(self, agent: str | None, task_id: str | None, run_id: str | None = None) -> dict[str, Any] | None:
        """The held-out grade of the run of ``agent`` on ``task_id`` (None: no result, or an evaluation error);
        a result naming ``run_id`` exactly wins."""
        if run_id is not None and run_id in self._run_files:
            found_runs = {}
            for index in self._run_files[run_id]:
                self._used_runs.add((index, run_id))
                grade = self.files[index].run_grades[run_id]
                if grade is not None:
                    found_runs[json.dumps(grade, sort_keys=True)] = grade
            if len(found_runs) > 1:
                raise IngestError(f"the results disagree about run {run_id!r}; pass only the results of this "
                                  f"evaluation")
            return next(iter(found_runs.values()), None)
        if task_id is None:
            return None
        found: list[tuple[ResultsFile, dict[str, Any] | None]] = []
        for index in self._files_of.get(task_id, ()):
            results = self.files[index]
            if results.agent in (None, agent):
                found.append((results, results.grades[task_id]))
                self._used.add((index, task_id))
                self._takers.setdefault((index, task_id), set()).add(agent or "")
        grades = {json.dumps(grade, sort_keys=True): grade for _, grade in found if grade is not None}
        if len(grades) > 1:
            where = ", ".join(str(results.path) for results, _ in found)
            raise IngestError(f"the results disagree about instance {task_id!r} of {agent or 'a run'} ({where}); "
                              f"pass only the results of this evaluation")
        return next(iter(grades.values()), None)

    def ambiguities(self) -> list[str]:
        """Instances a results file that names no agent gave to runs of more than one agent."""
        out = []
        for (index, instance), agents in sorted(self._takers.items()):
            results = self.files[index]
            if len(agents) > 1 and results.agent is None:
                out.append(f"--results {results.path}: instance {instance!r} matches runs of {len(agents)} agents "
                           f"({', '.join(sorted(agents))}); say whose results these are: "
                           f"--results AGENT={results.path}")
        return out

    def unmatched(self) -> list[tuple[str, str]]:
        """(instance, file) of results that graded no run of this import."""
        return [(instance, str(results.path)) for index, results in enumerate(self.files)
                for instance in sorted(results.grades) if (index, instance) not in self._used] + [
            (run_id, str(results.path)) for index, results in enumerate(self.files)
            for run_id in sorted(results.run_grades) if (index, run_id) not in self._used_runs]

    def bindings(self) -> list[dict[str, Any]]:
        """Per results file: whose runs it graded (``agent`` None: any agent's) and how many."""
        graded_by = Counter(index for index, instance in self._used if self.files[index].grades[instance] is not None)
        graded_by.update(index for index, run_id in self._used_runs if self.files[index].run_grades[run_id] is not None)
        out = []
        for index, results in enumerate(self.files):
            graded = graded_by[index]
            out.append({"results": str(results.path), "agent": results.agent,
                        "agent_from": "AGENT=" if results.named else ("file name" if results.agent else None),
                        "graded": graded})
        return out

    def evaluation_errors(self) -> int:
        """Results that are evaluation errors (their runs stay ungraded)."""
        return sum(1 for results in self.files for grades in (results.grades, results.run_grades)
                   for grade in grades.values() if grade is None)
