"""`kvjudge probe` and `kvjudge cache` as scripts use them: real subprocesses, JSON out, one-line errors."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers import kvjudge, memory_budget_for
from kvjudge.models import file_sha256
from kvjudge.probe import kv_cache_bytes, read_model_shape


def test_probe_json_carries_the_contract_fields(default_model: Path, isolated_dirs: Path) -> None:
    done = kvjudge("probe", "--no-certify", "--memory-budget", "1GiB", "--n-ctx", "4096", "--no-swa-full", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data["devices"], list) and any(d["kind"] == "host" for d in data["devices"])
    model = data["model"]
    assert model["path"] == str(default_model) and model["sha256"] == file_sha256(default_model)
    assert (model["arch"], model["n_layer"], model["n_ctx_train"]) == ("gemma3", 18, 32768)
    assert data["kv_bytes_per_token"] == 3 * 2 * 256 * 2  # windowed: only the 3 global layers grow
    assert data["max_context_tokens"] > 0 and data["max_context_tokens"] % 256 == 0
    assert (data["max_ok_input"], data["safe_context"], data["certified"], data["trials"]) == (None, None, False, [])
    shape = read_model_shape(default_model)
    assert data["kv_cache_bytes"] == kv_cache_bytes(shape, 4096, swa_full=False)
    assert data["memory_budget"] == 1024**3
    assert (isolated_dirs / "cache" / "capabilities.json").exists()


def test_probe_human_output_is_a_table(default_model: Path) -> None:
    done = kvjudge("probe", "--no-certify", "--memory-budget", "1GiB")
    assert done.returncode == 0, done.stderr
    assert "max_context_tokens" in done.stdout and "not certified" in done.stdout


def test_the_config_names_the_budget(default_model: Path, isolated_dirs: Path) -> None:
    (isolated_dirs / "kvjudge.toml").write_text('[probe]\nmemory_budget = "1GiB"\n')
    data = json.loads(kvjudge("probe", "--no-certify", "--json").stdout)
    assert data["memory_budget"] == 1024**3


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--memory-budget=-1GiB"], 2, "memory size must be positive"),
    (["--memory-budget", "lots"], 2, "cannot read memory size"),
    (["--model", "/nonexistent/model.gguf"], 1, "does not exist"),
    (["--type-v", "q8_0"], 2, "--flash-attn"),
    (["--type-k", "q3_k"], 2, "invalid choice"),
    (["--n-seq", "0"], 2, "must be positive"),
    (["--gpu-layers", "-5"], 2, "--gpu-layers"),
    (["--memory-budget", "400MiB"], 1, "does not fit"),
])
def test_bad_input_is_one_clear_line(default_model: Path, args: list[str], code: int, needle: str) -> None:
    done = kvjudge("probe", "--no-certify", *args)
    assert done.returncode == code
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_not_a_gguf_is_a_model_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello")
    done = kvjudge("probe", "--no-certify", "--model", str(fake))
    assert done.returncode == 1 and "not a GGUF" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_cache_show_refresh_clear(default_model: Path, isolated_dirs: Path) -> None:
    cache = isolated_dirs / "cache" / "capabilities.json"
    assert kvjudge("probe", "--no-certify", "--memory-budget", "1GiB").returncode == 0
    shown = json.loads(kvjudge("cache", "show", "--json").stdout)
    assert shown["path"] == str(cache) and [e["status"] for e in shown["entries"]] == ["fresh"]
    nothing = json.loads(kvjudge("cache", "refresh", "--stale-only", "--json").stdout)
    assert nothing["refreshed"] == []
    # Age the entry past the staleness limit: show says so and refresh --stale-only probes it again.
    raw = json.loads(cache.read_text())
    (fingerprint, entry), = raw["entries"].items()
    entry["probed_at"] = (datetime.now(timezone.utc) - timedelta(days=45)).isoformat()
    cache.write_text(json.dumps(raw))
    assert [e["status"] for e in json.loads(kvjudge("cache", "show", "--json").stdout)["entries"]] == ["stale"]
    refreshed = json.loads(kvjudge("cache", "refresh", "--stale-only", "--json").stdout)["refreshed"]
    assert [(r["fingerprint"], r["was"], r["result"]) for r in refreshed] == [(fingerprint, "stale", "estimated")]
    assert [e["status"] for e in json.loads(kvjudge("cache", "show", "--json").stdout)["entries"]] == ["fresh"]
    cleared = json.loads(kvjudge("cache", "clear", "--json").stdout)
    assert cleared["removed_entries"] == 1 and not cache.exists()


def test_a_corrupt_cache_is_named_and_left_alone_until_cleared(isolated_dirs: Path, default_model: Path) -> None:
    cache = isolated_dirs / "cache" / "capabilities.json"
    cache.parent.mkdir(parents=True)
    cache.write_text("{oops")
    for args in (["cache", "show"], ["probe", "--no-certify", "--memory-budget", "1GiB"]):
        done = kvjudge(*args)
        assert done.returncode == 1 and str(cache) in done.stderr and "kvjudge cache clear" in done.stderr
    assert cache.read_text() == "{oops"
    done = kvjudge("cache", "clear", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["was_unreadable"] is True and not cache.exists()


@pytest.mark.model
def test_probe_certifies_through_the_cli_into_the_named_cache(default_model: Path, isolated_dirs: Path,
                                                             tmp_path: Path) -> None:
    """A small --memory-budget makes 512 tokens the most that fits: the CLI runs the trials and says so."""
    cache = tmp_path / "elsewhere" / "caps.json"
    budget = memory_budget_for(default_model, 512)
    done = kvjudge("probe", "--memory-budget", str(budget), "--swa-full", "--n-ctx", "4096", "--cache", str(cache),
                   "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["certified"], data["method"], data["cached"]) == (True, "measured", False)
    assert data["settings"]["swa_full"] is True and data["memory_budget"] == budget
    assert data["max_context_tokens"] == 512
    outcomes = [(t["n_ctx"], t["outcome"]) for t in data["trials"]]
    assert outcomes == [(512, "ok"), (768, "over_budget")]
    # 512 less the 16 tokens kept free for decoding really ran; 512 less 10 % is 460.8, down to a multiple of 64.
    assert (data["max_ok_input"], data["safe_context"]) == (496, 448)
    shape = read_model_shape(default_model)
    assert data["trials"][0]["kv_bytes_measured"] == kv_cache_bytes(shape, 512)
    # --swa-full: the sliding-window layers keep every cell (at 4096 tokens that is more than the window needs).
    assert data["kv_cache_bytes"] == kv_cache_bytes(shape, 4096, swa_full=True) > kv_cache_bytes(shape, 4096,
                                                                                                 swa_full=False)
    assert data["fingerprint"] in json.loads(cache.read_text())["entries"]
    assert not (isolated_dirs / "cache" / "capabilities.json").exists()  # --cache, not the default
    again = json.loads(kvjudge("probe", "--memory-budget", str(budget), "--cache", str(cache), "--json").stdout)
    assert again["cached"] is True and again["certified_at"] == data["certified_at"]


def test_kv_settings_from_the_command_line_reach_the_kv_math(default_model: Path) -> None:
    done = kvjudge("probe", "--no-certify", "--memory-budget", "2GiB", "--type-k", "q8_0", "--type-v", "q8_0",
                   "--flash-attn", "--n-seq", "2", "--gpu-layers", "4", "--n-ctx", "4096", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["settings"] == {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True, "swa_full": True, "n_seq": 2,
                                "gpu_layers": 4, "n_ubatch": 512}
    shape = read_model_shape(default_model)
    assert data["kv_cache_bytes"] == kv_cache_bytes(shape, 4096, "q8_0", "q8_0", n_seq=2, flash_attn=True)
    assert data["kv_cache_bytes"] < kv_cache_bytes(shape, 4096, n_seq=2)  # q8_0 holds less than f16


def test_probe_without_a_model_probes_the_judge_the_settings_name(default_model: Path, judge_model: Path,
                                                                  isolated_dirs: Path) -> None:
    from kvjudge.testing.sim_judge import AnswerKey, SimJudgeServer

    bare = kvjudge("probe", "--no-certify", "--json")
    assert bare.returncode == 0 and json.loads(bare.stdout)["model"]["path"] == str(default_model), bare.stderr
    assert "bundled default model" in bare.stderr
    config = isolated_dirs / "kvjudge.toml"
    config.write_text(f'[judge]\nmodel = "{judge_model}"\n')
    named = kvjudge("probe", "--no-certify", "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["model"]["path"] == str(judge_model) != str(default_model)
    assert f"([judge] model): {judge_model}" in named.stderr
    # --model still wins over the settings.
    flagged = kvjudge("probe", "--no-certify", "--json", "--model", str(default_model))
    assert json.loads(flagged.stdout)["model"]["path"] == str(default_model) and "probing" not in flagged.stderr
    with SimJudgeServer(AnswerKey([])) as first, SimJudgeServer(AnswerKey([])) as second:
        config.write_text(f'[judge]\nmodel = "{judge_model}"\nserver = "{first.url}"\n')
        served = kvjudge("probe", "--no-certify", "--json")
        assert served.returncode == 0, served.stderr
        assert json.loads(served.stdout)["server"]["url"] == first.url  # a server configured is the judge
        config.write_text(f'[judge]\nservers = ["{first.url}", "{second.url}"]\n')
        pool = kvjudge("probe", "--no-certify", "--json")
        assert pool.returncode == 0, pool.stderr
        assert [entry["server"]["url"] for entry in json.loads(pool.stdout)["servers"]] == [first.url, second.url]
        local = kvjudge("probe", "--no-certify", "--n-ctx", "512")
        assert local.returncode == 2 and "--n-ctx" in local.stderr and "--model PATH" in local.stderr
    shown = kvjudge("probe", "--help", env={**os.environ, "COLUMNS": "200"})
    assert "[judge] servers / server, else [judge] model; else the bundled default model" in shown.stdout
