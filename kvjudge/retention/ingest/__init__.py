"""Getting runs in: every format in :mod:`.registry` (kvjudge's native JSONL, OpenAI chat JSONL, mini-swe-agent
and SWE-agent trajectories and demonstrations, OpenHands output, event streams and conversation exports, Harbor
trials and ATIF, inspect_ai eval logs, Claude Code sessions, Codex CLI rollouts, Cline tasks, and formats other
packages add), with SWE-bench results, Harbor rewards and inspect scores as held-out grades.

Public API::

    from kvjudge.retention.ingest import ingest_paths, walk, ingest_sources, IngestReport, Format, formats
    report = ingest_paths(store, ["runs/", "more.jsonl.gz"], results=["model.run1.json"])

One module per job: :mod:`.format` (what a format declares) and :mod:`.registry` (every format, the one door),
:mod:`.sources` (files, directories, companions, ``.gz``, documents), one module per format (:mod:`.native`,
:mod:`.openai`, :mod:`.mini_swe_agent`, :mod:`.swe_agent`, :mod:`.openhands`, :mod:`.openhands_v1`,
:mod:`.harbor`, :mod:`.inspect_log`, :mod:`.claude_code`, :mod:`.codex`, :mod:`.openhands_export`,
:mod:`.cline`), :mod:`.swebench` (predictions and SWE-bench outcomes), the readers of inspect's logs
(:mod:`.inspect_reader`, over :mod:`.archive` for ``.eval`` zips and :mod:`.json_stream` for ``.json`` logs),
:mod:`.yaml_document` (YAML run files), :mod:`.results` (SWE-bench reports, Harbor results, inspect scores),
:mod:`.model` (the ParsedRun every parser builds), :mod:`.trials` (which documents are one run, which are trials
of one task), :mod:`.importer` (each file read once, written whole in batches), :mod:`.ahead` (a child process
parsing the files ahead of the writes) and :mod:`.bucket` (``s3://`` prefixes and objects downloaded into a folder
that mirrors their keys, then walked as a directory).
"""

from kvjudge.retention.ingest.bucket import StagedInputs, staged_inputs
from kvjudge.retention.ingest.format import Companion, Format
from kvjudge.retention.ingest.importer import IngestReport, detect_format, formats, ingest_paths, ingest_sources
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun
from kvjudge.retention.ingest.sources import Source, Walk, walk

__all__ = ["Companion", "DocumentError", "Format", "IngestReport", "ParseContext", "ParsedRun", "Source",
           "StagedInputs", "Walk", "detect_format", "formats", "ingest_paths", "ingest_sources", "staged_inputs",
           "walk"]
