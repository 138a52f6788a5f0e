"""Prompts: encoding (text, chats, ids), fitting the context, (un)padding a batch, JSON Lines prompt files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import no_such_path
from .params import GenerationError


def encode_prompt(prompt, tokenizer, where: str = "prompt", chat: bool = False) -> list[int]:
    """Token ids of one prompt: a string (tokenized with BOS as the tokenizer adds it), a chat
    (``[{"role", "content"}, ...]`` rendered with the tokenizer's chat template plus the generation
    prompt, tokenized as :mod:`pai_zoo.data.sft` tokenizes training chats) or a list of ids."""
    if chat:
        if tokenizer is None:
            raise GenerationError(f"{where}: a chat prompt needs a tokenizer; the model has none")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise GenerationError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        from ..data.sft import _special_affixes, _with_template

        try:
            text = _with_template(tokenizer, None).apply_chat_template(prompt, add_generation_prompt=True)
        except Exception as exc:  # jinja errors, raise_exception() in the template
            raise GenerationError(f"{where}: the chat template failed: {exc}") from exc
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not (tokenizer.bos_token and text.startswith(tokenizer.bos_token)):
            ids = _special_affixes(tokenizer, text, ids)[0] + ids
        return _non_empty(ids, where)
    if isinstance(prompt, str):
        if not prompt:
            raise GenerationError(f"{where}: the prompt is empty")
        if tokenizer is None:
            raise GenerationError(
                f"{where}: a text prompt needs a tokenizer and the model has none; "
                "pass token ids or load a checkpoint with a tokenizer"
            )
        return _non_empty(tokenizer.encode(prompt), where)
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise GenerationError(
            f"{where}: expected a string or a list of token ids, got {type(prompt).__name__}"
        ) from None
    return _non_empty(ids, where)


def _non_empty(ids: list[int], where: str) -> list[int]:
    if not ids:
        raise GenerationError(f"{where}: the prompt is empty (no tokens)")
    return ids


def fit_context(
    ids: list[int], context: int | None, max_new_tokens: int, truncate: str | None, where: str = "prompt"
) -> tuple[list[int], int]:
    """``(ids, dropped)``: the prompt as it fits the model's context with ``max_new_tokens`` after
    it; with ``truncate="left"`` the oldest tokens are dropped, otherwise a clear error."""
    if truncate not in (None, "left"):
        raise GenerationError(f"truncate must be None or 'left', not {truncate!r}")
    if context is None or len(ids) + max_new_tokens <= context:
        return ids, 0
    room = context - max_new_tokens
    if truncate == "left" and room > 0:
        return ids[len(ids) - room :], len(ids) - room
    if room <= 0:
        raise GenerationError(
            f"{where}: max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
            f"model's context of {context} tokens"
        )
    raise GenerationError(
        f"{where}: {len(ids)} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's "
        f"context of {context} tokens; shorten the prompt, lower max_new_tokens or truncate it "
        f"on the left (truncate='left', --truncate left)"
    )


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0):
    """``(ids [b, L], keep [b, L] bool)``: prompts right-aligned, ``keep`` False on the padding."""
    import torch

    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    keep = torch.zeros((len(prompts), length), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, length - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
            keep[row, length - len(prompt) :] = True
    return ids, keep


def unpad(input_ids, attention_mask=None) -> list[list[int]]:
    """Prompts as lists of ids from a padded batch (left or right padding, mask 1 = real token)."""
    import torch

    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if attention_mask is None:
        return input_ids.tolist()
    keep = torch.as_tensor(attention_mask).bool()
    return [row[k].tolist() for row, k in zip(input_ids, keep)]


def read_prompts(path, chat: bool = False) -> list[tuple[str, dict, Any]]:
    """``(where, record, prompt)`` per non-blank line of a JSON Lines file (``where`` is
    ``"FILE:LINE"``): ``{"prompt": str | [ids]}``, or with ``chat`` ``{"messages": [...]}``.
    Errors name the file and line."""
    out = []
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise no_such_path(path, "the prompts file") from None
    except OSError as exc:
        raise GenerationError(f"{path}: cannot read prompts: {exc.strerror or exc}") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GenerationError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(record, dict):
                raise GenerationError(f"{where}: expected a JSON object, got {type(record).__name__}")
            key = "messages" if chat else "prompt"
            if key not in record:
                other = "'prompt' (without --chat)" if chat else "'messages' (with --chat)"
                raise GenerationError(
                    f"{where}: no {key!r} key"
                    + (f"; use {other}" if ("prompt" if chat else "messages") in record else "")
                )
            out.append((where, record, record[key]))
    if not out:
        raise GenerationError(f"{path}: no prompts in the file")
    return out
