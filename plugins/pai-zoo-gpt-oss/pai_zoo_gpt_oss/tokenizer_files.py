"""gpt-oss's test tokenizer: a byte-level BPE ``tokenizer.json`` (the real one is o200k_harmony, tiktoken-derived),
special tokens numbered after the learnt vocabulary as there (:mod:`pai_zoo.testing.tokenizers` data)."""
from __future__ import annotations

from pai_zoo.testing.tokenizers import ByteLevelBPE

STARTOFTEXT, ENDOFTEXT, RETURN = "<|startoftext|>", "<|endoftext|>", "<|return|>"
#: Ids of the special tokens in the test tokenizer (400 learnt pieces, then these).
TOKEN_IDS = {STARTOFTEXT: 400, ENDOFTEXT: 401, RETURN: 402}

write_gpt_oss_tokenizer = ByteLevelBPE(
    special_tokens=(STARTOFTEXT, ENDOFTEXT, RETURN),
    specials_first=False,
    added_tokens_in_config=True,
    vocab_size=400,
    repeat=4,
    config={
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": STARTOFTEXT, "eos_token": RETURN,
        "pad_token": ENDOFTEXT, "clean_up_tokenization_spaces": False, "model_max_length": 131072,
    },
)
