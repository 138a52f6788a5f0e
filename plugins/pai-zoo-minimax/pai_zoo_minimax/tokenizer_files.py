"""A toy MiniMax-M2-style tokenizer for the test presets: a byte-level BPE ``tokenizer.json`` with MiniMax's
special tokens first (``]~!b[`` 0, ``[e~[`` 1, ``]!d~[`` 2, ``]!p~[`` 3), no BOS added, as its chat template adds
what it needs."""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

BOS, EOS, UNK, PAD = "]~!b[", "[e~[", "]!d~[", "]!p~["

write_minimax_tokenizer = ByteLevelBPE(
    special_tokens=(BOS, EOS, UNK, PAD),
    pre_tokenizers=("digits", "byte_level"),
    vocab_size=450,
    corpus=(*SAMPLE_TEXT, "MiniMax-M2 is a mixture-of-experts model for coding and agents.\n"),
    config={"tokenizer_class": "GPT2Tokenizer", "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": 196608},
)
