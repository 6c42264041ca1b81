"""Harbor trials (Terminal-Bench 2 and every other Harbor dataset): ATIF trajectories with their ``result.json``.

Shapes, as Harbor writes them:

- a job directory ``jobs/<job>/`` holds one directory per trial, ``<task_name[:32]>__<7 characters>``, with
  ``result.json``, ``config.json``, ``trial.log``, ``agent/`` (what the agent wrote) and ``verifier/``;
- ``agent/trajectory.json`` is ATIF (Agent Trajectory Interchange Format, ``schema_version`` ``ATIF-v1.0`` …
  ``ATIF-v1.6``): ``session_id``, ``agent{name, version, model_name}``, ``steps[]{step_id (1, 2, … in each
  file), source system|user|agent, message (a string or content parts), reasoning_content, tool_calls[]
  {tool_call_id, function_name, arguments}, observation.results[]{source_call_id, content}, metrics
  {prompt_tokens (cached included), completion_tokens, …}, is_copied_context}``, ``final_metrics``,
  ``continued_trajectory_ref``. An agent that summarises its context continues in ``trajectory.cont-1.json``,
  ``-2`` …, whose first steps may be copies of earlier context (``is_copied_context``);
- ``result.json`` (TrialResult): ``task_name``, ``trial_name``, ``agent_info{name, version, model_info{name,
  provider}}``, ``config.agent.model_name``, ``verifier_result.rewards.reward`` (null when the verifier did not
  run), ``exception_info{exception_type, exception_message, …}``.

Newer minor ATIF versions and fields this kvjudge does not know are accepted; a major version other than 1 is
not. The checks are Harbor's own: step ids increase within a file, and an observation result names a tool call
of its own step (or none).

Mapping: a trial is a run. Agent = ``<agent name>@<model>`` (the model as the job named it,
``config.agent.model_name``, else ``model_info``, else the trajectory's); task id = ``task_name``; trial =
``trial_name``; run id ``<agent>/<task>/<trial>``. The first user message is the task prompt (its transition
reads ``{{task}}``); each agent step is an assistant transition per tool call (its reasoning before its
message), with the step's ``metrics`` as the call's usage; each observation result a tool transition. The
continuation files follow in order, their copied steps left out (counted in the metadata). The reward is the
held-out grade: ``{"grader": "harbor", "score": reward, "label": "pass"|"fail"|"partial"}``; a null verifier
result, a reward outside [0, 1] or rewards without ``reward`` leave the run ungraded, and an exception is noted
on the run.

Without ``result.json`` a trajectory imports ungraded. In a trial directory that has not finished (its
``config.json``, TrialConfig, beside ``agent/``) the run is named as the trial's ``result.json`` will name it:
agent ``<config.agent.name>@<config.agent.model_name>`` (else the trajectory's), task the config's ``task.name``
or the last part of its ``task.path`` (the task's directory, which Harbor names the task after unless its
``task.toml`` names it otherwise), trial ``trial_name``; the run notes ``trial_finished: false``, and importing the
trial again once it has finished counts it as already present (the log is never rewritten: its result comes with
``kvjudge grade``). A lone ATIF file, outside any trial, imports as ``<agent>/<session_id>`` with no task: nothing
in ATIF names the task or the trial (an agent's ``session_id`` is its own — Terminus 2 draws a UUID), so its
result is attached by naming the run (``kvjudge grade RUN --results result.json``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import DocumentError, JsonPath, ParseContext, ParsedRun, content_text, dig
from kvjudge.retention.ingest.model import get_field, need, scalars, settle_events, subpath, usage_of, with_marker

RESULT = "result.json"
CONFIG = "config.json"
AGENT_DIR = "agent"
TASK_MARKER = "{{task}}"
GRADER = "harbor"
#: An ATIF file's name: ``[<stem>.]trajectory[.cont-N | .<subagent>].json`` (under a folder, in a trial). The stem
#: groups a run's files outside Harbor's layout; ``cont-N`` is a continuation; any other middle part a subagent's
#: trajectory (Terminus 2's ``trajectory.summarization-1-summary.json``).
_TRAJECTORY = re.compile(r"(?:^|/)(?P<stem>[^/]*?\.)?trajectory(?:\.(?:cont-(?P<cont>\d+)|(?P<sub>[^/]+?)))?\.json\Z")
_VERSION = re.compile(r"ATIF-v(\d+)\.(\d+)\Z")
#: How an ATIF document opens (Harbor writes ``schema_version`` first): what a directory walk reads it by.
_ATIF_HEAD = re.compile(rb'\A\s*\{\s*"schema_version"\s*:\s*"ATIF-')
ATIF_HEAD_BYTES = 64
_SOURCES = ("system", "user", "agent")


def is_trajectory_name(name: str) -> bool:
    """An ATIF file's name: ``trajectory.json``, ``trajectory.cont-N.json``, a subagent's
    ``trajectory.<name>.json``, each optionally ``<stem>.``-prefixed (and under a folder)."""
    return _TRAJECTORY.search(name) is not None


def trajectory_stem(name: str) -> str:
    """The stem that groups an ATIF file with its continuations and subagents (``""`` for ``trajectory.json``)."""
    found = _TRAJECTORY.search(name)
    return found.group("stem") or "" if found else ""


def is_subagent_name(name: str) -> bool:
    """A subagent's trajectory (``trajectory.summarization-1-summary.json``): neither the run's nor a
    continuation."""
    found = _TRAJECTORY.search(name)
    return found is not None and found.group("sub") is not None


def continuation_index(name: str) -> int:
    """0 for ``trajectory.json`` (and a subagent's), N for ``trajectory.cont-N.json``."""
    found = _TRAJECTORY.search(name)
    return int(found.group("cont")) if found and found.group("cont") else 0


def is_trial_dir(path: Path) -> bool:
    """A finished Harbor trial: ``result.json`` beside ``agent/``."""
    return (path / RESULT).is_file() and (path / AGENT_DIR).is_dir()


def is_unfinished_trial_dir(path: Path) -> bool:
    """A Harbor trial still running (or stopped before writing its result): ``config.json`` beside ``agent/``, no
    ``result.json``."""
    return (path / CONFIG).is_file() and (path / AGENT_DIR).is_dir() and not (path / RESULT).is_file()


def is_atif_file(path: Path) -> bool:
    """A file that opens as an ATIF document does (``{"schema_version": "ATIF-…``); other JSON is not read."""
    try:
        with path.open("rb") as handle:
            return _ATIF_HEAD.match(handle.read(ATIF_HEAD_BYTES)) is not None
    except OSError:
        return False


def trajectory_files(folder: Path, stem: str = "") -> list[Path]:
    """``<stem>trajectory.json``, its continuations in order, then its subagents' trajectories (by name), in
    ``folder``."""
    found = [path for path in folder.glob(f"{glob_escape(stem)}trajectory*.json")
             if path.is_file() and is_trajectory_name(path.name) and trajectory_stem(path.name) == stem]
    return sorted(found, key=lambda path: (is_subagent_name(path.name), continuation_index(path.name), path.name))


def trial_parts(folder: Path) -> list[Path]:
    """The files a trial is read from: its ``result.json`` (else, not finished, its ``config.json``) and
    ``agent/trajectory*.json``."""
    head = folder / RESULT
    return [head if head.is_file() else folder / CONFIG, *trajectory_files(folder / AGENT_DIR)]


def is_read_trial(folder: Path) -> bool:
    """A finished trial, or one not finished whose ``agent/trajectory.json`` is ATIF (else passed over whole)."""
    return is_trial_dir(folder) or is_atif_file(folder / AGENT_DIR / "trajectory.json")


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def is_atif(obj: Any) -> bool:
    """One ATIF document: an ``ATIF-…`` schema version beside ``steps``."""
    return (isinstance(obj, dict) and isinstance(obj.get("schema_version"), str)
            and obj["schema_version"].startswith("ATIF-") and "steps" in obj)


def is_harbor(obj: Any) -> bool:
    """An ATIF document, or a trial as kvjudge reads it: ``{file name: decoded file}`` holding a trajectory."""
    if is_atif(obj):
        return True
    return isinstance(obj, dict) and any(isinstance(key, str) and is_trajectory_name(key) for key in obj)


@dataclass(frozen=True)
class TrialResult:
    """What kvjudge takes from a ``result.json``."""

    task: str
    trial: str
    agent_name: str
    agent_version: str | None
    model: str | None
    grade: dict[str, Any] | None
    ungraded_because: str | None
    exception: str | None

    @property
    def agent(self) -> str:
        return agent_label(self.agent_name, self.model)

    @property
    def run_id(self) -> str:
        return f"{self.agent}/{self.task}/{self.trial}"


def agent_label(name: str, model: str | None) -> str:
    """``<agent name>@<model>``, or the name alone when no model is known."""
    return f"{name}@{model}" if model else name


def read_result(result: Any, path: JsonPath = "$") -> TrialResult:
    """A ``result.json`` (decoded) → :class:`TrialResult`; DocumentError naming the JSON path of what is wrong."""
    need(isinstance(result, dict), path, "a Harbor result.json must be a JSON object")
    task = get_field(result, "task_name", path, str, "a string")
    trial = get_field(result, "trial_name", path, str, "a string")
    info = get_field(result, "agent_info", path, dict, "an object")
    name = get_field(info, "name", subpath(path, "agent_info"), str, "a string")
    version = info.get("version") if isinstance(info.get("version"), str) else None
    model = dig(result, "config", "agent", "model_name")
    if not isinstance(model, str) or not model:
        model_info = info.get("model_info") if isinstance(info.get("model_info"), dict) else {}
        parts = [model_info.get(key) for key in ("provider", "name") if isinstance(model_info.get(key), str)]
        model = "/".join(parts) or None
    grade, because = _grade(result.get("verifier_result"), subpath(path, "verifier_result"))
    exception = None
    info_exc = result.get("exception_info")
    if isinstance(info_exc, dict):
        kind = info_exc.get("exception_type") if isinstance(info_exc.get("exception_type"), str) else "exception"
        message = info_exc.get("exception_message") if isinstance(info_exc.get("exception_message"), str) else ""
        exception = f"{kind}: {message.strip().splitlines()[0][:200]}" if message.strip() else kind
    if grade is None and because is None:
        because = f"no verifier result ({exception})" if exception else "no verifier result"
    return TrialResult(task, trial, name, version, model, grade, because, exception)


def _grade(verifier: Any, path: JsonPath) -> tuple[dict[str, Any] | None, str | None]:
    if verifier is None:
        return None, None
    need(isinstance(verifier, dict), path, "must be an object or null")
    rewards = verifier.get("rewards")
    if rewards is None:
        return None, "the verifier recorded no rewards"
    need(isinstance(rewards, dict), subpath(path, "rewards"), "must be an object of reward names to numbers")
    key = "reward" if "reward" in rewards else (next(iter(rewards)) if len(rewards) == 1 else None)
    if key is None:
        return None, f"rewards has no 'reward' among {len(rewards)} entries"
    value = get_field(rewards, key, subpath(path, "rewards"), (int, float), "a number")
    need(math.isfinite(value), subpath(path, "rewards", key), f"must be a finite number, not {value}")
    if not 0 <= value <= 1:
        return None, f"reward {value} is outside [0, 1]"
    label = "pass" if value == 1 else "fail" if value == 0 else "partial"
    return {"grader": GRADER if key == "reward" else f"{GRADER}:{key}", "score": float(value), "label": label}, None


def parse_harbor(obj: Any, context: ParseContext) -> ParsedRun:
    """A trial (``{file name: decoded file}``) or one ATIF document → ParsedRun (DocumentError names the path)."""
    need(isinstance(obj, dict), "$", "a Harbor trial or ATIF trajectory must be a JSON object")
    subagents: list[tuple[JsonPath, dict[str, Any]]] = []
    if is_atif(obj):
        parts: list[tuple[JsonPath, dict[str, Any]]] = [("$", obj)]
        result = None
    else:
        names = sorted((key for key in obj if is_trajectory_name(key) and not is_subagent_name(key)),
                       key=continuation_index) or sorted(key for key in obj if is_trajectory_name(key))[:1]
        need(bool(names), "$", "no trajectory.json in this trial")  # (a subagent's file alone is read as its own)
        need(continuation_index(names[0]) == 0, ("$", names[0]),
             "a continuation without its trajectory.json (the run's first part)")
        parts = []
        for name in names:
            need(isinstance(obj[name], dict), ("$", name), "an ATIF trajectory must be a JSON object")
            parts.append((("$", name), obj[name]))
        for name in sorted(key for key in obj if is_trajectory_name(key) and is_subagent_name(key)
                           and key not in names):
            need(isinstance(obj[name], dict), ("$", name), "an ATIF trajectory must be a JSON object")
            subagents.append((("$", name), obj[name]))
        result = read_result(obj[RESULT], ("$", RESULT)) if RESULT in obj else None
    main_path, main = parts[0]
    for path, part in parts:
        _check_header(part, path)
    atif_agent = main["agent"]
    unfinished = _unfinished_trial(obj[CONFIG], ("$", CONFIG)) if result is None and CONFIG in obj else None
    name = result.agent_name if result else (unfinished or {}).get("agent") or atif_agent["name"]
    model = result.model if result else (unfinished or {}).get("model") or atif_agent.get("model_name") or None
    agent = context.agent or agent_label(name, model)
    session = main.get("session_id") if isinstance(main.get("session_id"), str) else None
    if result is not None:
        run_id, task, trial = f"{agent}/{result.task}/{result.trial}", result.task, result.trial
    elif unfinished is not None:
        task, trial = unfinished["task"], unfinished["trial"]
        run_id = f"{agent}/{task}/{trial}"
    else:
        session = session or (main.get("trajectory_id") if isinstance(main.get("trajectory_id"), str) else None)
        need(bool(session), subpath(main_path, "session_id"), "missing (a lone trajectory is named by its session)")
        # Outside a trial, ``<task>.trajectory.json`` names its task; a bare trajectory.json names none.
        stem = trajectory_stem(main_path[1]) if isinstance(main_path, tuple) else ""
        task = stem.rstrip(".") or None
        run_id, trial = f"{agent}/{task}/{session}" if task else f"{agent}/{session}", session
    run = context.new_run(run_id, "harbor", agent=agent, grading_open=result is None)
    run.named = True  # the trial (or session) is its identity
    branch = run.branch("main")
    prompt, copied = _transitions(run, branch, parts)
    for base, part in parts:  # ATIF 1.6 may embed its subagents' trajectories
        embedded = part.get("subagent_trajectories")
        if isinstance(embedded, list):
            subagents.extend((subpath(base, "subagent_trajectories", index), sub) for index, sub in enumerate(embedded))
    for index, (path, sub) in enumerate(subagents):
        need(isinstance(sub, dict), path, "a subagent trajectory must be an ATIF object")
        _check_header(sub, path)
        # A subagent's work (a summary, an answer) is read beside the run: a branch of its own, cut first.
        forked = run.branch(f"subagent-{index + 1}", "dead", parent=branch, fork_at=run.transitions(branch))
        _transitions(run, forked, [(path, sub)], prompted=True)
    last_metrics = parts[-1][1].get("final_metrics") if isinstance(parts[-1][1].get("final_metrics"), dict) else {}
    version = result.agent_version if result else atif_agent.get("version")
    metadata = scalars({
        "format": main["schema_version"], "harness": f"harbor {name} {version}" if version else f"harbor {name}",
        "model": model, "session_id": session, "continuations": len(parts) - 1 or None, "copied_steps": copied or None,
        "subagents": len(subagents) or None,
        "exception": result.exception if result else None,
        "ungraded_because": result.ungraded_because if result else None,
        "trial_finished": False if unfinished is not None else None,
        "cost": last_metrics.get("total_cost_usd"), "prompt_tokens": last_metrics.get("total_prompt_tokens"),
        "completion_tokens": last_metrics.get("total_completion_tokens")})
    # Known only once every step is read (the prompt is the first user step's text, the copied steps are counted):
    # RunStarted goes first all the same.
    run.start(task_id=task, prompt=prompt, metadata=metadata, trial=trial)
    if result is not None:
        run.events.extend(settle_events(run.run_id, True, result.grade))
    return run


def _unfinished_trial(config: Any, path: JsonPath) -> dict[str, str | None]:
    """What an unfinished trial's ``config.json`` (TrialConfig) says its ``result.json`` will name: the trial, the
    task (``task.name``, else the last part of ``task.path``), the agent's name and model (None where unsaid)."""
    need(isinstance(config, dict), path, "a Harbor config.json must be a JSON object")
    trial = get_field(config, "trial_name", path, str, "a string")
    need(trial != "", subpath(path, "trial_name"), "must not be empty")
    task_config = get_field(config, "task", path, dict, "an object")
    named = task_config.get("name")
    where = task_config.get("path")
    task = named if isinstance(named, str) and named else \
        where.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] if isinstance(where, str) else ""
    need(bool(task), subpath(path, "task"), "names no task (a task.name or task.path is expected)")
    agent = config.get("agent") if isinstance(config.get("agent"), dict) else {}
    return {"trial": trial, "task": task,
            **{ours: agent[key] if isinstance(agent.get(key), str) and agent[key] else None
               for ours, key in (("agent", "name"), ("model", "model_name"))}}


