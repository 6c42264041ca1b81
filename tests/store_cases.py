"""Reusable test cases, one per protocol of kvjudge/retention/store/interfaces.py, as eventsourcing tests its
recorders: a subclass names the implementation (its ``parts`` fixture opens one at a path and yields the store
object whose attributes are the parts; ``reopen`` opens another at the same location), and every case runs against
it. ``tests/test_store_interfaces.py`` runs them against the SQLite and the PostgreSQL implementations."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvjudge.errors import IntegrityError, RunStateError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.store import BlobStore, EventRecorder, Judgments, RunQueries, TokenCounts


def started(run_id: str, tenant: str = "t", task: str | None = "task-1") -> list[ev.Event]:
    """The events of a small run: started, one live branch, a user message naming ``ref``-less text."""
    return [ev.RunStarted(run=run_id, tenant=tenant, task_id=task, task_prompt_ref=None, agent="agent-a"),
            ev.BranchOpened(run=run_id, branch="main", status="live", parent=None, fork_at=None)]


def said(run_id: str, seq: int, ref: str) -> ev.TransitionRecorded:
    return ev.TransitionRecorded(run=run_id, branch="main", seq=seq, role="user", text_ref=ref, tool_call=None,
                                 tool_output=None, usage=None, context=None)


class StoreCases:
    """What every implementation shares: a fresh store per test, through the ``parts`` fixture."""

    @pytest.fixture
    def parts(self, tmp_path: Path) -> Iterator[Any]:
        raise NotImplementedError("a subclass opens its implementation at tmp_path")

    @pytest.fixture
    def reopen(self) -> Any:
        raise NotImplementedError("a subclass reopens its implementation at a location")


class EventRecorderCases(StoreCases):
    def test_append_returns_increasing_lsns_and_select_reads_them_back(self, parts: Any) -> None:
        events: EventRecorder = parts.events
        lsns = events.append_many("r1", started("r1"))
        more = events.append_many("r2", started("r2"))
        last = events.append("r1", ev.StateChanged(run="r1", state="grading"))
        assert lsns[0] < lsns[1] < more[0] < more[1] < last
        assert [lsn for lsn, _ in events.iter_events("r1")] == [*lsns, last]
        assert [e.kind for _, e in events.iter_events("r1")] == ["RunStarted", "BranchOpened", "StateChanged"]
        assert [lsn for lsn, _ in events.iter_events("r1", kind="StateChanged")] == [last]
        assert [e.run for _, e in events.iter_events()] == ["r1"] * 3 + ["r2"] * 2  # grouped by run
        assert events.logged_runs() == ["r1", "r2"]
        assert events.event_range("r1") == (lsns[0], last) and events.event_kind(last) == "StateChanged"
        assert events.event_kind(last + 100) is None

    def test_a_follower_reads_on_after_the_last_lsn_it_saw(self, parts: Any) -> None:
        events: EventRecorder = parts.events
        first = events.append_many("r1", started("r1"))
        with pytest.raises(RuntimeError), parts.transaction("abandoned"):  # may leave a gap in the LSNs
            events.append_many("r2", started("r2"))
            raise RuntimeError("roll back")
        last = events.append("r1", ev.StateChanged(run="r1", state="grading"))
        seen = events.events_after(0)
        assert [(lsn, run) for lsn, run, _ in seen] == [(first[0], "r1"), (first[1], "r1"), (last, "r1")]
        assert [lsn for lsn, _, _ in events.events_after(first[-1])] == [last]
        assert [lsn for lsn, _, _ in events.events_after(first[0], limit=1)] == [first[1]]
        assert events.events_after(last) == []

    def test_an_event_the_state_refuses_appends_nothing(self, parts: Any) -> None:
        events: EventRecorder = parts.events
        with pytest.raises(StoreError, match="no run 'ghost'"):
            events.append("ghost", ev.StateChanged(run="ghost", state="grading"))
        events.append_many("r1", started("r1"))
        before = list(events.iter_events("r1"))
        with pytest.raises(StoreError, match="already exists"):  # the batch is one: the good first event stays out
            events.append_many("r1", [ev.StateChanged(run="r1", state="grading"), *started("r1")[:1]])
        with pytest.raises(RunStateError):
            events.mark("r1", "archived")  # running cannot become archived
        assert list(events.iter_events("r1")) == before
        with pytest.raises(UsageError, match="event for run .r2. appended to run .r1."):
            events.append("r1", ev.StateChanged(run="r2", state="grading"))

    def test_an_event_naming_a_summary_needs_its_body_first(self, parts: Any) -> None:
        events: EventRecorder = parts.events
        body = parts.blobs.put(b"original text")
        events.append_many("r1", [*started("r1"), said("r1", 0, body)])
        summary = ref_of(b"an extract")
        reduced = ev.Reduced(run="r1", original=body, summary=summary, counter="c", tokens_before=3, tokens_after=1)
        with pytest.raises(IntegrityError, match="put it first"):
            events.append("r1", reduced)
        parts.blobs.put(b"an extract")
        assert events.append("r1", reduced) > 0

    def test_the_log_is_guarded_and_a_reopened_store_reads_the_same(self, parts: Any, reopen: Any) -> None:
        parts.events.append_many("r1", started("r1"))
        assert parts.events.missing_log_triggers() == []
        location = parts.location
        before = list(parts.events.iter_events())
        parts.close()
        with reopen(location) as again:
            assert list(again.events.iter_events()) == before


class BlobStoreCases(StoreCases):
    def test_put_is_content_addressed_and_idempotent(self, parts: Any) -> None:
        blobs: BlobStore = parts.blobs
        ref = blobs.put(b"hello")
        assert ref == ref_of(b"hello") and blobs.put(b"hello") == ref
        assert blobs.get(ref) == b"hello" and blobs.text(ref) == "hello" and blobs.has_body(ref)
        assert blobs.stat(ref) == (5, True) and blobs.known(ref)
        absent = ref_of(b"never stored")
        assert blobs.get(absent) is None and blobs.stat(absent) is None and not blobs.known(absent)
        with pytest.raises(IntegrityError, match="does not hash to"):
            blobs.put(b"other bytes", expected_ref=ref)

    def test_put_hashed_counts_only_new_bytes_and_bodies_stream_in_ref_order(self, parts: Any) -> None:
        blobs: BlobStore = parts.blobs
        items = [(ref_of(body), body) for body in (b"a" * 10, b"b" * 20)]
        assert blobs.put_hashed(items) == 30
        assert blobs.put_hashed(items + [(ref_of(b"c"), b"c")]) == 1
        assert list(blobs.iter_bodies()) == sorted([*items, (ref_of(b"c"), b"c")])

    def test_release_keeps_what_a_run_still_reads_and_keeps_the_row(self, parts: Any) -> None:
        blobs: BlobStore = parts.blobs
        read, spare = blobs.put(b"read by r1"), blobs.put(b"named by nobody")
        parts.events.append_many("r1", [*started("r1"), said("r1", 0, read)])
        assert blobs.release([read, spare, spare]) == [spare]
        assert blobs.has_body(read) and not blobs.has_body(spare)
        assert blobs.stat(spare) == (len(b"named by nobody"), False) and blobs.get(spare) is None
        assert blobs.put(b"named by nobody") == spare and blobs.has_body(spare)  # the same bytes come back

    def test_a_body_not_here_is_read_through_the_fallback(self, parts: Any) -> None:
        blobs: BlobStore = parts.blobs
        elsewhere = {ref_of(b"cold text"): b"cold text"}
        assert blobs.text(ref_of(b"cold text")) is None
        blobs.fallback = elsewhere.get
        assert blobs.text(ref_of(b"cold text")) == "cold text" and blobs.get(ref_of(b"cold text")) is None


class RunQueriesCases(StoreCases):
    def test_a_run_reads_as_its_events_fold_and_refolds_the_same(self, parts: Any) -> None:
        runs: RunQueries = parts.runs
        ref = parts.blobs.put(b"do the task")
        parts.events.append_many("r1", [*started("r1"), said("r1", 0, ref)])
        parts.events.append_many("r2", started("r2", tenant="u", task="task-2"))
        state = runs.run("r1")
        assert state.tenant == "t" and state.task_id == "task-1" and ref in state.bodies
        assert runs.refold("r1").canonical_bytes() == state.canonical_bytes() == runs.projected_bytes("r1")
        assert runs.has_run("r1") and not runs.has_run("ghost") and runs.projected_bytes("ghost") is None
        with pytest.raises(StoreError, match="no run 'ghost'"):
            runs.run("ghost")
        assert runs.run_ids() == ["r1", "r2"] and runs.run_ids("u") == ["r2"] and runs.run_ids(task="task-1") == ["r1"]
        assert runs.run_ids(agent="nobody") == [] and runs.run_ids("\udcff") == []  # a name no run can have
        assert [s.id for s in runs.iter_runs(state="running")] == ["r1", "r2"]

    def test_a_listing_and_digests_change_with_the_log(self, parts: Any) -> None:
        runs: RunQueries = parts.runs
        parts.events.append_many("r1", started("r1"))
        [listed] = runs.listing()
        assert (listed.id, listed.tenant, listed.agent, listed.state, listed.branches) == ("r1", "t", "agent-a",
                                                                                            "running", 1)
        before = runs.state_digests(["r1", "ghost"])
        assert list(before) == ["r1"]
        parts.events.mark("r1", "grading")
        assert runs.listing()[0].state == "grading" and runs.state_digests(["r1"]) != before

    def test_explain_names_the_event_that_took_a_body_away(self, parts: Any) -> None:
        runs: RunQueries = parts.runs
        ref = parts.blobs.put(b"tool output")
        parts.events.append_many("r1", [*started("r1"), said("r1", 0, ref)])
        assert runs.explain(ref).status == "local" and runs.read_locally(ref)
        lsn = parts.events.append("r1", ev.Dropped(run="r1", original=ref))
        assert not runs.read_locally(ref) and runs.unnamed_bodies() == 0
        parts.blobs.release([ref])
        explained = runs.explain(ref)
        assert (explained.status, explained.event, explained.lsn, explained.explained) == ("dropped", "Dropped", lsn,
                                                                                           True)
        assert runs.explain(ref_of(b"unknown")).status == "unknown"
        parts.blobs.put(b"put before a crash")
        assert runs.unnamed_bodies() == 1

    def test_tier_queries_follow_the_log(self, parts: Any) -> None:
        runs: RunQueries = parts.runs
        ref = parts.blobs.put(b"x" * 100)
        parts.events.append_many("r1", [*started("r1"), said("r1", 0, ref)])
        assert runs.local_body_bytes("r1") == 100 and runs.run_ids_with_tier_status("started") == []
        manifest = parts.blobs.put(b"manifest")
        parts.events.append("r1", ev.TierStarted(run="r1", target="file:///cold", manifest_ref=manifest))
        assert runs.run_ids_with_tier_status("started") == ["r1"]
        parts.events.append("r1", ev.Tiered(run="r1", target="file:///cold", manifest_ref=manifest, refs=[ref]))
        assert runs.tiered_bodies_here("r1") == [ref] and runs.runs_with_tiered_bodies_here() == ["r1"]
        assert runs.local_body_bytes("r1") == 0
        parts.blobs.release([ref], scrub=False)
        assert runs.tiered_bodies_here("r1") == [] and runs.runs_with_tiered_bodies_here() == []


class TokenCountsCases(StoreCases):
    def test_a_count_is_written_once_and_completes_a_runs_total(self, parts: Any) -> None:
        counts: TokenCounts = parts.caches
        a, b = parts.blobs.put(b"first text"), parts.blobs.put(b"second text")
        parts.events.append_many("r1", [*started("r1"), said("r1", 0, a), said("r1", 1, b), said("r1", 2, a)])
        counts.put_counts("chars", {a: 3})
        assert counts.cached_counts([a, b, a], "chars") == {a: 3} and counts.cached_counts([a], "other") == {}
        assert parts.runs.listing(counter="chars")[0].tokens is None  # b is not counted yet
        counts.put_counts("chars", {a: 99, b: 5})  # first write wins: a stays 3
        assert counts.cached_counts([a, b], "chars") == {a: 3, b: 5}
        assert parts.runs.listing(counter="chars")[0].tokens == 3 + 5 + 3  # a is shown twice


class JudgmentsCases(StoreCases):
    def test_a_judgment_is_replaced_never_merged(self, parts: Any) -> None:
        judgments: Judgments = parts.caches
        assert judgments.get_judgment("k1") is None and judgments.get_judgments(["k1"]) == {}
        judgments.put_judgment("k1", {"p": [0.2, 0.8]})
        judgments.put_judgment("k2", {"p": [0.5, 0.5]})
        judgments.put_judgment("k1", {"q": 1})
        assert judgments.get_judgment("k1") == {"q": 1}
        assert judgments.get_judgments(["k2", "k1", "k3", "k1"]) == {"k1": {"q": 1}, "k2": {"p": [0.5, 0.5]}}
        keys = [f"k{n}" for n in range(1200)]  # more keys than one look-up binds
        with parts.transaction("seed"):  # one commit, not 1200
            for key in keys:
                if key not in ("k1", "k2"):
                    judgments.put_judgment(key, {"n": key})
        assert len(judgments.get_judgments(keys)) == 1200


class TransactionsCases(StoreCases):
    def test_a_failed_transaction_writes_nothing_of_any_part(self, parts: Any) -> None:
        with pytest.raises(RuntimeError), parts.transaction("unit"):
            ref = parts.blobs.put(b"inside")
            parts.events.append_many("r1", [*started("r1"), said("r1", 0, ref)])
            parts.caches.put_judgment("k", {"p": 1})
            raise RuntimeError("abandon")
        assert not parts.blobs.known(ref_of(b"inside")) and parts.events.logged_runs() == []
        assert parts.caches.get_judgment("k") is None and parts.runs.run_ids() == []

    def test_writers_in_threads_of_one_process_take_turns(self, parts: Any, reopen: Any) -> None:
        failures: list[BaseException] = []

        def write(name: str) -> None:
            try:
                with reopen(parts.location) as own:
                    for n in range(20):
                        own.events.append_many(f"{name}-{n}", started(f"{name}-{n}"))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=write, args=(name,)) for name in ("a", "b", "c")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == [] and len(parts.runs.run_ids()) == 60
