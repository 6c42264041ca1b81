"""Does a reduced run keep the evidence a grader needs? Today's uniform head-and-tail reduction beside kvjudge's.

``--runs`` SWE-bench-shaped trajectories (default 60) are generated with
:func:`kvjudge.testing.trajectories.make_episode` — 50–120 transitions, 10k–40k tokens, a final patch of
10–80 changed lines in 1–4 hunks, test runs among the steps and a last one before the submission — written as
mini-swe-agent 2.x saves them and ingested with ``kvjudge``'s own importer. Each run is reduced to ceilings of
2k, 4k, 8k, 16k and 32k tokens (counted with the judge model's tokenizer, ``--counter``) in two ways:

- **uniform** (the baseline, kept here and nowhere else): reduction's first step as it was before evidence
  was ranked — every body above a common cap is cut to that cap, half head and half tail, around a marker
  ``[… N tokens elided from sha256:<12 hex>… …]``;
- **kvjudge**: :func:`kvjudge.retention.reduce.plan_reduction`, planned and never stored, as the judge derives
  a reduced view (:mod:`kvjudge.judge.pack`).

Each reduced run is rendered as the judge reads it (:func:`kvjudge.judge.render.render_view`) and measured with
:func:`kvjudge.retention.evidence.measure`: the share of the final patch's changed lines the view shows, whether
it shows the patch whole, whether it shows the last test run's outcome, and the tokens its markers take. "Fits":
the reduction reached the ceiling. Targets: at 16,384 every patch shown whole where the run fits at all; at
4,096 a mean share ≥ 0.85 over the runs that fit. Also: what markers cost in the view of the run closest to 100
transitions. Writes ``evidence_retention.json`` (with every run's figures) and ``evidence_retention.png`` to
``--out`` and prints the JSON (without the per-run figures) as one line.

    python benchmarks/evidence_retention.py --out /tmp/bench [--runs 60] [--counter model]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvjudge.judge.render import Body, body_resolver, escape, render_view
from kvjudge.models import judge_model_path
from kvjudge.retention import Store, ingest_paths
from kvjudge.retention.blobs import short
from kvjudge.retention.evidence import measure
from kvjudge.retention.extract import _cut_head, _cut_tail
from kvjudge.retention.reduce import plan_reduction, view_refs
from kvjudge.retention.state import LOCAL, RunState
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v2
from kvjudge.tokens import TokenCounter, make_counter

CEILINGS = (2048, 4096, 8192, 16384, 32768)
MARKERS = re.compile(r"\[\d+ (?:context )?(?:lines|characters) cut\]|\[… \d+ tokens elided from [^\]]*…\]")
CountFn = Callable[[str], int]


# ----------------------------------------------------------------- the baseline: the uniform cap of before
OLD_MARKER = "[… {elided} tokens elided from {source} …]"
_MIN_SAVING = 8


def _old_extract(text: str, source: str, tokens: int, keep: int, count: CountFn) -> str:
    keep = max(0, min(keep, tokens))
    half = int(keep / 2 * (len(text) / tokens if tokens > 0 else 4.0))
    head = _cut_head(text, half)
    tail = _cut_tail(text[len(head):], half)
    elided = max(0, tokens - (count(head) if head else 0) - (count(tail) if tail else 0))
    parts = [head.rstrip("\n"), OLD_MARKER.format(elided=elided, source=source), tail.lstrip("\n")]
    return "\n".join(part for part in parts if part)


def uniform_reduction(state: RunState, text_of: Callable[[str], str | None], counts: dict[str, int],
                      count: CountFn, target: int) -> tuple[dict[str, str], bool]:
    """Step 1 as it was: every body above a common cap (the largest whose estimate fits) cut to that cap, half
    head, half tail; the cap tightened while the real extracts overshoot. Summaries by original ref, and fits."""
    view = Counter(view_refs(state))
    candidates = sorted((r for r in view if state.bodies[r].status == LOCAL), key=lambda r: (-counts[r], r))
    marker_tokens = count(OLD_MARKER.format(elided=1234, source=short(candidates[0])))
    fixed = sum(counts[r] * n for r, n in view.items() if r not in set(candidates))

    def estimated(cap: int) -> int:
        return fixed + sum(view[r] * (cap + marker_tokens if counts[r] - cap - marker_tokens >= _MIN_SAVING
                                      else counts[r]) for r in candidates)

    low, high = 0, max(counts[r] for r in candidates)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if estimated(middle) <= target else (low, middle - 1)
    cap = low
    while True:
        summaries: dict[str, str] = {}
        total = fixed
        for ref in candidates:
            tokens = counts[ref]
            if tokens - (cap + marker_tokens) >= _MIN_SAVING:
                text = _old_extract(text_of(ref) or "", short(ref), tokens, cap, count)
                after = count(text)
                if after < tokens:
                    summaries[ref] = text
                    total += view[ref] * after
                    continue
            total += view[ref] * tokens
        if total <= target or cap == 0:
            return summaries, total <= target
        cap = max(0, min(cap - 1, int(cap * target / total)))


def uniform_view(state: RunState, text_of: Callable[[str], str | None], summaries: dict[str, str]) -> str:
    def resolve(ref: str) -> Body:
        return Body(summaries[ref], "summary") if ref in summaries else Body(text_of(ref), "original")
    return render_view(state, resolve)


# ------------------------------------------------------------------------------------------- the runs
def generate(directory: Path, runs: int, seed: int) -> list[Path]:
    """SWE-bench-shaped trajectories (mini-swe-agent 2.x files)."""
    rng = random.Random(seed)
    paths = []
    for index in range(runs):
        steps = rng.randrange(24, 59)                    # 2 × steps + 4 transitions: 52–120
        episode = make_episode(f"repo{index % 7}__proj-{index}", seed * 1000 + index,
                               target_bytes=rng.randrange(32_000, 125_000), steps=steps,
                               patch_lines=rng.randrange(10, 81))
        path = directory / f"run-{index:03d}.traj.json"
        path.write_text(json.dumps(mini_swe_agent_v2(episode)))
        paths.append(path)
    return paths


def marker_tokens(view: str, count: CountFn, memo: dict[str, int]) -> tuple[int, int]:
    """Markers in ``view`` and the tokens they take."""
    total = found = 0
    for match in MARKERS.finditer(view):
        text = match.group()
        if text not in memo:
            memo[text] = count(text)
        total += memo[text]
        found += 1
    return found, total


def measure_run(store: Store, run_id: str, counter: TokenCounter, memo: dict[str, int]) -> dict[str, Any]:
    state = store.runs.run(run_id)
    transitions = sum(len(b.transitions) for b in state.branches)
    counts = {ref: counter.count(store.blobs.text(ref) or "") for ref in state.bodies}
    tokens = sum(counts[ref] for ref in view_refs(state))
    row: dict[str, Any] = {"run": run_id, "transitions": transitions, "tokens": tokens, "ceilings": {}}
    for ceiling in CEILINGS:
        summaries, old_fits = uniform_reduction(state, store.blobs.text, counts, counter.count, ceiling)
        old_view = uniform_view(state, store.blobs.text, summaries)
        # As the judge derives a reduced view (kvjudge.judge.pack): plan, never store, render.
        plan = plan_reduction(state, store.blobs.text, counter, ceiling, counts=counts)
        reduced = plan.state_after
        new_view = render_view(reduced, body_resolver(reduced, lambda ref: plan.text_of(ref, store.blobs.text)))
        result = {}
        for name, view, fits in (("uniform", old_view, old_fits), ("kvjudge", new_view, plan.fits)):
            seen = measure(state, store.blobs.text, view, escape)
            markers, tokens_of_markers = marker_tokens(view, counter.count, memo)
            result[name] = {"fits": fits, "share": seen.share, "whole": seen.whole,
                            "outcome_visible": seen.outcome_visible, "markers": markers,
                            "marker_tokens": tokens_of_markers}
        row["ceilings"][ceiling] = result
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ceiling in CEILINGS:
        per: dict[str, Any] = {}
        for name in ("uniform", "kvjudge"):
            cells = [row["ceilings"][ceiling][name] for row in rows]
            fit = [c for c in cells if c["fits"]]
            per[name] = {
                "fits": len(fit),
                "mean_share_fitting": round(statistics.fmean(c["share"] for c in fit), 4) if fit else None,
                "mean_share_all": round(statistics.fmean(c["share"] for c in cells), 4),
                "whole_fitting": round(sum(bool(c["whole"]) for c in fit) / len(fit), 4) if fit else None,
                "none_visible": sum(c["share"] == 0 for c in cells),
                "outcome_visible": round(sum(bool(c["outcome_visible"]) for c in cells) / len(cells), 4),
                "mean_marker_tokens": round(statistics.fmean(c["marker_tokens"] for c in cells), 1),
                "tokens_per_marker": round(sum(c["marker_tokens"] for c in cells)
                                           / max(1, sum(c["markers"] for c in cells)), 2),
            }
        out[str(ceiling)] = per
    return out


def hundred_transitions(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What markers cost in the view of the run closest to 100 transitions, at each ceiling."""
    row = min(rows, key=lambda r: (abs(r["transitions"] - 100), r["run"]))
    return {"run": row["run"], "transitions": row["transitions"], "tokens": row["tokens"],
            "markers": {str(c): {name: {"markers": cell["markers"], "tokens": cell["marker_tokens"]}
                                 for name, cell in row["ceilings"][c].items()} for c in CEILINGS}}


