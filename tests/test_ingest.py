"""Importing runs: the native format (checked by the shipped JSON Schema), OpenAI chat lines, files and
directories, .gz, detection, bad input (one line, nothing written), and re-imports (#16)."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CallLog, cli_json, kvjudge, sql, store_snapshot

from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.ingest.trials import stored_content_hash
from kvjudge.retention.ingest.native import parse_native, schema
from kvjudge.retention.verify import verify
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

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


def events_count(store: Store) -> int:
    return sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0]


def test_contract_example_imports(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [CONTRACT_EXAMPLE])
    assert ingest_paths(store, [path]).runs == ["run-1"]
    state = store.runs.run("run-1")
    call = state.branches[0].transitions[1]
    assert call.tool_call["name"] == "bash" and store.blobs.text(call.tool_call["arguments_ref"]) == "pytest -q"
    assert call.usage == {"input_tokens": 1234, "output_tokens": 56} and call.context["history"] == 900
    assert state.branches[0].transitions[2].tool_output["exit_code"] == 1
    assert state.branches[1].fork_at == 2 and state.branches[1].parent == "main"
    assert store.blobs.text(state.task_prompt_ref) == "Fix quoting."
    assert state.agent is None and state.metadata is None


def test_agent_and_metadata_are_part_of_the_native_format(store: Store, tmp_path: Path) -> None:
    assert {"agent", "metadata"} <= set(schema()["properties"])
    run = dict(CONTRACT_EXAMPLE, id="run-2", agent="gpt-x",
               metadata={"exit_status": "Submitted", "cost": 0.25, "api_calls": 7})
    write_jsonl(tmp_path / "runs.jsonl", [run, dict(CONTRACT_EXAMPLE, id="run-3")])
    report = ingest_paths(store, [tmp_path / "runs.jsonl"], agent=None)
    assert report.imported == ["run-2", "run-3"]
    state = store.runs.run("run-2")
    assert state.agent == "gpt-x" and state.metadata == {"exit_status": "Submitted", "cost": 0.25, "api_calls": 7}
    # --agent names the agent of every run of the import.
    write_jsonl(tmp_path / "other.jsonl", [dict(CONTRACT_EXAMPLE, id="run-4", agent="gpt-x")])
    ingest_paths(store, [tmp_path / "other.jsonl"], agent="override")
    assert store.runs.run("run-4").agent == "override"
    assert store.runs.refold("run-2").canonical_bytes() == store.runs.projected_bytes("run-2")


def test_runs_without_the_new_fields_keep_their_old_bytes(store: Store, tmp_path: Path) -> None:
    """A log written before agent/metadata existed re-folds to the projection it always had."""
    write_jsonl(tmp_path / "runs.jsonl", [CONTRACT_EXAMPLE])
    ingest_paths(store, [tmp_path / "runs.jsonl"]).runs
    first = sql(store).execute("SELECT payload FROM events ORDER BY lsn LIMIT 1").fetchone()[0]
    assert "agent" not in json.loads(first) and "metadata" not in json.loads(first)
    state_json = json.loads(store.runs.projected_bytes("run-1"))
    assert "agent" not in state_json and "metadata" not in state_json
    assert verify(store).ok


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.pop("id"), r"\$: is missing the required field id"),
    (lambda r: r.update(id="  "), r"\$\.id: must not be blank"),
    (lambda r: r.update(lifecycle=["running", "graded"]), r"\$\.lifecycle: lifecycle step running → graded"),
    (lambda r: r["branches"][0]["transitions"][1].update(role="robot"),
     r"\$\.branches\[0\]\.transitions\[1\]\.role: must be one of"),
    (lambda r: r["branches"][0]["transitions"][1].update(usage={"input_tokens": -1}),
     r"\$\.branches\[0\]\.transitions\[1\]\.usage\.input_tokens: must be at least 0"),
    (lambda r: r["branches"][1].update(parent="nowhere"), r"\$\.branches\[1\]\.parent: 'nowhere' must name an earlier"),
    (lambda r: r["grades"][0].update(score="high"), r"\$\.grades\[0\]\.score: must be a number"),
    (lambda r: r["branches"][0].update(id="attempt-1"), r"\$\.branches\[1\]\.id: branch id 'attempt-1' is used twice"),
    (lambda r: r.update(metadata={"cost": [1]}), r"\$\.metadata\.cost: must be a number or null"),
])
def test_bad_fields_name_line_and_field(store: Store, tmp_path: Path, mutate, message: str) -> None:
    run = make_run("r2", ["out"], dead=[["d"]])
    mutate(run)
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["fine"]), run])
    before = store_snapshot(store)
    with pytest.raises(IngestError, match=f"runs.jsonl:2: {message}") as caught:
        ingest_paths(store, [path]).runs
    assert "\n" not in str(caught.value) and "nothing was imported" in str(caught.value)
    assert store_snapshot(store) == before and store.runs.run_ids() == []


SCHEMA = json.loads((Path(__file__).parents[1] / "kvjudge" / "schemas" / "run.schema.json").read_text())
# One value of each JSON type; a value is wrong for a property when its type is not among the property's types.
SAMPLES = ["text", 7, 1.5, True, [], {}, None]


def _json_types(value: object) -> set[str]:
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    kinds = {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}
    return {kinds[type(value)]}


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _types(node: dict) -> set[str] | None:
    """The JSON types ``node`` allows (None: any)."""
    node = _resolve(node)
    if "anyOf" in node:
        branches = [_types(branch) for branch in node["anyOf"]]
        return None if None in branches else set().union(*branches)
    kind = node.get("type")
    return None if kind is None else set(kind) if isinstance(kind, list) else {kind}


def _branch_for(node: dict, instance: object) -> dict:
    """The part of ``node`` that describes ``instance`` (the matching branch of an ``anyOf``)."""
    node = _resolve(node)
    if "anyOf" not in node:
        return node
    return next(_resolve(branch) for branch in node["anyOf"]
                if _types(branch) is None or _json_types(instance) & _types(branch))


def _violations(node: dict, instance: object, path: tuple) -> Iterator[tuple[str, tuple, object]]:
    """``(what, path, value)``: each way to break one constraint the schema puts on ``instance`` (``value`` is
    the replacement at ``path``; ``_DELETE`` removes the key)."""
    allowed = _types(node)
    node = _branch_for(node, instance)
    if path:  # the line itself being an object is checked by the JSON parse
        for value in SAMPLES:
            if allowed is not None and not _json_types(value) & allowed:
                yield f"{'/'.join(map(str, path))} = {value!r} (type {sorted(allowed)})", path, value
        if "enum" in node:
            yield f"{'/'.join(map(str, path))} outside {node['enum']}", path, "bogus"
        if "minimum" in node:
            yield f"{'/'.join(map(str, path))} below {node['minimum']}", path, node["minimum"] - 1
        if "minLength" in node:
            yield f"{'/'.join(map(str, path))} empty", path, ""
        if "minItems" in node:
            yield f"{'/'.join(map(str, path))} with no items", path, []
    if isinstance(instance, dict):
        for key in node.get("required", []):
            yield f"{'/'.join(map(str, (*path, key)))} missing", (*path, key), _DELETE
        if node.get("additionalProperties") is False:
            yield f"{'/'.join(map(str, path)) or 'run'} with an unknown field", (*path, "colour"), "blue"
        for key, value in instance.items():
            child = node.get("properties", {}).get(key)
            if child is None and isinstance(node.get("additionalProperties"), dict):
                child = node["additionalProperties"]
            if child is not None:
                yield from _violations(child, value, (*path, key))
    if isinstance(instance, list) and "items" in node:
        for index, item in enumerate(instance):
            yield from _violations(node["items"], item, (*path, index))


_DELETE = object()


def _with(document: dict, path: tuple, value: object) -> dict:
    changed = copy.deepcopy(document)
    parent = changed
    for key in path[:-1]:
        parent = parent[key]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return changed


def _field_named(path: tuple) -> str:
    """The last named field of a path (``lifecycle`` for ``lifecycle/0``)."""
    return next(str(key) for key in reversed(path) if isinstance(key, str))


# The contract's example with every optional part the schema describes filled in.
SCHEMA_EXAMPLE = {**CONTRACT_EXAMPLE, "agent": "gpt-x", "trial": "1",
                  "metadata": {"exit_status": "Submitted", "cost": 0.25, "api_calls": 7, "harness": "mini"}}
VIOLATIONS = list(_violations(SCHEMA, SCHEMA_EXAMPLE, ()))


def test_the_example_covers_every_constraint_of_the_schema() -> None:
    # Every property the schema describes appears in the example, so every constraint below is exercised.
    named = {key for what, path, _ in VIOLATIONS for key in path if isinstance(key, str)}
    described: set[str] = set()

    def collect(node: dict) -> None:
        for key, child in node.get("properties", {}).items():
            if _types(child) is not None or "enum" in _resolve(child):  # ``arguments`` may be any JSON value
                described.add(key)
            collect(child)
        for child in (node.get("items"), *node.get("anyOf", ())):
            if isinstance(child, dict):
                collect(child)

    collect(SCHEMA)
    for part in SCHEMA["$defs"].values():
        collect(part)
    assert described - named == set()
    assert len(VIOLATIONS) > 100


def test_ingest_refuses_what_the_schema_forbids(store: Store, tmp_path: Path) -> None:
    """Each violation alone, as its own file: refused with one line naming the file, the line and the field,
    and nothing written."""
    accepted, unclear = [], []
    for index, (what, path, value) in enumerate(VIOLATIONS):
        source = tmp_path / f"runs-{index}.jsonl"
        write_jsonl(source, [_with(SCHEMA_EXAMPLE, path, value)])
        try:
            ingest_paths(store, [source], fmt="native").runs
        except IngestError as refused:
            message = str(refused)
            if not (f"{source}:1" in message and _field_named(path) in message and "\n" not in message):
                unclear.append(f"{what}: {message}")
        else:
            accepted.append(what)
    assert accepted == [] and unclear == []
    assert events_count(store) == 0


@pytest.mark.parametrize(("path", "value"), [
    (("tenant",), None), (("task", "id"), None), (("task", "prompt"), None),
    (("branches", 0, "transitions", 0, "text"), None), (("branches", 1, "parent"), None),
    (("branches", 1, "fork_at"), None), (("branches", 0, "transitions", 2, "tool_output", "exit_code"), None),
    (("branches", 0, "transitions", 1, "tool_call", "arguments"), {"cmd": ["pytest", "-q"]}),
    (("task",), _DELETE), (("lifecycle",), _DELETE), (("verifier",), _DELETE), (("grades",), _DELETE),
    (("branches", 0, "status"), _DELETE), (("branches", 0, "transitions", 1, "usage"), _DELETE),
    (("grades", 0, "score"), 1), (("agent",), None), (("metadata", "harness"), None), (("metadata",), _DELETE),
    (("task",), None), (("branches", 0, "transitions", 1, "tool_call"), None),
    (("branches", 0, "transitions", 2, "tool_output"), None), (("branches", 0, "transitions", 1, "usage"), None),
    (("branches", 0, "transitions", 1, "context"), None),
])
def test_ingest_accepts_what_the_schema_allows(store: Store, tmp_path: Path, path: tuple, value: object) -> None:
    source = tmp_path / "runs.jsonl"
    write_jsonl(source, [_with(SCHEMA_EXAMPLE, path, value)])
    assert ingest_paths(store, [source], fmt="native").runs == ["run-1"]


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
    ids = ingest_paths(store, [path], tenant="acme").runs
    assert ids[1] == "chat-tools" and ids[0].startswith("chat-")
    for run_id in ids:
        state = store.runs.run(run_id)
        assert state.state == "ungraded" and state.lifecycle == ("running", "grading", "ungraded")
        assert len(state.branches) == 1 and state.tenant == "acme" and state.is_reducible
    tools = store.runs.run("chat-tools").branches[0].transitions
    assert store.blobs.text(tools[0].text_ref) == "list files"
    assert [t.tool_call["name"] for t in tools[1:3]] == ["bash", "cat"]
    assert store.blobs.text(tools[2].tool_call["arguments_ref"]) == '{"path":"a"}'
    assert tools[3].tool_output["name"] == "bash" and store.blobs.text(tools[3].tool_output["output_ref"]) == "a.py"


def test_the_same_file_again_is_already_present(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, [{"messages": [{"role": "user", "content": "hi"}]}, make_run("n1", ["a"])])
    first = ingest_paths(store, [path])
    before = store_snapshot(store)
    again = ingest_paths(store, [path])
    assert len(first.imported) == 2 and first.imported == again.already_present and again.imported == []
    assert again.runs == first.runs and store_snapshot(store) == before


def test_same_id_other_content_is_refused_with_both_hashes(store: Store, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [make_run("same", ["one"])])
    ingest_paths(store, [tmp_path / "a.jsonl"]).runs
    stored = stored_content_hash(store, "same", 0)
    write_jsonl(tmp_path / "b.jsonl", [make_run("fresh", ["x"]), make_run("same", ["two"])])
    before = store_snapshot(store)
    with pytest.raises(IngestError) as caught:
        ingest_paths(store, [tmp_path / "b.jsonl"])
    message = str(caught.value)
    assert "b.jsonl:2:" in message and "'same'" in message and stored in message
    assert len(set(part for part in message.split() if part.startswith("sha256:"))) == 2
    assert store_snapshot(store) == before


def test_duplicate_ids_in_one_import(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("same", ["a"]), make_run("same", ["b"])])
    with pytest.raises(IngestError, match=r"runs.jsonl:2: run 'same' appears twice with different content "
                                          r"\(.*runs.jsonl:1: sha256:"):
        ingest_paths(store, [path]).runs
    assert events_count(store) == 0
    # The same run twice (here: a file and its gzipped copy) is one run; the second is already present.
    (tmp_path / "dir").mkdir()
    write_jsonl(tmp_path / "dir" / "x.jsonl", [make_run("twice", ["a"])])
    (tmp_path / "dir" / "y.jsonl.gz").write_bytes(gzip.compress((tmp_path / "dir" / "x.jsonl").read_bytes()))
    report = ingest_paths(store, [tmp_path / "dir"])
    assert report.imported == ["twice"] and report.already_present == ["twice"]


def test_legacy_runs_without_a_recorded_hash_are_recognised(store: Store, tmp_path: Path) -> None:
    """Runs imported before content hashes existed: the hash is computed over their logged events."""
    run = parse_native(make_run("old", ["a", "b"]))
    with store.transaction("ingest"):
        store.blobs.put_hashed(run.bodies.items())
        store.events.append_many("old", run.events)  # no settle(): RunStarted carries no content_hash
    write_jsonl(tmp_path / "runs.jsonl", [make_run("old", ["a", "b"])])
    assert ingest_paths(store, [tmp_path / "runs.jsonl"]).already_present == ["old"]
    write_jsonl(tmp_path / "changed.jsonl", [make_run("old", ["a", "c"])])
    with pytest.raises(IngestError, match="already in the store with other content"):
        ingest_paths(store, [tmp_path / "changed.jsonl"])


def test_malformed_json_names_the_line_and_writes_nothing(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    good = json.dumps(make_run("good", ["x"]))
    path.write_text(good + "\n\n" + '{"id": "bad", "branches": [' + "\n")
    with pytest.raises(IngestError, match=r"runs.jsonl:3: not valid JSON"):
        ingest_paths(store, [path]).runs
    assert events_count(store) == 0 and store.runs.run_ids() == []
    assert sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


def test_format_detection_and_forcing(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("n1", ["a"])])
    with pytest.raises(IngestError, match="expected an OpenAI chat line"):
        ingest_paths(store, [path], fmt="openai").runs
    with pytest.raises(IngestError, match="unknown format"):
        ingest_paths(store, [path], fmt="csv").runs
    assert ingest_paths(store, [path]).runs == ["n1"]


def test_missing_file_and_bad_utf8(store: Store, tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="does not exist"):
        ingest_paths(store, [tmp_path / "absent.jsonl"]).runs
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "\xe9"}\n')
    with pytest.raises(IngestError, match="latin1.jsonl:1: not UTF-8"):
        ingest_paths(store, [path]).runs


def test_directories_are_walked_and_gzip_is_read(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "b" / "deeper").mkdir(parents=True)
    write_jsonl(root / "a.jsonl", [make_run("a1", ["x"])])
    with gzip.open(root / "b" / "deeper" / "c.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(make_run("c1", ["y"])) + "\n" + json.dumps(make_run("c2", ["z"])) + "\n")
    (root / "b" / "notes.txt").write_text("not a run")
    (root / "b" / "preds.json").write_text("{}")
    write_jsonl(tmp_path / "loose.data", [make_run("loose", ["w"])])  # named directly: read whatever its name
    report = ingest_paths(store, [root, tmp_path / "loose.data"])
    assert report.imported == ["a1", "c1", "c2", "loose"] and report.ignored_files == 2 and report.files == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("hi")
    with pytest.raises(IngestError, match=r"empty: no run files in this directory"):
        ingest_paths(store, [empty])


def test_a_truncated_gzip_file_is_named(store: Store, tmp_path: Path) -> None:
    data = gzip.compress((json.dumps(make_run("a", ["x" * 5000])) + "\n").encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(IngestError, match=r"cut.jsonl.gz: cannot be read \(the compressed stream ends early\)"):
        ingest_paths(store, [tmp_path / "cut.jsonl.gz"])
    assert events_count(store) == 0


def test_skip_bad_imports_the_rest_and_lists_the_skipped(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    write_jsonl(root / "1-good.jsonl", [make_run("g1", ["x"])])
    (root / "2-bad.jsonl").write_text('{"id": "b1", "branches": [}\n')
    write_jsonl(root / "3-good.jsonl", [make_run("g2", ["y"])])
    before = store_snapshot(store)
    with pytest.raises(IngestError, match=r"2-bad.jsonl:1: not valid JSON .*nothing was imported"):
        ingest_paths(store, [root])
    assert store_snapshot(store) == before
    report = ingest_paths(store, [root], skip_bad=True)
    assert report.imported == ["g1", "g2"] and [s["path"] for s in report.skipped] == [str(root / "2-bad.jsonl")]
    assert "not valid JSON" in report.skipped[0]["error"]


def test_cli_counts_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    write_jsonl(root / "a.jsonl", [make_run("a1", ["x"]), make_run("a2", ["y"], lifecycle=("running",))])
    (root / "z.jsonl").write_text("[1, 2]\n")
    store_path = str(tmp_path / "store.sqlite")
    code, out = cli_json(capsys, "ingest", str(root), "--store", store_path, "--skip-bad")
    assert code == 0 and out["imported"] == 2 and out["already_present"] == 0 and out["skipped"] == 1
    assert out["states"] == {"graded": 1, "running": 1} and out["ingested"] == ["a1", "a2"]
    assert "is none of the formats" in out["skipped_files"][0]["error"]
    code, out = cli_json(capsys, "ingest", str(root / "a.jsonl"), "--store", store_path)
    assert code == 0 and (out["imported"], out["already_present"], out["skipped"]) == (0, 2, 0)
    done = kvjudge("ingest", str(root / "z.jsonl"), "--store", store_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "z.jsonl:1: $: is none of the formats" in done.stderr
    human = kvjudge("ingest", str(root / "a.jsonl"), "--store", store_path)
    assert human.returncode == 0 and "imported 0 run(s), 2 already present, 0 file(s) skipped" in human.stdout


def test_a_crash_inside_the_ingest_transaction_leaves_nothing_of_that_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["one"])])
    store_path = tmp_path / "store.sqlite"
    child = kvjudge("ingest", str(path), "--store", str(store_path), faults="ingest.txn")
    assert child.returncode == -9  # SIGKILL
    with Store.open(store_path) as store:
        assert store.runs.run_ids() == [] and events_count(store) == 0
        assert sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0


def test_the_content_hash_is_recorded_and_covers_every_event(store: Store, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "runs.jsonl", [make_run("h", ["a"])])
    ingest_paths(store, [tmp_path / "runs.jsonl"]).runs
    logged = [event for _, event in store.events.iter_events("h")]
    assert isinstance(logged[0], ev.RunStarted) and logged[0].content_hash == ev.content_hash(logged)


def test_each_document_is_parsed_once(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvjudge.retention.ingest import importer

    parsed = CallLog(tmp_path / "parsed.log")  # the parse runs in the child that parses ahead
    real = importer.parse_document
    monkeypatch.setattr(importer, "parse_document",
                        lambda document, *args: parsed.note(document.where) or real(document, *args))
    runs = tmp_path / "runs"
    write_jsonl(runs / "a.jsonl", [make_run("a1", ["x"]), make_run("a2", ["y"])])
    write_jsonl(runs / "b.jsonl", [make_run("b1", ["z"])])
    assert ingest_paths(store, [runs]).imported == ["a1", "a2", "b1"]
    assert parsed.lines() == [f"{runs / 'a.jsonl'}:1", f"{runs / 'a.jsonl'}:2", f"{runs / 'b.jsonl'}:1"]
    parsed.clear()
    assert ingest_paths(store, [runs]).already_present == ["a1", "a2", "b1"] and len(parsed.lines()) == 3


def test_a_file_is_imported_whole_or_not_at_all(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    write_jsonl(root / "1-good.jsonl", [make_run("g1", ["x"])])
    with (root / "2-half.jsonl").open("w") as handle:  # good lines, then a bad one: none of the file is kept
        handle.write(json.dumps(make_run("h1", [HALF_ONLY])) + "\n" + json.dumps(make_run("h2", ["b"])) + "\n")
        handle.write('{"id": "h3", "branches": [}\n')
    write_jsonl(root / "3-good.jsonl", [make_run("g2", ["y"])])
    report = ingest_paths(store, [root], skip_bad=True)
    assert report.imported == ["g1", "g2"] and report.runs == ["g1", "g2"]
    assert [s["path"] for s in report.skipped] == [str(root / "2-half.jsonl")]
    assert store.runs.run_ids() == ["g1", "g2"] and verify(store).ok
    # The bodies only the dropped file held were not kept either (the kept files' are there).
    bodies = [body for _, body in store.blobs.iter_bodies()]
    assert b"x\n12 passed in 0.31s" in bodies
    assert not any(HALF_ONLY.encode() in body for body in bodies)


HALF_ONLY = "output that only the half-good file holds"


def test_an_import_writes_through_a_page_cache_that_holds_a_batch(store: Store, tmp_path: Path) -> None:
    from kvjudge.retention.ingest.importer import BATCH_BYTES, IMPORT_PAGE_CACHE_MIB

    def cache_kib() -> int:  # the store's own connection's (negative: KiB)
        return -int(store._conn.execute("PRAGMA cache_size").fetchone()[0])

    before = cache_kib()
    seen: list[int] = []
    write_jsonl(tmp_path / "a.jsonl", [make_run("a1", ["x"])])
    ingest_paths(store, [tmp_path / "a.jsonl"], progress=lambda files, description: seen.append(cache_kib()))
    assert seen and set(seen) == {IMPORT_PAGE_CACHE_MIB * 1024} and IMPORT_PAGE_CACHE_MIB << 20 > BATCH_BYTES
    assert cache_kib() == before  # and the store's own size again after


def test_only_a_file_of_several_runs_to_write_opens_a_savepoint(store: Store, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A savepoint journals every page the file changes: a file that writes one run needs none (everything that
    # can refuse it comes before its write), one that writes two or more gets one, so a later refusal undoes it.
    opened: list[str] = []
    real = store.savepoint
    monkeypatch.setattr(store, "savepoint", lambda name: opened.append(name) or real(name))
    write_jsonl(tmp_path / "a.jsonl", [make_run("a1", ["x"])])
    write_jsonl(tmp_path / "b.jsonl", [make_run("b1", ["y"]), make_run("b2", ["z"])])
    write_jsonl(tmp_path / "c.jsonl", [make_run("a1", ["x"]), make_run("c1", ["w"])])  # a1 is there already
    assert ingest_paths(store, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]).imported == ["a1", "b1", "b2"]
    assert opened == ["ingest_file"]
    assert ingest_paths(store, [tmp_path / "c.jsonl"]).imported == ["c1"] and opened == ["ingest_file"]
    with (tmp_path / "d.jsonl").open("w") as handle:  # one run to write, then a refused document
        handle.write(json.dumps(make_run("d1", [HALF_ONLY])) + "\n" + '{"id": "d2", "branches": [}\n')
    report = ingest_paths(store, [tmp_path / "d.jsonl"], skip_bad=True)
    assert report.imported == [] and len(report.skipped) == 1 and opened == ["ingest_file"]
    assert "d1" not in store.runs.run_ids() and verify(store).ok
    assert not any(HALF_ONLY.encode() in body for _, body in store.blobs.iter_bodies())


def test_a_bad_file_after_committed_batches_says_what_was_imported(store: Store, tmp_path: Path) -> None:
    from kvjudge.retention.ingest.importer import BATCH_RUNS

    root = tmp_path / "runs"
    root.mkdir()
    for index in range(BATCH_RUNS + 6):
        write_jsonl(root / f"a-{index:03d}.jsonl", [make_run(f"r{index:03d}", [f"out {index}"])])
    (root / "b-bad.jsonl").write_text('{"id": "bad", "branches": [}\n')
    write_jsonl(root / "c-late.jsonl", [make_run("late", ["z"])])
    with pytest.raises(IngestError) as caught:
        ingest_paths(store, [root])
    message = str(caught.value)
    assert "\n" not in message and "b-bad.jsonl:1: not valid JSON" in message
    # The first batch (BATCH_RUNS whole files) was committed; the files since, in the open batch, were not.
    assert f"{BATCH_RUNS} run(s) of the files before it were imported, nothing since" in message
    assert store.runs.run_ids() == [f"r{index:03d}" for index in range(BATCH_RUNS)] and verify(store).ok
    (root / "b-bad.jsonl").write_text(json.dumps(make_run("bad", ["fixed"])) + "\n")
    report = ingest_paths(store, [root])
    assert len(report.already_present) == BATCH_RUNS and len(report.imported) == 6 + 2
