"""Every benchmark that runs the real model runs: at its smallest size (the cases of tests/benchmark_smoke.py), in a
child process, exit 0 and one JSON line, no figure read. Apart from tests/test_benchmarks_smoke.py so that two test
workers (``--dist loadfile``) run the model's cases beside the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark_smoke import SMOKE_WITH_MODEL, run_smoke


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(SMOKE_WITH_MODEL))
def test_the_benchmark_runs_the_real_model_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    run_smoke(name, SMOKE_WITH_MODEL[name], tmp_path)
