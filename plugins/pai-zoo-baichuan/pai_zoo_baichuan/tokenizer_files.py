"""A small Baichuan-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.SentencePieceBPE`).

SentencePiece BPE with byte fallback and split digits, identity normalization, ``<unk>``/``<s>``/``</s>`` = 0/1/2,
no BOS/EOS added on encode (as Baichuan's tokenizer_config.json says). Real checkpoints name their own
remote-code class (``BaichuanTokenizer``); its encoding is SentencePiece's, so the test files name
``LlamaTokenizer``, which transformers loads without remote code. It checks the wiring, not Baichuan's real
64000/125696-piece vocabulary.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, SentencePieceBPE

__all__ = ["write_test_tokenizer"]

#: ``write_test_tokenizer(folder)`` writes ``tokenizer.model`` and ``tokenizer_config.json``.
write_test_tokenizer = SentencePieceBPE(
    vocab_size=600,
    options={"allow_whitespace_only_pieces": True},
    corpus=(*SAMPLE_TEXT, "Baichuan is a large language model trained on 2.6 trillion tokens in 2023.",
            "百川大模型。你好，世界。"),
    config={
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": None, "add_bos_token": False, "add_eos_token": False, "legacy": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 4096,
    },
)
