"""The one place kvjudge touches llama-cpp-python's and gguf's private parts (and llama.cpp's C API).

Everything here was written against the versions pinned in ``pyproject.toml``
(:data:`LLAMA_CPP_PYTHON_VERSION`, :data:`GGUF_VERSION`). ``tests/test_llama_adapter.py`` pins each
behaviour this module relies on with the real library, a real model and real GGUF files: after an
upgrade, that test names what changed. Nothing else in kvjudge reaches past the public API of either.

What is private, and why it is used:

- ``llama_cpp._internals`` (``LlamaModel``, ``LlamaContext``, ``LlamaBatch``): a certification trial
  needs context parameters that ``Llama(...)`` does not take (``n_seq_max``, exact ``n_ubatch``) and
  must see llama.cpp's own allocation log while the context is created;
- ``Llama._ctx.kv_cache_seq_rm``: drop the KV cells past a shared prefix (the judge's prefix reuse);
- ``llama_cpp._utils.suppress_stdout_stderr``: llama.cpp writes to the C-level stderr even with
  ``verbose=False`` (a vocab-only load warns about its context size);
- ``GGUFReader._get_field_parts``: the stock reader builds one numpy view per element of every array,
  ~12 s for Gemma 3's 262k-token vocabulary; the header reader steps over long arrays instead.

llama-cpp-python comes with kvjudge's ``local`` extra: a judge-pool install (``pip install kvjudge``) has none, so
every function here imports it on first use through :func:`llama_cpp_module`, which says in one line
(:class:`~kvjudge.errors.LocalExtraMissing`) which extra to install.

And one public call made directly: ``llama_tokenize`` (:func:`token_ids`), because ``Llama.tokenize`` sizes its
buffer by the model's training context, which a vocab-only load reads as 0 — so every call tokenized the text
twice, once only to learn how many tokens it has.
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from kvjudge.errors import LocalExtraMissing

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
GGUF_VERSION = "0.19.0"

# Arrays longer than this (vocabularies, merges, scores) are stepped over by the header reader; the
# per-layer arrays the KV math reads are far shorter.
LONG_ARRAY = 4096

# llama.cpp keeps the log callback's C pointer for the life of the process: the Python object behind it
# must outlive every call, so the one installed last is kept here.
_installed_log_callback: Any = None


# -- llama-cpp-python itself: the local extra ------------------------------------------------------------

def local_inference_available() -> bool:
    """Whether llama-cpp-python is installed here (kvjudge's ``local`` extra), without importing it."""
    from importlib.util import find_spec

    return find_spec("llama_cpp") is not None


def require_local_inference(what: str) -> None:
    """Raise :class:`~kvjudge.errors.LocalExtraMissing` (``what`` needs the local extra) where llama-cpp-python is
    not installed; cheap: nothing is imported."""
    if not local_inference_available():
        raise LocalExtraMissing(what)


def llama_cpp_module(name: str = "llama_cpp", *, what: str = "in-process inference") -> ModuleType:
    """``llama_cpp`` (or one of its submodules, ``name``), imported; without the local extra a
    :class:`~kvjudge.errors.LocalExtraMissing` saying ``what`` needs it and how to install it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "llama_cpp":
            raise
        raise LocalExtraMissing(what) from exc


def load_llama(**params: Any) -> Any:
    """``llama_cpp.Llama(**params)`` (a vocab-only tokenizer or a whole model)."""
    return llama_cpp_module().Llama(**params)


def backend_version() -> str:
    """The installed llama-cpp-python's version (what a verdict's manifest records)."""
    return str(llama_cpp_module().__version__)


# -- llama.cpp's log and output -------------------------------------------------------------------------

def capture_native_log(sink: list[str]) -> None:
    """Send every line llama.cpp logs from now on (in this process) to ``sink``, instead of stderr.

    The probe reads the allocations llama.cpp reports ("llama_kv_cache: size = … MiB", "… buffer size =
    … MiB") from these lines.
    """
    global _installed_log_callback
    llama_cpp = llama_cpp_module()

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        sink.append(text.decode("utf-8", "replace"))

    _installed_log_callback = on_log
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))


@contextmanager
def quiet_native_output() -> Iterator[None]:
    """Silence what C code writes to the process's stdout and stderr inside the block."""
    utils = llama_cpp_module("llama_cpp._utils")

    with utils.suppress_stdout_stderr(disable=False):
        yield


# -- llama_cpp.Llama: the KV cache and the logits ---------------------------------------------------------

def rewind(llama: Any, keep: int) -> int:
    """Forget every token of ``llama`` (a ``llama_cpp.Llama``) from position ``keep`` on; returns the
    number of tokens still in the KV cache, ``keep`` or 0.

    The next ``llama.eval(tokens)`` then continues at that position. A cache that cannot drop a suffix
    (a windowed sliding-window cache) is cleared instead of leaving stale cells behind.
    """
    if not llama._ctx.kv_cache_seq_rm(-1, keep, -1):
        llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        keep = 0
    llama.n_tokens = keep
    return keep


def last_logits(context: Any, n_vocab: int) -> Any:
    """The logits of the last evaluated position as a numpy ``float32`` array of ``n_vocab`` (a view).

    ``context`` is a ``llama_cpp.Llama`` or a context from :func:`open_context` (both expose the raw
    ``llama_context`` as ``.ctx``). ``Llama.scores`` stays zero after ``eval`` without ``logits_all``,
    so this is the way to read them.
    """
    llama_cpp = llama_cpp_module()
    import numpy as np

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(context.ctx, -1), shape=(n_vocab,))


