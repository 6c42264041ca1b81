"""A run's decisive evidence: found from the folded state, measured in a view, and kept by reduction.

Runs here are hand-built (native format), or written as each harness kvjudge imports writes them (the writers in
:mod:`kvjudge.testing`) and ingested by the real importers; token counts are chars/4, so each test is exact and
quick.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import kvjudge, sql, store_from_runs

from kvjudge.judge.render import body_resolver, escape, render_view
from kvjudge.retention import Store
from kvjudge.retention.evidence import (
    changed_lines,
    evidence_lines,
    find_evidence,
    is_patch,
    measure,
    runs_tests,
    visibility,
)
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.reduce import plan_reduction, view_refs
from kvjudge.retention.state import LOCAL
from kvjudge.retention.worth import EXPLORATION, FINAL_MESSAGE, SUBMISSION, body_worth
from kvjudge.testing.filler import filler
from kvjudge.testing.graded_runs import swe_run
from kvjudge.testing.harbor import TrialSpec, write_job
from kvjudge.testing.inspect_logs import eval_spec, sample, write_json_log
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.openhands import output_line
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1, mini_swe_agent_v2, swe_agent
from kvjudge.tokens import CharsPerToken

CHARS = CharsPerToken(4)

PATCH = """diff --git a/src/rows.py b/src/rows.py
index 1a2b3c4..5d6e7f8 100644
--- a/src/rows.py
+++ b/src/rows.py
@@ -10,6 +10,7 @@ def split_row(line):
     fields = []
     for part in line.split(","):
-        fields.append(part)
+        fields.append(part.strip('"'))
+    # quoted separators stay inside their field
     return fields
 
 
