"""Writing JSON Lines files: kvjudge's native run files, OpenHands ``output.jsonl``, OpenAI chat lines."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_jsonl(path: str | Path, lines: Iterable[dict[str, Any]]) -> Path:
    """Write ``lines`` one JSON object per line (as ``json.dumps(line) + "\\n"``), creating the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")
    return path
