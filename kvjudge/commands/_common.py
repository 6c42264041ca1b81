"""What every subcommand shares: common options, JSON or table output, progress on a TTY."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge import models
from kvjudge.config import Config, load_config
from kvjudge.display import visible
from kvjudge.errors import CapabilityMissing, ConfigError, UsageError

if TYPE_CHECKING:
    from kvjudge.budget import CeilingBound
    from kvjudge.judge.pairing import PairSelection
    from kvjudge.probe import CapabilityEntry
    from kvjudge.retention.tiering import ColdStores
    from kvjudge.tokens import TokenCounter

# The figures of a capability entry worth showing (trials are the probe's business).
_ENTRY_FIELDS = ("fingerprint", "model_sha256", "device", "max_context_tokens", "max_ok_input", "safe_context",
                 "certified", "certified_at", "method", "stale")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--raw`` and ``--config`` (every subcommand has all three)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    parser.add_argument("--raw", action="store_true",
                        help="print run text as stored, terminal escape sequences included (default: control "
                             "characters shown visibly, e.g. ␛[31m)")
    parser.add_argument("--config", metavar="PATH", help="config file (default: ./kvjudge.toml)")


def add_store_args(parser: argparse.ArgumentParser) -> None:
    """``--store PATH`` (every command that reads or writes the run store)."""
    parser.add_argument("--store", metavar="PATH", help="store file (default: [retention] store, else "
                                                        "<data dir>/store.sqlite)")


def add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    """``--endpoint-url URL`` (commands that reach an S3 cold store)."""
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3 endpoint for new moves (default: [retention] endpoint_url, else AWS_ENDPOINT_URL / "
                             "AWS config); a tiered run is read where its log says it went, and this overrides "
                             "that only when the store at URL holds the same manifest (the store moved)")


def add_results_args(parser: argparse.ArgumentParser) -> None:
    """``--results [AGENT=]FILE`` (``ingest`` and ``grade``: evaluation results as held-out grades)."""
    parser.add_argument("--results", metavar="[AGENT=]FILE", action="append", default=[],
                        help="evaluation results as held-out grades: a SWE-bench summary report, per-instance "
                             "report.json files, OpenHands output.swebench_eval.jsonl, Harbor result.json files, "
                             "inspect logs (a directory is searched); repeatable")


def unmatched_results_line(unmatched: Sequence[dict[str, str]], runs: str = "run of this import",
                           listed: int = 10) -> str:
    """The one warning line for results that named no run: the first ``listed`` by name, the rest counted."""
    names = [item["instance"] for item in unmatched[:listed]]
    more = len(unmatched) - len(names)
    files = sorted({item["results"] for item in unmatched})
    return (f"warning: {len(unmatched)} result(s) name no {runs}: {', '.join(names)}"
            f"{f' and {more} more' if more else ''} (from {', '.join(files)})")


def staleness_days(args: argparse.Namespace) -> float | None:
    """``[probe] staleness_days`` of the command's config (None: the probe's default)."""
    value = config_from(args).get("probe.staleness_days", (int, float), None)
    return None if value is None else float(value)


def format_mib(value: int | None) -> str:
    """Bytes for a table, in the probe's units."""
    from kvjudge.probe import format_size

    return format_size(value)


def megabytes(n_bytes: int) -> str:
    """Bytes as decimal megabytes with one decimal (tables)."""
    return f"{n_bytes / 1e6:.1f}"


