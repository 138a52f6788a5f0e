"""Supervised fine-tuning (SFT) examples: chat records -> token ids + loss mask, and packing.

    messages = normalize_record(record, "data.jsonl:17")       # messages or Alpaca records
    tokens, loss_mask = build_example(messages, tokenizer)     # 1 only on assistant responses
    for packed in pack(examples, seq_length=4096, pad_id=0):   # fixed-length sequences
        packed.tokens, packed.loss_mask, packed.boundaries

``loss_mask[i]`` says whether token ``i`` is a training target; when labels are formed as ``tokens[1:]``, shift the
mask with them (``loss_mask[1:]``). Only numpy is imported here (no torch, transformers or megatron); the tokenizer
is any :class:`pai_zoo.tokenizers.Tokenizer`.

How the mask is computed (:func:`build_example`): the chat template is rendered for the whole conversation and for
its prefixes ``messages[:k]``: before each assistant turn with ``add_generation_prompt=True`` (where the response
starts) and after it with ``add_generation_prompt=False`` (where the turn, end-of-turn tokens included, ends). Every
prefix rendering must be a prefix of the full one. This cuts the full text into character segments labelled
"assistant" or not. The full text is tokenized once; segment boundaries are mapped to token boundaries by

1. *segments*: tokenizing each segment on its own; when the concatenation equals the tokens of the whole text, the
   cumulative lengths are the boundaries (the usual case: templates cut at special tokens or newlines);
2. *prefix diffing*, otherwise (a tokenizer that merges across a boundary or adds a SentencePiece dummy prefix to a
   segment): for each boundary the text before it is tokenized and compared with the tokens of the whole text. If
   it is a token prefix of them, its length is the boundary. If not, a token straddles the boundary; the first token
   that differs is then given to the assistant side (trained on), so that the first response token and the
   end-of-turn token are always learnt.

A token is therefore trained on exactly when it holds text of an assistant turn (as rendered by the template).
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..plugin.errors import DataError

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "ROLES",
    "normalize_record",
    "build_example",
    "PackedSequence",
    "PackStats",
    "pack",
    "pad_to_multiple",
]

ROLES = ("system", "user", "assistant")

#: Generic ChatML template (``<|im_start|>role\ncontent<|im_end|>\n``) for tokenizers without one.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TOKEN_DTYPE = np.int64
MASK_DTYPE = np.uint8


# --------------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------------
def _text(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: {what} is empty")
    return value


def normalize_record(record: dict, where: str) -> list[dict]:
    """Messages ``[{"role", "content"}, ...]`` of one SFT record.

    Accepts ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}`` (at least one assistant
    message) or Alpaca ``{"instruction": str, "input": str (optional), "output": str}``, which becomes a user message
    ``instruction`` (+ ``"\\n\\n" + input`` when non-empty) and an assistant message ``output``. Other keys are
    ignored. Anything else raises :class:`~pai_zoo.errors.DataError` (a ValueError) whose message starts with
    ``where`` (e.g. ``"data.jsonl:17"``).
    """
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    has_messages, has_alpaca = "messages" in record, "instruction" in record or "output" in record
    if has_messages and has_alpaca:
        raise DataError(f"{where}: record has both 'messages' and 'instruction'/'output'; use one format")
    if has_messages:
        raw = record["messages"]
        if not isinstance(raw, list):
            raise DataError(f"{where}: 'messages' must be a list, got {type(raw).__name__}")
        if not raw:
            raise DataError(f"{where}: 'messages' is empty")
        messages = []
        for index, message in enumerate(raw):
            label = f"messages[{index}]"
            if not isinstance(message, dict):
                raise DataError(f"{where}: {label} must be an object, got {type(message).__name__}")
            for key in ("role", "content"):
                if key not in message:
                    raise DataError(f"{where}: {label} has no {key!r}")
            role = message["role"]
            if role not in ROLES:
                raise DataError(f"{where}: {label} has unknown role {role!r} (expected one of {', '.join(ROLES)})")
            messages.append({"role": role, "content": _text(message["content"], where, f"{label}.content")})
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: no assistant message: nothing to train on")
        return messages
    if has_alpaca:
        for key in ("instruction", "output"):
            if key not in record:
                raise DataError(f"{where}: Alpaca record has no {key!r}")
        prompt = _text(record["instruction"], where, "'instruction'")
        extra = record.get("input")
        if extra is not None:
            if not isinstance(extra, str):
                raise DataError(f"{where}: 'input' must be a string, got {type(extra).__name__}")
            if extra.strip():
                prompt += "\n\n" + extra
        output = _text(record["output"], where, "'output'")
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    keys = ", ".join(map(repr, list(record)[:8])) or "none"
    raise DataError(
        f"{where}: not an SFT record: expected 'messages' or 'instruction'/'input'/'output' keys, got {keys}"
    )


# --------------------------------------------------------------------------------------------------------------
# Examples
# --------------------------------------------------------------------------------------------------------------
def _with_template(tokenizer, chat_template: str | None):
    """The tokenizer itself, or a shallow copy rendering another template."""
    template = chat_template or tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE
    if template == tokenizer.chat_template:
        return tokenizer
    clone = copy.copy(tokenizer)
    clone.chat_template = template
    return clone


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, variables: dict) -> str:
    import jinja2

    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as exc:
        raise DataError(f"the chat template failed on the first {len(messages)} messages: {exc}") from exc


def _segments(tokenizer, messages: Sequence[dict], variables: dict) -> tuple[str, list[int], list[int]]:
    """``(text, cuts, labels)``: the full rendering, character offsets ``0 = cuts[0] < ... < cuts[-1] = len(text)``
    and per segment ``text[cuts[i]:cuts[i + 1]]`` a label (1 = assistant turn)."""
    messages = list(messages)
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        raise DataError("the conversation has no assistant turn: nothing to train on")
    if messages[0].get("role") == "assistant":
        raise DataError("the conversation starts with an assistant turn; it needs a prompt before it")
    text = _render(tokenizer, messages, False, variables)
    cuts, labels = [0], []

    def cut(k: int, generation_prompt: bool, label: int) -> None:
        prefix = _render(tokenizer, messages[:k], generation_prompt, variables)
        if not text.startswith(prefix):
            raise DataError(
                f"chat template problem: rendering the first {k} of {len(messages)} messages "
                f"(add_generation_prompt={generation_prompt}) is not a prefix of rendering them all, so the assistant "
                f"turns cannot be located (the template renders earlier turns differently depending on later ones)"
            )
        if len(prefix) < cuts[-1]:
            raise DataError(f"chat template problem: renderings of growing prefixes shrink at message {k}")
        if len(prefix) > cuts[-1]:
            cuts.append(len(prefix))
            labels.append(label)
        elif label == 1:  # an empty assistant rendering
            raise DataError(f"chat template problem: the assistant turn at message {k - 1} renders as nothing")

    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            cut(index, True, 0)  # prompt up to the generation prompt
            cut(index + 1, False, 1)  # the response and what closes it
    if cuts[-1] < len(text):
        cuts.append(len(text))
        labels.append(0)
    return text, cuts, labels


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _token_cuts(tokenizer, text: str, cuts: list[int], labels: list[int]) -> tuple[list[int], list[int], str]:
    """``(ids, token_cuts, method)``: ``tokenizer.encode(text, add_special_tokens=False)`` and the token index of
    every character cut (see the module docstring); ``method`` is ``"segments"`` or ``"prefixes"``."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.encode(text[a:b], add_special_tokens=False) for a, b in zip(cuts, cuts[1:])]
    if [t for piece in pieces for t in piece] == ids:
        out = [0]
        for piece in pieces:
            out.append(out[-1] + len(piece))
        return ids, out, "segments"
    out = [0]
    for i, position in enumerate(cuts[1:-1], start=1):
        before = tokenizer.encode(text[:position], add_special_tokens=False)
        common = _common_prefix(before, ids)
        if common < len(before):  # a token straddles the cut: it goes to the assistant side
            common = common + 1 if labels[i - 1] == 1 else common
        out.append(min(max(common, out[-1]), len(ids)))
    out.append(len(ids))
    return ids, out, "prefixes"


