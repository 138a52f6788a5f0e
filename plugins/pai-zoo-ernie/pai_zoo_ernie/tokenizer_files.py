"""A toy ERNIE-4.5-style tokenizer for the test presets: a SentencePiece BPE ``tokenizer.model`` with ERNIE's
ids (``<unk>`` 0, also the padding, ``<s>`` 1, ``</s>`` 2), BOS not added. transformers reads ERNIE-4.5 folders
with its ``TokenizersBackend`` (the hub's ``tokenizer_class`` names a remote-code class), as it reads this one."""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, SentencePieceBPE

write_ernie_tokenizer = SentencePieceBPE(
    vocab_size=500,
    options={"allow_whitespace_only_pieces": True},
    corpus=(*SAMPLE_TEXT, "ERNIE 4.5 is a family of large language models from Baidu.\n",
            "文心大模型是百度研发的产业级知识增强大模型。\n"),
    config={"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "pad_token": "<unk>", "add_bos_token": False, "add_eos_token": False, "legacy": False,
            "clean_up_tokenization_spaces": False, "model_max_length": 131072},
)
