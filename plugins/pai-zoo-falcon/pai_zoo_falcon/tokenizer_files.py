"""A small Falcon-style tokenizer for tests, trained locally (no download).

tiiuae/falcon-* ship a byte-level BPE ``tokenizer.json`` (65024 tokens) with the special tokens
``>>TITLE<<`` ... ``>>MIDDLE<<`` at ids 0-10 and ``<|endoftext|>`` (BOS = EOS) at 11, no BOS added
when encoding, and ``tokenizer_class: PreTrainedTokenizerFast``. This one is built the same way with
a few hundred tokens. Imports ``tokenizers`` inside the function, no torch.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

#: Falcon's special tokens, in id order from 0.
SPECIAL_TOKENS = [
    ">>TITLE<<", ">>ABSTRACT<<", ">>INTRODUCTION<<", ">>SUMMARY<<", ">>COMMENT<<", ">>ANSWER<<",
    ">>QUESTION<<", ">>DOMAIN<<", ">>PREFIX<<", ">>SUFFIX<<", ">>MIDDLE<<", "<|endoftext|>",
]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!\n",
    "Falcon is a family of causal decoder-only models trained on RefinedWeb.\n\n  Indented\tline\n",
    "User: What is 12 + 30?\nFalcon: 12 + 30 = 42.\n",
    "你好，世界。日本語のテキスト🙂🚀 end\n",
]


def write_test_tokenizer(folder: str | Path, vocab_size: int = 500) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of a small Falcon-style byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Punctuation("contiguous"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
         pre_tokenizers.Digits(individual_digits=False)]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "eos_token": "<|endoftext|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
