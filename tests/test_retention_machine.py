"""A hypothesis state machine over the store: ingest, mark, reduce, crash mid-reduction, recover, verify.

A crash here is an exception thrown at a fault point (the process keeps running, the open transaction rolls
back as it would on a kill); tests/test_reduction.py kills real child processes at the same points.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvjudge.errors import RunStateError
from kvjudge.retention import Store
from kvjudge.retention.faults import REDUCTION_POINTS
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.lifecycle import LEGAL_NEXT, STATES
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.stored_tokens import run_tokens
from kvjudge.retention.state import LOCAL
from kvjudge.retention.verify import verify
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import CharsPerToken

from helpers import sql

CHARS = CharsPerToken(4)


class Crash(Exception):
    """Stands in for SIGKILL at a fault point."""


def crashing_at(point: str):
    def fault(name: str) -> None:
        if name == point:
            raise Crash(point)
    return fault


class StoreMachine(RuleBasedStateMachine):
    @initialize()
    def open_store(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvjudge-machine-"))
        self.store = Store.open(self.dir / "store.sqlite")
        self.count = 0
        self.log: list[tuple[int, str, str, bytes]] = []
        self.last_target: dict[str, int] = {}

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _log(self) -> list[tuple[int, str, str, bytes]]:
        """Every event row as stored, in LSN order (the payload's bytes, not a re-serialised event)."""
        rows = sql(self.store).execute("SELECT lsn, run, kind, CAST(payload AS BLOB) FROM events ORDER BY lsn")
        return [(int(lsn), run, kind, bytes(payload)) for lsn, run, kind, payload in rows]

    @rule(sizes=st.lists(st.integers(1, 600), min_size=1, max_size=4),
          dead=st.lists(st.lists(st.integers(1, 400), min_size=1, max_size=3), max_size=2),
          end=st.sampled_from(["running", "grading", "graded", "ungraded"]), shared=st.booleans())
    def ingest(self, sizes: list[int], dead: list[list[int]], end: str, shared: bool) -> None:
        self.count += 1
        path_to = {"running": ["running"], "grading": ["running", "grading"],
                   "graded": ["running", "grading", "graded"], "ungraded": ["running", "grading", "ungraded"]}
        seed = 0 if shared else self.count * 100  # shared=True reuses bodies other runs hold too
        outputs = [filler(seed + i, n) for i, n in enumerate(sizes)]
        dead_texts = [[filler(seed + 50 + 10 * b + i, n) for i, n in enumerate(branch)] for b, branch in enumerate(dead)]
        run = make_run(f"run-{self.count}", outputs, dead=dead_texts, lifecycle=path_to[end])
        path = self.dir / f"in-{self.count}.jsonl"
        write_jsonl(path, [run])
        assert ingest_paths(self.store, [path]).runs == [f"run-{self.count}"]

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), new=st.sampled_from(STATES))
    def mark(self, data: st.DataObject, new: str) -> None:
        run_id = data.draw(st.sampled_from(self.store.runs.run_ids()))
        current = self.store.runs.run(run_id).state
        log = self._log()
        if new in LEGAL_NEXT[current]:
            self.store.events.mark(run_id, new)
            assert self.store.runs.run(run_id).state == new
        else:
            try:
                self.store.events.mark(run_id, new)
            except RunStateError:
                assert self._log() == log
            else:
                raise AssertionError(f"{current} → {new} was accepted")

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), tokens=st.integers(20, 3000))
    def reduce(self, data: st.DataObject, tokens: int) -> None:
        run_id = data.draw(st.sampled_from(self.store.runs.run_ids()))
        state = self.store.runs.run(run_id)
        if not state.is_reducible:
            try:
                reduce_run(self.store, run_id, tokens, CHARS)
            except RunStateError:
                return
            raise AssertionError(f"a {state.state} run was reduced")
        result = reduce_run(self.store, run_id, tokens, CHARS)
        now = run_tokens(self.store, self.store.runs.run(run_id), CHARS)
        assert now == result.plan.tokens_after
        if result.plan.fits:
            assert now <= tokens
        # reducing again to the same tokens changes nothing
        assert reduce_run(self.store, run_id, tokens, CHARS).appended == 0

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), tokens=st.integers(20, 3000), point=st.sampled_from(REDUCTION_POINTS))
    def crash_and_recover(self, data: st.DataObject, tokens: int, point: str) -> None:
        candidates = [r for r in self.store.runs.run_ids() if self.store.runs.run(r).is_reducible]
        if not candidates:
            return
        run_id = data.draw(st.sampled_from(candidates))
        fault = crashing_at(point)
        with mock.patch("kvjudge.retention.reduce_apply.fault_point", fault), \
                mock.patch("kvjudge.retention.store.database.fault_point", fault):
            try:
                reduce_run(self.store, run_id, tokens, CHARS)
            except Crash:
                pass
        # "Restart": a fresh connection, then the interrupted reduction runs again and converges.
        self.store.close()
        self.store = Store.open(self.dir / "store.sqlite")
        self.store_is_sound()
        reduce_run(self.store, run_id, tokens, CHARS)
        assert reduce_run(self.store, run_id, tokens, CHARS).appended == 0

    @invariant()
    def store_is_sound(self) -> None:
        if not hasattr(self, "store"):
            return
        report = verify(self.store)
        assert report.ok, report.to_dict()
        for state in self.store.runs.iter_runs():
            for ref, location in state.bodies.items():
                if self.store.blobs.get(ref) is None:
                    assert location.status != LOCAL
        log = self._log()
        # The log only grows: every event seen before is still there, byte for byte, at the same LSN.
        assert log[:len(self.log)] == self.log
        self.log = log


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
