"""The judge: two runs read into one local model, a pairwise verdict from the model's own probabilities.

Public API::

    from kvjudge.judge import LlamaBackend, ServerBackend, Judge, judge_pair, Verdict
    from kvjudge.judge import still_grades, StillGrades, cohen_kappa, render_view, escape

- backends: :class:`LlamaBackend` (in-process llama-cpp-python, prefix KV reuse), :class:`ServerBackend`
  (one OpenAI-compatible server: completions, or chat completions for the chat framing, with logprobs) and
  :class:`ServerPool` (several servers of one model, with retries and failover; :func:`open_servers`);
  :class:`WindowPlanner` sizes the window to the pairs (certifying that size only). Which backend a command uses
  is the judge target's business (:mod:`kvjudge.target`).
- views: :func:`render_view` of a folded run (verifier results and grades held out), :func:`escape` for the
  delimiters, :func:`pack_pair` into the window (further-reduced views derived with the retention's pure
  ``plan_reduction``); prompts in the model's chat template or raw (:mod:`kvjudge.judge.prompt`).
- verdicts: :class:`Judge` / :func:`judge_pair` ask both orders and un-swap; outcomes a | b | tie |
  inconsistent | overflow | error; judgments are cached in the store. :func:`judge_batch` sends every
  pair's orders concurrently through a server pool, with the judge's own stages.
- meta-evaluation and ranking: :mod:`kvjudge.judge.evaluate` (accuracy against held-out grades beside
  baselines) and :mod:`kvjudge.judge.ranking` (Bradley–Terry with bootstrap intervals).
- still grades: :func:`still_grades` compares full and reduced verdicts (agreement, flips, κ, Δp_a).
- evidence retention (:mod:`kvjudge.judge.evidence`): how much of each run's final submission and last test
  outcome the views judged show (:class:`RunEvidence`, on every verdict), flagged when a reduction hides some.
"""

from kvjudge.judge.backends import (
    LABELS,
    Backend,
    LabelScore,
    LlamaBackend,
    PromptOverflow,
)
from kvjudge.judge.batch import judge_batch
from kvjudge.judge.evidence import RunEvidence
from kvjudge.judge.pack import (
    BaseView,
    CommonBlock,
    PackedView,
    PairBases,
    RunTokens,
    base_view,
    common_block,
    fit_view,
    pack_pair,
    pack_run,
    pair_bases,
)
from kvjudge.judge.prompt import RAW, TEMPLATE_CHOICES, TEMPLATE_VERSION, Framing, TemplateText, choose_framing
from kvjudge.judge.render import body_resolver, escape, render_view
from kvjudge.judge.stillgrades import StillGrades, cohen_kappa, still_grades, still_grades_summary, summarize_verdicts
from kvjudge.judge.verdict import (
    DEFAULT_MARGIN,
    OUTCOMES,
    SCORED,
    Judge,
    OrderPrompt,
    PackedPair,
    OrderScore,
    Verdict,
    decide,
    judge_pair,
    judgment_key,
    order_score,
)
from kvjudge.judge.servers import ServerBackend, ServerPool, open_servers
from kvjudge.judge.window import Window, WindowPlanner, window_tokens

__all__ = [
    "DEFAULT_MARGIN", "LABELS", "OUTCOMES", "RAW", "SCORED", "TEMPLATE_CHOICES", "TEMPLATE_VERSION", "Backend",
    "BaseView", "CommonBlock", "Framing", "Judge", "LabelScore", "LlamaBackend", "OrderPrompt", "OrderScore",
    "PackedPair", "PackedView", "PairBases", "PromptOverflow", "RunEvidence", "RunTokens", "ServerBackend",
    "ServerPool", "StillGrades", "TemplateText", "Verdict", "Window", "WindowPlanner", "base_view", "body_resolver",
    "choose_framing", "cohen_kappa", "common_block", "decide", "escape", "fit_view", "judge_batch", "judge_pair",
    "judgment_key", "open_servers", "order_score", "pack_pair", "pack_run", "pair_bases",
    "render_view", "still_grades", "still_grades_summary", "summarize_verdicts", "window_tokens",
]
