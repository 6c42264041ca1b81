"""inspect_ai eval logs written as inspect writes them: ``.eval`` archives (``header.json``,
``_journal/start.json``, ``_journal/summaries/N.json``, ``summaries.json``, ``reductions.json`` and one
``samples/<id>_epoch_<epoch>.json`` per sample; members zstd-compressed as newer inspect versions write them, or
deflated as older ones did) and ``.json`` logs (the whole log as one object, pretty-printed).

Samples are condensed as inspect condenses them: text over 100 characters in the events becomes an
``attachment://<hash>`` reference into the sample's ``attachments``; messages keep their text. A model event's
``output`` carries the assistant message it produced (by id) and that call's usage (``input_tokens`` without
the cache reads, counted apart). Each sample tells a :class:`~kvjudge.testing.trajectories.Episode`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import zstandard

from kvjudge.testing.trajectories import Episode

ZIP_ZSTANDARD = 93
SYSTEM = ("You are a helpful assistant attempting to submit the correct answer. You have several functions "
          "available to help with finding the answer. Each message may perform one function call.")


def eval_spec(task: str, model: str, *, solver: str | None = None, epochs: int = 1, samples: int = 1) -> dict[str, Any]:
    """An ``EvalSpec`` as inspect writes it."""
    spec: dict[str, Any] = {
        "eval_id": f"{hashlib.md5(f'{task}{model}'.encode()).hexdigest()[:22]}",
        "run_id": "Yx3JpQe8bNq7Kd2sUvW4Lm", "created": "2025-11-03T09:12:44+00:00", "task": task,
        "task_id": "gP4kR8sT2vX6yZ9aB3cD5e", "task_version": 0, "task_file": f"{task}.py", "task_attribs": {},
        "task_args": {}, "dataset": {"name": task, "location": f"{task}.jsonl", "samples": samples,
                                     "shuffled": False},
        "model": model, "model_generate_config": {}, "model_args": {},
        "config": {"epochs": epochs, "epochs_reducer": ["mean"], "fail_on_error": True, "sandbox_cleanup": True,
                   "log_samples": True, "log_images": True, "score_display": True},
        "revision": {"type": "git", "origin": "https://github.com/example/evals.git", "commit": "3f9a2c1"},
        "packages": {"inspect_ai": "0.3.140"},
        "scorers": [{"name": "includes", "options": {}, "metrics": [{"name": "inspect_ai/accuracy", "options": {}}]}]}
    if solver is not None:
        spec["solver"] = solver
        spec["solver_args"] = {}
    return spec


def sample(episode: Episode, sample_id: int | str, epoch: int, *, model: str, score: Any = "C",
           error: str | None = None) -> dict[str, Any]:
    """An ``EvalSample`` telling ``episode``: a bash tool call per step, then the answer (``score`` None: not
    scored)."""
    attachments: dict[str, str] = {}
    messages: list[dict[str, Any]] = [
        {"id": f"sys-{sample_id}", "content": SYSTEM, "source": "input", "role": "system"},
        {"id": f"in-{sample_id}", "content": episode.problem_statement, "source": "input", "role": "user"}]
    events: list[dict[str, Any]] = [{"event": "sample_init", "timestamp": "2025-11-03T09:12:45+00:00",
                                     "sample": {"input": episode.problem_statement, "target": "a,b",
                                                "id": sample_id}, "state": {}}]
    for index, step in enumerate(episode.steps):
        call_id = f"call_{sample_id}_{epoch}_{index}"
        assistant = {"id": f"msg-{sample_id}-{epoch}-{index}", "content": [
            {"type": "reasoning", "reasoning": step.thought, "redacted": False},
            {"type": "text", "text": f"Running `{step.command}`."}], "source": "generate", "role": "assistant",
            "tool_calls": [{"id": call_id, "function": "bash", "arguments": {"cmd": step.command},
                            "type": "function"}], "model": model.split("/", 1)[-1]}
        messages.append(assistant)
        events.append(_model_event(assistant, index, attachments, model))
        messages.append({"id": f"tool-{sample_id}-{epoch}-{index}", "content": step.output, "role": "tool",
                         "tool_call_id": call_id, "function": "bash",
                         **({"error": {"type": "unknown", "message": "exit status 1"}} if step.returncode else {})})
        events.append({"event": "tool", "type": "function", "id": call_id, "function": "bash",
                       "arguments": {"cmd": step.command}, "result": _attach(step.output, attachments),
                       "events": [], "completed": "2025-11-03T09:13:00+00:00", "working_time": 0.8})
    final = {"id": f"msg-{sample_id}-{epoch}-final", "content": "ANSWER: a,b", "source": "generate",
             "role": "assistant", "model": model.split("/", 1)[-1]}
    messages.append(final)
    events.append(_model_event(final, len(episode.steps), attachments, model))
    record: dict[str, Any] = {
        "id": sample_id, "epoch": epoch, "input": episode.problem_statement, "target": "a,b", "messages": messages,
        "output": {"model": model.split("/", 1)[-1], "choices": [{"message": final, "stop_reason": "stop"}],
                   "usage": _usage(len(episode.steps)), "time": 1.2},
        "metadata": {"repo": episode.instance_id}, "store": {}, "events": events,
        "model_usage": {model: _usage(len(episode.steps))}, "total_time": 31.5, "working_time": 29.9,
        "uuid": f"uuid-{sample_id}-{epoch}", "attachments": attachments}
    if score is not None:
        record["scores"] = {"includes": {"value": score, "answer": "a,b", "explanation": "ANSWER: a,b"}}
    if error is not None:
        record["error"] = {"message": error, "traceback": f"Traceback (most recent call last):\n{error}\n",
                           "traceback_ansi": error}
    return record


def _usage(index: int) -> dict[str, int]:
    return {"input_tokens": 1_300 + 500 * index, "output_tokens": 60 + index, "total_tokens": 2_460 + 901 * index,
            "input_tokens_cache_read": 1_100 + 400 * index}


def _model_event(message: dict[str, Any], index: int, attachments: dict[str, str], model: str) -> dict[str, Any]:
    condensed = dict(message)
    if isinstance(message["content"], list):
        condensed["content"] = [{**part, **({"text": _attach(part["text"], attachments)} if "text" in part else {})}
                                for part in message["content"]]
    else:
        condensed["content"] = _attach(message["content"], attachments)
    return {"event": "model", "timestamp": "2025-11-03T09:12:50+00:00", "model": model, "input_refs": [[0, 2 * index + 2]],
            "tools": [{"name": "bash", "description": "Run a bash command.", "parameters": {"type": "object"}}],
            "tool_choice": "auto", "config": {},
            "output": {"model": model.split("/", 1)[-1], "choices": [{"message": condensed, "stop_reason": "tool_calls"}],
                       "usage": _usage(index), "time": 1.1},
            "completed": "2025-11-03T09:12:51+00:00", "working_time": 1.1}


def _attach(text: str, attachments: dict[str, str]) -> str:
    if len(text) <= 100:
        return text
    key = hashlib.md5(text.encode()).hexdigest()
    attachments[key] = text
    return f"attachment://{key}"


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The ``EvalSampleSummary`` of a sample."""
    return {key: record[key] for key in ("id", "epoch", "input", "target", "scores", "model_usage", "total_time",
                                         "working_time", "uuid") if key in record} | {"completed": True}


