"""Text a trace put in a name, made safe to write to a terminal or a text file.

A name in a trace is any JSON string: control characters (a bell, an ESC sequence that clears the screen),
lone surrogates (which no UTF-8 stream can encode), bidirectional overrides. Every character that is not
printable is written as its Python escape (\\x07, \\x1b, \\udc80, \\u202e); the rest is left as it is."""

import sys
from typing import TextIO


def _escape(ch: str) -> str:
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def is_control(ch: str) -> bool:
    """A character that acts on a terminal or breaks an encoder: C0, DEL, C1, a lone surrogate, a bidirectional
    override or isolate. Other non-printable characters (no-break and ideographic spaces, joiners) are text."""
    n = ord(ch)
    return n < 0x20 or 0x7F <= n <= 0x9F or 0xD800 <= n <= 0xDFFF or 0x202A <= n <= 0x202E or 0x2066 <= n <= 0x2069


def has_control(s: str) -> bool:
    """Whether s holds a character is_control names."""
    return not s.isprintable() and any(is_control(ch) for ch in s)


def safe_text(s: str) -> str:
    """s with every character that is not printable escaped (newlines and tabs too): one line, always encodable."""
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def safe_lines(s: str) -> str:
    """safe_text of each line of s, the newlines kept."""
    return "\n".join(safe_text(line) for line in s.split("\n"))


def write(text: str, file: TextIO | None = None) -> None:
    """Write text (its newlines kept, every other character that is not printable escaped) to file (stdout)."""
    (file or sys.stdout).write(safe_lines(text))


def say(line: str, file: TextIO | None = None) -> None:
    """print(line) made safe: one line's text, escaped, then a newline."""
    write(line + "\n", file)