def config_from(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def judge_model(args: argparse.Namespace, config: Config) -> Path:
    """``--model``, else ``[judge] model``, else the default judge model."""
    chosen = getattr(args, "model", None) or config.get("judge.model", str, None)
    return models.resolve_model(chosen) if chosen else models.judge_model_path()


def counter_for(args: argparse.Namespace, config: Config, served: CapabilityEntry | None = None) -> TokenCounter:
    """``[retention] counter``: ``model`` (the judge model's tokenizer, default), ``tiktoken`` or ``chars``.

    With ``served`` (the entry of a judge server) ``model`` is the served model's tokenizer: ``--model`` (a local
    copy of the served GGUF), else the served file when it is readable here, else the server's tokenize endpoint.
    """
    from kvjudge.tokens import ModelTokenizer, make_counter

    spec = config.get("retention.counter", str, "model")
    if spec.partition(":")[0] != "model":
        return make_counter(spec)
    if served is None:
        return make_counter(spec, judge_model(args, config))
    if getattr(args, "model", None):
        return ModelTokenizer(models.resolve_model(args.model))
    if served.model_sha256 and Path(served.model_path).is_file() \
            and models.file_sha256(Path(served.model_path)) == served.model_sha256:
        return ModelTokenizer(served.model_path, sha256=served.model_sha256)
    from kvjudge.server_client import ServerClient, ServerTokenCounter

    return ServerTokenCounter(ServerClient(served.server["url"]), served.server["model_id"])


def judge_servers(args: argparse.Namespace, config: Config) -> list[str]:
    """``--server URL`` (repeatable), else ``[judge] servers`` or ``[judge] server`` — unless ``--model`` names a
    local model. Empty: judge in-process."""
    given = getattr(args, "server", None)
    if given:
        return list(given) if isinstance(given, list) else [given]
    if getattr(args, "model", None):
        return []
    servers = config.get("judge.servers", list, None)
    if servers is not None:
        if not servers or not all(isinstance(url, str) and url for url in servers):
            raise ConfigError(f"{config.source}: [judge] servers must be a non-empty list of URLs, got {servers!r}; "
                              f"fix the config file")
        return list(servers)
    server = config.get("judge.server", str, None)
    return [server] if server else []


def served_entry(args: argparse.Namespace, url: str, cache_path: str | os.PathLike[str] | None = None, *,
                 required: bool = True) -> CapabilityEntry | None:
    """The capability entry of the model served at ``url`` (never probes). Missing: CapabilityMissing when
    ``required``, else None with a note. A stale entry, or one that could not be checked against an unreachable
    server, is used with a note on stderr."""
    from kvjudge.probe import lookup_served

    found = lookup_served(url, cache_path=cache_path, staleness_days=staleness_days(args))
    if found.entry is None:
        why = f" ({found.reason})" if found.reason not in ("", "no entry") else ""
        message = (f"no probe figure for the model served at {found.url}{why}; run `kvjudge probe --server "
                   f"{found.url}`")
        if required:
            raise CapabilityMissing(message)
        info(message)
        return None
    if not found.verified and found.reason:
        info(f"note: {found.reason}; using the figures probed at {found.entry.age_reference()}")
    if found.entry.stale:
        info(f"the capability entry for the model served at {found.url} is stale; rerun "
             f"`kvjudge probe --server {found.url} --refresh`")
    return found.entry


def add_ceiling_args(parser: argparse.ArgumentParser) -> None:
    """``--ceiling``, ``--capabilities``, ``--model``, ``--server``: what a run's effective ceiling is computed from."""
    parser.add_argument("--ceiling", type=int, metavar="N",
                        help="lower the configured ceiling to N tokens (the hardware bound still applies)")
    parser.add_argument("--capabilities", metavar="FILE",
                        help="capability cache file (e.g. copied from the judge host; default: in the cache dir)")
    parser.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model or the default "
                                                        "judge model); with --server: a local copy of the served "
                                                        "GGUF to count tokens with")
    parser.add_argument("--server", metavar="URL",
                        help="the judge is this OpenAI-compatible server: the ceiling comes from its `kvjudge probe "
                             "--server` entry (default: [judge] servers / server, unless --model is given)")


