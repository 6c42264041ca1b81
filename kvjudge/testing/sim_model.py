"""What the simulated judge answers a prompt: its settings, the decision from the answer key and the views the
prompt quotes, the scale mode, its small tokenizer and the answer's top logprobs — no HTTP (that is
:mod:`kvjudge.testing.sim_judge`'s).

**The verdict.** The prompt quotes each run between ``<<<BEGIN RUN A>>>`` / ``<<<END RUN A>>>`` lines and ``B``
likewise. Text both runs share may be quoted once before them, between ``<<<BEGIN COMMON TEXT>>>`` /
``<<<END COMMON TEXT>>>`` lines, as numbered pieces (``[common text N]`` on a line of its own, then the piece); a
view that shows ``[common text N]`` contains piece N there, so its lines count as that view's (as the judge's
instructions say). Anything else in the prompt is ignored. A view is identified by
the one key marker among its lines. When both views are identified, both runs' evidence is visible (at least
``evidence_share`` of each run's evidence lines) and their grades differ, the server prefers the better run with
probability ``accuracy``: a deterministic draw per pair (:func:`draw`: from ``seed`` and the two markers, the same
in both orders), so a pair is consistently judged right or wrong. The preferred run gets probability
``confidence``. Otherwise (a run not identified, its evidence hidden, equal grades) it has no preference: 0.5.
Then the position bias moves the probability of the run shown first by ``bias − 0.5``, so the mean probability
given to the run shown first (what ``kvjudge eval`` reports as position bias) is ``bias``. The answer's first
token carries the labels' probabilities (a ``label_mass`` share of the whole; the rest on other tokens) in its
top logprobs, in vLLM's shapes.

**Scale mode** (the scale protocols, :mod:`kvjudge.judge.protocols`). A prompt that names a scale — its last line
reading ``Scale, worst to best: A B C …`` (or ``Scale, best to worst: … C B A``: the levels in the other order) — is
answered on that scale instead of with A or B. Each run has a latent quality: the key entry's ``quality`` (in
[0, 1]), else its grade clipped to [0, 1]. A prompt quoting one run (``RUN A`` only: pointwise) centres the reading
on that run's quality; one quoting two centres it on ``0.5 + (quality of A − quality of B) / 2`` plus the position
bias ``bias − 0.5``; a run not identified or whose evidence is hidden counts as 0.5. Each reading adds noise
``σ · z`` (``--sigma``), ``z`` a standard normal drawn from ``seed`` and the whole prompt (:func:`scale_noise`): the
same prompt always gets the same noise, and two prompts — another criterion, wording, order or run — independent
draws. The noisy centre, clipped to [0, 1] (and, with ``--sharpen γ`` > 1, overconfident: pushed to the ends as
``sigmoid(γ · logit(c))``), is the answer's expected level: its probability is split between the two levels either
side of it (:func:`scale_distribution`), so the expected score a judge reads back is exactly that value.

The tokenizer is a small deterministic one (words, numbers, punctuation and whitespace runs; about four characters
a token on code); a prompt counts one BOS token more.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.testing.sim_key import AnswerKey, KeyEntry, compared_line

DEFAULT_MAX_MODEL_LEN = 32_768
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
BOS_ID = 1
LABEL_MASS = 0.96  # the share of the first token's probability on the two labels

# Tokens: a word (≤ 8 letters, with the space before it), a number (≤ 3 digits), punctuation (≤ 2), whitespace.
_TOKEN = re.compile(r" ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]{1,2}|\s{1,8}")
# Each token's id, once computed: a zero-latency judge answers /tokenize without a hash a token (a body of a few KB is
# thousands of tokens, most of them seen before). Bounded by the regex: at most a few million short strings.
_TOKEN_IDS: dict[str, int] = {}


def _token_id(token: str) -> int:
    _TOKEN_IDS[token] = token_id = zlib.crc32(token.encode("utf-8")) % 150_000 + 2
    return token_id


_RUN_BLOCK = re.compile(r"^<<<BEGIN RUN ([AB])>>>\n(.*?)\n<<<END RUN \1>>>$", re.MULTILINE | re.DOTALL)
_COMMON_BLOCK = re.compile(r"^<<<BEGIN COMMON TEXT>>>\n(.*?)\n<<<END COMMON TEXT>>>$", re.MULTILINE | re.DOTALL)
_COMMON_PIECE = re.compile(r"^\[common text (\d+)\]$", re.MULTILINE)
# What a model might say instead of a label: the rest of the first token's probability.
_OTHER_TOKENS = ("The", "Run", "Both", "Neither", "I", "Based", "**", "Answer", "It", "In", "After", "Looking",
                 "This", "We", "Comparing", "From", "Given", "To", "Overall", "Each", "Option", "C")


# -------------------------------------------------------------------------------------------- the decision
def draw(seed: int, marker_x: str, marker_y: str) -> float:
    """The pair's uniform draw in [0, 1): from ``seed`` and the two markers, the same in either order. The server
    prefers the better run of a decidable pair when this is below ``accuracy``."""
    low, high = sorted((compared_line(marker_x), compared_line(marker_y)))
    digest = hashlib.sha256(f"{seed}\n{low}\n{high}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Settings:
    """What kind of judge the server is. ``bias``: the mean probability it gives the run shown first."""

    accuracy: float = 0.8
    bias: float = 0.5
    confidence: float = 0.85
    seed: int = 0
    evidence_share: float = 1.0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    model: str | None = None
    sigma: float = 0.15  # the scale mode's noise per reading
    sharpen: float = 1.0  # the scale mode's overconfidence (1: calibrated to the latent quality)

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy <= 1.0:
            raise UsageError(f"--accuracy must be in [0, 1], got {self.accuracy}")
        if not 0.5 <= self.confidence < 1.0:
            raise UsageError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        if not 0.0 < self.bias < 1.0:
            raise UsageError(f"--bias must be in (0, 1), got {self.bias}")
        if self.confidence + abs(self.bias - 0.5) > 0.99:
            raise UsageError(f"--confidence {self.confidence} with --bias {self.bias} would push a probability past "
                             f"0.99 (the bias would be clipped, and eval would measure less of it); keep confidence "
                             f"+ |bias - 0.5| <= 0.99")
        if not 0.0 < self.evidence_share <= 1.0:
            raise UsageError(f"--evidence-share must be in (0, 1], got {self.evidence_share}")
        if self.max_model_len < 64:
            raise UsageError(f"--max-model-len must be at least 64, got {self.max_model_len}")
        if self.max_logprobs < 1:
            raise UsageError(f"--max-logprobs must be at least 1, got {self.max_logprobs}")
        if not 0.0 <= self.sigma <= 1.0:
            raise UsageError(f"--sigma must be in [0, 1], got {self.sigma}")
        if self.sharpen < 1.0:
            raise UsageError(f"--sharpen must be at least 1 (1: calibrated), got {self.sharpen}")

    def model_name(self, key: AnswerKey) -> str:
        """The served model's id: the settings and the key's hash, so verdicts cached for one simulated judge are
        never read for another (the judgment cache is keyed by model)."""
        scale = "" if (self.sigma, self.sharpen) == (0.15, 1.0) else f"-sigma{self.sigma:g}-sharpen{self.sharpen:g}"
        return self.model or (f"sim-judge-acc{self.accuracy:g}-bias{self.bias:g}-conf{self.confidence:g}-"
                              f"seed{self.seed}-share{self.evidence_share:g}{scale}-key{key.digest()}")


@dataclass(frozen=True)
class Decision:
    """One answer: ``p_first`` is the probability that the run shown first (A) is better."""

    p_first: float
    reason: str  # decided | equal_grades | evidence_hidden | unidentified | no_runs | scale
    runs: tuple[str | None, str | None] = (None, None)
    right: bool | None = None  # for a decided pair: did it prefer the better run?
    levels: dict[str, float] | None = None  # scale mode: each level's probability (they sum to 1)


def quoted_views(prompt: str) -> dict[str, str]:
    """The text quoted for each position (``A``, ``B``) between its RUN delimiter lines (the last such block)."""
    return {match.group(1): match.group(2) for match in _RUN_BLOCK.finditer(prompt)}


def common_pieces(prompt: str) -> dict[str, str]:
    """The pieces of the block common to both runs, by their placeholder (``[common text 1]`` → its text)."""
    found = _COMMON_BLOCK.search(prompt)
    if found is None:
        return {}
    block = found.group(1)
    heads = list(_COMMON_PIECE.finditer(block))
    return {head.group(0): block[head.end():(heads[index + 1].start() if index + 1 < len(heads) else len(block))]
            for index, head in enumerate(heads)}


def _lines(view: str, pieces: Mapping[str, str] | None = None) -> frozenset[str]:
    """A view's non-blank lines, stripped; a ``[common text N]`` line stands for the lines of its piece."""
    found: set[str] = set()
    for line in view.split("\n"):
        stripped = line.strip()
        if pieces and stripped in pieces:
            found |= _lines(pieces[stripped])
        elif stripped:
            found.add(stripped)
    return frozenset(found)


