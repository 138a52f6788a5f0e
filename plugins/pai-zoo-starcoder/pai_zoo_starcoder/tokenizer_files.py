"""Small StarCoder-style tokenizers for tests, trained locally (no download).

StarCoder and StarCoder2 ship a byte-level BPE ``tokenizer.json`` (49152 tokens) whose pre-tokenizer splits every
digit on its own before GPT-2's byte-level regex, with their special tokens at ids 0, 1, 2 ...
(``<|endoftext|>``, ``<fim_prefix>``, ...) and ``tokenizer_class: GPT2Tokenizer``. These files are built the same
way with a vocabulary of a few hundred tokens. Imports ``tokenizers`` inside the function, no torch.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SPECIAL_TOKENS", "write_test_tokenizer"]

_FIM = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]
_JUPYTER = ["<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>"]

#: The special tokens, in id order from 0, as bigcode/starcoder and bigcode/starcoder2-* number them.
SPECIAL_TOKENS = {
    "starcoder": [
        "<|endoftext|>", *_FIM, "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
        *_JUPYTER, "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>", "<reponame>",
    ],
    "starcoder2": [
        "<|endoftext|>", *_FIM, "<repo_name>", "<file_sep>", "<issue_start>", "<issue_comment>", "<issue_closed>",
        *_JUPYTER, "<jupyter_script>", "<empty_output>", "<code_to_intermediate>", "<intermediate_to_code>", "<pr>",
        "<pr_status>", "<pr_is_merged>", "<pr_base>", "<pr_file>", "<pr_base_code>", "<pr_diff>", "<pr_diff_hunk>",
        "<pr_comment>", "<pr_event_id>", "<pr_review>", "<pr_review_state>", "<pr_review_comment>",
        "<pr_in_reply_to_review_id>", "<pr_in_reply_to_comment_id>", "<pr_diff_hunk_comment_line>", "<NAME>",
        "<EMAIL>", "<KEY>", "<PASSWORD>",
    ],
}

_CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 100; ++i) {\n\tprintf(\"%d\\n\", i);\n}\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # 12 zeros\n",
    "The quick brown fox jumps over the lazy dog. Hello, world!\n",
    "class Indented:\n    \"\"\"A docstring.\"\"\"\n\n    def method(self, value):\n        return value * 2\n",
    "你好，世界。日本語のテキスト🙂🚀 end\n",
]


def write_test_tokenizer(folder: str | Path, family: str = "starcoder", vocab_size: int = 600) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` of a small StarCoder(2)-style byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIAL_TOKENS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "additional_special_tokens": specials,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 8192 if family == "starcoder" else 16384,
    }
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
