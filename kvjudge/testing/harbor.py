"""Harbor job directories written as Harbor writes them: ``jobs/<job>/<trial>/`` with ``result.json``
(TrialResult), ``config.json`` (TrialConfig), ``trial.log``, ``agent/trajectory.json`` (ATIF, with
``trajectory.cont-N.json`` continuations after a context summary), the agent's other logs and ``verifier/``;
the job's own ``config.json``, ``result.json`` and ``job.log`` beside the trials.

Two agents' ATIF shapes: ``terminus-2`` (its JSON reply as the message, ``bash_command`` keystrokes and
``mark_task_complete`` as tool calls, terminal screens as observations, the whole prompt as the first user step)
and ``claude-code`` (reasoning, ``Bash``/``Read`` tool calls, a copy of its session JSONL under ``agent/``).
Each trial tells a :class:`~kvjudge.testing.trajectories.Episode` (realistic commands and output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.testing.trajectories import Episode, make_episode

TERMINUS_PROMPT = (
    "You are an AI assistant tasked with solving command-line tasks in a Linux environment. You will be given a "
    "task description and the output from previously executed commands. Your goal is to solve the task by "
    "providing batches of shell commands.\n\nFormat your response as JSON with the following structure:\n\n"
    '{{\n  "analysis": "…",\n  "plan": "…",\n  "commands": [{{"keystrokes": "ls -la\\n", "duration": 0.1}}],\n'
    '  "task_complete": true\n}}\n\nTask Description:\n{instruction}\n\nCurrent terminal state:\n'
    "Current Terminal Screen:\nroot@7f3c2a:/app# \n")


@dataclass
class TrialSpec:
    """One trial to write. ``reward`` is the verifier's (None with ``exception``: the verifier did not run; any
    other JSON value is written as it is, for broken files); ``continuations``: how many times the agent
    summarised its context (each starts a ``trajectory.cont-N.json``); ``finished`` False: the trial is still
    running (no ``result.json`` yet, nothing from the verifier)."""

    task: str
    agent: str = "terminus-2"  # or "claude-code"
    model: str = "anthropic/claude-sonnet-4-5-20250929"
    suffix: str = "AbC1234"
    seed: int = 0
    reward: Any = 1.0
    exception: str | None = None
    continuations: int = 0
    target_bytes: int = 6_000
    steps: int | None = None  # keep only this many of the episode's steps
    schema_version: str = "ATIF-v1.6"
    extra_result: dict[str, Any] = field(default_factory=dict)
    finished: bool = True

    @property
    def trial_name(self) -> str:
        return f"{self.task[:32]}__{self.suffix}"


def write_job(root: Path, job: str, trials: list[TrialSpec]) -> Path:
    """``root/<job>/`` with every trial of ``trials`` and the job's own files; the job directory."""
    folder = root / job
    folder.mkdir(parents=True, exist_ok=True)
    for spec in trials:
        write_trial(folder, spec)
    rewards = [t.reward for t in trials if isinstance(t.reward, int | float)]
    _json(folder / "config.json", {"job_name": job, "jobs_dir": str(root), "n_attempts": 2, "timeout_multiplier": 1.0,
                                   "orchestrator": {"type": "local", "n_concurrent_trials": 4},
                                   "agents": sorted({t.agent for t in trials}), "datasets": [{"name": "terminal-bench",
                                                                                             "version": "2.0"}]})
    _json(folder / "result.json", {"id": "6f1d0c2e-2c4b-4c1e-9a51-7d3f2f1b8e10", "started_at": "2025-11-02T10:00:00",
                                   "finished_at": "2025-11-02T11:30:00", "n_total_trials": len(trials),
                                   "stats": {"n_trials": len(trials), "n_errors": sum(bool(t.exception) for t in trials),
                                             "mean_reward": sum(rewards) / len(rewards) if rewards else None}})
    (folder / "job.log").write_text(f"Starting job {job} with {len(trials)} trials\n")
    return folder


