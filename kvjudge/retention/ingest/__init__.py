"""Getting runs in: every format in :mod:`.registry` (kvjudge's native JSONL, OpenAI chat JSONL, mini-swe-agent
and SWE-agent trajectories, OpenHands output and event streams, Harbor trials and ATIF, inspect_ai eval logs,
Claude Code sessions, Codex CLI rollouts, and formats other packages add), with SWE-bench results, Harbor rewards
and inspect scores as held-out grades.

Public API::

    from kvjudge.retention.ingest import ingest_paths, walk, ingest_sources, IngestReport, Format, formats
    report = ingest_paths(store, ["runs/", "more.jsonl.gz"], results=["model.run1.json"])

One module per job: :mod:`.format` (what a format declares) and :mod:`.registry` (every format, the one door),
:mod:`.sources` (files, directories, companions, ``.gz``, documents), one module per format (:mod:`.native`,
:mod:`.openai`, :mod:`.mini_swe_agent`, :mod:`.swe_agent`, :mod:`.openhands`, :mod:`.openhands_v1`,
:mod:`.harbor`, :mod:`.inspect_log`, :mod:`.claude_code`, :mod:`.codex`), :mod:`.swebench` (predictions and
SWE-bench outcomes), the readers of inspect's logs (:mod:`.inspect_reader`, over :mod:`.archive` for ``.eval``
zips and :mod:`.json_stream` for ``.json`` logs), :mod:`.results` (SWE-bench reports, Harbor results, inspect
scores), :mod:`.model` (the ParsedRun every parser builds), :mod:`.importer` (each file read once, written
whole in batches) and :mod:`.ahead` (a child process parsing the files ahead of the writes).
"""

from kvjudge.retention.ingest.archive import Archive
from kvjudge.retention.ingest.harbor import parse_harbor, read_result
from kvjudge.retention.ingest.importer import (
    BATCH_BYTES,
    BATCH_RUNS,
    IngestReport,
    detect_format,
    formats,
    ingest_paths,
    ingest_sources,
    parse_document,
    stored_content_hash,
)
from kvjudge.retention.ingest.inspect_log import parse_inspect_sample, score_grade
from kvjudge.retention.ingest.model import DEFAULT_TENANT, DocumentError, ParseContext, ParsedRun
from kvjudge.retention.ingest.native import parse_native, schema
from kvjudge.retention.ingest.format import Companion, Format
from kvjudge.retention.ingest.sources import RUN_SUFFIXES, Document, Source, Walk, collect_sources, iter_documents, walk

__all__ = [
    "Archive", "parse_harbor", "parse_inspect_sample", "read_result", "score_grade",
    "BATCH_BYTES", "BATCH_RUNS", "DEFAULT_TENANT", "RUN_SUFFIXES", "Companion", "Document", "DocumentError",
    "Format", "IngestReport", "ParseContext", "ParsedRun", "Source", "Walk", "collect_sources", "detect_format",
    "formats", "ingest_paths", "ingest_sources", "iter_documents", "parse_document", "parse_native", "schema",
    "stored_content_hash", "walk",
]
