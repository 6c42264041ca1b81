"""A simulated judge of known quality: a small vLLM-shaped OpenAI-compatible server whose verdicts follow held-out
truth with a set accuracy and a set position bias, and which decides a pair only when each run's decisive evidence
is visible in the view the prompt quotes.

kvjudge cannot show on a laptop that it reads a capable judge right (the bundled judge model has no signal), so
the test suite and the benchmarks judge through this server instead: ``kvjudge probe --server URL`` certifies it
(its context refusals included) and ``kvjudge judge / eval / rank --server URL`` judge through it exactly as through
vLLM. It reads nothing but the requests it is sent: no store, no run files; the truth comes from an answer key.

Starting it::

    python -m kvjudge.testing.sim_judge --key KEY.json [--port 0] [--accuracy 0.8] [--bias 0.5] [--seed 0]
        [--confidence 0.85] [--evidence-share 1.0] [--max-model-len 32768] [--model NAME] [--json]

prints one line naming its URL (with ``--json``: ``{"url", "model", "max_model_len", …}``) once it listens, and
serves until SIGTERM or SIGINT. In a test, :class:`SimJudgeServer` runs it in a thread
(``with SimJudgeServer(key, Settings(accuracy=0.8)) as judge: judge.url``). The standard library's threading HTTP
server does the serving: a thread per connection, HTTP/1.1 keep-alive, nothing to install beyond kvjudge's own
dependencies (fastapi and uvicorn are test extras only), and it is listening within milliseconds.

**The answer key** (JSON, written by whoever wrote the runs; :func:`write_key`, :func:`key_entry`)::

    {"runs": [
      {"run": "agent-a/task-7",                           # optional: a label for diagnostics only
       "marker": "index 3f9a2b1..8c0d4e2 100644",         # a line of the run's text no other run has
       "grade": 1.0,                                      # the held-out grade (higher is better)
       "evidence": ["-    return field",                  # lines that must be visible to judge the run:
                    "+    return quote(field, sep)",      # its final patch's changed lines and
                    "==== 43 passed in 1.87s ===="]}]}    # its last test outcome line

Lines are compared whole, with surrounding whitespace stripped (a view may indent them), after the escaping the
judge applies to run text (runs of ``<`` or ``>``); a line cut in the middle by an elision is not visible. Markers
must be unique in the key; a line that is only ``+`` or ``-`` (a blank line added or removed) says nothing and is
left out of the evidence by :func:`changed_lines`.

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

**Endpoints** (vLLM's shapes): ``GET /v1/models`` (with ``max_model_len``), ``GET /version``, ``POST /tokenize``
(``{"count", "max_model_len", "tokens"}``), ``POST /v1/completions`` (``logprobs.top_logprobs``: a list of
``{token: logprob}``) and ``POST /v1/chat/completions`` (``logprobs.content[0].top_logprobs``: a list of
``{"token", "logprob", "bytes"}``). A prompt over ``max_model_len`` is refused with vLLM's words; more than
``max_logprobs`` logprobs likewise. The tokenizer is a small deterministic one (words, numbers, punctuation and
whitespace runs; about four characters a token on code); a prompt counts one BOS token more.

**What it was sent.** ``SimJudgeServer(key, settings, prompts=[])`` appends to that list every text a request
asks it to read — each completions prompt, each chat request's messages as its template renders them, each
``/tokenize`` text — so a test can check what a judge is shown (that no grade reaches it, say). Off by default:
a long benchmark would keep every prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.judge.render import escape

DEFAULT_MAX_MODEL_LEN = 32_768
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
VERSION = "kvjudge-sim-judge 1"
BOS_ID = 1
LABEL_MASS = 0.96  # the share of the first token's probability on the two labels

_KEY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["runs"],
    "properties": {
        "runs": {"type": "array", "items": {
            "type": "object",
            "required": ["marker", "grade", "evidence"],
            "additionalProperties": False,
            "properties": {
                "run": {"type": ["string", "null"]},
                "marker": {"type": "string", "pattern": r"\S"},
                "grade": {"type": "number"},
                "quality": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "evidence": {"type": "array", "items": {"type": "string"}},
            }}},
    },
}
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


# ---------------------------------------------------------------------------------------------------- the key
@dataclass(frozen=True)
class KeyEntry:
    """One run in the answer key: how to recognise its view, its held-out grade, and what must be visible."""

    marker: str
    grade: float
    evidence: tuple[str, ...]
    run: str | None = None
    quality: float | None = None  # the latent quality the scale mode centres on (None: the grade, clipped)

    def to_json(self) -> dict[str, Any]:
        entry = {"run": self.run, "marker": self.marker, "grade": self.grade, "evidence": list(self.evidence)}
        return entry if self.quality is None else {**entry, "quality": self.quality}

    @property
    def latent(self) -> float:
        return self.quality if self.quality is not None else min(1.0, max(0.0, self.grade))


def changed_lines(patch: str) -> list[str]:
    """The changed lines of a unified diff (``+`` / ``-`` lines, not the ``+++`` / ``---`` file headers, not
    a blank line added or removed), in order."""
    lines = []
    for line in patch.splitlines():
        if line.startswith(("+++ ", "--- ")) or not line.startswith(("+", "-")) or not line[1:].strip():
            continue
        lines.append(line)
    return lines


def key_entry(*, marker: str, grade: float, patch: str, outcome: str, run: str | None = None) -> KeyEntry:
    """The key entry of a run whose decisive evidence is its final patch's changed lines and its last test
    outcome line."""
    return KeyEntry(marker=marker, grade=float(grade), evidence=(*changed_lines(patch), outcome), run=run)


def write_key(path: str | Path, entries: Iterable[KeyEntry]) -> Path:
    """Write an answer key (checked the way :func:`load_key` reads it)."""
    path = Path(path)
    payload = {"runs": [entry.to_json() for entry in entries]}
    AnswerKey.from_json(payload, str(path))  # refuse a key the server would refuse
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def _line(text: str) -> str:
    """A line as it is compared: escaped as the judge escapes run text, surrounding whitespace stripped."""
    return escape(text).strip()


class AnswerKey:
    """The runs the server knows, by marker line."""

    def __init__(self, entries: Sequence[KeyEntry]) -> None:
        self.entries = tuple(entries)
        self.by_marker: dict[str, KeyEntry] = {}
        self.evidence: dict[str, frozenset[str]] = {}
        for entry in self.entries:
            marker = _line(entry.marker)
            self.by_marker[marker] = entry
            self.evidence[marker] = frozenset(line for text in entry.evidence if (line := _line(text)))

    @classmethod
    def from_json(cls, payload: Any, source: str = "the answer key") -> AnswerKey:
        """Checked: a one-line error names the file and the JSON path of the first problem."""
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(_KEY_SCHEMA).iter_errors(payload))
        if error is not None:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or "(top)"
            raise UsageError(f"{source}: {where.lstrip('.')}: {error.message}; see kvjudge/testing/sim_judge.py "
                             f"for the key format")
        entries = [KeyEntry(marker=item["marker"], grade=float(item["grade"]), evidence=tuple(item["evidence"]),
                            run=item.get("run"), quality=item.get("quality")) for item in payload["runs"]]
        seen: dict[str, int] = {}
        for index, entry in enumerate(entries):
            marker = _line(entry.marker)
            if marker in seen:
                raise UsageError(f"{source}: runs[{index}].marker: the same marker as runs[{seen[marker]}] "
                                 f"({marker[:60]!r}); each run needs a line no other run has")
            seen[marker] = index
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> AnswerKey:
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read the answer key {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise UsageError(f"{path}: not JSON ({exc}); see kvjudge/testing/sim_judge.py for the key format") from exc
        return cls.from_json(payload, str(path))

    def digest(self) -> str:
        """A short hash of what the key says (part of the default model name: another key, another judge)."""
        text = json.dumps([e.to_json() for e in self.entries], sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]

    def identify(self, lines: frozenset[str]) -> KeyEntry | None:
        """The one run whose marker is among ``lines`` (None for none, or for several)."""
        found = [self.by_marker[line] for line in lines if line in self.by_marker]
        return found[0] if len(found) == 1 else None

    def visible_share(self, entry: KeyEntry, lines: frozenset[str]) -> float:
        """The share of ``entry``'s evidence lines among ``lines`` (1.0 when it has none)."""
        evidence = self.evidence[_line(entry.marker)]
        return len(evidence & lines) / len(evidence) if evidence else 1.0


