"""A small BLOOM-style tokenizer for tests, trained locally with ``tokenizers`` (no download).

Byte-level BPE with BLOOM's special tokens at BLOOM's ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2,
``<pad>`` 3) and, like BLOOM's tokenizer, no BOS/EOS added on encode. It checks the wiring, not
BLOOM's real 250880-token vocabulary.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "BigScience Large Open-science Open-access Multilingual Language Model.",
    "Le renard brun saute par-dessus le chien paresseux. ¿Dónde está la biblioteca?",
    "你好，世界。大型语言模型。日本語のテキスト。",
    "def main():\n    return 42\n\n\tindented\twith tabs",
]


def write_test_tokenizer(folder: str | Path, vocab_size: int = 600) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (created if needed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "BloomTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "padding_side": "left", "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
