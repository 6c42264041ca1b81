"""What the judge reads of a pair: text both runs share quoted once, packing token-exact with it, the evidence each
view keeps (on the verdict, in still-grades and in eval), and `kvjudge show --judge-view` — the same view.

Token counts use the bundled models' own tokenizers (vocab only: no weights), except in the `show --judge-view`
tests: one judges a pair with the default model to catch the prompt it really evaluates, one counts through a
simulated judge's server (:mod:`kvjudge.testing.sim_judge`: no model loads) to fit views within `--allowance`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import cli_json, store_from_runs

from kvjudge.cli import main
from kvjudge.judge import Judge, LlamaBackend, Verdict
from kvjudge.judge.pack import base_view, pack_pair
from kvjudge.judge.verdict import OrderScore
from kvjudge.judge.evaluate import evaluate
from kvjudge.judge.prompt import COMMON_CLOSING, COMMON_OPENING, RAW, closing, opening
from kvjudge.judge.stillgrades import still_grades
from kvjudge.retention import Store
from kvjudge.testing.filler import filler
from kvjudge.testing.graded_runs import swe_run
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudge, key_entry, write_key

SYSTEM = ("You are a careful software engineer. Work in small steps, run the tests after every change, and never "
          "edit the tests themselves. When you are done, submit a unified diff of your change.")
TASK = ("split_row() breaks CSV lines whose fields contain quoted commas or doubled quotes. Fix it so that "
        "tests/test_rows.py passes; keep the public signature of split_row unchanged.")


def patch(seed: int) -> str:
    return ("diff --git a/rows.py b/rows.py\n--- a/rows.py\n+++ b/rows.py\n@@ -1,4 +1,5 @@\n import csv\n"
            "-def split_row(line):\n-    return line.split(\",\")\n+def split_row(line: str) -> list[str]:\n"
            f"+    return next(csv.reader([line]))  # attempt {seed}\n+\n \n")


def harness_run(run_id: str, seed: int, *, size: int = 300, task: str = TASK, system: str | None = SYSTEM,
                passed: bool = True) -> dict[str, Any]:
    """A run as a harness writes it: its system prompt, the task, exploration, a test run, a patch."""
    transitions: list[dict[str, Any]] = []
    if system:
        transitions.append({"role": "system", "text": system})
    transitions += [
        {"role": "user", "text": task},
        {"role": "assistant", "text": "Read the module.", "tool_call": {"name": "bash", "arguments": "cat rows.py"}},
        {"role": "tool", "tool_output": {"name": "bash", "output": filler(seed, size), "exit_code": 0}},
        {"role": "assistant", "text": "Run the tests.", "tool_call": {"name": "bash", "arguments": "pytest -q"}},
        {"role": "tool", "tool_output": {"name": "bash", "exit_code": 0 if passed else 1,
                                         "output": filler(seed + 1, size // 3) + (
                                             "\n3 passed in 0.04s" if passed else "\n2 failed, 1 passed in 0.05s")}},
        {"role": "assistant", "text": "Done.", "tool_call": {"name": "submit", "arguments": patch(seed)}},
    ]
    return {"id": run_id, "tenant": "default", "task": {"id": "rows", "prompt": task},
            "lifecycle": ["running", "grading", "graded"],
            "branches": [{"id": "main", "status": "live", "parent": None, "fork_at": None,
                          "transitions": transitions}],
            "verifier": [{"name": "pytest", "passed": passed}],
            "grades": [{"grader": "swe-bench", "score": 1.0 if passed else 0.0}]}


@pytest.fixture(scope="module")
def judge_backend() -> Any:
    from kvjudge import models

    backend = LlamaBackend(model_path=models.judge_model_path())  # vocab only: counts and framing
    yield backend
    backend.close()


@pytest.fixture
def store(tmp_path: Path) -> Any:
    runs = [harness_run("a", 1), harness_run("b", 2, passed=False), harness_run("c", 3, task="Fix the bug.",
                                                                              system=None)]
    with store_from_runs(tmp_path / "store.sqlite", runs) as opened:
        yield opened


def _bases(store: Any, count: Any, *runs: str) -> list[Any]:
    return [base_view(store, store.runs.run(r), count) for r in runs]


# ------------------------------------------------------------------------------------------ the common block
def test_text_both_runs_share_is_quoted_once_the_same_in_both_orders(store: Any, judge_backend: Any) -> None:
    judge = Judge(judge_backend, template="raw", use_cache=False)
    a, b = _bases(store, judge_backend.count, "a", "b")
    view_a, view_b = pack_pair(a, b, judge_backend.count, 100_000)
    assert view_a.common == view_b.common and view_a.common_tokens == view_b.common_tokens > 0
    # The task (as the task and as the first user message) and the system prompt: two pieces, in reading order.
    assert view_a.common.startswith("[common text 1]\n" + TASK + "\n[common text 2]\n" + SYSTEM)
    for view in (view_a, view_b):
        assert TASK not in view.text and SYSTEM not in view.text
        assert view.text.count("[common text 1]") == 2 and view.text.count("[common text 2]") == 1
    prompts = judge.order_prompts(view_a, view_b)
    for prompt in prompts:
        text = "".join(prompt.segments)
        assert text.count(TASK) == 1 and text.count(SYSTEM) == 1  # quoted once in the whole prompt
        # Its own delimiters, before the runs' own, which are unchanged.
        assert text.index(COMMON_OPENING) < text.index(COMMON_CLOSING) < text.index(opening("A"))
        assert text.count("<<<BEGIN RUN A>>>") == text.count("<<<END RUN A>>>") == 1
        assert text.count("<<<BEGIN RUN B>>>") == text.count("<<<END RUN B>>>") == 1
    # The block's segments, between its delimiters: the same text, and the same prefix (instructions and the whole
    # block) in both orders.
    prefixes = [prompt.segments[:list(prompt.segments).index(COMMON_CLOSING) + 1] for prompt in prompts]
    assert "".join(prefixes[0][prefixes[0].index(COMMON_OPENING) + 1:-1]) == view_a.common
    assert prefixes[0] == prefixes[1]
    # The pair named the other way round gets the same block.
    swapped = pack_pair(b, a, judge_backend.count, 100_000)
    assert swapped[0].common == view_a.common and swapped[0].text == view_b.text


def test_without_shared_text_there_is_no_block(store: Any, judge_backend: Any) -> None:
    a, c = _bases(store, judge_backend.count, "a", "c")
    view_a, view_c = pack_pair(a, c, judge_backend.count, 100_000)
    assert view_a.common == "" and view_a.common_tokens == 0 and view_a.text == a.text
    segments = RAW.segments(view_a.text, view_c.text, view_a.common)
    assert COMMON_OPENING not in segments and segments == RAW.segments(view_a.text, view_c.text)


@pytest.mark.parametrize("template", ["chat", "raw"])
@pytest.mark.parametrize("n_ctx", [8192, 1024, 768])
def test_packing_is_token_exact_with_the_common_block(store: Any, judge_backend: Any, template: str,
                                                      n_ctx: int) -> None:
    judge = Judge(judge_backend, template=template, use_cache=False)
    view_a, view_b = judge.pack_pair(store, "a", "b", n_ctx)
    assert view_a.text is not None and view_b.text is not None
    for prompt in judge.order_prompts(view_a, view_b):
        ids = judge_backend.prompt_tokens(prompt.segments)
        assert len(ids) == (judge.framing_tokens + view_a.common_tokens + view_a.tokens.view + view_b.tokens.view)
        assert len(ids) + 1 <= n_ctx  # the answer fits too
    cut = view_a.tokens.further_reduced or view_b.tokens.further_reduced
    assert cut == (n_ctx < 8192)
    if cut:
        # Cut to fit: the block keeps the task (decisive evidence), the harness's prompt goes to each view's marker.
        assert TASK in view_a.common and SYSTEM not in view_a.common and SYSTEM not in view_a.text
    else:
        assert SYSTEM in view_a.common


# ---------------------------------------------------------------------------------------- evidence figures
def _verdict(judge: Judge, view_a: Any, view_b: Any, p_a: float) -> Verdict:
    orders = [OrderScore(order, p_a, 1.0, 100, 0, False) for order in ("ab", "ba")]
    return judge.conclude(view_a, view_b, orders, started=0.0, seconds=0.0)


def test_the_evidence_each_view_keeps_is_on_the_verdict_and_flagged_when_hidden(store: Any,
                                                                                judge_backend: Any) -> None:
    judge = Judge(judge_backend, template="raw", use_cache=False)
    whole = _verdict(judge, *judge.pack_pair(store, "a", "b", 8192), 0.8)
    cut = _verdict(judge, *judge.pack_pair(store, "a", "b", 700), 0.7)
    full_figures = whole.to_json()["evidence"]
    for side in ("a", "b"):
        assert full_figures[side]["view"] == full_figures[side]["full"] and full_figures[side]["hidden"] is False
        assert full_figures[side]["view"]["submission"] == "patch"
        assert full_figures[side]["view"]["submission_lines"] == 5  # 2 removed, 3 added ("+" alone too)
        assert full_figures[side]["view"]["submission_share"] == 1.0
        assert full_figures[side]["view"]["verification"] == "pytest"
        assert full_figures[side]["view"]["verification_outcome_visible"] is True
    assert whole.evidence_hidden is False and whole.to_json()["evidence_hidden"] is False
    cut_figures = cut.to_json()["evidence"]
    assert cut.evidence_hidden and cut.to_json()["evidence_hidden"] is True
    hidden = [side for side in ("a", "b") if cut_figures[side]["hidden"]]
    assert hidden
    for side in hidden:
        view = cut_figures[side]["view"]
        assert view["submission_share"] < 1.0 or view["verification_outcome_visible"] is False
    json.dumps(cut.to_json())

    results, summary = still_grades([whole], [cut])
    assert results[0].evidence_hidden and summary["evidence"]["hidden_pairs"] == 1
    assert summary["evidence"]["full"]["mean_submission_share"] == 1.0
    assert summary["evidence"]["full"]["outcome_visible"] == 2
    reduced = summary["evidence"]["reduced"]
    shares = [cut.evidence[side].view.share for side in ("a", "b")]
    assert reduced["mean_submission_share"] == pytest.approx(sum(shares) / 2)
    assert results[0].to_json()["evidence"]["a"]["full"]["submission_share"] == 1.0

    evaluated = evaluate(store, [cut])
    assert evaluated["evidence"]["hidden"] == ["a vs b"]
    assert evaluated["evidence"]["full"]["submission_whole"] == 2
    assert evaluated["evidence"]["judged"]["mean_submission_share"] == pytest.approx(sum(shares) / 2)


def test_the_still_grades_output_flags_a_reduction_that_hides_evidence(tmp_path: Path, start_sim: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # `kvjudge judge --still-grades` as a user reads it, against a simulated server (what it answers plays no part:
    # the flag is about what the views show, whatever the verdicts did).
    path = tmp_path / "flagged.sqlite"
    store_from_runs(path, [harness_run("a", 1), harness_run("b", 2, passed=False)]).close()
    key = write_key(tmp_path / "key.json", [key_entry(marker="no such run", grade=1.0, patch="+x\n",
                                                      outcome="1 passed")])
    server = start_sim(key, SimSettings(max_model_len=8192))
    assert main(["judge", "a", "b", "--still-grades", "--reduce-to", "100", "--server", server.url,
                 "--store", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the output wraps at 80 columns: compare words
    assert "winner held: " in out and "REDUCTION HIDES EVIDENCE" in out
    assert "patch 5/5 lines, test outcome shown (full)" in out
    assert "HIDDEN by reduction in 1 pair(s): a vs b" in out


# ------------------------------------------------------------------------------------- show --judge-view
class Recording(LlamaBackend):
    """The judge's backend, keeping every prompt it was given (segments as sent)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sent: list[list[str]] = []

    def score(self, segments, shared: int = 0, scale=None):  # type: ignore[no-untyped-def]
        self.sent.append(list(segments))
        return super().score(segments, shared=shared, scale=scale)


