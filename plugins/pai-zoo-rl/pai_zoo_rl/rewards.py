"""The built-in reward functions, registered through ``pai_zoo_reward_funcs`` as a third party's would be.

- ``exact_match``: 1.0 when the completion's answer equals the record's ``answer`` field, else 0.0. The answer is
  the text inside the last ``<answer>...</answer>`` when the completion has one, else the whole completion; both
  sides are compared with surrounding whitespace stripped.
- ``format``: 1.0 when the whole completion matches a regular expression, else 0.0: the record's ``pattern`` field
  when it has one, else DeepSeek-R1's ``<think>...</think><answer>...</answer>`` layout (:data:`R1_FORMAT`).

Both take TRL's completions: texts, token-id lists (compared as their decimal ids joined by spaces), or
conversations (the last message's content).
"""
from __future__ import annotations

import re

R1_FORMAT = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def completion_text(completion) -> str:
    """A completion as text: itself, a conversation's last content, or token ids joined by spaces."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, (list, tuple)):
        return " ".join(str(int(t)) for t in completion)
    raise TypeError(f"a completion is text, token ids or messages, not {type(completion).__name__}")


def exact_match(prompts, completions, answer=None, **fields) -> list[float]:
    """1.0 where the completion's answer equals the record's ``answer`` (see the module docstring)."""
    if answer is None:
        raise KeyError("exact_match needs an 'answer' field in every prompt record")
    out = []
    for completion, expected in zip(completions, answer):
        if expected is None:
            raise KeyError("exact_match needs an 'answer' field in every prompt record")
        text = completion_text(completion)
        tagged = _ANSWER.findall(text)
        given = tagged[-1] if tagged else text
        wanted = completion_text(expected) if isinstance(expected, (list, tuple)) else str(expected)
        out.append(float(given.strip() == wanted.strip()))
    return out


def format_reward(prompts, completions, pattern=None, **fields) -> list[float]:
    """1.0 where the completion matches the record's ``pattern`` (default :data:`R1_FORMAT`) in full."""
    patterns = pattern if pattern is not None else [None] * len(completions)
    return [float(re.fullmatch(p or R1_FORMAT, completion_text(c), re.S) is not None)
            for c, p in zip(completions, patterns)]


BUILTIN = {"exact_match": exact_match, "format": format_reward}
