"""pai-zoo plugin for GLM-4 in transformers: ``GlmForCausalLM`` (glm-4-9b-hf) and ``Glm4ForCausalLM``
(GLM-4-0414, with norms on the attention and MLP outputs). RMSNorm, GQA, QKV bias, fused ``gate_up_proj``,
interleaved rotary embeddings on half of each head. Family ``glm4-moe``: GLM-4.5 (``Glm4MoeForCausalLM``),
a mixture of experts with sigmoid routing, score-correction bias, routed scaling and first-k dense layers."""
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
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    FirstKDense,
    MtpLayers,
    llama_config_rules,
    llama_layout,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
    qkv_bias,
)

from .presets import PRESETS
from .presets_moe import GLM4_MOE_PRESETS
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


# -- GLM-4.5 (Glm4MoeForCausalLM) ------------------------------------------------------------------------------
GLM4_MOE_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_bias", "add_qkv_bias"),
        Field("use_qk_norm", "qk_layernorm", default=False),
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),  # partial_rotary_factor 0.5 -> rotary_percent; GLM-4.5 rotates halves (rotate_half), not pairs
        MtpLayers(),
        *moe_config_rules("n_routed_experts", aux_loss=None, score="sigmoid", groups=("n_group", "topk_group"),
                          scaling="routed_scaling_factor", expert_bias=True, shared_count="n_shared_experts",
                          dense_layers=FirstKDense(), router_fp32=True),
        head_dim=None,
        mcore_fixed={"add_bias_linear": False, "rotary_interleaved": False},
    ),
    # Whether transformers returns the router logits: no effect on the logits.
    passthrough=("output_router_logits",),
)


def glm4_moe_weights(config) -> WeightMap:
    """GLM-4.5: per-expert ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate`` and its
    ``e_score_correction_bias``, the ungated ``mlp.shared_experts``, plain MLPs on the first-k dense layers; QKV
    bias and (``use_qk_norm``) per-head q/k norms."""
    rows = llama_layout(mlp=moe_layout(shared="shared_experts." if config.get("moe_shared_expert_intermediate_size")
                                       else None, expert_bias="gate.e_score_correction_bias"))
    rows.append(qkv_bias())
    if config.get("qk_layernorm"):
        rows += [
            Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
            Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
        ]
    return WeightMap(*rows)


GLM4_MOE = Family(
    name="glm4-moe",
    aliases=("glm4_moe", "glm-4.5-moe"),
    hf_architectures=("Glm4MoeForCausalLM",),
    model_types=("glm4_moe",),
    presets=GLM4_MOE_PRESETS,
    tiny="glm4-moe-tiny",
    odd="glm4-moe-odd",
    config_map=GLM4_MOE_CONFIG,
    weight_map=glm4_moe_weights,
    megatron_args=(*moe_megatron_args("sigmoid", add_qkv_bias=True),
                   *moe_megatron_args("sigmoid", add_qkv_bias=True, qk_layernorm=True)),
    test_tokenizer=write_glm4_tokenizer,
    description="GLM-4.5 and GLM-4.5-Air (Glm4MoeForCausalLM): sigmoid-routed experts with a shared expert",
)


@hookimpl
def pai_zoo_families():
    from .glm5 import GLM5  # pai-zoo-deepseek's MLA and sparse attention

    return [GLM, GLM4_MOE, GLM5]
