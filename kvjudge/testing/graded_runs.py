"""SWE-bench-shaped runs in kvjudge's native format, each with its entry in a simulated judge's answer key.

A run explores the repository (``cat`` of source files), runs the tests once (a pytest log whose last line is the
outcome) and submits its final patch (the output of ``git diff --cached``, as mini-swe-agent's submission prints
it): the patch and that outcome line are what decides its grade, so they are its evidence in the key
(:func:`kvjudge.testing.sim_key.key_entry`). Everything is drawn from a seed, so the same arguments give the same
bytes; the task's problem statement depends on the task alone, so runs of one task share it.

Sizes are in lines: ``explore`` source files of ``file_lines`` lines each (≈ 10 tokens a line), a patch with
``changed`` changed lines, a test log of ≈ 20 lines.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.sim_key import KeyEntry, key_entry, write_key

_WORDS = ("field", "row", "quote", "sep", "cache", "token", "value", "index", "buffer", "parse", "merge", "split",
          "column", "reader", "writer", "header", "record", "limit", "state", "entry", "node", "path", "name")
_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"


@dataclass(frozen=True)
class GradedRun:
    """A native run (a dict for ``kvjudge ingest``) and its answer-key entry."""

    run: dict[str, Any]
    key: KeyEntry
    patch: str
    outcome: str

    @property
    def id(self) -> str:
        return str(self.run["id"])


def _seed(*parts: Any) -> int:
    return zlib.crc32(json.dumps(parts).encode("utf-8"))


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"


def _code_line(rng: random.Random, indent: int = 4) -> str:
    pad = " " * indent
    shape = rng.randrange(6)
    a, b, c = _name(rng), _name(rng), rng.choice(_WORDS)
    if shape == 0:
        return f"{pad}{a} = {b}({c}, {rng.randrange(100)})"
    if shape == 1:
        return f"{pad}if {a} is None:"
    if shape == 2:
        return f"{pad}return self.{a}[{c}]"
    if shape == 3:
        return f"{pad}# {c} {rng.choice(_WORDS)} before the {rng.choice(_WORDS)} is read"
    if shape == 4:
        return f"{pad}for {c} in self.{a}:"
    return f"{pad}{a}.append({b}.{c})"


def source_file(seed: int, lines: int) -> str:
    """A Python module of about ``lines`` lines (deterministic per seed)."""
    rng = random.Random(seed)
    out = ['"""Helpers for reading and writing delimited files."""', "", "import re", ""]
    while len(out) < lines:
        out += ["", f"def {_name(rng)}(self, {rng.choice(_WORDS)}):"]
        out += [_code_line(rng) for _ in range(rng.randrange(3, 9))]
    return "\n".join(out[:lines])


def final_patch(seed: int, path: str, changed: int) -> tuple[str, str]:
    """A unified diff with ``changed`` changed lines (about a third removed, the rest added), and its ``index``
    line: the blob hashes drawn from ``seed`` make it a line no other patch has (the run's marker), near the top
    of the patch where a head-and-tail extract keeps it."""
    rng = random.Random(seed)
    removed = max(1, changed // 3)
    added = max(1, changed - removed)
    index = f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644"
    start = rng.randrange(20, 400)
    lines = [f"diff --git a/{path} b/{path}", index, f"--- a/{path}", f"+++ b/{path}",
             f"@@ -{start},{removed + 6} +{start},{added + 6} @@ def {_name(rng)}(self, {rng.choice(_WORDS)}):"]
    lines += [" " + _code_line(rng) for _ in range(3)]
    lines += ["-" + _code_line(rng) for _ in range(removed)]
    lines += ["+" + _code_line(rng) for _ in range(added)]
    lines += [" " + _code_line(rng) for _ in range(3)]
    return "\n".join(lines) + "\n", index


def pytest_log(seed: int, test_path: str, passed: bool) -> tuple[str, str]:
    """A pytest log of one test file, and its outcome line (the last line)."""
    rng = random.Random(seed)
    total = rng.randrange(20, 80)
    failed = 0 if passed else rng.randrange(1, 4)
    seconds = rng.randrange(150, 4000) / 1000
    dots = "".join("F" if i < failed else "." for i in rng.sample(range(total), total))
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
             f"rootdir: /testbed (run {rng.getrandbits(32):08x})", f"collected {total} items", "",
             f"{test_path} {dots}"]
    for number in range(failed):
        name = f"test_{_name(rng)}"
        lines += ["", f"___________________________ {name} ___________________________", "",
                  f"    def {name}():", f">       assert {_name(rng)}('a,b') == ['a', 'b']",
                  "E       AssertionError: assert ['a,b'] == ['a', 'b']", "",
                  f"{test_path}:{rng.randrange(10, 300)}: AssertionError"]
    if failed:
        outcome = f"==== {failed} failed, {total - failed} passed in {seconds:.2f}s ===="
    else:
        outcome = f"==== {total} passed in {seconds:.2f}s ===="
    return "\n".join([*lines, outcome]), outcome


def _step(thought: str, command: str, output: str, exit_code: int = 0) -> list[dict[str, Any]]:
    return [{"role": "assistant", "text": f"THOUGHT: {thought}\n\n```bash\n{command}\n```",
             "tool_call": {"name": "bash", "arguments": command}},
            {"role": "tool", "tool_output": {"name": "bash", "output": output, "exit_code": exit_code}}]


def swe_run(run_id: str, *, task: str, passed: bool, agent: str | None = None, seed: int = 0, explore: int = 4,
            file_lines: int = 40, changed: int = 12, tenant: str = "default") -> GradedRun:
    """One graded run of ``task`` (SWE-bench's resolved: grade 1.0, else 0.0) and its key entry."""
    rng = random.Random(_seed(run_id, seed))
    module = f"src/{rng.choice(_WORDS)}/{_name(rng)}.py"
    test_path = f"tests/test_{_name(rng)}.py"
    problem = (f"{task}: {filler(_seed(task) % 100_000, 60)}\n\nSteps to reproduce: call the reader on a quoted "
               f"field. Expected the separator inside quotes to be kept.")
    transitions: list[dict[str, Any]] = [
        {"role": "system", "text": "You are a helpful assistant that can interact with a computer shell to solve "
                                   "programming tasks."},
        {"role": "user", "text": f"Consider the following PR description:\n{problem}"}]
    for number in range(explore):
        path = module if number == 0 else f"src/{rng.choice(_WORDS)}/{_name(rng)}.py"
        transitions += _step(f"Let me read {path} to see how it handles this.", f"cat {path}",
                             source_file(rng.getrandbits(32), file_lines))
    patch, marker = final_patch(rng.getrandbits(32), module, changed)
    log, outcome = pytest_log(rng.getrandbits(32), test_path, passed)
    transitions += _step("I edited the reader; now let me run its tests.", f"python -m pytest {test_path} -q",
                         log, 0 if passed else 1)
    transitions += _step("The change is ready; submitting it.", _SUBMIT, patch)
    grade = 1.0 if passed else 0.0
    run = {"id": run_id, "tenant": tenant, "agent": agent, "task": {"id": task, "prompt": problem},
           "lifecycle": ["running", "grading", "graded"],
           "branches": [{"id": "main", "status": "live", "parent": None, "fork_at": None,
                         "transitions": transitions}],
           "verifier": [{"name": "swebench", "passed": passed,
                         "detail": "FAIL_TO_PASS and PASS_TO_PASS pass" if passed else "FAIL_TO_PASS fails"}],
           "grades": [{"grader": "swebench", "score": grade, "label": "resolved" if passed else "unresolved"}]}
    entry = key_entry(marker=marker, grade=grade, patch=patch, outcome=outcome, run=run_id)
    return GradedRun(run=run, key=entry, patch=patch, outcome=outcome)


def write_graded(directory: str | Path, runs: Iterable[GradedRun], *, name: str = "runs") -> tuple[Path, Path]:
    """``<name>.jsonl`` (the runs, for ``kvjudge ingest``) and ``<name>.key.json`` (the answer key) in
    ``directory``."""
    runs = list(runs)
    directory = Path(directory)
    runs_path, key_path = directory / f"{name}.jsonl", directory / f"{name}.key.json"
    write_key(key_path, [r.key for r in runs])
    write_jsonl(runs_path, [r.run for r in runs])
    return runs_path, key_path
