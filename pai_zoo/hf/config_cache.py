"""A config dict with its transformers class's defaults filled in, without importing transformers twice.

:func:`full_config_dict` is ``config_dict(hf_config(family, config))``. Making that imports transformers and torch
(seconds, more than ``info`` and ``inspect`` may take), so the answer is kept in the cache folder
(``$PAI_ZOO_CACHE/configs``), keyed by the family, the config and the versions of pai-zoo, the family's plugin and
transformers: the second ``info NAME`` or ``inspect FOLDER`` of the same config imports neither.
"""
from __future__ import annotations

import copy
import hashlib
import json
from importlib import metadata
from typing import Any, Mapping

from ..families.family import Family
from ..families.registry import get_registry
from ..util.cache import cache_dir
from ..util.files import write_text_atomic
from .models import config_dict, hf_config


def full_config_dict(family: Family, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as its transformers config class writes it (``config_dict(hf_config(family, config))``), from the
    cache when it holds it; ``config`` is left as it is."""
    plugin = get_registry().plugins.get(family.plugin)
    key = json.dumps([family.name, config, _version("pai-zoo"), plugin and plugin.version, _version("transformers")],
                     sort_keys=True, default=str)
    path = cache_dir() / "configs" / f"{family.name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    try:
        cached = _int_labels(json.loads(path.read_text(encoding="utf-8")))
        if isinstance(cached, dict):
            return cached
    except (OSError, ValueError, AttributeError):
        pass
    full = config_dict(hf_config(family, copy.deepcopy(dict(config))))  # transformers may change nested dicts
    try:
        if _int_labels(json.loads(json.dumps(full))) == full:  # only what JSON keeps as it is
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(full, sort_keys=True))
    except (OSError, TypeError, ValueError):  # a read-only cache folder: the answer is the same, only slower
        pass
    return full


def _int_labels(config):
    """``id2label``'s keys as the ints transformers makes of them (JSON keeps them as strings), also in nested
    configs (a vision-language model's ``text_config`` and ``vision_config``)."""
    if isinstance(config, dict):
        for key, value in config.items():
            config[key] = ({int(k): v for k, v in value.items()} if key == "id2label" and isinstance(value, dict)
                           else _int_labels(value))
    return config


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