def header(spec: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The log's header (``header.json``, and the head of a ``.json`` log)."""
    return {"version": 2, "status": "success", "eval": spec,
            "plan": {"name": "plan", "steps": [{"solver": spec.get("solver", "basic_agent"), "params": {}}],
                     "config": {}},
            "results": {"total_samples": len(samples), "completed_samples": len(samples),
                        "scores": [{"name": "includes", "scorer": "includes", "scored_samples": len(samples),
                                    "unscored_samples": 0, "params": {},
                                    "metrics": {"accuracy": {"name": "accuracy", "value": 0.5, "params": {}}}}]},
            "stats": {"started_at": "2025-11-03T09:12:44+00:00", "completed_at": "2025-11-03T09:40:02+00:00",
                      "model_usage": {spec["model"]: _usage(10)}}}


def write_eval(path: Path, spec: dict[str, Any], samples: list[dict[str, Any]], *, compression: str = "zstd",
               finished: bool = True, members: dict[str, bytes] | None = None) -> Path:
    """An ``.eval`` archive: ``compression`` "zstd" (newer inspect) or "deflate" (older); ``finished`` False
    leaves out ``header.json`` and ``summaries.json`` (a log still running). ``members`` adds raw members."""
    content: dict[str, bytes] = {"_journal/start.json": _dump({"version": 2, "eval": spec,
                                                               "plan": header(spec, samples)["plan"]})}
    for record in samples:
        content[f"samples/{record['id']}_epoch_{record['epoch']}.json"] = _dump(record)
    content["_journal/summaries/1.json"] = _dump([summary(r) for r in samples])
    if finished:
        content["summaries.json"] = _dump([summary(r) for r in samples])
        content["reductions.json"] = _dump([{"scorer": "includes", "reducer": "mean", "samples": [
            {"value": 1.0, "sample_id": r["id"]} for r in samples]}])
        content["header.json"] = _dump(header(spec, samples))
    content.update(members or {})
    if compression == "deflate":
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=5) as archive:
            for name, data in content.items():
                archive.writestr(name, data)
    else:
        ZstdZip(path).write(content)
    return path