# -------------------------------------------------------------------------------------------- the decision
def draw(seed: int, marker_x: str, marker_y: str) -> float:
    """The pair's uniform draw in [0, 1): from ``seed`` and the two markers, the same in either order. The server
    prefers the better run of a decidable pair when this is below ``accuracy``."""
    low, high = sorted((_line(marker_x), _line(marker_y)))
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


# ----------------------------------------------------------------------------------------------- HTTP
class _Refusal(Exception):
    def __init__(self, status: int, payload: dict[str, Any]) -> None:
        super().__init__(payload)
        self.status = status
        self.payload = payload


def _bad_request(message: str, status: int = 400) -> _Refusal:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return _Refusal(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the judge's client reuses its connections
    # Headers and body go out in one write where the answer fits this buffer (handle_one_request flushes it): one
    # send a request, for a judge meant to cost its caller nothing. A larger answer is a second write, which with
    # Nagle's algorithm on would wait for the client's delayed ACK (~40 ms).
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    @staticmethod
    def _body(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise _bad_request(f"the request body is not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise _bad_request("the request body must be a JSON object")
        return body

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        self.server.count(path)
        routes = {("GET", "/v1/models"): self.server.api.models, ("GET", "/version"): self.server.api.version,
                  ("GET", "/health"): self.server.api.health, ("POST", "/tokenize"): self.server.api.tokenize,
                  ("POST", "/v1/completions"): self.server.api.completions,
                  ("POST", "/v1/chat/completions"): self.server.api.chat}
        handler = routes.get((method, path))
        try:
            # The body is read before anything is refused: left unread on a kept-alive connection, it would be
            # taken for the start of the next request.
            raw = self._raw_body()
            if handler is None:
                raise _Refusal(404, {"detail": "Not Found"})
            payload = handler(self._body(raw) if method == "POST" else {})
        except _Refusal as refusal:
            self._send(refusal.status, refusal.payload)
            return
        self._send(200, payload)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        self._route("POST")


class _Api:
    """The endpoints' answers, in vLLM's shapes; every text sent to be read is appended to ``prompts`` when it
    is a list."""

    def __init__(self, judge: SimJudge, prompts: list[str] | None = None) -> None:
        self.judge = judge
        self.settings = judge.settings
        self.created = int(time.time())
        self.prompts = prompts
        self._lock = threading.Lock()

    def _received(self, text: str) -> None:
        if self.prompts is not None:
            with self._lock:
                self.prompts.append(text)

    def health(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {}

    def version(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"version": VERSION}

    def models(self, _body: dict[str, Any]) -> dict[str, Any]:
        model = self.judge.model
        return {"object": "list", "data": [{
            "id": model, "object": "model", "created": int(time.time()), "owned_by": "kvjudge-sim-judge",
            "root": model, "parent": None, "max_model_len": self.settings.max_model_len}]}

    def _model(self, body: dict[str, Any]) -> None:
        asked = body.get("model")
        if asked is not None and asked != self.judge.model:
            raise _bad_request(f"The model `{asked}` does not exist.", 404)

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        if "messages" in body:
            text = _chat_text(body["messages"])
        else:
            text = body.get("prompt", body.get("content"))
        if not isinstance(text, str):
            raise _bad_request("tokenize needs a \"prompt\" string")
        self._received(text)
        tokens = SimJudge.token_ids(text, bos=bool(body.get("add_special_tokens", True)))
        return {"count": len(tokens), "max_model_len": self.settings.max_model_len, "tokens": tokens}

    def _limits(self, prompt_tokens: int, max_tokens: Any, asked_logprobs: Any) -> int:
        if asked_logprobs is not None and (not isinstance(asked_logprobs, int) or asked_logprobs < 0):
            raise _bad_request(f"logprobs must be a non-negative integer, got {asked_logprobs!r}")
        if asked_logprobs is not None and asked_logprobs > self.settings.max_logprobs:
            raise _bad_request(f"Requested sample logprobs of {asked_logprobs}, which is greater than max allowed: "
                               f"{self.settings.max_logprobs}")
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad_request(f"max_tokens must be at least 1, got {max_tokens!r}")
        limit = self.settings.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise _bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                               f"in the completion). Please reduce the length of the messages or completion.")
        return max_tokens

    def _usage(self, prompt_tokens: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 1, "completion_tokens": 1,
                "prompt_tokens_details": None}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            raise _bad_request("prompt must be a string or a list of token ids")
        if isinstance(prompt, str):
            self._received(prompt)
        prompt_tokens = self.judge.prompt_tokens(prompt)
        asked = body.get("logprobs")
        self._limits(prompt_tokens, body.get("max_tokens"), asked)
        decision = self.judge.decide(prompt if isinstance(prompt, str) else "")
        top = self.judge.label_logprobs(decision.p_first, (" A", " B"), max(1, asked or 0), decision.levels)
        token, logprob = top[0]
        logprobs = None if asked is None else {"text_offset": [0], "token_logprobs": [logprob], "tokens": [token],
                                               "top_logprobs": [dict(top[:asked]) if asked else {}]}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.judge.model,
                "choices": [{"index": 0, "text": token, "logprobs": logprobs, "finish_reason": "length",
                             "stop_reason": None, "prompt_logprobs": None}],
                "usage": self._usage(prompt_tokens)}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self._model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise _bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects")
        self._received(_chat_text(messages))
        prompt_tokens = len(SimJudge.token_ids(_chat_text(messages), bos=True))
        asked = body.get("top_logprobs") if body.get("logprobs") else None
        self._limits(prompt_tokens, body.get("max_tokens"), asked)
        user = [m["content"] for m in messages if m.get("role") == "user"]
        decision = self.judge.decide(user[-1] if user else "")
        top = self.judge.label_logprobs(decision.p_first, ("A", "B"), max(1, asked or 0), decision.levels)
        token, logprob = top[0]

        def entry(text: str, value: float) -> dict[str, Any]:
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        logprobs = None if asked is None else {"content": [{**entry(token, logprob),
                                                            "top_logprobs": [entry(t, v) for t, v in top[:asked]]}]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.judge.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                                     "content": token, "tool_calls": []},
                             "logprobs": logprobs, "finish_reason": "length", "stop_reason": None}],
                "usage": self._usage(prompt_tokens)}


