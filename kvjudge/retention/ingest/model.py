"""What every format's parser builds: a :class:`ParsedRun` — bodies to put, events to append.

Parsers are pure: one decoded JSON document in, one ParsedRun out, or a :class:`DocumentError` naming the JSON
path of what is wrong. Text never enters an event; events carry ``sha256:`` refs (hashed once, here).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import canonical_json, content_hash
from kvjudge.retention.lifecycle import GRADED, GRADING, UNGRADED

DEFAULT_TENANT = "default"
ROLES = ("system", "developer", "user", "assistant", "tool")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


#: A JSON path: its text (``$.messages[3]``), or the parts to join into it only when an error needs it
#: (``("$.messages", 3, "content")``) — parsers walk every message, and most documents are fine.
JsonPath = str | tuple[str | int, ...]


class DocumentError(Exception):
    """A problem in one JSON document: ``path`` is its JSON path (``$.messages[3].content``)."""

    def __init__(self, path: JsonPath, message: str) -> None:
        path = path if isinstance(path, str) else jpath(*path)
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def jpath(base: str | int, *keys: str | int) -> str:
    """``base`` extended by object keys and array indexes: ``jpath("$", "messages", 3)`` → ``$.messages[3]``."""
    out = str(base)
    for key in keys:
        out += _segment(key)
    return out


@functools.lru_cache(maxsize=4096)
def _segment(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    return f".{key}" if _IDENTIFIER.match(key) else f"[{canonical_json(key)}]"


def need(cond: bool, path: JsonPath, message: str) -> None:
    """Raise DocumentError(path, message) unless ``cond``."""
    if not cond:
        raise DocumentError(path, message)


def get_field(obj: Any, key: str, path: JsonPath, kinds: type | tuple[type, ...], what: str, *,
              required: bool = True) -> Any:
    """``obj[key]`` checked against ``kinds`` (bool is never an int here); None when absent and not required."""
    value = obj.get(key)
    if value is None:
        if required:
            raise DocumentError(subpath(path, key), f"missing ({what} expected)")
        return None
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
        raise DocumentError(subpath(path, key), f"must be {what}, not {_kind(value)}")
    return value


def subpath(path: JsonPath, *keys: str | int) -> JsonPath:
    """``path`` extended by ``keys``, still unjoined (see :data:`JsonPath`)."""
    return (path, *keys) if isinstance(path, str) else (*path, *keys)


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]…`` through nested objects, None where any level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def as_object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (for optional blocks such as ``model_stats``)."""
    return value if isinstance(value, dict) else {}