"""


def step(role: str, text: str | None = None, call: tuple[str, Any] | None = None,
         output: tuple[str, int | None] | None = None) -> dict[str, Any]:
    transition: dict[str, Any] = {"role": role, "text": text}
    if call is not None:
        transition["tool_call"] = {"name": call[0], "arguments": call[1]}
    if output is not None:
        transition["tool_output"] = {"name": "bash", "output": output[0], "exit_code": output[1]}
    return transition


def native(run_id: str, transitions: list[dict[str, Any]], prompt: str = "Quoted commas split fields.",
           dead: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    branches = [{"id": "main", "status": "live", "parent": None, "fork_at": None, "transitions": transitions}]
    if dead:
        branches.append({"id": "attempt-1", "status": "dead", "parent": "main", "fork_at": 1, "transitions": dead})
    return {"id": run_id, "tenant": "default", "task": {"id": "rows", "prompt": prompt},
            "lifecycle": ["running", "grading", "graded"], "branches": branches,
            "verifier": [{"name": "pytest", "passed": True}], "grades": [{"grader": "swe-bench", "score": 1.0}]}


def patch_run(run_id: str = "patched", *, size: int = 1) -> dict[str, Any]:
    """Explore, fail a test, edit, pass it, submit a patch: every kind of evidence, with long exploration output."""
    return native(run_id, [
        step("user", "Quoted commas split fields."),
        step("assistant", "Let me look around.", ("bash", "ls -R")),
        step("tool", output=(filler(1, 400 * size), 0)),
        step("assistant", "The settings.", ("bash", "cat pytest.ini")),  # names pytest, runs nothing
        step("tool", output=(filler(2, 400 * size), 0)),
        step("assistant", "Run the tests.", ("bash", "cd /testbed && python -m pytest tests/test_rows.py -q")),
        step("tool", output=(filler(3, 300 * size) + "\nFAILED tests/test_rows.py::test_quoted\n1 failed in 0.05s\n",
                             1)),
        step("assistant", "Read the module.", ("bash", "nl -ba src/rows.py")),
        step("tool", output=(filler(4, 600 * size), 0)),
        step("assistant", "Strip the quotes.", ("bash", "sed -i 's/part)/part.strip()/' src/rows.py")),
        step("tool", output=("", 0)),
        step("assistant", "Run them again.", ("bash", {"command": "timeout 60 pytest tests/test_rows.py -q"})),
        step("tool", output=(filler(5, 200 * size) + "\ntests/test_rows.py ..\n2 passed in 0.04s\n", 0)),
        step("assistant", "split_row now strips the quotes around each field; both tests pass.",
             ("submit", PATCH)),
    ])


# ------------------------------------------------------------------------------------------------ finding
def test_the_evidence_of_a_run_that_submits_a_patch(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [patch_run()]) as store:
        state = store.runs.run("patched")
        found = find_evidence(state, store.blobs.text)
        main = state.branches[0].transitions
    assert found.branch == "main" and found.task_ref == state.task_prompt_ref
    assert found.submission_ref == main[13].tool_call["arguments_ref"]
    assert found.final_message_ref == main[13].text_ref
    verification = found.verification
    assert verification is not None and verification.runner == "pytest"  # JSON arguments, through `timeout 60`
    assert (verification.call_seq, verification.output_ref, verification.exit_code) == (
        11, main[12].tool_output["output_ref"], 0)
    assert set(found.refs()) == {"task", "submission", "verification", "final_message"}


@pytest.mark.parametrize(("command", "runner"), [
    ("pytest -q", "pytest"), ("cd /testbed && python3 -m pytest tests/x.py", "python -m pytest/unittest/tox/nox"),
    ("python -m unittest discover", "python -m pytest/unittest/tox/nox"), ("tox -e py311", "tox/nox"),
    ("make -C build test", "make test"), ("yarn test --watch=false", "npm/yarn/pnpm test"),
    ("npm run test", "npm/yarn/pnpm test"), ("go test ./...", "go test"), ("cargo test --release", "cargo test"),
    ("./tests/runtests.py admin_views", "project test runner"), ("bin/test sympy/core", "project test runner"),
    ("FOO=1 python reproduce_issue.py", "test or reproduce script"),
    ("cat pytest.ini", None), ("grep -rn pytest .", None), ("nl -ba tests/test_rows.py", None),
    ("python -c 'print(1)'", None), ("make install", None), ("ls tests/", None),
    ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached", None),
])
def test_which_commands_run_tests(command: str, runner: str | None) -> None:
    assert runs_tests(command) == runner


def test_a_final_answer_a_run_that_submits_nothing_and_paired_outputs(tmp_path: Path) -> None:
    answer = native("answer", [
        step("user", "What does split_row return?"),
        step("assistant", None, ("bash", "pytest -q")),  # a call and its output on separate transitions
        step("assistant", None, ("bash", "ls")),          # a second call before either output
        step("tool", output=("5 passed in 0.01s", 0)),    # answers the first call (first in, first out)
        step("tool", output=("README", 0)),
        step("assistant", "It returns the fields.\n\nQuotes are stripped."),
    ])
    unfinished = native("unfinished", [
        step("user", "Fix it."),
        step("assistant", "Testing.", ("bash", "go test ./...")),
        step("tool", output=("ok  rows 0.01s", 0)),
        step("tool", "", ("bash", "make check"), ("FAIL rows", 2)),  # call and output on one transition
    ])
    with store_from_runs(tmp_path / "store.sqlite", [answer, unfinished]) as store:
        first, second = (store.runs.run(r) for r in ("answer", "unfinished"))
        found = find_evidence(first, store.blobs.text)
        assert found.submission_ref == found.final_message_ref == first.branches[0].transitions[5].text_ref
        assert found.verification is not None
        assert found.verification.output_ref == first.branches[0].transitions[3].tool_output["output_ref"]
        lines = evidence_lines(found, store.blobs.text)
        assert lines.submission == "answer" and lines.submission_lines == ("It returns the fields.",
                                                                           "Quotes are stripped.")
        ended = find_evidence(second, store.blobs.text)
        assert ended.submission_ref is None and ended.final_message_ref == second.branches[0].transitions[1].text_ref
        assert ended.verification is not None and ended.verification.runner == "make test"
        assert ended.verification.exit_code == 2 and ended.verification.call_seq == 3
        assert evidence_lines(ended, store.blobs.text).submission is None


def _written(tmp_path: Path, harness: str) -> tuple[Path, Any]:
    """A run as ``harness`` writes it (for kvjudge's importer), and the submission kvjudge must find in it:
    ``("patch", its changed lines)`` or ``("answer", its non-blank lines)``."""
    episode = make_episode("repo__proj-1", 5, target_bytes=6_000, steps=8, patch_lines=6)
    patch = ("patch", tuple(changed_lines(episode.patch)))
    if harness == "native":  # the patch is the output of mini-swe-agent's submit command, as a native run has it
        graded = swe_run("native/repo__proj-1", task="repo__proj-1", passed=True, explore=2)
        write_jsonl(tmp_path / "runs.jsonl", [graded.run])
        return tmp_path / "runs.jsonl", ("patch", tuple(changed_lines(graded.patch)))
    if harness.startswith(("mini-swe-agent", "swe-agent")):
        document = {"mini-swe-agent 1": mini_swe_agent_v1, "swe-agent": swe_agent,
                    "mini-swe-agent 2": mini_swe_agent_v2,
                    "mini-swe-agent 2 text": lambda e: mini_swe_agent_v2(e, tool_calls=False)}[harness](episode)
        path = tmp_path / ("run.traj" if harness == "swe-agent" else "run.traj.json")
        path.write_text(json.dumps(document))
        return path, patch
    if harness == "openhands":
        write_jsonl(tmp_path / "output.jsonl", [output_line(episode, "claude-sonnet-4-5")])
        return tmp_path / "output.jsonl", patch
    if harness.startswith("harbor"):
        agent = harness.split()[1]
        job = write_job(tmp_path / "jobs", "j", [TrialSpec("hello-world", agent=agent, seed=2, steps=4)])
        if agent == "claude-code":  # ends on the agent's last message
            return job, ("answer", ("The change is in place and the tests pass.",))
        # Terminus ends on mark_task_complete(), no arguments: its answer is the message that made the call.
        message = json.dumps({"analysis": "The tests pass.", "plan": "Done.", "commands": [], "task_complete": True},
                             indent=2)
        return job, ("answer", tuple(message.splitlines()))
    if harness == "inspect":
        model = "openai/gpt-4o"
        path = write_json_log(tmp_path / "log.json", eval_spec("csv", model),
                              [sample(episode, 1, 1, model=model)])
        return path, ("answer", ("ANSWER: a,b",))
    assert harness == "openai chat"
    chat = {"id": "chat-1", "messages": [
        {"role": "user", "content": "Why do quoted fields split?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat rows.py"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "def split_row(line): return line.split(',')"},
        {"role": "assistant", "content": "split_row splits on every comma.\nQuotes are not read."}]}
    write_jsonl(tmp_path / "chat.jsonl", [chat])
    return tmp_path / "chat.jsonl", ("answer", ("split_row splits on every comma.", "Quotes are not read."))


@pytest.mark.parametrize("harness", ["native", "mini-swe-agent 1", "mini-swe-agent 2", "mini-swe-agent 2 text",
                                     "swe-agent", "openhands", "harbor claude-code", "harbor terminus-2", "inspect",
                                     "openai chat"])
def test_the_final_submission_is_found_in_every_shape_kvjudge_imports(tmp_path: Path, harness: str) -> None:
    path, (kind, lines) = _written(tmp_path, harness)
    with Store.open(tmp_path / "store.sqlite") as store:
        [run_id] = ingest_paths(store, [path]).runs
        state = store.runs.run(run_id)
        found = find_evidence(state, store.blobs.text)
        last = state.branches[0].transitions[-1]
        assert found.submission_ref in {last.text_ref, (last.tool_call or {}).get("arguments_ref"),
                                        (last.tool_output or {}).get("output_ref"),
                                        state.branches[0].transitions[-2].text_ref}  # its last transition
        submitted = evidence_lines(found, store.blobs.text)
        assert (submitted.submission, submitted.submission_lines) == (kind, lines)
        # Reduction keeps it longest: the submission is the last body to be cut.
        assert body_worth(state, found, store.blobs.text)[found.submission_ref].rank == SUBMISSION


def test_a_run_that_ends_on_a_submit_commands_output_submitted_it(tmp_path: Path) -> None:
    sentinel = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    runs = {
        # The sentinel in the command (JSON arguments), mini-swe-agent's older word in the output.
        "json": [step("assistant", "Submit.", ("bash", {"command": "echo MINI_SWE_AGENT_FINAL_OUTPUT; git diff"})),
                 step("tool", output=("MINI_SWE_AGENT_FINAL_OUTPUT\n" + PATCH, 0))],
        "diff": [step("assistant", "The change.", ("bash", "git diff")), step("tool", output=(PATCH, 0))],
        # SWE-agent's bare submit command, its call and output on one transition.
        "bare": [step("tool", None, ("bash", "submit\n"), ("Submitted; nothing changed.", 0))],
        # An output that starts with the sentinel answers no known call: it is the submission all the same.
        "word": [step("tool", output=(f"\n{sentinel}\nNo changes.", 0))],
        # inspect's submit tool echoes what it was given: the submission is the call's arguments.
        "echo": [step("assistant", "Done.", ("submit", {"answer": "42"})), step("tool", output=("42", None))],
        # Whatever ran last is no submission when its command and output are none.
        "cat": [step("assistant", "Read it.", ("bash", "git diff")), step("tool", output=(PATCH, 0)),
                step("assistant", "And the module.", ("bash", "cat src/rows.py")),
                step("tool", output=("def split_row(line):", 0))],
    }
    with store_from_runs(tmp_path / "store.sqlite", [native(name, [step("user", "Fix it."), *transitions])
                                                      for name, transitions in runs.items()]) as store:
        def submitted(name: str) -> tuple[str | None, str | None, Any]:
            state = store.runs.run(name)
            found = find_evidence(state, store.blobs.text)
            lines = evidence_lines(found, store.blobs.text)
            last = state.branches[0].transitions[-1]
            where = next((place for place, ref in (("output", (last.tool_output or {}).get("output_ref")),
                                                   ("arguments", (state.branches[0].transitions[-2].tool_call or {})
                                                    .get("arguments_ref"))) if ref == found.submission_ref), None)
            return where, lines.submission, lines.submission_lines

        patch = tuple(changed_lines(PATCH))
        assert submitted("json") == ("output", "patch", patch)
        assert submitted("diff") == ("output", "patch", patch)
        assert submitted("bare") == ("output", "answer", ("Submitted; nothing changed.",))
        assert submitted("word") == ("output", "answer", (sentinel, "No changes."))
        assert submitted("echo") == ("arguments", "answer", ('{"answer":"42"}',))
        assert submitted("cat") == (None, None, None)


def test_reduction_keeps_a_native_runs_submitted_patch_whole_and_cuts_exploration_first(tmp_path: Path) -> None:
    graded = swe_run("native/repo__proj-1", task="repo__proj-1", passed=False, explore=6, file_lines=80)
    with store_from_runs(tmp_path / "store.sqlite", [graded.run]) as store:
        state = store.runs.run(graded.id)
        full = sum(CHARS.count(store.blobs.text(ref)) for ref in view_refs(state))
        needed = _needed(state, store)
        assert needed < full // 3
        plan = plan_reduction(state, store.blobs.text, CHARS, needed)
        view = _view(plan, store)
        assert plan.fits and all(escape(line) in view.splitlines() for line in graded.patch.splitlines())
        assert escape(graded.outcome) in view
        cut = {e.original for e in plan.events if e.kind == "Reduced"}
        explored = [t.tool_output["output_ref"] for t in state.branches[0].transitions[3:15:2]]
        assert set(explored) <= cut  # the six file dumps went to make room
        assert measure(state, store.blobs.text, view, escape).whole


# ---------------------------------------------------------------------------------------------- measuring
def test_a_patch_counts_its_changed_lines_never_its_file_headers() -> None:
    assert is_patch(PATCH) and not is_patch("--- a\n+++ b\nno hunk")
    assert changed_lines(PATCH) == ["-        fields.append(part)", "+        fields.append(part.strip('\"'))",
                                    "+    # quoted separators stay inside their field"]
    tricky = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n--- a comment\n+++ a comment\n keep\n"
    assert changed_lines(tricky) == ["--- a comment", "+++ a comment"]  # inside the hunk: changed lines


def test_visibility_on_hand_written_views(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [patch_run()]) as store:
        state = store.runs.run("patched")
        lines = evidence_lines(find_evidence(state, store.blobs.text), store.blobs.text)
    assert lines.submission == "patch" and len(lines.submission_lines) == 3
    assert lines.outcome_lines[-2:] == ("tests/test_rows.py ..", "2 passed in 0.04s")
    whole = "  -> calls submit: " + PATCH.replace("\n", "\n  ") + "\n" + "\n".join(lines.outcome_lines)
    seen = visibility(lines, whole)
    assert (seen.lines, seen.visible, seen.share, seen.whole, seen.outcome_visible) == (3, 3, 1.0, True, True)
    cut = whole.replace("+    # quoted separators stay inside their field", "[1 line cut]").replace(
        "2 passed in 0.04s", "[1 line cut]")
    seen = visibility(lines, cut)
    assert (seen.visible, round(seen.share, 3), seen.whole, seen.outcome_visible) == (2, 0.667, False, False)
    # A changed line is counted once, however often the view repeats it elsewhere.
    twice = cut + "\n+        fields.append(part.strip('\"'))"
    assert visibility(lines, twice).visible == 2
    assert visibility(lines, "nothing here").share == 0.0


def test_visibility_reads_escaped_run_text_and_a_first_line_after_its_label(tmp_path: Path) -> None:
    run = native("angle", [step("user", "Fix it."),
                           step("assistant", "Done: use <<heredoc>> markers.\nThen >>> prompts.")])
    with store_from_runs(tmp_path / "store.sqlite", [run]) as store:
        state = store.runs.run("angle")
        view = render_view(state, body_resolver(state, store.blobs.text))
        seen = measure(state, store.blobs.text, view, escape)
        assert "‹‹heredoc››" in view and seen.submission == "answer" and seen.whole
        assert measure(state, store.blobs.text, view).share == 0.0  # unescaped lines are not what the view shows


# ---------------------------------------------------------------------------------------------- reduction
def _view(plan: Any, store: Store) -> str:
    state = plan.state_after
    return render_view(state, body_resolver(state, lambda ref: plan.text_of(ref, store.blobs.text)))


def _swe_store(tmp_path: Path, seed: int = 7, patch_lines: int = 40) -> Store:
    episode = make_episode("repo__proj-1", seed, target_bytes=90_000, steps=45, patch_lines=patch_lines)
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps(mini_swe_agent_v2(episode)))
    store = Store.open(tmp_path / "swe.sqlite")
    ingest_paths(store, [path]).runs
    return store


def _needed(state: Any, store: Store) -> int:
    """Tokens the run takes once everything but its evidence is down to markers, its evidence whole."""
    deep = plan_reduction(state, store.blobs.text, CHARS, 1)
    found = find_evidence(state, store.blobs.text)
    evidence = set(found.refs().values())
    return deep.tokens_after + sum(e.tokens_before - e.tokens_after for e in deep.events
                                   if e.kind == "Reduced" and e.original in evidence)


def test_reduction_keeps_the_patch_and_the_last_test_outcome_while_the_ceiling_allows(tmp_path: Path) -> None:
    with _swe_store(tmp_path) as store:
        state = store.runs.run(store.runs.run_ids()[0])
        full = sum(CHARS.count(store.blobs.text(ref)) for ref in view_refs(state))
        lines = evidence_lines(find_evidence(state, store.blobs.text), store.blobs.text)
        assert lines.submission == "patch" and len(lines.submission_lines) == 40 and lines.outcome_lines
        needed = _needed(state, store)
        assert needed < full // 3
        for target in (full - 1, full // 2, full // 4, (needed + full // 4) // 2, needed + 40, needed):
            plan = plan_reduction(state, store.blobs.text, CHARS, target)
            view = _view(plan, store)
            assert plan.fits and plan.tokens_after <= target
            for line in lines.submission_lines + lines.outcome_lines:  # on the rendered text itself
                assert escape(line) in view, (target, line)
            task = store.blobs.text(state.task_prompt_ref)
            view_lines = set(view.splitlines())
            assert all(escape(line) in view_lines for line in task.splitlines() if line.strip())
        # Tighter than that, evidence goes too, and only once everything ranked below it is down to its marker:
        # the final message, the task, the last test log, and the patch last of all.
        worth = body_worth(state, find_evidence(state, store.blobs.text), store.blobs.text)
        submission = find_evidence(state, store.blobs.text).submission_ref
        deepest = plan_reduction(state, store.blobs.text, CHARS, 1).tokens_after
        for target in (needed - 1, needed - 150, deepest + CHARS.count(store.blobs.text(submission)) // 2):
            tight = plan_reduction(state, store.blobs.text, CHARS, target)
            assert tight.fits
            cut = {e.original: tight.blobs[e.summary] for e in tight.events if e.kind == "Reduced"}
            top = max(worth[ref].rank for ref in cut)
            assert top >= FINAL_MESSAGE
            for ref in set(view_refs(state)):
                if worth[ref].rank < top:
                    assert (re.fullmatch(r"\[\d+ (?:lines?|characters?) cut\]", cut[ref]) if ref in cut
                            else CHARS.count(store.blobs.text(ref)) <= 8 + 4), ref  # at its marker, or too small to cut
        assert submission in cut and measure(state, store.blobs.text, _view(tight, store), escape).share < 1.0


def test_exploration_output_is_cut_first_and_earlier_before_later(tmp_path: Path) -> None:
    run = patch_run(size=3)
    with store_from_runs(tmp_path / "store.sqlite", [run]) as store:
        state = store.runs.run("patched")
        full = sum(CHARS.count(store.blobs.text(ref)) for ref in view_refs(state))
        worth = body_worth(state, find_evidence(state, store.blobs.text), store.blobs.text)
        exploration = [ref for ref in dict.fromkeys(view_refs(state))
                       if worth[ref].rank == EXPLORATION and store.blobs.text(ref)]
        assert len(exploration) == 3  # ls, cat pytest.ini, nl: not the test runs (nor sed's empty output)
        plan = plan_reduction(state, store.blobs.text, CHARS, full - 600)
        cut = {e.original: e for e in plan.events if e.kind == "Reduced"}
        assert cut and set(cut) <= set(exploration)  # nothing else was touched
        kept = [cut[ref].tokens_after / cut[ref].tokens_before if ref in cut else 1.0 for ref in exploration]
        assert kept == sorted(kept) and kept[0] < kept[-1]  # the earliest lost the most
        view = _view(plan, store)
        assert "1 failed in 0.05s" in view and "2 passed in 0.04s" in view
        assert all(escape(line) in view for line in changed_lines(PATCH))
        markers = re.findall(r"\[\d+ (?:lines|characters) cut\]", view)
        assert markers and all(CHARS.count(m) <= 6 for m in markers)  # a few tokens, never a ref


def test_dead_branches_and_their_bodies_go_before_the_live_branch(tmp_path: Path) -> None:
    dead = [step("assistant", "Try regex.", ("bash", "cat src/rows.py")), step("tool", output=(filler(9, 500), 0))]
    with store_from_runs(tmp_path / "store.sqlite", [native("r", patch_run()["branches"][0]["transitions"],
                                                           dead=dead)]) as store:
        state = store.runs.run("r")
        full = sum(CHARS.count(store.blobs.text(ref)) for ref in view_refs(state))
        plan = plan_reduction(state, store.blobs.text, CHARS, full - 300)
        (event,) = [e for e in plan.events if e.kind == "Reduced"]
        assert event.original == state.branches[1].transitions[1].tool_output["output_ref"]


def test_planning_the_evidence_keeping_reduction_is_deterministic(tmp_path: Path) -> None:
    with _swe_store(tmp_path, seed=11) as store:
        state = store.runs.run(store.runs.run_ids()[0])
        for target in (3000, 6000):
            first = plan_reduction(state, store.blobs.text, CHARS, target)
            again = plan_reduction(state, store.blobs.text, CHARS, target, counts=dict(first.new_counts))
            assert first.events == again.events and dict(first.blobs) == dict(again.blobs) and first.fits


def test_a_crashed_reduction_of_a_swe_run_writes_the_same_blobs_when_run_again(
        tmp_path: Path, capabilities: dict[int, Path]) -> None:
    config = tmp_path / "kvjudge.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    for name in ("control", "crash"):
        (tmp_path / name).mkdir()
        _swe_store(tmp_path / name, seed=3).close()
    run_id = "anthropic/claude-sonnet-4-5-20250929/repo__proj-1"
    args = ["reduce", run_id, "--ceiling", "4000", "--capabilities", str(capabilities[160_000]),
            "--config", str(config), "--json"]
    ok = kvjudge(*args, "--store", str(tmp_path / "control" / "swe.sqlite"), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    crashed = kvjudge(*args, "--store", str(tmp_path / "crash" / "swe.sqlite"), cwd=tmp_path,
                      faults="after_put_summary")
    assert crashed.returncode == -9, crashed.stderr

    def summaries(path: Path, *, orphans: bool) -> set[str]:
        with Store.open(path) as store:
            if orphans:  # put, and named by no event yet
                rows = sql(store).execute("SELECT ref FROM blobs WHERE body IS NOT NULL AND ref NOT IN "
                                                "(SELECT ref FROM run_bodies)").fetchall()
                return {row[0] for row in rows}
            state = store.runs.run(run_id)
            return {loc.summary_ref for loc in state.bodies.values() if loc.summary_ref}

    control = summaries(tmp_path / "control" / "swe.sqlite", orphans=False)
    assert control and summaries(tmp_path / "crash" / "swe.sqlite", orphans=True) == control
    rerun = kvjudge(*args, "--store", str(tmp_path / "crash" / "swe.sqlite"), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    with Store.open(tmp_path / "control" / "swe.sqlite") as a, Store.open(tmp_path / "crash" / "swe.sqlite") as b:
        assert a.runs.run(run_id).canonical_bytes() == b.runs.run(run_id).canonical_bytes()
        assert all(loc.status != LOCAL or b.blobs.get(ref) is not None for ref, loc in b.runs.run(run_id).bodies.items())
