"""Reduction end to end, step by step, plus no-op and counting rules. The steps (each test is named by its step):

1. the transitions stay intact, only reduction events are added; 2. a reduced episode still grades; 3. every
surviving ref re-hashes; 4. the state tables dropped, the log re-folds byte-identical; 5. a reduced original reads
as None and the fold explains it; 6. a crash at every fault point leaves no unexplained body and a rerun converges;
7. the hardware bound caps the configured ceiling, and without a probe figure nothing is reduced; 9. a run still
in grading is refused.

Every fault test kills a real child process (``python -m kvjudge reduce`` with ``KVJUDGE_FAULTS`` set).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import cli_json, comparable_fold, kvjudge, sql, store_from_runs

from kvjudge.cli import main
from kvjudge.errors import RunStateError
from kvjudge.retention import Store
from kvjudge.retention.events import REDUCTION_KINDS, Reduced
from kvjudge.retention.faults import REDUCTION_POINTS
from kvjudge.retention.reduce import plan_reduction, resolve, view_refs
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.stored_tokens import run_tokens
from kvjudge.retention.state import LOCAL, RunState
from kvjudge.retention.verify import verify
from kvjudge.testing.filler import filler
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import CharsPerToken, ModelTokenizer

CHARS = CharsPerToken(4)


class CountingCounter:
    """A chars/4 counter that records how many texts it was asked to count."""

    name = "chars/4"

    def __init__(self) -> None:
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return CHARS.count(text)


def big_run(run_id: str = "r1", *, lifecycle=("running", "grading", "graded"), passed: bool = True,
            scale: int = 1) -> dict:
    final = "12 passed in 0.31s" if passed else "3 failed, 9 passed in 0.40s"
    return make_run(run_id, [filler(i + 10 * scale, 900 * scale) for i in range(4)], lifecycle=list(lifecycle),
                    dead=[[filler(100 + i, 700 * scale) for i in range(2)], [filler(200, 300 * scale)]],
                    passed=passed, final=final)


def grade(state: RunState, text_of) -> float:
    """A deterministic stand-in for the judge: verifier pass rate × whether the last live tool output,
    read through whatever the log says stands in for it, ends in a clean pytest summary."""
    live = next(branch for branch in state.branches if branch.status == "live")
    last = [t for t in live.transitions if t.tool_output][-1]
    seen = resolve(state, last.tool_output["output_ref"])
    assert seen is not None, "the live branch's last output must stay readable"
    text = text_of(seen)
    assert text is not None
    clean = re.fullmatch(r"\d+ passed in [\d.]+s", text.strip().splitlines()[-1]) is not None
    verifier = sum(1.0 for v in state.verifier if v["passed"]) / len(state.verifier)
    return verifier * (1.0 if clean else 0.0)


def assert_every_missing_body_explained(store: Store) -> None:
    """No record points at a deleted body without an explaining event."""
    for state in store.runs.iter_runs():
        for ref, location in state.bodies.items():
            if store.blobs.get(ref) is None:
                assert location.status != LOCAL, f"{ref} is missing and the log says it is local"
                assert store.runs.explain(ref).explained


# ------------------------------------------------------------ steps 1–5
def test_step1_transitions_intact_only_reduction_events_added(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        before_events = [(lsn, e.kind, e.to_json()) for lsn, e in store.events.iter_events("r1")]
        before = store.runs.run("r1")
        assert run_tokens(store, before, CHARS) > 2000
        result = reduce_run(store, "r1", 2000, CHARS)
        assert result.plan.fits and result.plan.tokens_after <= 2000 and result.appended > 0
        after_events = [(lsn, e.kind, e.to_json()) for lsn, e in store.events.iter_events("r1")]
        assert after_events[:len(before_events)] == before_events  # none removed or altered
        added = after_events[len(before_events):]
        assert added and {kind for _, kind, _ in added} <= REDUCTION_KINDS
        assert "Reduced" in {kind for _, kind, _ in added}
        after = store.runs.run("r1")
        # The transition records themselves (refs included) are untouched: nothing was repointed.
        assert [b.transitions for b in after.branches] == [b.transitions for b in before.branches]
        assert after.verifier == before.verifier and after.grades == before.grades
        assert run_tokens(store, after, CHARS) <= 2000


def test_step2_reduced_episode_still_grades(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run("good"), big_run("bad", passed=False)]) as store:
        full = {r: grade(store.runs.run(r), store.blobs.text) for r in ("good", "bad")}
        assert full == {"good": 1.0, "bad": 0.0}
        for run_id in ("good", "bad"):
            reduce_run(store, run_id, 1500, CHARS)
            reduced = store.runs.run(run_id)
            assert reduced.reduced
            score = grade(reduced, store.blobs.text)
            assert isinstance(score, float) and score == full[run_id]


def test_step3_every_surviving_ref_rehashes(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        reduce_run(store, "r1", 1500, CHARS)
        state = store.runs.run("r1")
        surviving = 0
        for ref in state.refs():
            body = store.blobs.get(ref)
            if body is not None:
                surviving += 1
                assert "sha256:" + hashlib.sha256(body).hexdigest() == ref
        assert surviving > 0
        assert verify(store).ok
        # A body rewritten under its ref still *resolves*; only re-hashing sees it.
        victim = next(ref for ref in state.refs() if store.blobs.get(ref) is not None)
        sql(store).execute("UPDATE blobs SET body = ? WHERE ref = ?", (b"rewritten", victim))
        assert store.blobs.text(victim) == "rewritten"
        report = verify(store)
        assert not report.ok and [(v.check, v.ref) for v in report.violations] == [("rehash", victim)]


def test_step4_drop_state_tables_and_refold_byte_identical(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        reduce_run(store, "r1", 800, CHARS)
        reduced = store.runs.run("r1")
        assert reduced.reduced and any(loc.status == "reduced" for loc in reduced.bodies.values())
        path = store.path
        sql(store).execute("DROP TABLE runs")
        sql(store).execute("DROP TABLE run_bodies")
    with Store.open(path) as store:
        assert store.runs.run("r1").canonical_bytes() == reduced.canonical_bytes()
        assert store.runs.refold("r1").canonical_bytes() == reduced.canonical_bytes()
        # The original → summary mapping survives because it lives in the log, not in a projection.
        original = next(ref for ref, loc in reduced.bodies.items() if loc.status == "reduced")
        assert store.runs.explain(original).summary_ref == reduced.bodies[original].summary_ref


def test_step5_get_original_is_none_and_the_fold_explains_it(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        reduce_run(store, "r1", 1500, CHARS)
        state = store.runs.run("r1")
        reduced = [(ref, loc) for ref, loc in state.bodies.items() if loc.status == "reduced"]
        assert reduced
        for original, location in reduced:
            assert store.blobs.get(original) is None
            explanation = store.runs.explain(original)
            assert explanation.status == "reduced" and explanation.event == "Reduced"
            assert explanation.summary_ref == location.summary_ref and not explanation.body_present
            summary = store.blobs.text(location.summary_ref)
            # The marker says what was cut in a few tokens; the Reduced event names the original in full.
            marker = re.search(r"\[(\d+) (lines|characters) cut\]", summary)
            assert marker and int(marker.group(1)) > 0
            (event,) = [e for _, e in store.events.iter_events("r1") if e.kind == "Reduced" and e.original == original]
            assert event.summary == location.summary_ref and event.tokens_after < event.tokens_before


# ------------------------------------------------------------ step 6: crashes in a killed child
def write_config(directory: Path, text: str = "") -> Path:
    path = directory / "kvjudge.toml"
    path.write_text('[retention]\ncounter = "chars"\n' + text)
    return path


@pytest.mark.parametrize("point", REDUCTION_POINTS)
def test_step6_crash_at_every_point_leaves_no_unexplained_body_and_rerun_converges(
        tmp_path: Path, capabilities: dict[int, Path], point: str, store_at: Callable[[str], str]) -> None:
    config = write_config(tmp_path)
    runs = [big_run("r1")]
    args = ["reduce", "r1", "--ceiling", "1200", "--capabilities", str(capabilities[160_000]),
            "--config", str(config), "--json"]
    control_at, crash_at = store_at("control"), store_at("crash")  # a SQLite file, or a PostgreSQL database, each
    with store_from_runs(control_at, runs) as control:
        pass
    ok = kvjudge(*args, "--store", control_at, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    with Store.open(control_at) as control:
        converged = comparable_fold(control, "r1")
        assert control.runs.run("r1").reduced
        summaries_made = ok_summaries(control)

    with store_from_runs(crash_at, runs) as store:
        before_events = list(store.events.iter_events("r1"))
    crashed = kvjudge(*args, "--store", crash_at, cwd=tmp_path, faults=point)
    assert crashed.returncode == -9, f"{point}: child was not killed ({crashed.returncode}): {crashed.stderr}"

    with Store.open(crash_at) as store:
        assert_every_missing_body_explained(store)
        report = verify(store)
        assert report.ok, report.to_dict()
        events = list(store.events.iter_events("r1"))
        reduction_events = [e for _, e in events[len(before_events):]]
        state = store.runs.run("r1")
        summaries = [loc.summary_ref for loc in state.bodies.values() if loc.summary_ref]
        if point in ("put_summary.txn", "after_put_summary", "commit_reduction.txn"):
            assert reduction_events == []  # nothing committed yet: no ref lost its body
            assert all(store.blobs.get(ref) is not None for ref in state.refs())
            orphans = store.runs.unnamed_bodies()
            assert orphans == (0 if point == "put_summary.txn" else len(summaries_made))
        else:
            assert reduction_events and all(store.blobs.get(ref) is not None for ref in summaries)
            gone = [ref for ref, loc in state.bodies.items() if loc.status != LOCAL]
            bodies_left = [ref for ref in gone if store.blobs.get(ref) is not None]
            if point in ("after_commit_reduction", "delete_body.txn"):
                assert bodies_left == gone  # explained by the log, deletion pending
                assert any("still stored" in note for note in report.notes)
            else:
                assert bodies_left == []

    rerun = kvjudge(*args, "--store", crash_at, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    with Store.open(crash_at) as store:
        assert comparable_fold(store, "r1") == converged
        assert store.runs.run("r1").canonical_bytes() == store.runs.refold("r1").canonical_bytes()
        report = verify(store)
        assert report.ok and not any("still stored" in n for n in report.notes)
        assert all(store.blobs.get(ref) is None for ref, loc in store.runs.run("r1").bodies.items() if loc.status != LOCAL)
    again = kvjudge(*args, "--store", crash_at, cwd=tmp_path)
    assert json.loads(again.stdout)["runs"][0]["events"] == 0  # converged: a further run is a no-op


def ok_summaries(control: Store) -> list[str]:
    state = control.runs.run("r1")
    return sorted({loc.summary_ref for loc in state.bodies.values() if loc.summary_ref}
                  | {b.summary_ref for b in state.branches if b.summary_ref})


def test_the_invariant_check_fails_on_a_body_deleted_before_its_event(tmp_path: Path) -> None:
    """The trap: deleting the original before Reduced commits. The checks above would see it."""
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        ref = store.runs.run("r1").branches[0].transitions[2].tool_output["output_ref"]
        store._conn.execute("UPDATE blobs SET body = NULL WHERE ref = ?", (ref,))  # behind the store's back
        with pytest.raises(AssertionError, match="log says it is local"):
            assert_every_missing_body_explained(store)
        report = verify(store)
        assert [(v.check, v.ref) for v in report.violations] == [("explained", ref)]


# ------------------------------------------------------------ step 7: the ceiling bound
def test_step7_hardware_bound_wins_over_a_200k_ceiling(tmp_path: Path, capabilities: dict[int, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "ceiling = 200000\n")
    run = make_run("huge", [filler(i, 12_000) for i in range(8)])  # ~8 × 21k chars/4 tokens
    with store_from_runs(tmp_path / "store.sqlite", [run]) as store:
        before = run_tokens(store, store.runs.run("huge"), CHARS)
    assert before > 120_000
    code = main(["reduce", "huge", "--store", str(tmp_path / "store.sqlite"), "--config", str(config),
                 "--capabilities", str(capabilities[160_000]), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    bound = payload["ceilings"]["default"]
    assert bound == {"configured": 200_000, "max_context_tokens": 160_000, "hardware_bound": 80_000,
                     "effective": 80_000, "winner": "hardware"}
    result = payload["runs"][0]
    assert result["target_tokens"] == 80_000 and result["tokens_before"] == before
    assert 70_000 < result["tokens_after"] <= 80_000  # reduced to the bound, not below it for no reason
    with Store.open(tmp_path / "store.sqlite") as store:
        assert run_tokens(store, store.runs.run("huge"), CHARS) == result["tokens_after"]


def test_step7_ceiling_flag_lowers_but_the_bound_still_applies(tmp_path: Path, capabilities: dict[int, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]):
        pass
    base = ["reduce", "r1", "--store", str(tmp_path / "store.sqlite"), "--config", str(config), "--dry-run", "--json"]
    assert main([*base, "--capabilities", str(capabilities[4_000]), "--ceiling", "100000"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["target_tokens"] == 2_000  # 4000 // 2 wins
    assert main([*base, "--capabilities", str(capabilities[160_000]), "--ceiling", "1500"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["target_tokens"] == 1_500


def test_step7_no_probe_figure_means_no_reduction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Never the configured ceiling alone: without max_context_tokens the command refuses."""
    config = write_config(tmp_path)
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        before = len(list(store.events.iter_events()))
    code = main(["reduce", "r1", "--store", str(tmp_path / "store.sqlite"), "--config", str(config),
                 "--capabilities", str(tmp_path / "empty-cache.json")])
    assert code != 0
    assert "max_context_tokens" in capsys.readouterr().err
    with Store.open(tmp_path / "store.sqlite") as store:
        assert len(list(store.events.iter_events())) == before and not store.runs.run("r1").reduced