def _special_affixes(tokenizer, text: str, core: list[int]) -> tuple[list[int], list[int]]:
    """Tokens the tokenizer adds around ``core`` (the ids of ``text`` without special tokens): BOS, EOS..."""
    full = tokenizer.encode(text, add_special_tokens=True)
    extra = len(full) - len(core)
    for start in range(extra + 1) if extra >= 0 else ():
        if full[start : start + len(core)] == core:
            return full[:start], full[start + len(core) :]
    raise DataError(
        f"tokenizer {getattr(tokenizer, 'path', tokenizer)} changes the ids of a text when adding special tokens; "
        "cannot locate them"
    )


def _example(messages, tokenizer, chat_template, variables) -> tuple[list[int], list[int], str]:
    renderer = _with_template(tokenizer, chat_template)
    text, cuts, labels = _segments(renderer, messages, variables)
    ids, token_cuts, method = _token_cuts(tokenizer, text, cuts, labels)
    mask = [0] * len(ids)
    for label, a, b in zip(labels, token_cuts, token_cuts[1:]):
        if label:
            mask[a:b] = [1] * (b - a)
    bos = tokenizer.bos_token
    if not (bos and text.startswith(bos)):
        # The template has no BOS text: tokenize as the tokenizer does by default. A BOS it adds is prompt; an EOS it
        # appends closes the last turn and takes its label.
        head, tail = _special_affixes(tokenizer, text, ids)
        ids = head + ids + tail
        mask = [0] * len(head) + mask + [labels[-1]] * len(tail)
    return ids, mask, method


