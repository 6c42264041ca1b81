"""Judgments of chosen probabilities, written into a store's judgment cache where the judge writes its own.

A judge of known behaviour at no model time: the views, the prompts and the cache keys are the judge's own
(:meth:`~kvjudge.judge.Judge.prepare_pairs`, :meth:`~kvjudge.judge.Judge.order_prompts`,
:meth:`~kvjudge.judge.Judge.record_score`); only the label probabilities are chosen. ``kvjudge eval``, ``rank``
and ``report`` run with the same judge settings (model, framing, ``--n-ctx``) then read those verdicts from the
cache, as they would read verdicts a real judge left there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvjudge.judge import Judge, LabelScore, PackedPair


def seed_judgments(judge: Judge, store: Any, choices: Mapping[tuple[str, str], tuple[float, float]], *,
                   label_mass: float = 0.9) -> int:
    """Cache both orders of each pair ``(a, b)`` of ``choices``: ``(p_ab, p_ba)`` are the probabilities that run
    a is better as asked with a shown first and with b shown first (so order ``ba``'s label A, run b, gets
    ``1 - p_ba``). The pairs are packed together, in one window, as a judge run over exactly them would pack
    them. Returns the number of judgments written."""
    pairs = list(choices)
    manifest = judge.manifest()
    written = 0
    for (a, b), item in zip(pairs, judge.prepare_pairs(store, pairs)):
        if not isinstance(item, PackedPair):
            raise ValueError(f"pair ({a}, {b}) could not be packed: {item.error}")
        p_ab, p_ba = choices[(a, b)]
        for prompt in judge.order_prompts(item.view_a, item.view_b):
            first = p_ab if prompt.order == "ab" else 1.0 - p_ba
            tokens = judge.framing_tokens + item.view_a.tokens.view + item.view_b.tokens.view  # packing is exact
            judge.record_score(store, prompt, LabelScore(probs={"A": first, "B": 1.0 - first}, label_mass=label_mass,
                                                         prompt_tokens=tokens), manifest)
            written += 1
    return written
