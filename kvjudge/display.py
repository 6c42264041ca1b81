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


# The code points invisible_class() covers, as inclusive ranges, by the Unicode version they were scanned from (a
# scan of every code point costs about 0.18 s of CPU at each process start that renders). Another Python's
# Unicode database is scanned instead; tests/test_display.py checks the entry for this Python against the scan.
INVISIBLE_RANGES: dict[str, tuple[tuple[int, int], ...]] = {
    "14.0.0": ((0x0000, 0x0008), (0x000B, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605),
               (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
               (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F),
               (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
               (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F)),
}


def scan_invisible_ranges() -> tuple[tuple[int, int], ...]:
    """The ranges of code points :func:`invisible_class` covers, scanned from this Python's Unicode database."""
    ranges: list[list[int]] = []
    for code in range(sys.maxunicode + 1):
        if chr(code) not in "\t\n" and unicodedata.category(chr(code)) in ("Cc", "Cf"):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return tuple((lo, hi) for lo, hi in ranges)


@functools.cache
def invisible_class() -> str:
    """A regex character class of the code points a reader may not see and a tokenizer may skip: controls
    (C0 but tab and newline, DEL, C1) and format characters (Cf: bidi controls, zero-width characters, the
    BOM, tag characters), from this Python's Unicode database (:data:`INVISIBLE_RANGES` for a known version, else
    a scan), for code that must treat ``<\\x00<`` as ``<<``."""
    ranges = INVISIBLE_RANGES.get(unicodedata.unidata_version) or scan_invisible_ranges()
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
