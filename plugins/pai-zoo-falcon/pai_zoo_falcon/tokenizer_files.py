"""A small Falcon-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

tiiuae/falcon-* ship a byte-level BPE ``tokenizer.json`` (65024 tokens) with the special tokens ``>>TITLE<<`` ...
``>>MIDDLE<<`` at ids 0-10 and ``<|endoftext|>`` (BOS = EOS) at 11, punctuation split off before GPT-2's regex
and digit runs after it, no BOS added when encoding, and ``tokenizer_class: PreTrainedTokenizerFast``. This one
is built the same way with a few hundred tokens.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

#: Falcon's special tokens, in id order from 0.
SPECIAL_TOKENS = (
    ">>TITLE<<", ">>ABSTRACT<<", ">>INTRODUCTION<<", ">>SUMMARY<<", ">>COMMENT<<", ">>ANSWER<<",
    ">>QUESTION<<", ">>DOMAIN<<", ">>PREFIX<<", ">>SUFFIX<<", ">>MIDDLE<<", "<|endoftext|>",
)

#: ``write_test_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
write_test_tokenizer = ByteLevelBPE(
    special_tokens=SPECIAL_TOKENS,
    pre_tokenizers=("punctuation", "byte_level", "digits"),
    trim_offsets=True,
    corpus=(*SAMPLE_TEXT, "Falcon is a family of causal decoder-only models trained on RefinedWeb.\n",
            "User: What is 12 + 30?\nFalcon: 12 + 30 = 42.\n"),
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": False, "eos_token": "<|endoftext|>",
        "model_input_names": ["input_ids", "attention_mask"], "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    },
)
