"""Budget inflation: the legacy fullness figure (summed per turn) against the anchored one, on a real session.

A multi-turn chat runs through llama-cpp-python's ``Llama.create_chat_completion`` (greedy), with the
history chosen by a live :class:`~kvjudge.budget.TokenBudget`. Each turn's real prompt size is the
backend's own ``usage.prompt_tokens``. Per turn, side by side:

- **real**: the context after the turn as the backend counts it (``prompt_tokens + completion_tokens``);
- **legacy**: the old figure, ``sum(input + output)`` over the turns in history (double counts);
- **anchored**: the TokenBudget's fullness (last report + the reply as the backend counted it,
  ``completion_tokens``, with its template markup estimated), before any pruning;
- **estimate-only**: a TokenBudget that never sees a report (sum of per-turn estimates).

The estimate is chars/4 of each message's text plus the chat template's tokens around each message, counted
from the template the backend renders with (``--estimation template``, the default), or chars/4 of the text
alone (``--estimation plain``, the rule before templates were counted: the same-run comparison for the prunes).

The baseline of the run is the legacy figure; ratios are against the real size of the same run.
Also the estimator error table: chars/4, tiktoken cl100k and the model tokenizer against the backend's
counts. Writes ``inflation.json``, ``inflation.png`` and ``inflation.md`` to ``--out`` and prints one
JSON line (the summary).

    python benchmarks/inflation.py --out /tmp/inflation [--turns 20] [--model PATH] [--budget-tokens 2000]

**Replaying an imported run** (``--run RUN --store PATH``): no model runs. The run's model calls are its
assistant transitions that carry usage (ATIF step metrics, inspect model events, mini-swe-agent responses):
each call's ``input_tokens`` is the backend's own count of the prompt it was sent. Between two calls the run's
other transitions (tool output, user messages) are the "user" side of a turn; the call's reply (text and tool
call) the "assistant" side. Turn by turn, a TokenBudget that never prunes predicts the next prompt — its
anchored fullness (the last reported prompt + the reply as reported + the estimate of what came since) — and
the prediction is compared with the backend's count; the legacy figure (sum of input + output over the turns)
beside it. Writes ``inflation-run.json`` to ``--out`` and prints one JSON line (the summary).

    python benchmarks/inflation.py --out /tmp/inflation --run 'terminus-2@m/task/trial' --store runs.sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvjudge._llama import chat_renderer, end_of_generation_ids
from kvjudge.budget import ConversationTurn, TokenBudget, TokenEstimation, TurnMetrics
from kvjudge.commands._output import progress
from kvjudge.models import resolve_model
from kvjudge.retention import Store
from kvjudge.tokens import MessageOverhead, ModelTokenizer, make_counter, template_overhead

# A system prompt of the size an agent harness sends (instructions + tool schemas): the anchored figure
# includes it through the backend's report; the estimate-only figure, which sees only turns, cannot.
SYSTEM_PROMPT = """You are a careful software engineering agent working inside a sandboxed repository.
Follow these rules on every turn:
1. Read the relevant files before you change them. Never guess at an API: open its source or its docs.
2. Make the smallest change that fixes the problem, keep the style of the surrounding code, and explain why.
3. Run the test suite after each change with the `bash` tool. If a test fails, read its output in full.
4. Do not touch files outside the repository. Do not install packages unless the task says you may.
5. When you are unsure, say what you know, what you do not know, and what you would check next.
6. Answer in plain English. Use code blocks for code. Keep answers short unless asked for detail.

Tools available (call them with JSON arguments):
- bash: {"type": "object", "properties": {"command": {"type": "string", "description": "a shell command run in
  the repository root with a 120 s timeout; stdout and stderr are returned, truncated to 8 kB"}},
  "required": ["command"]}
- read_file: {"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer",
  "minimum": 0}, "limit": {"type": "integer", "minimum": 1, "maximum": 2000}}, "required": ["path"]}
