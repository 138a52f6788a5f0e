"""The material of a small training run for tests: a tiny Hugging Face model with the toy tokenizer
(:mod:`pai_zoo.data.toy`), and a toy corpus preprocessed to Megatron's indexed format beside it."""
from __future__ import annotations

from pathlib import Path

__all__ = ["write_toy_model_and_data"]


def write_toy_model_and_data(root, preset: str = "llama3-tiny", documents: int = 150, seed: int = 3,
                             **overrides) -> Path:
    """Write ``root/hf`` (``preset`` as a transformers model, ``seed`` and config ``overrides``; ``vocab_size`` 300
    unless overridden, the toy tokenizer's) and ``root/toy_text_document.{bin,idx}`` (``documents`` toy documents,
    each ending in EOD); returns ``root``."""
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess
    from pai_zoo.models.handle import load

    root = Path(root)
    overrides.setdefault("vocab_size", 300)
    toy.write_tokenizer(root / "hf", vocab_size=300)
    load(preset, backend="hf", seed=seed, **overrides).model.save_pretrained(root / "hf")
    corpus = toy.write_corpus(root / "corpus.jsonl", documents=documents)
    preprocess([corpus], root / "toy", str(root / "hf"), append_eod=True, progress=False)
    return root