def build_example(
    messages: Sequence[dict], tokenizer, chat_template: str | None = None, **template_vars: Any
) -> tuple[list[int], list[int]]:
    """``(tokens, loss_mask)`` of a conversation; ``loss_mask[i] == 1`` only for tokens of assistant turns as the
    template renders them (response text and the end-of-turn / EOS tokens that close it), 0 for system and user turns,
    role headers and generation prompts.

    The template is ``chat_template``, else the tokenizer's, else :data:`DEFAULT_CHAT_TEMPLATE`; ``template_vars``
    become template variables. The tokens are those of the full rendering tokenized in one go: with
    ``add_special_tokens=False`` when the rendering starts with the BOS text, else as the tokenizer does by default
    (a BOS it adds has mask 0). Raises DataError when the conversation has no assistant turn, starts with one, or
    the template renders a conversation's prefix as something that is not a prefix of the whole rendering.
    See the module docstring for how token boundaries are found.
    """
    ids, mask, _ = _example(messages, tokenizer, chat_template, template_vars)
    return ids, mask


# --------------------------------------------------------------------------------------------------------------
# Packing and padding
# --------------------------------------------------------------------------------------------------------------
@dataclass
class PackedSequence:
    """One packed sequence: ``tokens`` (int64) and ``loss_mask`` (uint8) of exactly ``seq_length`` items;
    ``boundaries``: the lengths of the records inside it in order, then the padding (``padding`` tokens of ``pad_id``,
    mask 0) if any, summing to ``seq_length``."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    boundaries: list[int]
    padding: int = 0

    @property
    def num_records(self) -> int:
        """Records in the pack (``boundaries`` less the padding segment)."""
        return len(self.boundaries) - (1 if self.padding else 0)


@dataclass
class PackStats:
    """Counts of a :func:`pack` run (updated while it yields): ``records`` read, ``packs`` yielded, ``truncated``
    records (longer than ``seq_length``), ``tokens`` of records kept (after truncation), ``padding`` tokens and
    ``masked_tokens`` (loss_mask 1, the tokens trained on)."""

    records: int = 0
    packs: int = 0
    truncated: int = 0
    tokens: int = 0
    padding: int = 0
    masked_tokens: int = 0
    truncated_where: list[int] = field(default_factory=list)  # input indices of truncated records (first 100)


def _arrays(tokens, loss_mask, index: int | str) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.asarray(tokens, dtype=TOKEN_DTYPE).reshape(-1)
    mask = np.asarray(loss_mask).reshape(-1)
    if tokens.shape != mask.shape:
        raise DataError(f"example {index}: {tokens.size} tokens but a loss mask of {mask.size}")
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise DataError(f"example {index}: the loss mask must hold only 0 and 1")
    return tokens, mask.astype(MASK_DTYPE)


def pack(
    examples: Iterable[tuple[Sequence[int], Sequence[int]]],
    seq_length: int,
    pad_id: int,
    stats: PackStats | None = None,
) -> Iterator[PackedSequence]:
    """Greedily pack ``(tokens, loss_mask)`` examples, in input order, into sequences of exactly ``seq_length``.

    A record goes into the current pack if it fits, else the pack is padded (``pad_id``, mask 0) and yielded and a
    new one starts; records are never split or reordered. A record longer than ``seq_length`` is truncated to it
    (mask too), counted in ``stats.truncated``, and fills a pack alone. Empty records are an error. Deterministic.
    """
    if not isinstance(seq_length, int) or seq_length < 1:
        raise DataError(f"seq_length must be a positive integer, got {seq_length!r}")
    if pad_id is None:
        raise DataError("pad_id is None: pass the tokenizer's pad id (or its EOS id when it has none)")
    stats = stats if stats is not None else PackStats()
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    used = 0

    def flush() -> PackedSequence:
        nonlocal parts, used
        padding = seq_length - used
        tokens = np.full(seq_length, pad_id, dtype=TOKEN_DTYPE)
        mask = np.zeros(seq_length, dtype=MASK_DTYPE)
        offset, boundaries = 0, []
        for t, m in parts:
            tokens[offset : offset + t.size], mask[offset : offset + t.size] = t, m
            offset += t.size
            boundaries.append(int(t.size))
        if padding:
            boundaries.append(padding)
        stats.packs += 1
        stats.padding += padding
        parts, used = [], 0
        return PackedSequence(tokens, mask, boundaries, padding)

    for index, example in enumerate(examples):
        tokens, mask = _arrays(*example, index=index)
        if tokens.size == 0:
            raise DataError(f"example {index} is empty")
        stats.records += 1
        if tokens.size > seq_length:
            tokens, mask = tokens[:seq_length], mask[:seq_length]
            stats.truncated += 1
            if len(stats.truncated_where) < 100:
                stats.truncated_where.append(index)
        if used + tokens.size > seq_length:
            yield flush()
        parts.append((tokens, mask))
        used += tokens.size
        stats.tokens += int(tokens.size)
        stats.masked_tokens += int(mask.sum())
        if used == seq_length:
            yield flush()
    if parts:
        yield flush()


def pad_to_multiple(
    tokens: Sequence[int], loss_mask: Sequence[int], multiple: int = 128, pad_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, loss_mask)`` as int64 / uint8 arrays padded with ``pad_id`` (mask 0) up to the next multiple of
    ``multiple`` (unpacked SFT; 128 as the PAI recipe's ``pad_length``). ``pad_id`` is required."""
    if not isinstance(multiple, int) or multiple < 1:
        raise DataError(f"multiple must be a positive integer, got {multiple!r}")
    if pad_id is None:
        raise DataError("pad_id is None: pass the tokenizer's pad id (or its EOS id when it has none)")
    tokens, mask = _arrays(tokens, loss_mask, index="to pad")
    padding = -tokens.size % multiple
    if padding:
        tokens = np.concatenate([tokens, np.full(padding, pad_id, dtype=TOKEN_DTYPE)])
        mask = np.concatenate([mask, np.zeros(padding, dtype=MASK_DTYPE)])
    return tokens, mask