- write_file: {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
  "required": ["path", "content"]}
- edit_file: {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string",
  "description": "exact text to replace; must occur once"}, "new": {"type": "string"}},
  "required": ["path", "old", "new"]}
- search: {"type": "object", "properties": {"pattern": {"type": "string", "description": "a regular
  expression"}, "glob": {"type": "string", "default": "**/*.py"}}, "required": ["pattern"]}
- submit: {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}

Repository facts: Python 3.11, pytest, the package lives in src/csvkit_lite/, tests in tests/. The CI runs
`pytest -q` and `ruff check`. Commit messages use the imperative mood. The maintainers prefer explicit
error messages that say what to do next, and they reject changes without a test that fails before the fix.
"""

USER_TURNS = [
    "The test test_quoted_fields fails: a field with an embedded comma is split in two. Where do I start?",
    "Here is the reader loop:\n```python\nfor line in handle:\n    fields = line.rstrip('\\n').split(',')\n"
    "    yield fields\n```\nWhat is wrong with it?",
    "Can you rewrite it with the csv module instead, keeping the generator interface?",
    "The file may be encoded in latin-1 (café, naïve, Zürich). How should the reader handle that?",
    "Now the test for an empty trailing line fails: we yield an empty list at the end. Fix?",
    "Run `pytest -q tests/test_reader.py` and tell me what you would look at first in its output.",
    "Output: `E   AssertionError: assert [['a', 'b'], []] == [['a', 'b']]`. Explain it in one sentence.",
    "Write a test for a quoted field that spans two lines, e.g. \"line one\\nline two\".",
    "What is the difference between csv.reader and csv.DictReader for our use case?",
    "The maintainers want an explicit error for a ragged row (a row with fewer fields). Draft the message.",
    "Add the ragged-row check: raise ValueError naming the line number and the expected field count.",
    "Does the check slow the reader down much? The files have up to 2 million rows.",
    "Summarise the changes so far as a bullet list for the pull request description.",
    "A reviewer asks: why not use pandas.read_csv? Give two reasons in our context.",
    "日本語のファイル名 (データ.csv) でも動きますか？ Answer in English, briefly.",
    "Write the docstring for read_rows(path, encoding='utf-8', strict=True).",
    "ruff reports `E501 line too long (104 > 100)` in reader.py line 42. How do I fix it cleanly?",
    "The CI also runs on Windows. Anything in the reader that could break there (newlines, paths)?",
    "Write the final commit message in the imperative mood, with a short body.",
    "Call submit with a one-paragraph summary of the fix and the tests you added.",
]


@dataclass(frozen=True)
class Turn:
    """One turn's measurements and figures."""

    turn: int
    prompt_tokens: int  # the backend's count of the prompt sent this turn
    completion_tokens: int
    real: int  # prompt_tokens + completion_tokens: the context after the turn
    legacy: int
    anchored: int  # before pruning this turn (the figure the prune decision is made on)
    estimate_only: int
    predicted_prompt: int | None  # anchored fullness before the turn + the estimate of the new user message
    kept_turns: int
    pruned: int  # turns the live TokenBudget dropped after this turn
    prune_required: bool  # the real context exceeded the budget
    prune_needed: int | None  # fewest oldest turns to drop so the kept history's exact context fits the budget
    #                           (None when the chat format's prompt cannot be rebuilt here)
    prune_needed_by_real: int | None  # the same against real minus the dropped turns' exact weight (the older,
    #                                   laxer reference: real leaves out the reply's end-of-turn markup)
    exact_prompt: int | None  # the rebuilt prompt's token count (checks the rebuild against prompt_tokens)
    context: int | None  # exact tokens of system + kept turns (before pruning) as the next request renders them,
    #                      generation prompt included: the quantity the anchored fullness estimates


def _pct(estimate: float, real: float) -> float:
    return 100.0 * (estimate - real) / real if real else 0.0


def _error_stats(pairs: list[tuple[int, int]]) -> dict[str, float]:
    """Median and worst (largest magnitude, signed) relative error in %, of (estimate, backend) pairs."""
    errors = [_pct(estimate, real) for estimate, real in pairs if real > 0]
    if not errors:
        return {"median_pct": 0.0, "worst_pct": 0.0, "n": 0}
    return {"median_pct": round(statistics.median(errors), 2), "worst_pct": round(max(errors, key=abs), 2),
            "n": len(errors)}


def _load_llama(model: Path, n_ctx: int, chat_format: str | None):  # noqa: ANN202 - llama_cpp.Llama
    from llama_cpp import Llama

    # llama.cpp logs to stderr from C; keep the benchmark's own output readable.
    with contextlib.redirect_stderr(io.StringIO()):
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_threads=os.cpu_count() or 2, seed=0, verbose=False)
    if chat_format is not None:
        llm.chat_format = chat_format
    elif "tokenizer.chat_template" not in llm.metadata:
        # No template in the GGUF (the default model is a base model): llama-cpp-python would fall back to
        # llama-2, whose markup the base model echoes back. chatml keeps the system role and plain text.
        llm.chat_format = "chatml"
    return llm


def _template_of(llm) -> str | None:  # noqa: ANN001 - llama_cpp.Llama
    """The chat template the backend renders with, as :func:`kvjudge.tokens.template_overhead` names it."""
    return {"chatml": "chatml", "chat_template.default": "model"}.get(llm.chat_format)


class PromptCounter:
    """Counts a message list's tokens exactly as the chat handler will: same template, same tokenizer.

    Used only to judge prune decisions after the fact (how many turns the real context required dropping);
    the budget itself never sees it.
    """

    def __init__(self, llm) -> None:  # noqa: ANN001 - llama_cpp.Llama
        self._llm = llm
        self.template = _template_of(llm)
        self._render = chat_renderer(llm, self.template) if self.template else None

    def count(self, messages: list[dict[str, str]]) -> int | None:
        if self._render is None:
            return None
        prompt, added_special = self._render(messages)
        return len(self._llm.tokenize(prompt.encode("utf-8"), add_bos=not added_special, special=True))

    def history(self, system: str, turns: tuple[ConversationTurn, ...]) -> int | None:
        """Exact tokens of ``system`` + ``turns`` as the next request renders them (before its new message)."""
        messages = [{"role": "system", "content": system}]
        for turn in turns:
            messages += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": turn.assistant}]
        return self.count([m for m in messages if m["content"].strip()])

    def turns_needed(self, system: str, kept: tuple[ConversationTurn, ...], budget: int,
                     real: int | None = None) -> int | None:
        """Fewest oldest turns of ``kept`` to drop so the rest fits ``budget``: their exact context, or (with
        ``real``) ``real`` minus the dropped turns' exact weight."""
        full = self.history(system, kept)
        if full is None:
            return None
        for drop in range(len(kept) + 1):
            rest = self.history(system, kept[drop:])
            if (rest if real is None else real - (full - rest)) <= budget:
                return drop
        return len(kept)


def session_estimation(model: Path, llm, kind: str, counter: str = "chars") -> TokenEstimation:  # noqa: ANN001
    """``counter`` (chars/4 by default) for the text, plus (``kind == "template"``) the tokens of the template the
    backend (``llm``) renders with."""
    estimation = TokenEstimation(make_counter(counter, model))
    template = _template_of(llm)
    if kind == "plain" or template is None:
        return estimation
    return estimation.with_template(template_overhead(ModelTokenizer(model), template))


def run_session(model: Path, turns: int, max_reply_tokens: int, n_ctx: int, budget_tokens: int,
                threshold_pct: float, chat_format: str | None = None, estimation_kind: str = "template",
                counter_kind: str = "chars") -> tuple[list[Turn], list[dict], dict]:
    """Run the chat; return the per-turn figures, the raw texts and counts, and the session settings."""
    llm = _load_llama(model, n_ctx, chat_format)
    # The default model is a base model: without this it often ends a reply before its first token.
    # Banning end-of-generation keeps every reply max_reply_tokens long (deterministic, greedy).
    no_stop = {token: -100.0 for token in end_of_generation_ids(llm)}
    counter = PromptCounter(llm)
    estimation = session_estimation(model, llm, estimation_kind, counter_kind)
    # live drives the session (its history is what is sent); blind gets the same turns and never a report.
    live = TokenBudget(budget_tokens, threshold_pct).with_estimation(estimation)
    blind = TokenBudget(budget_tokens, threshold_pct).with_estimation(estimation)
    rows: list[Turn] = []
    texts: list[dict] = []
    user_texts = [USER_TURNS[i % len(USER_TURNS)] + (f" (round {i // len(USER_TURNS) + 1})"
                                                       if i >= len(USER_TURNS) else "") for i in range(turns)]
    with progress("inflation session", turns) as advance:
        for index, user in enumerate(user_texts, start=1):
            predicted = live.fullness() + estimation.message("user", user) if live.anchor is not None else None
            messages = live.build_messages(SYSTEM_PROMPT, user)
            exact_prompt = counter.count([m.to_dict() for m in messages])
            response = llm.create_chat_completion(
                messages=[m.to_dict() for m in messages], max_tokens=max_reply_tokens, temperature=0.0,
                seed=0, logit_bias=no_stop, repeat_penalty=1.3)
            reply = response["choices"][0]["message"]["content"] or ""
            usage = response["usage"]
            prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
            before = live.history
            asyncio.run(live.sync_turn(user, reply, TurnMetrics(prompt_tokens, completion_tokens)))
            asyncio.run(blind.sync_turn(user, reply, TurnMetrics()))
            dropped = len(before) + 1 - len(live.history)
            # The figure the prune decision was made on: fullness now plus what pruning subtracted.
            anchored = live.fullness() + sum(estimation.turn(t.user, t.assistant) for t in before[:dropped])
            kept = (*before, ConversationTurn(user, reply, prompt_tokens, completion_tokens))  # before pruning
            legacy = sum((t.tokens_in or 0) + (t.tokens_out or 0) for t in kept)
            real = prompt_tokens + completion_tokens
            rows.append(Turn(turn=index, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                             real=real, legacy=legacy, anchored=anchored, estimate_only=blind.fullness(),
                             predicted_prompt=predicted, kept_turns=len(live.history), pruned=dropped,
                             prune_required=real > live.prune_above,
                             prune_needed=counter.turns_needed(SYSTEM_PROMPT, kept, live.prune_above),
                             prune_needed_by_real=counter.turns_needed(SYSTEM_PROMPT, kept, live.prune_above, real),
                             exact_prompt=exact_prompt, context=counter.history(SYSTEM_PROMPT, kept)))
            texts.append({"user": user, "reply": reply, "messages": [m.to_dict() for m in messages],
                          "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "pruned_before": sum(r.pruned for r in rows[:-1])})
            advance()
    settings = {"model": str(model), "chat_format": llm.chat_format, "turns": turns,
                "max_reply_tokens": max_reply_tokens, "n_ctx": n_ctx,
                "budget_tokens": budget_tokens, "threshold_pct": live.threshold_pct, "prune_above": live.prune_above,
                "system_prompt_tokens": len(llm.tokenize(SYSTEM_PROMPT.encode(), add_bos=False)),
                "estimation_kind": estimation_kind, "estimation": estimation.name,
                "template": dataclasses.asdict(estimation.template)}
    return rows, texts, settings


def estimator_errors(model: Path, texts: list[dict], template: MessageOverhead) -> dict[str, dict[str, dict[str, float]]]:
    """Per estimator: replies vs completion_tokens, messages added between reports vs the prompt growth,
    and whole prompts (every message) vs prompt_tokens (median and worst signed relative error, %).

    ``template`` is the session's chat template cost: the "+ template" rows add it to every message."""
    counters = {"chars/4": TokenEstimation.chars(4), "tiktoken cl100k": TokenEstimation.tiktoken(),
                "model tokenizer": TokenEstimation.model(model)}
    if template.template != "none":
        counters["chars/4 + template"] = counters["chars/4"].with_template(template)
        counters["model tokenizer + template"] = counters["model tokenizer"].with_template(template)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for label, estimation in counters.items():
        replies = [(estimation.estimate(t["reply"]), t["completion_tokens"]) for t in texts]
        growth = [(estimation.message("assistant", prev["reply"]) + estimation.message("user", cur["user"]),
                   cur["prompt_tokens"] - prev["prompt_tokens"])
                  for prev, cur in zip(texts, texts[1:]) if cur["pruned_before"] == prev["pruned_before"]]
        prompts = [(sum(estimation.message(m["role"], m["content"]) for m in t["messages"]), t["prompt_tokens"])
                   for t in texts]
        table[label] = {"reply": _error_stats(replies), "added_between_reports": _error_stats(growth),
                        "whole_prompt": _error_stats(prompts)}
    return table


def decision_quality(rows: list[Turn], fractions: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)) -> list[dict]:
    """For budgets spread over the range the real size covered: turns where a figure would prune and the
    real size would not (spurious), and the reverse (missed)."""
    low, high = min(r.real for r in rows), max(r.real for r in rows)
    result = []
    for fraction in fractions:
        budget = int(low + (high - low) * fraction)
        entry: dict = {"budget": budget, "fraction_of_range": fraction}
        for name in ("legacy", "anchored", "estimate_only"):
            figures = [(getattr(r, name), r.real) for r in rows]
            entry[name] = {"spurious": sum(1 for f, real in figures if f > budget >= real),
                           "missed": sum(1 for f, real in figures if real > budget >= f)}
        result.append(entry)
    return result


def summarise(rows: list[Turn], settings: dict, seconds: float) -> dict:
    last = rows[-1]
    anchored_errors = [_pct(r.anchored, r.real) for r in rows]
    predicted = [_pct(r.predicted_prompt, r.prompt_tokens) for r in rows if r.predicted_prompt is not None]
    exact = all(r.prune_needed is not None for r in rows)
    context_errors = [_pct(r.anchored, r.context) for r in rows if r.context]
    if exact:  # in turns: dropped beyond what the exact weights required, and short of it
        spurious_prunes = sum(max(0, r.pruned - r.prune_needed) for r in rows)
        missed_prunes = sum(max(0, r.prune_needed - r.pruned) for r in rows)
        spurious_by_real = sum(max(0, r.pruned - r.prune_needed_by_real) for r in rows)
    else:  # in turns at which a prune happened that the real size did not require, and the reverse
        spurious_prunes = sum(1 for r in rows if r.pruned and not r.prune_required)
        missed_prunes = sum(1 for r in rows if r.prune_required and not r.pruned)
    return {
        "benchmark": "inflation",
        "model": Path(settings["model"]).name,
        "turns": len(rows),
        "real_last": last.real,
        "legacy_last": last.legacy,
        "anchored_last": last.anchored,
        "estimate_only_last": last.estimate_only,
        "legacy_over_real_last": round(last.legacy / last.real, 3),  # the baseline's inflation
        "anchored_over_real_last": round(last.anchored / last.real, 4),
        "estimate_only_over_real_last": round(last.estimate_only / last.real, 3),
        "anchored_max_abs_err_pct": round(max(map(abs, anchored_errors)), 3),
        "anchored_vs_context_max_abs_err_pct": round(max(map(abs, context_errors)), 3) if context_errors else None,
        "predicted_prompt_max_abs_err_pct": round(max(map(abs, predicted)), 3) if predicted else None,
        "prunes": sum(r.pruned for r in rows),
        "prunes_needed": sum(r.prune_needed for r in rows) if exact else None,
        "prune_check": "exact turn weights" if exact else "per turn: real size over budget",
        "rebuilt_prompt_matches_backend": all(r.exact_prompt == r.prompt_tokens for r in rows) if exact else None,
        "spurious_prunes": spurious_prunes,
        "missed_prunes": missed_prunes,
        "spurious_prunes_by_real": spurious_by_real if exact else None,
        "legacy_spurious_prunes_at_live_budget": sum(1 for r in rows if r.legacy > settings["prune_above"] >= r.real),
        "estimation": settings["estimation"],
        "targets": {"anchored_within_2pct_every_turn": max(map(abs, anchored_errors)) <= 2.0,
                    "anchored_within_2pct_of_context_every_turn": bool(context_errors)
                    and max(map(abs, context_errors)) <= 2.0,
                    "predicted_prompt_within_2pct_every_turn": bool(predicted) and max(map(abs, predicted)) <= 2.0,
                    "zero_spurious_prunes": spurious_prunes == 0},
        "seconds": round(seconds, 1),
    }


def write_png(rows: list[Turn], path: Path, settings: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [r.turn for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, style in (("real", "k-"), ("legacy", "r--"), ("anchored", "b-"), ("estimate_only", "g:")):
        left.plot(turns, [getattr(r, name) for r in rows], style, marker=".", label=name.replace("_", "-"))
    left.axhline(settings["prune_above"], color="grey", linewidth=0.8, label=f"prune above {settings['prune_above']}")
    left.set_yscale("log")
    left.set_xlabel("turn")
    left.set_ylabel("tokens (log)")
    left.set_title("fullness figure vs the real context")
    left.legend(fontsize=8)
    right.plot(turns, [_pct(r.anchored, r.real) for r in rows], "b-", marker=".", label="anchored")
    right.plot(turns, [_pct(r.predicted_prompt, r.prompt_tokens) if r.predicted_prompt is not None else float("nan")
                       for r in rows], "c--", marker=".", label="next-prompt prediction")
    right.axhspan(-2, 2, color="b", alpha=0.08, label="±2 %")
    right.set_xlabel("turn")
    right.set_ylabel("error vs real (%)")
    right.set_title("anchored error")
    right.legend(fontsize=8)
    fig.suptitle(f"{Path(settings['model']).name}: {len(rows)} turns, system prompt "
                 f"{settings['system_prompt_tokens']} tokens, replies ≤ {settings['max_reply_tokens']} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(rows: list[Turn], summary: dict, errors: dict, decisions: list[dict], path: Path) -> None:
    lines = [f"{summary['model']}, {summary['turns']} turns; pruned turns: {summary['prunes']} "
             f"(the real context needed {summary['prunes_needed']}; check: {summary['prune_check']}).", "",
             "real = the backend's prompt_tokens + completion_tokens of the turn (the context after it); "
             "legacy = sum of input + output over the turns in history (the double count); anchored = last report "
             "+ the estimate since; estimate-only = the sum of per-turn estimates (no report, so no system prompt). "
             f"Estimate: {summary['estimation']}.", "",
             "| turn | prompt | real | legacy | anchored | estimate-only | legacy/real | anchored err % | pruned | needed |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.turn} | {r.prompt_tokens} | {r.real} | {r.legacy} | {r.anchored} | {r.estimate_only} | "
                     f"{r.legacy / r.real:.2f}× | {_pct(r.anchored, r.real):+.2f} | {r.pruned} | "
                     f"{'?' if r.prune_needed is None else r.prune_needed} |")
    lines += ["", "Estimator error vs the backend's own count (median / worst, %; \"+ template\" adds the chat "
                  "template's tokens per message):", "",
              "| estimator | reply vs completion_tokens | added between reports | message texts vs prompt_tokens |",
              "|---|---:|---:|---:|"]
    for label, kinds in errors.items():
        cells = [f"{kinds[k]['median_pct']:+.1f} / {kinds[k]['worst_pct']:+.1f}"
                 for k in ("reply", "added_between_reports", "whole_prompt")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Prune decisions at budgets across the real range (spurious / missed turns):", "",
              "| budget | legacy | anchored | estimate-only |", "|---:|---:|---:|---:|"]
    for d in decisions:
        lines.append(f"| {d['budget']} | " + " | ".join(f"{d[n]['spurious']} / {d[n]['missed']}"
                                                        for n in ("legacy", "anchored", "estimate_only")) + " |")
    lines += ["", f"Last turn: legacy {summary['legacy_over_real_last']}× the real context, anchored "
                  f"{summary['anchored_over_real_last']}×; anchored worst error {summary['anchored_max_abs_err_pct']} %; "
                  f"prunes {summary['prunes']}, spurious {summary['spurious_prunes']}."]
    path.write_text("\n".join(lines) + "\n")


def run_turns(store: Store, run_id: str) -> tuple[list[dict], int]:
    """The model calls of ``run_id``'s live branch as turns ``{"user", "assistant", "input", "output"}`` (the
    first call's "user" side is everything before it), and how many bodies could not be read locally."""
    state = store.runs.run(run_id)
    branch = next(b for b in state.branches if b.status == "live")
    missing = 0

    def text(ref: str | None) -> str:
        nonlocal missing
        body = store.blobs.text(ref) if ref else ""
        missing += body is None
        return body or ""

    turns: list[dict] = []
    pending: list[str] = []
    for t in branch.transitions:
        parts = [text(t.text_ref)]
        if t.tool_call:
            parts.append(f"{t.tool_call['name']}({text(t.tool_call.get('arguments_ref'))})")
        if t.tool_output:
            parts.append(text(t.tool_output.get("output_ref")))
        said = "\n".join(p for p in parts if p)
        if t.role == "assistant" and t.usage and "input_tokens" in t.usage:
            turns.append({"user": "\n".join(pending), "assistant": said, "input": t.usage["input_tokens"],
                          "output": t.usage.get("output_tokens")})
            pending = []
        elif t.role == "assistant" and turns and not pending:
            turns[-1]["assistant"] += "\n" + said  # another tool call of the same reply
        else:
            pending.append(said)
    return turns, missing


def replay_run(store_path: Path, run_id: str, counter_kind: str, model: str | None) -> dict:
    """Replay ``run_id``'s turns through a TokenBudget's anchored fullness (see the module docstring)."""
    with Store.open(store_path) as store:
        turns, missing = run_turns(store, run_id)
        agent = store.runs.run(run_id).agent
    if len(turns) < 2:
        raise SystemExit(f"run {run_id!r} has {len(turns)} model call(s) with usage; replaying needs two or more "
                         f"(import runs whose harness records per-call usage)")
    estimation = TokenEstimation(make_counter(counter_kind, model))
    budget = TokenBudget(1 << 40, 0.99).with_estimation(estimation)  # never prunes: the run did not
    rows, legacy = [], 0
    for index, turn in enumerate(turns, start=1):
        predicted = budget.fullness() + estimation.message("user", turn["user"]) if budget.anchor is not None else None
        asyncio.run(budget.sync_turn(turn["user"], turn["assistant"], TurnMetrics(turn["input"], turn["output"])))
        legacy += turn["input"] + (turn["output"] or 0)
        rows.append({"turn": index, "prompt_tokens": turn["input"], "completion_tokens": turn["output"],
                     "predicted_prompt": predicted,
                     "error_pct": round(_pct(predicted, turn["input"]), 3) if predicted is not None else None,
                     "anchored_after": budget.fullness(), "legacy": legacy})
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    real_last = rows[-1]["prompt_tokens"] + (rows[-1]["completion_tokens"] or 0)
    summary = {"benchmark": "inflation", "mode": "run", "run": run_id, "agent": agent, "turns": len(rows),
               "estimation": estimation.name, "missing_bodies": missing,
               "real_last": real_last, "legacy_last": legacy, "anchored_last": rows[-1]["anchored_after"],
               "legacy_over_real_last": round(legacy / real_last, 3),
               "anchored_over_real_last": round(rows[-1]["anchored_after"] / real_last, 4),
               "predicted_prompt_median_abs_err_pct": round(statistics.median(errors), 3),
               "predicted_prompt_max_abs_err_pct": round(max(errors), 3),
               "targets": {"predicted_prompt_within_2pct_every_turn": max(errors) <= 2.0}}
    return {"summary": summary, "turns": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for inflation.json/.png/.md")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--model", default=None, help="GGUF path (default: the default model)")
    parser.add_argument("--max-reply-tokens", type=int, default=48)
    parser.add_argument("--n-ctx", type=int, default=4096, help="≤ 8192")
    parser.add_argument("--budget-tokens", type=int, default=None,
                        help="the live TokenBudget's max_tokens (default: --n-ctx)")
    parser.add_argument("--threshold-pct", type=float, default=0.8)
    parser.add_argument("--chat-format", default=None,
                        help="llama-cpp-python chat format (default: the GGUF's template, else chatml)")
    parser.add_argument("--estimation", choices=("template", "plain"), default="template",
                        help="chars/4 plus the chat template's tokens per message (default), or chars/4 alone "
                             "(the rule before templates were counted, for comparison)")
    parser.add_argument("--counter", choices=("chars", "tiktoken", "model"), default="chars",
                        help="how the text of a message is estimated ([context.estimation] counter; default chars/4)")
    parser.add_argument("--run", default=None, help="replay this imported run's turns instead (needs --store)")
    parser.add_argument("--store", type=Path, default=None, help="the store holding --run")
    args = parser.parse_args(argv)
    if args.run is not None:
        if args.store is None:
            parser.error("--run needs --store PATH")
        args.out.mkdir(parents=True, exist_ok=True)
        model = str(resolve_model(args.model)) if args.counter == "model" else None
        result = replay_run(args.store, args.run, args.counter, model)
        (args.out / "inflation-run.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["summary"]))
        return 0
    if args.turns < 2 or not 0 < args.n_ctx <= 8192 or args.max_reply_tokens < 1:
        parser.error("need --turns ≥ 2, 0 < --n-ctx ≤ 8192 and --max-reply-tokens ≥ 1")
    model = resolve_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows, texts, settings = run_session(model, args.turns, args.max_reply_tokens, args.n_ctx,
                                        args.budget_tokens or args.n_ctx, args.threshold_pct, args.chat_format,
                                        args.estimation, args.counter)
    if rows[-1].prompt_tokens + args.max_reply_tokens > args.n_ctx:
        print(f"warning: the last prompt ({rows[-1].prompt_tokens} tokens) nearly fills n_ctx {args.n_ctx}",
              file=sys.stderr)
    errors = estimator_errors(model, texts, MessageOverhead(**settings["template"]))
    decisions = decision_quality(rows)
    summary = summarise(rows, settings, time.perf_counter() - started)
    full = {"summary": summary, "settings": settings, "turns": [asdict(r) for r in rows],
            "estimator_errors": errors, "decisions": decisions, "texts": texts}
    (args.out / "inflation.json").write_text(json.dumps(full, indent=1, ensure_ascii=False) + "\n")
    write_png(rows, args.out / "inflation.png", settings)
    write_markdown(rows, summary, errors, decisions, args.out / "inflation.md")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
