"""The command-line front door.

Each subcommand lives in a module of :mod:`kvjudge.commands` that exposes ``register(subparsers)``;
this file only assembles them, runs the chosen one, and turns a :class:`~kvjudge.errors.KvjudgeError`
into one line on stderr and a non-zero exit (no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvjudge import __version__
from kvjudge.display import visible
from kvjudge.errors import KvjudgeError

# Order here is the order of `kvjudge --help`.
COMMAND_MODULES = (
    "kvjudge.commands.probe",
    "kvjudge.commands.cache",
    "kvjudge.commands.budget",
    "kvjudge.commands.ingest",
    "kvjudge.commands.runs",
    "kvjudge.commands.mark",
    "kvjudge.commands.grade",
    "kvjudge.commands.show",
    "kvjudge.commands.reduce",
    "kvjudge.commands.verify",
    "kvjudge.commands.tier",
    "kvjudge.commands.rehydrate",
    "kvjudge.commands.store",
    "kvjudge.commands.judge",
    "kvjudge.commands.score",
    "kvjudge.commands.eval",
    "kvjudge.commands.rank",
    "kvjudge.commands.select",
    "kvjudge.commands.report",
    "kvjudge.commands.demo",
    "kvjudge.commands.models",
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command`` (a command's name) the parser of that command alone, so a
    command pays only for its own imports (a listing never loads the judge's machinery). Each command module
    registers the command it is named after."""
    parser = argparse.ArgumentParser(
        prog="kvjudge",
        description="Probe what fits, budget tokens, reduce and tier agent runs, and judge them on your own hardware.",
    )
    parser.add_argument("--version", action="version", version=f"kvjudge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = [name for name in COMMAND_MODULES if name.rsplit(".", 1)[1] == command]
    for module_name in chosen or COMMAND_MODULES:
        # A command module that does not import is a broken install: fail loudly, never drop the command.
        module = importlib.import_module(module_name)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # A terminal that cannot encode some run text shows an escape for it rather than a traceback.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        build_parser().print_help()
        return 2
    try:
        result = args.func(args)
    except KvjudgeError as exc:
        message = " ".join(str(exc).split())  # one line, always; it may quote run text, so shown visibly
        print(f"kvjudge: error: {visible(message)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvjudge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
