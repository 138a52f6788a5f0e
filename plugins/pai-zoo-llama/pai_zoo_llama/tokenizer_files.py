"""Llama tokenizers written from files installed locally (no download): a real Llama-2-style one and a toy.

``write_test_tokenizer`` writes a real one: Mistral-7B-v0.1's ``tokenizer.model``, shipped inside the PyPI package
``mistral-common`` as ``mistral_common/data/tokenizer.model.v1``: a 32000-piece BPE model built like Llama-2's
(``<unk>``/``<s>``/``</s>`` = 0/1/2, 256 byte-fallback pieces, identity normalization, dummy prefix, whitespace-only
pieces ``"▁▁"``... scored -1e9). It is the family's ``published_tokenizer``, for the ``mistral-7b`` preset only
(Llama-2's own 32000 pieces are different ones).

``write_toy_tokenizer`` trains a few-hundred-piece SentencePiece BPE of the same make (same special ids, byte
fallback, whitespace-only pieces, the same ``tokenizer_config.json``): the family's ``test_tokenizer``, whose
ids fit the tiny presets' 1000-token vocabularies. This module imports neither torch nor transformers.
"""
from __future__ import annotations

import importlib.resources
import importlib.util
import json
import shutil
from pathlib import Path

from pai_zoo.testing.tokenizers import SAMPLE_TEXT, SentencePieceBPE

__all__ = ["LLAMA2_CHAT_TEMPLATE", "llama2_tokenizer_config", "spm_model_path", "write_test_tokenizer",
           "write_toy_tokenizer"]

_PACKAGE = "mistral-common"
_MODEL_RESOURCE = "data/tokenizer.model.v1"

#: Llama-2-chat's chat template, as in meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json.
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)


def spm_model_path() -> Path:
    """Path of the Llama-2-style SentencePiece model inside the installed ``mistral-common`` package."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None:
        raise ModuleNotFoundError(
            f"write_test_tokenizer needs the '{_PACKAGE}' package for its Llama-2-style tokenizer.model: "
            f"pip install {_PACKAGE}"
        )
    # Located from the import spec, so mistral_common itself is not imported.
    locations = list(spec.submodule_search_locations or [])
    if locations:
        path = Path(locations[0], *_MODEL_RESOURCE.split("/"))
    else:  # an unusual loader (zip import): let importlib.resources find it
        path = Path(str(importlib.resources.files("mistral_common").joinpath(_MODEL_RESOURCE)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this '{_PACKAGE}' version does not ship {_MODEL_RESOURCE}")
    return path


def llama2_tokenizer_config() -> dict:
    """A Llama-2(-chat) ``tokenizer_config.json``."""
    return {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        # legacy=false is what meta-llama/Llama-2-*-hf's tokenizer_config.json says. It only matters for text that
        # follows a special token inside the string ("...</s>next"): with legacy=false, transformers' LlamaTokenizer
        # and pai_zoo's SentencePieceTokenizer both add no "▁" to that text; with true, both add one. Either value
        # keeps the two in agreement; false matches the real checkpoints.
        "legacy": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": LLAMA2_CHAT_TEMPLATE,
    }


def write_test_tokenizer(folder: str | Path) -> None:
    """Write a real Llama-2-style tokenizer into ``folder`` (created if needed): ``tokenizer.model`` (32000
    SentencePiece pieces, from ``mistral-common``) and ``tokenizer_config.json`` (LlamaTokenizer, BOS added,
    Llama-2-chat template)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spm_model_path(), folder / "tokenizer.model")
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(llama2_tokenizer_config(), handle, indent=2, ensure_ascii=False)
        handle.write("\n")


#: ``write_toy_tokenizer(folder)`` writes a 600-piece Llama-2-style ``tokenizer.model`` and ``tokenizer_config.json``.
write_toy_tokenizer = SentencePieceBPE(
    vocab_size=600,
    options={"allow_whitespace_only_pieces": True},
    corpus=(*SAMPLE_TEXT, "Llama is a family of large language models released by Meta AI in 2023.",
            "[INST] <<SYS>> You are a helpful assistant. <</SYS>> Hello! [/INST] Hi, how can I help?"),
    config=llama2_tokenizer_config(),
)
