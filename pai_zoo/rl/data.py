"""RL data: preference pairs and prompts from JSON Lines, as token ids.

A preference record is ``{"prompt": ..., "chosen": ..., "rejected": ...}``; a prompt record is
``{"prompt": ...}`` (read by :mod:`pai_zoo.generation`). Each field is text (tokenized with the model's
tokenizer) or a list of token ids. A bad record stops the run before training with an error naming ``file:line``.

With ``chat`` (``pai-zoo rl ... --chat``) the tokenizer's chat template applies, as ``pai-zoo generate --chat``
applies it (:func:`pai_zoo.generation.encode_prompt`): a text prompt is one user turn, a prompt record may be
``{"messages": [...]}`` instead, and a pair's ``prompt`` (text or a list of messages) is answered by ``chosen``
and ``rejected`` as assistant turns (:func:`pai_zoo.generation.prompts.encode_chat_response`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..data.sources import BadRecord, iter_records
from ..data.vocabulary import check_token_ids
from ..generation import encode_prompt
from ..generation import read_prompts as read_prompt_records
from ..generation.prompts import encode_chat_response
from ..plugin.errors import PaiZooError

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass
class Pair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    where: str = ""


def check_ids(what: str, ids: list[int], vocab_size: int) -> list[int]:
    """``ids``, after :func:`~pai_zoo.data.vocabulary.check_token_ids` (the rule ``pai-zoo train`` applies)."""
    if ids:
        bad = [i for i in ids if not 0 <= i < vocab_size][:5]
        check_token_ids(what, min(ids), max(ids), vocab_size, examples=bad)
    return ids


def _ids(where: str, key: str, value, tokenizer, vocab_size: int, add_special_tokens: bool) -> list[int]:
    if isinstance(value, str):
        if tokenizer is None:
            raise PaiZooError(f"{where}: field {key!r} is text but the model has no tokenizer; "
                              "give token ids (a list of integers) or a model folder with tokenizer files")
        ids = tokenizer.encode(value, add_special_tokens=add_special_tokens)
    elif isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        ids = list(value)
    else:
        raise PaiZooError(f"{where}: field {key!r} must be text or a list of token ids, not {type(value).__name__}")
    return check_ids(f"{where}: field {key!r}", ids, vocab_size)


def _records(path):
    for where, record in iter_records([path]):
        if isinstance(record, BadRecord):
            raise record
        yield where, record


def _chat_pair(where: str, record: dict, tokenizer, vocab_size: int) -> Pair:
    if tokenizer is None:
        raise PaiZooError(f"{where}: --chat needs a tokenizer and the model has none; "
                          "give a model folder with tokenizer files")
    prompt = record["prompt"]
    if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
        raise PaiZooError(f"{where}: with --chat, 'prompt' must be text or a list of {{role, content}} messages")
    answers = {key: _assistant_text(where, key, record[key]) for key in ("chosen", "rejected")}
    prompt_ids, chosen = encode_chat_response(prompt, answers["chosen"], tokenizer, where)
    other, rejected = encode_chat_response(prompt, answers["rejected"], tokenizer, where)
    if other != prompt_ids:
        raise PaiZooError(f"{where}: the chat template renders the prompt differently before 'chosen' and "
                          "'rejected'; cannot split them at one prompt")
    for key, ids in (("prompt", prompt_ids), ("chosen", chosen), ("rejected", rejected)):
        check_ids(f"{where}: field {key!r}", ids, vocab_size)
    return Pair(prompt_ids, chosen, rejected, where)


def _assistant_text(where: str, key: str, value) -> str:
    """A chat pair's answer: text, or TRL's conversational form, one assistant message."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) \
            and value[0].get("role") == "assistant" and isinstance(value[0].get("content"), str):
        return value[0]["content"]
    if not isinstance(value, str):
        raise PaiZooError(f"{where}: with --chat, {key!r} must be text or one assistant message "
                          '([{"role": "assistant", "content": "..."}])')
    return value


def _is_conversation(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def read_pairs(path, tokenizer=None, vocab_size: int = 1 << 62, chat: bool = False) -> list[Pair]:
    """Every preference pair of a JSON Lines file, tokenized (``chat``: with the chat template, which a record in
    TRL's conversational form -- ``prompt`` a list of messages -- gets without it)."""
    pairs = []
    for where, record in _records(path):
        missing = [k for k in PAIR_FIELDS if k not in record]
        if missing:
            raise PaiZooError(f"{where}: preference record lacks {', '.join(repr(m) for m in missing)} "
                              f"(needs {', '.join(PAIR_FIELDS)})")
        if chat or _is_conversation(record["prompt"]):
            pair = _chat_pair(where, record, tokenizer, vocab_size)
        else:
            prompt = _ids(where, "prompt", record["prompt"], tokenizer, vocab_size, True)
            chosen, rejected = (_ids(where, k, record[k], tokenizer, vocab_size, False) for k in ("chosen", "rejected"))
            pair = Pair(prompt, chosen, rejected, where)
        if not pair.chosen or not pair.rejected:
            raise PaiZooError(f"{where}: 'chosen' and 'rejected' must not be empty")
        pairs.append(pair)
    if not pairs:
        raise PaiZooError(f"{path}: no preference records")
    return pairs


def read_prompts(path, tokenizer=None, vocab_size: int = 1 << 62, chat: bool = False) -> list[list[int]]:
    """Every prompt of a JSON Lines file (``{"prompt": text | [ids]}``, and with ``chat`` also
    ``{"messages": [...]}``, read as ``pai-zoo generate [--chat]`` reads prompts), as token ids inside the
    vocabulary."""

    prompts = []
    for where, _record, prompt in read_prompt_records(path, chat=chat):
        prompts.append(check_ids(where, encode_prompt(prompt, tokenizer, where, chat), vocab_size))
    return prompts
