"""The judging pipeline: verdicts found in the cache by what identifies them, views counted from counts kept per body,
and a pool kept busy — against the simulated judge (a real HTTP server answering as vLLM does) and the bundled judge
model's tokenizer (vocab only: no weights).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import store_from_runs

from kvjudge.judge import Judge, LlamaBackend, Prompt, ServerPool, judge_batch, open_servers
from kvjudge.judge.render import view_source
from kvjudge.judge.evaluate import evaluate
from kvjudge.judge.pack import pair_bases, pack_pair
from kvjudge.judge.pairing import same_task_pairs
from kvjudge.judge.runfacts import RUN_FACTS_KEY_PREFIX, RunFacts
from kvjudge.judge.verdict import view_sources
from kvjudge.retention import Store
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.state import TIERED
from kvjudge.server_client import RetryPolicy
from kvjudge.testing.graded_runs import swe_run
from kvjudge.testing.sim_judge import AnswerKey, Settings, SimJudgeServer
from kvjudge.tokens import ModelTokenizer, make_counter

TASKS = ("csv-1", "csv-2", "csv-3")
N_CTX = 16_384


def _runs() -> list[Any]:
    return [swe_run(f"{agent}/{task}", task=task, agent=agent, passed=agent == "x", seed=number, explore=2)
            for number, task in enumerate(TASKS) for agent in ("x", "y")]


PAIRS = [(f"x/{task}", f"y/{task}") for task in TASKS]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with store_from_runs(tmp_path / "store.sqlite", [r.run for r in _runs()]) as opened:
        yield opened


@pytest.fixture
def sim() -> Iterator[SimJudgeServer]:
    with SimJudgeServer(AnswerKey([r.key for r in _runs()]), Settings(accuracy=1.0, max_model_len=N_CTX)) as server:
        yield server


def _pool(url: str, parallel: int = 2) -> ServerPool:
    return open_servers([url], n_ctx=N_CTX, parallel=parallel)  # no local vocabulary: counts go to /tokenize


def _essence(verdict: Any) -> tuple[Any, ...]:
    return (verdict.a, verdict.b, verdict.outcome, verdict.p_a, verdict.p_a_by_order, verdict.tokens,
            verdict.view_sha256, verdict.notes, verdict.common_tokens, verdict.evidence, verdict.manifest)



def test_the_runs_read_to_select_the_pairs_are_the_ones_judged_and_scored(store: Store, sim: SimJudgeServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    judge_batch(Judge(_pool(sim.url)), store, PAIRS)  # every verdict cached
    selection = same_task_pairs(store.runs.iter_runs())
    assert selection.pairs == PAIRS and set(selection.runs) == {run for pair in PAIRS for run in pair}
    reads: list[str] = []
    real_run = store.runs.run
    monkeypatch.setattr(store.runs, "run", lambda run_id: reads.append(run_id) or real_run(run_id))
    verdicts = judge_batch(Judge(_pool(sim.url)), store, selection.pairs, states=selection.runs)
    result = evaluate(store, verdicts, selection.runs)
    assert all(v.cached for v in verdicts) and result["pairs"] == len(PAIRS) and reads == []
    evaluate(store, verdicts)  # without them, each run is read (once)
    assert sorted(reads) == sorted(selection.runs)

# ------------------------------------------------------------------------------------- cached verdicts
def test_a_cached_verdict_is_found_without_rendering_or_counting(store: Store, sim: SimJudgeServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first = judge_batch(Judge(_pool(sim.url)), store, PAIRS)
    assert [v.outcome for v in first] == ["a", "a", "a"] and not any(v.cached for v in first)
    before = dict(sim.requests)
    reads: list[str] = []
    real_text = store.blobs.text
    monkeypatch.setattr(store.blobs, "text", lambda ref: reads.append(ref) or real_text(ref))
    judge = Judge(_pool(sim.url))
    calls: list[int] = []
    again = judge_batch(judge, store, PAIRS, on_call=lambda: calls.append(1))
    assert all(v.cached for v in again) and [_essence(v) for v in again] == [_essence(v) for v in first]
    # Nothing rendered (no body read), nothing counted (not even the framing), no call; progress heard of both
    # orders of every pair.
    assert reads == [] and judge.counter.calls == 0 and len(calls) == 2 * len(PAIRS)
    sent = {path: n - before.get(path, 0) for path, n in sim.requests.items()}
    assert sent["/tokenize"] == 0 and sent["/v1/completions"] == 0
    # The margin is not part of what identifies a verdict: the cached orders are decided again with the new one.
    wide = judge_batch(Judge(_pool(sim.url), margin=0.45), store, PAIRS)
    assert [v.outcome for v in wide] == ["tie"] * 3 and [v.p_a for v in wide] == [v.p_a for v in first]
    assert reads == []


def test_a_batch_whose_verdicts_are_cached_decodes_no_run_once_their_sources_are_kept(
        store: Store, sim: SimJudgeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    first = judge_batch(Judge(_pool(sim.url)), store, PAIRS)  # judged: each run's view source kept as well
    reads: list[str] = []
    real_run = store.runs.run
    monkeypatch.setattr(store.runs, "run", lambda run_id: reads.append(run_id) or real_run(run_id))
    again = judge_batch(Judge(_pool(sim.url)), store, PAIRS)
    assert all(v.cached for v in again) and [_essence(v) for v in again] == [_essence(v) for v in first]
    assert reads == []


def test_a_view_source_is_kept_per_state_and_per_what_the_views_show(store: Store) -> None:
    runs = [run for pair in PAIRS for run in pair]
    folded: list[str] = []

    def state(run_id: str) -> Any:
        folded.append(run_id)
        return store.runs.run(run_id)

    hidden = view_sources(store, runs, state)
    assert hidden == {run: view_source(store.runs.run(run)) for run in runs} and folded == runs
    folded.clear()
    assert view_sources(store, runs, state) == hidden and folded == []  # kept: no run decoded
    # What the views show is part of what is kept: grades shown, every source derived again.
    shown = view_sources(store, runs, state, show_grades=True)
    assert shown == {run: view_source(store.runs.run(run), show_grades=True) for run in runs} and folded == runs
    # A run changed by an event has a new state: its source is derived again (here the same: lifecycle is no
    # part of a view), the others' are not.
    folded.clear()
    store.events.mark(runs[0], "archived")
    assert view_sources(store, runs, state) == hidden and folded == [runs[0]]


def test_a_fact_that_needs_more_than_the_state_is_never_kept(store: Store) -> None:
    run = PAIRS[0][0]
    computed: list[str] = []

    def length(folded: Any) -> tuple[int, bool]:
        computed.append(folded.id)
        return len(folded.branches), False  # as a view missing a body: it depends on more than the state

    facts = RunFacts("branches", length, code="test")
    expected = {run: len(store.runs.run(run).branches)}
    assert facts.of(store, [run], store.runs.run) == facts.of(store, [run], store.runs.run) == expected
    assert computed == [run, run]


def test_every_field_of_a_folded_run_is_either_in_the_view_source_or_named_as_read_by_no_view() -> None:
    from kvjudge.judge.render import NOT_VIEW_FIELDS, VIEW_FIELDS
    from kvjudge.retention.state import Branch, RunState, Transition

    for kind, cls in (("run", RunState), ("branch", Branch), ("step", Transition)):
        declared = {f.name for f in dataclasses.fields(cls)}
        assert declared == set(VIEW_FIELDS[kind]) | set(NOT_VIEW_FIELDS[kind]), kind


def test_what_a_view_derives_from_ignores_names_lifecycle_grades_and_tiering(store: Store) -> None:
    state = store.runs.run(PAIRS[0][0])
    digest = view_source(state)
    renamed = dataclasses.replace(state, id="other", tenant="t2", agent="z", state="archived", grades=(),
                                  tier={"status": "tiered", "target": "s3://cold", "manifest_ref": "m", "lsn": 9},
                                  bodies={ref: dataclasses.replace(loc, status=TIERED, lsn=99)
                                          for ref, loc in state.bodies.items()})
    assert view_source(renamed) == digest
    # Grades count where a view shows them; verifier results likewise.
    assert view_source(state, show_grades=True) != digest
    assert view_source(dataclasses.replace(state, grades=()), show_grades=True) != view_source(state, show_grades=True)
    assert view_source(dataclasses.replace(state, verifier=()), show_verifier=True) != \
        view_source(state, show_verifier=True)


def test_a_reduced_run_is_judged_again_and_a_failure_is_never_cached(store: Store, sim: SimJudgeServer) -> None:
    judge = Judge(_pool(sim.url))
    judge_batch(judge, store, PAIRS[:1])
    a, b = PAIRS[0]
    before = view_source(store.runs.run(b))
    reduce_run(store, b, 400, make_counter("chars"))
    assert view_source(store.runs.run(b)) != before
    requests = sim.requests["/v1/completions"]
    reduced = judge_batch(judge, store, PAIRS[:1])[0]
    assert not reduced.cached and sim.requests["/v1/completions"] == requests + 2
    # A pool whose every server is gone: an error, and nothing of it in either cache.
    dead = Judge(open_servers([sim.url], n_ctx=N_CTX, retry=RetryPolicy(attempts=1)))
    sim.stop()
    keys = _cache_keys(store)
    failed = judge_batch(dead, store, PAIRS[1:2])[0]
    assert failed.outcome == "error" and not failed.cached and _cache_keys(store) == keys


def test_the_baselines_inputs_are_kept_so_scoring_cached_verdicts_decodes_no_run(
        store: Store, sim: SimJudgeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts = judge_batch(Judge(_pool(sim.url)), store, PAIRS)
    fresh = evaluate(store, verdicts, use_cache=False)
    assert evaluate(store, verdicts) == fresh  # computed, and kept
    listed = {row.id: row for row in store.runs.listing()}  # the grades are all the truth needs
    reads: list[str] = []
    real_run = store.runs.run
    monkeypatch.setattr(store.runs, "run", lambda run_id: reads.append(run_id) or real_run(run_id))
    assert evaluate(store, verdicts, listed) == fresh and reads == []


def _cache_keys(store: Store) -> set[str]:
    """The verdict and order cache's keys (not the facts kept of runs: what their views derive from)."""
    with sqlite3.connect(store.path) as db:
        return {key for (key,) in db.execute("SELECT key FROM judgments") if not key.startswith(RUN_FACTS_KEY_PREFIX)}


