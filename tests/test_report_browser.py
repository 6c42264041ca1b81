"""`kvjudge report` in a real headless Chromium (the system's, driven by Selenium): the page loads clean, shows the
conclusion and every agent, filters and sorts without a network, shows each pair's views exactly as the judge read
them, never runs what a run's text carries, and shows the very figures `eval --json` and `rank --json` print.

The store (tests/report_support.py) has its verdicts in the judgment cache, written through the judge's own
packing and keys, except one pair that the report judges itself with the real default model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import kvjudge, kvjudge_json
from report_support import AGENTS, N_CTX, PASSES, PAYLOAD_RUN, PAYLOADS, REDUCED_RUN, seeded_store
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.testing.browser import chromium, console, open_page, screenshot

pytestmark = [pytest.mark.model, pytest.mark.browser]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> dict[str, Any]:
    """The store, its report, and what eval, rank and judge print for the same store (all in child processes,
    with their own cache and data dirs)."""
    root = tmp_path_factory.mktemp("report")
    env_dirs = {"KVJUDGE_CACHE_DIR": str(root / "cache"), "KVJUDGE_DATA_DIR": str(root / "data")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env_dirs.items():
            patch.setenv(name, value)
        store, pairs = seeded_store(root / "store.sqlite", default_model, leave_out=1)
        import os

        env = dict(os.environ)
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


def _errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")]


def _visible_pairs(browser: Any) -> list[tuple[str, str]]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#pairs tbody tr")
    return [(row.get_attribute("data-a"), row.get_attribute("data-b")) for row in rows if row.is_displayed()]


def test_the_report_judged_only_what_was_not_cached(built: dict[str, Any]) -> None:
    written = built["written"]
    assert (written["pairs"], written["cached"], written["judged"]) == (12, 11, 1)
    assert written["pair_pages"] == 12 and sorted(p.name for p in Path(written["pair_dir"]).iterdir())[0] == "0001.html"


def test_the_report_loads_clean_with_the_conclusion_and_every_agent(built: dict[str, Any], browser: Any,
                                                                    tmp_path: Path) -> None:
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
    shot = screenshot(browser, tmp_path / "report-index.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")


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


def _pair_number(browser: Any, a: str, b: str) -> str:
    row = browser.find_element(By.CSS_SELECTOR, f'#pairs tbody tr[data-a="{a}"][data-b="{b}"]')
    return row.find_element(By.CSS_SELECTOR, "td a").text


def test_a_pair_page_shows_both_views_exactly_as_the_judge_read_them(built: dict[str, Any], browser: Any,
                                                                     tmp_path: Path) -> None:
    verdict = next(v for v in built["verdicts"] if REDUCED_RUN in (v["a"], v["b"]))
    open_page(browser, built["index"])
    number = _pair_number(browser, verdict["a"], verdict["b"])
    browser.find_element(By.LINK_TEXT, number).click()
    assert _errors(console(browser)) == []
    for side in ("a", "b"):
        text = browser.execute_script(f"return document.querySelector('#view-{side} pre').textContent")
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == verdict["view_sha256"][side]
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
        events = [e for _, e in store.iter_events(REDUCED_RUN) if isinstance(e, ev.Reduced)]
    rows = browser.find_elements(By.CSS_SELECTOR, f'table.reductions[data-run="{REDUCED_RUN}"] tbody tr')
    shown = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [(r[0], int(r[2]), int(r[3]), r[4]) for r in shown] == \
        [("Reduced", e.tokens_before, e.tokens_after, e.counter) for e in events] and events
    print(f"screenshot: {screenshot(browser, tmp_path / 'report-pair.png')}")


def test_run_text_with_script_and_markup_never_executes(built: dict[str, Any], browser: Any) -> None:
    verdict = next(v for v in built["verdicts"] if PAYLOAD_RUN in (v["a"], v["b"]))
    side = "a" if verdict["a"] == PAYLOAD_RUN else "b"
    open_page(browser, built["index"])
    browser.find_element(By.LINK_TEXT, _pair_number(browser, verdict["a"], verdict["b"])).click()
    view = browser.execute_script(f"return document.querySelector('#view-{side} pre').textContent")
    for payload in PAYLOADS:
        assert payload in view  # shown as the characters the run holds
    assert browser.execute_script("return typeof window.pwned") == "undefined"
    assert browser.execute_script("return document.scripts.length") == 0  # a pair page runs no script at all
    for selector in ('a[href^="javascript:"]', 'img[src="x"]', "svg[onload]", "textarea", "pre style"):
        assert browser.find_elements(By.CSS_SELECTOR, selector) == [], selector
    assert browser.find_element(By.TAG_NAME, "body").is_displayed()  # the run's <style> hid nothing
    # The policy itself: an inline handler added to the page is refused, and the refusal is reported.
    ran = browser.execute_script(
        "const b = document.createElement('button'); b.setAttribute('onclick', 'window.handlerRan = 1');"
        "document.body.append(b); b.click(); return typeof window.handlerRan")
    assert ran == "undefined"
    refused = [e for e in console(browser) if "Content Security Policy" in e["message"]]
    assert refused and "inline event handler" in refused[0]["message"]
    # On the index, which does run its own script, an injected script element is refused all the same.
    open_page(browser, built["index"])
    injected = browser.execute_script(
        "const s = document.createElement('script'); s.textContent = 'window.injected = 1';"
        "document.body.append(s); return typeof window.injected")
    assert injected == "undefined"
    assert any("Content Security Policy" in e["message"] for e in console(browser))


def test_the_figures_on_the_page_are_eval_and_rank_json(built: dict[str, Any], browser: Any) -> None:
    open_page(browser, built["index"])
    figures = json.loads(browser.find_element(By.ID, "kvjudge-figures").get_attribute("textContent"))
    expected_rank = {k: v for k, v in built["rank"].items() if k not in ("png", "pairing")}  # the command's own
    # The window and the backend's n_ctx and threads say where the judge ran, not what it found: the report judged
    # the one pair not cached (so it opened a window), eval afterwards read every verdict from the cache (none).
    def figures_only(result: dict[str, Any]) -> dict[str, Any]:
        manifest = {k: v for k, v in result["manifest"].items()
                    if k not in ("n_ctx", "n_ctx_source", "n_batch", "threads")}
        return {**{k: v for k, v in result.items() if k != "window"}, "manifest": manifest}

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
