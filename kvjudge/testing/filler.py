"""Deterministic prose-like filler text, for run bodies of a chosen size in tests and benchmarks."""

from __future__ import annotations


def filler(seed: int, words: int) -> str:
    """Deterministic prose-like text of about ``words`` words (distinct per seed)."""
    vocabulary = ("the parser reads each field and quotes commas inside strings while tests check rows "
                  "columns values errors retries cache buffer index merge split join token budget").split()
    state = seed * 2654435761 % 2**32 or 1
    out = []
    for index in range(words):
        state = (state * 1103515245 + 12345) % 2**31
        out.append(vocabulary[state % len(vocabulary)])
        if index % 13 == 12:
            out.append(f"\nline {seed}-{index}:")
    return " ".join(out)