# ------------------------------------------------------------------------------- views from body counts
@pytest.fixture(scope="module")
def vocab() -> Iterator[LlamaBackend]:
    from kvjudge import models

    backend = LlamaBackend(model_path=models.judge_model_path())  # vocab only: counts and framing
    yield backend
    backend.close()


def test_a_view_is_counted_from_the_counts_ingest_kept_and_packing_stays_token_exact(store: Store,
                                                                                     vocab: LlamaBackend) -> None:
    # What ingest or reduction would have kept: every body counted with the judge model's tokenizer, by ref.
    tokenizer = ModelTokenizer(vocab.model_path)
    assert vocab.counter_name == tokenizer.name
    bodies = {ref: store.blobs.text(ref) for run in store.runs.iter_runs() for ref in run.bodies}
    store.caches.put_counts(tokenizer.name, {ref: tokenizer.count(text or "") for ref, text in bodies.items()})
    counted: list[str] = []
    judge = Judge(vocab, template="raw", use_cache=False)
    judge.counter.count_fn = lambda text: counted.append(text) or vocab.count(text)
    for a, b in PAIRS:
        pair = pair_bases(judge.base(store, a), judge.base(store, b), judge.counter)
        for room in (N_CTX, 900):  # whole, and cut to fit
            view_a, view_b = pack_pair(pair.a, pair.b, judge.counter, room, pair)
            for prompt in judge.order_prompts(view_a, view_b):
                assert len(vocab.prompt_tokens(prompt.segments)) == (
                    judge.framing_tokens + view_a.common_tokens + view_a.tokens.view + view_b.tokens.view)
    # No stored body was tokenized: only markup (headings, markers, references) and the extracts cut to fit.
    stored = set(bodies.values())
    assert counted and not stored.intersection(counted)


