"""Kimi-K2's tokenizer: a tiktoken rank file ``tiktoken.model`` with Kimi's split pattern and 256 special tokens
numbered from the end of the ranks, as the checkpoint's remote ``tokenization_kimi.py`` builds it, read here
without running that code (:func:`load_kimi_tiktoken`, pai-zoo's tiktoken adapter). ``write_kimi_tokenizer`` writes
a small one of that kind for the test presets.

The pattern and the special tokens' names are as remembered from Kimi-K2's repository (no network where this was
written): Han runs, letter runs split at case changes with English contractions, digits in threes.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, TiktokenBPE

__all__ = ["KIMI_PAT_STR", "KIMI_RANK_FILE", "kimi_special_tokens", "kimi_tiktoken_file", "load_kimi_tiktoken",
           "write_kimi_tokenizer"]

KIMI_RANK_FILE = "tiktoken.model"

#: Kimi-K2's split pattern (tokenization_kimi.py's ``pat_str``).
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

#: The named special tokens by offset from the first special id (163584 in Kimi-K2); the others of the 256 are
#: ``<|reserved_token_{id}|>``.
KIMI_NAMED_SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
    7: "<|end_header_id|>", 9: "[EOT_ID]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]",
}
NUM_SPECIAL = 256
BOS, EOS, PAD, UNK = "[BOS]", "[EOS]", "[PAD]", "[UNK]"


def kimi_special_tokens(first: int, named: dict[int, str] | None = None) -> dict[str, int]:
    """The 256 special tokens numbered from ``first`` (the rank file's size): ``named`` (id -> token, a
    tokenizer_config.json's ``added_tokens_decoder``; default: Kimi-K2's names at their offsets) or
    ``<|reserved_token_{id}|>``."""
    if named is None:
        named = {first + offset: token for offset, token in KIMI_NAMED_SPECIALS.items()}
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(first, first + NUM_SPECIAL)}


def kimi_tiktoken_file(path) -> Path | None:
    """The ``tiktoken.model`` of a folder (or the file itself), else None."""
    path = Path(path)
    if path.is_file():
        return path if path.name == KIMI_RANK_FILE else None
    candidate = path / KIMI_RANK_FILE
    return candidate if candidate.is_file() else None


def load_kimi_tiktoken(path):
    """A :class:`pai_zoo.tokenizers.TiktokenTokenizer` for Kimi's ``tiktoken.model`` (a folder or the file), as
    ``tokenization_kimi.py`` reads it: Kimi's split pattern, the special tokens of ``tokenizer_config.json``'s
    ``added_tokens_decoder`` numbered from the end of the ranks (reserved names for the rest), its BOS/EOS/PAD; no
    BOS added unless the config says so."""
    from pai_zoo.tokenizers import TiktokenTokenizer, read_tiktoken_ranks
    from pai_zoo.tokenizers.config import added_tokens_decoder, read_tokenizer_config

    rank_file = kimi_tiktoken_file(path)
    config = read_tokenizer_config(rank_file.parent)
    named = {int(index): token["content"] for index, token in added_tokens_decoder(config)}
    specials = kimi_special_tokens(len(read_tiktoken_ranks(rank_file)), named or None)
    return TiktokenTokenizer(rank_file, pat_str=KIMI_PAT_STR, special_tokens=specials,
                             add_bos_token=bool(config.get("add_bos_token", False)), name="kimi", config=config)


@dataclasses.dataclass(frozen=True, eq=False)
class _KimiTiktokenBPE(TiktokenBPE):
    """:class:`~pai_zoo.testing.tokenizers.TiktokenBPE` learning its ranks with Python ``regex``'s V1 syntax, in
    which Kimi's ``&&`` class intersections mean what they mean to tiktoken and tokenizers."""

    def train(self):
        return TiktokenBPE.train(dataclasses.replace(self, pattern="(?V1)" + self.pattern))


_RANKS = 400  # the learnt rank file's size: the special tokens are 400 .. 655
_SPECIALS = kimi_special_tokens(_RANKS)

#: ``write_kimi_tokenizer(folder)`` writes ``tiktoken.model`` (400 ranks learnt here with Kimi's pattern), a
#: Kimi-K2-like ``tokenizer_config.json`` (its special tokens as ``added_tokens_decoder``, ``[BOS]`` / ``[EOS]`` /
#: ``[PAD]`` / ``[UNK]``, no BOS added) and, for transformers' side of the conformance check, ``tokenizer.json``
#: converted from the same ranks by transformers' ``TikTokenConverter`` with Kimi's pattern (Kimi's own tokenizer
#: class is remote code): the check compares two engines on one rank file.
write_kimi_tokenizer = _KimiTiktokenBPE(
    pattern=KIMI_PAT_STR,
    file_name=KIMI_RANK_FILE,
    special_tokens=tuple(_SPECIALS),
    corpus=(*SAMPLE_TEXT, "Kimi K2 is a mixture-of-experts model by Moonshot AI.\n", "月之暗面发布了Kimi大模型。\n"),
    vocab_size=_RANKS,
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "unk_token": UNK, "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t, i in _SPECIALS.items()},
    },
)
