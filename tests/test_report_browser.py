"""`kvjudge report` in a real headless Chromium (the system's, driven by Selenium): the page loads clean, shows the
conclusion and every agent, filters and sorts without a network, shows each pair's views exactly as the judge read
them, never runs what a run's text or names carry, and shows the very figures `eval --json` and `rank --json` print.

The store (tests/report_support.py) has its verdicts in the judgment cache, written through the judge's own
packing and keys, except one pair that the report judges itself with the real default model. The demo's own report
(the session's `kvjudge demo`, conftest.py) is opened too, and a report judged by a pool of simulated judge servers.
Screenshots go to ``test-output/`` in the repository (git-ignored), for people to look at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import DemoRun, kvjudge, kvjudge_json
from report_support import (
    AGENTS,
    HOSTILE_RUNS,
    HOSTILE_TASK,
    N_CTX,
    PASSES,
    PAYLOADS,
    REDUCED_RUN,
    hostile_store,
    report_in_process,
    seeded_store,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from kvjudge.judge.evaluate import BASELINES
from kvjudge.report import write_report
from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.state import agent_of
from kvjudge.testing.browser import chromium, console, open_page, screenshot
from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import VERSION as SIM_VERSION
from kvjudge.testing.sim_judge import Settings, SimJudgeServer

pytestmark = [pytest.mark.model, pytest.mark.browser]

# Where the screenshots go: a fixed, git-ignored folder of the repository, for people to look at.
SCREENSHOTS = Path(__file__).resolve().parents[1] / "test-output"


@contextmanager
def _kvjudge_env(root: Path) -> Iterator[dict[str, str]]:
    """Cache and data dirs under ``root`` for this process while the block runs; the environment for children."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVJUDGE_CACHE_DIR", str(root / "cache"))
        patch.setenv("KVJUDGE_DATA_DIR", str(root / "data"))
        yield dict(os.environ)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> dict[str, Any]:
    """The store, its report, and what eval, rank and judge print for the same store (all in child processes,
    with their own cache and data dirs)."""
    root = tmp_path_factory.mktemp("report")
    with _kvjudge_env(root) as env:
        store, pairs = seeded_store(root / "store.sqlite", default_model, leave_out=1)
    judge_args = ["--store", store, "--model", str(default_model), "--n-ctx", str(N_CTX), "--no-certify"]
    index = root / "out" / "report.html"
    written = kvjudge_json("report", *judge_args, "--out", str(index), env=env, timeout=600)
    pairs_file = root / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in pairs))
    judged = kvjudge("judge", *judge_args, "--pairs", str(pairs_file), "--json", env=env, timeout=600)
    assert judged.returncode == 0, judged.stderr
    verdicts = [json.loads(line) for line in judged.stdout.splitlines()][:-1]
    evaluation = kvjudge_json("eval", *judge_args, "--png", str(root / "eval.png"), env=env, timeout=600)
    ranking = kvjudge_json("rank", *judge_args, "--png", str(root / "rank.png"), env=env, timeout=600)
    return {"root": root, "store": store, "index": index, "written": written, "verdicts": verdicts,
            "eval": evaluation["templates"]["raw"], "rank": ranking}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as session:
        yield session


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> dict[str, Any]:
    """The report of the hostile store: run ids, agents and the task name are markup payloads."""
    root = tmp_path_factory.mktemp("hostile")
    with _kvjudge_env(root) as env:
        store, pairs = hostile_store(root / "store.sqlite", default_model)
    index = root / "out" / "report.html"
    written = kvjudge_json("report", "--store", store, "--model", str(default_model), "--n-ctx", str(N_CTX),
                           "--no-certify", "--out", str(index), env=env, timeout=600)
    assert written["pairs"] == written["cached"] == len(pairs) == 3
    return {"index": index, "pairs": pairs}