def finished_since(stored_metadata: dict[str, Any], run: ParsedRun) -> bool:
    """True when a stored run was imported from this trial before it finished and ``run`` is the finished trial:
    the same run, which its log keeps as imported (its result is attached with ``kvjudge grade``)."""
    return run.fmt == "harbor" and not run.grading_open and stored_metadata.get("trial_finished") is False


def _check_header(part: dict[str, Any], path: JsonPath) -> None:
    version = get_field(part, "schema_version", path, str, "a string such as \"ATIF-v1.6\"")
    found = _VERSION.match(version)
    need(found is not None and found.group(1) == "1", subpath(path, "schema_version"),
         f"unknown ATIF version {version!r} (this kvjudge reads ATIF-v1.x)")
    agent = get_field(part, "agent", path, dict, "an object")
    get_field(agent, "name", subpath(path, "agent"), str, "a string")
    steps = get_field(part, "steps", path, list, "a list of steps")
    need(len(steps) > 0, subpath(path, "steps"), "must not be empty")


def _transitions(run: ParsedRun, branch: str, parts: list[tuple[JsonPath, dict[str, Any]]], *,
                 prompted: bool = False) -> tuple[str | None, int]:
    """Every step of every part, checked and turned into its transitions in one pass; copied context checked, left
    out and counted. Returns the task prompt (the first user step's text, unless ``prompted``: a subagent's) and
    how many steps were copied."""
    prompt: str | None = None
    copied = 0
    for base, part in parts:
        previous = 0
        for index, step in enumerate(part["steps"]):
            source, text = _checked_step(step, base, index, previous)
            previous = step["step_id"]
            calls, outputs = _calls_and_outputs(step, base, index)
            if step.get("is_copied_context") is True:
                copied += 1
            elif source == "agent":
                _agent_step(run, branch, step, text, calls, outputs)
            elif source == "user" and not prompted:
                prompted, prompt = True, text
                run.step(branch, "user", text=with_marker(text or "", prompt, TASK_MARKER))
            else:
                run.step(branch, source, text=text)
                for name, output in outputs:
                    run.step(branch, "tool", output=(name, output, None))
    return prompt, copied


