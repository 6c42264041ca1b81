"""Run text on a terminal: control characters and other invisible code points made visible.

A run carries whatever its tools printed, so its text may hold terminal escape sequences (``ESC [2J``
clears the screen, ``ESC ] 0 ; … BEL`` retitles the window) or bidi overrides that reorder what a reviewer
reads. :func:`visible` renders every such code point as something a terminal only displays, the way
``cat -v`` and ``less`` do; newline and tab stay as they are. ``--json`` output needs none of this (JSON
escapes control characters) and ``--raw`` skips it for a user who wants their colours.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# Every character outside printable ASCII, newline and tab, in runs: most runs are printable as a whole
# (``str.isprintable`` is C speed), so only the few that are not are looked at one character at a time.
_SUSPECT_RUN = re.compile(r"[^\t\n\x20-\x7e]+")

# Categories a terminal may act on or that show nothing: controls (C0, DEL, C1), format characters (bidi
# overrides and isolates, zero-width characters, the BOM, tag characters), lone surrogates, line and
# paragraph separators. Unassigned (Cn), private-use (Co) and space (Zs) characters only print.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


@functools.cache
def invisible_class() -> str:
    """A regex character class of the code points a reader may not see and a tokenizer may skip: controls
    (C0 but tab and newline, DEL, C1) and format characters (Cf: bidi controls, zero-width characters, the
    BOM, tag characters), from this Python's Unicode database. Built once per process (a scan of every
    code point, about a tenth of a second), for code that must treat ``<\\x00<`` as ``<<``."""
    ranges: list[list[int]] = []
    for code in range(sys.maxunicode + 1):
        if chr(code) not in "\t\n" and unicodedata.category(chr(code)) in ("Cc", "Cf"):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    members = (re.escape(chr(lo)) + ("" if lo == hi else "-" + re.escape(chr(hi))) for lo, hi in ranges)
    return "[" + "".join(members) + "]"


def _picture(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the control pictures: ␀ … ␛ (ESC) … ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"<U+{code:04X}>"


def _visible_run(match: re.Match[str]) -> str:
    run = match.group()
    if run.isprintable():
        return run
    return "".join(_picture(char) if unicodedata.category(char) in _HIDDEN_CATEGORIES else char for char in run)


def visible(text: str) -> str:
    """``text`` as a terminal should show untrusted text: every control or invisible code point made visible.

    C0 controls become their control pictures (ESC → ``␛``, BEL → ``␇``, CR → ``␍``), DEL becomes ``␡``,
    and C1 controls, format characters (e.g. U+202E RIGHT-TO-LEFT OVERRIDE), lone surrogates and line or
    paragraph separators become ``<U+XXXX>``. Newline and tab are kept; everything else is unchanged.
    """
    if text.isascii() and text.isprintable():
        return text
    return _SUSPECT_RUN.sub(_visible_run, text)
