"""Real agent runs in: mini-swe-agent (v1 and v2 shapes) and SWE-agent trajectories, SWE-bench results as
held-out grades. The trajectories are written by the tests, shaped as the harnesses write them (see
kvjudge.testing.trajectories and the literal ones below); nothing is downloaded."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from helpers import CallLog, cli_json_ok, kvjudge, sql

from kvjudge.cli import main
from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.verify import verify
from kvjudge.testing.trajectories import (
    MINI_SYSTEM_V2,
    Episode,
    Step,
    make_episode,
    mini_swe_agent_v1,
    mini_swe_agent_v2,
    swe_agent,
)

PR = "TimeDelta serialization precision\n\nOutput of `td_field.serialize(\"td\", obj)` is `344`, expected `345`."
INSTANCE = ("<pr_description>\nConsider the following PR description:\n" + PR + "\n</pr_description>\n\n"
            "<instructions>\n# Task Instructions\n\nMake the change in /testbed.\n</instructions>")
PATCH = ("diff --git a/src/marshmallow/fields.py b/src/marshmallow/fields.py\n--- a/src/marshmallow/fields.py\n"
         "+++ b/src/marshmallow/fields.py\n@@ -1474 +1474 @@\n-        return int(value.total_seconds() / base)\n"
         "+        return int(round(value.total_seconds() / base))\n")
LONG = "".join(f"line {i}: {'x' * 40}\n" for i in range(400))  # 20 kB: over the 10,000-character limit

# A mini-swe-agent 1.x trajectory as `mini-extra swebench` saves it (trajectory_format mini-swe-agent-1).
MINI_V1 = {
    "info": {
        "exit_status": "Submitted",
        "submission": PATCH,
        "model_stats": {"instance_cost": 0.0421, "api_calls": 5},
        "mini_version": "1.17.3",
        "config": {
            "agent": {"system_template": "You are a helpful assistant…", "instance_template": "<pr_description>…",
                      "action_regex": "```bash\\s*\\n(.*?)\\n```", "step_limit": 250, "cost_limit": 3.0},
            "model": {"model_name": "openai/gpt-4o-mini", "model_kwargs": {"temperature": 0.0}},
            "environment": {"image": "docker.io/swebench/sweb.eval.x86_64.marshmallow-code_1776_marshmallow-1867",
                            "cwd": "/testbed", "timeout": 60},
            "agent_type": "minisweagent.run.extra.swebench.ProgressTrackingAgent",
            "model_type": "minisweagent.models.litellm_model.LitellmModel",
            "environment_type": "minisweagent.environments.docker.DockerEnvironment"}},
    "messages": [
        {"role": "system", "content": "You are a helpful assistant that can interact multiple times with a computer "
                                      "shell to solve programming tasks.", "timestamp": 1752000000.1},
        {"role": "user", "content": INSTANCE, "timestamp": 1752000000.2},
        {"role": "assistant", "timestamp": 1752000003.5,
         "content": "THOUGHT: Let me find the field.\n\n```bash\ngrep -n \"class TimeDelta\" "
                    "src/marshmallow/fields.py\n```",
         "extra": {"response": {"id": "chatcmpl-1", "usage": {"prompt_tokens": 1510, "completion_tokens": 38,
                                                              "total_tokens": 1548}}}},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n1428:class TimeDelta(Field):\n</output>",
         "timestamp": 1752000003.9},
        {"role": "assistant", "timestamp": 1752000006.0,
         "content": "THOUGHT: Read the whole file.\n\n```bash\ncat src/marshmallow/fields.py\n```",
         "extra": {"response": {"usage": {"prompt_tokens": 1600, "completion_tokens": 20}}}},
        {"role": "user", "timestamp": 1752000006.4, "content": (
            "<returncode>0</returncode>\n<warning>\nThe output of your last command was too long.\nPlease try a "
            "different command that produces less output.\n</warning><output_head>\n" + LONG[:5000] +
            "\n</output_head>\n<elided_chars>\n" + str(len(LONG) - 10000) + " characters elided\n</elided_chars>\n"
            "<output_tail>\n" + LONG[-5000:] + "\n</output_tail>")},
        {"role": "assistant", "content": "THOUGHT: I will fix it and run the tests at once.",
         "timestamp": 1752000009.0},
        {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks, found 0 actions.",
         "timestamp": 1752000009.1},
        {"role": "assistant", "timestamp": 1752000012.0,
         "content": "THOUGHT: Round instead of truncating.\n\n```bash\n"
                    "sed -i 's/return int(value/return int(round(value/' "
                    "src/marshmallow/fields.py && python -c \"print(1)\"\n```"},
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n"
                                    "SyntaxError: '(' was never closed\n</output>", "timestamp": 1752000012.5},
        {"role": "assistant", "timestamp": 1752000015.0,
         "content": "THOUGHT: Submit.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff "
                    "--cached\n```"},
        {"role": "user", "content": PATCH, "timestamp": 1752000015.4},
    ],
    "trajectory_format": "mini-swe-agent-1",
    "instance_id": "marshmallow-code__marshmallow-1867",
}

# A SWE-agent 0.7 trajectory (no replay_config): demonstration in history, the ISSUE/INSTRUCTIONS template.
SWE_V07 = {
    "environment": "swe_main",
    "trajectory": [
        {"action": "create reproduce.py\n",
         "observation": "[File: /pydicom__pydicom/reproduce.py (1 lines total)]\n1:\n",
         "response": "First I'll reproduce the bug.\n\n```\ncreate reproduce.py\n```", "thought":
         "First I'll reproduce the bug.\n\n",
         "state": "{\"open_file\": \"n/a\", \"working_dir\": \"/pydicom__pydicom\"}\n"},
        {"action": "python reproduce.py\n",
         "observation": "Traceback (most recent call last):\r\n  File \"reproduce.py\"",
         "response": "Run it.\n\n```\npython reproduce.py\n```", "thought": "Run it.\n\n", "state": "{}"},
        {"action": "submit\n", "observation": "\ndiff --git a/pydicom/x.py b/pydicom/x.py\n",
         "response": "Done.\n\n```\nsubmit\n```", "thought": "Done.\n\n", "state": "{}"},
    ],
    "history": [
        {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "primary"},
        {"role": "user", "content": "Here is a demonstration of how to correctly accomplish this task.\n--- "
                                    "DEMONSTRATION ---\n…\n--- END OF DEMONSTRATION ---\n", "agent": "primary",
         "is_demo": True},
        {"role": "user", "content": "We're currently solving the following issue within our repository. Here's the "
                                    "issue text:\nISSUE:\nFloat Pixel Data is not handled\r\n\r\nSee below.\n\n"
                                    "INSTRUCTIONS:\nNow, you're going to solve this issue on your own.",
         "agent": "primary"},
        {"role": "assistant", "content": "First I'll reproduce the bug.", "thought": "First", "action": "create",
         "agent": "primary"},
    ],
    "info": {"exit_status": "submitted", "submission": "\ndiff --git a/pydicom/x.py b/pydicom/x.py\n",
             "model_stats": {"total_cost": 1.26719, "instance_cost": 1.26719, "tokens_sent": 122612,
                             "tokens_received": 1369, "api_calls": 12}},
}


def write(path: Path, data: dict, *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def texts(store: Store, run_id: str) -> list[tuple]:
    """(role, text, call name, call arguments, exit code, output) per transition of the live branch."""
    out = []
    for t in store.runs.run(run_id).branches[0].transitions:
        call = t.tool_call or {}
        output = t.tool_output or {}
        out.append((t.role, store.blobs.text(t.text_ref) if t.text_ref else None, call.get("name"),
                    store.blobs.text(call["arguments_ref"]) if call.get("arguments_ref") else None,
                    output.get("exit_code"), store.blobs.text(output["output_ref"]) if output.get("output_ref") else None))
    return out


def test_mini_swe_agent_v1_maps_to_the_native_model(store: Store, tmp_path: Path) -> None:
    write(tmp_path / "runs" / "marshmallow-code__marshmallow-1867.traj.json", MINI_V1)
    report = ingest_paths(store, [tmp_path / "runs"])
    run_id = "openai/gpt-4o-mini/marshmallow-code__marshmallow-1867"
    assert report.imported == [run_id]
    state = store.runs.run(run_id)
    assert state.task_id == "marshmallow-code__marshmallow-1867" and store.blobs.text(state.task_prompt_ref) == PR
    assert state.agent == "openai/gpt-4o-mini" and state.state == "ungraded" and state.grades == ()
    assert state.metadata == {"format": "mini-swe-agent-1", "exit_status": "Submitted", "cost": 0.0421,
                              "api_calls": 5, "model": "openai/gpt-4o-mini", "harness": "mini-swe-agent 1.17.3"}
    steps = texts(store, run_id)
    assert steps[0][:2] == ("system", MINI_V1["messages"][0]["content"])
    # The instance template is the first user transition, the task prompt in it as {{task}} — reversibly.
    assert steps[1][0] == "user" and "{{task}}" in steps[1][1] and PR not in steps[1][1]
    assert steps[1][1].replace("{{task}}", PR) == INSTANCE
    assert steps[2] == ("assistant", "THOUGHT: Let me find the field.", "bash",
                        'grep -n "class TimeDelta" src/marshmallow/fields.py', None, None)
    assert steps[3] == ("tool", None, None, None, 0, "1428:class TimeDelta(Field):\n")
    # The long-output warning stays as the agent saw it: head, elision, tail.
    assert steps[5][4] == 0 and steps[5][5].startswith("<warning>") and "<output_tail>" in steps[5][5]
    assert "10000 characters elided" not in steps[5][5] and f"{len(LONG) - 10000} characters elided" in steps[5][5]
    # A response without its block: no tool call; the format error is what the user said next.
    assert steps[6] == ("assistant", "THOUGHT: I will fix it and run the tests at once.", None, None, None, None)
    assert steps[7][0] == "user" and steps[7][1].startswith("Please always provide EXACTLY ONE action")
    assert steps[9][4] == 1 and "SyntaxError" in steps[9][5]
    assert steps[10][2:4] == ("bash", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached")
    # The submission is the last transition, once (the exit message that repeated it is not a step of its own).
    assert steps[-1] == ("assistant", None, "submit", PATCH, None, None) and len(steps) == 12
    usage = store.runs.run(run_id).branches[0].transitions[2].usage
    assert usage == {"input_tokens": 1510, "output_tokens": 38}


@pytest.mark.parametrize("tool_calls", [True, False], ids=["tool-calls", "text-based"])
def test_mini_swe_agent_v2_shapes(store: Store, tmp_path: Path, tool_calls: bool) -> None:
    episode = Episode("astropy__astropy-12907", PR, [
        Step("Look around.", "ls -la", "total 8\n-rw-r--r-- 1 root root 12 setup.py\n"),
        Step("Run the tests.", "python -m pytest -q", "1 failed, 3 passed\n", returncode=1),
        Step("Big file.", "cat big.txt", LONG)],
        model="anthropic/claude-sonnet-4-5-20250929", patch=PATCH, cost=0.0333, format_error_after=1)
    data = mini_swe_agent_v2(episode, tool_calls=tool_calls)
    write(tmp_path / "astropy__astropy-12907" / "astropy__astropy-12907.traj.json", data, gz=True)
    run_id = "anthropic/claude-sonnet-4-5-20250929/astropy__astropy-12907"
    assert ingest_paths(store, [tmp_path]).imported == [run_id]
    state = store.runs.run(run_id)
    assert state.metadata["format"] == "mini-swe-agent-1.1" and state.metadata["api_calls"] == episode.api_calls
    assert state.metadata["exit_status"] == "Submitted" and state.metadata["harness"] == "mini-swe-agent 2.0.0"
    steps = texts(store, run_id)
    assert steps[0][:2] == ("system", MINI_SYSTEM_V2) and "{{task}}" in steps[1][1]
    thought = "Look around." if tool_calls else "THOUGHT: Look around."
    assert steps[2] == ("assistant", thought, "bash", "ls -la", None, None)
    assert steps[3] == ("tool", None, None, None, 0, "total 8\n-rw-r--r-- 1 root root 12 setup.py\n")
    assert steps[5][4] == 1 and steps[6][0] == "user" and "No tool calls found" in steps[6][1]
    assert steps[8][5].startswith("<warning>")
    # The submit command has no observation (the harness stops there); the patch is the last transition.
    assert steps[-2][3] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
    assert steps[-1] == ("assistant", None, "submit", PATCH, None, None)


def test_mini_swe_agent_v2_parallel_tool_calls_and_responses_api(store: Store, tmp_path: Path) -> None:
    data = mini_swe_agent_v2(Episode("django__django-1", PR, [Step("x", "ls", "a\n")], patch=""))
    parallel = copy.deepcopy(data["messages"][2])
    parallel["tool_calls"].append({"function": {"arguments": json.dumps({"command": "pwd"}), "name": "bash"},
                                   "id": "toolu_2", "type": "function"})
    parallel["extra"]["actions"].append({"command": "pwd", "tool_call_id": "toolu_2"})
    second = {"content": "<returncode>0</returncode>\n<output>\n/testbed\n</output>", "role": "tool",
              "tool_call_id": "toolu_2", "extra": {"raw_output": "/testbed\n", "returncode": 0}}
    response = {"object": "response", "id": "resp_1", "model": "gpt-5", "status": "completed",
                "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                           {"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": "Checking the tests."}]},
                           {"type": "function_call", "name": "bash", "call_id": "call_9",
                            "arguments": json.dumps({"command": "pytest -q"})}],
                "usage": {"input_tokens": 900, "output_tokens": 40},
                "extra": {"actions": [{"command": "pytest -q", "tool_call_id": "call_9"}], "cost": 0.01}}
    output = {"type": "function_call_output", "call_id": "call_9",
              "output": "<returncode>2</returncode>\n<output>\nno tests ran\n</output>",
              "extra": {"raw_output": "no tests ran\n", "returncode": 2}}
    data["messages"] = data["messages"][:2] + [parallel, data["messages"][3], second, response, output,
                                               data["messages"][-1]]
    write(tmp_path / "django__django-1.traj.json", data)
    run_id = ingest_paths(store, [tmp_path])
    steps = texts(store, run_id.imported[0])
    assert [s[3] for s in steps[2:4]] == ["ls", "pwd"] and steps[2][1] == "x" and steps[3][1] is None
    assert [(s[4], s[5]) for s in steps[4:6]] == [(0, "a\n"), (0, "/testbed\n")]
    assert steps[6] == ("assistant", "Checking the tests.", "bash", "pytest -q", None, None)
    assert steps[7] == ("tool", None, None, None, 2, "no tests ran\n")
    assert store.runs.run(run_id.imported[0]).branches[0].transitions[6].usage == {"input_tokens": 900,
                                                                              "output_tokens": 40}


def test_swe_agent_1x_maps_to_the_native_model(store: Store, tmp_path: Path) -> None:
    episode = make_episode("sympy__sympy-20590", 5, target_bytes=8_000, model="gpt-4o")
    data = swe_agent(episode)
    write(tmp_path / "run" / "sympy__sympy-20590" / "sympy__sympy-20590.traj", data)
    run_id = "gpt-4o/sympy__sympy-20590"
    assert ingest_paths(store, [tmp_path]).imported == [run_id]
    state = store.runs.run(run_id)
    assert store.blobs.text(state.task_prompt_ref) == episode.problem_statement and state.agent == "gpt-4o"
    assert state.metadata["format"] == "swe-agent" and state.metadata["exit_status"] == "submitted"
    assert state.metadata["tokens_sent"] == data["info"]["model_stats"]["tokens_sent"]
    steps = texts(store, run_id)
    assert steps[0][0] == "system" and "{{problem_statement}}" in steps[1][1]
    assert steps[1][1].replace("{{problem_statement}}", episode.problem_statement) == \
        data["history"][1]["content"][0]["text"]
    first = data["trajectory"][0]
    assert steps[2] == ("assistant", first["thought"], "bash", first["action"], None, None)
    assert steps[3] == ("tool", None, None, None, None, first["observation"])
    assert steps[-1] == ("assistant", None, "submit", episode.patch, None, None)
    assert len(steps) == 2 + 2 * len(data["trajectory"]) + 1


def test_swe_agent_07_and_retry_attempts(store: Store, tmp_path: Path) -> None:
    write(tmp_path / "pydicom__pydicom-1458.traj", SWE_V07)
    retry = swe_agent(make_episode("flask__flask-1", 6, target_bytes=4_000, model="gpt-4o"))
    other = swe_agent(make_episode("flask__flask-1", 7, target_bytes=3_000, model="gpt-4o"))
    retry["attempts"] = [{k: other[k] for k in ("trajectory", "history", "info")},
                         {k: retry[k] for k in ("trajectory", "history", "info")}]
    retry["info"]["best_attempt_idx"] = 1
    write(tmp_path / "flask__flask-1.traj", retry)
    report = ingest_paths(store, [tmp_path], agent="sweagent-gpt4")
    assert report.imported == ["sweagent-gpt4/flask__flask-1", "sweagent-gpt4/pydicom__pydicom-1458"]
    old = store.runs.run("sweagent-gpt4/pydicom__pydicom-1458")
    assert store.blobs.text(old.task_prompt_ref) == "Float Pixel Data is not handled\r\n\r\nSee below."
    steps = texts(store, old.id)
    assert [s[0] for s in steps[:3]] == ["system", "user", "user"] and "DEMONSTRATION" in steps[1][1]
    assert "ISSUE:\n{{problem_statement}}\n\nINSTRUCTIONS:" in steps[2][1]
    assert steps[3][1:4] == ("First I'll reproduce the bug.\n\n", "bash", "create reproduce.py\n")
    assert old.metadata["cost"] == 1.26719 and old.metadata["api_calls"] == 12
    branches = store.runs.run("sweagent-gpt4/flask__flask-1").branches
    assert [(b.id, b.status, b.parent, b.fork_at) for b in branches] == [("main", "live", None, None),
                                                                      ("attempt-0", "dead", "main", 2)]
    assert len(branches[1].transitions) == 2 * len(other["trajectory"])


@pytest.mark.parametrize(("name", "data", "message"), [
    ("a.traj.json", dict(MINI_V1, trajectory_format="mini-swe-agent-9"),
     r"a.traj.json: \$\.trajectory_format: unknown trajectory_format 'mini-swe-agent-9'"),
    ("b.traj.json", dict(MINI_V1, messages=[{"content": "no role"}]),
     r"b.traj.json: \$\.messages\[0\]\.role: missing"),
    ("c.traj", dict(SWE_V07, trajectory=[{"action": "ls", "thought": "t"}]),
     r"c.traj: \$\.trajectory\[0\]\.observation: missing"),
    ("d.traj.json", [1, 2, 3], r"d.traj.json: \$: is none of the formats"),
    ("e.traj", dict(SWE_V07, info="done"), r"e.traj: \$\.info: must be an object, not a string"),
])
def test_bad_trajectories_name_the_file_and_json_path(store: Store, tmp_path: Path, name: str, data,
                                                      message: str) -> None:
    write(tmp_path / "runs" / "good.traj.json", MINI_V1)
    write(tmp_path / "runs" / name, data)
    with pytest.raises(IngestError, match=message):
        ingest_paths(store, [tmp_path / "runs"])
    assert store.runs.run_ids() == [] and sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


def test_truncated_trajectory_and_skip_bad(store: Store, tmp_path: Path) -> None:
    write(tmp_path / "runs" / "good.traj.json", MINI_V1)
    text = json.dumps(SWE_V07, indent=2)
    (tmp_path / "runs" / "cut.traj").write_text(text[: len(text) // 2])
    with pytest.raises(IngestError, match=r"cut.traj: not valid JSON \(.* at line \d+ column \d+\)"):
        ingest_paths(store, [tmp_path / "runs"])
    report = ingest_paths(store, [tmp_path / "runs"], skip_bad=True)
    assert len(report.imported) == 1 and report.skipped[0]["path"].endswith("cut.traj")


def test_dedup_stores_the_shared_prompts_once(store: Store, tmp_path: Path) -> None:
    for index in range(4):
        episode = make_episode(f"repo__proj-{index}", 10 + index, target_bytes=3_000, model="m")
        write(tmp_path / f"repo__proj-{index}.traj.json", mini_swe_agent_v2(episode))
    report = ingest_paths(store, [tmp_path])
    assert report.dedup_saved_bytes > 3 * len(MINI_SYSTEM_V2.encode())
    templates = {store.runs.run(run_id).branches[0].transitions[1].text_ref for run_id in report.imported}
    assert len(templates) == 1  # the instance template, the task in it as {{task}}, is one body for all four


# ---------------------------------------------------------------------- SWE-bench results as held-out grades
def two_agents(root: Path, instances: list[str]) -> None:
    for number, model in enumerate(("openai/gpt-4o", "anthropic/claude-3-5")):
        for index, instance in enumerate(instances):
            episode = make_episode(instance, 100 * number + index, target_bytes=2_000, model=model)
            write(root / model.replace("/", "__") / instance / f"{instance}.traj.json", mini_swe_agent_v1(episode))


def summary(path: Path, resolved: list[str], unresolved: list[str], **extra: list[str]) -> Path:
    report = {"total_instances": 4, "submitted_instances": 4, "completed_instances": 4, "resolved_instances":
              len(resolved), "unresolved_instances": len(unresolved), "empty_patch_instances": 0,
              "error_instances": 0, "completed_ids": resolved + unresolved, "incomplete_ids": [],
              "empty_patch_ids": extra.get("empty_patch_ids", []), "submitted_ids": resolved + unresolved,
              "resolved_ids": resolved, "unresolved_ids": unresolved, "error_ids": extra.get("error_ids", []),
              "schema_version": 2}
    path.write_text(json.dumps(report, indent=4))
    return path


def test_summary_reports_grade_each_agent_by_file_name(store: Store, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    two_agents(tmp_path / "runs", ["a__a-1", "b__b-2", "c__c-3"])
    gpt = summary(tmp_path / "openai__gpt-4o.eval1.json", ["a__a-1"], ["b__b-2"], error_ids=["c__c-3"])
    claude = summary(tmp_path / "anthropic__claude-3-5.eval1.json", ["b__b-2", "zz__zz-9"], ["a__a-1"],
                     empty_patch_ids=["c__c-3"])
    out = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), "--results", str(gpt), "--results", str(claude),
                      "--store", str(tmp_path / "s.sqlite"))
    assert out["imported"] == 6 and out["states"] == {"graded": 5, "ungraded": 1} and out["evaluation_errors"] == 1
    assert out["unmatched_results"] == [{"instance": "zz__zz-9", "results": str(claude)}]
    assert out["results"] == [
        {"results": str(gpt), "agent": "openai/gpt-4o", "agent_from": "file name", "graded": 2},
        {"results": str(claude), "agent": "anthropic/claude-3-5", "agent_from": "file name", "graded": 3}]
    with Store.open(tmp_path / "s.sqlite") as opened:
        grade = {run_id: [g["label"] for g in opened.runs.run(run_id).grades] for run_id in opened.runs.run_ids()}
        assert grade == {"anthropic/claude-3-5/a__a-1": ["unresolved"], "anthropic/claude-3-5/b__b-2": ["resolved"],
                         "anthropic/claude-3-5/c__c-3": ["unresolved"], "openai/gpt-4o/a__a-1": ["resolved"],
                         "openai/gpt-4o/b__b-2": ["unresolved"], "openai/gpt-4o/c__c-3": []}
        resolved = opened.runs.run("openai/gpt-4o/a__a-1")
        assert resolved.lifecycle == ("running", "grading", "graded")
        assert resolved.grades == ({"grader": "swe-bench", "score": 1.0, "label": "resolved"},)
        assert opened.runs.run("openai/gpt-4o/c__c-3").state == "ungraded"  # an evaluation error is not a grade
        assert verify(opened).ok
    # The warning about results naming no run is one line on stderr.
    more = summary(tmp_path / "openai__gpt-4o.eval2.json", ["a__a-1", "q__q-1"], ["r__r-2"])
    done = kvjudge("ingest", str(tmp_path / "runs" / "openai__gpt-4o"), "--results", str(more), "--store",
                   str(tmp_path / "t.sqlite"))
    assert done.returncode == 0
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "2 result(s) name no run of this import: q__q-1, r__r-2" in warning[0]
    assert f"results {more}: graded 1 of openai/gpt-4o's runs (agent from the file name)" in done.stdout


def test_per_instance_reports_agent_prefix_and_ambiguity(store: Store, tmp_path: Path) -> None:
    two_agents(tmp_path / "runs", ["a__a-1", "b__b-2"])
    logs = tmp_path / "logs" / "run_evaluation" / "eval1"
    for instance, resolved in (("a__a-1", True), ("b__b-2", False)):
        (logs / "somemodel" / instance).mkdir(parents=True)
        (logs / "somemodel" / instance / "report.json").write_text(json.dumps({instance: {
            "patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True, "resolved": resolved,
            "tests_status": {"FAIL_TO_PASS": {"success": [], "failure": []}}}}))
    # Neither the folder nor the file names an agent, and both agents ran these instances: refused.
    with pytest.raises(IngestError, match=r"matches runs of 2 agents .*--results AGENT="):
        ingest_paths(store, [tmp_path / "runs"], results=[str(logs)])
    assert store.runs.run_ids() == []
    report = ingest_paths(store, [tmp_path / "runs"], results=[f"openai/gpt-4o={logs}"])
    assert report.states == {"graded": 2, "ungraded": 2}
    assert store.runs.run("openai/gpt-4o/b__b-2").grades[0]["label"] == "unresolved"
    assert store.runs.run("anthropic/claude-3-5/a__a-1").grades == ()


def test_results_are_part_of_a_runs_content(store: Store, tmp_path: Path) -> None:
    two_agents(tmp_path / "runs", ["a__a-1"])
    ingest_paths(store, [tmp_path / "runs"])
    results = summary(tmp_path / "openai__gpt-4o.e.json", ["a__a-1"], [])
    with pytest.raises(IngestError, match="already in the store with other content .*--results grades"):
        ingest_paths(store, [tmp_path / "runs"], results=[str(results)])
    with pytest.raises(IngestError, match="neither a SWE-bench summary report"):
        ingest_paths(store, [tmp_path / "runs"], results=[str(tmp_path / "runs" / "openai__gpt-4o" / "a__a-1" /
                                                       "a__a-1.traj.json")])


def test_show_displays_agent_and_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "m.traj.json", MINI_V1)
    store_path = str(tmp_path / "s.sqlite")
    cli_json_ok(capsys, "ingest", str(tmp_path / "m.traj.json"), "--store", store_path)
    run_id = "openai/gpt-4o-mini/marshmallow-code__marshmallow-1867"
    shown = cli_json_ok(capsys, "show", run_id, "--store", store_path)
    assert shown["agent"] == "openai/gpt-4o-mini" and shown["metadata"]["exit_status"] == "Submitted"
    human = kvjudge("show", run_id, "--store", store_path)
    assert "agent openai/gpt-4o-mini" in human.stdout and "exit_status Submitted" in human.stdout
    assert "cost 0.0421" in human.stdout and "api_calls 5" in human.stdout
    assert main(["ingest", str(tmp_path / "m.traj.json"), "--store", store_path, "--format", "swe-agent"]) == 1
    assert "m.traj.json: $.trajectory: missing (a list of steps expected) (swe-agent format)" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["mini-swe-agent", "swe-agent"])
def test_text_that_is_not_unicode_in_a_trajectory(store: Store, tmp_path: Path, fmt: str) -> None:
    """The untrusted-text check holds for the trajectory formats: refused naming the file and JSON path, or
    repaired to U+FFFD and noted with --repair-text."""
    if fmt == "mini-swe-agent":
        data = copy.deepcopy(MINI_V1)
        data["messages"][3]["content"] = "<returncode>0</returncode>\n<output>\ncut \ud800here\n</output>"
        name, where = "m.traj.json", r"\$\.messages\[3\]\.content"
    else:
        data = copy.deepcopy(SWE_V07)
        data["trajectory"][1]["observation"] = "cut \ud800here"
        name, where = "s.traj", r"\$\.trajectory\[1\]\.observation"
    path = tmp_path / name
    path.write_text(json.dumps(data))  # json.dumps writes the lone surrogate as the escape \ud800
    with pytest.raises(IngestError, match=rf"{name}: text at {where} is not valid Unicode: lone surrogate U\+D800"):
        ingest_paths(store, [path])
    assert store.runs.run_ids() == []
    report = ingest_paths(store, [path], repair_text=True)
    [run_id] = report.imported
    outputs = [store.blobs.text(t.tool_output["output_ref"]) for t in store.runs.run(run_id).branches[0].transitions
               if t.tool_output]
    assert any(output.startswith("cut \ufffdhere") for output in outputs)
    assert report.repaired[run_id][0]["code_units"] == 1 and verify(store).ok
    assert ingest_paths(store, [path], repair_text=True).already_present == [run_id]


def test_results_read_ahead_only_when_a_file_must_be_bound_by_its_name(store: Store, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from kvjudge.retention.ingest import importer

    # One note per document parsed: whether its bodies were hashed (the parse runs in the child that parses ahead).
    parses = CallLog(tmp_path / "parses.log")
    real = importer.parse_document
    monkeypatch.setattr(importer, "parse_document", lambda document, fmt, context:
                        parses.note(str(context.hashing)) or real(document, fmt, context))
    two_agents(tmp_path / "runs", ["a__a-1", "b__b-2"])
    named = summary(tmp_path / "eval1.json", ["a__a-1"], ["b__b-2"])
    report = ingest_paths(store, [tmp_path / "runs" / "openai__gpt-4o"], results=[f"openai/gpt-4o={named}"])
    assert report.states == {"graded": 2} and parses.lines() == ["True", "True"]  # AGENT= given: each parsed once
    parses.clear()
    by_name = summary(tmp_path / "anthropic__claude-3-5.eval1.json", ["a__a-1"], ["b__b-2"])
    report = ingest_paths(store, [tmp_path / "runs" / "anthropic__claude-3-5"], results=[str(by_name)])
    assert report.results[0]["agent_from"] == "file name" and report.states == {"graded": 2}
    # Bound by its name: whose runs they are is read first.
    assert parses.lines() == ["False", "False", "True", "True"]


def test_each_trajectory_file_is_opened_once(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two_agents(tmp_path / "runs", ["a__a-1", "b__b-2"])
    opened = CallLog(tmp_path / "opened.log")  # the files are read by the child that parses ahead
    real = Path.open
    monkeypatch.setattr(Path, "open", lambda path, *args, **kwargs:
                        (path != opened.path and opened.note(str(path))) or real(path, *args, **kwargs))
    assert len(ingest_paths(store, [tmp_path / "runs"]).imported) == 4
    files = sorted((tmp_path / "runs").rglob("*.traj.json"))
    assert len(files) == 4 and sorted(opened.lines()) == [str(path) for path in files]
