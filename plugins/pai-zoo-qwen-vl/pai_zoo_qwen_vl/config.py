"""Qwen2-VL / Qwen2.5-VL configs: transformers' nested ``{text_config, vision_config, <token ids>}`` <-> one
:class:`~pai_zoo.config_map.McoreConfig`.

The language model is Qwen2's translation (:data:`pai_zoo_qwen.QWEN2_CONFIG`) run on ``text_config``, with
``position_embedding_type="mrope"`` and ``mrope_section`` from its ``rope_parameters``; the vision settings travel
as one dict under ``family.vision`` and the placeholder ids under ``family.*_token_id``. A published ``config.json``
(flat: text keys at the top, ``rope_scaling: {type: mrope}``) reaches this as transformers' config class nests it.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError
from pai_zoo.config_map import NON_ARCHITECTURE_KEYS, McoreConfig
from pai_zoo.vision import VISION_KEY
from pai_zoo_qwen import QWEN2_CONFIG

#: Top-level token ids of the nested config, kept under ``family.<key>``.
TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
TEXT_EXTRA = "text_config"  # hf_extra key of the text config's untranslated keys
ROPE_ALIAS = "family.mrope_type"
SECTION_ABSENT = "family.mrope_section_absent"  # no mrope_section in the source: transformers' default applies
#: transformers' Qwen2-VL rotary embedding's sections when the config names none (``rope_parameters.get``).
DEFAULT_MROPE_SECTION = [16, 24, 24]  # rope_parameters' "type" entry, where the source had one


def token_key(name: str) -> str:
    return f"family.{name}"


def placeholder_ids(config) -> dict[str, int]:
    """:attr:`pai_zoo.vision.VisionSpec.placeholders` of the Qwen-VL families: the image and video pad ids."""
    return {"image": config[token_key("image_token_id")], "video": config[token_key("video_token_id")]}


class VisionLanguageConfig(ConfigMap):
    """Nested HF config <-> megatron-core config (see the module docstring)."""

    def __init__(self, text_model_type: str, vision_model_type: str, inner: ConfigMap = QWEN2_CONFIG,
                 default_section=DEFAULT_MROPE_SECTION):
        super().__init__(*inner.rules, passthrough=inner.passthrough)
        self.text_model_type, self.vision_model_type = text_model_type, vision_model_type
        self.inner, self.default_section = inner, list(default_section)

    @property
    def consumed_keys(self) -> frozenset[str]:
        return frozenset({"text_config", "vision_config", "tie_word_embeddings", *TOKEN_KEYS})

    def to_mcore(self, family: str, hf: dict) -> McoreConfig:
        if not isinstance(hf.get("text_config"), dict) or not isinstance(hf.get("vision_config"), dict):
            raise ConfigTranslationError("a vision-language config needs text_config and vision_config "
                                         "(as transformers' Qwen2VLConfig writes them)")
        text = dict(hf["text_config"])
        text["tie_word_embeddings"] = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        rope = dict(text.get("rope_parameters") or {})
        section = rope.pop("mrope_section", None)
        if section is None:  # transformers' rotary embedding then uses its default sections
            section, absent = self.default_section, True
        else:
            absent = False
        alias = rope.pop("type", None)  # transformers keeps the published rope_scaling's "type": "mrope" here
        text["rope_parameters"] = rope
        inner = self.inner.to_mcore(family, text)
        arch = dict(inner.arch)
        head_dim = inner.kv_channels
        if sum(section) * 2 != head_dim:
            raise ConfigTranslationError(f"mrope_section {section} covers {sum(section) * 2} channels, not the "
                                         f"head_dim {head_dim}")
        arch.update(position_embedding_type="mrope", mrope_section=list(section))
        if alias is not None:
            arch[ROPE_ALIAS] = alias
        if absent:
            arch[SECTION_ABSENT] = True
        arch[VISION_KEY] = {k: v for k, v in hf["vision_config"].items()
                            if k != "model_type"}
        for key in TOKEN_KEYS:
            if key not in hf:
                raise ConfigTranslationError(f"{key} is missing from the config")
            arch[token_key(key)] = int(hf[key])
        extra = {k: v for k, v in hf.items() if k not in self.consumed_keys}
        extra[TEXT_EXTRA] = {k: v for k, v in inner.hf_extra.items() if k != "tie_word_embeddings"}
        # the text config's keys its rules would fill in (head_dim ...) stay out when the source had none
        absent_keys = {f"{TEXT_EXTRA}.{k}": v for k, v in (inner.hf_absent or {}).items()}
        return McoreConfig(family=family, arch=arch, hf_extra=extra, hf_absent=absent_keys)

    def to_hf(self, config: McoreConfig, known_keys: frozenset[str] | None = None) -> dict:
        arch = {k: v for k, v in config.arch.items()
                if k not in (VISION_KEY, "mrope_section") and not k.startswith("family.")}
        arch["position_embedding_type"] = "rope"
        extra = dict(config.hf_extra)
        text_extra = dict(extra.pop(TEXT_EXTRA, {}))
        inner = McoreConfig(family=config.family, arch=arch, hf_extra=text_extra, hf_absent={})
        text = self.inner.to_hf(inner)
        for key, implied in (config.hf_absent or {}).items():
            name = key.removeprefix(f"{TEXT_EXTRA}.")
            if name != key and name in text and text[name] == implied:
                del text[name]
        tie = text.pop("tie_word_embeddings", False)
        text["rope_parameters"] = dict(text["rope_parameters"])
        if not config.get(SECTION_ABSENT):
            text["rope_parameters"]["mrope_section"] = list(config["mrope_section"])
        if config.get(ROPE_ALIAS) is not None:
            text["rope_parameters"]["type"] = config[ROPE_ALIAS]
        text["model_type"] = self.text_model_type
        vision = {**config[VISION_KEY], "model_type": self.vision_model_type}
        hf = {**extra, "text_config": text, "vision_config": vision, "tie_word_embeddings": tie}
        hf.update({key: config[token_key(key)] for key in TOKEN_KEYS})
        return hf

    def untranslated_architecture_keys(self, hf: dict) -> list[str]:
        text = {k: v for k, v in (hf.get("text_config") or {}).items()}
        inner = self.inner.untranslated_architecture_keys(text)
        top = sorted(k for k in hf if k not in self.consumed_keys | NON_ARCHITECTURE_KEYS)
        return top + [f"text_config.{k}" for k in inner if k != "model_type"]


def tower_settings(config: McoreConfig) -> dict:
    """The tower's shape from the family's vision settings (``family.vision``), in one vocabulary for both models."""
    v = dict(config[VISION_KEY])
    qwen25 = "out_hidden_size" in v
    dim = v["hidden_size"] if qwen25 else v["embed_dim"]
    return {
        "dim": dim,
        "out": v["out_hidden_size"] if qwen25 else v["hidden_size"],
        "depth": v["depth"],
        "heads": v["num_heads"],
        "ffn": v["intermediate_size"] if qwen25 else int(dim * v["mlp_ratio"]),
        "act": v.get("hidden_act", "silu" if qwen25 else "quick_gelu"),
        "patch": v["patch_size"],
        "temporal": v["temporal_patch_size"],
        "channels": v.get("in_channels", 3),
        "merge": v["spatial_merge_size"],
        "theta": (v.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        "qwen25": qwen25,
        "window_size": v.get("window_size"),
        "full_layers": tuple(v.get("fullatt_block_indexes") or ()),
        "tokens_per_second": v.get("tokens_per_second") if qwen25 else None,
    }


def tower_parameters(config: McoreConfig, tp: int = 1) -> tuple[int, int]:
    """``(tower, projector)`` parameters on one tensor-parallel rank: the blocks' linears split as megatron-core's
    (column-parallel biases split, row-parallel biases and norms replicated), the patch embedding and the merger
    replicated."""
    s = tower_settings(config)
    dim, ffn, glu = s["dim"], s["ffn"], 2 if s["qwen25"] else 1
    norm = dim * (1 if s["qwen25"] else 2)
    block = 2 * norm
    block += (3 * dim * dim + 3 * dim) // tp + dim * dim // tp + dim  # qkv (bias), proj (replicated bias)
    block += (glu * ffn * dim + glu * ffn) // tp + ffn * dim // tp + dim  # fc1 (bias), fc2 (replicated bias)
    width = dim * s["merge"] ** 2
    projector = norm + width * width + width + width * s["out"] + s["out"]
    patch = s["channels"] * s["temporal"] * s["patch"] ** 2 * dim
    return patch + s["depth"] * block + projector, projector

