"""A run's decisive evidence: found from the folded state, measured in a view, and kept by reduction.

Runs here are hand-built (native format) or SWE-bench-shaped (mini-swe-agent 2.x files from the synthetic
writer, ingested by the real importer); token counts are chars/4, so each test is exact and quick.
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
from kvjudge.retention.reduce import plan_reduction, view_refs
from kvjudge.retention.state import LOCAL
from kvjudge.retention.worth import EXPLORATION, FINAL_MESSAGE, body_worth
from kvjudge.testing.filler import filler
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v2
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
        state = store.run("patched")
        found = find_evidence(state, store.text)
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
        first, second = (store.run(r) for r in ("answer", "unfinished"))
        found = find_evidence(first, store.text)
        assert found.submission_ref == found.final_message_ref == first.branches[0].transitions[5].text_ref
        assert found.verification is not None
        assert found.verification.output_ref == first.branches[0].transitions[3].tool_output["output_ref"]
        lines = evidence_lines(found, store.text)
        assert lines.submission == "answer" and lines.submission_lines == ("It returns the fields.",
                                                                           "Quotes are stripped.")
        ended = find_evidence(second, store.text)
        assert ended.submission_ref is None and ended.final_message_ref == second.branches[0].transitions[1].text_ref
        assert ended.verification is not None and ended.verification.runner == "make test"
        assert ended.verification.exit_code == 2 and ended.verification.call_seq == 3
        assert evidence_lines(ended, store.text).submission is None


# ---------------------------------------------------------------------------------------------- measuring
def test_a_patch_counts_its_changed_lines_never_its_file_headers() -> None:
    assert is_patch(PATCH) and not is_patch("--- a\n+++ b\nno hunk")
    assert changed_lines(PATCH) == ["-        fields.append(part)", "+        fields.append(part.strip('\"'))",
                                    "+    # quoted separators stay inside their field"]
    tricky = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n--- a comment\n+++ a comment\n keep\n"
    assert changed_lines(tricky) == ["--- a comment", "+++ a comment"]  # inside the hunk: changed lines


def test_visibility_on_hand_written_views(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [patch_run()]) as store:
        state = store.run("patched")
        lines = evidence_lines(find_evidence(state, store.text), store.text)
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
        state = store.run("angle")
        view = render_view(state, body_resolver(state, store.text))
        seen = measure(state, store.text, view, escape)
        assert "‹‹heredoc››" in view and seen.submission == "answer" and seen.whole
        assert measure(state, store.text, view).share == 0.0  # unescaped lines are not what the view shows


# ---------------------------------------------------------------------------------------------- reduction
def _view(plan: Any, store: Store) -> str:
    state = plan.state_after
    return render_view(state, body_resolver(state, lambda ref: plan.text_of(ref, store.text)))


def _swe_store(tmp_path: Path, seed: int = 7, patch_lines: int = 40) -> Store:
    episode = make_episode("repo__proj-1", seed, target_bytes=90_000, steps=45, patch_lines=patch_lines)
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps(mini_swe_agent_v2(episode)))
    store = Store.open(tmp_path / "swe.sqlite")
    store.ingest_file(path)
    return store


def _needed(state: Any, store: Store) -> int:
    """Tokens the run takes once everything but its evidence is down to markers, its evidence whole."""
    deep = plan_reduction(state, store.text, CHARS, 1)
    found = find_evidence(state, store.text)
    evidence = set(found.refs().values())
    return deep.tokens_after + sum(e.tokens_before - e.tokens_after for e in deep.events
                                   if e.kind == "Reduced" and e.original in evidence)


def test_reduction_keeps_the_patch_and_the_last_test_outcome_while_the_ceiling_allows(tmp_path: Path) -> None:
    with _swe_store(tmp_path) as store:
        state = store.run(store.run_ids()[0])
        full = sum(CHARS.count(store.text(ref)) for ref in view_refs(state))
        lines = evidence_lines(find_evidence(state, store.text), store.text)
        assert lines.submission == "patch" and len(lines.submission_lines) == 40 and lines.outcome_lines
        needed = _needed(state, store)
        assert needed < full // 3
        for target in (full - 1, full // 2, full // 4, (needed + full // 4) // 2, needed + 40, needed):
            plan = plan_reduction(state, store.text, CHARS, target)
            view = _view(plan, store)
            assert plan.fits and plan.tokens_after <= target
            for line in lines.submission_lines + lines.outcome_lines:  # on the rendered text itself
                assert escape(line) in view, (target, line)
            task = store.text(state.task_prompt_ref)
            view_lines = set(view.splitlines())
            assert all(escape(line) in view_lines for line in task.splitlines() if line.strip())
        # Tighter than that, evidence goes too, and only once everything ranked below it is down to its marker:
        # the final message, the task, the last test log, and the patch last of all.
        worth = body_worth(state, find_evidence(state, store.text), store.text)
        submission = find_evidence(state, store.text).submission_ref
        deepest = plan_reduction(state, store.text, CHARS, 1).tokens_after
        for target in (needed - 1, needed - 150, deepest + CHARS.count(store.text(submission)) // 2):
            tight = plan_reduction(state, store.text, CHARS, target)
            assert tight.fits
            cut = {e.original: tight.blobs[e.summary] for e in tight.events if e.kind == "Reduced"}
            top = max(worth[ref].rank for ref in cut)
            assert top >= FINAL_MESSAGE
            for ref in set(view_refs(state)):
                if worth[ref].rank < top:
                    assert (re.fullmatch(r"\[\d+ (?:lines?|characters?) cut\]", cut[ref]) if ref in cut
                            else CHARS.count(store.text(ref)) <= 8 + 4), ref  # at its marker, or too small to cut
        assert submission in cut and measure(state, store.text, _view(tight, store), escape).share < 1.0


def test_exploration_output_is_cut_first_and_earlier_before_later(tmp_path: Path) -> None:
    run = patch_run(size=3)
    with store_from_runs(tmp_path / "store.sqlite", [run]) as store:
        state = store.run("patched")
        full = sum(CHARS.count(store.text(ref)) for ref in view_refs(state))
        worth = body_worth(state, find_evidence(state, store.text), store.text)
        exploration = [ref for ref in dict.fromkeys(view_refs(state))
                       if worth[ref].rank == EXPLORATION and store.text(ref)]
        assert len(exploration) == 3  # ls, cat pytest.ini, nl: not the test runs (nor sed's empty output)
        plan = plan_reduction(state, store.text, CHARS, full - 600)
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
        state = store.run("r")
        full = sum(CHARS.count(store.text(ref)) for ref in view_refs(state))
        plan = plan_reduction(state, store.text, CHARS, full - 300)
        (event,) = [e for e in plan.events if e.kind == "Reduced"]
        assert event.original == state.branches[1].transitions[1].tool_output["output_ref"]


def test_planning_the_evidence_keeping_reduction_is_deterministic(tmp_path: Path) -> None:
    with _swe_store(tmp_path, seed=11) as store:
        state = store.run(store.run_ids()[0])
        for target in (3000, 6000):
            first = plan_reduction(state, store.text, CHARS, target)
            again = plan_reduction(state, store.text, CHARS, target, counts=dict(first.new_counts))
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
            state = store.run(run_id)
            return {loc.summary_ref for loc in state.bodies.values() if loc.summary_ref}

    control = summaries(tmp_path / "control" / "swe.sqlite", orphans=False)
    assert control and summaries(tmp_path / "crash" / "swe.sqlite", orphans=True) == control
    rerun = kvjudge(*args, "--store", str(tmp_path / "crash" / "swe.sqlite"), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    with Store.open(tmp_path / "control" / "swe.sqlite") as a, Store.open(tmp_path / "crash" / "swe.sqlite") as b:
        assert a.run(run_id).canonical_bytes() == b.run(run_id).canonical_bytes()
        assert all(loc.status != LOCAL or b.blobs.get(ref) is not None for ref, loc in b.run(run_id).bodies.items())
