"""Reading a judge server's answer: the first token's top logprobs, from either answer shape, as label (or scale
level) probabilities. A label missing from the top N is an error, never a guess; vLLM's cap on ``logprobs`` (20 by
default) is why a request asks for at most :data:`VLLM_MAX_LOGPROBS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvjudge.errors import JudgeError
from kvjudge.judge.labels import LABELS, SPELLINGS, LabelScore, renormalise
from kvjudge.judge.scale import Scale

DEFAULT_TOP_LOGPROBS = 20
VLLM_MAX_LOGPROBS = 20  # vLLM refuses more unless started with a larger --max-logprobs


def top_logprobs(answer: Any) -> dict[str, float]:
    """The first generated token's top logprobs, ``{token text: logprob}``, from either answer shape.

    Completions API: ``choices[0].logprobs.top_logprobs[0]`` is a ``{token: logprob}`` map (vLLM,
    llama-cpp-python, OpenAI). Chat completions API (and llama.cpp's newer completions): ``choices[0].logprobs
    .content[0].top_logprobs`` is a list of ``{"token", "logprob", …}``. Raises JudgeError when neither is there.
    """
    try:
        choice = answer["choices"][0]
        logprobs = choice["logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise JudgeError(f"the judge server's answer has no logprobs ({type(exc).__name__}: {exc}); does it "
                         f"support `logprobs`?") from exc
    if not isinstance(logprobs, Mapping):
        raise JudgeError("the judge server's answer has no logprobs; does it support `logprobs`?")
    content = logprobs.get("content")
    if isinstance(content, list):
        if not content:
            reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
            raise JudgeError(f"the judge server generated no token to read (finish_reason {reason!r}); the model "
                             f"ended its answer at once")
        entries = content[0].get("top_logprobs") if isinstance(content[0], Mapping) else None
        if not isinstance(entries, list):
            raise JudgeError("the judge server's answer has no top_logprobs for its first token")
        return {str(e["token"]): float(e["logprob"]) for e in entries if isinstance(e, Mapping) and "token" in e}
    tops = logprobs.get("top_logprobs")
    if isinstance(tops, list) and tops and isinstance(tops[0], Mapping):
        return {str(token): float(value) for token, value in tops[0].items()}
    raise JudgeError("the judge server's answer has no top logprobs for its first token; does it support "
                     "`logprobs`?")


def label_score(top: Mapping[str, float], *, top_n: int, prompt_tokens: int, server: str | None = None,
                scale: Scale | None = None) -> LabelScore:
    """Label probabilities from a top-logprobs map (each label's spellings summed; a missing label is an error).
    On a ``scale`` a level missing from the top N has probability 0 there, and too little mass is an error."""
    if scale is not None:
        levels = {level: 0.0 for level in scale.levels}
        for token, logprob in top.items():
            for level in scale.levels:
                if token in scale.spellings(level) and math.isfinite(logprob):
                    levels[level] += math.exp(logprob)
        probs, mass = scale.read(levels)
        return LabelScore(probs=probs, label_mass=mass, prompt_tokens=prompt_tokens, server=server)
    raw = {label: 0.0 for label in LABELS}
    seen: set[str] = set()
    for token, logprob in top.items():
        for label, spellings in SPELLINGS.items():
            if token in spellings and math.isfinite(logprob):
                raw[label] += math.exp(logprob)
                seen.add(label)
    missing = [label for label in LABELS if label not in seen]
    if missing:
        raise JudgeError(f"label(s) {', '.join(missing)} not among the server's top {top_n} next tokens; the model "
                         f"did not answer the forced choice")
    probs, mass = renormalise(raw)
    return LabelScore(probs=probs, label_mass=mass, prompt_tokens=prompt_tokens, server=server)


__all__ = ["DEFAULT_TOP_LOGPROBS", "VLLM_MAX_LOGPROBS", "label_score", "top_logprobs"]
