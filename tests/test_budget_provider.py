"""TokenBudget, rule by rule (kvjudge/budget/token_budget.py), and the MemoryProvider contract it keeps
(kvjudge/budget/provider.py)."""

from __future__ import annotations

import asyncio
import math

import pytest

from kvjudge.budget import ConversationTurn, MemMessage, TokenBudget, TokenEstimation, TurnMetrics
from kvjudge.errors import NotesUnsupported, UsageError


def sync(budget: TokenBudget, user: str, assistant: str, input_tokens: int | None = None,
         output_tokens: int | None = None) -> None:
    asyncio.run(budget.sync_turn(user, assistant, TurnMetrics(input_tokens, output_tokens)))


def est(text: str, n: float = 4) -> int:
    # The chars-per-token heuristic (UTF-8 bytes / n, rounded up), written out independently of the code under test.
    return math.ceil(len(text.encode("utf-8")) / n)


def big() -> TokenBudget:
    return TokenBudget(1_000_000, 0.99)


# -- construction and clamps ---------------------------------------------------------------------------

def test_name_and_usage_label() -> None:
    budget = TokenBudget(10_000, 0.8)
    assert budget.name() == "token_budget"
    assert budget.usage() == ("tokens", 0, 8000)


@pytest.mark.parametrize(("max_tokens", "expected"), [(0, 512), (-5, 512), (100, 512), (511, 512), (512, 512),
                                                      (513, 513), (200_000, 200_000)])
def test_max_tokens_is_clamped_to_at_least_512(max_tokens: int, expected: int) -> None:
    assert TokenBudget(max_tokens, 0.5).max_tokens == expected
    assert TokenBudget(100_000, 0.5).with_budget(max_tokens).max_tokens == expected


@pytest.mark.parametrize(("pct", "expected"), [(0.0, 0.1), (-1.0, 0.1), (0.05, 0.1), (0.1, 0.1), (0.5, 0.5),
                                               (0.99, 0.99), (1.0, 0.99), (7, 0.99)])
def test_threshold_is_clamped_to_range(pct: float, expected: float) -> None:
    assert TokenBudget(1000, pct).threshold_pct == expected


def test_budget_is_truncated_product() -> None:
    assert TokenBudget(8192, 0.8).prune_above == 6553  # 6553.6 truncated
    assert TokenBudget(1000, 0.05).prune_above == 100  # threshold clamped first
    assert TokenBudget(100, 0.5).prune_above == 256  # max_tokens clamped first
    assert TokenBudget(100_000, 0.5).with_budget(3000).prune_above == 1500


@pytest.mark.parametrize("bad", [None, 1.5, "1000", True])
def test_non_integer_budget_is_a_usage_error(bad: object) -> None:
    with pytest.raises(UsageError, match="whole number"):
        TokenBudget(bad, 0.5)  # type: ignore[arg-type]


def test_nan_threshold_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="threshold_pct"):
        TokenBudget(1000, float("nan"))


# -- fullness -----------------------------------------------------------------------------------------

def test_estimate_only_counts_each_turn_once() -> None:
    budget = big()
    turns = [("what is 2+2?", "4"), ("and in binary?", "100, which is four"), ("é" * 9, "ok")]
    for user, assistant in turns:
        sync(budget, user, assistant)
    assert budget.anchor is None
    assert budget.fullness() == sum(est(u) + est(a) for u, a in turns)
    # UTF-8 bytes, each side rounded up on its own: "é"*9 is 18 bytes -> 5, "ok" -> 1.
    assert est("é" * 9) + est("ok") == 6


def test_report_anchors_and_adds_only_the_reply() -> None:
    budget = big()
    sync(budget, "a" * 400, "b" * 400)  # no report: 100 + 100
    assert budget.fullness() == 200
    # The backend says the next prompt (system + turn 1 + this user text) was 950 tokens.
    sync(budget, "c" * 40, "d" * 81, input_tokens=950, output_tokens=20)
    assert budget.anchor == 950
    assert budget.fullness() == 950 + 20  # earlier turns are not added again; the reply as the backend counted it
    # Without output_tokens the reply is estimated: chars/4 of 81 characters, rounded up.
    sync(budget, "e" * 40, "f" * 81, input_tokens=1000)
    assert budget.fullness() == 1000 + est("f" * 81) == 1021


