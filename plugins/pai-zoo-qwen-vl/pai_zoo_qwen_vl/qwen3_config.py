"""Qwen3-VL / Qwen3-VL-MoE configs: transformers' nested ``{text_config, vision_config, <token ids>}`` <-> one
:class:`~pai_zoo.config_map.McoreConfig`, as :class:`~pai_zoo_qwen_vl.config.VisionLanguageConfig` does for
Qwen2-VL, with Qwen3's language model:

* dense (``qwen3_vl_text``): Qwen3's rules (per-head q/k norms, no biases), ``head_dim`` required;
* MoE (``qwen3_vl_moe_text``): Qwen3-MoE's rules with ``num_experts`` (transformers keeps ``num_local_experts``);
  its router always renormalises the top-k (no ``norm_topk_prob`` key); ``sliding_window`` is always ``None``;
* ``rope_parameters.mrope_interleaved`` -> the core's :data:`pai_zoo.mcore.mrope.MROPE_INTERLEAVED` (the value as
  given kept under ``family.mrope_interleaved`` for the way back); ``mrope_section`` defaults to ``[24, 20, 20]``
  (transformers' Qwen3-VL rotary default).

The tower's settings travel as one dict under ``family.vision`` (:func:`qwen3_tower_settings` reads them).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Field, Rope
from pai_zoo.config_map import McoreConfig
from pai_zoo.layouts import SparseStep, llama_config_rules, moe_config_rules
from pai_zoo.vision import VISION_KEY

from .config import VisionLanguageConfig

#: The core's arch key for interleaved M-RoPE (:mod:`pai_zoo.mcore.mrope`; the name, without importing torch).
MROPE_INTERLEAVED = "pai_zoo.mrope_interleaved"
INTERLEAVED_AS_GIVEN = "family.mrope_interleaved"
#: transformers' Qwen3-VL text rotary embedding's sections when the config names none.
QWEN3_VL_MROPE_SECTION = [24, 20, 20]

_QK_NORM = {"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True}

QWEN3_VL_TEXT_CONFIG = ConfigMap(
    *llama_config_rules(Field("attention_dropout", "attention_dropout", default=0.0), Rope(),
                        hf_fixed={"attention_bias": False}, mcore_fixed=_QK_NORM),
)

QWEN3_VL_MOE_TEXT_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        *moe_config_rules("num_local_experts", norm_topk=None, dense_layers=SparseStep()),
        hf_fixed={"attention_bias": False},
        mcore_fixed=_QK_NORM,
    ),
    # sliding_window: always None (transformers' __post_init__); output_router_logits: no effect on the logits.
    passthrough=("sliding_window", "output_router_logits"),
)


class Qwen3VisionLanguageConfig(VisionLanguageConfig):
    """Nested Qwen3-VL config <-> megatron-core config (see the module docstring)."""

    def __init__(self, text_model_type: str, vision_model_type: str, inner: ConfigMap):
        super().__init__(text_model_type, vision_model_type, inner, default_section=QWEN3_VL_MROPE_SECTION)

    def to_mcore(self, family: str, hf: dict) -> McoreConfig:
        text = dict(hf.get("text_config") or {})
        rope = dict(text.get("rope_parameters") or {})
        interleaved = rope.pop("mrope_interleaved", None)
        if interleaved is not None and not isinstance(interleaved, bool):
            raise ConfigTranslationError(f"rope_parameters.mrope_interleaved={interleaved!r}: give true or false")
        if "num_experts" in text and "num_local_experts" not in text:  # the published name (attribute_map)
            text["num_local_experts"] = text.pop("num_experts")
        text["rope_parameters"] = rope
        vision = hf.get("vision_config")
        if isinstance(vision, dict):
            _check_tower(vision)
        config = super().to_mcore(family, {**hf, "text_config": text})
        if interleaved is not None:
            config.arch[INTERLEAVED_AS_GIVEN] = interleaved
        if interleaved:
            config.arch[MROPE_INTERLEAVED] = True
        return config

    def to_hf(self, config: McoreConfig, known_keys: frozenset[str] | None = None) -> dict:
        arch = {k: v for k, v in config.arch.items() if k != MROPE_INTERLEAVED}
        given = config.get(INTERLEAVED_AS_GIVEN)
        if bool(given) != bool(config.get(MROPE_INTERLEAVED)):
            raise ConfigTranslationError(f"{MROPE_INTERLEAVED}={config.get(MROPE_INTERLEAVED)!r} disagrees with "
                                         f"the config's mrope_interleaved={given!r}")
        hf = super().to_hf(McoreConfig(family=config.family, arch=arch, hf_extra=config.hf_extra,
                                       hf_absent=config.hf_absent), known_keys)
        if given is not None:
            hf["text_config"]["rope_parameters"]["mrope_interleaved"] = given
        return hf


def _check_tower(v: dict) -> None:
    depth = v.get("depth")
    indexes = list(v.get("deepstack_visual_indexes") or [])
    bad = [i for i in indexes if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < (depth or 0)]
    if bad:
        raise ConfigTranslationError(f"vision_config.deepstack_visual_indexes={indexes}: each must be a tower layer "
                                     f"index below depth={depth}")
    if len(set(indexes)) != len(indexes):
        raise ConfigTranslationError(f"vision_config.deepstack_visual_indexes={indexes}: repeated layer")
    side = int((v.get("num_position_embeddings") or 0) ** 0.5)
    if side * side != v.get("num_position_embeddings") or side < 2:
        raise ConfigTranslationError(f"vision_config.num_position_embeddings={v.get('num_position_embeddings')}: "
                                     "the learned positions are a square grid of 4 or more")
    heads = v.get("num_heads") or 1
    if v.get("hidden_size", 0) % heads or (v.get("hidden_size", 0) // heads) % 4:
        raise ConfigTranslationError(f"vision_config.hidden_size={v.get('hidden_size')} / num_heads={heads}: the "
                                     "tower's head_dim must be a whole multiple of 4 (2D rotary: rows and columns)")


def qwen3_tower_settings(config: McoreConfig) -> dict:
    """The Qwen3-VL tower's shape from ``family.vision``."""
    v = dict(config[VISION_KEY])
    return {
        "dim": v["hidden_size"], "out": v["out_hidden_size"], "depth": v["depth"], "heads": v["num_heads"],
        "ffn": v["intermediate_size"], "act": v.get("hidden_act", "gelu_pytorch_tanh"), "patch": v["patch_size"],
        "temporal": v["temporal_patch_size"], "channels": v.get("in_channels", 3), "merge": v["spatial_merge_size"],
        "theta": (v.get("rope_parameters") or {}).get("rope_theta", 10000.0),
        "positions": v["num_position_embeddings"], "deepstack": tuple(v.get("deepstack_visual_indexes") or ()),
    }


def qwen3_tower_parameters(config: McoreConfig, tp: int = 1) -> tuple[int, int]:
    """``(tower, projector)`` parameters on one tensor-parallel rank: the blocks' linears split as megatron-core's
    (column-parallel weights and biases split, row-parallel biases and norms replicated); the patch embedding,
    learned positions, merger and DeepStack mergers replicated. The projector: the merger and DeepStack mergers."""
    s = qwen3_tower_settings(config)
    dim, ffn = s["dim"], s["ffn"]
    block = 4 * dim  # two LayerNorms with bias
    block += (3 * dim * dim + 3 * dim) // tp + dim * dim // tp + dim  # qkv (bias), proj (replicated bias)
    block += (ffn * dim + ffn) // tp + ffn * dim // tp + dim  # fc1 (bias), fc2 (replicated bias)
    width = dim * s["merge"] ** 2
    mlp = width * width + width + width * s["out"] + s["out"]
    projector = 2 * dim + mlp + len(s["deepstack"]) * (2 * width + mlp)
    patch = s["channels"] * s["temporal"] * s["patch"] ** 2 * dim + dim
    return patch + s["positions"] * dim + s["depth"] * block + projector, projector
