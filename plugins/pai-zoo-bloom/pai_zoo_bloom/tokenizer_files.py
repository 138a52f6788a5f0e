"""A small BLOOM-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

Byte-level BPE with BLOOM's special tokens at BLOOM's ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3) and,
like BLOOM's tokenizer, no BOS/EOS added on encode. It checks the wiring, not BLOOM's real 250880-token vocabulary.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")

#: ``write_test_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
write_test_tokenizer = ByteLevelBPE(
    special_tokens=SPECIAL_TOKENS,
    unk_token="<unk>",
    vocab_size=600,
    corpus=(*SAMPLE_TEXT, "BigScience Large Open-science Open-access Multilingual Language Model.",
            "Le renard brun saute par-dessus le chien paresseux. ¿Dónde está la biblioteca?"),
    config={
        "tokenizer_class": "BloomTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "padding_side": "left", "clean_up_tokenization_spaces": False,
    },
)