class SimJudge:
    """The decision rule and the tokenizer, without the HTTP (thread-safe: it holds no mutable state but counts)."""

    def __init__(self, key: AnswerKey, settings: Settings = Settings()) -> None:
        self.key = key
        self.settings = settings
        self.model = settings.model_name(key)
        self.reasons: Counter[str] = Counter()
        self._lock = threading.Lock()

    def decide(self, prompt: str) -> Decision:
        decision = self._decide(prompt)
        with self._lock:
            self.reasons[decision.reason] += 1
        return decision

    def _decide(self, prompt: str) -> Decision:
        s = self.settings
        shift = s.bias - 0.5
        levels = scale_levels(prompt)
        if levels is not None:
            return scale_decision(self, prompt, levels)
        views = quoted_views(prompt)
        if set(views) != {"A", "B"}:
            return Decision(0.5 + shift, "no_runs")
        pieces = common_pieces(prompt)
        lines = {position: _lines(views[position], pieces) for position in ("A", "B")}
        first, second = self.key.identify(lines["A"]), self.key.identify(lines["B"])
        runs = (first.run if first else None, second.run if second else None)
        if first is None or second is None or first is second:
            return Decision(0.5 + shift, "unidentified", runs)
        if first.grade == second.grade:
            return Decision(0.5 + shift, "equal_grades", runs)
        if min(self.key.visible_share(first, lines["A"]), self.key.visible_share(second, lines["B"])) \
                < s.evidence_share:
            return Decision(0.5 + shift, "evidence_hidden", runs)
        right = draw(s.seed, first.marker, second.marker) < s.accuracy
        first_preferred = (first.grade > second.grade) == right
        p_first = s.confidence if first_preferred else 1.0 - s.confidence
        return Decision(p_first + shift, "decided", runs, right)

    @staticmethod
    def tokens(text: str) -> list[str]:
        """The text's tokens (concatenated, they are the text)."""
        return _TOKEN.findall(text)

    @staticmethod
    def token_ids(text: str, *, bos: bool = False) -> list[int]:
        """The ids of the text's tokens (each token's id is fixed by its text), BOS first when ``bos``."""
        known = _TOKEN_IDS
        ids = [known.get(token) or _token_id(token) for token in _TOKEN.findall(text)]
        return [BOS_ID, *ids] if bos else ids

    def prompt_tokens(self, prompt: str | list[Any]) -> int:
        """Tokens of a completions prompt as the model reads it (BOS included); a list is token ids already."""
        if isinstance(prompt, list):
            return len(prompt) + 1
        return len(_TOKEN.findall(prompt)) + 1

    def label_logprobs(self, p_first: float, spellings: tuple[str, str], n: int,
                       levels: Mapping[str, float] | None = None) -> list[tuple[str, float]]:
        """The first token's top ``n`` (token, logprob): the labels (or, in scale mode, the ``levels`` given: each
        level's probability) share ``LABEL_MASS``, other tokens the rest."""
        rest = 1.0 - LABEL_MASS
        prefix = spellings[0][:-1]  # " " on the completions API, "" on chat
        answer = dict(levels) if levels is not None else {spellings[0][len(prefix):]: p_first,
                                                         spellings[1][len(prefix):]: 1.0 - p_first}
        others = [(token, rest * 0.5 ** (index + 1))
                  for index, token in enumerate(t for t in _OTHER_TOKENS if t not in answer)]
        entries = [*((prefix + token, LABEL_MASS * p) for token, p in answer.items() if p > 0),
                   *((prefix + token, p) for token, p in others)]
        entries.sort(key=lambda item: -item[1])
        return [(token, math.log(p)) for token, p in entries[:n]]


