"""The report as files: an index page and one page per pair in a folder beside it.

Pages are rendered by Jinja2 with autoescaping on for every template, so run text (ids, task names, agent
names, views, notes) is always written as text: ``<script>`` or ``</textarea>`` in a run shows as those
characters. Each page carries a Content-Security-Policy that loads nothing from anywhere (``default-src
'none'``), allows only its own stylesheet and — on the index — its own script, both inline and named by their
sha256; inline event handlers are therefore refused too. No link is ever made from run text.

Why a folder of pair pages: a pair page quotes both views as the judge read them, up to the judge's whole
window (a few KB to a few hundred KB each), so 500 pairs in one file would make a page of tens to hundreds of
MB. The index keeps the tables and charts (a few hundred bytes per pair) and links each pair to its own page.

Writing: the pair pages go to a fresh folder first, which then takes the place of the old one; the index is
written last (atomically), so a report interrupted part-way leaves the previous report readable.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from kvjudge.atomic import atomic_write
from kvjudge.errors import UsageError
from kvjudge.judge.prompt import TemplateText
from kvjudge.judge.evaluate import BASELINES
from kvjudge.report.charts import accuracy_chart, calibration_chart, ranking_chart, reliability_chart
from kvjudge.report.collect import PairDetail, Report

PAIRS_SUFFIX = "-pairs"


@dataclass(frozen=True)
class Written:
    """Where a report went and how large its files are (bytes)."""

    index: Path
    pair_dir: Path
    pair_pages: int
    index_bytes: int
    pair_bytes_total: int
    pair_bytes_max: int

    def to_json(self) -> dict[str, Any]:
        return {"index": str(self.index), "pair_dir": str(self.pair_dir), "pair_pages": self.pair_pages,
                "index_bytes": self.index_bytes, "pair_bytes_total": self.pair_bytes_total,
                "pair_bytes_max": self.pair_bytes_max}


def _asset(name: str) -> str:
    return files("kvjudge.report").joinpath("templates", name).read_text(encoding="utf-8")


def _digest(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


@dataclass(frozen=True)
class _Inline:
    """A stylesheet or script written inline, and its CSP source expression."""

    text: Markup
    source: str


# What would end each inline element early: our own files must not contain it.
_CLOSING = {".css": "</style", ".js": "</script"}


@cache
def _inline(name: str) -> _Inline:
    text = _asset(name)
    closing = _CLOSING[Path(name).suffix]
    if closing in text.lower():
        raise RuntimeError(f"kvjudge/report/templates/{name} contains {closing}: it would end its element early")
    return _Inline(Markup(text), f"'{_digest(text)}'")


def csp(*, script: bool) -> str:
    """The page's Content-Security-Policy: nothing loads from anywhere; the inline stylesheet (and on the
    index the inline script) are allowed by hash only, so an injected element or handler never runs."""
    style = _inline("report.css").source
    rules = ["default-src 'none'", f"style-src {style}", "base-uri 'none'", "form-action 'none'"]
    if script:
        rules.insert(1, f"script-src {_inline('report.js').source}")
    return "; ".join(rules)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _interval(value: Any, digits: int = 2) -> str:
    if not value:
        return ""
    return f"[{value[0]:.{digits}f}, {value[1]:.{digits}f}]"


def _sort_key(value: Any) -> str:
    """A ``data-sort`` value: numbers as they are (the script compares them as numbers), None last."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


@cache
def environment() -> jinja2.Environment:
    """The templates, autoescaping every one of them (HTML-escaping is what keeps run text inert)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("kvjudge.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=_fmt, interval=_interval, sortkey=_sort_key,
                       json=lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))
    env.globals.update(css=_inline("report.css").text)
    return env


def pair_dir_for(index: Path) -> Path:
    """The folder of pair pages beside ``index``: ``report.html`` → ``report-pairs/``."""
    return index.with_name(index.stem + PAIRS_SUFFIX)


def pair_file(number: int) -> str:
    """A pair page's file name: its number in the report (never anything from a run)."""
    return f"{number:04d}.html"


def _prompt_parts(pair: PairDetail, order: str, segments: list[str]) -> list[dict[str, Any]]:
    """One order's prompt as the judge sent it, segment by segment; the segments of a view (in the order's
    sequence) are named rather than quoted again: the views are shown in full beside each other."""
    expected = ["a", "b"] if order == "ab" else ["b", "a"]
    parts: list[dict[str, Any]] = []
    index = 0
    while index < len(segments):
        segment = segments[index]
        side = expected[0] if expected else None
        view = pair.view_segments[0 if side == "a" else 1] if side is not None else ()
        if view and tuple(segments[index:index + len(view)]) == view:
            expected.pop(0)
            parts.append({"view": side, "run": pair.verdict.a if side == "a" else pair.verdict.b})
            index += len(view)
            continue
        if segment:
            parts.append({"text": str(segment), "template": isinstance(segment, TemplateText)})
        index += 1
    return parts