def test_anchor_never_double_counts_over_many_turns() -> None:
    budget = big()
    system = 300
    real_prompt = system
    for turn in range(30):
        user, assistant = f"question {turn} " * 5, f"answer {turn} " * 7
        real_prompt += est(user)
        sync(budget, user, assistant, input_tokens=real_prompt, output_tokens=est(assistant))
        real_prompt += est(assistant)
        # With a perfect estimator the anchored figure is exactly the real context.
        assert budget.fullness() == real_prompt
    legacy = sum(t.tokens_in + t.tokens_out for t in budget.history)  # the old figure: input + output summed per turn
    assert legacy > 10 * budget.fullness()


def test_turn_without_report_after_anchor_adds_its_estimate() -> None:
    budget = big()
    sync(budget, "u" * 8, "a" * 8, input_tokens=500)
    sync(budget, "x" * 40, "y" * 44)  # not measured
    assert budget.fullness() == 500 + 2 + 10 + 11


def test_fullness_never_below_zero() -> None:
    budget = TokenBudget(512, 0.1)  # budget 51
    # A tiny report, then a long turn that must be pruned: subtracting its estimate would go negative.
    sync(budget, "x" * 400, "y" * 400, input_tokens=3)
    assert budget.history == ()
    assert budget.fullness() == 0
    assert budget.usage() == ("tokens", 0, 51)


def test_report_of_zero_is_a_measurement() -> None:
    budget = big()
    sync(budget, "hello", "world", input_tokens=0)
    assert budget.anchor == 0
    assert budget.fullness() == est("world")


@pytest.mark.parametrize("bad", [-1, 2.5, "10"])
def test_bad_metrics_are_rejected(bad: object) -> None:
    with pytest.raises(UsageError, match="input_tokens"):
        sync(big(), "u", "a", input_tokens=bad)  # type: ignore[arg-type]


# -- pruning ------------------------------------------------------------------------------------------

def test_prunes_oldest_whole_turns_until_within_budget() -> None:
    budget = TokenBudget(1000, 0.5)  # budget 500
    for index in range(5):
        sync(budget, f"{index}" * 400, f"{index}" * 400)  # 200 each, no report
    # 5 x 200 = 1000 would be over 500: turns 0, 1, 2 go, oldest first, whole.
    assert [t.user[0] for t in budget.history] == ["3", "4"]
    assert budget.fullness() == 400
    assert budget.pruned_turns == 3


def test_prune_subtracts_the_dropped_turns_estimate_from_the_anchor() -> None:
    budget = TokenBudget(2000, 0.5)  # budget 1000
    sync(budget, "a" * 400, "b" * 400, input_tokens=400)  # 400 + 100
    sync(budget, "c" * 400, "d" * 400, input_tokens=900)  # 900 + 100 = 1000: at budget, kept
    assert len(budget.history) == 2 and budget.fullness() == 1000
    sync(budget, "e" * 4, "f" * 4, input_tokens=1001)  # 1001 + 1 > 1000: drop turn 1 (200)
    assert [t.user[0] for t in budget.history] == ["c", "e"]
    assert budget.fullness() == 1002 - 200


def test_system_prompt_is_never_pruned_and_history_may_empty() -> None:
    budget = TokenBudget(512, 0.5)  # budget 256
    sync(budget, "q", "a", input_tokens=5000)  # the system prompt alone exceeds the budget
    assert budget.history == ()
    messages = budget.build_messages("SYSTEM", "next")
    assert messages == [MemMessage("system", "SYSTEM"), MemMessage("user", "next")]
    assert budget.fullness() == 5000 + 1 - 2  # still over: nothing left to drop, no loop


def test_pruning_again_with_a_smaller_injected_budget() -> None:
    budget = big()
    for index in range(4):
        sync(budget, "x" * 400, "y" * 400)
    budget.with_budget(800)  # budget int(800 * 0.99) = 792: 800 must shed one turn
    assert len(budget.history) == 3


# -- messages -----------------------------------------------------------------------------------------