def test_a_servers_whole_prompt_count_is_within_the_slack_of_the_sum_of_its_parts(store: Store,
                                                                                 sim: SimJudgeServer) -> None:
    pool = _pool(sim.url)
    judge = Judge(pool, template="raw", use_cache=False)
    client = pool.backends[0].client
    for a, b in PAIRS:
        pair = pair_bases(judge.base(store, a), judge.base(store, b), judge.counter)
        view_a, view_b = pack_pair(pair.a, pair.b, judge.counter, judge.room, pair)
        counted = judge.framing_tokens + view_a.common_tokens + view_a.tokens.view + view_b.tokens.view
        for prompt in judge.order_prompts(view_a, view_b):
            # Tokenized whole, a prompt can only lose tokens where segments meet (at most one each).
            whole = client.count("".join(prompt.segments))
            assert counted - len(prompt.segments) <= whole <= counted + pool.slack_tokens


# ------------------------------------------------------------------------------------------- a busy pool
def test_a_pool_takes_pairs_as_they_are_needed_and_sends_a_pairs_orders_to_one_server(store: Store) -> None:
    key = AnswerKey([r.key for r in _runs()])
    with SimJudgeServer(key, Settings(max_model_len=N_CTX)) as one, \
            SimJudgeServer(key, Settings(max_model_len=N_CTX)) as two:
        pool = open_servers([one.url, two.url], n_ctx=N_CTX, parallel=1)
        judge = Judge(pool, template="raw", use_cache=False)
        prompts = [judge.order_prompts(*judge.pack_pair(store, a, b, N_CTX)) for a, b in PAIRS]
        events: list[tuple[str, int]] = []

        def groups() -> Iterator[list[Prompt]]:
            for number in range(12):
                events.append(("pulled", number))
                yield prompts[number % len(prompts)]

        answered: dict[int, list[str | None]] = {}

        def on_result(group: int, position: int, score: Any, error: Any, server: str | None, _s: float) -> None:
            assert error is None and score is not None
            events.append(("answered", group))
            answered.setdefault(group, []).append(server)
            assert position == len(answered[group]) - 1  # a group's prompts are answered in turn

        pool.score_many(groups(), on_result)
    # Groups are taken as they are needed: never more than the requests in flight and as many again waiting.
    first_answer = events.index(next(e for e in events if e[0] == "answered"))
    assert sum(kind == "pulled" for kind, _ in events[:first_answer]) <= 2 * 2
    assert len(answered) == 12 and all(len(set(servers)) == 1 for servers in answered.values())
    assert {servers[0] for servers in answered.values()} == {one.url, two.url}
