"""Claude Code sessions: ``~/.claude/projects/<project>/<session>.jsonl``, one record per line, one run per file.

Shape, as Claude Code writes it: each line an object with a ``type``. ``user`` and ``assistant`` lines are
messages: ``uuid``, ``parentUuid`` (null at a conversation's root; after a compaction the new root keeps the old
leaf as ``logicalParentUuid``), ``sessionId``, ``timestamp``, ``cwd``, ``version``, ``gitBranch``,
``isSidechain`` (true for a subagent's messages — the Task tool's), ``isMeta`` (a message the harness inserted),
and ``message``: ``role``, ``content`` (a string, or blocks: ``text``, ``thinking``, ``tool_use{id, name,
input}``, ``tool_result{tool_use_id, content, is_error}``, ``image``), an assistant's ``model`` and ``usage``
(``input_tokens``, ``cache_creation_input_tokens``, ``cache_read_input_tokens``, ``output_tokens``; a streamed
reply is several lines sharing ``message.id``, each with the same usage). ``summary``, ``system`` and
``file-history-snapshot`` lines are the harness's bookkeeping.

Mapping: a session is a run. Agent ``claude-code@<model>`` (its first assistant message's model); trial the
session id; task :func:`~.model.task_from_prompt` of the first prompt and the ``cwd``; run id
``<agent>/<task>/<session>``. The live branch is the thread from the last message of the main chain back to the
root by ``parentUuid`` (through compactions); messages off it (a reply regenerated, an edit) are a dead branch,
and each subagent's sidechain a dead branch of its own, forking where its Task call was made. Each assistant
block is a transition (thinking, then text, on the first; one per ``tool_use``, its usage on the first line of
its message); each ``tool_result`` a tool transition (an error's exit code 1); the first prompt is the task prompt.
Records are named ``$[i]``: the *i*-th non-blank line of the file, from 0. A subagent's own file (newer versions
write ``agent-<id>.jsonl``: every message a sidechain) is a run of its own, its thread the live branch, trial
``<session>-<agentId>``, noted ``subagent_of`` the session.
"""

from __future__ import annotations

from typing import Any

from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun, assistant_blocks, content_text, need
from kvjudge.retention.ingest.model import scalars
from kvjudge.retention.ingest.model import task_from_prompt, usage_of, with_marker

NAME = "claude-code"
TASK_MARKER = "{{task}}"
_MESSAGES = ("user", "assistant")


def is_session_record(record: dict[str, Any]) -> bool:
    """A line of a Claude Code session: a message with its ``sessionId`` and ``uuid``, or the bookkeeping lines
    a session may open with (a ``summary`` with its ``leafUuid``, a ``file-history-snapshot``)."""
    kind = record.get("type")
    if kind in _MESSAGES:
        return "sessionId" in record and "uuid" in record and "message" in record
    if kind in ("system", "queue-operation"):  # a session may open with the harness's own line
        return "sessionId" in record
    return (kind == "summary" and "leafUuid" in record) or (kind == "file-history-snapshot" and "messageId" in record)