def scalars(values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are JSON scalars and not None (run metadata is a flat map)."""
    return {k: v for k, v in values.items() if isinstance(v, str | int | float | bool) and v is not None}


def with_marker(message: str, prompt: str | None, marker: str) -> str:
    """``message`` with its first occurrence of ``prompt`` replaced by ``marker`` — reversibly.

    The task prompt is stored once as the run's prompt; the message around it (the harness's instance
    template) then reads the same in every run and is stored once. ``message`` is kept whole when the prompt
    is not in it or the marker already is (the replacement could not be undone).
    """
    if not prompt or marker in message or prompt not in message:
        return message
    return message.replace(prompt, marker, 1)


@dataclass
class ParsedRun:
    """One run ready to write: bodies (ref → bytes, put first) and events (appended in order).

    ``grading_open``: the format does not say how the run was graded, so the importer settles it
    (with a held-out grade from ``--results`` → graded, else ungraded). ``body_bytes`` counts every body
    occurrence, so ``body_bytes`` minus the bytes a write really stored is what deduplication saved.
    """

    run_id: str
    tenant: str
    fmt: str
    task_id: str | None = None
    agent: str | None = None
    trial: str | None = None
    bodies: dict[str, bytes] = field(default_factory=dict)
    body_bytes: int = 0
    events: list[ev.Event] = field(default_factory=list)
    grading_open: bool = False
    hashing: bool = True  # False: a parse that only names the run (no bodies kept, refs left empty)
    grade: dict[str, Any] | None = None
    content_hash: str | None = None
    #: The harness's own ids for this run, best first (an inspect eval's run id): what tells it apart from another
    #: run of the same agent on the same task, where the harness names no trial (:mod:`.trials`).
    marks: tuple[str, ...] = ()
    #: The document names this run itself — its id (kvjudge's native format), or a trial that is the harness's own
    #: identity for it (a session, a Harbor trial, an inspect eval): other work under that id is the run changed,
    #: refused, never made a trial of its own (:mod:`.trials`).
    named: bool = False
    _seq: dict[str, int] = field(default_factory=dict)

    def body_ref(self, text: str | None) -> str | None:
        """Register ``text`` as a body and return its ref (None stays None)."""
        if text is None:
            return None
        if not self.hashing:
            return ""
        raw = text.encode("utf-8")
        ref = ref_of(raw)
        self.bodies.setdefault(ref, raw)
        self.body_bytes += len(raw)
        return ref

    def start(self, *, task_id: str | None, prompt: str | None, metadata: dict[str, Any] | None = None,
              trial: str | None = None) -> None:
        """The RunStarted event, first in the events and its prompt first in the bodies, whenever it is called (a
        parser that learns the prompt or the metadata only from the last step calls it then). ``trial`` names which
        of several runs of one agent on one task this is."""
        self.task_id = task_id
        self.trial = trial
        earlier = self.bodies
        if earlier:
            self.bodies = {}
        started = ev.RunStarted(run=self.run_id, tenant=self.tenant, task_id=task_id,
                                task_prompt_ref=self.body_ref(prompt), agent=self.agent,
                                metadata=metadata or None, trial=trial)
        if earlier:
            self.bodies.update(earlier)  # a ref already met keeps the prompt's place
        self.events.insert(0, started)

    def branch(self, branch_id: str, status: str = "live", parent: str | None = None,
               fork_at: int | None = None) -> str:
        self._seq[branch_id] = 0
        self.events.append(ev.BranchOpened(run=self.run_id, branch=branch_id, status=status, parent=parent,
                                           fork_at=fork_at))
        return branch_id

    def transitions(self, branch_id: str) -> int:
        """How many transitions ``branch_id`` holds so far (where a branch forking from it now forks)."""
        return self._seq[branch_id]

    def step(self, branch_id: str, role: str, *, text: str | None = None,
             call: tuple[str, Any] | None = None, output: tuple[str | None, str | None, int | None] | None = None,
             usage: dict[str, int] | None = None, context: dict[str, int] | None = None) -> int:
        """Append one transition: ``call`` = (tool name, arguments), ``output`` = (tool name, text, exit code).

        Structured arguments are kept as their canonical JSON text. Returns the transition's seq.
        """
        seq = self._seq[branch_id]
        self._seq[branch_id] = seq + 1
        tool_call = None
        if call is not None:
            name, arguments = call
            if arguments is not None and not isinstance(arguments, str):
                arguments = canonical_json(arguments)
            tool_call = {"name": name, "arguments_ref": self.body_ref(arguments)}
        tool_output = None
        if output is not None:
            name, text_out, exit_code = output
            tool_output = {"name": name, "output_ref": self.body_ref(text_out), "exit_code": exit_code}
        self.events.append(ev.TransitionRecorded(
            run=self.run_id, branch=branch_id, seq=seq, role=role, text_ref=self.body_ref(text),
            tool_call=tool_call, tool_output=tool_output, usage=usage, context=context))
        return seq

    def settle(self, grade: dict[str, Any] | None) -> str:
        """Append the settling events (see :func:`settle_events`) and record the content hash in RunStarted;
        returns the hash."""
        self.grade = grade if self.grading_open else None
        self.events.extend(settle_events(self.run_id, self.grading_open, grade))
        digest = content_hash(self.events)
        self.content_hash = digest
        self.events[0] = dataclasses.replace(self.events[0], content_hash=digest)
        return digest


def settle_events(run_id: str, grading_open: bool, grade: dict[str, Any] | None) -> list[ev.Event]:
    """The events that finish a run whose grading is open: grading → graded (with ``grade``) or ungraded.
    Nothing for a run whose document said its own lifecycle."""
    if not grading_open:
        return []
    settled: list[ev.Event] = [ev.StateChanged(run=run_id, state=GRADING)]
    if grade is not None:
        settled.append(ev.GradeRecorded(run=run_id, grade=grade))
    settled.append(ev.StateChanged(run=run_id, state=GRADED if grade is not None else UNGRADED))
    return settled


@dataclass(frozen=True)
class ParseContext:
    """What a parser knows beyond the document: overrides from the command line and the file's name."""

    tenant: str | None = None
    agent: str | None = None  # --agent: overrides the agent named by the document
    default_instance: str | None = None  # from the file name (``<instance>.traj.json``) when the document has none
    hashing: bool = True  # False: names the run only (the pass --results may need); see ParsedRun.hashing
    repair_text: bool = False  # text that is not Unicode: stored as U+FFFD and noted (else refused)
    trial: str | None = None  # --trial: which run of an agent on an instance this is, for formats that name none

    def with_trial(self, run_id: str) -> str:
        """The id of a run whose format names no trial (SWE-bench trajectories): ``<run_id>/<LABEL>`` under
        ``--trial LABEL``, so a repeated run of an agent on an instance is a run of its own."""
        return f"{run_id}/{self.trial}" if self.trial is not None else run_id

    def new_run(self, run_id: str, fmt: str, *, agent: str | None = None, tenant: str | None = None,
                grading_open: bool = False) -> ParsedRun:
        """An empty ParsedRun: ``--agent`` wins over ``agent``; ``tenant`` (the document's) over ``--tenant``."""
        return ParsedRun(run_id=run_id, tenant=tenant or self.tenant or DEFAULT_TENANT, fmt=fmt,
                         agent=self.agent or agent, grading_open=grading_open, hashing=self.hashing)


