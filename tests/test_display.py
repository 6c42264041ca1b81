"""Run text on a terminal (#17): control characters and invisible code points are shown, never obeyed — in `show`,
tables, status lines, errors and the judge's human output; `--raw` passes them through, `--json` stays exact."""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cli_json_ok
from kvjudge.cli import main
from kvjudge.commands._output import info
from kvjudge.display import INVISIBLE_RANGES, invisible_class, scan_invisible_ranges, visible
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

# What a hostile tool output looks like: colours, a retitled window, a cleared screen, a bell, a carriage
# return that overwrites the line, a C1 CSI, a right-to-left override, a zero-width space, tag characters.
HOSTILE = ("\x1b[31mred\x1b[0m \x1b]0;pwned\x07\x1b[2J\r fake \x9b6n \u202eevil\u202c \u200b \U000e0041"
           "\ttab\nnext line")
HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def hidden_left(text: str) -> set[str]:
    return {char for char in text if unicodedata.category(char) in HIDDEN and char not in "\n\t"}


def test_visible_shows_controls_as_pictures_and_invisibles_by_code_point() -> None:
    assert visible(HOSTILE) == ("␛[31mred␛[0m ␛]0;pwned␇␛[2J␍ fake <U+009B>6n <U+202E>evil<U+202C> <U+200B> "
                                "<U+E0041>\ttab\nnext line")
    assert visible("\x00\x7f\u2028\u2029\ud800") == "␀␡<U+2028><U+2029><U+D800>"
    ordinary = "plain ASCII, naïve café, 日本語, emoji 😀, no-break\u00a0space, private \ue000 use"
    assert visible(ordinary) == ordinary


def test_the_invisible_ranges_kept_for_this_python_are_what_its_unicode_database_says() -> None:
    # The kept table saves the scan at each start; it must be the scan wherever a version has an entry.
    scanned = scan_invisible_ranges()
    assert INVISIBLE_RANGES.get(unicodedata.unidata_version, scanned) == scanned
    invisible = re.compile(invisible_class())
    expected = [code for code in range(sys.maxunicode + 1)
                if chr(code) not in "\t\n" and unicodedata.category(chr(code)) in ("Cc", "Cf")]
    assert [code for code in range(sys.maxunicode + 1) if invisible.fullmatch(chr(code))] == expected
    assert {"\x00", "\u200b", "\u202e", "\ufeff", "\U000e0041"} <= {chr(c) for c in expected}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=())))
def test_visible_leaves_nothing_a_terminal_could_act_on(text: str) -> None:
    shown = visible(text)
    assert hidden_left(shown) == set()
    assert shown.count("\n") == text.count("\n") and shown.count("\t") == text.count("\t")
    assert visible(shown) == shown  # already visible text is left alone
    if not hidden_left(text):
        assert shown == text


@pytest.fixture
def hostile_store(tmp_path: Path) -> str:
    run = make_run("evil\x1b[2J", [HOSTILE])
    run["task"]["id"] = "task\u202e"
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, [run])
    store = str(tmp_path / "store.sqlite")
    assert main(["ingest", str(path), "--store", store]) == 0
    return store


def test_show_renders_run_text_visibly_and_raw_passes_it_through(hostile_store: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["show", "evil\x1b[2J", "--store", hostile_store]) == 0
    out = capsys.readouterr().out
    assert hidden_left(out) == set()
    assert "run evil␛[2J" in out and "task task<U+202E>:" in out
    assert "␛[31mred␛[0m ␛]0;pwned␇␛[2J␍ fake <U+009B>6n <U+202E>evil<U+202C>" in out
    assert main(["show", "evil\x1b[2J", "--store", hostile_store, "--raw"]) == 0
    assert HOSTILE in capsys.readouterr().out
    shown = cli_json_ok(capsys, "show", "evil\x1b[2J", "--store", hostile_store)
    assert shown["id"] == "evil\x1b[2J" and shown["branches"][0]["transitions"][2]["tool_output"]["output"]["text"] \
        == HOSTILE + "\n12 passed in 0.31s"


def test_tables_render_cells_visibly_while_rich_styles_the_terminal(hostile_store: str,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = Path(hostile_store).with_name("kvjudge.toml")
    config.write_text('[retention]\ncounter = "chars"\n')
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich writes its own escape sequences, as on a terminal
    capsys.readouterr()
    assert main(["runs", "--store", hostile_store, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "evil␛[2J" in out and "\x1b[2J" not in out
    assert "\x1b[1m" in out  # rich's bold header reached the terminal as an escape, not as ␛[1m
    assert main(["runs", "--store", hostile_store, "--config", str(config), "--raw"]) == 0
    assert "evil\x1b[2J" in capsys.readouterr().out
    rows = cli_json_ok(capsys, "runs", "--store", hostile_store, "--config", str(config))
    assert json.dumps(rows).count("\\u001b[2J") == 1 and rows[0]["id"] == "evil\x1b[2J"


def test_status_lines_and_errors_are_shown_visibly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info("run \x1b]0;pwned\x07 \u202eok")  # the demo's and every command's status lines
    assert capsys.readouterr().err == "run ␛]0;pwned␇ <U+202E>ok\n"
    missing = tmp_path / "runs\x1b[2J.jsonl"
    assert main(["ingest", str(missing), "--store", str(tmp_path / "s.sqlite")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs␛[2J.jsonl does not exist" in err and "\x1b" not in err


@pytest.mark.model
def test_the_judges_human_output_renders_run_ids_visibly(tmp_path: Path, default_model: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    runs = [make_run("a\x1b[2J", ["3 passed"]), make_run("b\u202e", ["\x1b[31m1 failed\x1b[0m"], passed=False)]
    path = tmp_path / "runs.jsonl"
    write_jsonl(path, runs)
    store = str(tmp_path / "store.sqlite")
    assert main(["ingest", str(path), "--store", store]) == 0
    capsys.readouterr()
    command = ["judge", "a\x1b[2J", "b\u202e", "--store", store, "--model", str(default_model), "--n-ctx", "512"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "a␛[2J vs b<U+202E>" in out and "summary" in out and hidden_left(out) == set()
    assert main([*command, "--raw"]) == 0  # a cache hit now: no model call
    assert "a\x1b[2J vs b\u202e" in capsys.readouterr().out
