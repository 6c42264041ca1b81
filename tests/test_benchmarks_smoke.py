"""Every benchmark runs: each script of ``benchmarks/`` at its smallest size, in a child process, must exit 0 and print
its one JSON line. Nothing here reads a figure (benchmarks are never timed tests): a benchmark that stops running —
an API it calls renamed, a store part moved — fails the suite instead of waiting for the next ``make bench``.

The cases are in tests/benchmark_smoke.py; the real-model ones run from tests/test_benchmarks_smoke_model.py (a file
of their own, so a second test worker takes them). A new benchmark needs its case there or a smoke test of its own
(``SMOKED_ELSEWHERE``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark_smoke import BENCHMARKS, SMOKE, SMOKE_WITH_BROWSER, SMOKE_WITH_MODEL, SMOKED_ELSEWHERE, run_smoke


def test_every_benchmark_has_a_smoke_run() -> None:
    cases = {**SMOKE, **SMOKE_WITH_MODEL, **SMOKE_WITH_BROWSER}
    assert {path.stem for path in BENCHMARKS.glob("*.py")} - SMOKED_ELSEWHERE == set(cases)


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    run_smoke(name, SMOKE[name], tmp_path)


@pytest.mark.browser
@pytest.mark.parametrize("name", sorted(SMOKE_WITH_BROWSER))
def test_the_benchmark_runs_with_the_browser_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    run_smoke(name, SMOKE_WITH_BROWSER[name], tmp_path)
