"""The ``letter`` protocol: today's pairwise forced choice — which run is better, A or B? — asked in both orders.

Its prompts, answers and cache keys are those kvjudge always had (:mod:`kvjudge.judge.prompt`,
:mod:`kvjudge.judge.labels`): the manifest says ``protocol = letter`` and the levels ``B, A`` (worst → best for the
run shown first), but nothing of it enters a cache key, so verdicts cached before protocols existed are still read.
"""

from __future__ import annotations

from typing import Any

from kvjudge.judge.labels import LabelScore
from kvjudge.judge.prompt import Framing, Quoted
from kvjudge.judge.protocols.base import ORDERS, JudgeProtocol, Reading


class LetterProtocol(JudgeProtocol):
    """Which run is better, A or B: the probability of one letter in each order, un-swapped (today's forced
    choice; no scale, rubric or repeats)."""

    name = "letter"
    kind = "pairwise"
    summary = "which run is better, A or B: one letter's probability, both orders (no rubric, no repeats)"
    version = "letter-1"

    def __init__(self, scale: Any = None, rubric: Any = None, repeats: int = 1) -> None:
        super().__init__(None, None, repeats)

    def readings(self) -> list[Reading]:
        return [Reading(None, 0, order) for order in ORDERS]

    def segments(self, framing: Framing, reading: Reading, first: Quoted, second: Quoted = "",
                 common: Quoted = "") -> list[str]:
        return framing.segments(first, second, common)

    def framing_segments(self, framing: Framing) -> list[str]:
        return framing.framing_segments()

    def score_of(self, answer: LabelScore) -> float:
        return answer.probs["A"]

    def manifest(self) -> dict[str, Any]:
        return {"protocol": self.name, "levels": ["B", "A"], "repeats": 1, "rubric": []}
