"""A small Gemma-style test tokenizer (data for :class:`pai_zoo.testing.tokenizers.SentencePieceBPE`).

Gemma's ``tokenizer.model`` is a SentencePiece BPE with byte fallback, split digits, no dummy prefix and the
special pieces ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3 first; its ``tokenizer_config.json`` names
``GemmaTokenizer`` and adds ``<bos>`` on encode. This one has 500 pieces with the same four ids.
"""
from __future__ import annotations

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, SentencePieceBPE

__all__ = ["GEMMA_CHAT_TEMPLATE", "write_gemma_tokenizer"]

#: Gemma's instruction-tuned chat template (turns between ``<start_of_turn>`` and ``<end_of_turn>``; no system
#: role), shortened; the toy vocabulary spells the turn markers out.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

#: ``write_gemma_tokenizer(folder)`` writes ``tokenizer.model`` and ``tokenizer_config.json``.
write_gemma_tokenizer = SentencePieceBPE(
    options={"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3, "pad_piece": "<pad>", "eos_piece": "<eos>",
             "bos_piece": "<bos>", "unk_piece": "<unk>", "add_dummy_prefix": False,
             "allow_whitespace_only_pieces": True},
    corpus=(*SAMPLE_TEXT, "Gemma is a family of lightweight open models from Google DeepMind."),
    config={
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False, "chat_template": GEMMA_CHAT_TEMPLATE,
    },
)