@pytest.fixture(scope="module")
def demo(demo_run: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session's demo (its report.html as `kvjudge demo` wrote it) and `kvjudge eval --json` on its store, with
    the demo's judge: its model, under the memory budget it certified the window with, in its cache dir."""
    report = demo_run.report()
    root = tmp_path_factory.mktemp("demo-eval")
    config = root / "kvjudge.toml"
    config.write_text(f"[probe]\nmemory_budget = {report['probe']['memory_budget_bytes']}\n")
    evaluation = kvjudge_json("eval", "--store", str(demo_run.out / "store.sqlite"), "--model", str(demo_run.model),
                              "--config", str(config), "--png", str(root / "eval.png"), env=demo_run.env,
                              timeout=600)
    [figures] = evaluation["templates"].values()
    with Store.open(demo_run.out / "store.sqlite") as store:
        runs = {run_id: store.runs.run(run_id) for run_id in store.runs.run_ids()}
    return {"index": Path(report["html"]["index"]), "report": report, "eval": figures,
            "verdicts": [pair["reduced"] for pair in report["judge"]["pairs"]],  # the side the report shows
            "grades": {run_id: state.grades[0]["score"] for run_id, state in runs.items()},
            "agents": {agent_of(state) for state in runs.values()}}


def _errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")]


def _rows(browser: Any) -> list[Any]:
    return browser.find_elements(By.CSS_SELECTOR, "#pairs tbody tr")


def _visible_pairs(browser: Any) -> list[tuple[str, str]]:
    return [(row.get_attribute("data-a"), row.get_attribute("data-b")) for row in _rows(browser) if row.is_displayed()]


def _hidden_pairs(browser: Any) -> set[tuple[str, str]]:
    return {(row.get_attribute("data-a"), row.get_attribute("data-b")) for row in _rows(browser)
            if not row.is_displayed()}


def _open_pair(browser: Any, index: Path, a: str, b: str) -> list[dict[str, Any]]:
    """Open the pair page of runs ``a`` and ``b`` from the index's table (by its link); its console messages."""
    open_page(browser, index)
    [row] = [row for row in _rows(browser) if (row.get_attribute("data-a"), row.get_attribute("data-b")) == (a, b)]
    row.find_element(By.CSS_SELECTOR, "td a").click()
    return console(browser)


def _text(browser: Any, selector: str) -> str:
    """The text an element holds, exactly (``textContent``: no whitespace folded, nothing trimmed)."""
    return browser.execute_script("return document.querySelector(arguments[0]).textContent", selector)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _select(browser: Any, select_id: str, value: str) -> None:
    """Choose ``value`` in a select as a person would (any characters: no CSS selector is built from it)."""
    browser.execute_script("const s = document.getElementById(arguments[0]); s.value = arguments[1];"
                           "s.dispatchEvent(new Event('change'));", select_id, value)
    assert browser.find_element(By.ID, select_id).get_attribute("value") == value


def _shown(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _shown_with_interval(value: float | None, interval: list[float] | None) -> str:
    return " ".join([_shown(value), *([f"[{interval[0]:.2f}, {interval[1]:.2f}]"] if interval else [])])


def _check_figures_shown(browser: Any, evaluation: Mapping[str, Any]) -> None:
    """The figures table as people read it: accuracy with its Wilson interval, κ and position bias of the judge
    and of each baseline are eval's, as printed (two digits; position bias three)."""
    for who in ("judge", *BASELINES):
        figures = evaluation["judge"] if who == "judge" else evaluation["baselines"][who]

        def cell(name: str, who: str = who) -> str:
            return browser.find_element(By.CSS_SELECTOR, f'#figures-table td[data-figure="{who}.{name}"]').text

        assert cell("accuracy_ties_half") == _shown_with_interval(figures["accuracy_ties_half"],
                                                                  figures["accuracy_ties_half_ci95"]), who
        assert cell("kappa") == _shown(figures["kappa"]), who
        assert cell("position_bias") == _shown(figures["position_bias"], 3), who


def test_the_report_judged_only_what_was_not_cached(built: dict[str, Any]) -> None:
    written = built["written"]
    assert (written["pairs"], written["cached"], written["judged"]) == (12, 11, 1)
    assert written["pair_pages"] == 12 and sorted(p.name for p in Path(written["pair_dir"]).iterdir())[0] == "0001.html"


def test_the_report_loads_clean_with_the_conclusion_and_every_agent(built: dict[str, Any], browser: Any) -> None:
    logs = open_page(browser, built["index"])
    assert _errors(logs) == []
    assert browser.find_element(By.ID, "conclusion").text == built["eval"]["conclusion"]
    shown_agents = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#agents-table td.agent")]
    assert sorted(shown_agents) == sorted(AGENTS) == sorted(r["agent"] for r in built["rank"]["agents"])
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#agent-filter option")]
    assert options == ["", *sorted(AGENTS)]
    assert browser.find_element(By.ID, "shown-count").text == "12 of 12 pairs shown"  # the script ran
    header = browser.find_element(By.ID, "header").text
    assert "sha256" in header and "n_ctx" in header and "tokens — the" in header and built["store"] in header
    assert "12 pair(s) on 4 task(s)" in header  # how the pairs were chosen, as eval says it
    shot = screenshot(browser, SCREENSHOTS / "report-index.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wrong_only_leaves_exactly_the_pairs_eval_counted_wrong(built: dict[str, Any], browser: Any) -> None:
    # By hand: a decisive verdict against the run that passed (grades 1.0 vs 0.0) is wrong.
    def passed(run_id: str) -> bool:
        agent, task = run_id.split("/")
        return agent in PASSES[task]

    decisive = [v for v in built["verdicts"] if v["outcome"] in ("a", "b") and passed(v["a"]) != passed(v["b"])]
    wrong = {(v["a"], v["b"]) for v in decisive if (v["outcome"] == "a") != passed(v["a"])}
    judge = built["eval"]["judge"]
    assert len(wrong) == judge["decisive"] - judge["correct"] >= 1
    open_page(browser, built["index"])
    browser.find_element(By.ID, "only-wrong").click()
    assert set(_visible_pairs(browser)) == wrong
    assert browser.find_element(By.ID, "shown-count").text == f"{len(wrong)} of 12 pairs shown"
    browser.find_element(By.ID, "only-wrong").click()
    browser.find_element(By.ID, "only-inconsistent").click()
    inconsistent = {(v["a"], v["b"]) for v in built["verdicts"] if v["outcome"] == "inconsistent"}
    assert inconsistent and set(_visible_pairs(browser)) == inconsistent
    browser.find_element(By.ID, "only-inconsistent").click()
    Select(browser.find_element(By.ID, "task-filter")).select_by_value("lru-cache")
    assert {a.split("/")[1] for a, _ in _visible_pairs(browser)} == {"lru-cache"} and len(_visible_pairs(browser)) == 3
    Select(browser.find_element(By.ID, "task-filter")).select_by_value("")
    Select(browser.find_element(By.ID, "agent-filter")).select_by_value("alpha")
    assert len(_visible_pairs(browser)) == 8 and all("alpha/" in a + b for a, b in _visible_pairs(browser))
    Select(browser.find_element(By.ID, "agent-filter")).select_by_value("")
    # Sorting by p_a, ascending then descending.
    button = browser.find_element(By.XPATH, "//table[@id='pairs']//th/button[text()='p_a']")
    for direction in (1, -1):
        button.click()
        values = [float(cell.get_attribute("data-sort"))
                  for cell in browser.find_elements(By.CSS_SELECTOR, "#pairs tbody tr td:nth-child(8)")]
        assert values == sorted(values, reverse=direction < 0) and len(values) == 12
    assert _errors(console(browser)) == []


def test_a_pair_page_shows_both_views_exactly_as_the_judge_read_them(built: dict[str, Any], browser: Any) -> None:
    verdict = next(v for v in built["verdicts"] if REDUCED_RUN in (v["a"], v["b"]))
    assert _errors(_open_pair(browser, built["index"], verdict["a"], verdict["b"])) == []
    for side in ("a", "b"):
        assert _sha256(_text(browser, f"#view-{side} pre")) == verdict["view_sha256"][side]
    assert browser.find_element(By.ID, "outcome").text == verdict["outcome"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#orders tbody tr")) == 2
    # Each run's decisive evidence, in its full view and as read: the verdict's own figures.
    for side in ("a", "b"):
        for which in ("full", "view"):
            row = browser.find_element(By.CSS_SELECTOR, f'#evidence tr[data-side="{side}"][data-view="{which}"]')
            figures = verdict["evidence"][side][which]
            shown = row.find_elements(By.TAG_NAME, "td")[3].text
            assert shown == (f"{figures['submission_visible']}/{figures['submission_lines']}"
                             if figures["submission_lines"] is not None else "–")
    assert browser.find_elements(By.ID, "views-differ") == []
    # Each prompt names both views in its order and quotes the framing around them.
    for order, first in (("ab", "a"), ("ba", "b")):
        placeholders = browser.find_elements(By.CSS_SELECTOR, f"#prompt-{order} .placeholder")
        assert [p.get_attribute("textContent").split(",")[0] for p in placeholders] == \
            [f"[the view of run {first}", f"[the view of run {'b' if first == 'a' else 'a'}"]
        assert "Which run accomplished the task better?" in browser.find_element(
            By.ID, f"prompt-{order}").get_attribute("textContent")
    # What reduction removed: the Reduced events of the run's log, row for row.
    with Store.open(built["store"]) as store:
        events = [e for _, e in store.events.iter_events(REDUCED_RUN) if isinstance(e, ev.Reduced)]
    rows = browser.find_elements(By.CSS_SELECTOR, f'table.reductions[data-run="{REDUCED_RUN}"] tbody tr')
    shown = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [(r[0], int(r[2]), int(r[3]), r[4]) for r in shown] == \
        [("Reduced", e.tokens_before, e.tokens_after, e.counter) for e in events] and events
    screenshot(browser, SCREENSHOTS / "report-pair.png")


def _never_ran(browser: Any) -> None:
    """Nothing a run carries ran on this page, and none of its markup became an element."""
    assert browser.execute_script("return typeof window.pwned") == "undefined"
    for selector in ('a[href^="javascript:"]', 'img[src="x"]', "svg[onload]", "textarea", "pre style", "b",
                     "select select", "option option"):
        assert browser.find_elements(By.CSS_SELECTOR, selector) == [], selector
    assert browser.find_element(By.TAG_NAME, "body").is_displayed()  # the run's <style> hid nothing


def test_run_text_and_names_with_script_and_markup_never_execute(hostile: dict[str, Any], browser: Any) -> None:
    agents = sorted(HOSTILE_RUNS.values())
    assert _errors(open_page(browser, hostile["index"])) == []
    _never_ran(browser)
    # The index runs its own script and no other; every name shows as the characters the run holds, wherever the
    # index names it: cells, attributes, the filters' options, the ranking chart's SVG, the figures' JSON.
    assert browser.execute_script("return document.scripts.length") == 2  # the figures (JSON, never run) and its own
    assert set(_visible_pairs(browser)) == set(hostile["pairs"])
    for row in _rows(browser):
        cells = [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td.id")]
        a, b = row.get_attribute("data-a"), row.get_attribute("data-b")
        assert cells == [HOSTILE_TASK, a, HOSTILE_RUNS[a], b, HOSTILE_RUNS[b]]
        assert row.get_attribute("data-task") == HOSTILE_TASK
    assert [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#task-filter option")] == \
        ["", HOSTILE_TASK]
    assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#agent-filter option")][1:] == agents
    assert [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#agent-filter option")] == \
        ["", *agents]
    assert sorted(cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#agents-table td.agent")) == agents
    labels = [_text(browser, f"#ranking-chart g:nth-of-type({n}) > text") for n in range(1, len(agents) + 1)]
    assert sorted(label.rsplit(" (", 1)[0] for label in labels) == agents
    assert {row.get_attribute("data-run") for row in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")} == \
        set(HOSTILE_RUNS)
    figures = json.loads(_text(browser, "#kvjudge-figures"))
    assert sorted(r["agent"] for r in figures["rank"]["agents"]) == agents
    # The filters compare the names as they are.
    _select(browser, "task-filter", HOSTILE_TASK)
    _select(browser, "agent-filter", agents[0])
    assert len(_visible_pairs(browser)) == 2 and all(agents[0] in (HOSTILE_RUNS[a], HOSTILE_RUNS[b])
                                                     for a, b in _visible_pairs(browser))
    _never_ran(browser)
    # On the index, which does run its own script, an injected script element is refused all the same.
    injected = browser.execute_script(
        "const s = document.createElement('script'); s.textContent = 'window.injected = 1';"
        "document.body.append(s); return typeof window.injected")
    assert injected == "undefined"
    assert any("Content Security Policy" in e["message"] for e in console(browser))

    payload_run = next(iter(HOSTILE_RUNS))  # the run whose text carries the payloads too
    for a, b in hostile["pairs"]:
        assert _errors(_open_pair(browser, hostile["index"], a, b)) == []
        _never_ran(browser)
        assert browser.execute_script("return document.scripts.length") == 0  # a pair page runs no script at all
        assert browser.execute_script("return document.title").endswith(f": {a} vs {b}")
        assert browser.find_element(By.TAG_NAME, "h1").text == f"{HOSTILE_TASK}: {a} vs {b}"
        for side, run_id in (("a", a), ("b", b)):
            view = _text(browser, f"#view-{side} pre")
            assert f"Task {HOSTILE_TASK}:" in view
            assert all(payload in view for payload in PAYLOADS) == (run_id == payload_run)
            assert _text(browser, f"#view-{side} h3 .mono") == run_id
    # The policy itself: an inline handler added to the page is refused, and the refusal is reported.
    ran = browser.execute_script(
        "const b = document.createElement('button'); b.setAttribute('onclick', 'window.handlerRan = 1');"
        "document.body.append(b); b.click(); return typeof window.handlerRan")
    assert ran == "undefined"
    refused = [e for e in console(browser) if "Content Security Policy" in e["message"]]
    assert refused and "inline event handler" in refused[0]["message"]


def test_the_figures_on_the_page_are_eval_and_rank_json(built: dict[str, Any], browser: Any) -> None:
    open_page(browser, built["index"])
    figures = json.loads(browser.find_element(By.ID, "kvjudge-figures").get_attribute("textContent"))
    expected_rank = {k: v for k, v in built["rank"].items()
                     if k not in ("png", "pairing", "cost", "job")}  # the command's own
    # The window and the backend's n_ctx and threads say where the judge ran, not what it found: the report judged
    # the one pair not cached (so it opened a window), eval afterwards read every verdict from the cache (none).
    # The cost is what each command itself spent (eval's, all cached, is zero calls), and the job what it shared
    # with other workers: the report prints its own.
    def figures_only(result: dict[str, Any]) -> dict[str, Any]:
        manifest = {k: v for k, v in result["manifest"].items()
                    if k not in ("n_ctx", "n_ctx_source", "n_batch", "threads")}
        return {**{k: v for k, v in result.items() if k not in ("window", "cost", "job")}, "manifest": manifest}

    assert figures_only(figures["eval"]) == figures_only(built["eval"])
    assert figures["rank"] == expected_rank
    # The numbers in the tables people read carry the same values.
    cells = browser.find_elements(By.CSS_SELECTOR, "#figures-table td[data-figure]")
    assert len(cells) == 4 * 10
    for cell in cells:
        who, name = cell.get_attribute("data-figure").split(".")
        source = built["eval"]["judge"] if who == "judge" else built["eval"]["baselines"][who]
        assert json.loads(cell.get_attribute("data-value")) == source[name], (who, name)
    for row in built["rank"]["agents"]:
        tr = browser.find_element(By.CSS_SELECTOR, f'#agents-table tr[data-agent="{row["agent"]}"]')
        for cell in tr.find_elements(By.CSS_SELECTOR, "td[data-figure]"):
            assert json.loads(cell.get_attribute("data-value")) == row[cell.get_attribute("data-figure")]
    # As people read them: the main figures' text, and the ranking in rank's order (table and chart).
    _check_figures_shown(browser, built["eval"])
    ranked = built["rank"]["agents"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#agents-table tbody tr")
    assert [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")][:3] for row in rows] == \
        [[str(r["rank"]), r["agent"], f"{r['strength']:+.2f}"] for r in ranked]
    labels = [g.find_element(By.TAG_NAME, "text").text
              for g in browser.find_elements(By.CSS_SELECTOR, "#ranking-chart g")]
    assert labels == [f"{r['agent']} ({r['wins']}-{r['ties']}-{r['losses']})" for r in ranked]
    assert [r["agent"] for r in ranked] != sorted(r["agent"] for r in ranked)  # the order is rank's, not the names'


# ------------------------------------------------------------------------------------------ the demo's report
def _demo_judged(demo: Mapping[str, Any], verdict: Mapping[str, Any]) -> str | None:
    """How the demo's verdict stands against its runs' grades, by hand: right, wrong, or None (no preference,
    unscored, or no truth)."""
    grade_a, grade_b = demo["grades"][verdict["a"]], demo["grades"][verdict["b"]]
    if grade_a == grade_b or verdict["outcome"] not in ("a", "b"):
        return None
    return "right" if (verdict["outcome"] == "a") == (grade_a > grade_b) else "wrong"


def test_the_demos_report_loads_clean_with_the_conclusion_every_agent_and_evals_figures(demo: dict[str, Any],
                                                                                        browser: Any) -> None:
    assert _errors(open_page(browser, demo["index"])) == []
    assert browser.find_element(By.ID, "conclusion").text == demo["eval"]["conclusion"]
    pairs = len(demo["verdicts"])
    assert pairs == demo["eval"]["pairs"] >= 1
    assert browser.find_element(By.ID, "shown-count").text == f"{pairs} of {pairs} pairs shown"  # the script ran
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#agent-filter option")]
    assert options == ["", *sorted(demo["agents"])]
    shown_agents = {cell.text for row in _rows(browser) for cell in row.find_elements(By.CSS_SELECTOR, "td.id")[2::2]}
    assert shown_agents == demo["agents"]
    assert {row.get_attribute("data-run") for row in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")} == \
        set(demo["grades"])
    _check_figures_shown(browser, demo["eval"])
    header = browser.find_element(By.ID, "header").text
    assert demo["report"]["probe"]["model_sha256"] in header and "the configured bound wins" in header
    assert screenshot(browser, SCREENSHOTS / "demo-report-index.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demos_wrong_only_filter_leaves_exactly_the_pairs_eval_counted_wrong(demo: dict[str, Any],
                                                                                 browser: Any) -> None:
    judged = {(v["a"], v["b"]): _demo_judged(demo, v) for v in demo["verdicts"]}
    wrong = {pair for pair, how in judged.items() if how == "wrong"}
    figures = demo["eval"]["judge"]
    assert len(wrong) == figures["decisive"] - figures["correct"]
    assert sum(how == "right" for how in judged.values()) == figures["correct"]
    open_page(browser, demo["index"])
    # The page's own verdict labels agree with eval (wrong may be none: the bundled judge has little signal).
    labels = [row.get_attribute("data-judged") for row in _rows(browser)]
    assert labels.count("wrong") == len(wrong) and labels.count("right") == figures["correct"]
    browser.find_element(By.ID, "only-wrong").click()
    assert set(_visible_pairs(browser)) == wrong and _hidden_pairs(browser) == set(judged) - wrong
    assert browser.find_element(By.ID, "shown-count").text == f"{len(wrong)} of {len(judged)} pairs shown"
    browser.find_element(By.ID, "only-wrong").click()
    assert set(_visible_pairs(browser)) == set(judged) and _hidden_pairs(browser) == set()
    browser.find_element(By.ID, "only-inconsistent").click()
    inconsistent = {(v["a"], v["b"]) for v in demo["verdicts"] if v["outcome"] == "inconsistent"}
    assert set(_visible_pairs(browser)) == inconsistent and _hidden_pairs(browser) == set(judged) - inconsistent
    if figures["scored"]:
        assert len(inconsistent) == round(figures["inconsistent_rate"] * figures["scored"])
    assert _errors(console(browser)) == []


def test_the_demos_pair_pages_show_both_views_as_the_judge_read_them(demo: dict[str, Any], browser: Any) -> None:
    for verdict in demo["verdicts"]:
        assert _errors(_open_pair(browser, demo["index"], verdict["a"], verdict["b"])) == []
        for side in ("a", "b"):
            assert _sha256(_text(browser, f"#view-{side} pre")) == verdict["view_sha256"][side]
        assert browser.find_elements(By.ID, "views-differ") == []
        assert browser.find_element(By.ID, "outcome").text == verdict["outcome"]
    screenshot(browser, SCREENSHOTS / "demo-report-pair.png")


# ------------------------------------------------------------------------------------ judged by a server pool
def test_a_report_judged_by_a_pool_of_servers_names_the_pool_and_its_model(
        tmp_path: Path, start_sim: Callable[[Path, Settings], SimJudgeServer], browser: Any) -> None:
    runs = [swe_run(f"{agent}/task-{n}", task=f"task-{n}", agent=agent, passed=(agent == "x") == (n % 2 == 0),
                    seed=n, explore=1, file_lines=20) for n in range(2) for agent in ("x", "y")]
    runs_file, key = write_graded(tmp_path, runs)
    store = str(tmp_path / "store.sqlite")
    kvjudge_json("ingest", str(runs_file), "--store", store)
    pool = [start_sim(key, Settings(accuracy=1.0)) for _ in range(2)]
    for server in pool:
        assert kvjudge_json("probe", "--server", server.url)["certified"]
    index = tmp_path / "out" / "report.html"
    servers = [arg for server in pool for arg in ("--server", server.url)]
    written = kvjudge_json("report", *servers, "--store", store, "--out", str(index))
    assert (written["pairs"], written["judged"]) == (2, 2)
    assert _errors(open_page(browser, index)) == []
    served = browser.find_element(By.ID, "header-judge").text
    assert served == f"{pool[0].model} served by 2 server(s): {pool[0].url}, {pool[1].url} (vllm {SIM_VERSION}, " \
                     f"OpenAI-compatible API)"
    assert "sha256" not in served  # no model file here: the servers hold it
    answered = set()
    for verdict_row in [(row.get_attribute("data-a"), row.get_attribute("data-b")) for row in _rows(browser)]:
        _open_pair(browser, index, *verdict_row)
        answered |= {row.find_elements(By.TAG_NAME, "td")[-1].text
                     for row in browser.find_elements(By.CSS_SELECTOR, "#orders tbody tr")}
    assert answered <= {server.url for server in pool} and answered


# ----------------------------------------------------------------------------------- text exactly as it is
def test_a_view_that_begins_with_a_newline_reads_exactly_as_the_judge_read_it(tmp_path: Path, default_model: Path,
                                                                              browser: Any) -> None:
    # The HTML parser drops a newline right after <pre>; a view (or the common block) beginning with one keeps it.
    report, _ = report_in_process(tmp_path / "store", default_model, task="clamp")
    first = report.pairs[0]
    views = ("\n" + (first.views[0] or ""), "\n\n" + (first.views[1] or ""))
    common = "\n[common text 1]\nshared"
    pairs = (dataclasses.replace(first, views=views, common=common), *report.pairs[1:])
    written = write_report(dataclasses.replace(report, pairs=pairs), tmp_path / "out" / "report.html")
    assert _errors(open_page(browser, written.pair_dir / "0001.html")) == []
    assert [_sha256(_text(browser, f"#view-{side} pre")) for side in ("a", "b")] == [_sha256(v) for v in views]
    assert _text(browser, "#common-block pre") == common