def write_json_log(path: Path, spec: dict[str, Any], samples: list[dict[str, Any]]) -> Path:
    """A ``.json`` log: the header's fields, then ``samples``, then ``reductions`` (indent 2, as inspect)."""
    log = {**header(spec, samples), "samples": samples,
           "reductions": [{"scorer": "includes", "samples": [{"value": 1.0, "sample_id": r["id"]} for r in samples]}]}
    path.write_text(json.dumps(log, indent=2))
    return path


def _dump(value: Any) -> bytes:
    return json.dumps(value, indent=2).encode("utf-8")


class ZstdZip:
    """A zip archive whose members are zstd-compressed (method 93), written field by field (APPNOTE 4.3): what
    inspect writes through its zipfile patch, which Python's zipfile cannot write before 3.14.

    ``declared_size`` (member → size) writes a size other than the real one, for corrupt archives."""

    def __init__(self, path: Path, declared_size: dict[str, int] | None = None) -> None:
        self.path = path
        self.declared_size = declared_size or {}

    def write(self, members: dict[str, bytes | list[bytes]]) -> None:
        """``members``: name → bytes, or a list of chunks compressed as one stream (large members)."""
        central = b""
        with self.path.open("wb") as out:
            for name, data in members.items():
                chunks = data if isinstance(data, list) else [data]
                compressor = zstandard.ZstdCompressor(level=3).compressobj()
                crc, size, packed = 0, 0, b""
                for chunk in chunks:
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
                    packed += compressor.compress(chunk)
                packed += compressor.flush()
                size = self.declared_size.get(name, size)
                encoded = name.encode("utf-8")
                offset = out.tell()
                out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 63, 0x800, ZIP_ZSTANDARD, 0, 0x21, crc,
                                      len(packed), size, len(encoded), 0) + encoded + packed)
                central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 63, 63, 0x800, ZIP_ZSTANDARD, 0, 0x21, crc,
                                       len(packed), size, len(encoded), 0, 0, 0, 0, 0o644 << 16, offset) + encoded
            start = out.tell()
            out.write(central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members),
                                            len(central), start, 0))
