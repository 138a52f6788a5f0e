"""A generated toy corpus and a tokenizer trained on it in seconds: the built-in data of
``make demo`` and of tests that need text a tiny model can learn (no download)."""
from __future__ import annotations

import json
import random
from pathlib import Path

from ..testing.tokenizers import ByteLevelBPE

SUBJECTS = ("the cat", "a dog", "the bird", "my friend", "the old man", "a child", "the teacher", "our neighbour")
VERBS = ("sees", "likes", "follows", "finds", "paints", "visits", "helps", "calls")
OBJECTS = ("the red ball", "a small house", "the green tree", "the river", "a blue boat", "the quiet garden",
           "a yellow kite", "the tall tower")
ENDINGS = ("every morning", "after lunch", "in the rain", "at night", "near the sea", "on sunday")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML, the template the toy tokenizer carries (``--chat`` and SFT use it).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` simple English sentences from a small grammar (learnable by a tiny model)."""
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}."
            for _ in range(n)]


def write_corpus(path, documents: int = 400, seed: int = 0) -> Path:
    """JSON Lines of ``{"text": ...}`` documents of 3-8 sentences each."""
    rng = random.Random(seed)
    path = Path(path)
    with open(path, "w") as f:
        for i in range(documents):
            f.write(json.dumps({"text": " ".join(sentences(rng.randint(3, 8), seed * 100003 + i))}) + "\n")
    return path


def write_tokenizer(folder, vocab_size: int = 400, seed: int = 0) -> Path:
    """A byte-level BPE ``tokenizer.json`` (+ ``tokenizer_config.json`` with ChatML) trained on the
    toy grammar, in ``folder``; the special tokens get ids 0, 1, 2."""

    return ByteLevelBPE(
        corpus=sentences(3000, seed), repeat=1, vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        config={"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>", "chat_template": CHATML},
    )(folder)