def write_trial(job_dir: Path, spec: TrialSpec) -> Path:
    """One trial directory under ``job_dir``; its path."""
    episode = make_episode(spec.task, spec.seed, target_bytes=spec.target_bytes, model=spec.model)
    if spec.steps is not None:
        episode.steps = episode.steps[:spec.steps]
    trial = job_dir / spec.trial_name
    agent_dir = trial / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    (trial / "verifier").mkdir(exist_ok=True)
    for index, part in enumerate(trajectories(spec, episode)):
        name = "trajectory.json" if index == 0 else f"trajectory.cont-{index}.json"
        _json(agent_dir / name, part)
    config = _trial_config(spec, job_dir)
    _json(trial / "config.json", config)
    if spec.finished:
        write_result(trial, spec)
    (trial / "trial.log").write_text(f"Trial {spec.trial_name} starting\nAgent {spec.agent} finished\n")
    if spec.agent == "terminus-2":
        (agent_dir / "recording.cast").write_text('{"version": 2, "width": 160, "height": 40}\n[0.1, "o", "$ "]\n')
    else:
        sessions = agent_dir / "sessions" / "projects" / "-app"
        sessions.mkdir(parents=True, exist_ok=True)
        (sessions / "f3a1c2d4.jsonl").write_text(json.dumps({"type": "user", "sessionId": "f3a1c2d4",
                                                             "message": {"role": "user", "content": "hi"}}) + "\n")
    if spec.exception is None and spec.finished:
        (trial / "verifier" / "reward.txt").write_text(f"{spec.reward}\n")
        (trial / "verifier" / "test-stdout.txt").write_text("===== 3 passed in 0.41s =====\n")
    return trial


def write_result(trial: Path, spec: TrialSpec) -> Path:
    """The trial's ``result.json``, as Harbor writes it when the trial ends (beside the ``config.json`` written at
    its start); its path."""
    config = json.loads((trial / "config.json").read_text())
    path = trial / "result.json"
    _json(path, {**_result(spec, config, trial), **spec.extra_result})
    return path


def instruction(episode: Episode) -> str:
    return f"{episode.problem_statement}\n\nWork in /app. The tests in /tests check your change."


