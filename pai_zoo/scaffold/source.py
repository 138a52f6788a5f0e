"""Where ``pai-zoo plugin new --from-config`` reads the architecture: an HF checkpoint folder, a ``config.json``,
or a transformers ``model_type`` / causal-LM class name (the config class's defaults)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..formats.hf_folder import CONFIG
from ..plugin.errors import PaiZooError


class ScaffoldError(PaiZooError):
    """``pai-zoo plugin new`` cannot start from what it was given (names the input and the fix)."""


@dataclass
class Source:
    """The architecture a plugin is generated from."""

    model_type: str
    architecture: str  # the transformers causal-LM class name
    given: dict[str, Any]  # the keys the source sets (a config.json's content; {} for a bare type name)
    where: str  # for messages and the generated README
    preset_name: str  # the suffix of the preset made from it ("default" for a type name)


def _causal_lm_names() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _slug(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return out or "config"


def read_source(spec: str) -> Source:
    """``spec``: a folder holding ``config.json``, a JSON file, a transformers ``model_type`` (``helium``) or a
    causal-LM architecture name (``HeliumForCausalLM``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = Path(spec).expanduser()
    names = _causal_lm_names()
    if path.is_dir() or path.is_file():
        file = path / CONFIG if path.is_dir() else path
        if not file.is_file():
            raise ScaffoldError(f"{path}: no config.json in this folder", hint="pass an HF checkpoint folder, its "
                                "config.json, or a transformers model_type such as 'helium'")
        try:
            given = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ScaffoldError(f"{file}: not a JSON config ({exc})") from None
        if not isinstance(given, dict) or "model_type" not in given:
            raise ScaffoldError(f"{file}: a Hugging Face config.json needs a 'model_type' key")
        model_type = given["model_type"]
        if model_type not in CONFIG_MAPPING:
            raise ScaffoldError(f"{file}: model_type {model_type!r} is not in the installed transformers",
                                hint="plugin new starts from an architecture transformers ships")
        archs = given.get("architectures") or [names.get(model_type)]
        architecture = archs[0]
        if not architecture:
            raise ScaffoldError(f"{file}: model_type {model_type!r} has no causal-LM class in transformers")
        folder = file.parent.name if file.name == CONFIG else file.stem
        return Source(model_type, architecture, dict(given), str(file), _slug(folder))
    if spec in CONFIG_MAPPING and spec in names:
        return Source(spec, names[spec], {}, f"transformers' {type(CONFIG_MAPPING[spec]()).__name__} defaults",
                      "default")
    by_class = {cls: mt for mt, cls in names.items()}
    if spec in by_class:
        model_type = by_class[spec]
        return Source(model_type, spec, {}, f"transformers' {type(CONFIG_MAPPING[model_type]()).__name__} defaults",
                      "default")
    raise ScaffoldError(f"--from-config {spec}: not a folder, a config.json, a transformers model_type or a causal-LM "
                        "class name", hint="for example --from-config helium, --from-config HeliumForCausalLM or "
                        "--from-config /path/to/checkpoint")
