"""Extracts: parts of a text kept verbatim, with a short marker where the rest was cut.

Nothing here reads or rewrites the text: no model is called, no sentence is composed, and no tokenizer is
asked (the caller passes the text's token count), so the same bytes in give the same bytes out, and a crashed
reduction that runs again writes the same extract under the same ref. In the log the extract is the run's
*summary blob* (``Reduced{original, summary}``: the event names the blob by its role); the ``Reduced`` event
carries the original's full ref and its token counts, so the marker in the text only says what was cut, in a
few tokens::

    [212 lines cut]            (the cut spans line ends)
    [5234 characters cut]      (a cut inside one line)
    [14 context lines cut]     (a diff that keeps its changed lines and lost unchanged ones)

Shapes: :func:`head_tail_extract` keeps the start and the end (``head_share`` of the kept text at the start:
a half for a file dump, a quarter for a test log, whose outcome is at its end); :func:`diff_extract` keeps a
unified diff's changed lines and headers before anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjudge.retention.evidence import diff_lines

MARKER = "[{amount} cut]"
# A kept piece that starts or ends inside a line and is shorter than this is left out: a few characters of a
# line tell a reader nothing and cost tokens.
MIN_FRAGMENT = 64


def marker(amount: str) -> str:
    """The cut marker: ``amount`` says what was cut (``212 lines``)."""
    return MARKER.format(amount=amount)


# Line ends other than "\n" that str.splitlines also splits at: a text with none has its lines counted by "\n".
_OTHER_LINE_ENDS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _line_count(text: str) -> int:
    """``len(text.splitlines())``, without making the lines when ``"\n"`` is the text's only line end."""
    if not any(end in text for end in _OTHER_LINE_ENDS):
        return text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    return len(text.splitlines())


def cut_marker(cut: str) -> str:
    """The marker for the text ``cut``: its lines when it spans a line end, else its characters."""
    if "\n" in cut:
        lines = _line_count(cut)
        return marker(f"{lines} line{'s' if lines != 1 else ''}")
    return marker(f"{len(cut)} character{'s' if len(cut) != 1 else ''}")


def _cut_head(text: str, chars: int) -> str:
    if chars <= 0:
        return ""
    head = text[:chars]
    # End on a line boundary when one is near, so the kept part reads as whole lines.
    newline = head.rfind("\n")
    return head[: newline + 1] if newline >= chars * 0.75 else head


def _cut_tail(text: str, chars: int) -> str:
    if chars <= 0:
        return ""
    tail = text[-chars:]
    newline = tail.find("\n")
    return tail[newline + 1:] if 0 <= newline <= chars * 0.25 else tail


@dataclass(frozen=True)
class HeadTail:
    """What a head-and-tail extract of a text keeps: ``text[:head_end]``, then the marker, then
    ``text[tail_start:]``, each on lines of its own."""

    head_end: int
    marker: str
    tail_start: int

    def middle(self, text: str) -> str:
        """What stands between the kept head and tail in the extract of ``text``: the marker and its line ends."""
        return ("\n" if self.head_end else "") + self.marker + ("\n" if self.tail_start < len(text) else "")

    def of(self, text: str) -> str:
        """The extract of ``text``."""
        return text[:self.head_end] + self.middle(text) + text[self.tail_start:]


def head_tail_cut(text: str, *, tokens: int, keep_tokens: int, head_share: float = 0.5) -> HeadTail | None:
    """The cut :func:`head_tail_extract` makes of ``text`` (None: nothing would be cut, the text stays whole)."""
    keep_tokens = max(0, min(keep_tokens, tokens))
    chars = int(keep_tokens * len(text) / tokens) if tokens > 0 else 0
    head = _cut_head(text, int(chars * head_share))
    if len(head) < MIN_FRAGMENT and not head.endswith("\n") and "\n" in text:
        head = ""
    tail = _cut_tail(text[len(head):], chars - len(head))
    start = len(text) - len(tail)
    if len(tail) < MIN_FRAGMENT and start > 0 and text[start - 1] != "\n" and "\n" in text:
        tail = ""
    cut = text[len(head):len(text) - len(tail)]
    if not cut:
        return None
    return HeadTail(head_end=len(head.rstrip("\n")), marker=cut_marker(cut),
                    tail_start=len(text) - len(tail.lstrip("\n")))


def head_tail_extract(text: str, *, tokens: int, keep_tokens: int, head_share: float = 0.5) -> str:
    """Keep about ``keep_tokens`` of ``text``'s ``tokens`` tokens verbatim — ``head_share`` of them at the start,
    the rest at the end — around a marker for the cut (``keep_tokens`` 0: the marker alone).

    Sizes are reckoned in characters at the text's own characters per token, so nothing is counted here.
    Deterministic. The text is returned whole when nothing would be cut.
    """
    cut = head_tail_cut(text, tokens=tokens, keep_tokens=keep_tokens, head_share=head_share)
    return text if cut is None else cut.of(text)


def diff_extract(text: str, *, tokens: int, keep_tokens: int) -> str:
    """A unified diff within about ``keep_tokens``: its unchanged context lines go first (one marker at the top
    says how many), then, if that is not enough, the middle of what is left (:func:`head_tail_extract`)."""
    kept: list[str] = []
    context = 0
    for kind, line in diff_lines(text):
        if kind == "context":
            context += 1
        else:
            kept.append(line)
    if context == 0:
        return head_tail_extract(text, tokens=tokens, keep_tokens=keep_tokens)
    slim = marker(f"{context} context lines") + "\n" + "".join(kept)
    slim_tokens = max(1, round(tokens * len(slim) / max(1, len(text))))
    if slim_tokens <= keep_tokens:
        return slim
    return head_tail_extract(slim, tokens=slim_tokens, keep_tokens=keep_tokens)


__all__ = ["MARKER", "HeadTail", "cut_marker", "diff_extract", "head_tail_cut", "head_tail_extract", "marker"]
