"""What a judge protocol is: it turns a view (one run, or two) into prompts and a model's answer into a typed
score — nothing else. Repeats, criteria and juries are combined outside it, from its readings.

A protocol lists its :class:`Reading` s (one call each: a criterion, a question variant, an order of the runs),
builds each reading's prompt segments, and reads a call's level probabilities into a score in [0, 1]: for a
pairwise protocol the probability-like score that the run shown first is the better, for a pointwise one that the
run succeeded.

**Prompt layout.** What the calls of one view share comes first — the template's opening, the instructions, the
run(s) — and what varies comes last: the criterion, the question's wording and the scale's order. A server's prefix
cache (and the in-process backend's) therefore reuses everything up to the question. The first ``shared`` segments
(template opening, instructions, the delimiter after them) are the same in every call of the protocol.

**Repeats.** Reading ``k`` of a criterion asks question variant ``k``: one of :data:`WORDINGS` wordings, with the
scale listed worst → best, then the same wordings with it listed best → worst (so at most :data:`MAX_REPEATS`
repeats, each a prompt of its own: identical prompts are not repeats). A pairwise protocol asks each variant in both
orders of the runs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvjudge.errors import UsageError
from kvjudge.judge.labels import LabelScore
from kvjudge.judge.prompt import RAW_ANSWER_CUE, Framing, Quoted, TemplateText
from kvjudge.judge.protocols.rubric import Criterion, Rubric
from kvjudge.judge.scale import Scale
from kvjudge.settings import MAX_REPEATS

# The two orders of a pair's runs: a shown first (``ab``), b shown first (``ba``).
ORDERS: tuple[str, str] = ("ab", "ba")
WORDINGS = 4
assert MAX_REPEATS == 2 * WORDINGS  # [judge] repeats is checked against the variants there are
# The line of every scale question that names the levels (the simulated judge finds the scale by it).
SCALE_UP = "Scale, worst to best: "
SCALE_DOWN = "Scale, best to worst: "


@dataclass(frozen=True)
class Reading:
    """One call of a protocol: the criterion asked (None: the letter question), the question variant, and the
    order of the runs (``ab`` / ``ba`` for a pairwise protocol, None for a pointwise one)."""

    criterion: Criterion | None
    variant: int
    order: str | None

    @property
    def id(self) -> str:
        """``correctness/0/ab``: what names the reading in a verdict and in its cache key."""
        return f"{self.criterion.name if self.criterion else '-'}/{self.variant}/{self.order or '-'}"

    def key_part(self) -> str:
        """What of the reading its call's cache key takes: its id and the criterion's text."""
        return f"{self.id}\n{self.criterion.sha256 if self.criterion else ''}"


def check_repeats(repeats: int) -> int:
    if not 1 <= repeats <= MAX_REPEATS:
        raise UsageError(f"repeats must be 1 to {MAX_REPEATS} (each repeat is a question variant of its own: "
                         f"{WORDINGS} wordings, the scale in either order), got {repeats}; set [judge] repeats or "
                         f"--repeats")
    return repeats


def scale_line(scale: Scale, variant: int) -> str:
    """The scale as variant ``variant`` lists it: worst → best for the first :data:`WORDINGS`, then best → worst."""
    if (variant // WORDINGS) % 2 == 0:
        return SCALE_UP + " ".join(scale.levels)
    return SCALE_DOWN + " ".join(reversed(scale.levels))


def finish(framing: Framing, body: list[str], question: str) -> list[str]:
    """The prompt's segments: the template's opening (chat), the body, the question last (and the answer cue)."""
    if framing.name == "chat":
        return [TemplateText(framing.head), *body, question, TemplateText(framing.tail)]
    return [*body, question + RAW_ANSWER_CUE]


def quoted(view: Quoted) -> list[str]:
    """A view's segments (one string, or several), empty ones left out."""
    if isinstance(view, str):
        return [view] if view else []
    return [segment for segment in view if segment]


class JudgeProtocol:
    """The base of every protocol (see the module docstring). ``scale`` and ``rubric`` are None for the letter
    protocol; ``repeats`` is K."""

    name: ClassVar[str]
    kind: ClassVar[str]  # "pairwise" | "pointwise"
    summary: ClassVar[str]  # one line for --help and the docs
    version: ClassVar[str]  # bump when the protocol's instructions or questions change (part of the cache keys)

    def __init__(self, scale: Scale | None, rubric: Rubric | None, repeats: int = 1) -> None:
        self.scale, self.rubric, self.repeats = scale, rubric, check_repeats(repeats)

    def readings(self) -> list[Reading]:
        raise NotImplementedError

    @property
    def calls(self) -> int:
        """Calls a verdict (pairwise) or a run's score (pointwise) takes."""
        return len(self.readings())

    def shared(self, framing: Framing) -> int:
        """Leading segments the same in every call: the template's opening, the instructions, the next delimiter."""
        return framing.shared

    def score_of(self, answer: LabelScore) -> float:
        """A call's score in [0, 1]: the expected level value on the scale."""
        assert self.scale is not None
        return self.scale.expected(answer.probs)

    def manifest(self) -> dict[str, Any]:
        """What every verdict's manifest says of the protocol: its name, the levels worst → best, K, the rubric."""
        assert self.scale is not None and self.rubric is not None
        return {"protocol": self.name, "protocol_version": self.version, "levels": self.scale.manifest(),
                "repeats": self.repeats, "rubric": self.rubric.manifest(), "min_label_mass": self.scale.min_mass}

    def segments(self, framing: Framing, reading: Reading, first: Quoted, second: Quoted = "",
                 common: Quoted = "") -> list[str]:
        """The prompt of ``reading``: ``first`` (and ``second``, with the block ``common`` to both) quoted."""
        raise NotImplementedError

    def framing_segments(self, framing: Framing) -> list[str]:
        """The longest prompt of the protocol with empty views: what packing counts as the framing."""
        prompts = [self.segments(framing, reading, "", "") for reading in self.readings()]
        return [segment for segment in max(prompts, key=lambda p: sum(map(len, p))) if segment]

    def longest_criterion(self) -> Criterion | None:
        """The criterion with the longest text (named where the framing leaves the views no room)."""
        if self.rubric is None:
            return None
        return max(self.rubric.criteria, key=lambda c: len(c.text))


def reading_key(base: str, reading: Reading, protocol: JudgeProtocol) -> str:
    """A scale reading's call cache key: the order cache's key of the views, with the reading and the protocol."""
    blob = f"{base}\n{protocol.name}:{protocol.version}\n{reading.key_part()}"
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def mean_spread(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (None for fewer than two values)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def by_criterion(scores: Sequence[tuple[str | None, float]]) -> dict[str, dict[str, Any]]:
    """Per criterion: the mean of its readings, their spread (sd) and how many there are."""
    grouped: dict[str, list[float]] = {}
    for name, value in scores:
        if name is not None:
            grouped.setdefault(name, []).append(value)
    out = {}
    for name, values in grouped.items():
        mean, spread = mean_spread(values)
        out[name] = {"mean": mean, "spread": spread, "n": len(values)}
    return out


def combined(criteria: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The combined score: the mean of the criteria's means (each criterion weighs the same)."""
    means = [c["mean"] for c in criteria.values() if c["mean"] is not None]
    return sum(means) / len(means) if means else None


__all__ = ["JudgeProtocol", "MAX_REPEATS", "ORDERS", "Reading", "SCALE_DOWN", "SCALE_UP", "WORDINGS", "by_criterion",
           "check_repeats", "combined", "finish", "mean_spread", "quoted", "reading_key", "scale_line"]
