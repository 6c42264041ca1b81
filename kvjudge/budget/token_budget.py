"""``TokenBudget``: keep turns up to ``threshold_pct`` of the model's context window.

Fullness anchors on the backend's last reported prompt size, which already includes the system prompt
and every prior turn, plus what was added or removed since that report: the reply as the backend counted
it when it reported ``output_tokens`` (else its estimate), every later message's estimate, and — when the
estimation counts it — the chat template's tokens around each message. The
legacy figure summed input + output per turn across history, counting every prior turn again
in every later reading (5.4x inflation by turn 20), which forced pruning the real context never needed.
Without any report the figure is the sum of per-turn estimates, each turn counted once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvjudge.budget.estimation import TokenEstimation
from kvjudge.budget.provider import ConversationTurn, MemMessage, MemoryProvider, TurnMetrics
from kvjudge.errors import UsageError

MIN_MAX_TOKENS = 512
MIN_THRESHOLD_PCT = 0.1
MAX_THRESHOLD_PCT = 0.99
DEFAULT_THRESHOLD_PCT = 0.8


@dataclass(frozen=True)
class _Turn:
    """A turn in history with its estimate, computed once (pruning subtracts the same figure it added)."""

    record: ConversationTurn
    estimate: int


def _clamp_max_tokens(max_tokens: int) -> int:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise UsageError(f"the token budget must be a whole number of tokens, got {max_tokens!r}")
    return max(MIN_MAX_TOKENS, max_tokens)


def _clamp_threshold(threshold_pct: float) -> float:
    if isinstance(threshold_pct, bool) or not isinstance(threshold_pct, (int, float)) or math.isnan(threshold_pct):
        raise UsageError(f"threshold_pct must be a number between 0.1 and 0.99, got {threshold_pct!r}")
    return min(MAX_THRESHOLD_PCT, max(MIN_THRESHOLD_PCT, float(threshold_pct)))


def _check_count(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{what} must be a non-negative whole number of tokens or None, got {value!r}")
    return value


class TokenBudget(MemoryProvider):
    """Keeps whole turns while the conversation's fullness stays within ``int(max_tokens * threshold_pct)``.

    ``max_tokens`` is clamped to at least 512 and ``threshold_pct`` to [0.1, 0.99]. The budget is a
    construction-time value: resolve it with :func:`kvjudge.budget.resolve_budget` and inject it.
    """

    def __init__(self, max_tokens: int, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> None:
        self._max_tokens = _clamp_max_tokens(max_tokens)
        self._threshold_pct = _clamp_threshold(threshold_pct)
        self._estimation = TokenEstimation()
        self._history: list[_Turn] = []
        self._anchor: int | None = None  # the last reported prompt size; None until a backend reports one
        self._delta = 0  # estimates added (+) or removed (-) since the anchor; the whole figure without one
        self._pruned = 0

    # -- builders ---------------------------------------------------------------------------------------

    def with_estimation(self, estimation: TokenEstimation) -> TokenBudget:
        """Builder: set the token-estimation heuristic (``[context.estimation]``). Only before the first turn."""
        if self._history:
            # Turns already counted under the old heuristic would be subtracted under the new one.
            raise UsageError("set the token estimation before the first turn (or call reset() first)")
        self._estimation = estimation
        return self

    def with_budget(self, tokens: int) -> TokenBudget:
        """Builder: inject a resolved token budget (same >= 512 clamp as the constructor)."""
        self._max_tokens = _clamp_max_tokens(tokens)
        self._prune()
        return self

    # -- read-only views --------------------------------------------------------------------------------

    @property
    def max_tokens(self) -> int:
        """The (clamped) context size the budget is a share of."""
        return self._max_tokens

    @property
    def threshold_pct(self) -> float:
        """The (clamped) share of ``max_tokens`` the conversation may fill."""
        return self._threshold_pct

    @property
    def prune_above(self) -> int:
        """The prune threshold, ``int(max_tokens * threshold_pct)``: fullness above this drops the oldest turns.

        Not the budget: the budget is ``max_tokens``, of which the conversation may fill this share.
        """
        return int(self._max_tokens * self._threshold_pct)

    @property
    def estimation(self) -> TokenEstimation:
        """The heuristic used for content the backend has not reported on."""
        return self._estimation

    @property
    def anchor(self) -> int | None:
        """The backend's last reported prompt size, or None when no report has been seen."""
        return self._anchor

    @property
    def pruned_turns(self) -> int:
        """Turns dropped by pruning since construction, the last reset or the last restore."""
        return self._pruned

    @property
    def history(self) -> tuple[ConversationTurn, ...]:
        """The turns currently kept, oldest first."""
        return tuple(turn.record for turn in self._history)

    def fullness(self) -> int:
        """Anchor plus estimates since (or the sum of turn estimates without an anchor); never below zero."""
        return max(0, (self._anchor or 0) + self._delta)

    # -- MemoryProvider ---------------------------------------------------------------------------------

    def name(self) -> str:
        return "token_budget"

    def build_messages(self, system_prompt: str, new_task: str) -> list[MemMessage]:
        """``[system] + history + [new_task]``; empty texts (e.g. a compaction record's reply) are left out."""
        messages = [MemMessage("system", system_prompt)]
        for turn in self._history:
            messages.append(MemMessage("user", turn.record.user))
            messages.append(MemMessage("assistant", turn.record.assistant))
        messages.append(MemMessage("user", new_task))
        return [message for message in messages if message.content.strip()]

    async def sync_turn(self, user: str, assistant: str, metrics: TurnMetrics) -> None:
        """Append the turn, re-anchor on a reported prompt size (else add the turn's estimate), then prune."""
        input_tokens = _check_count(metrics.input_tokens, "input_tokens")
        output_tokens = _check_count(metrics.output_tokens, "output_tokens")
        turn = self._make_turn(ConversationTurn(user, assistant, input_tokens, output_tokens))
        self._history.append(turn)
        if input_tokens is not None:
            # The reported prompt already holds the system prompt, all earlier turns and this user text;
            # only the reply (with the template's markup around it) is new since. Its size was reported too
            # when output_tokens is given: a measurement, not an estimate (the template's markup still is one).
            self._anchor = input_tokens
            self._delta = self._reply_tokens(assistant, output_tokens)
        else:
            self._delta += turn.estimate
        self._prune()

    def reset(self) -> None:
        """Forget the conversation; keep max_tokens, threshold and estimation."""
        self._history.clear()
        self._anchor = None
        self._delta = 0
        self._pruned = 0

    def restore_turns(self, turns: Sequence[ConversationTurn]) -> None:
        """Rebuild history from durable turns, anchored on the last turn that carries ``tokens_in``.

        The anchor is that figure plus the estimate of its reply and of every later turn. With no
        ``tokens_in`` anywhere there is no anchor: an estimate is never presented as a measurement.
        """
        restored = [self._make_turn(turn) for turn in turns]
        for turn in restored:
            _check_count(turn.record.tokens_in, "tokens_in")
            _check_count(turn.record.tokens_out, "tokens_out")
        last = max((i for i, turn in enumerate(restored) if turn.record.tokens_in is not None), default=None)
        self._history = restored
        self._pruned = 0
        if last is None:
            self._anchor = None
            self._delta = sum(turn.estimate for turn in restored)
        else:
            record = restored[last].record
            self._anchor = record.tokens_in
            self._delta = self._reply_tokens(record.assistant, record.tokens_out) + sum(
                turn.estimate for turn in restored[last + 1:]
            )
        self._prune()

    def usage(self) -> tuple[str, int, int]:
        """``("tokens", fullness, prune_above)``."""
        return ("tokens", self.fullness(), self.prune_above)

    # -- internals --------------------------------------------------------------------------------------

    def _reply_tokens(self, assistant: str, output_tokens: int | None) -> int:
        """The reply's share of the next prompt: the backend's count of it when reported, else its estimate;
        plus the template's markup around it (a blank reply is never sent)."""
        if output_tokens is None:
            return self._estimation.message("assistant", assistant)
        return output_tokens + (self._estimation.template.of("assistant") if assistant.strip() else 0)

    def _make_turn(self, record: ConversationTurn) -> _Turn:
        return _Turn(record, self._estimation.turn(record.user, record.assistant))

    def _prune(self) -> None:
        # Oldest whole turn first; the system prompt is not history and is never dropped.
        while self._history and self.fullness() > self.prune_above:
            dropped = self._history.pop(0)
            self._delta -= dropped.estimate
            self._pruned += 1
