"""Rankings of agents from pairwise verdicts: Bradley–Terry strengths with bootstrap 95 % intervals.

Each scored verdict between runs of two different agents is one game: ``a`` or ``b`` a win, ``tie`` and
``inconsistent`` half a win each (no preference). Overflow and error are not games (they lower coverage).
Strengths are log-scale Bradley–Terry parameters fitted by maximum likelihood with scipy (a small
Gaussian prior keeps them finite when an agent wins every game), centred to mean 0. Intervals: the fit
repeated on pairs resampled with replacement (percentile bootstrap, fixed seed: the same verdicts give the
same ranking).

An agent is the run's ``agent`` field; without one, the run-id prefix before ``/`` (``<agent>/<instance>``),
else the tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.judge.verdict import SCORED
from kvjudge.retention.state import agent_of  # noqa: F401 - re-exported: the rule lives with the run state

PRIOR = 0.01          # Gaussian prior precision on the log-strengths
BOOTSTRAP = 1000
SEED = 0


@dataclass(frozen=True)
class Game:
    """One verdict between two agents: ``score`` is what agent ``first`` got (1, 0.5 or 0)."""

    first: str
    second: str
    score: float


def games_from(verdicts: Sequence[Any], agent: Callable[[str], str]) -> tuple[list[Game], dict[str, dict[str, int]]]:
    """Games between different agents, and per agent its win/tie/loss/unscored counts."""
    counts: dict[str, dict[str, int]] = {}
    games = []
    for v in verdicts:
        first, second = agent(v.a), agent(v.b)
        if first == second:
            continue
        for name in (first, second):
            counts.setdefault(name, {"wins": 0, "ties": 0, "losses": 0, "unscored": 0})
        if v.outcome not in SCORED:
            counts[first]["unscored"] += 1
            counts[second]["unscored"] += 1
            continue
        score = {"a": 1.0, "b": 0.0}.get(v.outcome, 0.5)
        games.append(Game(first, second, score))
        if score == 0.5:
            counts[first]["ties"] += 1
            counts[second]["ties"] += 1
        else:
            winner, loser = (first, second) if score == 1.0 else (second, first)
            counts[winner]["wins"] += 1
            counts[loser]["losses"] += 1
    return games, counts


def bradley_terry(games: Sequence[Game], agents: Sequence[str], prior: float = PRIOR, *,
                  newton: bool = False) -> dict[str, float]:
    """Log-strengths maximising the Bradley–Terry likelihood (ties as half-wins), centred to mean 0. ``newton``:
    the same maximum by Newton's method (exact to 1e-10; for a few players fitted many times, as the runs of one
    task in best-of-N selection, where L-BFGS's set-up costs more than the fit)."""
    index = {name: i for i, name in enumerate(agents)}
    theta = (_fit_newton if newton else _fit)(*_arrays(games, index), len(agents), prior)
    return {name: float(theta[i]) for name, i in index.items()}


def _arrays(games: Sequence[Game], index: Mapping[str, int]) -> tuple[Any, Any, Any]:
    """The games as arrays: each one's first and second agent (by ``index``) and the first's score."""
    import numpy as np

    return (np.array([index[g.first] for g in games], dtype=int), np.array([index[g.second] for g in games], dtype=int),
            np.array([g.score for g in games], dtype=float))


def _fit(first: Any, second: Any, score: Any, agents: int, prior: float = PRIOR) -> Any:
    """The centred log-strengths of ``agents`` agents from games as arrays: each game's first and second agent (by
    index) and the first's score."""
    import numpy as np
    from scipy.optimize import minimize

    def objective(theta: Any) -> tuple[float, Any]:
        diff = theta[first] - theta[second]
        p = 1.0 / (1.0 + np.exp(-diff))
        # −log L = −Σ [s log p + (1 − s) log(1 − p)], written stably with logaddexp.
        loss = float(np.sum(score * np.logaddexp(0.0, -diff) + (1 - score) * np.logaddexp(0.0, diff)))
        loss += 0.5 * prior * float(theta @ theta)
        residual = p - score
        grad = np.zeros_like(theta)
        np.add.at(grad, first, residual)
        np.add.at(grad, second, -residual)
        return loss, grad + prior * theta

    result = minimize(objective, np.zeros(agents), jac=True, method="L-BFGS-B")
    return result.x - result.x.mean()