def end_of_generation_ids(llama: Any) -> list[int]:
    """Token ids that end a generation (EOS, EOT, …) in ``llama``'s vocabulary."""
    llama_cpp = llama_cpp_module()

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    return [token for token in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, token)]


def token_ids(llama: Any, data: bytes, *, add_bos: bool, special: bool) -> Any:
    """``llama.tokenize(data, add_bos=…, special=…)`` in one llama.cpp call, as a numpy ``int32`` array.

    A token spells at least one byte, so ``len(data)`` plus room for the added BOS (and a dummy-prefix space)
    is always enough; should it not be, llama.cpp says how many and the call is made again with that room.
    """
    llama_cpp = llama_cpp_module()
    import numpy as np

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    room = len(data) + 8
    buffer = (llama_cpp.llama_token * room)()
    found = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, room, add_bos, special)
    if found < 0:
        room = -found
        buffer = (llama_cpp.llama_token * room)()
        found = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, room, add_bos, special)
        if found < 0:
            raise RuntimeError(f"llama.cpp could not tokenize {len(data)} bytes (it asked for {-found} tokens)")
    return np.frombuffer(buffer, dtype=np.int32, count=found)


class PieceLengths:
    """The bytes each token of one vocabulary spells (no leading space stripped), looked up once per token and
    kept: :meth:`of` maps an array of ids to their lengths without a llama.cpp call per token."""

    def __init__(self, llama: Any, *, special: bool = False) -> None:
        import numpy as np

        self.llama = llama
        self.special = special
        self.table = np.full(llama.n_vocab(), -1, dtype=np.int32)

    def of(self, ids: Any) -> Any:
        """The byte length of each token of ``ids`` (a numpy integer array), as a numpy array."""
        import numpy as np

        lengths = self.table[ids]
        unknown = lengths < 0
        if unknown.any():
            new = np.unique(ids[unknown])
            self.table[new] = token_lengths(self.llama, new.tolist(), special=self.special)
            lengths = self.table[ids]
        return lengths


def token_lengths(llama: Any, tokens: Sequence[int], *, special: bool = False) -> list[int]:
    """The number of UTF-8 bytes each token of ``tokens`` stands for in ``llama``'s vocabulary (its piece, with
    no leading space stripped). A special token counts 0 unless ``special`` renders it."""
    llama_cpp = llama_cpp_module()

    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    buffer = ctypes.create_string_buffer(256)
    lengths = []
    for token in tokens:
        written = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, special)
        if written < 0:  # the piece is longer than the buffer: llama.cpp says how long
            buffer = ctypes.create_string_buffer(-written)
            written = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, special)
        lengths.append(written)
    return lengths


# -- chat templates ---------------------------------------------------------------------------------------

ChatRenderer = Callable[[Sequence[Mapping[str, str]]], tuple[str, bool]]
"""``render(messages) -> (prompt, added_special)``: the prompt text a chat template makes of ``messages``
(with the generation prompt), and whether the template already wrote the BOS token."""


def special_token_text(llama: Any, token: int, *, errors: str = "replace") -> str:
    """The text of a special token (BOS, EOS) as a chat template writes it; empty for a model without one."""
    return llama.detokenize([token], special=True).decode("utf-8", errors) if token >= 0 else ""


def chat_template_inputs(llama: Any) -> tuple[str | None, str, str]:
    """What rendering the GGUF's own chat template takes: ``(template or None, bos_text, eos_text)``."""
    return (llama.metadata.get("tokenizer.chat_template") or None,
            special_token_text(llama, llama.token_bos()), special_token_text(llama, llama.token_eos()))


