"""The report's files, without a browser: what the HTML source holds, how it is written, and the errors before
any model loads. (tests/test_report_browser.py renders the same pages in Chromium.)"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from report_support import PAYLOAD_RUN, report_in_process

from kvjudge.cli import main
from kvjudge.judge import Verdict
from kvjudge.report import write_report
from kvjudge.report.collect import judged_against
from kvjudge.report.pages import pair_dir_for
from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import Settings, SimJudgeServer


class _WithEvidence(Verdict):
    """A verdict with a field the report does not know by name (as new verdict fields will arrive)."""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "evidence_retention": {"a": 0.75, "b": "<b>all</b>"}}


def _with_evidence(verdicts: Sequence[Verdict]) -> list[Verdict]:
    return [_WithEvidence(**{f.name: getattr(v, f.name) for f in dataclasses.fields(v)}) for v in verdicts]


@pytest.mark.model
def test_the_pages_quote_run_text_and_run_only_their_own_script(tmp_path: Path, default_model: Path) -> None:
    report, verdicts = report_in_process(tmp_path, default_model, adapt=_with_evidence)
    assert all(v.cached for v in verdicts)  # the seeded cache answered every order: no model call
    written = write_report(report, tmp_path / "out" / "report.html")
    index = written.index.read_text()
    pages = {p.name: p.read_text() for p in sorted(written.pair_dir.iterdir())}
    assert len(pages) == written.pair_pages == 12 and written.index_bytes == len(index.encode())
    for name, html in [("index", index), *pages.items()]:
        assert "<script>window.pwned" not in html and "onerror=" not in html.replace("onerror=&#34;", ""), name
        assert 'href="javascript' not in html and "<svg onload" not in html, name
        policy = unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1))
        assert policy.startswith("default-src 'none'") and "unsafe" not in policy and "http" not in policy, name
    payload_page = next(html for html in pages.values() if f"<span class=\"mono\">{PAYLOAD_RUN}</span>" in html)
    assert "&lt;script&gt;window.pwned = &#34;script&#34;;&lt;/script&gt;" in payload_page
    assert "&lt;/textarea&gt;&lt;/pre&gt;&lt;img" in payload_page and "<script" not in payload_page
    # The index's scripts: the figures (JSON, never run) and its own, allowed by the sha256 in its policy.
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", index, flags=re.S)
    assert [attrs for attrs, _ in scripts] == [' type="application/json" id="kvjudge-figures"', ""]
    digest = base64.b64encode(hashlib.sha256(scripts[1][1].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in unescape(index)
    # A verdict field the report does not know is shown by name, its value escaped.
    assert all("evidence_retention" in html and "&lt;b&gt;all&lt;/b&gt;" in html for html in pages.values())
    assert "no probe figure" in index  # no ceiling was given: the header says why


@pytest.mark.model
def test_a_smaller_report_replaces_the_pair_pages_of_the_last(tmp_path: Path, default_model: Path) -> None:
    index = tmp_path / "report.html"
    first, _ = report_in_process(tmp_path / "all", default_model)
    write_report(first, index)
    (pair_dir_for(index) / "notes.txt").write_text("mine")
    second, _ = report_in_process(tmp_path / "one-task", default_model, task="clamp")
    written = write_report(second, index)
    assert sorted(p.name for p in written.pair_dir.iterdir()) == ["0001.html", "0002.html", "0003.html"]
    assert "3 judged pair(s)" in index.read_text() and index.stat().st_mode & 0o777 == 0o644
    assert not list(tmp_path.glob(".report-pairs.*"))  # no staging folder left behind


@pytest.mark.parametrize(("out", "says"), [(".", "is a directory"), ("report.txt", "does not end in .html"),
                                           ("taken.html", "is not a directory")])
def test_a_bad_out_path_is_one_line_before_anything_is_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              out: str, says: str) -> None:
    (tmp_path / "taken-pairs").write_text("a file where the pair pages would go")
    # No store exists and no model is named: the path is refused before either is opened.
    code = main(["report", "--store", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and says in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken-pairs"]


def test_how_a_verdict_stands_against_the_grades() -> None:
    assert judged_against("a", "a") == "right" and judged_against("b", "a") == "wrong"
    assert judged_against("tie", "b") == judged_against("inconsistent", "a") == "no preference"
    assert judged_against("error", "a") == "unscored" and judged_against("overflow", "b") == "unscored"
    assert judged_against("a", "equal") == "equal grades" and judged_against("a", None) == "ungraded"


def test_the_index_shows_the_pointwise_critics_figures_as_the_library_computes_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report --protocol pointwise` against the simulated judge's scale mode (noisy readings): the critic's AUC,
    Brier, ECE and per-criterion AUC on the index are eval's (the library's score_figures), and the AUC and Brier
    are also what the runs' own scores give, computed here from `kvjudge score`'s P(success) and the answer key."""
    runs = [swe_run(f"{side}/t{n}", task=f"t{n}", passed=side == "pass", seed=n, explore=0, file_lines=3, changed=2)
            for n in range(8) for side in ("pass", "fail")]
    # Latent qualities close together (0.6 passed, 0.4 failed) under noise: a critic better than chance, not perfect.
    runs = [dataclasses.replace(r, key=dataclasses.replace(r.key, quality=0.6 if r.key.grade == 1.0 else 0.4))
            for r in runs]
    runs_file, key = write_graded(tmp_path, runs)
    store, out = tmp_path / "store.sqlite", tmp_path / "report.html"
    assert main(["ingest", str(runs_file), "--store", str(store), "--json"]) == 0
    capsys.readouterr()
    with SimJudgeServer(key, Settings(sigma=0.3, seed=3)) as server:
        common = ["--server", server.url, "--n-ctx", "8192", "--store", str(store), "--protocol", "pointwise",
                  "--repeats", "2"]
        assert main(["report", *common, "--out", str(out), "--bootstrap", "20", "--json"]) == 0
        capsys.readouterr()
        asked = server.judge.reasons["scale"]
        # Each run read 3 criteria × 2 repeats; each task's pair (pairwise-scale) the same in both orders.
        assert asked == len(runs) * 3 * 2 + len(runs) // 2 * 2 * 3 * 2
        assert main(["eval", *common, "--json"]) == 0
        library = json.loads(capsys.readouterr().out)["pointwise"]
        assert main(["score", *common, "--json"]) == 0
        scored = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:-1]
        assert server.judge.reasons["scale"] == asked  # eval and score read the scores the report cached
    index = out.read_text()
    figure = r'data-figure="(critic\.[^"]+)" data-value="([^"]*)"'
    shown = {m[1]: json.loads(unescape(m[2])) for m in re.finditer(figure, index)}
    assert shown["critic.auc"] == library["auc"] and shown["critic.brier"] == library["brier"]
    assert shown["critic.ece"] == library["ece"]
    assert set(library["criteria"]) == {"correctness", "verification", "conduct"}
    for name, figures in library["criteria"].items():
        assert shown[f"critic.criteria.{name}.auc"] == figures["auc"]
    low, high = library["auc_ci95"]
    assert f"{library['auc']:.2f} [{low:.2f}, {high:.2f}]" in index
    assert 'id="critic-chart"' in index and index.count('data-who="critic"') == 1
    # The AUC and Brier from the runs' scores and their grades, by hand: P(a passing run outscores a failing one).
    passed = {r.id: r.key.grade == 1.0 for r in runs}
    p = {s["run"]: s["p_success"] for s in scored}
    wins = [1.0 if p[x] > p[y] else 0.5 if p[x] == p[y] else 0.0 for x in p if passed[x] for y in p if not passed[y]]
    assert shown["critic.auc"] == pytest.approx(sum(wins) / len(wins))
    assert 0.5 < shown["critic.auc"] < 1.0  # the noise makes the critic imperfect, and better than chance
    assert shown["critic.brier"] == pytest.approx(sum((p[r] - passed[r]) ** 2 for r in p) / len(p))