def _fit_newton(first: Any, second: Any, score: Any, agents: int, prior: float = PRIOR) -> Any:
    """:func:`_fit`'s maximum by damped Newton steps (the objective is strictly convex: the prior)."""
    import numpy as np

    design = np.zeros((len(score), agents))  # each game: +1 for its first player, −1 for its second
    design[np.arange(len(score)), first] += 1.0
    design[np.arange(len(score)), second] -= 1.0

    def loss(theta: Any) -> float:
        diff = design @ theta
        return float(np.sum(score * np.logaddexp(0.0, -diff) + (1 - score) * np.logaddexp(0.0, diff))
                     + 0.5 * prior * theta @ theta)

    theta = np.zeros(agents)
    current = loss(theta)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        grad = design.T @ (p - score) + prior * theta
        hessian = (design.T * (p * (1 - p))) @ design + prior * np.eye(agents)
        step = np.linalg.solve(hessian, grad)
        scale = 1.0
        while (trial := loss(theta - scale * step)) > current and scale > 1e-8:
            scale /= 2  # a full step can overshoot where a player won every game: halve it until the loss falls
        theta, current = theta - scale * step, min(trial, current)
        if float(np.max(np.abs(scale * step))) < 1e-10:
            break
    return theta - theta.mean()


def rank(verdicts: Sequence[Any], agent: Callable[[str], str], *, bootstrap: int = BOOTSTRAP,
         seed: int = SEED) -> dict[str, Any]:
    """Agents ranked by Bradley–Terry strength with bootstrap 95 % intervals over pairs, W/T/L, coverage."""
    import numpy as np

    games, counts = games_from(verdicts, agent)
    agents = sorted(counts)
    if len(agents) < 2:
        return {"agents": [], "games": len(games), "pairs": len(verdicts), "bootstrap": bootstrap,
                "note": "fewer than two agents met in these verdicts: nothing to rank"}
    strength = bradley_terry(games, agents) if games else {name: 0.0 for name in agents}
    samples: dict[str, list[float]] = {name: [] for name in agents}
    if games:
        rng = np.random.default_rng(seed)
        index = {name: i for i, name in enumerate(agents)}
        first, second, score = _arrays(games, index)
        for _ in range(bootstrap):
            drawn = rng.integers(0, len(games), len(games))  # the games resampled, as indexes
            fitted = _fit(first[drawn], second[drawn], score[drawn], len(agents))
            for name, i in index.items():
                samples[name].append(float(fitted[i]))
    rows = []
    for name in agents:
        c = counts[name]
        played = c["wins"] + c["ties"] + c["losses"]
        interval = (tuple(float(x) for x in np.percentile(samples[name], [2.5, 97.5]))
                    if samples[name] else None)
        rows.append({"agent": name, "strength": strength[name], "ci95": interval, **c,
                     "coverage": played / (played + c["unscored"]) if played + c["unscored"] else None})
    rows.sort(key=lambda r: r["strength"], reverse=True)
    for position, row in enumerate(rows, start=1):
        row["rank"] = position
    return {"agents": rows, "games": len(games), "pairs": len(verdicts), "bootstrap": bootstrap}


def plot_ranking(ranking: dict[str, Any], path: Any) -> None:
    """PNG: each agent's strength with its bootstrap 95 % interval."""
    # The figure alone, drawn by Agg: pyplot's state machine and backend loading cost a command a tenth of a second.
    from matplotlib.figure import Figure

    rows = ranking["agents"]
    fig = Figure(figsize=(7, 1.2 + 0.5 * max(1, len(rows))))
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    for y, row in zip(ys, rows):
        low, high = row["ci95"] or (row["strength"], row["strength"])
        ax.errorbar([row["strength"]], [y], xerr=[[row["strength"] - low], [high - row["strength"]]], fmt="o",
                    capsize=4)
    ax.set_yticks(ys, [f"{r['agent']} ({r['wins']}-{r['ties']}-{r['losses']})" for r in rows])
    ax.axvline(0.0, color="grey", linewidth=1)
    ax.set_xlabel("Bradley–Terry log-strength (bootstrap 95 % interval)")
    ax.set_title(f"Agents ranked from {ranking['games']} judged games")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
