"""The memory-provider interface and its value types.

A memory provider decides which conversation history an agent sends to its model each turn. Three
methods have no default (:meth:`MemoryProvider.name`, :meth:`MemoryProvider.build_messages`,
:meth:`MemoryProvider.sync_turn`); every other method has a default that does nothing (the note methods
refuse), so a provider overrides only what it needs. The methods an agent loop awaits (``sync_turn``,
``initialize``, ``prefetch``, ``on_pre_compress``, ``on_session_end``) are ``async def``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from kvjudge.errors import NotesUnsupported


@dataclass(frozen=True)
class MemMessage:
    """One chat message: ``role`` is ``"system"``, ``"user"`` or ``"assistant"``."""

    role: str
    content: str

    def to_dict(self) -> dict[str, str]:
        """The OpenAI-style ``{"role", "content"}`` mapping chat-completion APIs take."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class TurnMetrics:
    """What the backend reported for one turn; either figure may be missing.

    ``input_tokens`` is the full prompt size of the request (system prompt and all prior turns
    included), as the backend counted it; ``output_tokens`` the size of the reply.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class ConversationTurn:
    """A durable turn record, as restored from storage.

    ``tokens_in``/``tokens_out`` are the backend's measured figures, ``None`` when the turn was not
    measured (for example a compaction record).
    """

    user: str
    assistant: str
    tokens_in: int | None = None
    tokens_out: int | None = None


@dataclass(frozen=True)
class SessionContext:
    """What :meth:`MemoryProvider.initialize` learns about the session it starts."""

    session_id: str = ""
    working_dir: str | None = None


class MemoryProvider(abc.ABC):
    """Decides what history goes into each request, and learns from each completed turn."""

    @abc.abstractmethod
    def name(self) -> str:
        """Short stable identifier, e.g. ``"rolling_window"``."""

    @abc.abstractmethod
    def build_messages(self, system_prompt: str, new_task: str) -> list[MemMessage]:
        """The full message list (system prompt, history, new task) to send to the model."""

    @abc.abstractmethod
    async def sync_turn(self, user: str, assistant: str, metrics: TurnMetrics) -> None:
        """Persist a completed turn."""

    def reset(self) -> None:
        """Clear conversation-local history, keeping configuration and system-prompt state. Default: nothing."""

    def restore_turns(self, turns: Sequence[ConversationTurn]) -> None:
        """Replace conversation-local history with durable restored turns. Default: nothing kept."""

    def usage(self) -> tuple[str, int, int] | None:
        """Current usage for display as ``(label, current, max)``, e.g. ``("turns", 12, 20)``. Default: None."""
        return None

    async def initialize(self, ctx: SessionContext) -> None:
        """One-time setup at session start (load files, warm caches). Default: no-op."""

    def system_prompt_block(self) -> str | None:
        """A static block for the system prompt. Default: None."""
        return None

    async def prefetch(self, query: str) -> str:
        """Context to prepend to the user turn; must be fast. Default: ``""`` (contributes nothing)."""
        return ""

    def take_compaction_record(self) -> str | None:
        """Take and clear the compaction record minted since the last call. Default: None (never compresses)."""
        return None

    async def on_pre_compress(self, messages: Sequence[MemMessage]) -> str:
        """Called before old messages are discarded; returns text worth keeping. Default: ``""``."""
        return ""

    async def on_session_end(self, messages: Sequence[MemMessage]) -> None:
        """Called once when the session ends. Default: no-op."""

    def add_note(self, fact: str) -> None:
        """Add a persistent note. Default: raises :class:`NotesUnsupported`."""
        raise NotesUnsupported(f"the {self.name()} memory provider keeps no notes; use a provider that does")

    def replace_note(self, old_substring: str, new_text: str) -> None:
        """Replace the one note containing ``old_substring``. Default: raises :class:`NotesUnsupported`."""
        raise NotesUnsupported(f"the {self.name()} memory provider keeps no notes; use a provider that does")

    def remove_note(self, substring: str) -> None:
        """Remove the one note containing ``substring``. Default: raises :class:`NotesUnsupported`."""
        raise NotesUnsupported(f"the {self.name()} memory provider keeps no notes; use a provider that does")
