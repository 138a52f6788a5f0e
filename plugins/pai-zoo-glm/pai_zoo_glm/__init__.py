"""pai-zoo plugin for GLM-4 in transformers: ``GlmForCausalLM`` (glm-4-9b-hf) and ``Glm4ForCausalLM``
(GLM-4-0414, with norms on the attention and MLP outputs). RMSNorm, GQA, QKV bias, fused ``gate_up_proj``,
interleaved rotary embeddings on half of each head."""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    Copy,
    Family,
    Field,
    Rope,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import FAMILY_KEY_PREFIX, Rule
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_layout, qkv_bias

from .presets import PRESETS
from .tokenizer_files import write_glm4_tokenizer

#: arch key: the layers norm their attention and MLP outputs (Glm4ForCausalLM).
POST_NORMS = FAMILY_KEY_PREFIX + "post_norms"


class ModelType(Rule):
    """``model_type`` ``glm4`` (``Glm4ForCausalLM``) <-> norms on every layer's attention and MLP outputs."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch[POST_NORMS] = hf.get("model_type") == "glm4"

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["model_type"] = "glm4" if arch.get(POST_NORMS) else "glm"

    def describe(self) -> str:
        return f"model_type glm4 -> {POST_NORMS} (post_self_attn_layernorm, post_mlp_layernorm)"


CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_bias", "add_qkv_bias"),
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),  # partial_rotary_factor -> rotary_percent
        ModelType(),
        # GLM rotates interleaved pairs (x0, x1), (x2, x3) ... of the rotary half of each head.
        mcore_fixed={"add_bias_linear": False, "rotary_interleaved": True},
    ),
)

L, M = HF_LAYER, MCORE_LAYER


def weights(config) -> WeightMap:
    """GLM's table: ``gate_up_proj`` is already megatron's ``[gate; up]``; Glm4 adds the two post norms."""
    rows = llama_layout(fc1=Copy(L + "mlp.gate_up_proj.weight", M + "mlp.linear_fc1.weight"))
    if config.get("add_qkv_bias"):
        rows.append(qkv_bias())
    if config.get(POST_NORMS):
        rows += [
            Copy(L + "post_self_attn_layernorm.weight", M + "self_attention.linear_proj.post_layernorm.weight"),
            Copy(L + "post_mlp_layernorm.weight", M + "mlp.linear_fc2.post_layernorm.weight"),
        ]
    return WeightMap(*rows)


def layer_spec(config):
    """megatron-core's local spec; with the core's post-sublayer norms for Glm4."""
    from pai_zoo.mcore.specs import default_layer_spec

    spec = default_layer_spec(config)
    if config.get(POST_NORMS):
        from pai_zoo.mcore.post_norm import with_post_norms

        spec = with_post_norms(spec)
    return spec


GLM = Family(
    name="glm",
    aliases=("glm4", "glm-4"),
    hf_architectures=("GlmForCausalLM", "Glm4ForCausalLM"),
    model_types=("glm", "glm4"),
    presets=PRESETS,
    tiny="glm4-tiny",
    odd="glm4-odd",
    config_map=CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    test_tokenizer=write_glm4_tokenizer,
    description="GLM-4 (GlmForCausalLM: glm-4-9b-hf; Glm4ForCausalLM: GLM-4-0414)",
)


@hookimpl
def pai_zoo_families():
    return [GLM]