def parse_claude_code(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """A session's records (a list, one per line) → ParsedRun (DocumentError naming ``$[i]``)."""
    need(isinstance(obj, list) and bool(obj), "$", "a Claude Code session is a JSONL file of records")
    messages: list[tuple[int, dict[str, Any]]] = []
    for index, record in enumerate(obj):
        need(isinstance(record, dict), ("$", index), "must be an object (one record per line)")
        kind = record.get("type")
        if kind in _MESSAGES:
            need(isinstance(record.get("uuid"), str), ("$", index, "uuid"), "missing (every message has its uuid)")
            need(isinstance(record.get("message"), dict), ("$", index, "message"), "must be an object")
            messages.append((index, record))
        elif not isinstance(kind, str):
            raise DocumentError(("$", index, "type"), "missing (every record has a type)")
    need(bool(messages), "$", "holds no messages (only the harness's bookkeeping)")
    main, dead, sidechains = _threads(messages)
    agent_file = not main and len(sidechains) == 1  # a subagent's own file (agent-<id>.jsonl): its thread is the run
    if agent_file:
        main, sidechains = sidechains[0], []
    first = messages[0][1]
    session = first.get("sessionId")
    need(isinstance(session, str) and session != "", ("$", messages[0][0], "sessionId"), "must be a non-empty string")
    model = next((m["message"]["model"] for _, m in messages if m.get("type") == "assistant"
                  and isinstance(m["message"].get("model"), str) and not m["message"]["model"].startswith("<")), None)
    agent = context.agent or (f"claude-code@{model}" if model else "claude-code")
    prompt = next((text for _, m in main if (text := _prompt_of(m)) is not None), None)
    cwd = first.get("cwd") if isinstance(first.get("cwd"), str) else None
    task = task_from_prompt(prompt, cwd) or session
    trial = f"{session}-{first['agentId']}" if agent_file and isinstance(first.get("agentId"), str) else session
    run = context.new_run(f"{agent}/{task}/{trial}", NAME, agent=agent, grading_open=True)
    run.named = True  # the session is its identity: other content under it is the session changed
    version = first.get("version")
    run.start(task_id=task, prompt=prompt, trial=trial, metadata=scalars({
        "subagent_of": session if agent_file else None,
        "format": NAME, "model": model, "cwd": cwd, "git_branch": first.get("gitBranch"),
        "harness": f"Claude Code {version}" if isinstance(version, str) else "Claude Code",
        "subagents": len(sidechains) or None, "abandoned_messages": len(dead) or None}))
    writer = _Writer(run, prompt)
    branch = run.branch("main")
    places: dict[str, int] = {}  # a main message's uuid → the transitions main holds once it is written
    for index, record in main:
        writer.add(branch, index, record)
        places[record["uuid"]] = run.transitions(branch)
    if dead:
        forked = run.branch("abandoned", "dead", parent=branch, fork_at=places.get(_parent(dead[0][1]) or "", 0))
        for index, record in dead:
            writer.add(forked, index, record)
    for number, chain in enumerate(sidechains, start=1):
        fork_at = places.get(_parent(chain[0][1]) or "", run.transitions(branch))
        sub = run.branch(f"subagent-{number}", "dead", parent=branch, fork_at=min(fork_at, run.transitions(branch)))
        for index, record in chain:
            writer.add(sub, index, record)
    return run


def _parent(record: dict[str, Any]) -> str | None:
    parent = record.get("parentUuid")
    return parent if isinstance(parent, str) else None


def _threads(messages: list[tuple[int, dict[str, Any]]]) -> tuple[list[Any], list[Any], list[list[Any]]]:
    """The main thread (root → last main-chain message, by ``parentUuid``, through compactions), the other
    main-chain messages in file order, and each sidechain's messages (grouped by their root) in file order."""
    by_uuid = {record["uuid"]: (index, record) for index, record in messages}
    main_chain = [(i, r) for i, r in messages if r.get("isSidechain") is not True]
    on_main: set[str] = set()
    thread: list[tuple[int, dict[str, Any]]] = []
    if main_chain:
        current: dict[str, Any] | None = main_chain[-1][1]
        while current is not None and current["uuid"] not in on_main:  # a cycle ends the walk
            on_main.add(current["uuid"])
            thread.append(by_uuid[current["uuid"]])
            parent = current.get("parentUuid") or current.get("logicalParentUuid")
            current = by_uuid[parent][1] if isinstance(parent, str) and parent in by_uuid else None
        thread.reverse()
    dead = [(i, r) for i, r in main_chain if r["uuid"] not in on_main]
    chains: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for index, record in messages:
        if record.get("isSidechain") is True:
            chains.setdefault(_sidechain_root(record, by_uuid), []).append((index, record))
    return thread, dead, list(chains.values())


def _sidechain_root(record: dict[str, Any], by_uuid: dict[str, tuple[int, dict[str, Any]]]) -> str:
    """The first message of the sidechain ``record`` is in (its ``agentId`` names it where Claude Code writes one)."""
    if isinstance(record.get("agentId"), str):
        return record["agentId"]
    seen = {record["uuid"]}
    while True:
        parent = record.get("parentUuid")
        above = by_uuid.get(parent)[1] if isinstance(parent, str) and parent in by_uuid else None
        if above is None or above.get("isSidechain") is not True or above["uuid"] in seen:
            return record["uuid"]
        seen.add(above["uuid"])
        record = above


def _prompt_of(record: dict[str, Any]) -> str | None:
    """The text a user typed in ``record`` (None for a tool result, a meta message or an assistant's)."""
    if record.get("type") != "user" or record.get("isMeta"):
        return None
    content = record["message"].get("content")
    if isinstance(content, str):
        return content or None
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    if not isinstance(content, list):  # not a message's content: its parse names what is wrong
        return None
    texts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
             and isinstance(b.get("text"), str)]
    return "\n".join(texts) or None


