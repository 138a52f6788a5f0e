"""GLM-4.1V / GLM-4.5V configs: transformers' nested ``{text_config, vision_config, <token ids>}`` <-> one
:class:`~pai_zoo.config_map.McoreConfig`.

The language model is translated by GLM-4's rules run on ``text_config``:

* ``glm4v`` (GLM-4.1V): GLM-4-0414's layer (QKV bias, fused ``gate_up_proj``, post-attention and post-MLP norms),
  ``position_embedding_type="mrope"`` on interleaved pairs (``rotary_interleaved``: transformers'
  ``rotate_half_llm``; megatron-core's own M-RoPE cannot pair channels, :mod:`pai_zoo.mcore.mrope_pairs` does) on
  ``partial_rotary_factor`` of each head (``rotary_percent``). transformers' attention uses
  ``hidden_size // num_attention_heads`` channels a head; another ``head_dim`` is refused.
* ``glm4v_moe`` (GLM-4.5V): GLM-4.5's mixture of experts (``pai_zoo_glm.GLM4_MOE_CONFIG``: sigmoid router with
  the score-correction bias, shared experts, first-k dense layers), M-RoPE on halves (``rotate_half``), partial.

The vision settings travel as one dict under ``family.vision``, the special token ids under ``family.<key>``.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Field, Rope
from pai_zoo.config_map import McoreConfig
from pai_zoo.layouts import llama_config_rules
from pai_zoo.plugin.nested_config import MropeSections, NestedVisionConfig, family_key
from pai_zoo.vision import VISION_KEY
from pai_zoo_glm import GLM4_MOE_CONFIG, POST_NORMS

#: Top-level token ids of the nested config, kept under ``family.<key>``.
TOKEN_KEYS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
              "video_start_token_id", "video_end_token_id")
SECTION_ABSENT = "family.mrope_section_absent"
ROPE_ALIAS = "family.rope_type_alias"  # rope_parameters' "type": transformers keeps a published rope_scaling's
#: transformers' GLM-4V rotary embedding's sections when the config names none.
DEFAULT_MROPE_SECTION = [8, 12, 12]

#: GLM-4.1V's language model (``Glm4vTextConfig``): GLM-4-0414's layer without the keys its config lacks.
GLM4V_TEXT_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        head_dim=None,
        tie_default=False,
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": True, "rotary_interleaved": True, POST_NORMS: True},
    ),
)


token_key = family_key


class GlmVisionLanguageConfig(NestedVisionConfig):
    """Nested HF config <-> megatron-core config (see the module docstring): the core's
    :class:`~pai_zoo.plugin.nested_config.NestedVisionConfig` with GLM-4V's data and checks."""

    def __init__(self, text: ConfigMap, text_model_type: str, vision_model_type: str, moe: bool):
        super().__init__(text, text_model_type, vision_model_type, top_keys=TOKEN_KEYS, source="Glm4vConfig",
                         mrope=MropeSections(tuple(DEFAULT_MROPE_SECTION), ROPE_ALIAS, SECTION_ABSENT))
        self.moe = moe

    def text_in(self, hf: dict) -> dict:
        text = super().text_in(hf)
        heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
        if not self.moe and text.get("head_dim") not in (None, hidden // heads if heads else None):
            raise ConfigTranslationError(f"text_config.head_dim={text['head_dim']}: GLM-4.1V's attention uses "
                                         f"hidden_size // num_attention_heads = {hidden // heads} channels a head; "
                                         "remove head_dim or make it that")
        return text

    def vision_in(self, vision: dict) -> dict:
        vision = super().vision_in(vision)
        if vision.get("hidden_size", 0) % max(int(vision.get("num_heads", 1)), 1):
            raise ConfigTranslationError(f"vision_config.hidden_size={vision['hidden_size']} is not a multiple of "
                                         f"vision_config.num_heads={vision['num_heads']}")
        if vision.get("hidden_size", 1536) // int(vision.get("num_heads", 12)) % 4:
            raise ConfigTranslationError(f"vision_config.hidden_size / num_heads = "
                                         f"{vision.get('hidden_size', 1536) // int(vision.get('num_heads', 12))}: "
                                         "the tower's 2D rotary needs a head_dim that is a multiple of 4")
        return vision


GLM4V_CONFIG = GlmVisionLanguageConfig(GLM4V_TEXT_CONFIG, "glm4v_text", "glm4v_vision", moe=False)
#: GLM-4.5V's language model: GLM-4.5's rules; ``router_aux_loss_coef`` (transformers adds the load-balancing loss
#: only when asked for router logits) travels as it is.
GLM4V_MOE_TEXT_CONFIG = ConfigMap(*GLM4_MOE_CONFIG.rules,
                                  passthrough=(*GLM4_MOE_CONFIG.passthrough, "router_aux_loss_coef"))
GLM4V_MOE_CONFIG = GlmVisionLanguageConfig(GLM4V_MOE_TEXT_CONFIG, "glm4v_moe_text", "glm4v_moe_vision", moe=True)


def tower_settings(config: McoreConfig) -> dict:
    """The tower's shape from the family's vision settings (``family.vision``), transformers' defaults filled in."""
    v = dict(config[VISION_KEY])
    return {
        "dim": v.get("hidden_size", 1536),
        "out": v.get("out_hidden_size", 4096),
        "depth": v.get("depth", 24),
        "heads": v.get("num_heads", 12),
        "ffn": v.get("intermediate_size", 13696),  # the merger's width; the blocks' MLPs are out_hidden_size wide
        "act": v.get("hidden_act", "silu"),
        "patch": v.get("patch_size", 14),
        "temporal": v.get("temporal_patch_size", 2),
        "channels": v.get("in_channels", 3),
        "merge": v.get("spatial_merge_size", 2),
        "image_size": v.get("image_size", 336),
        "eps": v.get("rms_norm_eps", 1e-5),
        "qkv_bias": bool(v.get("attention_bias", False)),
        "theta": (v.get("rope_parameters") or {}).get("rope_theta", 10000.0),
    }


def tower_parameters(config: McoreConfig, tp: int = 1) -> tuple[int, int]:
    """``(tower, projector)`` parameters on one tensor-parallel rank: the blocks' linears split as megatron-core's
    (column-parallel biases split, norms replicated); the patch embedding, position embeddings, norms, downsample
    and merger replicated. The projector is the merger."""
    s = tower_settings(config)
    dim, out, ffn = s["dim"], s["out"], s["ffn"]
    block = 2 * dim + (3 * dim * dim + (3 * dim if s["qkv_bias"] else 0)) // tp + dim * dim // tp
    block += 2 * out * dim // tp + out * dim // tp  # SwiGLU fc1 [gate; up], fc2: out_hidden_size wide, no biases
    patch = s["channels"] * s["temporal"] * s["patch"] ** 2 * dim + dim
    positions = (s["image_size"] // s["patch"]) ** 2 * dim
    downsample = dim * out * s["merge"] ** 2 + out
    projector = out * out + 2 * out + 3 * out * ffn
    return patch + dim + positions + s["depth"] * block + dim + downsample + projector, projector
