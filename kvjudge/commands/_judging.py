"""What a judging command (``judge``, ``eval``, ``rank``, ``report``) adds to the shared argparse pieces of
:mod:`kvjudge.commands._args`: its flags, its judge, and the pairs it was given."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvjudge.commands._args import (JUDGE_CHOICE, add_api_key_args, add_lease_args, job_line, jsonl_objects,
                                   records_settings)
from kvjudge.commands._output import info, progress
from kvjudge.errors import UsageError
from kvjudge.judge import DEFAULT_MARGIN, TEMPLATE_CHOICES, Judge, Verdict, judge_batch
from kvjudge.judge import backend_registry
from kvjudge.judge.ledger import Ledger, plan_line
from kvjudge.judge.pairing import DEFAULT_POLICY, POLICIES, PairSelection, describe_pairs, same_task_pairs
from kvjudge.retention import Store
from kvjudge.retention.shared_job import Sharing
from kvjudge.retention.store.interfaces import RunQueries
from kvjudge.retention.state import RunState
from kvjudge.judge.protocols import PROTOCOLS
from kvjudge.settings import DEFAULT_LEVELS, DEFAULT_PARALLEL, DEFAULT_PROTOCOL, DEFAULT_TIMEOUT_S
from kvjudge.target import JudgeTarget


def add_judge_args(parser: argparse.ArgumentParser, *, also_templates: tuple[str, ...] = (),
                   kinds: tuple[str, ...] = ("pairwise",)) -> None:
    """What ``judge``, ``eval``, ``rank`` and ``report`` share: the pairs, the backend, the framing, the window (the
    store and the endpoint tiered runs are read from: :data:`READS_TIERED`, after the command's own options).

    ``also_templates``: further ``--template`` values a command understands (``eval``'s ``both``: then the
    command passes the framing to the judge itself); ``kinds``: the protocols it runs (pairwise, pointwise)."""
    parser.add_argument("runs", nargs="*", metavar="RUN", help="two run ids: RUN_A RUN_B")
    parser.add_argument("--pairs", metavar="FILE", help='JSONL file of pairs, one {"a": RUN, "b": RUN} per line')
    parser.add_argument("--task", metavar="TASK", help="every pair of runs on this task id")
    parser.add_argument("--trials", choices=POLICIES, default=DEFAULT_POLICY,
                        help="when an agent ran a task several times: matched pairs trial i with trial i of each "
                             "other agent, all pairs every two runs on the task (default: matched; runs without a "
                             "trial pair with every run on their task)")
    add_backend_args(parser, also_templates=also_templates, kinds=kinds)


def add_backend_args(parser: argparse.ArgumentParser, *, also_templates: tuple[str, ...] = (),
                     kinds: tuple[str, ...] = ("pairwise",)) -> None:
    """The judge itself (``add_judge_args`` without the pairs; ``kvjudge score`` reads runs, not pairs): the
    backend, the framing, the window, the protocol."""
    # Not argparse choices: an unknown name is the registry's one line, the same for the flag and [judge] backend.
    parser.add_argument("--backend", metavar="NAME", help=backend_registry.help_text())
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model, else the "
                                                         "default judge model)")
    backend.add_argument("--server", metavar="URL", action="append",
                         help="OpenAI-compatible server (llama.cpp, llama-cpp-python, vLLM) instead of in-process "
                              "llama-cpp-python; repeat for a pool of servers of one model (default: [judge] servers "
                              "or [judge] server; a server without a `kvjudge probe --server` entry is probed on "
                              "first use)")
    parser.add_argument("--parallel", type=int, metavar="N",
                        help=f"with servers: requests in flight per server (default: [judge] parallel or {DEFAULT_PARALLEL})")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help=f"with servers: seconds per request (default: [judge] timeout or {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--tokenizer-model", metavar="PATH",
                        help="with --server: a local copy of the served GGUF, to count tokens without the server "
                             "(and read its chat template)")
    parser.add_argument("--n-ctx", type=int, metavar="N",
                        help="upper bound on the judge window (default: sized to each batch of pairs, capped by "
                             "the certified safe_context, else the analytic max_context_tokens)")
    parser.add_argument("--no-certify", action="store_true",
                        help="never certify the window size first (the window is then labelled not certified)")
    parser.add_argument("--template", choices=(*TEMPLATE_CHOICES, *also_templates), default=None,
                        help="prompt framing: the model's chat template, raw, or auto (chat when the GGUF has a "
                             "template; default: [judge] template, else auto)"
                             + "".join(f"; {name}: each framing in turn" for name in also_templates))
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: [judge] threads or "
                                                                 "llama-cpp-python's default)")
    parser.add_argument("--margin", type=float, metavar="M",
                        help=f"tie margin on |p_a - 0.5| (default: [judge] margin or {DEFAULT_MARGIN})")
    parser.add_argument("--show-verifier", action="store_true",
                        help="show verifier results to the judge (hidden by default: grades often derive from them)")
    parser.add_argument("--show-grades", action="store_true", help="show recorded grades to the judge "
                                                                   "(experiments only)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write cached judgments")
    add_protocol_args(parser, kinds=kinds)
    records_settings(parser, *JUDGE_CHOICE, "backend", "parallel", "timeout", "tokenizer_model", "threads", "margin",
                     *(() if also_templates else ("template",)))
    add_api_key_args(parser)
    add_lease_args(parser)


def add_protocol_args(parser: argparse.ArgumentParser, *, kinds: tuple[str, ...] = ("pairwise",)) -> None:
    """``--protocol`` (its choices and help from the registry, :data:`~kvjudge.judge.protocols.PROTOCOLS`: those of
    ``kinds``), ``--levels``, ``--repeats``, ``--rubric``."""
    choices = [name for name, cls in PROTOCOLS.items() if cls.kind in kinds]
    parser.add_argument("--protocol", choices=choices, default=None,
                        help=f"judge protocol (default: [judge] protocol, else {DEFAULT_PROTOCOL}): "
                             + "; ".join(f"{name}: {PROTOCOLS[name].summary}" for name in choices))
    parser.add_argument("--levels", type=int, metavar="G",
                        help=f"a scale protocol's levels, letters from A (worst) (default: [judge] levels or "
                             f"{DEFAULT_LEVELS}; at most the servers' top logprobs)")
    parser.add_argument("--repeats", type=int, metavar="K",
                        help="a scale protocol's readings per criterion, each another question variant (default: "
                             "[judge] repeats or 1)")
    parser.add_argument("--rubric", metavar="FILE",
                        help="a scale protocol's criteria: a TOML rubric file of [[criterion]] name/text tables "
                             "(default: [judge] rubric, else the default rubric for coding-agent runs)")
    records_settings(parser, "protocol", "levels", "repeats", "rubric")


@contextlib.contextmanager
def opened_judge(args: argparse.Namespace, target: JudgeTarget, *, template: str | None = None,
                 protocol: str | None = None, store: Store | None = None) -> Iterator[Judge]:
    """The judge of a judging command (``add_judge_args``: window, certification, held-out inputs, cache), its
    backend closed on the way out. With ``store`` (and the cache on) the judge shares its work with other processes
    started on that store (``--lease``; a store without claims refused in one line, before the backend opens)."""
    sharing = None if store is None or args.no_cache else Sharing(store.claims, target.settings.store.lease_seconds)
    target.protocol(protocol)  # a bad protocol, rubric or scale: one line, before the backend is announced
    for problem in backend_registry.load_problems():  # a plugin that did not load: one note, never a traceback
        info(problem)
    kind = target.backend_kind  # an unknown backend: one line, as early
    info(f"loading the judge backend ({kind.name})…")
    judge = target.open_judge(n_ctx=args.n_ctx, certify=not args.no_certify, template=template,
                              show_verifier=args.show_verifier, show_grades=args.show_grades,
                              use_cache=not args.no_cache, protocol=protocol)
    judge.sharing = sharing
    try:
        yield judge
    finally:
        judge.backend.close()


def judged(judge: Judge, store: Store, selection: PairSelection, description: str = "judging", *,
           states: dict[str, RunState] | None = None) -> list[Verdict]:
    """:func:`~kvjudge.judge.judge_batch` of the selected pairs, with a progress bar on a terminal (a step per
    order). ``states``: folded runs already read, by id; the runs the batch folds are added to it."""
    with progress(description, len(selection.pairs) * judge.protocol.calls) as advance:
        judge.planner.progress = lambda message: advance(0, description=message)
        shown(judge, advance, description)
        return judge_batch(judge, store, selection.pairs, on_call=advance, states=states, on_plan=announce(judge))


def shown(judge: Judge, advance: Callable[..., None], description: str) -> None:
    """A shared job's progress (done by anyone, claimed, free) in the bar's description."""
    if judge.sharing is not None:
        judge.sharing.on_view = lambda view: advance(0, description=job_line(description, view))


def announce(judge: Judge, what: str = "verdict") -> Callable[[int, int], None]:
    """The ``on_plan`` of a judging command: before the first call, one line with the calls it is about to send,
    the prompt tokens they may take at most, and the way out (nothing said when every ``what`` is cached)."""

    def say(calls: int, cached: int) -> None:
        if calls:
            info(plan_line(calls, cached, judge.backend.n_ctx or judge.window_cap(), what))

    return say


def spent(*judges: Judge) -> Ledger:
    """What the judges' backends spent, added up (a command's ledger)."""
    total = Ledger()
    for judge in judges:
        total.merge(judge.backend.ledger)
    return total


def job_summary(sharing: Sharing | None) -> dict[str, Any] | None:
    """What a shared job holds and what this worker did in it, with the job's cost (each unit's calls recorded with
    its result, whoever sent them: every process of the job reports the same figure); None: not shared."""
    if sharing is None:
        return None
    cost = Ledger()
    for recorded in sharing.costs():
        cost.merge(Ledger.from_json(recorded))
    return {**sharing.summary(), "cost": cost.to_json()}


def _pairs_from_file(path: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for number, item in jsonl_objects(path, "pairs file", '{"a": RUN, "b": RUN} lines'):
        if not isinstance(item.get("a"), str) or not isinstance(item.get("b"), str):
            raise UsageError(f"{Path(path)}:{number}: needs string fields \"a\" and \"b\" (run ids)")
        pairs.append((item["a"], item["b"]))
    return pairs


def select_pairs(args: argparse.Namespace, runs: RunQueries, *, default_all: bool = False,
                 keep: Callable[[Any, Any], bool] | None = None) -> PairSelection:
    """The pairs named by RUN_A RUN_B, ``--pairs FILE`` or ``--task TASK`` (or, with ``default_all``, every
    same-task pair of ``runs``, the store's run queries), the trials of an agent paired by ``--trials``
    (:func:`kvjudge.judge.pairing.same_task_pairs`); unknown runs and self-pairs are errors before any model
    loads."""
    chosen = sum([bool(args.runs), args.pairs is not None, args.task is not None])
    if chosen > 1 or (chosen == 0 and not default_all):
        raise UsageError("name the pairs one way: RUN_A RUN_B, --pairs FILE or --task TASK")
    if args.runs:
        if len(args.runs) != 2:
            raise UsageError(f"judge takes two run ids (RUN_A RUN_B), got {len(args.runs)}")
        pairs = [(args.runs[0], args.runs[1])]
    elif args.pairs is not None:
        pairs = _pairs_from_file(args.pairs)
    else:
        # The listing is all pairing reads (nothing decoded); the judge folds a run only where it must.
        selection = same_task_pairs(runs.listing(task=args.task), task=args.task, policy=args.trials, keep=keep)
        pairs = selection.pairs
        if args.task is not None and not pairs:
            count = len(runs.run_ids(task=args.task))
            raise UsageError(f"task {args.task!r} has {count} run(s) in the store that pair under --trials "
                             f"{args.trials}; a pair needs two")
        if not pairs:
            raise UsageError("the store holds no two runs on one task; ingest runs, or name the pairs")
    if not (args.runs or args.pairs is not None):
        return selection  # pairs of the store's own runs: nothing to check (reading every run again costs seconds)
    for a, b in pairs:
        if a == b:
            raise UsageError(f"pair ({a}, {b}) names one run twice; a judge compares two runs")
        for run_id in (a, b):
            runs.run(run_id)  # an unknown run is an error before any model call (StoreError names it)
    return describe_pairs(pairs, runs.run, "named")
