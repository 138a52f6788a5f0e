"""A toy DeepSeek-style tokenizer (byte-level BPE, ``<｜begin▁of▁sentence｜>`` first on every text) for the
test presets; its ids are below their vocabularies."""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

write_deepseek_tokenizer = ByteLevelBPE(
    special_tokens=(BOS, EOS),  # ids 0 and 1, as DeepSeek-V3's
    prefix=(BOS,),
    pre_tokenizers=("digits", "byte_level"),
    vocab_size=400,
    corpus=(*SAMPLE_TEXT, "DeepSeek-V3 is a mixture-of-experts language model.\n"),
    config={"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
            "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": 16384},
)
