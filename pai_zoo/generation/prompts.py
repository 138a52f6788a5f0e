"""Prompts: encoding (text, chats, ids), fitting the context, (un)padding a batch, JSON Lines prompt files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..plugin.errors import DataError, no_such_path
from ..util.json_errors import json_msg
from .params import GenerationError


def encode_prompt(prompt, tokenizer, where: str = "prompt", chat: bool = False) -> list[int]:
    """Token ids of one prompt: a string (tokenized with BOS as the tokenizer adds it), a chat
    (``[{"role", "content"}, ...]`` rendered with the tokenizer's chat template plus the generation
    prompt, tokenized as :mod:`pai_zoo.data.sft` tokenizes training chats) or a list of ids.

    With ``chat`` a string is the one user turn of a chat (``[{"role": "user", "content": prompt}]``) and a list
    of ids is taken as it is (already a rendered prompt), so a prompts file may mix ``prompt`` and ``messages``
    records."""
    if chat:
        if isinstance(prompt, str):
            prompt = user_turn(prompt, where)
        elif isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return list(prompt)
        return _non_empty(_chat_ids(prompt, tokenizer, where), where)
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


def user_turn(text: str, where: str = "prompt") -> list[dict]:
    """A text prompt as a chat: one user message."""
    if not text:
        raise GenerationError(f"{where}: the prompt is empty")
    return [{"role": "user", "content": text}]


def _check_chat(messages, tokenizer, where: str) -> None:
    if tokenizer is None:
        raise GenerationError(f"{where}: a chat prompt needs a tokenizer; the model has none")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise GenerationError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")


def _chat_ids(messages, tokenizer, where: str) -> list[int]:
    """The chat rendered with the tokenizer's chat template (ChatML without one) and the generation prompt."""
    _check_chat(messages, tokenizer, where)
    from ..data.sft import _special_affixes, _with_template

    try:
        text = _with_template(tokenizer, None).apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # jinja errors, raise_exception() in the template
        raise GenerationError(f"{where}: the chat template failed: {exc}") from exc
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not (tokenizer.bos_token and text.startswith(tokenizer.bos_token)):
        ids = _special_affixes(tokenizer, text, ids)[0] + ids
    return ids


def encode_chat_response(prompt, response: str, tokenizer, where: str = "record") -> tuple[list[int], list[int]]:
    """``(prompt_ids, response_ids)`` of a prompt (text: one user turn; or a chat) answered by ``response`` (the
    assistant turn), rendered with the chat template the way :func:`encode_prompt` renders prompts and
    :func:`pai_zoo.data.sft.build_example` renders training chats: the prompt ids end with the generation prompt,
    the response ids are the assistant's text and what closes its turn (end-of-turn, EOS)."""
    messages = user_turn(prompt, where) if isinstance(prompt, str) else prompt
    _check_chat(messages, tokenizer, where)
    if not isinstance(response, str) or not response:
        raise GenerationError(f"{where}: with a chat template the response must be non-empty text")
    from ..data.sft import build_example

    try:
        ids, mask = build_example([*messages, {"role": "assistant", "content": response}], tokenizer)
    except (DataError, ValueError) as exc:
        raise GenerationError(f"{where}: {exc}") from exc
    first = mask.index(1) if 1 in mask else len(ids)
    return _non_empty(list(ids[:first]), where), list(ids[first:])


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
    ``"FILE:LINE"``): ``{"prompt": str | [ids]}``, and with ``chat`` also ``{"messages": [...]}`` (one file
    may mix both; :func:`encode_prompt` with ``chat`` makes a text prompt one user turn). Errors name the file
    and line."""
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
                raise GenerationError(f"{where}: malformed JSON: {json_msg(exc)} at column {exc.colno}") from None
            if not isinstance(record, dict):
                raise GenerationError(f"{where}: expected a JSON object, got {type(record).__name__}")
            keys = ("messages", "prompt") if chat else ("prompt",)
            key = next((k for k in keys if k in record), None)
            if key is None:
                raise GenerationError(
                    f"{where}: no {' or '.join(map(repr, keys))} key"
                    + ("; use 'messages' (with --chat)" if "messages" in record else "")
                )
            if chat and len([k for k in keys if k in record]) > 1:
                raise GenerationError(f"{where}: the record has both 'prompt' and 'messages'; give one")
            out.append((where, record, record[key]))
    if not out:
        raise GenerationError(f"{path}: no prompts in the file")
    return out
