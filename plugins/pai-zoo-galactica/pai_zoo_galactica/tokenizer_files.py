"""A small Galactica-style tokenizer for tests, trained locally (no download).

facebook/galactica-* ship a byte-level BPE ``tokenizer.json`` (50000 tokens) that splits every digit
on its own, with ``<s>``, ``<pad>``, ``</s>``, ``<unk>`` at ids 0-3, Galactica's markup tokens
(``[START_REF]``, ``<work>``, ``[START_SMILES]`` ...), no BOS added when encoding, and
``tokenizer_class: PreTrainedTokenizerFast``. This one is built the same way with a few hundred
tokens. Imports ``tokenizers`` inside the function, no torch.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

_MARKUP = [
    "[START_REF]", "[END_REF]", "[IMAGE]", "<fragments>", "</fragments>", "<work>", "</work>",
    "[START_SUP]", "[END_SUP]", "[START_SUB]", "[END_SUB]", "[START_DNA]", "[END_DNA]",
    "[START_AMINO]", "[END_AMINO]", "[START_SMILES]", "[END_SMILES]", "[START_I_SMILES]", "[END_I_SMILES]",
]
#: Special tokens in id order from 0: Galactica's four, then its markup tokens.
SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", *_MARKUP]

_CORPUS = [
    "The Transformer architecture [START_REF] Attention is All you Need, Vaswani [END_REF] is used here.\n",
    "<work>\nCalculate 1234 * 56 = 69104\n</work>\n",
    "Aspirin is [START_SMILES]CC(=O)OC1=CC=CC=C1C(=O)O[END_SMILES].\n\n  Indented\tline\n",
    "The quick brown fox jumps over the lazy dog. Hello, world!\n",
    "你好，世界。日本語のテキスト🙂🚀 end\n",
]


def write_test_tokenizer(folder: str | Path, vocab_size: int = 500) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of a small Galactica-style byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "additional_special_tokens": _MARKUP,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