@dataclass(frozen=True)
class Ceilings:
    """Effective ceilings per tenant: ``min(configured, max_context_tokens // 2)`` of the judge (a local model on
    this device, or the served model of a judge server), the configured value lowered by ``--ceiling``. Never the
    configured value alone: without a probe figure :meth:`bound` raises CapabilityMissing."""

    config: Config
    judge: str                      # the local GGUF's path, or "MODEL_ID @ URL" for a server
    max_context_tokens: int | None
    capability: dict[str, Any] | None
    lowered_to: int | None = None
    served: CapabilityEntry | None = None   # the server's entry (its tokenizer counts) when the judge is served

    def bound(self, tenant: str) -> CeilingBound:
        from kvjudge.budget import configured_ceiling, effective_ceiling

        configured = configured_ceiling(self.config, tenant)
        if self.lowered_to is not None:
            configured = min(configured, self.lowered_to)
        return effective_ceiling(configured, self.max_context_tokens)

    def describe(self, tenant: str) -> dict[str, Any]:
        """The figures behind a tenant's ceiling (``--json``'s ``ceilings``)."""
        bound = self.bound(tenant)
        return {"configured": bound.configured, "max_context_tokens": self.max_context_tokens,
                "hardware_bound": bound.hardware_bound, "effective": bound.effective, "winner": bound.winner}


def ceilings_from(args: argparse.Namespace, config: Config, *, required: bool = True) -> Ceilings:
    """The :class:`Ceilings` of a command with :func:`add_ceiling_args` (reads the capability cache, never probes).

    With judge servers the smallest ``max_context_tokens`` among their entries bounds the ceiling: a pair may be
    read by any of them. A missing server entry is CapabilityMissing, as for a local model, unless not
    ``required`` (then the ceiling is unknown: :meth:`Ceilings.bound` raises when asked)."""
    if args.ceiling is not None and args.ceiling <= 0:
        raise UsageError(f"--ceiling must be a positive number of tokens, got {args.ceiling}")
    servers = judge_servers(args, config)
    if servers:
        entries = [e for e in (served_entry(args, url, args.capabilities, required=required) for url in servers) if e]
        if not entries:
            return Ceilings(config=config, judge=", ".join(servers), max_context_tokens=None, capability=None,
                            lowered_to=args.ceiling)
        served = min(entries, key=lambda e: e.max_context_tokens)
        return Ceilings(config=config, judge=f"{served.server['model_id']} @ {served.server['url']}",
                        max_context_tokens=served.max_context_tokens, capability=entry_summary(served),
                        lowered_to=args.ceiling, served=served)
    model_path = judge_model(args, config)
    entry = lookup_entry(model_path, args.capabilities)
    warn_if_stale(entry, model_path)
    return Ceilings(config=config, judge=str(model_path),
                    max_context_tokens=None if entry is None else entry.max_context_tokens,
                    capability=entry_summary(entry), lowered_to=args.ceiling)


def lookup_entry(model_path: Path, cache_path: str | os.PathLike[str] | None = None,
                 memory_budget: int | str | None = None) -> CapabilityEntry | None:
    """The capability cache entry for ``model_path`` on this device, or None (never probes)."""
    from kvjudge.probe import lookup_capability

    return lookup_capability(model_path, cache_path=cache_path, memory_budget=memory_budget)


def entry_summary(entry: CapabilityEntry | None) -> dict[str, Any] | None:
    """The displayable figures of a capability entry (None stays None)."""
    if entry is None:
        return None
    return {name: getattr(entry, name, None) for name in _ENTRY_FIELDS}


def warn_if_stale(entry: CapabilityEntry | None, model_path: Path) -> None:
    """One line on stderr when the capability entry is past its staleness limit."""
    if entry is not None and getattr(entry, "stale", False):
        info(f"the capability entry for {model_path} is stale; rerun `kvjudge probe --model {model_path}`")


