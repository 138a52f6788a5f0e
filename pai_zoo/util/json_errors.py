"""JSON parse errors in words: :func:`json_error_text` gives Python's whole message, where it is, and the character
found there (Python's own ``msg`` of some errors ends mid-sentence: ``"Invalid control character at"``)."""
from __future__ import annotations

import json

__all__ = ["json_error_text", "json_msg"]


def json_error_text(exc: json.JSONDecodeError, *, line: bool = True) -> str:
    """``"line L column C: MESSAGE at column C (found X)"``-style text of ``exc``; ``line=False`` leaves out the
    line (a one-line record, whose ``file:line`` the caller gives)."""
    msg = exc.msg.strip()
    where = f"line {exc.lineno} column {exc.colno}" if line else f"column {exc.colno}"
    text = f"{msg} {where}" if msg.endswith(" at") else f"{msg} at {where}"
    doc = exc.doc if isinstance(exc.doc, str) else ""
    if 0 <= exc.pos < len(doc):
        text += f" (found {doc[exc.pos]!r})"
    elif doc and exc.pos >= len(doc):
        text += " (the text ends there)"
    return text


def json_msg(exc: json.JSONDecodeError) -> str:
    """Python's ``msg`` of ``exc`` made whole, for messages that give the position themselves: a trailing ``" at"``
    (``"Invalid control character at"``) dropped and the character found there added
    (``"Invalid control character (found '\\t')"``)."""
    msg = exc.msg.strip()
    msg = msg[:-3] if msg.endswith(" at") else msg
    doc = exc.doc if isinstance(exc.doc, str) else ""
    if 0 <= exc.pos < len(doc):
        return f"{msg} (found {doc[exc.pos]!r})"
    return f"{msg} (the text ends there)" if doc else msg
