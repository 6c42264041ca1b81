"""Which runs a judge compares: runs on the same task, and what to do when an agent ran a task several times.

Several runs of one agent on one task — its *trials* (``RunState.trial``: a Harbor trial, an inspect epoch, a
repeated SWE-bench run imported with ``--trial``) — are normal. Two policies say which same-task pairs are judged:

- ``matched`` (the default): trial *i* of one agent against trial *i* of every other agent, the trials of each
  agent on the task in order (by trial name, numbers numerically: 2 before 10). *k* trials each give *k* pairs
  per two agents, every trial judged once against each other agent, and no two trials of one agent compared.
  A run without a trial pairs with every other run on its task, so a store without trials pairs as before.
- ``all``: every pair of runs on the task — every cross pair of trials (*k*² per two agents) and two trials of
  one agent too.

The agent of a run is :func:`kvjudge.judge.ranking.agent_of` (its ``agent``, else the run-id prefix, else the
tenant).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvjudge.judge.ranking import agent_of

MATCHED, ALL = "matched", "all"
POLICIES = (MATCHED, ALL)
DEFAULT_POLICY = MATCHED
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class PairSelection:
    """The pairs chosen, and how: ``policy`` (``matched`` | ``all``, or ``named`` for pairs given by the user),
    ``tasks`` (tasks with at least one pair) and ``trials`` (trials per agent and task → how many tasks used that
    many: the most runs any one agent has in the pairs of that task). ``runs``: the runs read to choose the pairs, by
    id, as they were given (folded runs, or listings), so judging and scoring them need not read them again (empty
    for pairs as named)."""

    pairs: list[tuple[str, str]]
    policy: str
    tasks: int = 0
    trials: dict[int, int] = field(default_factory=dict)
    runs: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "pairs": len(self.pairs), "tasks": self.tasks,
                "trials_per_task": {str(k): v for k, v in sorted(self.trials.items())}}

    def describe(self) -> str:
        """One line: how many pairs, on how many tasks, with how many trials per agent and task."""
        trials = ", ".join(f"{n} trial(s) per agent on {count} task(s)" for n, count in sorted(self.trials.items()))
        how = {MATCHED: "trial i with trial i", ALL: "every pair of runs", "named": "pairs as named"}[self.policy]
        return f"{len(self.pairs)} pair(s) on {self.tasks} task(s) ({self.policy}: {how}; {trials or 'no trials'})"


def trial_order(trial: str | None) -> tuple[Any, ...]:
    """Sort key of a trial name: numbers numerically (``epoch-2`` before ``epoch-10``), None first."""
    if trial is None:
        return ()
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(trial) if part != "")


def same_task_pairs(states: Iterable[Any], *, task: str | None = None, policy: str = DEFAULT_POLICY,
                    keep: Callable[[Any, Any], bool] | None = None,
                    agent: Callable[[Any], str] = agent_of) -> PairSelection:
    """The pairs of runs on one task (``task``, else every task) under ``policy``, in run-id order within each
    task; ``keep(state_a, state_b)`` filters them. ``states`` are folded runs (``store.runs.iter_runs()``) or listings
    (``store.runs.listing()``: nothing decoded), anything with a run's ``id``, ``task_id``, ``trial`` and agent."""
    if policy not in POLICIES:
        raise ValueError(f"unknown pairing policy {policy!r}; use one of {', '.join(POLICIES)}")
    by_task: dict[str, list[Any]] = {}
    for state in states:
        if state.task_id is not None and (task is None or state.task_id == task):
            by_task.setdefault(state.task_id, []).append(state)
    pairs: list[tuple[str, str]] = []
    for name in sorted(by_task):
        runs = sorted(by_task[name], key=lambda s: s.id)
        index = _trial_index(runs, agent) if policy == MATCHED else {}
        for a, b in itertools.combinations(runs, 2):
            if policy == MATCHED and a.trial is not None and b.trial is not None and \
                    (agent(a) == agent(b) or index[a.id] != index[b.id]):
                continue
            if keep is None or keep(a, b):
                pairs.append((a.id, b.id))
    states_by_id = {state.id: state for runs in by_task.values() for state in runs}
    return replace(describe_pairs(pairs, states_by_id.__getitem__, policy, agent),
                   runs={run_id: states_by_id[run_id] for pair in pairs for run_id in pair})


def describe_pairs(pairs: Sequence[tuple[str, str]], state_of: Callable[[str], Any], policy: str,
                   agent: Callable[[Any], str] = agent_of) -> PairSelection:
    """A :class:`PairSelection` of ``pairs`` (``state_of(run_id)`` gives a folded run): tasks, trials used."""
    used: dict[str, dict[str, set[str]]] = {}  # task → agent → runs in the pairs
    for pair in pairs:
        for run_id in pair:
            state = state_of(run_id)
            used.setdefault(str(state.task_id), {}).setdefault(agent(state), set()).add(run_id)
    trials = Counter(max(len(runs) for runs in agents.values()) for agents in used.values())
    return PairSelection(list(pairs), policy, tasks=len(used), trials=dict(trials))


def _trial_index(runs: Sequence[Any], agent: Callable[[Any], str]) -> dict[str, int]:
    """Run id → its place among its agent's trials on the task (runs with a trial only)."""
    index: dict[str, int] = {}
    by_agent: dict[str, list[Any]] = {}
    for state in runs:
        if state.trial is not None:
            by_agent.setdefault(agent(state), []).append(state)
    for trials in by_agent.values():
        for place, state in enumerate(sorted(trials, key=lambda s: (trial_order(s.trial), s.id))):
            index[state.id] = place
    return index
