"""A small Baichuan-style SentencePiece tokenizer for tests, trained locally (no download).

BPE with byte fallback and split digits, identity normalization, ``<unk>``/``<s>``/``</s>`` = 0/1/2, no
BOS/EOS added on encode (as Baichuan's tokenizer_config.json says). Real checkpoints name their own
remote-code class (``BaichuanTokenizer``); its encoding is SentencePiece's, so the test files name
``LlamaTokenizer``, which transformers loads without remote code. It checks the wiring, not Baichuan's
real 64000/125696-piece vocabulary.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "Baichuan is a large language model trained on 2.6 trillion tokens in 2023.",
    "百川大模型。你好，世界。人工智能正在改变世界。日本語のテキスト。",
    "def main():\n    return 42\n\n\tindented\twith tabs",
    "Numbers 1234567890 and symbols !@#$%^&*() stay byte-exact.",
]


def write_test_tokenizer(folder: str | Path, vocab_size: int = 600) -> None:
    """Write ``tokenizer.model`` and ``tokenizer_config.json`` into ``folder`` (created if needed)."""
    import sentencepiece as spm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 20), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": None, "add_bos_token": False, "add_eos_token": False, "legacy": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 4096,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
