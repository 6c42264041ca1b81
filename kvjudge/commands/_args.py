"""The argparse pieces commands share, and what their flags become: :class:`~kvjudge.settings.Settings` (file,
environment, then flags) and the judge target. What only judging commands add (their flags, their judge, the
pairs they were given) is in :mod:`kvjudge.commands._judging`.

A group of options that sets settings records which (``settings_flags`` in the parsed arguments), so
:func:`settings_from` applies exactly the flags a command has, and an error names the flag a bad value came from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kvjudge.commands._output import info
from kvjudge.errors import UsageError
from kvjudge.retention.shared_job import check_lease
from kvjudge.retention.store.interfaces import JobView
from kvjudge.settings import Settings
from kvjudge.target import JudgeTarget

# A flag that sets a setting: argparse dest → (the setting's dotted key, the flag as a user writes it).
SETTING_FLAGS: dict[str, tuple[str, str]] = {
    "store": ("store.url", "--store"),
    "to": ("retention.cold", "--to"),
    "backend": ("judge.backend", "--backend"),
    "tokenizer_model": ("judge.tokenizer_model", "--tokenizer-model"),
    "parallel": ("judge.parallel", "--parallel"),
    "timeout": ("judge.timeout", "--timeout"),
    "margin": ("judge.margin", "--margin"),
    "template": ("judge.template", "--template"),
    "threads": ("judge.threads", "--threads"),
    "api_key_env": ("judge.api_key_env", "--api-key-env"),
    "protocol": ("judge.protocol", "--protocol"),
    "levels": ("judge.levels", "--levels"),
    "repeats": ("judge.repeats", "--repeats"),
    "rubric": ("judge.rubric", "--rubric"),
    "jury": ("judge.jury", "--jury"),
    "memory_budget": ("probe.memory_budget", "--memory-budget"),
    "lease": ("store.lease_seconds", "--lease"),
}
# --model and --server choose the judge: --server URL (repeatable) the pool, --model PATH the local GGUF (then no
# configured server applies); with both (`reduce`, `tier`), --model is a local copy of the served GGUF to count with.
JUDGE_CHOICE = ("model", "server")
# Options that mean something only to judge servers (checked once the settings say whether there are any).
_SERVER_ONLY = ("parallel", "timeout", "tokenizer_model")


Run = Callable[[argparse.Namespace], int]
AddArgs = Callable[[argparse.ArgumentParser], None]


@contextlib.contextmanager
def command(subparsers: argparse._SubParsersAction, name: str, run: Run, *, help: str,
            shared: Sequence[AddArgs] = ()) -> Iterator[argparse.ArgumentParser]:
    """Add the subcommand ``name``, carried out by ``run``, whose docstring is its ``--help`` description (argparse
    wraps it). The block adds the command's own options; after them come the ``shared`` groups (``add_store_args``,
    ``add_endpoint_args``, …) and the output options every command has (:func:`add_output_args`)."""
    parser = subparsers.add_parser(name, help=help, description=run.__doc__)
    yield parser
    for add in shared:
        add(parser)
    add_output_args(parser)
    parser.set_defaults(func=run)


def records_settings(parser: argparse.ArgumentParser, *dests: str) -> None:
    """Note that ``dests`` (options just added to ``parser``) set settings (see :data:`SETTING_FLAGS`)."""
    parser.set_defaults(settings_flags=(*(parser.get_default("settings_flags") or ()), *dests))


def add_api_key_args(parser: argparse.ArgumentParser) -> None:
    """``--api-key-env NAME`` (every command that talks to judge servers)."""
    parser.add_argument("--api-key-env", metavar="NAME",
                        help="the environment variable holding the judge servers' API key, sent as a bearer token "
                             "(default: [judge] api_key_env; the key itself is never a flag or a setting)")
    records_settings(parser, "api_key_env")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--raw`` and ``--config`` (every subcommand has all three)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    parser.add_argument("--raw", action="store_true",
                        help="print run text as stored, terminal escape sequences included (default: control "
                             "characters shown visibly, e.g. ␛[31m)")
    parser.add_argument("--config", metavar="PATH", help="config file (default: ./kvjudge.toml)")


def add_store_args(parser: argparse.ArgumentParser) -> None:
    """``--store PATH|URL`` (every command that reads or writes the run store)."""
    parser.add_argument("--store", metavar="PATH|URL",
                        help="store file or postgresql://user@host:port/dbname URL (default: KVJUDGE_STORE, "
                             "[store] url, [retention] store, else <data dir>/store.sqlite)")
    records_settings(parser, "store")


def add_lease_args(parser: argparse.ArgumentParser) -> None:
    """``--lease S`` (commands whose work several processes may share: each claims a unit before doing it)."""
    parser.add_argument("--lease", type=float, metavar="S",
                        help="seconds a claim on a unit of work lives unrenewed (default: [store] lease_seconds, "
                             "else 900): processes started at once on one store share its work, and a killed one's "
                             "units are taken over once its leases expire; at least the calls' --timeout")
    records_settings(parser, "lease")


def job_line(what: str, view: JobView) -> str:
    """A progress bar's description of a shared job: done by anyone (here), claimed by live workers, free."""
    return (f"{what} · job {view.done}/{view.units} done ({view.done_here} here) · {view.claimed} claimed by "
            f"{view.workers} worker(s) · {view.free} free")


