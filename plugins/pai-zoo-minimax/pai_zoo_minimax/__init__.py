"""pai-zoo plugin for MiniMax-M2 as transformers implements it (``MiniMaxM2ForCausalLM``, family ``minimax_m2``).

The Llama layout with an explicit ``head_dim``, GQA and no biases; RoPE on the first ``rotary_dim`` channels of
each head (``partial_rotary_factor``: megatron-core's ``rotary_percent``, halves rotated); q/k RMSNorms over the
whole query and key projections (``use_qk_norm``, ``qk_norm_type: per_layer``: the core's
``pai_zoo.qk_norm = "projection"``, :mod:`pai_zoo.mcore.projection_qk_norm`); every layer a mixture of experts
(``block_sparse_moe``: Mixtral's ``w1``/``w3``/``w2`` experts of ``intermediate_size``) routed by sigmoid scores
whose top-k is chosen with the score-correction bias ``e_score_correction_bias`` added, then renormalised
(megatron-core's ``moe_router_enable_expert_bias``).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    FixedIfPresent,
    Rope,
    Rule,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import QK_NORM
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    llama_config_rules,
    llama_layout,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
)

from .presets import PRESETS
from .tokenizer_files import write_minimax_tokenizer


class RotaryDim(Rule):
    """MiniMax-M2's published ``rotary_dim`` (transformers reads it as ``partial_rotary_factor = rotary_dim /
    head_dim``, which the core's :class:`~pai_zoo.Rope` rule translates): it must give the same fraction; kept as
    it was (written back as ``rotary_percent * kv_channels``)."""

    hf_keys = ("rotary_dim",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        dim = hf.get("rotary_dim")
        if dim is None:
            return
        head_dim, percent = arch["kv_channels"], arch.get("rotary_percent", 1.0)
        if not isinstance(dim, int) or dim % 2 or not 0 < dim <= head_dim or dim != round(percent * head_dim):
            raise ConfigTranslationError(f"rotary_dim={dim!r}: an even number of channels up to head_dim={head_dim} "
                                         f"that partial_rotary_factor={percent} of head_dim gives")
        if int(head_dim * percent) != dim:  # megatron-core rotates int(kv_channels * rotary_percent) channels
            raise ConfigTranslationError(f"rotary_dim={dim} of head_dim={head_dim}: megatron-core would rotate "
                                         f"int({head_dim} * {percent}) = {int(head_dim * percent)} channels")
        arch["family.rotary_dim"] = True  # present

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("family.rotary_dim"):
            hf["rotary_dim"] = round(arch.get("rotary_percent", 1.0) * arch["kv_channels"])

    def describe(self) -> str:
        return "rotary_dim = partial_rotary_factor x head_dim (kept)"


CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),  # partial_rotary_factor -> rotary_percent (the first channels of each head, halves rotated)
        RotaryDim(),
        FixedIfPresent("use_qk_norm", True, "transformers' MiniMax-M2 always norms its queries and keys"),
        FixedIfPresent("qk_norm_type", "per_layer", "transformers' MiniMax-M2 norms the whole query and key "
                       "projections of each layer"),
        FixedIfPresent("scoring_func", "sigmoid", "transformers' MiniMax-M2 routes by sigmoid scores"),
        FixedIfPresent("use_routing_bias", True, "transformers' MiniMax-M2 routes with its score-correction bias"),
        *moe_config_rules("num_local_experts", "num_experts_per_tok", expert_ffn=None,
                          aux_loss="router_aux_loss_coef", norm_topk=None, score="sigmoid", expert_bias=True),
        head_dim=128,
        tie_default=False,
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False, "qk_layernorm": True, QK_NORM: "projection",
                     "rotary_interleaved": False},
    ),
    # Whether transformers returns router logits; the jitter of the router's input in training (no effect on the
    # logits of a model in eval mode).
    passthrough=("output_router_logits", "router_jitter_noise"),
)

L, M = HF_LAYER, MCORE_LAYER


def weights(config) -> WeightMap:
    """The Llama layout with ``block_sparse_moe`` experts (Mixtral's names), the router's score-correction bias, and
    the whole-projection q/k norms (copied: the core's norm holds the full ``[heads * head_dim]`` weight)."""
    return WeightMap(
        *llama_layout(mlp=moe_layout("block_sparse_moe.", gate_up="{w1,w3}.weight", down="w2.weight",
                                     expert_bias="e_score_correction_bias", dense=None)),
        Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
        Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
    )


MINIMAX_M2 = Family(
    name="minimax_m2",
    aliases=("minimax-m2",),
    hf_architectures=("MiniMaxM2ForCausalLM",),
    model_types=("minimax_m2",),
    presets=PRESETS,
    tiny="minimax_m2-tiny",
    odd="minimax_m2-odd",
    config_map=CONFIG,
    weight_map=weights,
    test_tokenizer=write_minimax_tokenizer,
    backends=("local",),  # the whole-projection q/k norms are pai-zoo modules of the local spec
    megatron_args=moe_megatron_args("sigmoid", qk_layernorm=True, moe_router_enable_expert_bias=True,
                                    **{QK_NORM: "projection"}),
    description="MiniMax-M2 (MiniMaxM2ForCausalLM): partial RoPE, q/k norms over the whole projections, "
                "sigmoid-routed experts with a score-correction bias",
)


@hookimpl
def pai_zoo_families():
    return [MINIMAX_M2]
