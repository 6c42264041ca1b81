"""The judge protocols, in one registry: ``--protocol``'s choices, its ``--help`` and the docs' table come from
:data:`PROTOCOLS`.

- ``letter`` (:mod:`~kvjudge.judge.protocols.letter`): which run is better, A or B — today's forced choice.
- ``pairwise-scale`` and ``pointwise`` (:mod:`~kvjudge.judge.protocols.scaled`): one level of a G-level scale per
  criterion of the rubric (:mod:`~kvjudge.judge.protocols.rubric`) and repeat, read as an expected score.

Public API: :data:`PROTOCOLS` (by kind: :data:`PAIRWISE`, :data:`POINTWISE`), :func:`make_protocol`, the protocol
classes, the :class:`Scale` (:func:`letter_scale`) and :class:`Rubric` of :class:`Criterion` (:data:`DEFAULT_RUBRIC`,
at most :data:`MAX_REPEATS` repeats). A protocol turns views into prompts and answers into scores
(:mod:`~kvjudge.judge.protocols.base`, whose readings and their combination are imported from there); the pipeline
(pairwise) and :mod:`kvjudge.judge.pointwise` (one run at a time) run its calls and combine its readings.
"""

from __future__ import annotations

from kvjudge.errors import UsageError
from kvjudge.judge.protocols.base import MAX_REPEATS, JudgeProtocol
from kvjudge.judge.protocols.letter import LetterProtocol
from kvjudge.judge.protocols.rubric import DEFAULT_RUBRIC, Criterion, Rubric, rubric_from_setting
from kvjudge.judge.protocols.scaled import PairwiseScaleProtocol, PointwiseProtocol
from kvjudge.judge.scale import DEFAULT_LEVELS, DEFAULT_MIN_MASS, Scale, letter_scale

PROTOCOLS: dict[str, type[JudgeProtocol]] = {cls.name: cls for cls in (LetterProtocol, PairwiseScaleProtocol,
                                                                        PointwiseProtocol)}
PAIRWISE = tuple(name for name, cls in PROTOCOLS.items() if cls.kind == "pairwise")
POINTWISE = tuple(name for name, cls in PROTOCOLS.items() if cls.kind == "pointwise")


def make_protocol(name: str, *, levels: int = DEFAULT_LEVELS, min_mass: float = DEFAULT_MIN_MASS,
                  rubric: Rubric | str | tuple[str, ...] | list[str] | None = None, repeats: int = 1,
                  rubric_given: bool | None = None) -> JudgeProtocol:
    """The protocol ``name`` with its scale (``levels`` letters), rubric (a Rubric, a rubric file, ``"name: text"``
    strings, or None for the default) and K ``repeats``. The letter protocol takes neither a rubric nor repeats."""
    cls = PROTOCOLS.get(name)
    if cls is None:
        raise UsageError(f"unknown judge protocol {name!r}; choose one of {', '.join(PROTOCOLS)}")
    if cls is LetterProtocol:
        given = rubric is not None if rubric_given is None else rubric_given
        if repeats != 1 or given:
            raise UsageError("the letter protocol asks one question in both orders: a rubric or repeats need a "
                             "scale protocol (--protocol pairwise-scale or pointwise)")
        return LetterProtocol()
    chosen = rubric if isinstance(rubric, Rubric) else rubric_from_setting(rubric)
    return cls(letter_scale(levels, min_mass), chosen, repeats)


__all__ = ["Criterion", "DEFAULT_RUBRIC", "JudgeProtocol", "LetterProtocol", "MAX_REPEATS", "PAIRWISE", "POINTWISE",
           "PROTOCOLS", "PairwiseScaleProtocol", "PointwiseProtocol", "Rubric", "Scale", "letter_scale",
           "make_protocol"]