def _checked_step(step: Any, base: JsonPath, index: int, previous: int) -> tuple[str, str | None]:
    """A step's source and text, checked: an object whose ``step_id`` (a whole number from 1) follows
    ``previous``. JSON paths are built only for an error (most steps are fine)."""
    if not isinstance(step, dict):
        raise DocumentError(subpath(base, "steps", index), "must be an object")
    step_id = step.get("step_id")
    if type(step_id) is not int or step_id < 1:  # type(), not isinstance: a boolean is not a step id
        raise DocumentError(subpath(base, "steps", index, "step_id"), "must be a whole number from 1")
    if step_id <= previous:
        raise DocumentError(subpath(base, "steps", index, "step_id"),
                            f"step {step_id} comes after step {previous}: steps out of order")
    source = step.get("source")
    if source not in _SOURCES:
        raise DocumentError(subpath(base, "steps", index, "source"), f"must be one of {', '.join(_SOURCES)}")
    message = step.get("message")
    text = message if message is None or type(message) is str else \
        content_text(message, subpath(base, "steps", index, "message"))
    return source, text


def _calls_and_outputs(step: dict[str, Any], base: JsonPath,
                       index: int) -> tuple[list[tuple[str, Any]], list[tuple[str | None, str]]]:
    """A step's tool calls (function name, arguments) and observation results (the function of the call each
    names, or None; its text), each result matched to a call of its own step."""
    calls: list[tuple[str, Any]] = []
    names: dict[str, str] = {}
    for number, call in enumerate(step.get("tool_calls") or ()):
        at = subpath(base, "steps", index, "tool_calls", number)
        need(isinstance(call, dict), at, "must be an object")
        call_id = get_field(call, "tool_call_id", at, str, "a string")
        function = get_field(call, "function_name", at, str, "a string")
        calls.append((function, call.get("arguments")))
        names[call_id] = function
    outputs: list[tuple[str | None, str]] = []
    observation = step.get("observation")
    if observation is not None:
        where = subpath(base, "steps", index, "observation")
        need(isinstance(observation, dict), where, "must be an object")
        for number, result in enumerate(get_field(observation, "results", where, list, "a list")):
            if not isinstance(result, dict):
                raise DocumentError(subpath(where, "results", number), "must be an object")
            source_call = result.get("source_call_id")
            if source_call is not None and (not isinstance(source_call, str) or source_call not in names):
                raise DocumentError(subpath(where, "results", number, "source_call_id"),
                                    f"names tool call {source_call!r}, which is not among this step's tool_calls")
            content = result.get("content")
            if not (content is None or type(content) is str):
                content = content_text(content, subpath(where, "results", number, "content"))
            outputs.append((names.get(source_call) if source_call else None, content or ""))
    return calls, outputs