def trajectories(spec: TrialSpec, episode: Episode) -> list[dict[str, Any]]:
    """The trial's ATIF documents: ``trajectory.json`` and its continuations (step ids from 1 in each)."""
    first = _user_step(spec, episode)
    agent_steps = [_agent_step(spec, episode, index) for index in range(len(episode.steps))]
    agent_steps.append(_finish_step(spec))
    chunks = _split(agent_steps, spec.continuations + 1)
    documents = []
    for index, chunk in enumerate(chunks):
        steps = [first] if index == 0 else [
            {**first, "is_copied_context": True},
            {"source": "user", "message": f"Summary of the work so far (part {index}): the failing case is "
                                          f"understood; continue from the current terminal state."}]
        steps = [{"step_id": number, **step} for number, step in enumerate(steps + chunk, start=1)]
        document: dict[str, Any] = {
            "schema_version": spec.schema_version, "session_id": f"{spec.trial_name}-session",
            "agent": {"name": spec.agent, "version": "2.0.0" if spec.agent == "terminus-2" else "1.0.128",
                      "model_name": spec.model,
                      "extra": {"parser": "json", "temperature": 0.7, **({"continuation_index": index} if index else {})}},
            "steps": steps,
            "final_metrics": {"total_prompt_tokens": 2_400 * (len(steps) + 1), "total_completion_tokens": 90 * len(steps),
                              "total_cached_tokens": 1_200 * len(steps), "total_cost_usd": round(0.004 * len(steps), 4)}}
        if index < len(chunks) - 1:
            document["continued_trajectory_ref"] = f"trajectory.cont-{index + 1}.json"
        documents.append(document)
    return documents


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    size = max(1, -(-len(items) // parts))
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    return chunks + [[] for _ in range(parts - len(chunks))]


def _user_step(spec: TrialSpec, episode: Episode) -> dict[str, Any]:
    text = instruction(episode)
    if spec.agent == "terminus-2":
        text = TERMINUS_PROMPT.format(instruction=text)
    return {"timestamp": "2025-11-02T10:00:05.120000+00:00", "source": "user", "message": text}


def _agent_step(spec: TrialSpec, episode: Episode, index: int) -> dict[str, Any]:
    step = episode.steps[index]
    call_id = f"call_{index}_1" if spec.agent == "terminus-2" else f"toolu_01{index:06d}"
    metrics = {"prompt_tokens": 2_400 + 900 * index, "completion_tokens": 80 + index, "cached_tokens": 1_200 + 880 * index,
               "cost_usd": round(0.003 + 0.0004 * index, 6)}
    if spec.agent == "terminus-2":
        reply = json.dumps({"analysis": step.thought, "plan": f"Run `{step.command}`.",
                            "commands": [{"keystrokes": step.command + "\n", "duration": 1.0}],
                            "task_complete": False}, indent=2)
        return {"timestamp": f"2025-11-02T10:{index // 60 + 1:02d}:{index % 60:02d}.000000+00:00", "source": "agent",
                "model_name": spec.model, "message": reply,
                "tool_calls": [{"tool_call_id": call_id, "function_name": "bash_command",
                                "arguments": {"keystrokes": step.command + "\n", "duration": 1.0}}],
                "observation": {"results": [{"source_call_id": call_id,
                                             "content": f"New Terminal Output:\n\nroot@7f3c2a:/app# {step.command}\n"
                                                        f"{step.output}root@7f3c2a:/app# "}]},
                "metrics": metrics}
    return {"timestamp": f"2025-11-02T10:{index // 60 + 1:02d}:{index % 60:02d}.000000+00:00", "source": "agent",
            "model_name": spec.model, "message": f"I'll run `{step.command}`.", "reasoning_content": step.thought,
            "tool_calls": [{"tool_call_id": call_id, "function_name": "Bash",
                            "arguments": {"command": step.command, "description": step.thought[:60]}}],
            "observation": {"results": [{"source_call_id": call_id, "content": step.output}]},
            "metrics": metrics}


def _finish_step(spec: TrialSpec) -> dict[str, Any]:
    if spec.agent == "terminus-2":
        return {"source": "agent", "model_name": spec.model,
                "message": json.dumps({"analysis": "The tests pass.", "plan": "Done.", "commands": [],
                                       "task_complete": True}, indent=2),
                "tool_calls": [{"tool_call_id": "call_done", "function_name": "mark_task_complete", "arguments": {}}],
                "observation": {"results": [{"source_call_id": "call_done", "content": "Task marked complete."}]},
                "metrics": {"prompt_tokens": 9_000, "completion_tokens": 40}}
    return {"source": "agent", "model_name": spec.model, "message": "The change is in place and the tests pass.",
            "metrics": {"prompt_tokens": 9_000, "completion_tokens": 25}}


def _trial_config(spec: TrialSpec, job_dir: Path) -> dict[str, Any]:
    return {"task": {"path": f"tasks/{spec.task}", "git_url": "https://github.com/laude-institute/terminal-bench-2.git",
                     "git_commit_id": "9b2c4f1", "overwrite": False, "download_dir": None, "source": "terminal-bench"},
            "trial_name": spec.trial_name, "trials_dir": str(job_dir), "timeout_multiplier": 1.0,
            "agent": {"name": spec.agent, "import_path": None, "model_name": spec.model, "override_timeout_sec": None,
                      "override_setup_timeout_sec": None, "max_timeout_sec": None, "kwargs": {}},
            "environment": {"type": "docker", "import_path": None, "force_build": False, "delete": True,
                            "override_cpus": None, "override_memory_mb": None, "override_storage_mb": None,
                            "override_gpus": None, "suppress_override_warnings": False, "kwargs": {}},
            "verifier": {"override_timeout_sec": None, "max_timeout_sec": None, "disable": False},
            "job_id": "6f1d0c2e-2c4b-4c1e-9a51-7d3f2f1b8e10"}


def _result(spec: TrialSpec, config: dict[str, Any], trial: Path) -> dict[str, Any]:
    provider, _, name = spec.model.partition("/")
    exception = None
    if spec.exception is not None:
        exception = {"exception_type": spec.exception, "exception_message": f"{spec.exception} after 900.0 seconds",
                     "exception_traceback": f"Traceback (most recent call last):\n  ...\n{spec.exception}\n",
                     "occurred_at": "2025-11-02T10:15:00.000000"}
    verifier = None if spec.exception is not None and spec.reward is None else {"rewards": {"reward": spec.reward}}
    timing = {"started_at": "2025-11-02T10:00:00.000000", "finished_at": "2025-11-02T10:20:00.000000"}
    return {"id": "0b7e2a9c-5d1f-4a3b-8c6d-2e9f1a4b7c3d", "task_name": spec.task, "trial_name": spec.trial_name,
            "trial_uri": trial.resolve().as_uri(), "task_id": {"git_url": config["task"]["git_url"],
                                                             "git_commit_id": "9b2c4f1", "path": config["task"]["path"]},
            "source": "terminal-bench", "task_checksum": "5e1f0c2b9a", "config": config,
            "agent_info": {"name": spec.agent, "version": "2.0.0" if spec.agent == "terminus-2" else "1.0.128",
                           "model_info": {"name": name or provider, "provider": provider if name else "unknown"}},
            "agent_result": {"n_input_tokens": 48_000, "n_cache_tokens": 20_000, "n_output_tokens": 1_900,
                             "cost_usd": 0.21, "rollout_details": None, "metadata": {"n_episodes": 12}},
            "verifier_result": verifier, "exception_info": exception, "started_at": timing["started_at"],
            "finished_at": timing["finished_at"], "environment_setup": timing, "agent_setup": timing,
            "agent_execution": timing, "verifier": timing if verifier else None}


def _json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
