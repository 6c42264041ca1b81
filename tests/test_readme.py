"""The README's Python API example runs as written (on the fast default model, with two small sample runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvjudge.demo import sample_runs_path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python API example"
    return blocks[0]


@pytest.mark.model
def test_readme_python_example_runs(tmp_path: Path, default_model: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = [line for line in sample_runs_path().read_text().splitlines()
             if json.loads(line)["id"] in ("slug-1", "slug-2")]
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    # The example uses the bundled judge model; the default model runs the same code three times faster.
    import kvjudge.models

    monkeypatch.setattr(kvjudge.models, "judge_model_path", lambda fetch=True: default_model)
    exec(compile(_python_example(), str(README), "exec"), {"__name__": "readme_example"})
    outcome, p_a = capsys.readouterr().out.split()
    assert outcome in ("a", "b", "tie", "inconsistent")
    assert 0.0 <= float(p_a) <= 1.0
