"""Importing runs: the native format, OpenAI chat format, detection, and malformed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention.ingest import parse_native
from kvjudge.retention.synthetic import make_run, write_jsonl

CONTRACT_EXAMPLE = {
    "id": "run-1", "tenant": "default", "task": {"id": "fix-csv-quoting", "prompt": "Fix quoting."},
    "lifecycle": ["running", "grading", "graded"],
    "branches": [
        {"id": "main", "status": "live", "parent": None, "fork_at": None, "transitions": [
            {"role": "user", "text": "please"},
            {"role": "assistant", "text": "testing", "tool_call": {"name": "bash", "arguments": "pytest -q"},
             "usage": {"input_tokens": 1234, "output_tokens": 56}, "context": {"system": 300, "history": 900, "tools": 34}},
            {"role": "tool", "tool_output": {"name": "bash", "output": "1 failed", "exit_code": 1}}]},
        {"id": "attempt-1", "status": "dead", "parent": "main", "fork_at": 2,
         "transitions": [{"role": "assistant", "text": "retry"}]}],
    "verifier": [{"name": "pytest", "passed": True, "detail": "12 passed"}],
    "grades": [{"grader": "human", "score": 1.0, "label": "pass"}]}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "store.sqlite") as opened:
        yield opened


def events_count(store: Store) -> int:
    return store.connection.execute("SELECT COUNT(*) FROM events").fetchone()[0]


def test_contract_example_imports(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [CONTRACT_EXAMPLE])
    assert store.ingest_file(path) == ["run-1"]
    state = store.run("run-1")
    call = state.branches[0].transitions[1]
    assert call.tool_call["name"] == "bash" and store.text(call.tool_call["arguments_ref"]) == "pytest -q"
    assert call.usage == {"input_tokens": 1234, "output_tokens": 56} and call.context["history"] == 900
    assert state.branches[0].transitions[2].tool_output["exit_code"] == 1
    assert state.branches[1].fork_at == 2 and state.branches[1].parent == "main"
    assert store.text(state.task_prompt_ref) == "Fix quoting."


def test_schema_file_lists_the_fields_the_parser_accepts() -> None:
    schema = json.loads((Path(__file__).parents[1] / "kvjudge" / "schemas" / "run.schema.json").read_text())
    assert set(schema["properties"]) == set(CONTRACT_EXAMPLE)
    transition = schema["$defs"]["transition"]["properties"]
    assert set(transition) == {"role", "text", "tool_call", "tool_output", "usage", "context"}
    bad = dict(CONTRACT_EXAMPLE, colour="blue")
    with pytest.raises(Exception, match="unknown field"):
        parse_native(bad, None)


def test_openai_chat_lines_land_as_ungraded_one_branch_runs(store: Store, tmp_path: Path) -> None:
    lines = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello"}]},
        {"id": "chat-tools", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list "}, {"type": "text", "text": "files"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": {"path": "a"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            {"role": "assistant", "content": "done"}]},
    ]
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, lines)
    ids = store.ingest_file(path, tenant="acme")
    assert ids[1] == "chat-tools" and ids[0].startswith("chat-")
    for run_id in ids:
        state = store.run(run_id)
        assert state.state == "ungraded" and state.lifecycle == ("running", "grading", "ungraded")
        assert len(state.branches) == 1 and state.tenant == "acme" and state.is_reducible
    tools = store.run("chat-tools").branches[0].transitions
    assert store.text(tools[0].text_ref) == "list files"
    assert [t.tool_call["name"] for t in tools[1:3]] == ["bash", "cat"]
    assert store.text(tools[2].tool_call["arguments_ref"]) == '{"path":"a"}'
    assert tools[3].tool_output["name"] == "bash" and store.text(tools[3].tool_output["output_ref"]) == "a.py"


def test_same_openai_file_twice_names_the_same_runs(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, [{"messages": [{"role": "user", "content": "hi"}]}])
    store.ingest_file(path)
    with pytest.raises(IngestError, match=r"chat.jsonl:1: run 'chat-[0-9a-f]{16}' is already in the store"):
        store.ingest_file(path)


def test_malformed_json_names_the_line_and_writes_nothing(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    good = json.dumps(make_run("good", ["x"]))
    path.write_text(good + "\n\n" + '{"id": "bad", "branches": [' + "\n")
    with pytest.raises(IngestError, match=r"runs.jsonl:3: not valid JSON"):
        store.ingest_file(path)
    assert events_count(store) == 0 and store.run_ids() == []
    assert store.connection.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.pop("id"), "run.id must be a non-empty string"),
    (lambda r: r.update(lifecycle=["running", "graded"]), "lifecycle step running → graded"),
    (lambda r: r["branches"][0]["transitions"][1].update(role="robot"), r"transitions\[1\].role must be one of"),
    (lambda r: r["branches"][0]["transitions"][1].update(usage={"input_tokens": -1}), "non-negative integer"),
    (lambda r: r["branches"][1].update(parent="nowhere"), "must name an earlier branch"),
    (lambda r: r["grades"][0].update(score="high"), "numeric score"),
    (lambda r: r["branches"][0].update(id="attempt-1"), "is used twice"),
])
def test_bad_fields_name_line_and_field(store: Store, tmp_path: Path, mutate, message: str) -> None:
    run = make_run("r2", ["out"], dead=[["d"]])
    mutate(run)
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["fine"]), run])
    with pytest.raises(IngestError, match=f"runs.jsonl:2: .*{message}"):
        store.ingest_file(path)
    assert store.run_ids() == [] and events_count(store) == 0


def test_duplicate_ids_in_one_file(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("same", ["a"]), make_run("same", ["b"])])
    with pytest.raises(IngestError, match="runs.jsonl:2: run id 'same' appears twice"):
        store.ingest_file(path)


def test_format_detection_and_forcing(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("n1", ["a"])])
    with pytest.raises(IngestError, match="expected an OpenAI chat line"):
        store.ingest_file(path, fmt="openai")
    with pytest.raises(IngestError, match="unknown format"):
        store.ingest_file(path, fmt="csv")
    assert store.ingest_file(path) == ["n1"]


def test_missing_file_and_bad_utf8(store: Store, tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="does not exist"):
        store.ingest_file(tmp_path / "absent.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "\xe9"}\n')
    with pytest.raises(IngestError, match="latin1.jsonl:1: not UTF-8"):
        store.ingest_file(path)


def test_a_crash_inside_the_ingest_transaction_leaves_nothing_of_that_run(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["one"])])
    store_path = tmp_path / "store.sqlite"
    child = subprocess.run([sys.executable, "-m", "kvjudge", "ingest", str(path), "--store", str(store_path)],
                           env={**os.environ, "KVJUDGE_FAULTS": "ingest.txn"}, capture_output=True, text=True)
    assert child.returncode == -9  # SIGKILL
    with Store.open(store_path) as store:
        assert store.run_ids() == [] and events_count(store) == 0
        assert store.connection.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0
