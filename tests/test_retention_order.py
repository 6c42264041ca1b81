"""Retention order (issue #15): reduce to the ceiling, then tier. `tier` moves only runs within their effective
ceiling (`--unreduced` overrides, and the log records it); `reduce` refuses a run in cold storage, naming
`kvjudge rehydrate RUN`; both exit 1 whenever a run is left above its ceiling, and name it. Races between real
`reduce` and `tier` processes (and two of each) decide on the committed state. The races and the forced interleavings
run on both stores (a SQLite file, a PostgreSQL database: ``store_at``); what only the commands decide, on SQLite.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import event_kinds, kvjudge, local_cold_url, start_kvjudge, store_from_runs

import kvjudge.retention.reduce_apply as reduce_module
import kvjudge.retention.tiering.move as move_module
from kvjudge.retention import RunInColdStorage, Store, reduce_run, tier_run, verify
from kvjudge.retention.cold.local import LocalDirColdStore
from kvjudge.retention.tiering.checks import verify_checks
from kvjudge.retention.tiering.move import TierGate
from kvjudge.retention.tiering.reader import ColdReader
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.retention import events as ev
from kvjudge.retention.stored_tokens import run_tokens
from kvjudge.testing.filler import filler
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import CharsPerToken

CEILING = 1200
CHARS = CharsPerToken(4)
#: What only the commands decide (the same on either store) runs on SQLite alone.
SQLITE_ONLY = pytest.mark.parametrize("store_at", ["sqlite"], indirect=True)


def runs(copy: int = 0) -> list[dict]:
    """Two runs within the ceiling and four above it (one with a dead branch), all graded; ``copy`` > 0 makes
    another six like them (ids and texts of their own)."""
    tag, seed = ("", 0) if copy == 0 else (f"-{copy}", 100 * copy)
    return [make_run(f"small-1{tag}", [filler(seed + 1, 120)]),
            make_run(f"small-2{tag}", [filler(seed + 2, 200), "ok"]), make_run(f"big-1{tag}", [filler(seed + 3, 2500)]),
            make_run(f"big-2{tag}", [filler(seed + 4, 900), filler(seed + 5, 1400)]),
            make_run(f"big-3{tag}", [filler(seed + 6, 3000)], dead=[[filler(seed + 7, 800)]]),
            make_run(f"big-4{tag}", [filler(seed + 8, 4000)])]


@pytest.fixture
def setup(tmp_path: Path, capabilities: dict[int, Path], store_at: Callable[[str], str]) -> dict:
    """A store of :func:`runs`, a cold directory, and the options that give every command the same ceiling."""
    location = store_at("store")
    store_from_runs(location, runs()).close()
    config = tmp_path / "kvjudge.toml"
    config.write_text(f'[retention]\ncounter = "chars"\nceiling = {CEILING}\n')
    common = ["--config", str(config), "--capabilities", str(capabilities[160_000])]
    return {"store": location, "cold": local_cold_url(tmp_path), "config": config, "common": common,
            "tmp": tmp_path, "store_at": store_at}


def tokens_now(path: str) -> dict[str, int]:
    """Visible tokens of every run (chars/4), tiered bodies read through the cold reader."""
    with Store.open(path) as store:
        store.blobs.fallback = ColdReader(store, ColdStores())
        return {run_id: run_tokens(store, store.runs.run(run_id), CHARS) for run_id in store.runs.run_ids()}


def assert_sound(path: str) -> None:
    """verify is green (recovery, re-hash, re-fold, tiered refs present), no unfinished deletion left."""
    with Store.open(path) as store:
        report = verify(store, extra_checks=verify_checks(store, ColdStores()))
        assert report.ok, report.to_dict()
        assert not [note for note in report.notes if "still stored" in note], report.notes


def tier_starts(path: str, run_id: str) -> list[ev.TierStarted]:
    with Store.open(path) as store:
        return [e for _, e in store.events.iter_events(run_id) if isinstance(e, ev.TierStarted)]


@SQLITE_ONLY
def test_tier_moves_only_runs_within_their_ceiling(setup: dict) -> None:
    store_args = ["--store", str(setup["store"]), *setup["common"]]
    before = tokens_now(setup["store"])
    assert {r: t <= CEILING for r, t in before.items()} == {"small-1": True, "small-2": True, "big-1": False,
                                                           "big-2": False, "big-3": False, "big-4": False}
    done = kvjudge("tier", "--all", "--to", setup["cold"], *store_args, "--json")
    assert done.returncode == 1, done.stderr
    payload = json.loads(done.stdout)
    statuses = {r["run"]: (r["status"], r["tokens"], r["ceiling"]) for r in payload["runs"]}
    assert statuses == {r: ("tiered" if t <= CEILING else "above_ceiling", t, CEILING) for r, t in before.items()}
    assert payload["left_behind"] == ["big-1", "big-2", "big-3", "big-4"]
    for run_id in payload["left_behind"]:
        assert (f"run {run_id}: {before[run_id]} tokens, above its ceiling {CEILING}; not moved — run "
                f"`kvjudge reduce {run_id}` first") in done.stderr
        assert tier_starts(setup["store"], run_id) == []  # nothing of it moved, nothing logged
    assert_sound(setup["store"])

    # --unreduced moves one anyway, and its log says so (with the figures it was moved at).
    raw = kvjudge("tier", "big-1", "--unreduced", "--to", setup["cold"], *store_args, "--json")
    assert raw.returncode == 0, raw.stderr
    (result,) = json.loads(raw.stdout)["runs"]
    recorded = {"tokens": before["big-1"], "ceiling": CEILING, "counter": "chars/4"}
    assert (result["status"], result["unreduced"]) == ("tiered", recorded)
    assert "big-1: moved unreduced as asked" in raw.stderr
    (started,) = tier_starts(setup["store"], "big-1")
    assert started.unreduced == recorded
    with Store.open(setup["store"]) as store:
        assert store.runs.run("big-1").tier["unreduced"] == recorded
        assert store.runs.run("big-1").tier["status"] == "tiered"
        assert store.runs.refold("big-1").canonical_bytes() == store.runs.projected_bytes("big-1")
        assert "unreduced" not in store.runs.run("small-1").tier  # an ordinary move records no such thing
    assert_sound(setup["store"])

    # Without a probe figure the ceiling is unknown: refused, unless --unreduced (recorded with ceiling null).
    no_probe = ["--store", str(setup["store"]), "--config", str(setup["config"])]
    refused = kvjudge("tier", "big-2", "--to", setup["cold"], *no_probe)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "kvjudge probe" in refused.stderr
    blind = kvjudge("tier", "big-2", "--unreduced", "--to", setup["cold"], *no_probe, "--json")
    assert blind.returncode == 0, blind.stderr
    assert json.loads(blind.stdout)["runs"][0]["unreduced"] == {"tokens": before["big-2"], "ceiling": None,
                                                                "counter": "chars/4"}


@SQLITE_ONLY
def test_tier_first_then_reduce_names_rehydrate(setup: dict) -> None:
    store_args = ["--store", str(setup["store"]), *setup["common"]]
    before = tokens_now(setup["store"])
    # A tier whose ceiling is the hardware bound (80 000: the --ceiling of reduce below is not its ceiling).
    roomy = ["--store", str(setup["store"]), "--capabilities", setup["common"][-1]]
    setup["config"].write_text('[retention]\ncounter = "chars"\n')
    moved = kvjudge("tier", "--all", "--to", setup["cold"], *roomy, "--json")
    assert moved.returncode == 0, moved.stderr
    assert {r["status"] for r in json.loads(moved.stdout)["runs"]} == {"tiered"}
    with Store.open(setup["store"]) as store:
        logs = {run_id: [e.to_json() for _, e in store.events.iter_events(run_id)] for run_id in store.runs.run_ids()}

    reduced = kvjudge("reduce", "--all", "--ceiling", str(CEILING), *store_args, "--json")
    assert reduced.returncode == 1, reduced.stderr
    payload = json.loads(reduced.stdout)
    above = {item["run"]: item for item in payload["above_ceiling"]}
    assert sorted(above) == ["big-1", "big-2", "big-3", "big-4"]
    for run_id, item in above.items():
        assert (item["tokens"], item["target"], item["fix"]) == (before[run_id], CEILING,
                                                                  f"kvjudge rehydrate {run_id}")
        assert f"run `kvjudge rehydrate {run_id}`, then reduce it" in reduced.stderr
    assert "loss step" not in reduced.stderr  # no loss step was taken, so none is spoken of
    assert re.search(r"4 run\(s\) left above their ceiling: big-1, big-2, big-3, big-4\n$", reduced.stderr)
    assert {r["run"]: r["fits"] for r in payload["runs"]} == {r: t <= CEILING for r, t in before.items()}
    with Store.open(setup["store"]) as store:  # nothing was appended to any run: the refusal wrote nothing
        assert {run_id: [e.to_json() for _, e in store.events.iter_events(run_id)] for run_id in store.runs.run_ids()} == logs
    assert_sound(setup["store"])

    # The named fix works: rehydrate, reduce, and tier again (now within the ceiling).
    assert kvjudge("rehydrate", "big-4", "--store", str(setup["store"])).returncode == 0
    again = kvjudge("reduce", "big-4", "--ceiling", str(CEILING), *store_args, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["runs"][0]["fits"]
    retier = kvjudge("tier", "big-4", "--ceiling", str(CEILING), "--to", setup["cold"], *store_args, "--json")
    assert retier.returncode == 0 and json.loads(retier.stdout)["runs"][0]["status"] == "tiered", retier.stderr
    assert tokens_now(setup["store"])["big-4"] <= CEILING
    assert_sound(setup["store"])


@SQLITE_ONLY
def test_a_run_loss_steps_cannot_bring_down_is_named_with_the_steps_taken(setup: dict) -> None:
    store_args = ["--store", str(setup["store"]), *setup["common"]]
    done = kvjudge("reduce", "big-3", "--ceiling", "5", *store_args, "--json")
    assert done.returncode == 1, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert not run["fits"] and run["steps"]["bodies_reduced"] > 0 and run["steps"]["dropped"] > 0
    taken = [f"{run['steps'][key]} {label}" for key, label in (
        ("bodies_reduced", "bodies reduced to extracts"), ("branches_reduced", "dead branches reduced to extracts"),
        ("dropped", "dead-branch texts dropped")) if run["steps"][key]]
    assert (f"run big-3: {run['tokens_after']} tokens remain above the target 5 after every loss step "
            f"({', '.join(taken)})") in done.stderr
    assert json.loads(done.stdout)["above_ceiling"][0]["run"] == "big-3"


RACES = [("reduce", "tier"), ("tier", "reduce"), ("reduce", "reduce"), ("tier", "tier")]


@pytest.mark.parametrize("first,second", RACES)
def test_concurrent_reduce_and_tier_decide_on_the_committed_state(setup: dict, first: str, second: str) -> None:
    # 24 runs: both processes walk the same runs in the same order, long enough to meet on some of them.
    pristine = [run for copy in range(4) for run in runs(copy)]
    rng = random.Random(f"{first}-{second}")
    # Two rounds on PostgreSQL (each round there is slower: its processes write through the server).
    rounds = 2 if str(setup["store"]).startswith("postgresql://") else 3
    for round_ in range(rounds):
        path = setup["store_at"](f"round-{round_}")
        store_from_runs(path, pristine).close()
        cold = setup["tmp"] / f"cold-{round_}"
        cold.mkdir()
        commands = {"reduce": ["reduce", "--all"], "tier": ["tier", "--all", "--to", f"file://{cold}"]}
        processes = []
        for kind in (first, second):
            processes.append((kind, start_kvjudge(*commands[kind], "--store", str(path), *setup["common"], "--json")))
            time.sleep(rng.uniform(0, 0.6))  # a random start offset: the overlap differs every round
        named: set[str] = set()
        for kind, process in processes:
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode in (0, 1) and "Traceback" not in stderr, (kind, process.returncode, stderr)
            payload = json.loads(stdout)
            left = payload["left_behind"] if kind == "tier" else [item["run"] for item in payload["above_ceiling"]]
            assert (process.returncode == 1) == bool(left), (kind, stderr)
            for run_id in left:
                assert f"run {run_id}: " in stderr
            named.update(left)
        assert_sound(path)
        now = tokens_now(path)
        # Every run is within its ceiling, or was named by a process that exited 1.
        assert all(tokens <= CEILING or run_id in named for run_id, tokens in now.items()), (now, named)
        for run_id in now:
            starts = tier_starts(path, run_id)
            assert len(starts) <= 1  # two movers joined one move; never a second one
            assert all(start.unreduced is None for start in starts)  # nothing above its ceiling was moved
        if first != second:  # reduce ran to the end: whatever tier left behind, reduce brought within
            assert all(tokens <= CEILING for tokens in now.values()), now


# ---------------------------------------------------------------- interleavings, each forced at a known point
# Two connections to one store file, as two processes would have: "elsewhere" runs to completion on its own
# connection between two steps of the operation under test (SQLite's locking is the same either way).


def once(action: Callable[[], None]) -> Callable[[], None]:
    """``action`` the first time the returned function is called; nothing after."""
    pending = [action]

    def call() -> None:
        if pending:
            pending.pop()()

    return call


def at_fault_point(monkeypatch: pytest.MonkeyPatch, module: Any, point: str, action: Callable[[], None]) -> None:
    """Run ``action`` (once) when ``module`` reaches fault point ``point``."""
    real, elsewhere = module.fault_point, once(action)

    def hook(name: str) -> None:
        if name == point:
            elsewhere()
        real(name)

    monkeypatch.setattr(module, "fault_point", hook)


class CheckedThen(LocalDirColdStore):
    """A local cold store whose first ``check()`` (made before a move decides anything) lets ``action`` run."""

    def __init__(self, root: Path, action: Callable[[], None]) -> None:
        super().__init__(root)
        self._then = once(action)

    def check(self) -> None:
        super().check()
        self._then()


def test_reduce_sees_a_move_committed_after_it_planned(setup: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path, cold = setup["store"], LocalDirColdStore(setup["tmp"] / "cold")

    def tier_elsewhere() -> None:
        with Store.open(path) as other:
            assert tier_run(other, "big-1", cold, gate=TierGate(CEILING, CHARS, unreduced=True)).status == "tiered"

    at_fault_point(monkeypatch, reduce_module, "after_put_summary", tier_elsewhere)
    with Store.open(path) as store:
        store.blobs.fallback = ColdReader(store, ColdStores())
        with pytest.raises(RunInColdStorage, match="run `kvjudge rehydrate big-1`, then reduce it"):
            reduce_run(store, "big-1", CEILING, CHARS)
        kinds = event_kinds(store, "big-1")
    assert kinds[-2:] == ["TierStarted", "Tiered"]
    assert not {"Reduced", "BranchReduced", "Dropped"} & set(kinds)  # nothing appended
    assert_sound(path)


def test_tier_judges_a_run_reduced_after_it_looked(setup: dict) -> None:
    path = setup["store"]

    def reduce_elsewhere() -> None:
        with Store.open(path) as other:
            assert reduce_run(other, "big-1", CEILING, CHARS).plan.fits

    with Store.open(path) as store:
        assert run_tokens(store, store.runs.run("big-1"), CHARS) > CEILING  # what it saw before deciding
        result = tier_run(store, "big-1", CheckedThen(setup["tmp"] / "cold", reduce_elsewhere),
                          gate=TierGate(CEILING, CHARS))
        assert (result.status, result.unreduced) == ("tiered", None) and result.tokens <= CEILING
        state = store.runs.run("big-1")
        # The move carried the reduced run: its summaries, not the originals the reduction replaced.
        moved = {ref for ref, loc in state.bodies.items() if loc.status == "tiered"}
        reduced = {ref for ref, loc in state.bodies.items() if loc.status == "reduced"}
        assert reduced and {state.bodies[ref].summary_ref for ref in reduced} <= moved and not reduced & moved
    assert_sound(path)


def test_a_second_reduce_plans_again_on_the_committed_state(setup: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path = setup["store"]

    def reduce_elsewhere() -> None:
        with Store.open(path) as other:
            assert reduce_run(other, "big-2", CEILING, CHARS).appended > 0

    with Store.open(path) as store:
        # The other reduction commits (and deletes the originals) after this one read the run, mid-planning.
        real_text = store.blobs.text
        monkeypatch.setattr(store.blobs, "text", lambda ref: (once_elsewhere(), real_text(ref))[1])
        once_elsewhere = once(reduce_elsewhere)
        result = reduce_run(store, "big-2", CEILING, CHARS)
        assert result.appended == 0 and result.plan.fits  # planned again: nothing left to do
    with Store.open(path) as store:
        originals = [e.original for _, e in store.events.iter_events("big-2") if isinstance(e, ev.Reduced)]
        assert originals and len(originals) == len(set(originals))  # each body reduced once, by one process
    assert_sound(path)


def test_a_second_tier_joins_the_move_under_way(setup: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path, cold = setup["store"], LocalDirColdStore(setup["tmp"] / "cold")

    def tier_elsewhere() -> None:
        with Store.open(path) as other:
            joined = tier_run(other, "small-1", cold, gate=TierGate(CEILING, CHARS))
            assert (joined.status, joined.recovered) == ("tiered", "upload")  # it finished the started move

    at_fault_point(monkeypatch, move_module, "tier.after_started", tier_elsewhere)
    with Store.open(path) as store:
        result = tier_run(store, "small-1", cold, gate=TierGate(CEILING, CHARS))
        assert result.status == "already_tiered"  # the other committed this very move first
        kinds = event_kinds(store, "small-1")
    assert kinds[-2:] == ["TierStarted", "Tiered"] and kinds.count("TierStarted") == 1
    assert_sound(path)
