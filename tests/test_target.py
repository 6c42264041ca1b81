"""The judge target (kvjudge.target): one home for which judge, its capability entries, max_context_tokens, the
ceiling per tenant, the token counter and the settings that reach them — for a local GGUF and for a pool of
simulated vLLM judges (real HTTP servers in this process)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers import cli_json_ok, free_ports, kvjudge, store_from_runs
from kvjudge.cli import main
from kvjudge.errors import CapabilityMissing, ConfigError
from kvjudge.probe import CapabilityCache, probe, probe_server
from kvjudge.retention import Store, reduce_run, run_tokens
from kvjudge.settings import Settings
from kvjudge.target import JudgeTarget
from kvjudge.testing.filler import filler
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudgeServer, key_entry, write_key
from kvjudge.tokens import ModelTokenizer, ParallelCounter, count_texts


def _settings(tmp_path: Path, toml: str, name: str = "kvjudge.toml") -> Settings:
    path = tmp_path / name
    path.write_text(toml)
    return Settings.load(path)


# ------------------------------------------------------------------------------------------------ a local judge
def test_the_ceiling_is_the_entrys_bound_per_tenant_never_the_configured_value_alone(
        tmp_path: Path, capabilities: dict[int, Path], judge_model: Path) -> None:
    settings = _settings(tmp_path, "[retention]\nceiling = 100000\n[retention.tenants.acme]\nceiling = 5000\n")
    target = JudgeTarget.resolve(settings, capabilities=capabilities[160_000])
    assert target.model_path == judge_model and target.max_context_tokens == 160_000
    default, acme = target.ceiling("default"), target.ceiling("acme")
    assert (default.configured, default.effective, default.winner) == (100_000, 80_000, "hardware")
    assert (acme.configured, acme.effective, acme.winner) == (5000, 5000, "configured")
    assert target.ceiling_figures("acme") == {"configured": 5000, "max_context_tokens": 160_000,
                                              "hardware_bound": 80_000, "effective": 5000, "winner": "configured"}
    lowered = JudgeTarget.resolve(settings, capabilities=capabilities[160_000], ceiling=1000)
    assert lowered.ceiling("default").effective == 1000
    assert target.describe()["judge"] == str(judge_model)
    assert target.describe()["capability"]["max_context_tokens"] == 160_000

    nothing = JudgeTarget.resolve(settings, capabilities=tmp_path / "empty.json")
    assert nothing.max_context_tokens is None
    with pytest.raises(CapabilityMissing, match=r"max_context_tokens.*run `kvjudge probe --model"):
        nothing.ceiling("default")
    figures, note = nothing.ceilings({"default"})
    assert figures == {} and "run `kvjudge probe --model" in note


def test_config_memory_budget_reaches_every_lookup(tmp_path: Path, judge_model: Path) -> None:
    # Two entries of one model under two memory budgets; the one a lookup finds is the one [probe] memory_budget
    # names in the file given with --config (the probe reads no ./kvjudge.toml of its own any more).
    caps = tmp_path / "caps.json"
    unbounded = probe(judge_model, certify=False, cache_path=caps).entry
    budgeted = probe(judge_model, certify=False, cache_path=caps, memory_budget="1GiB").entry
    CapabilityCache(caps).put(dataclasses.replace(budgeted, max_context_tokens=6000))
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    config = elsewhere / "judge.toml"
    config.write_text('[probe]\nmemory_budget = "1GiB"\n')
    target = JudgeTarget.resolve(Settings.load(config), capabilities=caps)
    assert target.entry.fingerprint == budgeted.fingerprint and target.max_context_tokens == 6000
    assert JudgeTarget.resolve(Settings(), capabilities=caps).entry.fingerprint in (unbounded.fingerprint,
                                                                                    budgeted.fingerprint)
    done = kvjudge("budget", "--ceiling", "--json", "--config", str(config), "--capabilities", str(caps))
    assert done.returncode == 0, done.stderr
    assert '"max_context_tokens": 6000' in done.stdout and '"effective": 3000' in done.stdout


def test_the_in_process_window_reads_the_targets_capabilities_file_and_staleness(tmp_path: Path,
                                                                                  judge_model: Path) -> None:
    # One entry, certified ten days ago, in a file of its own (--capabilities); the default cache stays empty.
    caps = tmp_path / "caps.json"
    analytic = probe(judge_model, certify=False, cache_path=caps).entry
    ten_days_ago = (datetime.now(timezone.utc) - timedelta(days=10)).isoformat()
    CapabilityCache(caps).put(dataclasses.replace(analytic, max_context_tokens=4000, max_ok_input=1700,
                                                  safe_context=1536, certified=True, certified_at=ten_days_ago,
                                                  method="measured"))

    def window_caps(staleness_days: int) -> tuple[tuple[int, str], tuple[int, str], int | None]:
        settings = _settings(tmp_path, f"[probe]\nstaleness_days = {staleness_days}\n")
        target = JudgeTarget.resolve(settings, capabilities=caps)
        judge = target.open_judge(certify=False)
        try:
            return judge.planner.cap("certified"), judge.planner.cap("analytic"), target.max_context_tokens
        finally:
            judge.backend.close()

    # Fresh under a 30-day limit: the window is capped by the file's certified safe_context, and the ceiling
    # reads the same entry.
    certified, bound, ceiling_context = window_caps(30)
    assert certified == (1536, "the certified safe_context")
    assert bound == (4000, "the analytic max_context_tokens") and ceiling_context == 4000
    # Stale under a 5-day limit: the planner re-derives the analytic figure (no model run) into that same file.
    certified, bound, _ = window_caps(5)
    assert certified == bound == (analytic.max_context_tokens, "the analytic max_context_tokens")
    refreshed = CapabilityCache(caps, staleness_days=5).get(analytic.fingerprint)
    assert refreshed is not None and not refreshed.stale and not refreshed.certified


def test_an_unknown_key_fails_every_command_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "typo.toml"
    config.write_text("[retention]\nceilng = 5000\n")
    for argv in (["runs"], ["budget", "--ceiling"], ["verify"], ["cache", "show"]):
        assert main([*argv, "--config", str(config)]) == 1
        err = capsys.readouterr().err
        assert "unknown key 'ceilng' in [retention]; did you mean ceiling?" in err and err.count("\n") == 1


def test_a_flag_is_checked_like_the_file_and_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = tmp_path / "s.sqlite"
    store_from_runs(store, [make_run("a", ["x"]), make_run("b", ["y"])]).close()
    assert main(["judge", "a", "b", "--server", "http://127.0.0.1:9", "--parallel", "0", "--store", str(store)]) == 1
    assert "--parallel: [judge] parallel must be at least 1, got 0" in capsys.readouterr().err
    assert main(["judge", "a", "b", "--margin", "0.7", "--store", str(store)]) == 1
    assert "--margin: [judge] margin must be in [0, 0.5)" in capsys.readouterr().err
    assert main(["judge", "a", "b", "--parallel", "3", "--store", str(store)]) == 2
    assert "--parallel only apply to judge servers" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--store"):
        Settings().with_overrides({"retention.store": 5}, {"retention.store": "--store"})


# --------------------------------------------------------------------------------------- a pool of servers
@pytest.fixture
def sim(tmp_path: Path, start_sim: Callable[[Path, SimSettings], SimJudgeServer]) -> Callable[[int], SimJudgeServer]:
    """``sim(max_model_len)``: a simulated vLLM judge serving model "sim" at that context, stopped after the test."""
    key = write_key(tmp_path / "key.json", [key_entry(marker="marker line", grade=1.0, patch="+fix\n",
                                                      outcome="1 passed")])
    return lambda max_model_len: start_sim(key, SimSettings(max_model_len=max_model_len, model="sim"))


def test_a_pools_ceiling_is_its_smallest_served_context_everywhere(tmp_path: Path, sim, capsys) -> None:
    big, small = sim(8192), sim(2048)
    caps = tmp_path / "caps.json"
    for server in (big, small):
        assert probe_server(server.url, cache_path=caps).entry.certified
    settings = _settings(tmp_path, f'[judge]\nservers = ["{big.url}", "{small.url}"]\n')
    target = JudgeTarget.resolve(settings, capabilities=caps)
    assert target.max_context_tokens == 2048 and target.ceiling("default").effective == 1024
    assert target.label == f"sim @ {small.url}"
    # `budget --ceiling` read the first server (8192 // 2 = 4096); now the pool's minimum, as reduce and tier.
    bound = cli_json_ok(capsys, "budget", "--ceiling", "--config", str(tmp_path / "kvjudge.toml"),
                        "--capabilities", str(caps))
    assert (bound["max_context_tokens"], bound["effective"], bound["servers"]) == (2048, 1024, [big.url, small.url])
    store = tmp_path / "store.sqlite"
    store_from_runs(store, [make_run("long", [filler(1, 9000)])]).close()
    reduced = cli_json_ok(capsys, "reduce", "--all", "--dry-run", "--server", big.url, "--server", small.url,
                          "--store", str(store), "--capabilities", str(caps))
    assert reduced["ceilings"]["default"]["effective"] == 1024


def test_a_member_without_an_entry_is_probed_on_first_use(tmp_path: Path, sim) -> None:
    known, fresh = sim(4096), sim(3072)
    caps = tmp_path / "caps.json"
    probe_server(known.url, cache_path=caps)
    probed_before = known.requests["/v1/completions"]
    said: list[str] = []
    target = JudgeTarget.resolve(Settings().with_overrides({"judge.servers": (known.url, fresh.url)}),
                                 capabilities=caps, say=said.append)
    assert fresh.requests["/v1/completions"] == 0
    assert target.max_context_tokens == 3072  # the fresh member, probed now, bounds the pool
    assert len(said) == 1 and f"model served at {fresh.url}" in said[0] and "probing it now" in said[0]
    assert 1 <= fresh.requests["/v1/completions"] <= 3  # at most three certification requests
    assert known.requests["/v1/completions"] == probed_before  # a member with an entry is not probed again
    entries = CapabilityCache(caps).entries()
    assert {e.server["url"] for e in entries} == {known.url, fresh.url}

    # `kvjudge judge` over a pool nobody probed: each member is probed on first use, one line each, then judged.
    store = tmp_path / "s.sqlite"
    store_from_runs(store, [make_run("a", ["x"]), make_run("b", ["y"], passed=False)]).close()
    pool = (sim(4096), sim(4096))
    done = kvjudge("judge", "a", "b", "--server", pool[0].url, "--server", pool[1].url, "--store", str(store),
                   "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("probing it now") == 2 and all(1 <= s.requests["/v1/completions"] for s in pool)

    # A member that cannot be reached: no figure, and the error says how to get one — never the configured value.
    nowhere = f"http://127.0.0.1:{free_ports(1)[0]}"
    blind = JudgeTarget.resolve(Settings().with_overrides({"judge.servers": (known.url, nowhere)}),
                                capabilities=caps)
    assert blind.max_context_tokens is None
    with pytest.raises(CapabilityMissing, match=rf"no probe figure for the model served at {nowhere}.*"
                                                rf"kvjudge probe --server {nowhere}"):
        blind.ceiling("default")


def test_a_served_counter_counts_locally_when_it_can_else_in_parallel_batches(tmp_path: Path, sim,
                                                                             judge_model: Path) -> None:
    first, second = sim(4096), sim(4096)
    caps = tmp_path / "caps.json"
    for server in (first, second):
        probe_server(server.url, cache_path=caps)
    pool = Settings().with_overrides({"judge.servers": (first.url, second.url), "judge.parallel": 3})
    counter = JudgeTarget.resolve(pool, capabilities=caps).counter()
    # No GGUF of the served model here: the servers' own tokenizer, a batch spread over the pool.
    assert isinstance(counter, ParallelCounter) and counter.parallel == 3 and len(counter.counters) == 2
    before = first.requests["/tokenize"] + second.requests["/tokenize"]
    texts = [f"def f{i}(x):\n    return x * {i}\n" * (i + 1) for i in range(40)]
    counts = count_texts(counter, texts)
    sent = first.requests["/tokenize"] + second.requests["/tokenize"] - before
    assert first.requests["/tokenize"] > 0 and second.requests["/tokenize"] > 0  # both members counted
    assert sent == len(texts)  # one request a text: each member found its route and BOS once, when opened
    assert counts == [counter.count(text) for text in texts]  # the same counts, whichever member answered

    # A reduction counts each run's bodies in one batch, stored once: counting again asks nothing.
    store_path = tmp_path / "store.sqlite"
    store_from_runs(store_path, [make_run(f"r{i}", [filler(i, 800), filler(i + 50, 600)]) for i in range(6)]).close()
    with Store.open(store_path) as store:
        totals = [run_tokens(store, store.runs.run(f"r{i}"), counter) for i in range(6)]
        asked = first.requests["/tokenize"] + second.requests["/tokenize"]
        assert [run_tokens(store, store.runs.run(f"r{i}"), counter) for i in range(6)] == totals
        assert first.requests["/tokenize"] + second.requests["/tokenize"] == asked

    # [judge] model names a local GGUF, but it does not tokenize as these servers do: it is checked, not trusted.
    unchecked = JudgeTarget.resolve(pool.with_overrides({"judge.model": str(judge_model)}), capabilities=caps)
    assert isinstance(unchecked.counter(), ParallelCounter)

    # A local copy of the served GGUF ([judge] tokenizer_model / --tokenizer-model): no request at all.
    local = JudgeTarget.resolve(pool.with_overrides({"judge.tokenizer_model": str(judge_model)}),
                                capabilities=caps).counter()
    asked = first.requests["/tokenize"] + second.requests["/tokenize"]
    assert isinstance(local, ModelTokenizer) and local.count("hello world") > 0
    assert first.requests["/tokenize"] + second.requests["/tokenize"] == asked


def test_still_grades_reduces_each_tenants_side_to_its_ceiling_or_reads_the_callers_stored_reduction(
        tmp_path: Path, sim) -> None:
    server = sim(8192)
    caps = tmp_path / "caps.json"
    probe_server(server.url, cache_path=caps)
    settings = _settings(tmp_path, f'[judge]\nservers = ["{server.url}"]\n[retention]\ncounter = "chars"\n'
                                   f'[retention.tenants.acme]\nceiling = 300\n')
    runs = [make_run("a", [filler(1, 600)]), make_run("b", [filler(2, 600)], passed=False),
            make_run("c", [filler(3, 600)], tenant="acme"), make_run("d", [filler(4, 600)], tenant="acme",
                                                                      passed=False)]
    store = store_from_runs(tmp_path / "store.sqlite", runs)
    target = JudgeTarget.resolve(settings, capabilities=caps)
    judge = target.open_judge()
    try:
        # By default each tenant's side is reduced to its effective ceiling: acme's 300, the pool's 8192 // 2.
        check = target.still_grades(judge, store, [("a", "b"), ("c", "d")])
        assert check.reduce_to == {"acme": 300, "default": 4096}
        default_pair, acme_pair = check.results
        assert not default_pair.views_differ  # nothing of a and b is over 4096 tokens
        assert acme_pair.views_differ and all(acme_pair.reduced.tokens[side].view
                                              < acme_pair.full.tokens[side].view for side in ("a", "b"))
        assert any("300-token target for this check" in note for note in acme_pair.reduced.notes)
        assert check.summary["pairs"] == 2 and check.reduced == [default_pair.reduced, acme_pair.reduced]
        assert target.still_grades(judge, store, [("c", "d")], reduce_to=500).reduce_to == {"acme": 500}

        # The caller's own reduction in the store, between the sides: the reduced side reads the runs as stored.
        heard: list[str] = []

        def reduce_stored(targets: Mapping[str, int]) -> None:
            heard.append(f"reduce to {dict(targets)}")
            for run_id in ("c", "d"):
                reduce_run(store, run_id, targets["acme"], target.counter())

        stored = target.still_grades(judge, store, [("c", "d")], reduce_stored=reduce_stored,
                                     on_verdict=lambda _index, verdict: heard.append(verdict.outcome))
        assert heard[1] == "reduce to {'acme': 300}" and len(heard) == 3  # full verdict, reduction, reduced verdict
        (result,) = stored.results
        assert store.runs.run("c").reduced and result.views_differ and "reduce_stored" in stored.seconds
        assert not any("for this check" in note for note in result.reduced.notes)
    finally:
        judge.backend.close()
        store.close()