class _HumanStdout:
    """stdout while a command prints for people: run text goes through :func:`visible` unless ``--raw``."""

    def __init__(self, stream: Any, raw: bool) -> None:
        self.stream = stream
        self.raw = raw

    def write(self, text: str) -> int:
        return self.stream.write(text if self.raw else visible(text))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, … of the real stream
        return getattr(self.stream, name)


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None] | None = None) -> None:
    """Print ``payload`` as JSON with ``--json``, else call ``human`` (or pretty-print the payload).

    JSON escapes control characters itself; what ``human`` prints is shown visibly (:func:`visible`)
    unless ``--raw``.
    """
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=None, sort_keys=False, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    elif human is not None:
        with contextlib.redirect_stdout(_HumanStdout(sys.stdout, getattr(args, "raw", False))):
            human()
    else:
        print(json.dumps(payload, indent=2, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A short table on stdout, as wide as the terminal (80 columns when stdout is not one, or ``COLUMNS``).

    A table wider than that is never cut: it is printed as one record per row instead (the first cell on its own
    line, then ``column  value`` lines), so a run id a user must copy is always whole and every header readable.
    Cells are shown visibly (:func:`visible`) unless the command runs with ``--raw``.
    """
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    out = sys.stdout
    # rich's own styling must reach the terminal as it is, so the table renders its cells visibly itself
    # and writes past the human-output wrapper.
    raw = isinstance(out, _HumanStdout) and out.raw
    stream = out.stream if isinstance(out, _HumanStdout) else out
    shown: Callable[[str], str] = (lambda text: text) if raw else visible
    cells = [[shown("" if cell is None else str(cell)) for cell in row] for row in rows]
    console = Console(file=stream, soft_wrap=False)
    table = Table(title=None if title is None else Text(shown(title)), show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in cells:
        # Text(), not str: cells hold run text and refs, whose square brackets are not rich markup.
        table.add_row(*[Text(cell) for cell in row])
    natural = Measurement.get(console, console.options.update(width=10**6), table).maximum
    if natural <= console.width:
        console.print(table, width=console.width)
        return
    _print_records([shown(column) for column in columns], cells, None if title is None else shown(title), stream,
                   console.width)


def print_wrapped(text: str, indent: str = "") -> None:
    """A sentence on stdout, wrapped at the terminal's width (80 columns when stdout is not a terminal), every
    line after ``indent``; a word longer than a line is never broken."""
    import textwrap

    from rich.console import Console

    width = Console(file=sys.stdout).width
    print(textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                        break_long_words=False, break_on_hyphens=False))


def _print_records(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None, stream: Any,
                   width: int) -> None:
    """The vertical layout of :func:`print_table`: one block per row, labels aligned, nothing cut."""
    import textwrap

    if title:
        print(textwrap.fill(title, width=width, break_long_words=False, break_on_hyphens=False), file=stream)
    labels = [column or f"column {index + 1}" for index, column in enumerate(columns)]
    pad = max((len(label) for label in labels[1:]), default=0)
    for row in rows:
        first, *rest = row or [""]
        print(f"{labels[0]}: {first}" if columns[0] else first, file=stream)
        indent = " " * (pad + 4)
        for label, cell in zip(labels[1:], rest):
            # Long values wrap at spaces under their label (a word longer than the line is never broken).
            lines = [wrapped for line in cell.split("\n")
                     for wrapped in textwrap.wrap(line, width=max(20, width - len(indent)), break_long_words=False,
                                                  break_on_hyphens=False) or [""]]
            print(f"  {label.ljust(pad)}  {lines[0]}", file=stream)
            for line in lines[1:]:
                print(f"{indent}{line}", file=stream)
    stream.flush()


def cold_stores(args: argparse.Namespace, config: Config) -> ColdStores:
    """The cold stores a command opens: new moves at ``--endpoint-url`` / ``[retention] endpoint_url`` / boto3's
    resolution; recorded moves where their log says (``--endpoint-url`` overrides that only when it holds the
    same manifest). Notices (an old log without endpoints) go to stderr, once."""
    from kvjudge.retention.tiering import ColdStores

    return ColdStores.from_config(config, getattr(args, "endpoint_url", None), notice=info)


def open_store(args: argparse.Namespace, config: Config, *, read_tiered: bool = True,
               stores: ColdStores | None = None) -> Any:
    """The store named by ``--store``, ``[retention] store`` or the default path.

    With ``read_tiered`` the store reads tiered bodies from their cold store (``show``, the judge) through
    ``stores`` (default: :func:`cold_stores`); tiering itself moves local bodies and opens the store without
    that reader.
    """
    from kvjudge.retention import Store
    from kvjudge.retention.tiering import ColdReader

    store = Store.open(getattr(args, "store", None) or config.get("retention.store", str, None))
    if read_tiered:  # the reader looks up where each tiered body went, so it needs the store
        store.fallback = ColdReader(store, stores or cold_stores(args, config))
    return store


def info(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json); run text in it is shown visibly."""
    print(visible(message), file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n=1, description=None)``; draws a progress bar on stderr when it is a TTY."""
    if not sys.stderr.isatty():
        yield lambda n=1, description=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1, description: str | None = None) -> None:
            if description is not None:
                bar.update(task, description=description)
            bar.advance(task, n)

        yield advance


# ---------------------------------------------------------------------------------------- judging commands
def add_judge_args(parser: argparse.ArgumentParser, *, also_templates: tuple[str, ...] = ()) -> None:
    """What ``judge``, ``eval`` and ``rank`` share: the pairs, the backend, the framing, the window.

    ``also_templates``: further ``--template`` values a command understands (``eval``'s ``both``)."""
    from kvjudge.judge import DEFAULT_MARGIN, TEMPLATE_CHOICES
    from kvjudge.judge.pairing import DEFAULT_POLICY, POLICIES

    parser.add_argument("runs", nargs="*", metavar="RUN", help="two run ids: RUN_A RUN_B")
    parser.add_argument("--pairs", metavar="FILE", help='JSONL file of pairs, one {"a": RUN, "b": RUN} per line')
    parser.add_argument("--task", metavar="TASK", help="every pair of runs on this task id")
    parser.add_argument("--trials", choices=POLICIES, default=DEFAULT_POLICY,
                        help="when an agent ran a task several times: matched pairs trial i with trial i of each "
                             "other agent, all pairs every two runs on the task (default: matched; runs without a "
                             "trial pair with every run on their task)")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model, else the "
                                                         "default judge model)")
    backend.add_argument("--server", metavar="URL", action="append",
                         help="OpenAI-compatible server (llama.cpp, llama-cpp-python, vLLM) instead of in-process "
                              "llama-cpp-python; repeat for a pool of servers of one model (default: [judge] servers "
                              "or [judge] server; probe each first: kvjudge probe --server URL)")
    parser.add_argument("--parallel", type=int, metavar="N",
                        help="with servers: requests in flight per server (default: [judge] parallel or 2)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="with servers: seconds per request (default: [judge] timeout or 600)")
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
    add_store_args(parser)
    add_endpoint_args(parser)  # tiered runs are read where their moves went (--endpoint-url: the store moved)
    add_output_args(parser)


def jsonl_objects(path: str, what: str, hint: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file, with their line numbers; one-line errors name the file and line.

    ``what`` names the file in errors ("pairs file"), ``hint`` says what a line holds.
    """
    from kvjudge.errors import UsageError

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{what} {file} does not exist; pass a JSONL file of {hint}")
    items: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{file}:{number}: not JSON ({exc.args[0]}); each line is {hint}") from exc
        if not isinstance(item, dict):
            raise UsageError(f"{file}:{number}: not an object; each line is {hint}")
        items.append((number, item))
    if not items:
        raise UsageError(f"{what} {file} holds nothing")
    return items


def _pairs_from_file(path: str) -> list[tuple[str, str]]:
    from kvjudge.errors import UsageError

    pairs: list[tuple[str, str]] = []
    for number, item in jsonl_objects(path, "pairs file", '{"a": RUN, "b": RUN} lines'):
        if not isinstance(item.get("a"), str) or not isinstance(item.get("b"), str):
            raise UsageError(f"{Path(path)}:{number}: needs string fields \"a\" and \"b\" (run ids)")
        pairs.append((item["a"], item["b"]))
    return pairs


def select_pairs(args: argparse.Namespace, store: Any, *, default_all: bool = False,
                 keep: Callable[[Any, Any], bool] | None = None) -> PairSelection:
    """The pairs named by RUN_A RUN_B, ``--pairs FILE`` or ``--task TASK`` (or, with ``default_all``, every
    same-task pair of the store), the trials of an agent paired by ``--trials``
    (:func:`kvjudge.judge.pairing.same_task_pairs`); unknown runs and self-pairs are errors before any model
    loads."""
    from kvjudge.errors import UsageError
    from kvjudge.judge.pairing import describe_pairs, same_task_pairs

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
        selection = same_task_pairs(store.iter_runs(task=args.task), task=args.task, policy=args.trials, keep=keep)
        pairs = selection.pairs
        if args.task is not None and not pairs:
            count = len(store.run_ids(task=args.task))
            raise UsageError(f"task {args.task!r} has {count} run(s) in the store that pair under --trials "
                             f"{args.trials}; a pair needs two")
        if not pairs:
            raise UsageError("the store holds no two runs on one task; ingest runs, or name the pairs")
    for a, b in pairs:
        if a == b:
            raise UsageError(f"pair ({a}, {b}) names one run twice; a judge compares two runs")
        for run_id in (a, b):
            store.run(run_id)  # an unknown run is an error before any model call (StoreError names it)
    if args.runs or args.pairs is not None:
        return describe_pairs(pairs, store.run, "named")
    return selection


def _server_options(args: argparse.Namespace, config: Config, servers: list[str]) -> tuple[int, float]:
    """``--parallel`` and ``--timeout`` (or ``[judge] parallel`` / ``timeout``), which only apply to servers."""
    from kvjudge.errors import UsageError
    from kvjudge.judge.servers import DEFAULT_PARALLEL
    from kvjudge.server_client import DEFAULT_TIMEOUT_S

    if not servers:
        given = [flag for flag, value in (("--parallel", args.parallel), ("--timeout", args.timeout),
                                          ("--tokenizer-model", args.tokenizer_model)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} only apply to judge servers (--server URL)")
        return DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S
    if args.threads is not None:
        raise UsageError("--threads applies to the in-process judge; a server uses its own threads")
    parallel = args.parallel if args.parallel is not None else config.get("judge.parallel", int, DEFAULT_PARALLEL)
    timeout = args.timeout if args.timeout is not None else config.get("judge.timeout", (int, float),
                                                                       DEFAULT_TIMEOUT_S)
    if parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {parallel}")
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
    return parallel, float(timeout)


def open_judge(args: argparse.Namespace, config: Config, *, template: str | None = None) -> Any:
    """The Judge for a judging command: backend (not yet loaded), framing, held-out inputs, window planner.

    With judge servers (``--server`` …, ``[judge] servers`` / ``server``) the backend is a
    :class:`~kvjudge.judge.ServerPool` windowed from each server's ``kvjudge probe --server`` entry."""
    from kvjudge.judge import DEFAULT_MARGIN, Judge, WindowPlanner, open_backend, open_servers

    servers = judge_servers(args, config)
    parallel, timeout = _server_options(args, config, servers)
    margin = args.margin if args.margin is not None else config.get("judge.margin", (int, float), DEFAULT_MARGIN)
    template = template or args.template or config.get("judge.template", str, "auto")
    info("loading the judge backend…")
    if servers:
        backend = open_servers(servers, n_ctx=args.n_ctx, tokenizer_model=args.tokenizer_model, parallel=parallel,
                               timeout_s=timeout, staleness_days=staleness_days(args),
                               on_drop=lambda url, why: info(f"judge server {url} dropped: {why}"))
    else:
        backend = open_backend(model=args.model, n_ctx=args.n_ctx, threads=args.threads, config=config)
    planner = WindowPlanner(backend, requested=args.n_ctx, certify=not args.no_certify, say=info)
    try:
        return Judge(backend, margin=float(margin), show_grades=args.show_grades, show_verifier=args.show_verifier,
                     use_cache=not args.no_cache, template=template, planner=planner)
    except Exception:
        backend.close()
        raise
