"""A GGUF's Jinja chat template rendered as llama-cpp-python renders it (``Jinja2ChatFormatter``), with jinja2 alone.

The chat framing of a served model comes from the template the server publishes; a judge-pool install has no
llama-cpp-python to render it with. The environment is the formatter's: sandboxed, ``trim_blocks`` and
``lstrip_blocks``, HuggingFace's ``{% generation %}`` tag passed through, loop controls, ``tojson`` as Transformers
writes it, and ``raise_exception`` / ``strftime_now`` in the context. ``tests/test_llama_adapter.py`` pins the two
renderings equal on the bundled models' templates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(spec: str) -> str:
    return datetime.now().strftime(spec)


def render_chat_template(template: str, messages: Sequence[Mapping[str, str]], *, bos_token: str = "",
                         eos_token: str = "", add_generation_prompt: bool = True) -> str:
    """The prompt ``template`` makes of ``messages`` (the generation prompt added unless told otherwise). Raises
    what jinja2 raises for a template it cannot parse or render, and ``ValueError`` from the template's own
    ``raise_exception``."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """HuggingFace's ``{% generation %}…{% endgeneration %}``: its body rendered as is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    environment = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                                extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    return environment.from_string(template).render(
        messages=list(messages), eos_token=eos_token, bos_token=bos_token, raise_exception=_raise_exception,
        add_generation_prompt=add_generation_prompt, functions=None, function_call=None, tools=None,
        tool_choice=None, strftime_now=_strftime_now)


__all__ = ["render_chat_template"]