@pytest.mark.model
def test_show_judge_view_prints_the_view_the_judge_sends(tmp_path: Path, default_model: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    n_ctx = 1024
    runs = [harness_run("a", 1, size=700), harness_run("b", 2, size=700, passed=False),
            harness_run("c", 3, size=700, task="Fix the bug.", system=None),
            harness_run("d", 4, size=700, task="Fix the bug.", system=None, passed=False)]
    path = tmp_path / "store.sqlite"
    store_from_runs(path, runs).close()
    backend = Recording(model_path=default_model, n_ctx=n_ctx)
    try:
        judge = Judge(backend, use_cache=False)
        with Store.open(path) as opened:
            shared, alone = judge.judge_pairs(opened, [("a", "b"), ("c", "d")])
    finally:
        backend.close()
    assert shared.further_reduced and alone.further_reduced  # both pairs are cut to fit the window
    prompt_ab, _, prompt_cd, _ = backend.sent

    def between(segments: list[str], start: str, end: str) -> str:
        """The text of the segments after ``start`` up to the one that begins with ``end`` (a view, the block)."""
        first = segments.index(start) + 1
        last = next(i for i in range(first, len(segments)) if segments[i].startswith(end))
        return "".join(segments[first:last])

    common = ("--n-ctx", str(n_ctx), "--model", str(default_model), "--store", str(path))
    code, beside = cli_json(capsys, "show", "a", "--judge-view", "--beside", "b", *common)
    assert code == 0 and beside["text"] == between(prompt_ab, opening("A"), closing("A"))
    assert beside["common"] == between(prompt_ab, COMMON_OPENING, COMMON_CLOSING) and beside["further_reduced"]
    code, view = cli_json(capsys, "show", "c", "--judge-view", *common)  # half the room: as beside a run as long
    assert code == 0 and view["common"] is None and view["text"] == between(prompt_cd, opening("A"), closing("A"))
    assert view["allowance"] == judge.room_at(n_ctx) // 2 and view["evidence"]["submission"] == "patch"
    # People get the same text (run text shown visibly: this one has no control characters).
    assert main(["show", "c", "--judge-view", *common]) == 0
    assert capsys.readouterr().out == view["text"] + "\n"
    assert closing("A").strip() not in view["text"]


def test_show_judge_view_within_an_allowance(tmp_path: Path, start_sim, capsys: pytest.CaptureFixture[str]) -> None:
    """``--allowance N``: the view cut to N tokens of the judge's own counting (a served judge: no model loads),
    keeping the evidence while N allows; a one-line error where not even the view's skeleton fits."""
    runs = [swe_run("t/pass", task="t", passed=True, explore=6, file_lines=80),
            swe_run("t/fail", task="t", passed=False, explore=6, file_lines=80)]
    key = write_key(tmp_path / "key.json", [run.key for run in runs])
    store_from_runs(tmp_path / "store.sqlite", [run.run for run in runs]).close()
    server = start_sim(key, SimSettings(max_model_len=8192))
    assert cli_json(capsys, "probe", "--server", server.url)[1]["certified"]
    common = ("--server", server.url, "--store", str(tmp_path / "store.sqlite"))

    def view(allowance: int | None) -> dict[str, Any]:
        extra = () if allowance is None else ("--allowance", str(allowance))
        code, shown = cli_json(capsys, "show", "t/pass", "--judge-view", *extra, *common)
        assert code == 0
        return shown

    default = view(None)  # half the room of the largest window: as beside a run as long as itself
    assert view(default["allowance"])["text"] == default["text"]
    whole = {"submission": "patch", "submission_lines": 12, "submission_visible": 12, "submission_share": 1.0,
             "submission_whole": True, "verification": "python -m pytest/unittest/tox/nox",
             "verification_outcome_visible": True}
    kept = view(800)
    assert kept["allowance"] == 800 and kept["further_reduced"]
    assert kept["tokens"] == len(SimJudge.tokens(kept["text"])) <= 800  # counted as the judge counts: its server's
    assert kept["tokens"] < default["tokens"] / 4
    assert kept["evidence"] == kept["evidence_full"] == whole  # the file dumps went, the patch and outcome stayed
    assert all(line in kept["text"].splitlines() for line in runs[0].patch.splitlines())
    assert runs[0].outcome in kept["text"] and len(re.findall(r"\[\d+ lines cut\]", kept["text"])) >= 6
    # People get the same text, markers and all.
    assert main(["show", "t/pass", "--judge-view", "--allowance", "800", *common]) == 0
    assert capsys.readouterr().out == kept["text"] + "\n"
    starved = view(450)  # under what the evidence needs: the view shows it, and says how little of it
    assert starved["tokens"] <= 450 and starved["evidence_full"] == whole
    assert starved["evidence"]["submission_share"] < 1.0 and not starved["evidence"]["verification_outcome_visible"]
    assert main(["show", "t/pass", "--judge-view", "--allowance", "300", *common]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"kvjudge: error: run t/pass cannot be judged in a \d+-token window: even the skeleton "
                        r"takes \d+ tokens, over the 300-token allowance", error)
    for bad in (("--allowance", "0"), ("--allowance", "800", "--beside", "t/fail")):
        assert main(["show", "t/pass", "--judge-view", *bad, *common]) == 2
        assert "--allowance must be a positive number of tokens" in capsys.readouterr().err