# ------------------------------------------------------------------------------------------- the scale mode
_SCALE_LINE = re.compile(r"^Scale, (worst to best|best to worst): ((?:\S+ )*\S+)$", re.MULTILINE)


def scale_levels(prompt: str) -> tuple[str, ...] | None:
    """The levels, worst first, that the prompt's last ``Scale, worst to best: …`` (or ``best to worst``) line names;
    None when there is none (a letter question)."""
    found = list(_SCALE_LINE.finditer(prompt))
    if not found:
        return None
    direction, tokens = found[-1].group(1), found[-1].group(2).split(" ")
    return tuple(tokens) if direction == "worst to best" else tuple(reversed(tokens))


def scale_noise(seed: int, prompt: str) -> float:
    """A standard normal draw from ``seed`` and the whole prompt (the same prompt, the same draw)."""
    from statistics import NormalDist

    digest = hashlib.sha256(f"{seed}\nscale\n{prompt}".encode()).digest()
    uniform = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    return NormalDist().inv_cdf(uniform)


def scale_distribution(levels: Sequence[str], value: float) -> dict[str, float]:
    """Probabilities over ``levels`` whose expected level value (level i worth i / (G-1)) is ``value``: split
    between the two levels either side of it."""
    position = min(1.0, max(0.0, value)) * (len(levels) - 1)
    low = min(int(math.floor(position)), len(levels) - 2)
    upper = position - low
    return {level: (1.0 - upper if index == low else upper if index == low + 1 else 0.0)
            for index, level in enumerate(levels)}


