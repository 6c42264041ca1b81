"""OpenHands runs in: the SWE-bench evaluation's output.jsonl (event history and the older pair history) and its
llm_completions logs (native and mocked function calling), its evaluation output as held-out grades, and the
files beside them. Every file is written by kvjudge.testing.openhands, shaped as OpenHands writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cli_json_ok, store_snapshot

from kvjudge.cli import main
from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.verify import verify
from kvjudge.testing import openhands as oh
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.trajectories import Episode, make_episode, mini_swe_agent_v2

MODEL = "anthropic/claude-sonnet-4-20250514"
AGENT = f"CodeActAgent/{MODEL}"
INSTANCE = "csvkit__csvkit-101"


def episode(instance: str = INSTANCE, seed: int = 1, steps: int = 4) -> Episode:
    made = make_episode(instance, seed, target_bytes=4_000, model=MODEL)
    made.steps = made.steps[:steps]
    return made


def texts(store: Store, run_id: str) -> list[str]:
    """Every body the run names, as text."""
    return [store.blobs.text(ref) or "" for ref in store.runs.run(run_id).refs()]


def steps(store: Store, run_id: str) -> list[tuple]:
    """(role, call name, call arguments, tool name, exit code) of each transition of the main branch."""
    out = []
    for t in store.runs.run(run_id).branches[0].transitions:
        call = t.tool_call or {}
        output = t.tool_output or {}
        arguments = store.blobs.text(call["arguments_ref"]) if call.get("arguments_ref") else None
        out.append((t.role, call.get("name"), arguments, output.get("name"), output.get("exit_code")))
    return out


def test_output_jsonl_event_history_maps_to_the_native_model(store: Store, tmp_path: Path) -> None:
    run = episode()
    run.steps[1].returncode = 2
    line = oh.output_line(run, MODEL, error="AgentStuckInLoopError: Agent got stuck in a loop")
    write_jsonl(tmp_path / "output.jsonl", [line])
    report = ingest_paths(store, [tmp_path / "output.jsonl"])
    run_id = f"{AGENT}/{INSTANCE}"
    assert report.imported == [run_id] and report.states == {"ungraded": 1}
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (AGENT, INSTANCE, None)
    assert store.blobs.text(state.task_prompt_ref) == run.problem_statement
    assert state.metadata == {"format": "openhands", "agent_class": "CodeActAgent", "model": MODEL,
                              "max_iterations": 100, "dataset": "princeton-nlp/SWE-bench_Verified", "cost": 0.1,
                              "error": "AgentStuckInLoopError: Agent got stuck in a loop",
                              "harness": f"OpenHands {oh.VERSION}"}
    shape = steps(store, run_id)
    # system prompt, instance message, then (call, result) per step, the finish call, the patch last; the recall
    # and agent-state events are bookkeeping and left out.
    assert [s[0] for s in shape] == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant", "assistant"]
    assert shape[2] == ("assistant", "execute_bash", run.steps[0].command, None, None)
    assert shape[3] == ("tool", None, None, "execute_bash", 0)
    assert shape[4][1] == "str_replace_editor"  # a view: the path, the defaults of a whole-file read left out
    assert json.loads(shape[4][2]) == {"path": f"{oh.WORKSPACE}/{run.steps[1].command.split()[-1]}"}
    assert shape[5][3:] == ("str_replace_editor", None)  # a file view has no exit code
    assert [s[4] for s in shape if s[0] == "tool" and s[3] == "execute_bash"] == [0, run.steps[2].returncode,
                                                                                 run.steps[3].returncode]
    assert shape[-2][1] == "finish" and json.loads(shape[-2][2]) == {"final_thought": oh.FINISH_MESSAGE}
    assert shape[-1] == ("assistant", "submit", run.patch, None, None)  # the submission is the last transition
    transitions = state.branches[0].transitions
    # The instance message is stored with the problem statement as a marker (the template is one body for all).
    assert store.blobs.text(transitions[1].text_ref) == oh.instruction(run).replace(run.problem_statement,
                                                                              "{{ instance.problem_statement }}")
    # Per-call usage: metrics.token_usages joined to each action's model_response id.
    usages = [t.usage for t in transitions if t.role == "assistant" and t.tool_call["name"] != "submit"]
    assert usages == [{"input_tokens": 5200 + 1100 * i, "output_tokens": 120 + i} for i in range(5)]
    # The SWE-bench row OpenHands keeps (gold patch, tests to pass) is never imported.
    assert not any("GOLD_PATCH_MARKER" in text or "test_gold_marker" in text for text in texts(store, run_id))
    assert verify(store).ok


def test_older_pair_history(store: Store, tmp_path: Path) -> None:
    run = episode(steps=3)
    run.steps[2].returncode = 1
    write_jsonl(tmp_path / "output.jsonl", [oh.output_line(run, MODEL, pairs=True)])
    ingest_paths(store, [tmp_path / "output.jsonl"])
    shape = steps(store, f"{AGENT}/{INSTANCE}")
    assert shape == [("user", None, None, None, None)] + [
        s for step in run.steps for s in (("assistant", "run", step.command, None, None),
                                          ("tool", None, None, "run", step.returncode))] + [
        ("assistant", "finish", None, None, None), ("assistant", "submit", run.patch, None, None)]


def test_a_line_with_its_evaluation_report_lands_graded(store: Store, tmp_path: Path) -> None:
    resolved, errored = episode(), episode("csvkit__csvkit-202", 2)
    write_jsonl(tmp_path / "output.jsonl", [oh.output_line(resolved, MODEL, with_report=oh.report(resolved=True)),
                                               oh.output_line(errored, MODEL, with_report=oh.report(error_eval=True))])
    report = ingest_paths(store, [tmp_path])
    assert report.states == {"graded": 1, "ungraded": 1}
    assert store.runs.run(f"{AGENT}/{INSTANCE}").grades == ({"grader": "swe-bench", "score": 1.0, "label": "resolved"},)
    assert store.runs.run(f"{AGENT}/csvkit__csvkit-202").grades == ()  # an evaluation error is not a grade


def completions_root(tmp_path: Path, *, mocked: bool = False, name: str = "eval") -> Path:
    root = tmp_path / name
    for seed, instance in enumerate((INSTANCE, "csvkit__csvkit-202"), start=1):
        oh.write_completions(root, episode(instance, seed), MODEL, mocked=mocked)
    return root


def test_completions_logs_one_run_per_instance_with_usage_per_call(store: Store, tmp_path: Path) -> None:
    root = completions_root(tmp_path)
    files = sorted((root / "llm_completions" / INSTANCE).iterdir())
    assert len(files) == 5  # four steps and the finish call: five model calls, one run
    report = ingest_paths(store, [root])
    run_id = f"OpenHands/{MODEL}/{INSTANCE}"
    assert report.imported == [run_id, f"OpenHands/{MODEL}/csvkit__csvkit-202"]
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id) == (f"OpenHands/{MODEL}", INSTANCE)
    assert state.metadata == {"format": "openhands", "model": MODEL, "api_calls": 5, "harness": "OpenHands"}
    run = episode()
    shape = steps(store, run_id)
    assert [s[0] for s in shape] == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant"]
    assert shape[2] == ("assistant", "execute_bash", run.steps[0].command, None, None)
    assert [s[4] for s in shape if s[0] == "tool"] == [0, None, run.steps[2].returncode, run.steps[3].returncode]
    assert shape[-1][1] == "finish" and json.loads(shape[-1][2]) == {"message": oh.FINISH_MESSAGE}
    # Each assistant turn carries the usage of its own call (file k of the series for turn k).
    usage = [t.usage for t in state.branches[0].transitions if t.role == "assistant"]
    calls = [json.loads(path.read_text())["response"]["usage"] for path in files]
    assert usage == [{"input_tokens": c["prompt_tokens"], "output_tokens": c["completion_tokens"]} for c in calls]
    assert len({u["input_tokens"] for u in usage}) == 5
    assert store.blobs.text(state.task_prompt_ref) == run.problem_statement
    # Imported again, the same command changes nothing.
    again = ingest_paths(store, [root])
    assert again.imported == [] and len(again.already_present) == 2


def test_mocked_function_calling_reads_as_the_native_calls(store: Store, tmp_path: Path) -> None:
    native, mocked = completions_root(tmp_path), completions_root(tmp_path, mocked=True, name="mocked")
    ingest_paths(store, [native])
    with Store.open(tmp_path / "mocked.sqlite") as other:
        ingest_paths(other, [mocked])
        run_id = f"OpenHands/{MODEL}/{INSTANCE}"
        assert other.runs.run(run_id).metadata["function_calling"] == "mocked"
        assert steps(other, run_id) == steps(store, run_id)  # fncall_messages: the same calls, results, codes
        # An older log without fncall_messages: the calls are read from the <function=…><parameter=…> text.
        for path in (mocked / "llm_completions").rglob("*.json"):
            entry = json.loads(path.read_text())
            del entry["fncall_messages"], entry["fncall_response"]
            path.write_text(json.dumps(entry))
        text_only = Store.open(tmp_path / "text.sqlite")
        try:
            ingest_paths(text_only, [mocked])
            assert steps(text_only, run_id) == steps(store, run_id)
            first_user = text_only.runs.run(run_id).branches[0].transitions[1]
            assert text_only.blobs.text(first_user.text_ref).startswith(oh.MOCK_EXAMPLE)  # what the model was sent
            usage = [t.usage for t in text_only.runs.run(run_id).branches[0].transitions if t.role == "assistant"]
            assert usage == [t.usage for t in store.runs.run(run_id).branches[0].transitions if t.role == "assistant"]
        finally:
            text_only.close()


def test_a_directory_walk_reads_the_runs_and_passes_over_the_rest(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "outputs" / "CodeActAgent" / "claude-sonnet-4_maxiter_100"
    runs = [episode(), episode("csvkit__csvkit-202", 2)]
    write_jsonl(root / "output.jsonl", [oh.output_line(run, MODEL) for run in runs])
    write_jsonl(root / "output.swebench_eval.jsonl",
                   [oh.eval_output_line(run, MODEL, oh.report(resolved=True)) for run in runs])
    write_jsonl(root / "output.critic_attempt_1.jsonl", [oh.output_line(runs[0], MODEL)])
    (root / "maximum_retries_exceeded.jsonl").write_text(json.dumps({"instance_id": "x", "error": "boom",
                                                                     "timestamp": "2025-08-01 10:00:00"}) + "\n")
    (root / "metadata.json").write_text(json.dumps(oh.eval_metadata(MODEL)))
    calls = oh.write_completions(root, runs[0], MODEL)  # the same runs as output.jsonl: passed over
    report = ingest_paths(store, [tmp_path / "outputs"])
    assert report.imported == [f"{AGENT}/{INSTANCE}", f"{AGENT}/csvkit__csvkit-202"]
    # metadata.json is the evaluation's own companion: read beside the runs (for lines naming no agent), not passed over.
    assert report.files == 1 and report.ignored_files == 3 + len(calls)
    assert report.companion_files == [str(root / "metadata.json")]
    assert report.notes[1] == ("3 file(s) passed over (OpenHands' evaluation results — give them with --results —, "
                               f"predictions and attempts: not the runs): {root / 'maximum_retries_exceeded.jsonl'}, "
                               f"{root / 'output.critic_attempt_1.jsonl'}, {root / 'output.swebench_eval.jsonl'}")
    # Named directly, the completions folder is read.
    assert ingest_paths(store, [root / "llm_completions"]).imported == [f"OpenHands/{MODEL}/{INSTANCE}"]


def test_a_line_that_is_not_json_names_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_path = tmp_path / "s.sqlite"
    good = tmp_path / "runs" / "good" / "output.jsonl"
    write_jsonl(good, [oh.output_line(episode(), MODEL)])
    bad = tmp_path / "runs" / "bad" / "output.jsonl"
    write_jsonl(bad, [oh.output_line(episode("csvkit__csvkit-202", 2), MODEL)])
    with bad.open("a") as handle:
        handle.write('{"instance_id": "csvkit__csvkit-303", "history": [{"action": "run", "args": {"comm\n')
    cli_json_ok(capsys, "ingest", str(good), "--store", str(store_path))
    before = store_snapshot(store_path)
    code = main(["ingest", str(tmp_path / "runs"), "--store", str(store_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert f"{bad}:2: not valid JSON (" in err and "nothing was imported" in err
    assert store_snapshot(store_path) == before
    skipped = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), "--store", str(store_path), "--skip-bad")
    assert skipped["imported"] == 0 and skipped["already_present"] == 1
    assert [item["path"] for item in skipped["skipped_files"]] == [str(bad)]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda line: line.update(history=None), r"\$\.history: missing: this line holds no trajectory .*--results"),
    (lambda line: line["history"].append({"id": 99, "source": "agent"}),
     r"\$\.history\[\d+\]: is neither an action nor an observation"),
    (lambda line: line["history"][6]["extras"]["metadata"].update(exit_code="0"),
     r"\$\.history\[6\]\.extras\.metadata\.exit_code: must be an integer"),
    (lambda line: line.update(report={"resolved": "yes"}), r"\$\.report: resolved must be true or false"),
])
def test_bad_lines_name_the_json_path(store: Store, tmp_path: Path, mutate, message: str) -> None:
    line = oh.output_line(episode(), MODEL)
    mutate(line)
    write_jsonl(tmp_path / "output.jsonl", [line])
    with pytest.raises(IngestError, match=rf"output\.jsonl:1: {message}"):
        ingest_paths(store, [tmp_path / "output.jsonl"])
    assert store.runs.run_ids() == []


def test_an_earlier_call_that_is_not_json_is_named(store: Store, tmp_path: Path) -> None:
    root = completions_root(tmp_path)
    second = sorted((root / "llm_completions" / INSTANCE).iterdir())[1]
    second.write_text(second.read_text()[:100])
    with pytest.raises(IngestError, match=rf"{second}: not valid JSON"):
        ingest_paths(store, [root])
    assert store.runs.run_ids() == []


def test_evaluation_output_as_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [episode(), episode("csvkit__csvkit-202", 2), episode("csvkit__csvkit-303", 3)]
    write_jsonl(tmp_path / "runs" / "output.jsonl", [oh.output_line(run, MODEL) for run in runs])
    results = write_jsonl(tmp_path / "eval" / "output.swebench_eval.jsonl", [
        oh.eval_output_line(runs[0], MODEL, oh.report(resolved=True)),
        oh.eval_output_line(runs[1], MODEL, oh.report(empty_generation=True)),
        oh.eval_output_line(runs[2], MODEL, oh.report(test_timeout=True))])
    out = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), "--results", str(tmp_path / "eval"),
                      "--store", str(tmp_path / "s.sqlite"))
    # Each line names its agent (metadata): it grades that run by id, no binding needed.
    assert out["states"] == {"graded": 2, "ungraded": 1} and out["evaluation_errors"] == 1
    assert out["results"] == [{"results": str(results), "agent": None, "agent_from": "run ids", "graded": 2}]
    with Store.open(tmp_path / "s.sqlite") as opened:
        assert [g["label"] for g in opened.runs.run(f"{AGENT}/csvkit__csvkit-202").grades] == ["unresolved"]
    # The placeholder metadata eval_infer.py writes without metadata.json names no agent: graded by instance.
    placeholder = write_jsonl(tmp_path / "p" / "output.swebench_eval.jsonl",
                                 [oh.eval_output_line(runs[0], MODEL, oh.report(resolved=True), agent_class=None)])
    out = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), "--results", str(placeholder),
                      "--store", str(tmp_path / "p.sqlite"))
    assert out["states"] == {"graded": 1, "ungraded": 2} and out["results"][0]["agent_from"] is None
    bad = write_jsonl(tmp_path / "bad" / "output.swebench_eval.jsonl",
                         [oh.eval_output_line(runs[0], MODEL, {"resolved": None})])
    code = main(["ingest", str(tmp_path / "runs"), "--results", str(bad), "--store", str(tmp_path / "b.sqlite")])
    assert code == 1
    assert f"--results {bad}:1: $.test_result.report: resolved must be true or false" in capsys.readouterr().err


def test_mini_swe_agent_v2_carries_the_usage_of_each_response(store: Store, tmp_path: Path) -> None:
    run = episode()
    (tmp_path / f"{INSTANCE}.traj.json").write_text(json.dumps(mini_swe_agent_v2(run)))
    run_id = ingest_paths(store, [tmp_path / f"{INSTANCE}.traj.json"]).imported[0]
    usage = [t.usage for t in store.runs.run(run_id).branches[0].transitions if t.role == "assistant" and t.usage]
    assert usage == [{"input_tokens": 2400 + 900 * i, "output_tokens": 80 + i} for i in range(len(run.steps) + 1)]


def test_text_that_is_not_unicode_in_an_output_line(store: Store, tmp_path: Path) -> None:
    line = oh.output_line(episode(), MODEL)
    raw = json.dumps(line).replace('"content": "Here', '"content": "\\ud800Here', 1)
    (tmp_path / "output.jsonl").write_text(raw + "\n")
    with pytest.raises(IngestError, match=r"output\.jsonl:1: text at \$\.history\[\d+\]\.content is not valid "
                                          r"Unicode: lone surrogate U\+D800"):
        ingest_paths(store, [tmp_path / "output.jsonl"])
    assert store.runs.run_ids() == []
    report = ingest_paths(store, [tmp_path / "output.jsonl"], repair_text=True)
    assert report.imported == [f"{AGENT}/{INSTANCE}"] and report.repaired[f"{AGENT}/{INSTANCE}"][0]["code_units"] == 1
