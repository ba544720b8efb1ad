"""Text bound for a terminal, made inert: env-derived strings never drive the terminal.

In: any text a command shows a person (skills, reject reasons, error messages, log lines).
Out: the same text with every control character but newline and tab (C0, DEL, C1), every
bidi mark or override and every lone surrogate written out as a visible `\\xNN` / `\\uNNNN`.
Guarantees: no ANSI colour, cursor move, OSC title or hyperlink from an env reaches the terminal,
no line is rewritten by a carriage return, and the result always encodes as UTF-8.
"""

from __future__ import annotations

import re

# C0 but newline and tab, DEL, C1 (ESC, CSI, OSC...), the bidi marks and overrides that make text
# read differently from what it is, and lone surrogates (they cannot be encoded).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def terminal_safe(text: str) -> str:
    return _UNSAFE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