def _chat_text(messages: Any) -> str:
    """The prompt a chat request becomes (a ChatML-style template: the model's own turn markers)."""
    if not isinstance(messages, list):
        raise _bad_request("messages must be a list")
    turns = "".join(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>\n" for m in messages
                    if isinstance(m, dict))
    return turns + "<|im_start|>assistant\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a judge pool opens many connections at once

    def __init__(self, address: tuple[str, int], judge: SimJudge, *, verbose: bool = False,
                 prompts: list[str] | None = None) -> None:
        self.api = _Api(judge, prompts)
        self.verbose = verbose
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def count(self, path: str) -> None:
        with self._lock:
            self.requests[path] += 1


@dataclass
class SimJudgeServer:
    """The server in a background thread of this process (for a test or a benchmark): ``url`` once started.

    ``key`` is an :class:`AnswerKey` or the path of a key file. ``requests`` counts requests per path and
    ``judge.reasons`` the decisions by reason (decided, evidence_hidden, …). ``prompts``: a list to append every
    text the server is sent to read (prompts and tokenize texts), or None (the default) to keep none.
    """

    key: AnswerKey | str | Path
    settings: Settings = field(default_factory=Settings)
    host: str = "127.0.0.1"
    port: int = 0
    verbose: bool = False
    prompts: list[str] | None = field(default=None, repr=False)
    judge: SimJudge = field(init=False, repr=False)
    url: str = field(init=False, default="")
    _server: _Server | None = field(init=False, default=None, repr=False)
    _thread: threading.Thread | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        key = self.key if isinstance(self.key, AnswerKey) else AnswerKey.load(self.key)
        self.judge = SimJudge(key, self.settings)

    @property
    def model(self) -> str:
        return self.judge.model

    @property
    def requests(self) -> Counter[str]:
        return self._server.requests if self._server is not None else Counter()

    def start(self) -> SimJudgeServer:
        self._server = _Server((self.host, self.port), self.judge, verbose=self.verbose, prompts=self.prompts)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="sim-judge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> SimJudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m kvjudge.testing.sim_judge",
        description="A simulated judge of known quality, served as vLLM serves a model (see the module docstring "
                    "for the answer key's format and the decision rule).")
    parser.add_argument("--key", required=True, metavar="FILE", help="the answer key (JSON)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    parser.add_argument("--accuracy", type=float, default=defaults.accuracy,
                        help=f"share of decidable pairs it judges right (default {defaults.accuracy})")
    parser.add_argument("--bias", type=float, default=defaults.bias,
                        help=f"mean probability given to the run shown first (default {defaults.bias}: none)")
    parser.add_argument("--confidence", type=float, default=defaults.confidence,
                        help=f"probability given to the preferred run (default {defaults.confidence})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the per-pair draws")
    parser.add_argument("--evidence-share", type=float, default=defaults.evidence_share,
                        help="share of a run's evidence lines that must be visible to judge it (default 1.0: all)")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len,
                        help=f"the served context in tokens (default {defaults.max_model_len})")
    parser.add_argument("--max-logprobs", type=int, default=defaults.max_logprobs,
                        help=f"most logprobs a request may ask for (default {defaults.max_logprobs}, as vLLM)")
    parser.add_argument("--model", help="the served model's id (default: named after the settings and the key)")
    parser.add_argument("--sigma", type=float, default=defaults.sigma,
                        help=f"scale mode: the noise of each reading (default {defaults.sigma})")
    parser.add_argument("--sharpen", type=float, default=defaults.sharpen,
                        help="scale mode: overconfidence, readings pushed to the ends (default 1: calibrated)")
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    parser.add_argument("--json", action="store_true", help="announce the URL as one JSON line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings(accuracy=args.accuracy, bias=args.bias, confidence=args.confidence, seed=args.seed,
                            evidence_share=args.evidence_share, max_model_len=args.max_model_len,
                            max_logprobs=args.max_logprobs, model=args.model, sigma=args.sigma,
                            sharpen=args.sharpen)
        judge = SimJudge(AnswerKey.load(args.key), settings)
        server = _Server((args.host, args.port), judge, verbose=args.verbose)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}"
    if args.json:
        print(json.dumps({"url": url, "model": judge.model, "max_model_len": settings.max_model_len,
                          "runs": len(judge.key.entries)}), flush=True)
    else:
        print(f"sim judge {judge.model} ({len(judge.key.entries)} runs in the key) serving at {url}", flush=True)

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