class _Writer:
    """Messages → transitions: tool calls named by their ids, the first prompt marked, usage once per reply."""

    def __init__(self, run: ParsedRun, prompt: str | None) -> None:
        self.run = run
        self.prompt = prompt
        self.prompted = False
        self.names: dict[str, str] = {}
        self.replies: set[str] = set()

    def add(self, branch: str, index: int, record: dict[str, Any]) -> None:
        message = record["message"]
        where = ("$", index, "message", "content")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        need(isinstance(blocks, list), where, "must be a string or a list of content blocks")
        if record["type"] == "assistant":
            self._assistant(branch, message, blocks, where)
        else:
            self._user(branch, blocks, where)

    def _assistant(self, branch: str, message: dict[str, Any], blocks: list[Any], where: Any) -> None:
        texts, calls = assistant_blocks(blocks, where, self.names)
        reply = message.get("id")
        usage = None
        if not (isinstance(reply, str) and reply in self.replies):
            usage = usage_of(_input_counted(message.get("usage")))
            if isinstance(reply, str):
                self.replies.add(reply)
        text = "\n\n".join(t for t in texts if t) or None
        for number in range(max(1, len(calls))):
            self.run.step(branch, "assistant", text=text if number == 0 else None,
                          call=calls[number] if calls else None, usage=usage if number == 0 else None)

    def _user(self, branch: str, blocks: list[Any], where: Any) -> None:
        texts = []
        for number, block in enumerate(blocks):
            need(isinstance(block, dict), (*where, number), "must be a content block object")
            if block.get("type") == "tool_result":
                output = block.get("content")
                text = output if output is None or isinstance(output, str) else \
                    content_text(output, (*where, number, "content"))
                call = block.get("tool_use_id")
                name = self.names.get(call, "tool") if isinstance(call, str) else "tool"
                self.run.step(branch, "tool", output=(name, text or "", 1 if block.get("is_error") is True else None))
            else:
                texts.append(content_text([block], (*where, number)) or "")
        text = "\n".join(t for t in texts if t)
        if not text:
            return
        if not self.prompted and text == self.prompt:
            self.prompted = True
            text = with_marker(text, self.prompt, TASK_MARKER)
        self.run.step(branch, "user", text=text)


def _input_counted(usage: Any) -> Any:
    """Anthropic counts cache reads and writes apart from ``input_tokens``: the prompt is all three."""
    if not isinstance(usage, dict):
        return usage
    parts = [usage.get(key) for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    counted = [p for p in parts if isinstance(p, int) and not isinstance(p, bool)]
    return {**usage, "input_tokens": sum(counted)} if counted else usage


FORMAT = Format(
    name=NAME, summary="Claude Code sessions (`<session>.jsonl`: messages threaded by `parentUuid`, "
                       "subagent sidechains)",
    recognises_record=is_session_record, parse=parse_claude_code)
