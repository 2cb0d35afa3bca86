"""The one function every string from outside goes through before it reaches a terminal or an
HTML page: trace names, thread and stream names, file names, LLM replies, server messages.

``plain`` shows every character that could act instead of being read as a visible escape
(``\\x1b``, ``\\u202e``): control characters (ESC sequences that recolour or rewrite the
terminal, C1 codes, line breaks that would forge a line of output such as ``error: ...``),
Unicode format characters (bidirectional overrides that reorder what is shown, zero-width and
invisible tag characters), line and paragraph separators and lone surrogates. ``html_text`` is
``plain`` then HTML-escaped, for the report's page; ``plotly_text`` the same for its figures'
labels (plotly renders a subset of HTML tags in them): tags in a name are shown as text.
"""

from __future__ import annotations

import html
import re

# Unicode categories Cc, Cf, Zl, Zp (Unicode 15; tests/report/test_inert.py checks the list
# against the running Python's unicodedata) and the surrogates.
UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def plain(text: object) -> str:
    """``text`` as inert, one-line terminal text: each unsafe character (module docstring) shown
    as its Python escape, everything else as it is."""
    s = str(text)
    return UNSAFE.sub(_escape, s) if UNSAFE.search(s) else s


def html_text(text: object) -> str:
    """``plain(text)`` escaped for HTML text and attribute values (``<``, ``>``, ``&``, quotes)."""
    return html.escape(plain(text), quote=True)


def plotly_text(text: object) -> str:
    """``plain(text)`` for a plotly label or hover text: ``<``, ``>`` and ``&`` as the entities
    plotly turns back into characters (it renders a subset of HTML tags there, and shows other
    entities, ``&quot;``, as they are)."""
    return html.escape(plain(text), quote=False)
