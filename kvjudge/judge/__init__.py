"""The judge: two runs read into one local model, a pairwise verdict from the model's own probabilities.

Public API::

    from kvjudge.judge import open_backend, LlamaBackend, ServerBackend, Judge, judge_pair, Verdict
    from kvjudge.judge import still_grades, StillGrades, cohen_kappa, render_view, escape

- backends: :class:`LlamaBackend` (in-process llama-cpp-python, prefix KV reuse) and :class:`ServerBackend`
  (OpenAI-compatible ``/v1/completions`` with logprobs); :func:`open_backend` picks one from CLI/config
  choices with n_ctx from the capability cache.
- views: :func:`render_view` of a folded run, :func:`escape` for the delimiters, :func:`pack_run` into an
  equal allowance (further-reduced views derived with the retention's pure ``plan_reduction``).
- verdicts: :class:`Judge` / :func:`judge_pair` ask both orders and un-swap; outcomes a | b | tie |
  inconsistent | overflow | error; judgments are cached in the store.
- still grades: :func:`still_grades` compares full and reduced verdicts (agreement, flips, κ, Δp_a).
"""

from kvjudge.judge.backends import (
    LABELS,
    Backend,
    LabelScore,
    LlamaBackend,
    PromptOverflow,
    ServerBackend,
    capability_n_ctx,
    open_backend,
    resolve_n_ctx,
)
from kvjudge.judge.pack import PackedView, RunTokens, pack_run, view_allowance
from kvjudge.judge.render import TEMPLATE_VERSION, body_resolver, escape, render_view, segments
from kvjudge.judge.stillgrades import StillGrades, cohen_kappa, still_grades, still_grades_summary, summarize_verdicts
from kvjudge.judge.verdict import (
    DEFAULT_MARGIN,
    OUTCOMES,
    SCORED,
    Judge,
    OrderScore,
    Verdict,
    decide,
    judge_pair,
    judgment_key,
)

__all__ = [
    "DEFAULT_MARGIN", "LABELS", "OUTCOMES", "SCORED", "TEMPLATE_VERSION", "Backend", "Judge", "LabelScore",
    "LlamaBackend", "OrderScore", "PackedView", "PromptOverflow", "RunTokens", "ServerBackend", "StillGrades",
    "Verdict", "body_resolver", "capability_n_ctx", "cohen_kappa", "decide", "escape", "judge_pair",
    "judgment_key", "open_backend", "pack_run", "render_view", "resolve_n_ctx", "segments", "still_grades",
    "still_grades_summary", "summarize_verdicts", "view_allowance",
]
