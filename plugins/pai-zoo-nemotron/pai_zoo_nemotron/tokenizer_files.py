"""A toy Nemotron-H-style tokenizer for the test presets: a byte-level BPE ``tokenizer.json`` with ``<unk>`` 0, ``<s>``
1 and ``</s>`` 2 first (the config's pad, BOS and EOS ids), no BOS added."""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

UNK, BOS, EOS = "<unk>", "<s>", "</s>"

write_nemotron_tokenizer = ByteLevelBPE(
    special_tokens=(UNK, BOS, EOS),
    pre_tokenizers=("digits", "byte_level"),
    vocab_size=450,
    corpus=(*SAMPLE_TEXT, "Nemotron-H interleaves Mamba-2 layers with attention and MLP layers.\n"),
    config={"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
            "pad_token": UNK, "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": 8192},
)