def task_from_prompt(prompt: str | None, workdir: str | None) -> str | None:
    """The task of a session that names none (Claude Code, Codex CLI, OpenHands conversations): the folder it ran
    in and a digest of its first prompt, ``<folder>/<sha256[:12]>`` — so two agents given the same prompt in the
    same project (or two sessions of one agent) are runs of one task, whichever tool recorded them."""
    if not prompt:
        return None
    folder = workdir.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] if isinstance(workdir, str) and workdir else ""
    digest = hashlib.sha256(prompt.strip().encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{folder or 'session'}/{digest}"


def usage_of(response_usage: Any) -> dict[str, int] | None:
    """Token usage of one model call (OpenAI chat or Responses API shape) as ``input_tokens``/``output_tokens``."""
    if not isinstance(response_usage, dict):
        return None
    found = {}
    for ours, theirs in (("input_tokens", ("prompt_tokens", "input_tokens")),
                         ("output_tokens", ("completion_tokens", "output_tokens"))):
        for key in theirs:
            value = response_usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                found[ours] = value
                break
    return found or None


def content_text(content: Any, path: JsonPath) -> str | None:
    """Message content as text: a string, null, or a list of parts (text parts joined; others named)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DocumentError(path, f"must be a string, null or a list of content parts, not {_kind(content)}")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict):
            raise DocumentError(subpath(path, index), f"must be a content part object, not {_kind(part)}")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise DocumentError(subpath(path, index, "text"), f"a {kind} part needs a string text")
            texts.append(part["text"])
        else:
            need(isinstance(kind, str), subpath(path, index, "type"), "a content part needs a string type")
            texts.append(f"[{kind} part not imported]")
    return "".join(texts)


def assistant_blocks(blocks: list[Any], where: JsonPath,
                     names: dict[str, str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """An assistant message's content blocks as Anthropic's API writes them (Claude Code's and Cline's logs): its
    texts (thinking and text blocks) and its tool calls (name, input); each tool_use id's name kept in ``names``, so
    the tool result that answers it is named."""
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    for number, block in enumerate(blocks):
        need(isinstance(block, dict), (*where, number), "must be a content block object")
        kind = block.get("type")
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            texts.append(block["thinking"])
        elif kind == "text":
            texts.append(content_text([block], (*where, number)) or "")
        elif kind == "tool_use":
            need(isinstance(block.get("name"), str), (*where, number, "name"), "a tool_use needs its name")
            if isinstance(block.get("id"), str):
                names[block["id"]] = block["name"]
            calls.append((block["name"], block.get("input")))
    return texts, calls
