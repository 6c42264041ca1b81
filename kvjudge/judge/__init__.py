"""The judge: two runs read into one model, a pairwise verdict from the model's own probabilities.

Public API::

    from kvjudge.judge import LlamaBackend, ServerBackend, Judge, judge_batch, judge_pair, Verdict
    from kvjudge.judge import check_still_grades, still_grades, StillGrades, cohen_kappa, render_view, escape

The pipeline runs one way (:mod:`kvjudge.judge.pipeline`): pairs (:mod:`kvjudge.judge.pairing`) → views →
prompts → scores → verdicts, through :func:`judge_batch` for every caller.

- backends: the :class:`Backend` protocol (everything a caller may ask of a backend), :class:`LlamaBackend`
  (in-process llama-cpp-python, prefix KV reuse), :class:`ServerBackend` (one OpenAI-compatible server:
  completions, or chat completions for the chat framing, with logprobs) and :class:`ServerPool` (several servers
  of one model, with retries and failover; :func:`open_servers`); which backend a command uses is the judge
  target's business (:mod:`kvjudge.target`). :class:`WindowPlanner` sizes the window to the pairs (certifying
  that size only). Labels, spellings and renormalisation: :mod:`kvjudge.judge.labels`.
- views: :func:`render_view` of a folded run (verifier results and grades held out), :func:`escape` for the
  delimiters, :func:`pack_pair` into the window (further-reduced views derived with the retention's pure
  ``plan_reduction``); token counts added up from counts kept once per body (:class:`ViewCounter`); prompts in
  the model's chat template or raw (:mod:`kvjudge.judge.prompt`).
- verdicts: :class:`Judge` / :func:`judge_pair` / :func:`judge_batch` ask both orders and un-swap; outcomes a | b |
  tie | inconsistent | overflow | error; each order's call and each verdict are cached in the store (a verdict
  found by what identifies it, without rendering the pair again).
- meta-evaluation and ranking: :mod:`kvjudge.judge.evaluate` (accuracy against held-out grades beside
  baselines) and :mod:`kvjudge.judge.ranking` (Bradley–Terry with bootstrap intervals).
- still grades: :func:`check_still_grades` judges pairs full, then reduced (the judge target's
  ``still_grades`` gives it each tenant's target); :func:`still_grades` compares the two sides' verdicts
  (agreement, flips, κ, Δp_a).
- protocols (:mod:`kvjudge.judge.protocols`): the registry :data:`PROTOCOLS` (letter, pairwise-scale, pointwise),
  :func:`make_protocol`, the :class:`Scale` a scale protocol answers on (:mod:`kvjudge.judge.scale`) and its
  :class:`Rubric`; :func:`score_runs` scores runs one at a time with a pointwise protocol (:class:`RunScore`,
  cached), :func:`jury_verdicts` combines several judges (:class:`JuryVerdict`), :mod:`kvjudge.judge.critic_eval`
  measures scores as critics are measured.
- evidence retention (:mod:`kvjudge.judge.evidence`): how much of each run's final submission and last test
  outcome the views judged show (:class:`RunEvidence`, on every verdict), flagged when a reduction hides some.
"""

from kvjudge.judge.backends import Backend, LlamaBackend
from kvjudge.judge.evidence import RunEvidence
from kvjudge.judge.labels import LABELS, LabelScore, PromptOverflow
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
from kvjudge.judge.pipeline import Judge, judge_batch, judge_pair
from kvjudge.judge.pointwise import RunScore, score_runs
from kvjudge.judge.jury import JuryVerdict, jury_verdicts
from kvjudge.judge.protocols import PROTOCOLS, JudgeProtocol, Rubric, make_protocol
from kvjudge.judge.scale import Scale, letter_scale
from kvjudge.judge.prompt import RAW, TEMPLATE_CHOICES, TEMPLATE_VERSION, Framing, Prompt, TemplateText, choose_framing
from kvjudge.judge.render import ViewParts, body_resolver, escape, render_parts, render_view, view_source
from kvjudge.judge.server_backend import ServerBackend
from kvjudge.judge.server_pool import ServerPool
from kvjudge.judge.servers import open_servers
from kvjudge.judge.stillgrades import (
    FullCut,
    StillGrades,
    StillGradesCheck,
    check_still_grades,
    cohen_kappa,
    split_full_cut,
    still_grades,
    still_grades_summary,
    summarize_verdicts,
)
from kvjudge.judge.verdict import (
    DEFAULT_MARGIN,
    OUTCOMES,
    SCORED,
    OrderPrompt,
    OrderScore,
    PackedPair,
    Verdict,
    decide,
    judgment_key,
    order_score,
    verdict_key,
)
from kvjudge.judge.viewcount import ViewCounter
from kvjudge.judge.window import Window, WindowPlanner, window_tokens

__all__ = [
    "JudgeProtocol", "JuryVerdict", "PROTOCOLS", "Rubric", "RunScore", "Scale", "jury_verdicts", "letter_scale",
    "make_protocol", "score_runs",
    "Backend", "BaseView", "CommonBlock", "DEFAULT_MARGIN", "Framing", "FullCut", "Judge", "LABELS", "LabelScore",
    "LlamaBackend", "OUTCOMES", "OrderPrompt", "OrderScore", "PackedPair", "PackedView", "PairBases", "Prompt",
    "PromptOverflow", "RAW", "RunEvidence", "RunTokens", "SCORED", "ServerBackend", "ServerPool", "StillGrades",
    "StillGradesCheck", "TEMPLATE_CHOICES", "TEMPLATE_VERSION", "TemplateText", "Verdict", "ViewCounter", "ViewParts",
    "Window", "WindowPlanner", "base_view", "body_resolver", "check_still_grades", "choose_framing", "cohen_kappa",
    "common_block", "decide", "escape", "fit_view", "judge_batch", "judge_pair", "judgment_key", "open_servers",
    "order_score", "pack_pair", "pack_run", "pair_bases", "render_parts", "render_view", "split_full_cut",
    "still_grades", "still_grades_summary", "summarize_verdicts", "verdict_key", "view_source", "window_tokens",
]