def add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    """``--endpoint-url URL`` (commands that reach an S3 cold store)."""
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3 endpoint for new moves (default: [retention] endpoint_url, else AWS_ENDPOINT_URL / "
                             "AWS config); a tiered run is read where its log says it went, and this overrides "
                             "that only when the store at URL holds the same manifest (the store moved)")


# The shared groups of a command that reads runs, tiered ones too: they are read where their moves went
# (--endpoint-url: the store moved).
READS_TIERED: tuple[AddArgs, ...] = (add_store_args, add_endpoint_args)


def add_results_args(parser: argparse.ArgumentParser) -> None:
    """``--results [AGENT=]FILE`` (``ingest`` and ``grade``: evaluation results as held-out grades)."""
    parser.add_argument("--results", metavar="[AGENT=]FILE", action="append", default=[],
                        help="evaluation results as held-out grades: a SWE-bench summary report, per-instance "
                             "report.json files, OpenHands output.swebench_eval.jsonl, Harbor result.json files, "
                             "inspect logs (a directory is searched); repeatable")


def add_ceiling_args(parser: argparse.ArgumentParser) -> None:
    """``--ceiling``, ``--capabilities``, ``--model``, ``--server``: what a run's effective ceiling is computed from."""
    parser.add_argument("--ceiling", type=int, metavar="N",
                        help="lower the configured ceiling to N tokens (the hardware bound still applies)")
    parser.add_argument("--capabilities", metavar="FILE",
                        help="capability cache file (e.g. copied from the judge host; default: in the cache dir)")
    parser.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model or the default "
                                                        "judge model); with --server: a local copy of the served "
                                                        "GGUF to count tokens with")
    parser.add_argument("--server", metavar="URL", action="append",
                        help="the judge is this OpenAI-compatible server (repeat for a pool: the smallest served "
                             "context bounds the ceiling): the ceiling comes from its `kvjudge probe --server` "
                             "entry, probed on first use (default: [judge] servers / server, unless --model is "
                             "given)")
    parser.add_argument("--tokenizer-model", metavar="PATH",
                        help="with --server: a local copy of the served GGUF, to count tokens without the server "
                             "(default: [judge] tokenizer_model)")
    records_settings(parser, *JUDGE_CHOICE, "tokenizer_model")
    add_api_key_args(parser)


# ------------------------------------------------------------------------------------- settings and target
def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of a command: its ``--config`` file (else ``KVJUDGE_CONFIG``, else ``./kvjudge.toml``), then the
    flags it was given; a bad value is one line naming the flag."""
    settings = Settings.load(getattr(args, "config", None))
    dests = getattr(args, "settings_flags", None) or ()
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for dest in dests:
        if dest in SETTING_FLAGS and getattr(args, dest, None) is not None:
            key, flag = SETTING_FLAGS[dest]
            values[key], names[key] = getattr(args, dest), flag
    unset: tuple[str, ...] = ()
    if "model" in dests:
        model, servers = getattr(args, "model", None), getattr(args, "server", None)
        servers = [servers] if isinstance(servers, str) else servers
        if servers:
            values["judge.servers"], names["judge.servers"] = tuple(servers), "--server"
            unset = ("judge.server",)
            if model and "judge.tokenizer_model" not in values:
                values["judge.tokenizer_model"], names["judge.tokenizer_model"] = model, "--model"
        elif model:
            values["judge.model"], names["judge.model"] = model, "--model"
            unset = ("judge.server", "judge.servers")
        if (servers or model) and getattr(args, "backend", None) is None:
            unset = (*unset, "judge.backend")  # --server / --model choose the judge as they always did
    settings = settings.with_overrides(values, names, unset=unset)
    _check_server_flags(args, dests, settings)
    if "lease" in dests:  # before any store is opened: nothing written
        check_lease(settings.store.lease_seconds, JudgeTarget(settings).call_timeout)
    return settings


def _check_server_flags(args: argparse.Namespace, dests: tuple[str, ...], settings: Settings) -> None:
    given = [SETTING_FLAGS[dest][1] for dest in _SERVER_ONLY if dest in dests and getattr(args, dest) is not None]
    threads = "threads" in dests and args.threads is not None
    if not given and not threads:
        return
    served = bool(JudgeTarget(settings).servers)  # the kind [judge] backend names decides, not the URLs alone
    if not served and given:
        raise UsageError(f"{', '.join(given)} only apply to judge servers (--server URL)")
    if served and threads:
        raise UsageError("--threads applies to the in-process judge; a server uses its own threads")


def target_from(args: argparse.Namespace, *, ceiling: int | None = None,
                settings: Settings | None = None) -> JudgeTarget:
    """The judge target of a command: its settings, ``--capabilities`` and ``--endpoint-url`` (where it has them),
    a lowered ``ceiling``, notes on stderr. Its :meth:`~kvjudge.target.JudgeTarget.open_store` reads tiered runs
    through its cold stores."""
    return JudgeTarget.resolve(settings or settings_from(args), capabilities=getattr(args, "capabilities", None),
                               ceiling=ceiling, endpoint_url=getattr(args, "endpoint_url", None), say=info)


# ------------------------------------------------------------------------------------------------- pairs
def jsonl_objects(path: str, what: str, hint: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file, with their line numbers; one-line errors name the file and line.

    ``what`` names the file in errors ("pairs file"), ``hint`` says what a line holds.
    """
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