def sharpened(value: float, gamma: float) -> float:
    """``sigmoid(gamma · logit(value))``: the overconfident mode's push towards the ends (gamma 1: unchanged)."""
    if gamma == 1.0:
        return value
    clipped = min(1.0 - 1e-9, max(1e-9, value))
    return 1.0 / (1.0 + math.exp(-gamma * math.log(clipped / (1.0 - clipped))))


def _quality(judge: SimJudge, lines: frozenset[str]) -> tuple[KeyEntry | None, float]:
    """The run a view shows and the quality the reading centres on (0.5 when not identified or hidden)."""
    entry = judge.key.identify(lines)
    if entry is None or judge.key.visible_share(entry, lines) < judge.settings.evidence_share:
        return entry, 0.5
    return entry, entry.latent


def scale_decision(judge: SimJudge, prompt: str, levels: tuple[str, ...]) -> Decision:
    """The scale mode's answer (see the module docstring): a distribution over ``levels`` centred on the latent
    quality (pointwise) or half the quality difference (pairwise), with noise drawn from the prompt."""
    s = judge.settings
    views = quoted_views(prompt)
    pieces = common_pieces(prompt)
    found = {position: _quality(judge, _lines(views[position], pieces)) for position in sorted(views)}
    if set(found) == {"A"}:
        centre = found["A"][1]
    elif set(found) == {"A", "B"}:
        centre = 0.5 + (found["A"][1] - found["B"][1]) / 2 + (s.bias - 0.5)
    else:
        centre = 0.5
    value = sharpened(min(1.0, max(0.0, centre + s.sigma * scale_noise(s.seed, prompt))), s.sharpen)
    runs = tuple(entry.run if entry else None for entry, _ in found.values())
    return Decision(value, "scale", (runs + (None, None))[:2], levels=scale_distribution(levels, value))
