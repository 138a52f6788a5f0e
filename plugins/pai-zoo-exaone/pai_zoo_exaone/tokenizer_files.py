"""A small EXAONE-4-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

EXAONE 4.0 ships a byte-level BPE (``GPT2Tokenizer``) whose special tokens come first (``[PAD]`` 0, ``[BOS]`` 1,
``[EOS]`` 2, ``[UNK]`` 3), with ``[|endofturn|]`` (id 361) as the models' EOS and no BOS added on encode. This one is
built the same way with a few hundred tokens and ``[|endofturn|]`` as id 4 (:data:`pai_zoo_exaone.presets.TOY_TOKENS`).
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

__all__ = ["ENDOFTURN", "write_exaone_tokenizer"]

PAD, BOS, EOS, UNK, ENDOFTURN = "[PAD]", "[BOS]", "[EOS]", "[UNK]", "[|endofturn|]"

#: ``write_exaone_tokenizer(folder)`` writes ``tokenizer.json`` and ``tokenizer_config.json``.
write_exaone_tokenizer = ByteLevelBPE(
    special_tokens=(PAD, BOS, EOS, UNK, ENDOFTURN),
    vocab_size=480,
    corpus=(*SAMPLE_TEXT, "EXAONE 4.0 unifies a non-reasoning mode and a reasoning mode.\n"),
    config={"tokenizer_class": "GPT2Tokenizer", "bos_token": BOS, "eos_token": ENDOFTURN, "pad_token": PAD,
            "unk_token": UNK, "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": 131072},
)
