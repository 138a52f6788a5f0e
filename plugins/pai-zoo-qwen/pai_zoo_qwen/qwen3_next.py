"""The ``qwen3_next`` family: Qwen3-Next (``Qwen3NextForCausalLM``).

Gated DeltaNet layers between gated full-attention layers (``layer_types``: the core's
:class:`~pai_zoo.plugin.linear_attention.LinearAttentionLayers` and :mod:`pai_zoo.mcore.linear_attention`), zero-centred
RMSNorms (``1 + weight``; the Gated DeltaNet's output norm is a plain one), partial rotary, per-head q/k norms, the
attention's sigmoid output gate (megatron-core's ``attention_output_gate``) and, in every layer (or those
``decoder_sparse_step`` / ``mlp_only_layers`` leave), a softmax-routed mixture of experts with a sigmoid-gated shared
expert (``moe_shared_expert_gate``). The family is data: config rules and a weight table.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, Family, Field, Rope, WeightMap
from pai_zoo.layouts import SparseStep, llama_config_rules, moe_config_rules, moe_layout, moe_megatron_args
from pai_zoo.mapping import Ignored
from pai_zoo.plugin.linear_attention import LinearAttentionLayers, MegatronLmGatedDeltaNet
from pai_zoo.tables.linear_layouts import hybrid_layout

from .presets_qwen3_next import QWEN3_NEXT_PRESETS
from .tokenizer_files import write_qwen2_tokenizer

#: The published checkpoints' multi-token-prediction module, which transformers does not load (``mtp.*``).
MTP_IGNORED = Ignored(lambda name: name.startswith("mtp."), "Qwen3-Next's multi-token-prediction module (mtp.*), "
                      "which transformers does not load either")

QWEN3_NEXT_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        LinearAttentionLayers(default_interval=4),
        *moe_config_rules(shared_ffn="shared_expert_intermediate_size", dense_layers=SparseStep()),
        head_dim=256,
        hf_fixed={"attention_bias": False},
        mcore_fixed={"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True,
                     "attention_output_gate": True, "layernorm_zero_centered_gamma": True},
    ),
    # output_router_logits: whether transformers returns the router logits (and adds its aux loss).
    passthrough=("output_router_logits",),
)


def qwen3_next_weights(config) -> WeightMap:
    """Qwen3-Next: gated attention and Gated DeltaNet rows on their layers, Qwen-MoE experts with the shared expert
    and its gate (dense ``mlp.{gate,up,down}_proj`` on ``mlp_only_layers``)."""
    mlp = moe_layout(shared="shared_expert.", shared_gate="shared_expert_gate.weight")
    return WeightMap(*hybrid_layout(config, mlp=mlp), MTP_IGNORED)


QWEN3_NEXT = Family(
    name="qwen3_next",
    aliases=("qwen3-next",),
    hf_architectures=("Qwen3NextForCausalLM",),
    model_types=("qwen3_next",),
    presets=QWEN3_NEXT_PRESETS,
    tiny="qwen3_next-tiny",
    odd="qwen3_next-odd",
    config_map=QWEN3_NEXT_CONFIG,
    weight_map=qwen3_next_weights,
    megatron_args=moe_megatron_args(qk_layernorm=True, layernorm_zero_centered_gamma=True,
                                    attention_output_gate=True, experimental_attention_variant="gated_delta_net"),
    megatron_lm_rules=(MegatronLmGatedDeltaNet(),),
    test_tokenizer=write_qwen2_tokenizer,
    description="Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet and gated attention layers, MoE with a gated "
                "shared expert",
)
