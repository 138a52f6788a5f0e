"""A small OLMo-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

OLMo-2 and OLMo-3 ship the dolma2 tokenizer (``allenai/dolma2-tokenizer``): a byte-level BPE with the cl100k split
pattern, ``<|endoftext|>`` (BOS and EOS) and ``<|pad|>`` after the learnt vocabulary, no BOS added when encoding,
``tokenizer_class: GPT2Tokenizer``. This one is built the same way with a few hundred tokens: ``<|endoftext|>`` is
id 500 and ``<|pad|>`` 501 (:data:`pai_zoo_olmo.presets.TOY_TOKENS`). Its ``tokenizer_class`` is
``PreTrainedTokenizerFast``: transformers 5's ``GPT2Tokenizer`` rebuilds GPT-2's own split pattern rather than
reading the file's.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE
from pai_zoo.tokenizers import CL100K_PAT_STR

__all__ = ["ENDOFTEXT", "PAD", "write_olmo_tokenizer"]

ENDOFTEXT, PAD = "<|endoftext|>", "<|pad|>"

#: ``write_olmo_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
write_olmo_tokenizer = ByteLevelBPE(
    special_tokens=(ENDOFTEXT, PAD),
    specials_first=False,
    added_tokens_in_config=True,
    pre_tokenizers=("split", "byte_level"),
    split_pattern=CL100K_PAT_STR,
    trim_offsets=False,
    corpus=(*SAMPLE_TEXT, "OLMo is a fully open language model trained on Dolma.\n"),
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "pad_token": PAD,
        "unk_token": ENDOFTEXT, "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    },
)
