"""The judge: runs read into one model, verdicts and scores from the model's own probabilities.

Public API::

    from kvjudge.judge import Judge, judge_batch, judge_pair, Verdict, LlamaBackend, ServerBackend, open_servers
    from kvjudge.judge import make_protocol, score_runs, jury_verdicts, candidates_of, roc_auc, Ledger

The pipeline runs one way (:mod:`kvjudge.judge.pipeline`): pairs (:mod:`kvjudge.judge.pairing`) → views →
prompts → scores → verdicts, through :func:`judge_batch` for every caller.

- backends: the :class:`Backend` protocol (everything a caller may ask of a backend), :class:`LlamaBackend`
  (in-process llama-cpp-python, prefix KV reuse), :class:`ServerBackend` (one OpenAI-compatible server) and
  :class:`ServerPool` (several servers of one model, with retries and failover; :func:`open_servers`); which backend
  a command uses is the judge target's business (:mod:`kvjudge.target`). :class:`WindowPlanner` sizes the
  :class:`Window` to the pairs (certifying that size only). A label's probabilities: :class:`LabelScore`; a prompt
  too long for the window: :class:`PromptOverflow`. What each call cost: :class:`Ledger` of :class:`CallCost`.
- views and prompts: :func:`render_view` of a folded run (verifier results and grades held out), :func:`escape`
  for the delimiters; a :class:`Prompt` in a :class:`Framing` (the model's chat template or raw:
  :data:`TEMPLATE_CHOICES`).
- verdicts: :class:`Judge` / :func:`judge_pair` / :func:`judge_batch` ask both orders and un-swap; a
  :class:`Verdict`'s outcome is one of :data:`OUTCOMES` (:data:`SCORED` those that are scores; ties within
  :data:`DEFAULT_MARGIN`), cached in the store; :func:`summarize_verdicts` counts them. How much of each run's
  final submission and last test outcome the views show: :class:`RunEvidence`.
- protocols (:mod:`kvjudge.judge.protocols`): the registry :data:`PROTOCOLS` (letter, pairwise-scale, pointwise),
  :func:`make_protocol` (a :class:`JudgeProtocol`) with its :class:`Scale` (:func:`letter_scale`) and
  :class:`Rubric` of :class:`Criterion` (:data:`DEFAULT_RUBRIC`); :func:`score_runs` scores runs one at a time with
  a pointwise protocol (:class:`RunScore`, cached); :func:`jury_verdicts` combines several judges
  (:class:`JuryVerdict`).
- measured as critics are: :func:`score_figures` (a pointwise protocol's scores against the grades) over
  :func:`roc_auc`, :func:`brier`, :func:`expected_calibration_error` and :func:`reliability_bins`; agreement:
  :func:`cohen_kappa`.
- best of N: :func:`candidates_of` each task's runs, :data:`STRATEGIES`, a :class:`Pick` per task — the calls are
  :func:`kvjudge.judge.best_of_n.best_of_n` and :func:`kvjudge.judge.select.select` (not re-exported here: each
  shares its module's name; ``kvjudge.best_of_n`` is the library API's).
- still grades: :func:`check_still_grades` judges pairs full, then reduced (a :class:`StillGradesCheck`);
  :func:`still_grades` compares the two sides' verdicts (:class:`StillGrades`: agreement, flips, κ, Δp_a).

Everything else lives in its module (:mod:`kvjudge.judge.pack`, :mod:`kvjudge.judge.verdict`, …) and is imported
from there.
"""

from kvjudge.judge.backends import Backend, LlamaBackend
from kvjudge.judge.best_of_n import candidates_of
from kvjudge.judge.critic_eval import score_figures
from kvjudge.judge.evidence import RunEvidence
from kvjudge.judge.jury import JuryVerdict, jury_verdicts
from kvjudge.judge.labels import LabelScore, PromptOverflow
from kvjudge.judge.ledger import CallCost, Ledger
from kvjudge.judge.metrics import brier, expected_calibration_error, reliability_bins, roc_auc
from kvjudge.judge.pipeline import Judge, judge_batch, judge_pair
from kvjudge.judge.pointwise import RunScore, score_runs
from kvjudge.judge.prompt import TEMPLATE_CHOICES, Framing, Prompt
from kvjudge.judge.protocols import DEFAULT_RUBRIC, PROTOCOLS, Criterion, JudgeProtocol, Rubric, make_protocol
from kvjudge.judge.render import escape, render_view
from kvjudge.judge.scale import Scale, letter_scale
from kvjudge.judge.select import STRATEGIES, Pick
from kvjudge.judge.server_backend import ServerBackend
from kvjudge.judge.server_pool import ServerPool
from kvjudge.judge.servers import open_servers
from kvjudge.judge.stillgrades import (
    StillGrades,
    StillGradesCheck,
    check_still_grades,
    cohen_kappa,
    still_grades,
    summarize_verdicts,
)
from kvjudge.judge.verdict import DEFAULT_MARGIN, OUTCOMES, SCORED, Verdict
from kvjudge.judge.window import Window, WindowPlanner

__all__ = [
    "Backend", "CallCost", "Criterion", "DEFAULT_MARGIN", "DEFAULT_RUBRIC", "Framing", "Judge", "JudgeProtocol",
    "JuryVerdict", "LabelScore", "Ledger", "LlamaBackend", "OUTCOMES", "PROTOCOLS", "Pick", "Prompt",
    "PromptOverflow", "Rubric", "RunEvidence", "RunScore", "SCORED", "STRATEGIES", "Scale", "ServerBackend",
    "ServerPool", "StillGrades", "StillGradesCheck", "TEMPLATE_CHOICES", "Verdict", "Window", "WindowPlanner",
    "brier", "candidates_of", "check_still_grades", "cohen_kappa", "escape", "expected_calibration_error",
    "judge_batch", "judge_pair", "jury_verdicts", "letter_scale", "make_protocol", "open_servers",
    "reliability_bins", "render_view", "roc_auc", "score_figures", "score_runs", "still_grades",
    "summarize_verdicts",
]
