"""Invisible and bidirectional control characters in what a run wrote, made visible before anyone reads it.

A browser or a terminal does not show U+202E RIGHT-TO-LEFT OVERRIDE: it
draws the text after it backwards, so an interrupt question
``"IBAN \\u202e1234 5678\\u202c"`` reads "IBAN 8765 4321" and an amount
``"\\u202e00.0001\\u202c"`` reads "1000.00". Zero-width characters, Unicode
tag characters (text a model reads and a person does not see) and control
characters hide text the same way. Escaping HTML does not help: they are not
markup. So every value a run wrote goes through ``visible()`` before it is
shown (the web view, ``kubectl agentrun``): each such character becomes its
escape (``\\u202e``), which is what it would look like in JSON, and the page
or the command says that a value contained them.

What counts as hidden (``HIDDEN``): control characters (Cc) except tab and
newline, format characters (Cf: the bidi controls U+202A-202E, U+2066-2069,
U+200E/F, U+061C, the zero-width ones, U+FEFF, the tag characters
U+E0000-E007F, ...), the line and paragraph separators U+2028/2029, lone
surrogates, the invisible Hangul fillers, U+034F, and variation selectors
except one directly after a character (how emoji and ideographs are written;
a run of them, or one that starts a text, carries hidden data). The table is
written out here (a scan of ``unicodedata`` costs half a second at every
``kubectl agentrun`` start); ``tests/unit/test_history_text.py`` checks it
against this Python's Unicode database.
"""

from __future__ import annotations

import re
import unicodedata

# Ranges of code points that are always shown as escapes (see the module docstring).
_ALWAYS = (
    (0x00, 0x08),
    (0x0B, 0x1F),  # tab (09) and newline (0A) stay
    (0x7F, 0x9F),
    (0xAD, 0xAD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xD800, 0xDFFF),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE007F),
    (0xE0100, 0xE01EF),  # variation selectors 17-256: no text of ours needs them, hidden data does
)
_SELECTORS = "\ufe00-\ufe0f"


def _char_class() -> str:
    return "".join(f"\\U{a:08x}-\\U{b:08x}" if a != b else f"\\U{a:08x}" for a, b in _ALWAYS)


# A hidden character, or a variation selector U+FE00-FE0F at the start or after another selector.
HIDDEN = re.compile(f"[{_char_class()}]|(?:(?<=[{_SELECTORS}])|^)[{_SELECTORS}]")


def escape(char: str) -> str:
    """``char`` as its escape: ``\\u202e``, ``\\U000e0041`` beyond the Basic Multilingual Plane."""
    point = ord(char)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def describe(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``: the character's code point and name (control characters have none)."""
    point = ord(char)
    return f"U+{point:04X} {unicodedata.name(char, 'CONTROL CHARACTER' if point < 0xA0 else 'UNNAMED')}"


def hidden(text: str) -> list[str]:
    """The distinct hidden characters of ``text``, in the order they first occur."""
    found: dict[str, None] = {}
    for match in HIDDEN.finditer(text):
        found.setdefault(match.group(), None)
    return list(found)


def visible(text: str) -> str:
    """``text`` with each hidden character replaced by its escape (``\\u202e``)."""
    return HIDDEN.sub(lambda m: escape(m.group()), text)


def visible_json(text: str) -> str:
    """JSON ``text`` with each hidden character as a JSON escape: the same JSON value, nothing hidden.

    Hidden characters occur only inside JSON strings (``json.dumps`` escapes the controls there itself), where
    ``\\u202e`` is the character's own escape; beyond U+FFFF it is written as its UTF-16 surrogate pair."""

    def json_escape(match: re.Match[str]) -> str:
        point = ord(match.group())
        if point <= 0xFFFF:
            return f"\\u{point:04x}"
        point -= 0x10000
        return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"

    return HIDDEN.sub(json_escape, text)


def note(found: list[str]) -> str:
    """One sentence saying which hidden characters ``found`` were shown as escapes."""
    names = ", ".join(describe(c) for c in found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    return (
        f"Values here contained invisible or bidirectional control characters ({names}); each is shown as its "
        "escape (like \\u202e): read them as written, not as a browser or a terminal would draw them."
    )