def plot(path: Path, summary: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("mean_share_fitting", "patch lines shown (mean, runs that fit)"),
              ("whole_fitting", "runs showing the whole patch (of those that fit)"),
              ("outcome_visible", "runs showing the last test outcome"),
              ("mean_marker_tokens", "tokens spent on markers (mean per view)"))
    figure, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for axis, (key, title) in zip(axes, panels):
        for name, style in (("uniform", "o--"), ("kvjudge", "s-")):
            values = [summary[str(c)][name][key] for c in CEILINGS]
            axis.plot(CEILINGS, [float("nan") if v is None else v for v in values], style, label=name)
        axis.set_xscale("log", base=2)
        axis.set_xticks(CEILINGS, [f"{c // 1024}k" for c in CEILINGS])
        axis.set_xlabel("ceiling (tokens)")
        axis.set_title(title, fontsize=9)
        if key != "mean_marker_tokens":
            axis.set_ylim(-0.03, 1.03)
        axis.legend(fontsize=8)
    figure.suptitle("Evidence a judge can still read after reduction (uniform head-and-tail vs kvjudge)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--counter", default="model", help="model (the judge model's tokenizer) or tiktoken")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    counter = make_counter(args.counter, judge_model_path() if args.counter == "model" else None)
    started = time.perf_counter()
    memo: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="kvjudge-evidence-") as scratch:
        paths = generate(Path(scratch), args.runs, args.seed)
        with Store.open(Path(scratch) / "store.sqlite") as store:
            run_ids = [run for path in paths for run in ingest_paths(store, [path]).runs]
            rows = [measure_run(store, run_id, counter, memo) for run_id in run_ids]
    summary = summarise(rows)
    result = {"benchmark": "evidence_retention", "counter": counter.name, "runs": len(rows),
              "transitions": [min(r["transitions"] for r in rows), max(r["transitions"] for r in rows)],
              "tokens": [min(r["tokens"] for r in rows), max(r["tokens"] for r in rows)],
              "ceilings": summary, "markers_in_a_100_transition_run": hundred_transitions(rows),
              "targets": targets(summary), "seconds": round(time.perf_counter() - started, 1)}
    (args.out / "evidence_retention.json").write_text(json.dumps({**result, "per_run": rows}, indent=2) + "\n")
    plot(args.out / "evidence_retention.png", summary)
    print(json.dumps(result))


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    """The targets, met or not: every patch whole at 16,384 where the run fits; mean share ≥ 0.85 at 4,096."""
    at16, at4 = summary["16384"]["kvjudge"], summary["4096"]["kvjudge"]
    return {"whole_at_16384": at16["whole_fitting"], "whole_at_16384_met": at16["whole_fitting"] == 1.0,
            "mean_share_at_4096": at4["mean_share_fitting"],
            "mean_share_at_4096_met": (at4["mean_share_fitting"] or 0) >= 0.85}


if __name__ == "__main__":
    main()
