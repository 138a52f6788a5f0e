"""Python source of plain values, as the generated plugins write them (:func:`py`)."""
from __future__ import annotations

import json
from typing import Any


def py(value: Any) -> str:
    """Python source of a plain value, strings in double quotes (the project's style)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py(k)}: {py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(py(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)
