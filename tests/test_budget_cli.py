"""`kvjudge budget` and `kvjudge budget --ceiling` through the real CLI entry point and a real capability cache.

Cache entries are written by the probe itself (``probe(certify=False)``: the analytic figure from the GGUF
header and this host's memory); the measured figures a certification would add are set on the stored entry
with the cache's own API, so every path from the cache file to the printed budget is the real one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helpers import cli_json_ok
from kvjudge.cli import main
from kvjudge.probe import CapabilityCache, CapabilityEntry, probe


@pytest.fixture
def cached(default_model: Path):
    """``cached(model=default, path=None, **figures)``: a real cache entry for ``model``, figures overridden."""

    def make(model: Path = default_model, path: Path | None = None, **figures) -> CapabilityEntry:
        entry = probe(model, certify=False, cache_path=path).entry
        if figures:
            entry = CapabilityCache(path).put(dataclasses.replace(entry, **figures))
        return entry

    return make


def test_budget_from_measured_max_ok_input(capsys, cached, default_model) -> None:
    entry = cached(max_ok_input=12_000, safe_context=10_000, certified=True, method="measured")
    payload = cli_json_ok(capsys, "budget", "--model", str(default_model))
    assert payload["tokens"] == 12_000 and payload["source"] == "max_ok_input"
    assert payload["prune_above"] == 9600 and payload["threshold_pct"] == 0.8
    assert payload["estimation"] == "chars/4" and payload["provider"] == "token_budget"
    assert payload["capability"]["fingerprint"] == entry.fingerprint
    assert payload["capability"]["max_context_tokens"] == entry.max_context_tokens
    assert "trials" not in payload["capability"]


def test_budget_reads_what_the_cache_learns(capsys, cached, default_model) -> None:
    # The probe's analytic entry alone has no measured figure: the budget is the default, not a guess.
    entry = cached()
    assert entry.max_ok_input is None and entry.safe_context is None
    payload = cli_json_ok(capsys, "budget", "--model", str(default_model))
    assert (payload["tokens"], payload["source"]) == (8192, "default")
    assert payload["capability"]["method"] == "estimated"
    # A prompt of 3,500 tokens really ran: the entry now holds that measured figure, and the next budget takes it.
    CapabilityCache().update(entry.fingerprint, lambda known: dataclasses.replace(known, max_ok_input=3500))
    payload = cli_json_ok(capsys, "budget", "--model", str(default_model))
    assert (payload["tokens"], payload["source"]) == (3500, "max_ok_input")


def test_budget_precedence_through_the_cli(capsys, cached, default_model, tmp_path) -> None:
    cached(max_ok_input=None, safe_context=7000)
    assert cli_json_ok(capsys, "budget", "--model", str(default_model))["source"] == "safe_context"
    config = tmp_path / "k.toml"
    config.write_text("[memory]\ncontext_tokens = 3000\nthreshold_pct = 0.5\n")
    payload = cli_json_ok(capsys, "budget", "--model", str(default_model), "--config", str(config))
    assert (payload["tokens"], payload["source"], payload["prune_above"]) == (3000, "explicit", 1500)


def test_budget_without_entry_says_to_probe(capsys, default_model) -> None:
    assert main(["budget", "--model", str(default_model)]) == 0
    captured = capsys.readouterr()
    assert "run `kvjudge probe --model" in captured.err
    assert "8192" in captured.out and "default" in captured.out and "cache entry" in captured.out


def test_capabilities_file_option(capsys, cached, default_model, tmp_path) -> None:
    caps = tmp_path / "elsewhere.json"
    cached(path=caps, max_ok_input=5000)
    assert cli_json_ok(capsys, "budget", "--model", str(default_model))["source"] == "default"  # not in the default cache
    payload = cli_json_ok(capsys, "budget", "--model", str(default_model), "--capabilities", str(caps))
    assert (payload["tokens"], payload["source"]) == (5000, "max_ok_input")


def test_stale_entry_is_used_with_a_warning(capsys, cached, default_model) -> None:
    cached(max_ok_input=4000, probed_at="2001-01-01T00:00:00+00:00")
    assert main(["budget", "--model", str(default_model), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["capability"]["stale"] is True
    assert "stale" in captured.err


def test_ceiling_hardware_wins(capsys, cached, default_model) -> None:
    entry = cached()
    payload = cli_json_ok(capsys, "budget", "--ceiling", "--model", str(default_model))
    bound = entry.max_context_tokens // 2
    assert bound < 200_000
    assert (payload["configured"], payload["hardware_bound"], payload["effective"], payload["winner"]) == (
        200_000, bound, bound, "hardware")
    assert payload["max_context_tokens"] == entry.max_context_tokens


def test_ceiling_per_tenant_and_human_table(capsys, cached, default_model, tmp_path) -> None:
    cached(max_context_tokens=40_000)
    config = tmp_path / "k.toml"
    config.write_text("[retention]\nceiling = 30000\n[retention.tenants.acme]\nceiling = 5000\n")
    payload = cli_json_ok(capsys, "budget", "--ceiling", "--tenant", "acme", "--model", str(default_model),
                       "--config", str(config))
    assert (payload["tenant"], payload["configured"], payload["effective"], payload["winner"]) == (
        "acme", 5000, 5000, "configured")
    assert main(["budget", "--ceiling", "--model", str(default_model), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "30000" in out and "20000" in out and "hardware wins" in out


def test_ceiling_default_model_is_the_judge_model(capsys, cached, judge_model) -> None:
    entry = cached(model=judge_model)
    payload = cli_json_ok(capsys, "budget", "--ceiling")
    assert Path(payload["model"]).resolve() == judge_model.resolve()
    assert payload["capability"]["fingerprint"] == entry.fingerprint


def test_ceiling_without_probe_figure_is_an_error_not_the_configured_value(capsys, cached, default_model,
                                                                          judge_model) -> None:
    cached(model=default_model)  # a figure for another model does not bound the judge model
    assert main(["budget", "--ceiling", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed that could be mistaken for a ceiling
    assert f"run `kvjudge probe --model {judge_model}" in captured.err
    assert captured.err.count("\n") == 1


def test_tenant_without_ceiling_is_a_usage_error(capsys, default_model) -> None:
    assert main(["budget", "--tenant", "acme", "--model", str(default_model)]) == 2
    assert "--tenant only applies with --ceiling" in capsys.readouterr().err


def test_bad_config_is_one_line_error(capsys, default_model, tmp_path) -> None:
    config = tmp_path / "k.toml"
    config.write_text("[memory]\nthreshold_pct = 80\n")
    assert main(["budget", "--model", str(default_model), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvjudge: error:") and "threshold_pct must be a fraction" in err