# ------------------------------------------------------------ step 9: grading is refused
def test_step9_a_run_in_grading_is_refused(tmp_path: Path, capabilities: dict[int, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    runs = [big_run("g", lifecycle=["running", "grading"]), big_run("done")]
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        events_before = len(list(store.events.iter_events("g")))
        with pytest.raises(RunStateError, match="run g is grading"):
            plan_reduction(store.runs.run("g"), store.blobs.text, CHARS, 100)
        with pytest.raises(RunStateError):
            reduce_run(store, "g", 100, CHARS)
    common = ["--store", str(tmp_path / "store.sqlite"), "--config", str(config),
              "--capabilities", str(capabilities[160_000]), "--ceiling", "1000"]
    assert main(["reduce", "g", *common]) == 1
    assert "run g is grading" in capsys.readouterr().err
    # --all reduces what may be reduced and names what it refused (never a silent skip).
    assert main(["reduce", "--all", *common, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in payload["runs"]] == ["done"]
    assert payload["refused"] == [{"run": "g", "state": "grading",
                                   "reason": "grading has not terminated (only graded, ungraded, archived reduce)"}]
    with Store.open(tmp_path / "store.sqlite") as store:
        assert len(list(store.events.iter_events("g"))) == events_before and not store.runs.run("g").reduced


# ------------------------------------------------------------ loss order, idempotence, counting
def test_loss_order_bodies_then_dead_branches_then_dropped(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        state = store.runs.run("r1")
        total = run_tokens(store, state, CHARS)
        mild = plan_reduction(state, store.blobs.text, CHARS, total - 500, counts={})
        assert mild.steps == {"bodies_reduced": mild.steps["bodies_reduced"], "branches_reduced": 0, "dropped": 0}
        assert mild.steps["bodies_reduced"] >= 1 and mild.fits
        harsh = plan_reduction(state, store.blobs.text, CHARS, 60)
        kinds = [event.kind for event in harsh.events]
        # Fixed order: every Reduced before any BranchReduced, every BranchReduced before any Dropped.
        assert kinds == sorted(kinds, key=["Reduced", "BranchReduced", "Dropped"].index)
        assert {"Reduced", "BranchReduced", "Dropped"} <= set(kinds)
        dead_refs = {ref for b in state.branches if b.status == "dead" for ref in b.refs()}
        live_refs = {ref for b in state.branches if b.status == "live" for ref in b.refs()}
        dropped = {event.original for event in harsh.events if event.kind == "Dropped"}
        assert dropped and not (dropped & live_refs)  # only text on dead branches is ever dropped
        assert dead_refs & dropped
        # planning is pure: nothing was written
        assert store.runs.run("r1") == state and not state.reduced


def test_planning_is_pure_and_gives_a_view(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        lsns = sql(store).execute("SELECT MAX(lsn) FROM events").fetchone()[0]
        blobs = sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0]
        plan = plan_reduction(store.runs.run("r1"), store.blobs.text, CHARS, 900)
        again = plan_reduction(store.runs.run("r1"), store.blobs.text, CHARS, 900)
        assert plan.events == again.events and dict(plan.blobs) == dict(again.blobs)  # deterministic
        assert sql(store).execute("SELECT MAX(lsn) FROM events").fetchone()[0] == lsns
        assert sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == blobs
        view = plan.state_after
        text = [plan.text_of(ref, store.blobs.text) for ref in view_refs(view)]
        assert all(t is not None for t in text)
        assert sum(CHARS.count(t) for t in text) == plan.tokens_after <= 900


def test_second_reduction_is_a_no_op_without_recounting(tmp_path: Path) -> None:
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        counter = CountingCounter()
        first = reduce_run(store, "r1", 1500, counter)
        assert first.appended > 0 and counter.calls > 0
        counter.calls = 0
        second = reduce_run(store, "r1", 1500, counter)
        assert second.appended == 0 and second.plan.noop and second.bodies_deleted == 0
        assert counter.calls == 0  # every count came from blob_tokens
        assert run_tokens(store, store.runs.run("r1"), counter) == first.plan.tokens_after and counter.calls == 0


def test_an_extract_two_dead_branches_share_is_dropped_in_the_same_reduction(tmp_path: Path) -> None:
    # Found by the state machine: a body of one dead branch is cut to an extract whose text equals the other dead
    # branch's summary (the same ref). Each branch kept it while the other still showed it, so it was dropped
    # only by the next reduction to the same target — a second reduction that was not a no-op.
    dead = [[filler(150, 2)], [filler(160, 1), filler(161, 26)]]
    run = make_run("r1", [filler(100, 1)], dead=dead, lifecycle=["running", "grading", "graded"])
    with store_from_runs(tmp_path / "store.sqlite", [run]) as store:
        first = reduce_run(store, "r1", 20, CHARS)
        shared = {e.summary for e in first.plan.events if type(e).__name__ == "Reduced"} & \
            {e.summary for e in first.plan.events if type(e).__name__ == "BranchReduced"}
        assert shared, "the case needs an extract equal to a branch summary"
        assert first.plan.steps["dropped"] > 0
        second = reduce_run(store, "r1", 20, CHARS)
        assert second.appended == 0 and second.plan.tokens_before == first.plan.tokens_after
        assert all(store.runs.run("r1").bodies[ref].status == "dropped" for ref in shared)


def test_a_body_shared_with_another_run_is_kept_for_it(tmp_path: Path) -> None:
    shared = filler(7, 3000)
    a = make_run("a", [shared, filler(8, 3000)])
    b = make_run("b", [shared, "tail"], lifecycle=["running"])
    with store_from_runs(tmp_path / "store.sqlite", [a, b]) as store:
        ref = store.runs.run("b").branches[0].transitions[2].tool_output["output_ref"]
        reduce_run(store, "a", 300, CHARS)
        assert store.runs.run("a").bodies[ref].status == "reduced"
        assert store.blobs.text(ref) is not None  # b still reads it
        assert verify(store).ok


def sharing_runs() -> list[dict]:
    """Three graded runs that all hold one large body (a system prompt, say), each with a body of its own."""
    shared = filler(7, 3000)
    return [make_run(run_id, [shared, filler(20 + index, 600)]) for index, run_id in enumerate(("a", "b", "c"))]


def shared_ref(store: Store) -> str:
    return store.runs.run("a").branches[0].transitions[2].tool_output["output_ref"]


def test_a_shared_body_is_kept_until_the_last_run_reading_it_is_reduced(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from kvjudge.commands.show import render_run

    with store_from_runs(tmp_path / "store.sqlite", sharing_runs()) as store:
        ref = shared_ref(store)
        assert all(ref in store.runs.run(run_id).bodies for run_id in ("a", "b", "c"))
        for step, run_id in enumerate(("a", "b", "c"), start=1):
            reduce_run(store, run_id, 400, CHARS)
            assert store.runs.run(run_id).bodies[ref].status == "reduced"
            readers = [r for r in ("a", "b", "c") if store.runs.run(r).bodies[ref].status == LOCAL]
            assert readers == ["a", "b", "c"][step:]
            # Stored while any run reads it, deleted by the reduction of the last one: never a later `reduce a`.
            assert (store.blobs.get(ref) is not None) == bool(readers)
            report = verify(store)
            assert report.ok and report.notes == [], report.to_dict()
            assert report.shared_bodies == (1 if readers else 0)
            if step == 1:
                # `show a` reads a's summary, never the original a's log says was reduced (b and c still hold it).
                read: list[str] = []
                real_get = store.blobs.get
                monkeypatch.setattr(store.blobs, "get", lambda r: read.append(r) or real_get(r))
                rendered = render_run(store.blobs, store.runs.run("a"))
                monkeypatch.undo()
                entry = rendered["branches"][0]["transitions"][2]["tool_output"]["output"]
                summary = store.runs.run("a").bodies[ref].summary_ref
                assert entry["summary_ref"] == summary and entry["text"] == store.blobs.text(summary)
                assert summary in read and ref not in read
        projected = {run_id: store.runs.run(run_id).canonical_bytes() for run_id in ("a", "b", "c")}
        store.rebuild_projection()
        assert {run_id: store.runs.run(run_id).canonical_bytes() for run_id in ("a", "b", "c")} == projected
        assert all(store.runs.refold(r).canonical_bytes() == projected[r] for r in projected)
    code, payload = cli_json(capsys, "verify", "--store", str(tmp_path / "store.sqlite"))
    assert code == 0 and payload["ok"] and payload["notes"] == [] and payload["shared_bodies"] == 0


def test_an_interrupted_reduction_gets_the_note_and_the_named_command_removes_it(
        tmp_path: Path, capabilities: dict[int, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    with store_from_runs(tmp_path / "store.sqlite", sharing_runs()) as store:
        ref = shared_ref(store)
        for run_id in ("a", "b"):
            reduce_run(store, run_id, 400, CHARS)
    common = ("--store", str(tmp_path / "store.sqlite"), "--config", str(config))
    reduce_args = ("--ceiling", "400", "--capabilities", str(capabilities[160_000]), *common)
    killed = kvjudge("reduce", "c", *reduce_args, cwd=tmp_path, faults="after_commit_reduction")
    assert killed.returncode == -9, killed.stderr
    with Store.open(tmp_path / "store.sqlite") as store:
        assert store.runs.run("c").bodies[ref].status == "reduced" and store.blobs.get(ref) is not None
    code, payload = cli_json(capsys, "verify", *common)
    assert code == 0 and payload["ok"] and payload["shared_bodies"] == 0
    (note,) = payload["notes"]  # once, for the run whose reduction stopped
    assert note.startswith("run c: ") and "a reduction stopped before deleting them" in note
    fix = re.search(r"run `kvjudge (reduce c)` to finish", note)
    assert fix, note
    done = kvjudge(*fix.group(1).split(), *reduce_args, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"][0]["bodies_deleted"] >= 1
    code, payload = cli_json(capsys, "verify", *common)
    assert code == 0 and payload["ok"] and payload["notes"] == []
    with Store.open(tmp_path / "store.sqlite") as store:
        assert store.blobs.get(ref) is None and store.runs.explain(ref).explained


@pytest.mark.model
def test_reduction_with_the_model_tokenizer(tmp_path: Path, default_model: Path) -> None:
    counter = ModelTokenizer(default_model)
    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        before = run_tokens(store, store.runs.run("r1"), counter)
        result = reduce_run(store, "r1", 1000, counter)
        state = store.runs.run("r1")
        assert before > 1000 and result.plan.fits and result.plan.counter == counter.name
        # Recount what a reader sees with the model's own tokenizer, from the bodies themselves.
        seen = sum(counter.count(store.blobs.text(ref)) for ref in view_refs(state))
        assert seen == result.plan.tokens_after <= 1000
        stored = store.caches.cached_counts(state.refs(), counter.name)
        assert all(stored[ref] == counter.count(store.blobs.text(ref)) for ref in set(view_refs(state)))


class PlainCounter:
    """The same tokenizer without its token ends: every extract is tokenized whole."""

    def __init__(self, inner: ModelTokenizer) -> None:
        self.inner = inner
        self.name = inner.name

    def count(self, text: str) -> int:
        return self.inner.count(text)


@pytest.mark.model
@pytest.mark.parametrize("which", ["default_model", "judge_model"])
def test_extracts_counted_from_their_originals_token_ends_plan_the_same_reduction(
        tmp_path: Path, which: str, request: pytest.FixtureRequest) -> None:
    """A local tokenizer counts each extract from where its original's tokens end (only the lines around the
    marker are tokenized): the plan is the one made by tokenizing every extract whole, count for count."""
    counted: list[str] = []

    class RecordingTokenizer(ModelTokenizer):
        def count(self, text: str) -> int:
            counted.append(text)
            return super().count(text)

    counter = RecordingTokenizer(request.getfixturevalue(which))
    with store_from_runs(tmp_path / "store.sqlite", [big_run(scale=3)]) as store:
        state = store.runs.run("r1")
        spliced = plan_reduction(state, store.blobs.text, counter, 2000)
        asked, counted[:] = list(counted), []
        whole = plan_reduction(state, store.blobs.text, PlainCounter(counter), 2000)
    assert spliced.steps["bodies_reduced"] > 0 and spliced.fits
    # Step 1's extracts that keep text beside their marker.
    kept = [spliced.blobs[event.summary] for event in spliced.events
            if isinstance(event, Reduced) and "\n" in spliced.blobs[event.summary]]
    assert kept and not set(kept) & set(asked)  # none of them was tokenized whole
    assert set(kept) <= set(counted)  # (as they are without token ends)
    assert spliced.events == whole.events and dict(spliced.blobs) == dict(whole.blobs)
    assert dict(spliced.new_counts) == dict(whole.new_counts)
    assert all(spliced.new_counts[ref] == counter.count(text) for ref, text in spliced.blobs.items())


def test_only_the_reduction_events_wait_for_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of the three steps only the commit of the events is synced at its COMMIT: the summaries before it are
    synced with it (the log is written in order), and a deletion lost at a power cut leaves a body the log
    explains. The store is back to syncing every commit afterwards."""
    from kvjudge.retention.store import database

    with store_from_runs(tmp_path / "store.sqlite", [big_run()]) as store:
        synced: dict[str, int] = {}
        real = database.fault_point

        def before_commit(name: str) -> None:
            synced[name] = store._conn.execute("PRAGMA synchronous").fetchone()[0]
            real(name)

        monkeypatch.setattr(database, "fault_point", before_commit)
        reduce_run(store, "r1", 1000, CHARS)
        assert synced == {"put_summary.txn": 1, "commit_reduction.txn": 2, "delete_body.txn": 1}  # NORMAL, FULL
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
