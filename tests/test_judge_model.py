"""The judge on the real default model (Gemma 3 270M, in-process llama-cpp-python, n_ctx 512).

These test mechanics, not judgment quality: the default model chooses by position (it leans towards one slot
whatever the runs say), which is exactly what makes "identical runs are never decisive" and "inconsistent" worth
asserting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import kvjudge, store_from_runs

from kvjudge.judge import SCORED, Judge, LlamaBackend
from kvjudge.judge.verdict import judgment_key
from kvjudge.judge.render import body_resolver, render_view
from kvjudge.models import file_sha256
from kvjudge.retention import Store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import ModelTokenizer

pytestmark = pytest.mark.model
N_CTX = 512  # small prompts: every call evaluates at most ~500 tokens on 2 shared cores


@pytest.fixture(scope="module")
def backend(default_model: Path):
    loaded = LlamaBackend(model_path=default_model, n_ctx=N_CTX)
    yield loaded
    loaded.close()


def _same_task(run: dict, task: str = "fix-csv") -> dict:
    run["task"]["id"] = task
    return run


def _runs() -> list[dict]:
    good = _same_task(make_run("good", ["collected 12 items\n12 passed"], passed=True))
    bad = _same_task(make_run("bad", ["collected 12 items\nFAILED test_quote - AssertionError"], passed=False,
                              final="1 failed, 11 passed"))
    twin = _same_task(make_run("twin", ["collected 12 items\n12 passed"], passed=True))
    twin2 = _same_task(make_run("twin2", ["collected 12 items\n12 passed"], passed=True))
    long = _same_task(make_run("long", [filler(1, 1200)]))
    steps = _same_task(make_run("steps", [f"out {i}" for i in range(80)]))
    return [good, bad, twin, twin2, long, steps]


@pytest.fixture
def store(tmp_path: Path):
    opened = store_from_runs(tmp_path / "store.sqlite", _runs())
    yield opened
    opened.close()


def test_both_orders_run_with_prefix_reuse_and_a_manifest(backend: LlamaBackend, store: Store,
                                                          default_model: Path) -> None:
    calls, saved = backend.calls, backend.tokens_saved
    verdict = Judge(backend).judge_pair(store, "good", "bad")
    assert backend.calls - calls == 2 and not verdict.cached
    assert [o.order for o in verdict.orders] == ["ab", "ba"]
    assert all(0.0 < p < 1.0 for p in verdict.p_a_by_order.values())
    assert verdict.p_a == pytest.approx(sum(verdict.p_a_by_order.values()) / 2)
    assert verdict.outcome in SCORED
    # The second call kept the instruction prefix's KV cache.
    assert verdict.orders[1].reused_tokens > 50 and backend.tokens_saved > saved
    # The in-process KV reuse is counted as a server's prefix cache is: the verdict's ledger holds its two calls.
    cost = verdict.cost
    assert cost is not None and cost.calls == 2 and cost.cached_calls == 2
    assert cost.cached_tokens == sum(o.reused_tokens for o in verdict.orders) == backend.tokens_saved - saved
    assert cost.prompt_tokens == sum(o.prompt_tokens for o in verdict.orders) and cost.completion_tokens == 0
    manifest = verdict.manifest
    assert manifest["model_sha256"] == file_sha256(default_model)
    assert manifest["backend"] == "llama-cpp-python" and manifest["backend_version"]
    assert (manifest["n_ctx"], manifest["n_batch"]) == (N_CTX, 512) and manifest["threads"] >= 1
    assert manifest["template_version"]
    # A re-run of the same pair is read from the store's judgment cache: no model call.
    calls = backend.calls
    again = Judge(backend).judge_pair(store, "good", "bad")
    assert backend.calls == calls and again.cached
    assert (again.outcome, again.p_a, again.p_a_by_order) == (verdict.outcome, verdict.p_a, verdict.p_a_by_order)


def test_identical_runs_are_never_decisive(backend: LlamaBackend, store: Store) -> None:
    verdict = Judge(backend, use_cache=False).judge_pair(store, "twin", "twin2")
    assert verdict.outcome in ("tie", "inconsistent")
    assert verdict.p_a == pytest.approx(0.5, abs=1e-9)


def test_swapping_a_and_b_mirrors_p_a(backend: LlamaBackend, store: Store) -> None:
    judge = Judge(backend, use_cache=False)
    forward = judge.judge_pair(store, "good", "bad")
    backward = judge.judge_pair(store, "bad", "good")
    assert forward.p_a + backward.p_a == pytest.approx(1.0, abs=1e-9)
    # The same prompt (good shown first) read from two verdicts: deterministic, whatever ran in between.
    assert backward.p_a_by_order["ba"] == pytest.approx(1.0 - forward.p_a_by_order["ab"], abs=1e-12)
    mirrored = {"a": "b", "b": "a"}.get(forward.outcome, forward.outcome)
    assert backward.outcome == mirrored


def test_a_pair_that_cannot_fit_is_overflow_never_a_score(backend: LlamaBackend, store: Store) -> None:
    calls = backend.calls
    verdict = Judge(backend).judge_pair(store, "good", "steps")
    assert verdict.outcome == "overflow" and not verdict.scored
    assert verdict.p_a is None and verdict.p_a_by_order == {"ab": None, "ba": None}
    assert verdict.tokens["b"].view is None and "skeleton" in (verdict.error or "")
    assert backend.calls == calls


def test_a_backend_failure_is_error_and_is_not_cached(default_model: Path, store: Store) -> None:
    broken = LlamaBackend(model_path=default_model, n_ctx=256)
    judge = Judge(broken)
    manifest = judge.manifest()
    broken.close()  # the runtime is gone: every call fails
    verdict = judge.judge_pair(store, "good", "bad")
    assert verdict.outcome == "error" and verdict.p_a is None and not verdict.scored
    assert "closed" in (verdict.error or "")
    views = [render_view(store.runs.run(r), body_resolver(store.runs.run(r), store.blobs.text)) for r in ("good", "bad")]
    assert store.caches.get_judgment(judgment_key(manifest, *views)) is None


def test_a_long_run_is_judged_from_a_further_reduced_view(backend: LlamaBackend, store: Store) -> None:
    before = store.runs.run("long").canonical_bytes()
    judge = Judge(backend, use_cache=False)
    verdict = judge.judge_pair(store, "good", "long")
    assert verdict.scored and verdict.further_reduced
    tokens = verdict.tokens["b"]
    # The short run is read whole; the long one gets the rest of the room, cut to fit.
    assert tokens.further_reduced and tokens.full == tokens.reduced > judge.room - verdict.tokens["a"].view
    assert tokens.view <= judge.room - verdict.tokens["a"].view and not verdict.tokens["a"].further_reduced
    assert store.runs.run("long").canonical_bytes() == before  # a view, never stored


def test_a_run_reduced_through_retention_is_still_gradeable(backend: LlamaBackend, store: Store,
                                                            default_model: Path) -> None:
    # The acceptance test of reduction: a run over its ceiling reduces, and the reduced episode gets a real score.
    counter = ModelTokenizer(default_model)
    result = reduce_run(store, "long", 350, counter)
    state = store.runs.run("long")
    assert result.bodies_deleted > 0 and state.reduced
    verdict = Judge(backend, use_cache=False).judge_pair(store, "long", "good")
    assert verdict.scored and verdict.p_a is not None and 0.0 < verdict.p_a < 1.0
    assert verdict.tokens["a"].full is None  # the originals are gone, and the verdict does not pretend
    assert verdict.tokens["a"].view is not None and verdict.tokens["a"].view <= Judge(backend).room


def test_cli_still_grades_then_a_plain_judge_reads_the_full_side_from_the_cache(store: Store,
                                                                                 default_model: Path) -> None:
    path = str(store.path)
    store.close()
    base = [sys.executable, "-m", "kvjudge", "judge", "good", "long", "--store", path,
            "--model", str(default_model), "--n-ctx", str(N_CTX), "--no-certify"]
    first = subprocess.run([*base, "--still-grades", "--reduce-to", "100", "--json"], capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stderr
    pair, summary = [json.loads(line) for line in first.stdout.splitlines()]
    for key in ("a", "b", "outcome", "p_a", "p_a_by_order", "tokens", "further_reduced", "seconds", "manifest"):
        assert key in pair and key in pair["full"]
    assert (pair["a"], pair["b"]) == ("good", "long") and pair["outcome"] in SCORED
    assert set(pair["tokens"]["b"]) == {"full", "reduced", "view", "further_reduced"}
    # The reduced side read a view reduced to ~100 body tokens; the full side read the whole run (cut to fit).
    assert pair["tokens"]["b"]["reduced"] < pair["full"]["tokens"]["b"]["reduced"]
    assert pair["delta_p_a"] == pytest.approx(pair["p_a"] - pair["full"]["p_a"])
    totals = summary["summary"]
    assert totals["pairs"] == 1 and totals["coverage"] == {"full": 1.0, "reduced": 1.0}
    assert {"agreement", "flips", "kappa", "position_consistency", "reduce_to"} <= set(totals)
    # --n-ctx 512 cannot hold the full pair: the full side was cut, so the pair is left out of agreement.
    assert pair["full_cut"] and not pair["compared"] and totals["full_cut"] == 1 and totals["compared"] == 0
    assert totals["window"]["n_ctx"] == N_CTX and not totals["window"]["measured"]
    # The plain judge of the stored runs reads the same views as the full side: a cache hit, same p_a.
    second = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout.splitlines()[0])
    assert again["cached"] and again["p_a"] == pair["full"]["p_a"]
    human = subprocess.run(base, capture_output=True, text=True, timeout=900)
    assert human.returncode == 0 and "good vs long" in human.stdout and "summary" in human.stdout
    pairs = Path(path).with_name("pairs.jsonl")
    pairs.write_text('{"a": "good", "b": "long"}\n{"a": "long", "b": "good"}\n')
    batch = subprocess.run([*base[:4], "--pairs", str(pairs), *base[6:], "--json"], capture_output=True, text=True,
                           timeout=900)
    assert batch.returncode == 0, batch.stderr
    *rows, tail = [json.loads(line) for line in batch.stdout.splitlines()]
    assert [(r["a"], r["b"]) for r in rows] == [("good", "long"), ("long", "good")]
    assert rows[1]["p_a"] == pytest.approx(1.0 - rows[0]["p_a"])  # both orders of both pairs: all cache hits
    assert tail["summary"]["pairs"] == 2 and tail["summary"]["cached"] == 2


def test_cli_task_judges_every_pair_of_runs_on_that_task(store: Store, default_model: Path, tmp_path: Path) -> None:
    solo = [_same_task(make_run(name, ["collected 3 items\n3 passed"], passed=True), task="solo")
            for name in ("solo-1", "solo-2", "solo-3")]
    write_jsonl(tmp_path / "solo.jsonl", solo)
    ingest_paths(store, [tmp_path / "solo.jsonl"]).runs
    path = str(store.path)
    store.close()
    result = subprocess.run([sys.executable, "-m", "kvjudge", "judge", "--task", "solo", "--store", path,
                             "--model", str(default_model), "--n-ctx", str(N_CTX), "--no-certify", "--json"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    *rows, tail = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted((r["a"], r["b"]) for r in rows) == [("solo-1", "solo-2"), ("solo-1", "solo-3"),
                                                      ("solo-2", "solo-3")]
    assert all(r["outcome"] in SCORED for r in rows) and tail["summary"]["pairs"] == 3
    unknown = subprocess.run([sys.executable, "-m", "kvjudge", "judge", "--task", "nope", "--store", path,
                              "--model", str(default_model), "--n-ctx", str(N_CTX)], capture_output=True, text=True)
    assert unknown.returncode != 0 and unknown.stderr.count("\n") == 1


def test_the_bundled_judge_model_judges_a_pair_through_the_cli_certifying_only_its_window(
        tmp_path: Path, judge_model: Path) -> None:
    # Small views (the 0.5B judge prefills ~66 tokens/s here). A fresh capability cache: the judge must
    # certify the window this pair needs, that size only, and say so first with an estimate.
    runs = [_same_task(make_run("fixed", ["collected 3 items\n3 passed"], passed=True)),
            _same_task(make_run("broken", ["collected 3 items\nFAILED test_x - AssertionError"], passed=False,
                                final="1 failed, 2 passed"))]
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        path = str(store.path)
    first = kvjudge("judge", "fixed", "broken", "--store", path, "--json", timeout=900)
    assert first.returncode == 0, first.stderr
    verdict = json.loads(first.stdout.splitlines()[0])
    manifest = verdict["manifest"]
    assert manifest["model_sha256"] == file_sha256(judge_model) and manifest["model"] == judge_model.name
    assert manifest["template"] == "chat" and len(manifest["chat_template_sha256"]) == 64  # Qwen's ChatML
    assert manifest["show_verifier"] is False and verdict["outcome"] in SCORED
    assert all(0.0 < p < 1.0 for p in verdict["p_a_by_order"].values())
    # The window: framing + both views + the answer, rounded up to 256; certified at exactly that size.
    needed = sum(verdict["tokens"][r]["view"] for r in ("a", "b"))
    assert manifest["n_ctx"] == 512 and needed < 512
    assert "certifying qwen2.5-coder-0.5b-instruct-q4.gguf at n_ctx 512 only" in first.stderr
    assert "at the measured prefill speed of" in first.stderr
    (entry,) = json.loads(Path(os.environ["KVJUDGE_CACHE_DIR"], "capabilities.json").read_text())["entries"].values()
    assert [(t["n_ctx"], t["outcome"]) for t in entry["trials"]] == [(512, "ok")]
    assert entry["certified"] is False and entry["max_ok_input"] > needed  # a size, not a whole certification
    # Swapped, without the judgment cache: p_a mirrors within 1e-6, and nothing is certified again.
    swapped = kvjudge("judge", "broken", "fixed", "--store", path, "--json", "--no-cache", timeout=900)
    assert swapped.returncode == 0, swapped.stderr
    mirror = json.loads(swapped.stdout.splitlines()[0])
    assert mirror["p_a"] == pytest.approx(1.0 - verdict["p_a"], abs=1e-6)
    assert mirror["p_a_by_order"]["ab"] == pytest.approx(1.0 - verdict["p_a_by_order"]["ba"], abs=1e-6)
    assert "certifying" not in swapped.stderr and mirror["manifest"]["n_ctx"] == 512


def test_cli_eval_scores_the_judge_beside_the_baselines(tmp_path: Path, default_model: Path) -> None:
    runs = []
    for task in ("t1", "t2"):
        good = _same_task(make_run(f"{task}-good", ["collected 3 items\n3 passed"], passed=True), task=task)
        bad = _same_task(make_run(f"{task}-bad", ["collected 3 items\n1 failed"], passed=False, final="1 failed"),
                         task=task)
        bad["branches"][0]["transitions"][-1]["tool_output"]["exit_code"] = 1
        for run, score in ((good, 1.0), (bad, 0.0)):
            run["grades"] = [{"grader": "human", "score": score, "label": "pass" if score else "fail"}]
        runs += [good, bad]
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        path = str(store.path)
    png = tmp_path / "eval.png"
    done = kvjudge("eval", "--store", path, "--model", str(default_model), "--n-ctx", str(N_CTX), "--no-certify",
                   "--png", str(png), "--json", timeout=900)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (result,) = report["templates"].values()  # the default model has no chat template: raw only
    assert result["manifest"]["template"] == "raw" and result["graded_pairs"] == 2
    judge, baselines = result["judge"], result["baselines"]
    assert judge["pairs"] == 2 and judge["coverage"] == 1.0 and 0.0 <= judge["accuracy_ties_half"] <= 1.0
    assert judge["position_bias"] is not None and judge["mean_label_mass"] is not None
    assert baselines["last_exit_zero"]["accuracy_ties_half"] == 1.0  # the passing runs' last command exited 0
    assert baselines["always_first"]["accuracy_ties_half"] == 0.0    # pairs are listed bad-first (id order)
    assert result["conclusion"].startswith("the judge does not beat the baselines")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chat = kvjudge("eval", "--store", path, "--model", str(default_model), "--template", "chat", timeout=300)
    assert chat.returncode != 0 and "carries no chat template" in chat.stderr and "Traceback" not in chat.stderr


def test_the_prefill_speed_sample_fits_whatever_window_is_loaded(default_model: Path) -> None:
    backend = LlamaBackend(model_path=default_model, n_ctx=256)  # smaller than the sample needs
    try:
        assert backend.measure_prefill(256) > 0 and backend.n_ctx == 512 and backend.loads == 2
    finally:
        backend.close()


def test_the_in_process_backend_reads_a_scale_from_the_logits(default_model: Path, store: Store) -> None:
    from kvjudge.judge import make_protocol, score_runs
    from kvjudge.judge.protocols import Criterion, Rubric

    one = Rubric((Criterion("overall", "The run accomplished its task."),))
    judge = Judge(LlamaBackend(model_path=default_model, n_ctx=1024),
                  protocol=make_protocol("pointwise", levels=5, rubric=one, min_mass=0.0))
    try:
        [score] = score_runs(judge, store, ["good"])
    finally:
        judge.backend.close()
    assert score.outcome == "scored" and len(score.readings) == 1
    reading = score.readings[0]
    assert 0.0 < reading.label_mass <= 1.0 and 0.0 <= reading.score <= 1.0
    assert score.p_success == reading.score  # one criterion, one repeat
    assert score.manifest["levels"] == ["A", "B", "C", "D", "E"]