def _agent_step(run: ParsedRun, branch: str, step: dict[str, Any], text: str | None, calls: list[tuple[str, Any]],
                outputs: list[tuple[str | None, str]]) -> None:
    """One agent step → an assistant transition per tool call (reasoning and message on the first, with the
    step's usage), then a tool transition per observation result."""
    reasoning = step.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        text = f"{reasoning}\n\n{text}" if text else reasoning
    usage = usage_of(step.get("metrics"))
    run.step(branch, "assistant", text=text, call=calls[0] if calls else None, usage=usage)
    for call in calls[1:]:
        run.step(branch, "assistant", call=call)
    for name, output in outputs:
        run.step(branch, "tool", output=(name, output, None))


def read_trial_result(path: Path) -> TrialResult:
    """A ``result.json`` file → TrialResult; IngestError naming the file and the JSON path."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise IngestError(f"{path}: not readable JSON ({exc})") from None
    try:
        return read_result(data)
    except DocumentError as exc:
        raise IngestError(f"{path}: {exc.path}: {exc.message}") from None


FORMAT = Format(
    name="harbor", summary="Harbor trials (`result.json` beside `agent/`) and ATIF trajectories "
                           "(`[<stem>.]trajectory.json`, its continuations and subagents' trajectories)",
    recognises=is_harbor, parse=lambda obj, context, document: parse_harbor(obj, context))
