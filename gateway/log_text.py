"""Text a client or an upstream chose, made safe for a log line: every character that is not printable
(``\r``, ANSI's ESC, the other C0 and C1 controls, DEL, the Unicode line and paragraph separators,
bidirectional overrides) written as its Python escape, so that such text can neither forge a line of
its own, nor rewrite the terminal that shows the log, nor hide what it says. Printable text, the usual
case, is returned as it is after one C-level test.
"""

from __future__ import annotations


def log_text(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
