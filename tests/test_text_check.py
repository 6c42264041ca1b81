"""Run text that is not Unicode at ingest: refused with file, line and JSON path, or repaired to U+FFFD and noted
on the run (#17). Also what Python's JSON decoder accepts but the store cannot hold: NaN, huge integers, nesting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cli_json_ok, sql, store_snapshot
from kvjudge.cli import main
from kvjudge.errors import IngestError
from kvjudge.retention import Store, TextError, verify
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import canonical_json
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.state import RunState
from kvjudge.retention import text_check
from kvjudge.retention.text_check import MAX_DEPTH, parse_checked, repair, scan
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

LONE = "\ud800"


def bad_native_run(run_id: str = "r2") -> dict:
    """A run with lone surrogates in a text body, a tool output, structured tool-call arguments (a value and a
    key), a verifier detail (not a body), beside a body that holds a genuine U+FFFD and is not repaired."""
    run = make_run(run_id, ["clean output", f"cut {LONE}here"], prompt="prompt with a real \ufffd already")
    live = run["branches"][0]["transitions"]
    live[1]["text"] = f"step {LONE}{LONE}"
    live[3]["tool_call"]["arguments"] = {"path": f"a{LONE}", "k\udfff": 1}
    run["verifier"][0]["detail"] = "\udc80 passed"
    return run


def test_scan_names_the_first_bad_string_by_its_json_path() -> None:
    doc = {"a": [1, "ok", {"weird key": ["x", f"y{LONE}"]}], "z": LONE}
    first = scan(doc, first_only=True)
    assert [(b.path, b.index, b.code_unit, b.in_key) for b in first] == [('$.a[2]["weird key"][1]', 1, 0xD800, False)]
    every = scan({"m": [{f"k{LONE}": "v"}], "n": "fine", "o": f"\udfff{LONE}"}, first_only=False)
    assert [(b.path, b.in_key) for b in every] == [('$.m[0]["k\\ud800"]', True), ("$.o", False)]
    assert scan({"ascii": "x", "text": "naïve — ✓ \U0001f600"}, first_only=False) == []


def test_scan_refuses_what_json_allows_but_the_store_cannot_hold() -> None:
    with pytest.raises(TextError, match=r"number at \$\.score is nan, which JSON does not allow"):
        scan({"score": float("nan")}, first_only=True)
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(TextError, match=f"nested deeper than {MAX_DEPTH} levels"):
        scan({"x": deep}, first_only=False)
    fine: list = []
    for _ in range(MAX_DEPTH - 2):
        fine = [fine]
    assert scan({"x": fine}, first_only=True) == []


documents = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(st.characters(exclude_categories=()))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(st.characters(exclude_categories=())), inner,
                                                                max_size=3), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(documents, st.integers(0, MAX_DEPTH + 2))
def test_the_fast_path_agrees_with_the_scan(document: object, depth: int) -> None:
    for _ in range(depth if depth > MAX_DEPTH - 3 else 0):
        document = [document]
    try:
        clean_by_scan = scan(document, first_only=False) == []
    except TextError:
        clean_by_scan = False
    scanned: list[object] = []

    def counted_scan(checked: object, *, first_only: bool) -> list:
        scanned.append(checked)
        return scan(checked, first_only=first_only)

    # parse_checked scans only what its fast path did not find clean: a clean document is never scanned, and a
    # document with bad text is refused.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_check, "scan", counted_scan)
        try:
            parse_checked(document, lambda checked: checked)
            accepted = True
        except TextError:
            accepted = False
    assert accepted == clean_by_scan
    assert (not scanned) == clean_by_scan


def test_repair_replaces_each_bad_code_unit_and_never_merges_keys() -> None:
    fixed, count = repair({"a": [f"{LONE}x{LONE}"], f"k{LONE}": "\udc80"})
    assert fixed == {"a": ["\ufffdx\ufffd"], "k\ufffd": "\ufffd"} and count == 4
    with pytest.raises(TextError, match=r"two keys of the object at \$\.o both read \"k\\ufffd\" once repaired"):
        repair({"o": {f"k{LONE}": 1, "k\ufffd": 2}})


@pytest.mark.parametrize("fmt", ["native", "openai"])
def test_a_lone_surrogate_is_refused_naming_file_line_and_path(store: Store, tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "runs.jsonl"
    if fmt == "native":
        write_jsonl(path, [make_run("r1", ["fine"]), bad_native_run()])
        where = r"\$\.branches\[0\]\.transitions\[1\]\.text"
    else:
        write_jsonl(path, [{"messages": [{"role": "user", "content": "hi"}]},
                           {"id": "u1", "messages": [{"role": "user", "content": f"lone {LONE} surrogate"}]}])
        where = r"\$\.messages\[0\]\.content"
    assert b"\\ud800" in path.read_bytes()  # valid JSON: the escape, as a tool that cut UTF-16 writes it
    with pytest.raises(IngestError, match=rf"runs.jsonl:2: text at {where} is not valid Unicode: lone surrogate "
                                          rf"U\+D800 at character 5; pass --repair-text"):
        ingest_paths(store, [path]).runs
    assert store_snapshot(store) == ([], [], [])  # not even the good first line


def test_cli_refusal_is_one_line_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, [{"id": "u1", "messages": [{"role": "user", "content": f"lone {LONE} surrogate"}]}])
    assert main(["ingest", str(path), "--store", str(tmp_path / "s.sqlite")]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"kvjudge: error: {path}:1: text at $.messages[0].content is not valid Unicode")


def test_repair_text_stores_u_fffd_and_notes_exactly_the_repaired_bodies(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["fine"]), bad_native_run()])
    assert ingest_paths(store, [path], repair_text=True).runs == ["r1", "r2"]
    state = store.runs.run("r2")
    live = state.branches[0].transitions
    texts = {"text": store.blobs.text(live[1].text_ref), "output": store.blobs.text(live[4].tool_output["output_ref"]),
             "arguments": store.blobs.text(live[3].tool_call["arguments_ref"])}
    assert texts == {"text": "step \ufffd\ufffd", "output": "cut \ufffdhere\n12 passed in 0.31s",
                     "arguments": canonical_json({"path": "a\ufffd", "k\ufffd": 1})}
    assert state.verifier[0]["detail"] == "\ufffd passed"
    expected_refs = sorted(ref_of(text.encode("utf-8")) for text in texts.values())
    assert state.text_repairs == ({
        "lsn": state.text_repairs[0]["lsn"], "code_units": 6, "refs": expected_refs,
        "paths": ["$.branches[0].transitions[1].text", '$.branches[0].transitions[3].tool_call.arguments["k\\udfff"]',
                  "$.branches[0].transitions[3].tool_call.arguments.path",
                  "$.branches[0].transitions[4].tool_output.output", "$.verifier[0].detail"]},)
    # The prompt holds a genuine U+FFFD of its own: not a repaired body.
    assert "\ufffd" in store.blobs.text(state.task_prompt_ref) and state.task_prompt_ref not in expected_refs
    assert store.runs.run("r1").text_repairs == ()
    # The note is an event: re-folding from LSN 0 gives the same bytes, and the run verifies.
    assert store.runs.refold("r2").canonical_bytes() == store.runs.projected_bytes("r2")
    assert verify(store).ok


def test_bytes_that_are_not_utf8_are_repaired_too(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    line = b'{"messages": [{"role": "user", "content": "caf\xe9 \xff!"}]}\n'
    path.write_bytes(line)
    with pytest.raises(IngestError, match=rf"chat.jsonl:1: not UTF-8 \(invalid continuation byte at byte "
                                          rf"{line.index(0xE9)}; inside a string, --repair-text stores U\+FFFD"):
        ingest_paths(store, [path]).runs
    [run_id] = ingest_paths(store, [path], repair_text=True).runs
    state = store.runs.run(run_id)
    assert store.blobs.text(state.branches[0].transitions[0].text_ref) == "caf\ufffd \ufffd!"
    assert [(n["paths"], n["code_units"]) for n in state.text_repairs] == [(["$.messages[0].content"], 2)]
    # The derived id hashes the line's bytes as they are: the same file names the same run again, already present.
    events = sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0]
    assert ingest_paths(store, [path], repair_text=True).already_present == [run_id]
    assert sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0] == events


@pytest.mark.parametrize(("line", "message"), [
    ('{"messages": [{"role": "user", "content": "x"}], "n": ' + "1" * 5000 + "}",
     "not valid JSON for kvjudge \\(Exceeds the limit \\(4300 digits\\)"),
    ('{"messages": [{"role": "user", "content": "x"}], "n": ' + "[" * 3000 + "]" * 3000 + "}",
     "not valid JSON for kvjudge \\(maximum recursion depth exceeded"),
    ('{"messages": [{"role": "user", "content": "x"}], "n": ' + "[" * 200 + "]" * 200 + "}",
     rf"value at \$\.n(\[0\])+…(\[0\])+ is nested deeper than {MAX_DEPTH} levels"),
    ('{"messages": [{"role": "user", "content": "x"}], "n": NaN}', r"number at \$\.n is nan"),
])
def test_what_the_store_cannot_hold_is_one_line_and_writes_nothing(store: Store, tmp_path: Path, line: str,
                                                                    message: str) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "good"}]}) + "\n" + line + "\n")
    for repair_text in (False, True):
        with pytest.raises(IngestError, match=f"odd.jsonl:2: {message}") as raised:
            ingest_paths(store, [path], repair_text=repair_text).runs
        assert "\n" not in str(raised.value) and len(str(raised.value)) < 400
        assert store_snapshot(store) == ([], [], [])


def test_ingest_cli_repair_text_reports_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [bad_native_run("r2")])
    store = str(tmp_path / "s.sqlite")
    payload = cli_json_ok(capsys, "ingest", str(path), "--store", store, "--repair-text")
    assert payload["ingested"] == ["r2"] and payload["repaired"]["r2"][0]["code_units"] == 6
    shown = cli_json_ok(capsys, "show", "r2", "--store", store)
    assert shown["text_repairs"] == payload["repaired"]["r2"]
    assert main(["show", "r2", "--store", store]) == 0
    # show wraps its header to the terminal's width; the note is read with the wrapping undone
    out = " ".join(capsys.readouterr().out.split())
    assert ("text repaired at ingest (LSN " in out and "6 bad code unit(s) stored as U+FFFD in 5 string(s) "
            "(bodies repaired: 3): $.branches[0].transitions[1].text," in out and "(+0 more)" not in out)


def test_states_without_repairs_keep_the_bytes_an_older_kvjudge_folded(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["fine"])])
    ingest_paths(store, [path]).runs
    raw = store.runs.projected_bytes("r1")
    assert b"text_repairs" not in raw
    assert RunState.from_bytes(raw).canonical_bytes() == raw == store.runs.refold("r1").canonical_bytes()


def test_a_name_that_is_not_unicode_names_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stray byte on a command line reaches Python as a lone surrogate (\\xff → U+DCFF): one line, no traceback."""
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [make_run("r1", ["fine"])])
    store = str(tmp_path / "s.sqlite")
    assert main(["ingest", str(path), "--store", store]) == 0
    capsys.readouterr()
    assert main(["show", "\udcff", "--store", store]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run '\\udcff' in the store" in err
    assert cli_json_ok(capsys, "runs", "--tenant", "\udcff", "--store", store) == []
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"a": "\\ud800", "b": "r1"}\n')
    assert main(["judge", "--pairs", str(pairs), "--store", store]) == 1  # refused before any model is loaded
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run '\\ud800' in the store" in err