def test_build_messages_order_and_no_empty_message() -> None:
    budget = big()
    sync(budget, "first question", "first answer")
    sync(budget, "[summary of earlier turns]", "")  # a compaction record: empty reply
    messages = budget.build_messages("be brief", "third question")
    assert [m.to_dict() for m in messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "[summary of earlier turns]"},
        {"role": "user", "content": "third question"},
    ]
    assert all(m.content for m in budget.build_messages("", "x"))


# -- restore and reset --------------------------------------------------------------------------------

def test_restore_anchors_on_last_turn_with_tokens_in() -> None:
    budget = big()
    turns = [
        ConversationTurn("u1" * 10, "a1" * 10, tokens_in=700, tokens_out=9),
        ConversationTurn("u2" * 10, "a2" * 30, tokens_in=760, tokens_out=20),
        ConversationTurn("u3" * 20, "a3" * 20),  # not measured
        ConversationTurn("u4" * 2, ""),  # a compaction record
    ]
    budget.restore_turns(turns)
    assert budget.history == tuple(turns)
    assert budget.anchor == 760
    # The anchored turn's reply as the backend counted it (20), the later turns estimated.
    assert budget.fullness() == 760 + 20 + est("u3" * 20) + est("a3" * 20) + est("u4" * 2)


def test_restore_without_tokens_in_is_an_estimate_not_a_measurement() -> None:
    budget = big()
    sync(budget, "old", "turn", input_tokens=9999)  # an anchor from before the restore must not survive
    turns = [ConversationTurn("a" * 40, "b" * 40, tokens_out=12), ConversationTurn("c" * 4, "d" * 4)]
    budget.restore_turns(turns)
    assert budget.anchor is None
    assert budget.fullness() == 10 + 10 + 1 + 1


def test_restore_then_prunes() -> None:
    budget = TokenBudget(1000, 0.5)  # budget 500
    turns = [ConversationTurn(str(i) * 400, str(i) * 400) for i in range(4)]
    budget.restore_turns(turns)
    assert [t.user[0] for t in budget.history] == ["2", "3"]
    assert budget.pruned_turns == 2


def test_reset_clears_history_and_anchor_but_keeps_configuration() -> None:
    budget = TokenBudget(4096, 0.6).with_estimation(TokenEstimation.chars(2))
    sync(budget, "a" * 10, "b" * 10, input_tokens=300)
    budget.reset()
    assert budget.history == () and budget.anchor is None and budget.fullness() == 0
    assert (budget.max_tokens, budget.threshold_pct, budget.estimation.name) == (4096, 0.6, "chars/2")
    sync(budget, "a" * 10, "b" * 10)
    assert budget.fullness() == 10  # chars/2 still in force


def test_estimation_is_used_and_fixed_before_first_turn() -> None:
    budget = big().with_estimation(TokenEstimation.chars(3))
    sync(budget, "abcdefg", "xy")
    assert budget.fullness() == 3 + 1
    with pytest.raises(UsageError, match="before the first turn"):
        budget.with_estimation(TokenEstimation())


# -- what the MemoryProvider contract says a provider like TokenBudget does ---------------------------------

def test_token_budget_keeps_no_notes_and_says_so() -> None:
    # An agent's save_note tool goes through add/replace/remove_note: a provider without notes refuses
    # with NotesUnsupported, never silently drops the fact.
    budget = big()
    for call in (lambda: budget.add_note("fact"), lambda: budget.replace_note("a", "b"),
                 lambda: budget.remove_note("a")):
        with pytest.raises(NotesUnsupported, match="token_budget memory provider keeps no notes; use a provider"):
            call()


def test_token_budget_never_compresses_and_adds_nothing_to_the_prompt() -> None:
    # Pruning drops whole turns: no compaction record is minted for the caller to persist, nothing is prefetched,
    # and the system prompt gets no block, so build_messages is the whole request.
    budget = TokenBudget(512, 0.1)
    for index in range(3):
        sync(budget, f"question {index} " * 20, f"answer {index} " * 20)
    assert budget.pruned_turns > 0
    assert budget.take_compaction_record() is None
    assert asyncio.run(budget.prefetch("next question")) == ""
    assert budget.system_prompt_block() is None
