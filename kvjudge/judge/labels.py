"""Forced-choice scores: the answer labels, the spellings that count for each, renormalisation, and what one call
returns or raises.

Every backend answers one question — given a prompt, what probability does the model put on each answer label as
its next token? — by forced choice: no sampling, no free-text parsing. A label may be spelled by several tokens
(``" A"`` after ``"Answer:"``, or a bare ``"A"``); their probabilities are summed, then renormalised over the labels,
so only their ratio matters.

:func:`score_in_turn` is the sequential way of scoring many prompts (a backend that answers one call at a time);
a pool of servers has its own, concurrent one, with the same callback.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvjudge.errors import AuthRefused, JudgeError
from kvjudge.judge.ledger import CallCost
from kvjudge.judge.prompt import Prompt
from kvjudge.judge.scale import Scale

# The answer labels and the spellings whose probabilities count for each.
LABELS: tuple[str, str] = ("A", "B")
SPELLINGS: dict[str, tuple[str, ...]] = {label: (f" {label}", label) for label in LABELS}


class PromptOverflow(JudgeError):
    """The prompt does not fit the backend's context (an outcome of its own: ``overflow``)."""


@dataclass(frozen=True)
class LabelScore:
    """What one forced-choice call returned.

    ``probs`` maps each label to its probability renormalised over the labels (they sum to 1);
    ``label_mass`` is how much of the full next-token distribution the labels held (a low figure
    means the model wanted to say something else — worth knowing, not an error).
    """

    probs: dict[str, float]
    label_mass: float
    prompt_tokens: int
    reused_tokens: int = 0
    server: str | None = None  # the server that answered (server backends)
    cost: CallCost | None = None  # what the call cost as its answerer measured it (None: read from a cache)


def renormalise(raw: dict[str, float]) -> tuple[dict[str, float], float]:
    """Label probabilities (summed over spellings, from the full distribution) → renormalised, mass."""
    mass = sum(raw.values())
    if not mass > 0 or not math.isfinite(mass):
        raise JudgeError(f"the model gave the answer labels no probability ({raw}); check the model and prompt")
    return {label: raw[label] / mass for label in LABELS}, mass


# on_result(group, position, score, error, server that answered, seconds the answering call took): one call per
# prompt of every group, in the thread that asked.
ResultFn = Callable[[int, int, "LabelScore | None", "JudgeError | None", "str | None", float], None]


def score_in_turn(score: Callable[[Sequence[str], int, Scale | None], LabelScore], groups: Iterable[Sequence[Prompt]],
                  on_result: ResultFn) -> None:
    """Score every prompt of every group, one call at a time, in order (groups are taken as they are needed).

    A failure is reported as the prompt's error, never raised: a backend bug or a runtime crash becomes a
    :class:`JudgeError` (an outcome, never a score).
    """
    for index, group in enumerate(groups):
        for position, prompt in enumerate(group):
            started = time.perf_counter()
            try:
                answer = score(prompt.segments, prompt.shared, prompt.scale)
            except JudgeError as exc:
                on_result(index, position, None, exc, None, time.perf_counter() - started)
                continue
            except AuthRefused:
                raise  # the credentials are a setting to fix, the same for every call: the command stops
            except Exception as exc:  # noqa: BLE001 - a backend bug or a runtime crash is an outcome, never a score
                failure = JudgeError(f"the judge backend failed ({type(exc).__name__}: {exc})")
                on_result(index, position, None, failure, None, time.perf_counter() - started)
                continue
            on_result(index, position, answer, None, answer.server, time.perf_counter() - started)


__all__ = ["LABELS", "SPELLINGS", "LabelScore", "PromptOverflow", "ResultFn", "renormalise", "score_in_turn"]
