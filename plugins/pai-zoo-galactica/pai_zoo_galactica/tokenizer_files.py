"""A small Galactica-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

facebook/galactica-* ship a byte-level BPE ``tokenizer.json`` (50000 tokens) that splits every digit on its own,
with ``<s>``, ``<pad>``, ``</s>``, ``<unk>`` at ids 0-3, Galactica's markup tokens (``[START_REF]``, ``<work>``,
``[START_SMILES]`` ...), no BOS added when encoding, and ``tokenizer_class: PreTrainedTokenizerFast``. This one is
built the same way with a few hundred tokens.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

_MARKUP = (
    "[START_REF]", "[END_REF]", "[IMAGE]", "<fragments>", "</fragments>", "<work>", "</work>",
    "[START_SUP]", "[END_SUP]", "[START_SUB]", "[END_SUB]", "[START_DNA]", "[END_DNA]",
    "[START_AMINO]", "[END_AMINO]", "[START_SMILES]", "[END_SMILES]", "[START_I_SMILES]", "[END_I_SMILES]",
)
#: Special tokens in id order from 0: Galactica's four, then its markup tokens.
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", *_MARKUP)

#: ``write_test_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
write_test_tokenizer = ByteLevelBPE(
    special_tokens=SPECIAL_TOKENS,
    pre_tokenizers=("single_digits", "byte_level"),
    trim_offsets=False,
    corpus=(*SAMPLE_TEXT,
            "The Transformer architecture [START_REF] Attention is All you Need, Vaswani [END_REF] is used here.\n",
            "<work>\nCalculate 1234 * 56 = 69104\n</work>\n",
            "Aspirin is [START_SMILES]CC(=O)OC1=CC=CC=C1C(=O)O[END_SMILES].\n"),
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>", "additional_special_tokens": list(_MARKUP), "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    },
)
