"""SWE-bench's own files as kvjudge reads them: predictions (a harness's final patches, ``{instance_id,
model_name_or_path, model_patch}``), and outcomes as held-out grades — what a resolution means as a grade, and
how an OpenHands evaluation report (``test_result.report``) reads as one. Shared by the SWE-agent and OpenHands
parsers and the results reader (:mod:`.results`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError

GRADER = "swe-bench"
RESOLVED = {"grader": GRADER, "score": 1.0, "label": "resolved"}
UNRESOLVED = {"grader": GRADER, "score": 0.0, "label": "unresolved"}


def openhands_report_grade(report: dict[str, Any]) -> dict[str, Any] | None:
    """The grade an OpenHands evaluation ``report`` gives (None: the evaluation errored or timed out).

    Raises ValueError naming the field that is wrong."""
    resolved = report.get("resolved")
    if not isinstance(resolved, bool):
        raise ValueError("resolved must be true or false")
    for flag in ("error_eval", "test_timeout"):
        if report.get(flag) not in (None, True, False):
            raise ValueError(f"{flag} must be true or false")
    if report.get("error_eval") or report.get("test_timeout"):
        return None
    return RESOLVED if resolved else UNRESOLVED


def read_predictions(path: Path) -> dict[str, dict[str, str]]:
    """Predictions — JSONL (SWE-agent's ``all_preds.jsonl``, one per line) or one JSON object of instance id →
    prediction (``preds.json``) — as instance id → ``{"model", "patch"}`` (the patch: ``model_patch``, else
    OpenHands' ``git_patch``); IngestError naming the file (and line) where it is not predictions."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise IngestError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        if path.name.endswith(".jsonl"):
            rows = [(f"{path}:{number}", json.loads(line)) for number, line in enumerate(raw.splitlines(), start=1)
                    if line.strip()]
        else:
            data = json.loads(raw)
            rows = [(f"{path}: ${json.dumps([key])}", value) for key, value in data.items()] \
                if isinstance(data, dict) else [(str(path), data)]
    except ValueError as exc:
        raise IngestError(f"{path}: not valid JSON ({str(exc).split(';')[0]}); is it a complete predictions "
                          f"file?") from None
    found = {}
    for where, row in rows:
        patch = row.get("model_patch", row.get("git_patch", "")) if isinstance(row, dict) else None
        if not (isinstance(row, dict) and isinstance(row.get("instance_id"), str) and isinstance(patch, str | None)):
            raise IngestError(f"{where}: a prediction needs its instance_id and model_patch (SWE-bench's "
                              f"predictions format)")
        model = row.get("model_name_or_path")
        found[row["instance_id"]] = {"model": model if isinstance(model, str) else "", "patch": patch or ""}
    return found