def render_index(report: Report, pair_href: str) -> str:
    """The index page: header, is the judge right, agents, the pairs table, the runs table."""
    pairs = report.pairs
    tasks = sorted({p.task for p in pairs if p.task is not None})
    agents = sorted({name for p in pairs for name in p.agents})
    figure_rows = [("judge", report.evaluation["judge"])] + [(name, report.evaluation["baselines"][name])
                                                             for name in BASELINES]
    calibrated = report.evaluation["judge"].get("calibration")
    return environment().get_template("index.html").render(
        csp=csp(script=True), script=_inline("report.js").text, header=report.header,
        evaluation=report.evaluation, ranking=report.ranking, figure_rows=figure_rows, pairs=pairs, runs=report.runs,
        tasks=tasks, agents=agents, pair_href=pair_href, accuracy=accuracy_chart(report.evaluation),
        reliability=reliability_chart(report.evaluation["judge"]["reliability"]),
        strengths=ranking_chart(report.ranking), selection=report.selection, calibrated=calibrated,
        calibration=calibration_chart(calibrated["reliability"], "Calibration of p_a: equal-mass bins against the "
                                      "share of pairs where run a has the higher grade") if calibrated else None,
        critic=report.critic, critic_chart=None if report.critic is None else calibration_chart(
            [(b["mean_p"], b["observed"], b["runs"]) for b in report.critic["reliability"]],
            "Reliability of the critic's P(success): equal-mass bins against the share of runs that passed"),
        figures={"eval": report.evaluation, "rank": report.ranking, "critic": report.critic})


def render_pair(report: Report, pair: PairDetail, index_href: str) -> str:
    """One pair's page: the verdict in both orders, the two views side by side, the prompts, what reduction
    removed from each run."""
    runs = {run.id: run for run in report.runs}
    prompts = [{"order": p.order, "parts": _prompt_parts(pair, p.order, p.segments)} for p in pair.prompts]
    return environment().get_template("pair.html").render(
        csp=csp(script=False), pair=pair, verdict=pair.verdict.to_json(),
        orders=pair.verdict.orders, run_a=runs[pair.verdict.a], run_b=runs[pair.verdict.b], prompts=prompts,
        index_href=index_href, total=len(report.pairs))


def check_output(index: Path) -> Path:
    """Refuse an output path that cannot take a report, before anything is judged or written."""
    index = Path(index)
    if index.is_dir():
        raise UsageError(f"--out {index} is a directory; name the report's HTML file (e.g. {index / 'report.html'})")
    if index.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {index} does not end in .html; name the report's HTML file")
    pair_dir = pair_dir_for(index)
    if pair_dir.exists() and not pair_dir.is_dir():
        raise UsageError(f"{pair_dir} exists and is not a directory; the report's pair pages go there: move it")
    parent = index.parent if str(index.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{parent} is not a directory; choose another --out")
    return index


def write_report(report: Report, index: Path) -> Written:
    """Write ``report`` to ``index`` (an HTML file) and its pair pages to the folder beside it."""
    index = check_output(index)
    index.parent.mkdir(parents=True, exist_ok=True)
    pair_dir = pair_dir_for(index)
    staging = Path(tempfile.mkdtemp(dir=index.parent, prefix=f".{pair_dir.name}."))
    sizes = []
    try:
        index_href = "../" + quote(index.name)
        for pair in report.pairs:
            page = render_pair(report, pair, index_href).encode("utf-8")
            (staging / pair_file(pair.number)).write_bytes(page)
            sizes.append(len(page))
        os.chmod(staging, 0o755)
        old = None
        if pair_dir.exists():
            old = Path(tempfile.mkdtemp(dir=index.parent, prefix=f".{pair_dir.name}.old."))
            os.replace(pair_dir, old / "pairs")
        os.replace(staging, pair_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    page = render_index(report, quote(pair_dir.name) + "/").encode("utf-8")
    atomic_write(index, page)
    os.chmod(index, 0o644)  # a page to read and share, not a private file (the temp file it came from was 0600)
    return Written(index=index, pair_dir=pair_dir, pair_pages=len(sizes), index_bytes=len(page),
                   pair_bytes_total=sum(sizes), pair_bytes_max=max(sizes, default=0))
