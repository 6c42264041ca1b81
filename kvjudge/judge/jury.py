"""Juries: several judges (models, or pools of servers) asked the same pairs with the same protocol, their verdicts
combined — the mean of the members' scores (p_a) and the majority of their labels (a, b or tie) — with every member's
verdicts kept beside the jury's.

A member that could not be opened (every server of it unreachable, its model missing) is an :class:`Absent` member:
its verdicts are ``error`` outcomes carrying why, never scores. A member's error or overflow verdict does not vote
and adds nothing to the mean; a pair none of the members scored is an ``error`` of the jury.

What a jury spent is its members' ledgers added up (:func:`jury_cost`, each member's beside the total); a jury
verdict's cost is its members' verdicts' (an absent member's, or a verdict read from the cache, costs nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.judge.ledger import Ledger
from kvjudge.judge.verdict import Verdict

if TYPE_CHECKING:
    from kvjudge.judge.pipeline import Judge
    from kvjudge.retention import Store

JURY_OUTCOMES = ("a", "b", "tie", "error")


@dataclass(frozen=True)
class Absent:
    """A jury member that could not be opened: ``why`` becomes each of its verdicts' error."""

    why: str


@dataclass(frozen=True)
class MemberVerdict:
    """One member's verdict on a pair (``verdict`` None: the member was absent, ``error`` says why)."""

    member: str
    verdict: Verdict | None
    error: str | None = None

    @property
    def outcome(self) -> str:
        return self.verdict.outcome if self.verdict is not None else "error"

    @property
    def scored(self) -> bool:
        return self.verdict is not None and self.verdict.scored

    def to_json(self) -> dict[str, Any]:
        if self.verdict is None:
            return {"member": self.member, "outcome": "error", "p_a": None, "error": self.error}
        return {"member": self.member, **self.verdict.to_json()}


@dataclass(frozen=True)
class JuryVerdict:
    """The jury's verdict on a pair: the majority label, the mean p_a, and each member's verdict."""

    a: str
    b: str
    outcome: str
    p_a: float | None
    votes: dict[str, int]
    members: tuple[MemberVerdict, ...]

    @property
    def scored(self) -> bool:
        return self.outcome != "error"

    @property
    def cost(self) -> Ledger:
        """The calls its members' verdicts sent, added up."""
        total = Ledger()
        for member in self.members:
            if member.verdict is not None and member.verdict.cost is not None:
                total.merge(member.verdict.cost)
        return total

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "outcome": self.outcome, "p_a": self.p_a, "votes": self.votes,
                "members": [m.to_json() for m in self.members], "cost": self.cost.to_json()}


def combine(a: str, b: str, members: Sequence[MemberVerdict]) -> JuryVerdict:
    """Mean of the scored members' p_a; the label most of them gave (a, b, or tie — an inconsistent verdict votes
    tie); no majority among the labels given is a tie; no member scored is an error."""
    scored = [m for m in members if m.scored]
    votes = Counter("tie" if m.outcome == "inconsistent" else m.outcome for m in scored)
    if not scored:
        return JuryVerdict(a, b, "error", None, {}, tuple(members))
    p_a = sum(m.verdict.p_a for m in scored if m.verdict is not None and m.verdict.p_a is not None) / len(scored)
    (top, count), *rest = votes.most_common() + [("", 0)]
    outcome = top if count > len(scored) / 2 else "tie"
    return JuryVerdict(a, b, outcome, p_a, dict(votes), tuple(members))


def jury_verdicts(members: Sequence[tuple[str, Judge | Absent]], store: Store, pairs: Sequence[tuple[str, str]], *,
                  judge: Callable[[Judge, Sequence[tuple[str, str]]], list[Verdict]] | None = None) -> list[JuryVerdict]:
    """Each member's verdicts on ``pairs`` (``judge(member, pairs)``, default :func:`judge_batch`), combined pair by
    pair (:func:`combine`)."""
    from kvjudge.judge.pipeline import judge_batch

    run = judge or (lambda member, asked: judge_batch(member, store, asked))
    by_member: list[list[MemberVerdict]] = []
    for name, member in members:
        if isinstance(member, Absent):
            by_member.append([MemberVerdict(name, None, member.why) for _ in pairs])
        else:
            by_member.append([MemberVerdict(name, verdict) for verdict in run(member, pairs)])
    return [combine(a, b, [column[index] for column in by_member]) for index, (a, b) in enumerate(pairs)]


def jury_cost(members: Sequence[tuple[str, Judge | Absent]]) -> tuple[Ledger, dict[str, Ledger]]:
    """What the jury spent (its members' backends' ledgers added up) and each member's ledger, by name (an absent
    member: an empty ledger)."""
    total, each = Ledger(), {}
    for name, member in members:
        each[name] = Ledger() if isinstance(member, Absent) else member.backend.ledger
        total.merge(each[name])
    return total, each


def summarize_jury(verdicts: Sequence[JuryVerdict]) -> dict[str, Any]:
    """The jury's outcome counts and coverage, and each member's outcome counts."""
    members: dict[str, Counter[str]] = {}
    for verdict in verdicts:
        for member in verdict.members:
            members.setdefault(member.member, Counter())[member.outcome] += 1
    return {"pairs": len(verdicts), "outcomes": dict(Counter(v.outcome for v in verdicts)),
            "coverage": sum(v.scored for v in verdicts) / len(verdicts) if verdicts else None,
            "members": {name: dict(counts) for name, counts in members.items()}}


__all__ = ["Absent", "JURY_OUTCOMES", "JuryVerdict", "MemberVerdict", "combine", "jury_cost", "jury_verdicts",
           "summarize_jury"]
