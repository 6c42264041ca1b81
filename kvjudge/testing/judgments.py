"""Judgments of chosen probabilities, written into a store's judgment cache where the judge writes its own.

A judge of known behaviour at no model time: the views, the prompts and the cache keys are the judge's own
(:meth:`~kvjudge.judge.Judge.pack_pair` in the window the judge would open for these pairs,
:meth:`~kvjudge.judge.Judge.order_prompts`, :func:`~kvjudge.judge.verdict.score_payload`); only the label
probabilities are chosen. ``kvjudge eval``, ``rank``
and ``report`` run with the same judge settings (model, framing, ``--n-ctx``) then read those verdicts from the
cache, as they would read verdicts a real judge left there.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvjudge.judge import Judge, LabelScore
from kvjudge.judge.verdict import score_payload
from kvjudge.judge.window import window_tokens
from kvjudge.retention import Store


def seed_judgments(judge: Judge, store: Store, choices: Mapping[tuple[str, str], tuple[float, float]], *,
                   label_mass: float = 0.9) -> int:
    """Cache both orders of each pair ``(a, b)`` of ``choices``: ``(p_ab, p_ba)`` are the probabilities that run
    a is better as asked with a shown first and with b shown first (so order ``ba``'s label A, run b, gets
    ``1 - p_ba``). The pairs are packed together, in one window, as a judge run over exactly them would pack
    them. Returns the number of judgments written."""
    pairs = list(choices)
    bases = {run_id: judge.base(store, run_id) for pair in pairs for run_id in pair}
    needed = max(judge.needed_tokens(bases[a], bases[b]) for a, b in pairs)
    n_ctx = judge.planner.plan(needed).n_ctx if judge.planner is not None else \
        (judge.backend.n_ctx or window_tokens(needed))
    manifest = judge.manifest()
    written = 0
    with store.transaction("seed_judgments"):
        for a, b in pairs:
            view_a, view_b = judge.pack_pair(store, a, b, n_ctx)
            if view_a.text is None or view_b.text is None:
                raise ValueError(f"pair ({a}, {b}) does not fit a window of {n_ctx} tokens")
            p_ab, p_ba = choices[(a, b)]
            tokens = judge.framing_tokens + view_a.tokens.view + view_b.tokens.view + view_a.common_tokens
            for prompt in judge.order_prompts(view_a, view_b):
                first = p_ab if prompt.order == "ab" else 1.0 - p_ba
                score = LabelScore(probs={"A": first, "B": 1.0 - first}, label_mass=label_mass, prompt_tokens=tokens)
                store.caches.put_judgment(prompt.key, score_payload(score, manifest))
                written += 1
    return written
