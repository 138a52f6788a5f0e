"""Qwen2-VL / Qwen2.5-VL configs: transformers' nested ``{text_config, vision_config, <token ids>}`` <-> one
:class:`~pai_zoo.config_map.McoreConfig`.

The language model is Qwen2's translation (:data:`pai_zoo_qwen.QWEN2_CONFIG`) run on ``text_config``, with
``position_embedding_type="mrope"`` and ``mrope_section`` from its ``rope_parameters``; the vision settings travel
as one dict under ``family.vision`` and the placeholder ids under ``family.*_token_id``. A published ``config.json``
(flat: text keys at the top, ``rope_scaling: {type: mrope}``) reaches this as transformers' config class nests it.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, Family
from pai_zoo.config_map import McoreConfig
from pai_zoo.family import LazyClass
from pai_zoo.plugin.config_map import FAMILY_KEY_PREFIX
from pai_zoo.plugin.nested_config import MropeSections, NestedVisionConfig, family_key
from pai_zoo.vision import VISION_KEY
from pai_zoo_qwen import QWEN2_CONFIG

#: Top-level token ids of the nested config, kept under ``family.<key>``.
TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
ROPE_ALIAS = "family.mrope_type"  # rope_parameters' "type" entry, where the source had one
SECTION_ABSENT = "family.mrope_section_absent"  # no mrope_section in the source: transformers' default applies
#: transformers' Qwen2-VL rotary embedding's sections when the config names none (``rope_parameters.get``).
DEFAULT_MROPE_SECTION = [16, 24, 24]
token_key = family_key


def placeholder_ids(config) -> dict[str, int]:
    """:attr:`pai_zoo.vision.VisionSpec.placeholders` of the Qwen-VL families: the image and video pad ids."""
    return {"image": config[token_key("image_token_id")], "video": config[token_key("video_token_id")]}


class VisionLanguageConfig(NestedVisionConfig):
    """Nested HF config <-> megatron-core config (see the module docstring): the core's
    :class:`~pai_zoo.plugin.nested_config.NestedVisionConfig` with Qwen-VL's data."""

    def __init__(self, text_model_type: str, vision_model_type: str, inner: ConfigMap = QWEN2_CONFIG,
                 default_section=DEFAULT_MROPE_SECTION):
        super().__init__(inner, text_model_type, vision_model_type, top_keys=TOKEN_KEYS,
                         mrope=MropeSections(tuple(default_section), ROPE_ALIAS, SECTION_ABSENT),
                         source="Qwen2VLConfig")

    def own_keys(self, config: McoreConfig) -> set[str]:
        return {k for k in config.arch if k.startswith(FAMILY_KEY_PREFIX)} | {VISION_KEY, "mrope_section"}


def qwen_vl_family(name: str, aliases: tuple, architecture: str, model_type: str, presets: dict, description: str,
                   **fields) -> Family:
    """One Qwen-VL family: what Qwen2-VL's and Qwen3-VL's share (names, presets, transformers' class, the local
    layers only: the tower is megatron-core's local layers, Transformer Engine is untested here), ``fields`` the
    rest (config and weight maps, the tower, the test tokenizer)."""
    return Family(name=name, aliases=aliases, hf_architectures=(architecture,), model_types=(model_type,),
                  presets=presets, tiny=f"{name}-tiny", odd=f"{name}-odd",
                  hf_model_class=LazyClass(f"transformers:{architecture}"), backends=("local",),
                  description=description, **fields)


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

