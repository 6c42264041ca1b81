"""The answer scale of a judge question: G one-token level labels ordered worst → best, their spellings, the
expected score over them, and the label mass a reading needs.

A reading is never a sampled token: the backend reads the probability of every level's spellings (``" C"`` after
a space, a bare ``"C"``) from the next-token distribution — the logits in-process, the top logprobs of a server —
and the score is the probability-weighted mean of the levels' values (level ``i`` of ``G`` is worth ``i / (G-1)``:
0 for the worst, 1 for the best). A level absent from a server's top logprobs has probability 0 there (the label
mass then says how much was seen). When the levels hold less than ``min_mass`` of the next-token probability the
model was answering something else: the reading is an error, never a score.

Why the defaults (:data:`DEFAULT_LEVELS` = 10 letters A–J, :data:`DEFAULT_MIN_MASS` = 0.5): a server reports at most
its top-N logprobs (vLLM: 20 unless started with a larger ``--max-logprobs``); ten levels fit there with room for ten
other tokens the model may rank above the lower levels, where LLM-as-a-Verifier's twenty would fill the list and
lose the levels pushed out of it. Single capital letters are one token in every tokenizer kvjudge ships with (the
bundled Qwen2.5 judge included; :class:`~kvjudge.judge.backends.LlamaBackend` checks). Half the probability on the
scale is where the answer is more a reading of the scale than of what the model wanted to say instead. Both are
settings (``[judge] levels``, ``[judge] min_label_mass``).
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass

from kvjudge.errors import JudgeError, UsageError
from kvjudge.settings import DEFAULT_LEVELS
from kvjudge.settings import DEFAULT_MIN_LABEL_MASS as DEFAULT_MIN_MASS

MAX_LEVELS = len(string.ascii_uppercase)


@dataclass(frozen=True)
class Scale:
    """``levels``: the level tokens, worst first; ``min_mass``: the least label mass a reading may have."""

    levels: tuple[str, ...]
    min_mass: float = 0.0

    def __post_init__(self) -> None:
        if len(self.levels) < 2:
            raise UsageError(f"a judge scale needs at least 2 levels, got {len(self.levels)}; set [judge] levels")
        if len(set(self.levels)) != len(self.levels):
            raise UsageError(f"the judge scale names a level twice ({' '.join(self.levels)})")
        if not 0.0 <= self.min_mass <= 1.0:
            raise UsageError(f"the least label mass must be in [0, 1], got {self.min_mass}; set [judge] "
                             f"min_label_mass")

    @property
    def size(self) -> int:
        return len(self.levels)

    def spellings(self, level: str) -> tuple[str, str]:
        """The tokens that count for ``level``: after a space (a raw prompt's ``Answer:``) and bare (a chat turn)."""
        return (f" {level}", level)

    def value(self, level: str) -> float:
        """A level's value: 0 for the worst, 1 for the best, evenly spaced."""
        return self.levels.index(level) / (self.size - 1)

    def expected(self, probs: Mapping[str, float]) -> float:
        """The probability-weighted mean of the levels' values (``probs`` renormalised over the levels)."""
        return sum(probs.get(level, 0.0) * self.value(level) for level in self.levels)

    def read(self, raw: Mapping[str, float]) -> tuple[dict[str, float], float]:
        """Level probabilities (each summed over its spellings, from the full distribution) → renormalised, mass.
        Too little mass is an error: the reading is not a score."""
        mass = sum(raw.get(level, 0.0) for level in self.levels)
        if not mass > 0 or not math.isfinite(mass):
            raise JudgeError(f"the model gave the scale's levels ({self.describe()}) no probability; check the "
                             f"model and prompt")
        if mass < self.min_mass:
            raise JudgeError(f"the scale's levels held {mass:.3f} of the answer's probability, under the least "
                             f"{self.min_mass:g} ([judge] min_label_mass): the model did not answer on the scale")
        return {level: raw.get(level, 0.0) / mass for level in self.levels}, mass

    def describe(self) -> str:
        return f"{self.levels[0]}..{self.levels[-1]}" if self.size > 3 else " ".join(self.levels)

    def manifest(self) -> list[str]:
        return list(self.levels)


def letter_scale(levels: int = DEFAULT_LEVELS, min_mass: float = DEFAULT_MIN_MASS) -> Scale:
    """``levels`` capital letters from A (worst) on: the default scale of the scale protocols."""
    if not 2 <= levels <= MAX_LEVELS:
        raise UsageError(f"a letter scale has 2 to {MAX_LEVELS} levels, got {levels}; set [judge] levels or --levels")
    return Scale(tuple(string.ascii_uppercase[:levels]), min_mass)


__all__ = ["DEFAULT_LEVELS", "DEFAULT_MIN_MASS", "MAX_LEVELS", "Scale", "letter_scale"]
