"""Reading inspect_ai eval logs sample by sample, never whole: ``.eval`` archives and ``.json`` logs.

- ``.eval`` is a zip (read through :mod:`.archive`: bounded, CRC-checked, never extracted): ``header.json`` (the
  finished log's header: ``eval``, ``plan``, ``results``, ``stats``, ``status``) or, while the eval runs,
  ``_journal/start.json`` (``version``, ``eval``, ``plan``); one member per sample and epoch,
  ``samples/<id>_epoch_<epoch>.json``; sample summaries in ``summaries.json`` (or ``_journal/summaries/N.json``).
  Members are deflated by older inspect versions and zstd-compressed by newer ones.
- ``.json`` is the whole log as one object — ``version``, ``status``, ``eval``, ``plan``, ``results``, ``stats``,
  …, ``samples`` — read by :mod:`.json_stream`, one sample at a time.

Each sample is handed on decoded, as ``{"eval": <the eval spec's fields kvjudge reads>, "sample": <what kvjudge
reads of the sample>}`` (:func:`~.inspect_log.sample_for_import`; :mod:`.inspect_log` parses it). Bytes that are
not UTF-8 pass as lone surrogates, for the untrusted-text check to refuse or repair.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest.archive import Archive, iter_members
from kvjudge.retention.ingest.inspect_log import EVAL_FIELDS, sample_for_import
from kvjudge.retention.ingest.json_stream import JsonObjectStream

EVAL_SUFFIX = ".eval"
HEADER, START = "header.json", "_journal/start.json"
SAMPLES = "samples/"
SUMMARIES, JOURNAL_SUMMARIES = "summaries.json", "_journal/summaries/"
# How inspect's JSON log begins (pydantic writes the fields in order): enough to tell it from other JSON.
_JSON_LOG_HEAD = re.compile(rb'\A\s*\{\s*"version"\s*:\s*\d+\s*,\s*"status"\s*:\s*"')


#: How many first bytes of a file tell an inspect ``.json`` log (:func:`is_json_log_head`).
HEAD_BYTES = 256


def is_json_log(path: Path) -> bool:
    """An inspect ``.json`` log, by its first bytes."""
    try:
        with path.open("rb") as handle:
            return is_json_log_head(handle.read(HEAD_BYTES))
    except OSError:
        return False


def is_json_log_head(head: bytes) -> bool:
    """The first :data:`HEAD_BYTES` bytes of a file begin as inspect's ``.json`` logs do."""
    return _JSON_LOG_HEAD.match(head) is not None


def eval_samples(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(member, {"eval": spec, "sample": sample})`` for every sample member of an ``.eval`` archive."""
    with Archive(path) as archive:
        spec = _archive_spec(archive)
        for name in iter_members(archive, SAMPLES, ".json"):
            sample = _json(archive.read(name), archive.where(name))
            yield name, {"eval": spec, "sample": sample_for_import(sample)}


def json_log_samples(path: Path, handle: IO[bytes] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("$.samples[i]", {"eval": spec, "sample": decoded sample})`` for every sample of a ``.json`` log (read
    from ``handle`` at its start when given: a file already open)."""
    spec = None
    with path.open("rb") if handle is None else contextlib.nullcontext(handle) as stream:
        for key, index, value in JsonObjectStream(stream, str(path)).members("samples"):
            if key == "eval":
                spec = _spec(value, f"{path}: $.eval")
            elif key == "samples" and index is not None:
                if spec is None:
                    raise IngestError(f"{path}: $.samples comes before $.eval; kvjudge reads the eval spec first "
                                      f"(inspect writes it first)")
                yield f"$.samples[{index}]", {"eval": spec, "sample": sample_for_import(value)}


def sample_scores(path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(spec, {"id", "epoch", "scores"})`` for every sample of a log, for ``--results``: from the summaries of
    an ``.eval`` archive when it has them (small), else from its samples; from the samples of a ``.json`` log."""
    if path.suffix != EVAL_SUFFIX:
        for where, parts in json_log_samples(path):
            yield parts["eval"], _score_fields(parts["sample"], f"{path}: {where}")
        return
    with Archive(path) as archive:
        spec = _archive_spec(archive)
        names = ([SUMMARIES] if archive.has(SUMMARIES) else list(iter_members(archive, JOURNAL_SUMMARIES, ".json")))
        if names:
            for name in names:
                summaries = _json(archive.read(name), archive.where(name))
                if not isinstance(summaries, list):
                    raise IngestError(f"{archive.where(name)}: must be a list of sample summaries")
                for index, summary in enumerate(summaries):
                    yield spec, _score_fields(summary, f"{archive.where(name)}: $[{index}]")
            return
        for name in iter_members(archive, SAMPLES, ".json"):
            yield spec, _score_fields(_json(archive.read(name), archive.where(name)), archive.where(name))


def _archive_spec(archive: Archive) -> dict[str, Any]:
    for name in (HEADER, START):
        if archive.has(name):
            header = _json(archive.read(name), archive.where(name))
            if not isinstance(header, dict):
                raise IngestError(f"{archive.where(name)}: must be a JSON object")
            return _spec(header.get("eval"), f"{archive.where(name)}: $.eval")
    raise IngestError(f"{archive.path}: neither {HEADER} nor {START}: not an inspect eval log")


def _spec(value: Any, where: str) -> dict[str, Any]:
    if not (isinstance(value, dict) and isinstance(value.get("task"), str) and isinstance(value.get("model"), str)):
        raise IngestError(f"{where}: must be the eval spec, an object with string task and model")
    return {key: value[key] for key in EVAL_FIELDS if key in value}


def _score_fields(sample: Any, where: str) -> dict[str, Any]:
    if not (isinstance(sample, dict) and "id" in sample and isinstance(sample.get("epoch"), int)):
        raise IngestError(f"{where}: a sample needs its id and epoch")
    return {"id": sample["id"], "epoch": sample["epoch"], "scores": sample.get("scores"), "where": where}


def _json(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError) as exc:
        raise IngestError(f"{where}: not valid JSON ({str(exc).split(';')[0]})") from None
