"""Runs in kvjudge's native format built from plain texts, for tests, the benchmarks and examples.

:func:`make_run` builds one run dict (see ``kvjudge/schemas/run.schema.json``) from plain texts, so a caller
controls exactly how big each body is and which branches are dead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def make_run(run_id: str, outputs: Sequence[str], *, tenant: str = "default", prompt: str | None = "Fix the bug.",
             lifecycle: Sequence[str] = ("running", "grading", "graded"), dead: Sequence[Sequence[str]] = (),
             passed: bool = True, final: str = "12 passed in 0.31s") -> dict[str, Any]:
    """A run whose live branch calls a tool once per text in ``outputs`` (the texts are the tool outputs).

    ``dead`` holds one list of tool outputs per dead branch (each forks from ``main`` at 1). The last live
    tool output ends with ``final`` so a grader can read the outcome from the tail.
    """
    transitions: list[dict[str, Any]] = [{"role": "user", "text": prompt or "Do the task."}]
    for index, output in enumerate(outputs):
        transitions.append({"role": "assistant", "text": f"Step {index}: running the tool.",
                            "tool_call": {"name": "bash", "arguments": f"step {index}"},
                            "usage": {"input_tokens": 100 + index, "output_tokens": 10},
                            "context": {"system": 20, "history": 60 + index, "tools": 20}})
        body = output + ("\n" + final if index == len(outputs) - 1 else "")
        transitions.append({"role": "tool", "tool_output": {"name": "bash", "output": body, "exit_code": 0}})
    branches: list[dict[str, Any]] = [{"id": "main", "status": "live", "parent": None, "fork_at": None,
                                       "transitions": transitions}]
    for number, texts in enumerate(dead, start=1):
        attempt = []
        for index, output in enumerate(texts):
            attempt.append({"role": "assistant", "text": f"Attempt {number}.{index}.",
                            "tool_call": {"name": "bash", "arguments": f"attempt {number} {index}"}})
            attempt.append({"role": "tool", "tool_output": {"name": "bash", "output": output, "exit_code": 1}})
        branches.append({"id": f"attempt-{number}", "status": "dead", "parent": "main", "fork_at": 1,
                         "transitions": attempt})
    return {"id": run_id, "tenant": tenant, "task": {"id": "task-" + run_id, "prompt": prompt},
            "lifecycle": list(lifecycle), "branches": branches,
            "verifier": [{"name": "pytest", "passed": passed, "detail": final}],
            "grades": [{"grader": "human", "score": 1.0 if passed else 0.0, "label": "pass" if passed else "fail"}]}

