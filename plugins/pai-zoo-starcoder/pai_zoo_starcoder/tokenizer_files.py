"""Small StarCoder-style test tokenizers (data for :class:`pai_zoo.testing.tokenizers.ByteLevelBPE`).

StarCoder and StarCoder2 ship a byte-level BPE ``tokenizer.json`` (49152 tokens) whose pre-tokenizer splits every
digit on its own before GPT-2's byte-level regex, with their special tokens at ids 0, 1, 2 ...
(``<|endoftext|>``, ``<fim_prefix>``, ...) and ``tokenizer_class: GPT2Tokenizer``. These are built the same way
with a vocabulary of a few hundred tokens.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, ByteLevelBPE

__all__ = ["SPECIAL_TOKENS", "TEST_TOKENIZERS"]

_FIM = ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>")
_JUPYTER = ("<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>")

#: The special tokens, in id order from 0, as bigcode/starcoder and bigcode/starcoder2-* number them.
SPECIAL_TOKENS = {
    "starcoder": (
        "<|endoftext|>", *_FIM, "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
        *_JUPYTER, "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>", "<reponame>",
    ),
    "starcoder2": (
        "<|endoftext|>", *_FIM, "<repo_name>", "<file_sep>", "<issue_start>", "<issue_comment>", "<issue_closed>",
        *_JUPYTER, "<jupyter_script>", "<empty_output>", "<code_to_intermediate>", "<intermediate_to_code>", "<pr>",
        "<pr_status>", "<pr_is_merged>", "<pr_base>", "<pr_file>", "<pr_base_code>", "<pr_diff>", "<pr_diff_hunk>",
        "<pr_comment>", "<pr_event_id>", "<pr_review>", "<pr_review_state>", "<pr_review_comment>",
        "<pr_in_reply_to_review_id>", "<pr_in_reply_to_comment_id>", "<pr_diff_hunk_comment_line>", "<NAME>",
        "<EMAIL>", "<KEY>", "<PASSWORD>",
    ),
}

_CODE = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 100; ++i) {\n\tprintf(\"%d\\n\", i);\n}\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # 12 zeros\n",
    "class Indented:\n    \"\"\"A docstring.\"\"\"\n\n    def method(self, value):\n        return value * 2\n",
)


def _tokenizer(family: str, model_max_length: int) -> ByteLevelBPE:
    specials = SPECIAL_TOKENS[family]
    return ByteLevelBPE(
        special_tokens=specials,
        pre_tokenizers=("single_digits", "byte_level"),
        trim_offsets=False,
        vocab_size=600,
        corpus=(*SAMPLE_TEXT, *_CODE),
        config={
            "tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "additional_special_tokens": list(specials),
            "clean_up_tokenization_spaces": True, "model_max_length": model_max_length,
        },
    )


#: Per family, a callable that writes ``tokenizer.json`` and ``tokenizer_config.json`` into a folder.
TEST_TOKENIZERS = {"starcoder": _tokenizer("starcoder", 8192), "starcoder2": _tokenizer("starcoder2", 16384)}
