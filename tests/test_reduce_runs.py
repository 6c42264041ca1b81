"""`reduce_runs`, the one library call behind `kvjudge reduce`: a selection of runs reduced to their tenants' targets,
and reduction through a served tokenizer (a real simulated judge over HTTP) as cheap in requests as it can be."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import store_from_runs

from kvjudge.errors import CapabilityMissing, RunStateError
from kvjudge.retention import reduce_run, reduce_runs
from kvjudge.testing.filler import filler
from kvjudge.testing.native_runs import make_run
from kvjudge.server_client import ServerClient, ServerTokenCounter
from kvjudge.testing.sim_judge import SimJudge, SimJudgeServer, write_key
from kvjudge.tokens import ParallelCounter


def _output(seed: int, lines: int) -> str:
    return "\n".join(f"{number:4d}  {filler(seed * 1000 + number, 12)}" for number in range(lines))


def _runs(count: int, *, tenant: str = "default", lifecycle=("running", "grading", "graded")) -> list[dict]:
    return [make_run(f"{tenant}-{index}", [_output(index * 10 + step, 60 + 20 * step) for step in range(5)],
                     tenant=tenant, lifecycle=list(lifecycle)) for index in range(count)]


class LocalSimTokenizer:
    """The simulated judge's tokenizer run here: what the server counts, without a request."""

    name = "local:sim-judge"

    @staticmethod
    def count(text: str) -> int:
        return len(SimJudge.tokens(text))


def _outcomes(done) -> list[tuple]:
    return [(r["run"], r["tokens_before"], r["tokens_after"], r["events"], r["fits"]) for r in done.runs]


def test_served_counting_reduces_as_local_counting_with_each_text_asked_once(tmp_path: Path) -> None:
    runs = _runs(4)
    with store_from_runs(tmp_path / "local.sqlite", runs) as store:
        local = reduce_runs(store, None, lambda tenant: 1500, LocalSimTokenizer())
    sent: list[str] = []
    with SimJudgeServer(write_key(tmp_path / "key.json", []), prompts=sent) as server, \
            store_from_runs(tmp_path / "served.sqlite", runs) as store:
        clients = [ServerClient(server.url) for _ in range(2)]
        model = clients[0].identify().model_id
        members = [ServerTokenCounter(client, model) for client in clients]
        for member in members:
            member.count("")  # the BOS each tokenization carries, found once (as the judge target does)
        counter = ParallelCounter(members, parallel=2)
        before, already = server.requests["/tokenize"], len(sent)
        served = reduce_runs(store, None, lambda tenant: 1500, counter)
        requests = server.requests["/tokenize"] - before
        del sent[:already]
        for client in clients:
            client.close()
    assert all(outcome[3] > 0 and outcome[4] for outcome in _outcomes(local))  # every run was cut, and fits
    assert _outcomes(served) == _outcomes(local)
    # Each text (a body, a cut marker, an extract tried) went to the server once in the whole selection: markers
    # recur run after run and are remembered.
    asked = Counter(sent)
    assert asked and max(asked.values()) == 1, [text[:40] for text, n in asked.items() if n > 1][:5]
    assert requests == len(sent) == len(asked)


def test_every_target_is_known_before_anything_is_counted(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", _runs(2) + _runs(1, tenant="acme")) as store:
        asked: list[str] = []

        def target_of(tenant: str) -> int:
            asked.append(tenant)
            if tenant == "default":
                raise CapabilityMissing("no probe figure for the judge")
            return 1500

        with pytest.raises(CapabilityMissing):
            reduce_runs(store, None, target_of, LocalSimTokenizer())
        assert asked == ["acme", "default"]
        assert store.caches.cached_counts({ref for s in store.runs.iter_runs() for ref in s.bodies}, LocalSimTokenizer.name) == {}
        assert not any(state.reduced for state in store.runs.iter_runs())


def test_a_run_still_grading_is_refused_by_name_and_listed_in_a_whole_selection(tmp_path: Path) -> None:
    runs = _runs(1) + _runs(1, tenant="late", lifecycle=("running", "grading"))
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        with pytest.raises(RunStateError, match="late-0 is grading"):
            reduce_runs(store, ["late-0"], lambda tenant: 1500, LocalSimTokenizer())
        done = reduce_runs(store, None, lambda tenant: 1500, LocalSimTokenizer())
        assert [r["run"] for r in done.runs] == ["default-0"] and done.token_targets == {"default": 1500}
        assert [item["run"] for item in done.refused] == ["late-0"]
        assert store.runs.run("default-0").reduced and not store.runs.run("late-0").reduced


def test_a_dry_run_plans_every_run_and_writes_nothing(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", _runs(2)) as store:
        seen: list[tuple[str, int, int]] = []
        done = reduce_runs(store, None, lambda tenant: 1500, LocalSimTokenizer(), dry_run=True,
                           on_run=lambda run_id, index, total: seen.append((run_id, index, total)))
        assert seen == [("default-0", 0, 2), ("default-1", 1, 2)]
        assert all(r["dry_run"] and r["events"] > 0 for r in done.runs)
        assert not any(state.reduced for state in store.runs.iter_runs())


def _served_counter(server: SimJudgeServer) -> tuple[ParallelCounter, list[ServerClient]]:
    clients = [ServerClient(server.url) for _ in range(2)]
    model = clients[0].identify().model_id
    members = [ServerTokenCounter(client, model) for client in clients]
    for member in members:
        member.count("")
    return ParallelCounter(members, parallel=2), clients


def test_a_run_changed_after_it_was_planned_ahead_is_planned_again_from_its_new_state(tmp_path: Path) -> None:
    runs = _runs(3)

    def first_cut(store):  # another process reduces default-1 a little while default-0 is being reduced
        def on_run(run_id: str, done: int, total: int) -> None:
            if run_id == "default-1":
                reduce_run(store, run_id, 3000, LocalSimTokenizer())
        return on_run

    with store_from_runs(tmp_path / "local.sqlite", runs) as store:
        local_plans = reduce_runs(store, None, lambda tenant: 1500, LocalSimTokenizer(), dry_run=True)
        local = reduce_runs(store, None, lambda tenant: 1500, LocalSimTokenizer(), on_run=first_cut(store))
    with SimJudgeServer(write_key(tmp_path / "key.json", [])) as server, \
            store_from_runs(tmp_path / "served.sqlite", runs) as store:
        counter, clients = _served_counter(server)
        planned = reduce_runs(store, None, lambda tenant: 1500, counter, dry_run=True)
        served = reduce_runs(store, None, lambda tenant: 1500, counter, on_run=first_cut(store))
        counters = [event.counter for _, event in store.events.iter_events("default-1") if event.kind == "Reduced"]
        for client in clients:
            client.close()
    assert _outcomes(planned) == _outcomes(local_plans) and _outcomes(served) == _outcomes(local)
    # default-1 was planned ahead from its state before the other cut, then planned again from the state after it.
    assert served.runs[1]["tokens_before"] < planned.runs[1]["tokens_before"]
    assert served.runs[1]["fits"] and set(counters) == {"local:sim-judge", counter.name}
