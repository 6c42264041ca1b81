"""`kvjudge budget` and `kvjudge budget --ceiling` through the real CLI entry point.

The capability lookup is replaced at its one boundary (``lookup_entry``) with an entry of the contract's
shape; everything behind it (config, resolution, TokenBudget, ceiling) is real.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvjudge.cli import main
from kvjudge.commands import budget as budget_command


@dataclass(frozen=True)
class FakeEntry:
    fingerprint: str = "fp-1"
    model_sha256: str = "ab" * 32
    model_path: str = ""
    device: str = "cpu:host"
    max_context_tokens: int = 40_000
    max_ok_input: int | None = 12_000
    safe_context: int | None = 10_000
    certified: bool = True
    certified_at: str | None = "2026-11-30T05:00:00Z"
    method: str = "measured"
    trials: tuple = ()
    stale: bool = False


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> dict:
    state: dict = {"entry": FakeEntry(), "calls": []}

    def fake(model_path: Path, cache_path=None):
        state["calls"].append((Path(model_path), cache_path))
        return state["entry"]

    monkeypatch.setattr(budget_command, "lookup_entry", fake)
    return state


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return json.loads(out)


def test_budget_from_measured_max_ok_input(capsys, lookups, model_file) -> None:
    payload = run_json(capsys, "budget", "--model", str(model_file))
    assert lookups["calls"] == [(model_file, None)]
    assert payload["tokens"] == 12_000 and payload["source"] == "max_ok_input"
    assert payload["prune_above"] == 9600 and payload["threshold_pct"] == 0.8
    assert payload["estimation"] == "chars/4" and payload["provider"] == "token_budget"
    assert payload["capability"]["fingerprint"] == "fp-1"
    assert "trials" not in payload["capability"]


def test_budget_precedence_through_the_cli(capsys, lookups, model_file, tmp_path) -> None:
    lookups["entry"] = FakeEntry(max_ok_input=None, safe_context=7000, certified=False)
    assert run_json(capsys, "budget", "--model", str(model_file))["source"] == "safe_context"
    lookups["entry"] = None
    payload = run_json(capsys, "budget", "--model", str(model_file))
    assert (payload["tokens"], payload["source"], payload["capability"]) == (8192, "default", None)
    config = tmp_path / "k.toml"
    config.write_text("[memory]\ncontext_tokens = 3000\nthreshold_pct = 0.5\n")
    lookups["entry"] = FakeEntry()
    payload = run_json(capsys, "budget", "--model", str(model_file), "--config", str(config))
    assert (payload["tokens"], payload["source"], payload["prune_above"]) == (3000, "explicit", 1500)


def test_budget_without_entry_says_to_probe(capsys, lookups, model_file) -> None:
    lookups["entry"] = None
    assert main(["budget", "--model", str(model_file)]) == 0
    captured = capsys.readouterr()
    assert "run `kvjudge probe --model" in captured.err
    assert "8192" in captured.out and "default" in captured.out


def test_capabilities_file_is_passed_to_the_lookup(capsys, lookups, model_file, tmp_path) -> None:
    run_json(capsys, "budget", "--model", str(model_file), "--capabilities", str(tmp_path / "caps.json"))
    assert lookups["calls"][-1] == (model_file, str(tmp_path / "caps.json"))


def test_ceiling_hardware_wins(capsys, lookups, model_file) -> None:
    payload = run_json(capsys, "budget", "--ceiling", "--model", str(model_file))
    assert (payload["configured"], payload["hardware_bound"], payload["effective"], payload["winner"]) == (
        200_000, 20_000, 20_000, "hardware")
    assert payload["max_context_tokens"] == 40_000


def test_ceiling_per_tenant_and_human_table(capsys, lookups, model_file, tmp_path) -> None:
    config = tmp_path / "k.toml"
    config.write_text("[retention]\nceiling = 30000\n[retention.tenants.acme]\nceiling = 5000\n")
    payload = run_json(capsys, "budget", "--ceiling", "--tenant", "acme", "--model", str(model_file),
                       "--config", str(config))
    assert (payload["tenant"], payload["configured"], payload["effective"], payload["winner"]) == (
        "acme", 5000, 5000, "configured")
    assert main(["budget", "--ceiling", "--model", str(model_file), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "30000" in out and "20000" in out and "hardware wins" in out


def test_ceiling_default_model_is_the_judge_model(capsys, lookups, judge_model) -> None:
    run_json(capsys, "budget", "--ceiling")
    assert lookups["calls"][-1][0].resolve() == judge_model.resolve()


def test_ceiling_without_probe_figure_is_an_error_not_the_configured_value(capsys, lookups, model_file) -> None:
    lookups["entry"] = None
    assert main(["budget", "--ceiling", "--model", str(model_file), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed that could be mistaken for a ceiling
    assert "run `kvjudge probe --model" in captured.err
    assert captured.err.count("\n") == 1


def test_tenant_without_ceiling_is_a_usage_error(capsys, lookups, model_file) -> None:
    assert main(["budget", "--tenant", "acme", "--model", str(model_file)]) == 2
    assert "--tenant only applies with --ceiling" in capsys.readouterr().err


def test_bad_config_is_one_line_error(capsys, lookups, model_file, tmp_path) -> None:
    config = tmp_path / "k.toml"
    config.write_text("[memory]\nthreshold_pct = 80\n")
    assert main(["budget", "--model", str(model_file), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvjudge: error:") and "threshold_pct must be a fraction" in err
