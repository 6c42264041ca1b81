"""The ledger's arithmetic: a cached figure not reported stays None (never 0), a mixed pool says how many calls
reported it, and a ledger survives its JSON."""

from __future__ import annotations

from kvjudge.judge.ledger import CallCost, Ledger, plan_line


def test_cached_tokens_not_reported_are_none_and_a_mix_is_not_a_share() -> None:
    quiet = Ledger.of([CallCost(100, None, 1), None, CallCost(50, None, 1, retries=2, seconds=0.5)])
    assert (quiet.calls, quiet.prompt_tokens, quiet.cached_tokens, quiet.retries) == (2, 150, None, 2)
    assert quiet.cached_share is None and "not reported" in quiet.line()
    mixed = Ledger.of([CallCost(100, 0, 1), CallCost(100, None, 1)])
    assert (mixed.cached_tokens, mixed.cached_calls, mixed.cached_share) == (0, 1, None)  # a reported 0 is 0
    full = Ledger.of([CallCost(100, 80, 1), CallCost(300, 0, 1)])
    assert full.cached_share == 80 / 400
    total = Ledger()
    for part in (quiet, mixed, full):
        total.merge(part)
    assert (total.calls, total.prompt_tokens, total.cached_tokens, total.cached_calls) == (6, 750, 80, 3)
    assert Ledger.from_json(total.to_json()) == total
    assert "up to 12 judge calls" in plan_line(12, 3, 4096) and "49,152" in plan_line(12, 3, 4096)
    assert "3 scores from the cache" in plan_line(12, 3, None, "score") and "finished score" in plan_line(1, 0, None, "score")