def chat_renderer(llama: Any, template: str) -> ChatRenderer:
    """How llama-cpp-python renders a chat for ``llama``: ``template`` is ``"model"`` (the GGUF's own
    ``tokenizer.chat_template``, as ``Llama.create_chat_completion`` uses it) or ``"chatml"`` (the format
    llama.cpp's server and the benchmarks fall back to for a model without a template).

    Raises ``LookupError`` when ``"model"`` is asked of a GGUF that has no template, ``ValueError`` for
    an unknown name.
    """
    llama_chat_format = llama_cpp_module("llama_cpp.llama_chat_format")

    if template == "chatml":
        def render_chatml(messages: Sequence[Mapping[str, str]]) -> tuple[str, bool]:
            result = llama_chat_format.format_chatml(messages=list(messages))
            return result.prompt, bool(result.added_special)

        return render_chatml
    if template != "model":
        raise ValueError(f"unknown chat template {template!r}")
    source = llama.metadata.get("tokenizer.chat_template")
    if not source:
        raise LookupError("the model has no tokenizer.chat_template")

    def token_text(token: int) -> str:
        return special_token_text(llama, token, errors="ignore")

    formatter = llama_chat_format.Jinja2ChatFormatter(template=source, eos_token=token_text(llama.token_eos()),
                                                      bos_token=token_text(llama.token_bos()))

    def render_model(messages: Sequence[Mapping[str, str]]) -> tuple[str, bool]:
        result = formatter(messages=list(messages))
        return result.prompt, bool(result.added_special)

    return render_model


# -- the low-level model, context and batch (certification trials) ----------------------------------------

def open_model(path: str, *, gpu_layers: int = 0) -> Any:
    """Load a model with llama.cpp's default parameters (``gpu_layers`` offloaded). Raises ``ValueError``
    when llama.cpp cannot load it (its reason is in the log)."""
    llama_cpp = llama_cpp_module()
    _internals = llama_cpp_module("llama_cpp._internals")

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = gpu_layers
    return _internals.LlamaModel(path_model=path, params=params, verbose=True)


def context_params() -> Any:
    """llama.cpp's default context parameters (a ``llama_context_params`` to adjust and pass on)."""
    llama_cpp = llama_cpp_module()

    return llama_cpp.llama_context_default_params()


def flash_attention_type(enabled: bool) -> int:
    """The ``flash_attn_type`` value that turns flash attention on or off explicitly (never "auto")."""
    llama_cpp = llama_cpp_module()

    return llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if enabled else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def open_context(model: Any, params: Any) -> Any:
    """Create a context on ``model``; llama.cpp logs its buffers as it allocates them. Raises ``ValueError``
    when llama.cpp refuses (out of memory, an unsupported KV type); ``.close()`` frees it."""
    _internals = llama_cpp_module("llama_cpp._internals")

    return _internals.LlamaContext(model=model, params=params, verbose=True)


def tokenize(model: Any, text: str, *, add_bos: bool) -> list[int]:
    """Token ids of ``text`` with ``model``'s tokenizer (special-token text is read as plain text)."""
    return list(model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False))


def n_vocab(model: Any) -> int:
    """The vocabulary size of a model from :func:`open_model`."""
    return int(model.n_vocab())


class Decoder:
    """Feeds tokens to a context in batches of at most ``n_batch``, keeping only the last position's logits."""

    def __init__(self, context: Any, n_batch: int) -> None:
        _internals = llama_cpp_module("llama_cpp._internals")

        self.context = context
        self.n_batch = n_batch
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1)

    def decode(self, tokens: Sequence[int], n_past: int) -> None:
        """Evaluate ``tokens`` (at most ``n_batch``) at positions ``n_past …``; raises ``RuntimeError`` when
        llama.cpp fails (e.g. no KV cells left)."""
        self._batch.set_batch(list(tokens), n_past=n_past, logits_all=False)
        self.context.decode(self._batch)


# -- gguf: read a header without walking the vocabulary ---------------------------------------------------

def header_reader(path: str) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` that steps over the contents of arrays longer than
    :data:`LONG_ARRAY`: such a field keeps its type and length (:func:`array_length`) but no values.
    Every other field and every tensor reads as with the stock reader. Raises what the reader raises
    on a damaged file (``ValueError``, ``IndexError``, ``KeyError``, ``OSError``, ``TypeError``)."""
    return _header_reader_class()(path, "r")


def array_length(field: Any) -> int:
    """The length of an array field (its fifth part: key length, key, type, item type, length)."""
    return int(field.parts[4][0])


def _header_reader_class() -> type:
    import numpy as np
    from gguf import GGUFReader, GGUFValueType

    class HeaderReader(GGUFReader):  # type: ignore[misc]
        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            count = int(alen[0])
            if count <= LONG_ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            item = GGUFValueType(int(raw_itype[0]))
            offs = orig_offs + 12
            if item == GGUFValueType.STRING:
                view = memoryview(self.data)
                for _ in range(count):
                    offs += 8 + int.from_bytes(view[offs:offs + 8], "little")
            else:
                nptype = self.gguf_scalar_to_np.get(item)
                if nptype is None:
                    return super()._get_field_parts(orig_offs, raw_type)
                offs += count * np.dtype(nptype).itemsize
            # (bytes consumed, parts, indices of the value parts, types): no value parts for a skipped array.
            return offs - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, item]

    return HeaderReader
