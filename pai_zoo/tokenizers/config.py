"""``tokenizer_config.json`` and friends, read as transformers 5 reads them: special tokens, added tokens and the
chat template of a tokenizer folder. Shared by every adapter; imports no third-party package."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..plugin.errors import TokenizerError
from ..util.json_errors import json_error_text

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: Named special tokens, in the order transformers registers them.
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: transformers classes whose __init__ rebuilds the Llama SentencePiece-BPE pipeline (see hf.py).
LLAMA_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast"})
SPIECE = "\u2581"  # "▁", SentencePiece's whitespace symbol


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path}: malformed JSON: {json_error_text(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{path} is not UTF-8 JSON: {exc}") from exc


def token_content(value: Any) -> str | None:
    """A special-token value from a config: a string, a dict with ``content``, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"cannot read a token from {value!r} (expected a string or a dict with 'content')")


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` of ``folder`` merged the way transformers 5 merges it: ``special_tokens_map.json``
    values override it unless the config has ``added_tokens_decoder``; ``chat_template.jinja`` overrides the
    config's template. Missing files give an empty dict."""
    config_path = folder / TOKENIZER_CONFIG
    config = read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise TokenizerError(f"{config_path} must hold a JSON object")
    config = dict(config)
    stm_path = folder / SPECIAL_TOKENS_MAP
    if "added_tokens_decoder" not in config and stm_path.is_file():
        stm = read_json(stm_path)
        if isinstance(stm, dict):
            config.update(stm)
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
        template = named.get("default")
    elif isinstance(template, dict):
        template = template.get("default")
    jinja_path = folder / CHAT_TEMPLATE_FILE
    if jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    config["chat_template"] = template if isinstance(template, str) else None
    return config


def named_special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """``{"bos_token": "<s>", ...}`` for the named special tokens the config sets."""
    out = {}
    for key in NAMED_SPECIAL:
        content = token_content(config.get(key))
        if content is not None:
            out[key] = content
    return out


def extra_special_tokens(config: dict[str, Any]) -> list[Any]:
    """Extra special tokens (``extra_special_tokens``/``additional_special_tokens`` and model-specific
    ``*_token`` keys), as strings or dicts."""
    out: list[Any] = []
    for key in ("extra_special_tokens", "additional_special_tokens"):
        value = config.get(key)
        if isinstance(value, dict):
            out.extend(value.values())
        elif isinstance(value, list):
            out.extend(value)
    for key, value in config.items():
        if key.endswith("_token") and key not in NAMED_SPECIAL and isinstance(value, (str, dict)):
            out.append(value)
    return out


def added_tokens_decoder(config: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``added_tokens_decoder`` of a config as ``[(id, {"content": ..., "special": ...}), ...]`` sorted by id."""
    raw = config.get("added_tokens_decoder") or {}
    if not isinstance(raw, dict):
        raise TokenizerError(f"added_tokens_decoder must be a mapping of id to token, got {type(raw).__name__}")
    out = []
    for index, token in raw.items():
        if isinstance(token, str):
            token = {"content": token, "special": True}
        if not isinstance(token, dict) or "content" not in token:
            raise TokenizerError(f"bad added_tokens_decoder entry {index!r}: {token!r}")
        out.append((int(index), {k: v for k, v in token.items() if k != "__type"}))
    return sorted(out, key=lambda item: item[0])


def pick(explicit: Any, config: dict[str, Any], key: str, default: Any = None) -> Any:
    if explicit is not None:
        return explicit
    value = config.get(key)
    return default if value is None else value

