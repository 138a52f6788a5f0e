"""pai-zoo plugin for Nemotron-H as transformers implements it (``NemotronHForCausalLM``, family ``nemotron_h``).

A hybrid of Mamba-2, attention and MLP layers in the order of ``hybrid_override_pattern`` / ``layers_block_type``
(the core's :class:`~pai_zoo.plugin.hybrid.HybridPattern`; megatron-core's ``MambaLayer`` / ``MambaMixer`` inside the
``GPTModel`` build, :mod:`pai_zoo.mcore.hybrid`). Each layer is ``x + mixer(RMSNorm(x))``; the attention layers have no
positional embedding (no RoPE) and GQA with an explicit ``head_dim``; the MLP layers are non-gated squared ReLU
(``relu2``); the Mamba-2 mixer's ``in_proj`` is ``[z, x, B, C, dt]`` as megatron-core's, its gated norm grouped by
``n_groups``. MoE layers (``E``, Nemotron-3) route by sigmoid scores with the score-correction bias over non-gated
squared-ReLU experts of ``moe_intermediate_size`` plus one shared expert of ``moe_shared_expert_intermediate_size``
(megatron-core's ``MoELayer``; :class:`HybridMoe`).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    FixedIfPresent,
    Output,
    Require,
    Rule,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.layouts import EveryLayerMoe, moe_config_rules
from pai_zoo.mapping import QKV
from pai_zoo.plugin.hybrid import (
    HYBRID_PATTERN,
    PER_LAYER_CHECKPOINT,
    HybridPattern,
    MegatronLmHybrid,
    hybrid_kinds,
    mamba_config_rules,
)

from .presets import PRESETS
from .tokenizer_files import write_nemotron_tokenizer

#: transformers' NemotronHConfig defaults of the Mamba keys a config may leave out.
MAMBA_DEFAULTS = {"mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
                  "conv_kernel": 4, "chunk_size": 128}

#: HF keys of the MoE layers that no :func:`moe_config_rules` rule reads.
MOE_OWN = ("n_shared_experts", "moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap",
           "output_router_logits")
MOE_RULES = [rule for rule in moe_config_rules(
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", aux_loss=None, norm_topk="norm_topk_prob",
    score="sigmoid", groups=("n_group", "topk_group"), scaling="routed_scaling_factor", expert_bias=True,
    router_fp32=True) if not isinstance(rule, EveryLayerMoe)]  # the E layers' moe_layer_freq: HybridMoe


class HybridMoe(Rule):
    """The MoE settings (every saved config has them): with ``E`` layers in the pattern, transformers' sigmoid router
    with its score-correction bias, top-k renormalised and scaled (:func:`pai_zoo.layouts.moe_config_rules`), the
    experts' width, one ungated shared expert of ``moe_shared_expert_intermediate_size`` (megatron's
    ``moe_shared_expert_intermediate_size``), ``moe_layer_freq`` 1 on the ``E`` layers only; no latent projection.
    Without ``E`` layers they are kept as given (``family.moe``) and written back."""

    hf_keys = tuple(dict.fromkeys(k for r in MOE_RULES for k in r.hf_keys)) + MOE_OWN

    def describe(self) -> str:
        return "n_routed_experts, num_experts_per_tok, moe_* ... -> megatron-core's MoE router and experts (E layers)"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        pattern = arch[HYBRID_PATTERN]
        if "E" not in pattern:
            kept = {k: hf[k] for k in self.hf_keys if k in hf}
            if kept:
                arch["family.moe"] = kept
            return
        if hf.get("moe_latent_size") is not None:
            raise ConfigTranslationError(f"moe_latent_size={hf['moe_latent_size']}: the experts' latent projection is "
                                         "not supported")
        for rule in MOE_RULES:
            rule.to_mcore(hf, arch)
        arch.pop("moe_layer_freq", None)
        arch["moe_layer_freq"] = [1 if c == "E" else 0 for c in pattern]
        arch["moe_shared_expert_intermediate_size"] = hf.get("moe_shared_expert_intermediate_size", 7688)
        arch["family.moe_own"] = {k: hf[k] for k in MOE_OWN if k in hf}

    def to_hf(self, arch: dict, hf: dict) -> None:
        if "E" not in arch[HYBRID_PATTERN]:
            hf.update(arch.get("family.moe") or {})
            return
        for rule in MOE_RULES:
            rule.to_hf(arch, hf)
        hf.update(arch.get("family.moe_own") or {})
        hf["moe_shared_expert_intermediate_size"] = arch["moe_shared_expert_intermediate_size"]


CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("intermediate_size", "ffn_hidden_size"),
    HybridPattern(kinds="M*-E"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("num_key_value_heads", "num_query_groups"),
    Field("head_dim", "kv_channels", default=128),
    Field("max_position_embeddings", "max_sequence_length", default=4096),
    Field("layer_norm_epsilon", "layernorm_epsilon", default=1e-5),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=False),
    Field("attention_dropout", "attention_dropout", default=0.0),
    *mamba_config_rules(defaults=MAMBA_DEFAULTS),
    HybridMoe(),
    FixedIfPresent("mlp_bias", False, "pai-zoo's Nemotron-H MLP has no biases"),
    # older (remote-code) configs' name of head_dim, which transformers' class does not read: it must agree
    Require(lambda hf: hf.get("attention_head_dim", hf.get("head_dim", 128)) == hf.get("head_dim", 128),
            "attention_head_dim differs from head_dim (transformers' Nemotron-H reads head_dim); make them agree"),
    FixedIfPresent("sliding_window", None, "transformers' Nemotron-H attends to every earlier token"),
    FixedIfPresent("num_nextn_predict_layers", 0, "Nemotron-H's multi-token-prediction layers are not supported"),
    Fixed(hf={"mlp_hidden_act": "relu2"},
          mcore={"activation_func": "squared_relu", "gated_linear_unit": False, "normalization": "RMSNorm",
                 "add_bias_linear": False, "add_qkv_bias": False, "qk_layernorm": False,
                 "position_embedding_type": "none"}),
    # No effect on the forward: initialisation ranges (time_step_*, rescale_prenorm_residual), the kernel switch, the
    # inner width a config also states as heads x head_dim (expand), the cache dtype, the MTP layers' kinds (MTP is
    # refused), the attention bias transformers never builds, dropout it never applies.
    passthrough=("expand", "time_step_min", "time_step_max", "time_step_floor", "use_mamba_kernels",
                 "mamba_ssm_cache_dtype", "rescale_prenorm_residual", "residual_in_fp32", "num_logits_to_keep",
                 "mamba_proj_bias", "attention_bias", "hidden_dropout", "mtp_layers_block_type", "attention_head_dim"),
)

L, M = "backbone.layers.{layer}.", "decoder.layers.{layer}."
MIXER = ("in_proj.weight", "conv1d.weight", "conv1d.bias", "A_log", "D", "dt_bias", "norm.weight", "out_proj.weight")


def _on(layers, *rows):
    for row in rows:
        row.layer_kind = tuple(layers)  # explicit layers (pai_zoo.tables.mapping.MappingContext.layers_of)
    return list(rows)


def _moe_rows(layers, L, M):
    """An ``E`` layer's norm, router (weight and score-correction bias), routed and shared experts."""
    E, X = L + "mixer.", M + "mlp."
    return _on(layers, Copy(L + "norm.weight", M + "pre_mlp_layernorm.weight"),
               Copy(E + "gate.weight", X + "router.weight"),
               Copy(E + "gate.e_score_correction_bias", X + "router.expert_bias"),
               Copy(E + "experts.{expert}.up_proj.weight", X + "experts.local_experts.{expert}.linear_fc1.weight"),
               Copy(E + "experts.{expert}.down_proj.weight", X + "experts.local_experts.{expert}.linear_fc2.weight"),
               Copy(E + "shared_experts.up_proj.weight", X + "shared_experts.linear_fc1.weight"),
               Copy(E + "shared_experts.down_proj.weight", X + "shared_experts.linear_fc2.weight"))


def weights(config) -> WeightMap:
    """Checkpoint names (``backbone.*``, as published and as transformers saves them). Per layer kind of the pattern:
    a Mamba layer's norm and mixer (``in_proj`` ``[z, x, B, C, dt]`` in both, copied), an attention layer's norm
    (megatron's ``input_layernorm``) and q/k/v/o, an MLP layer's norm (``pre_mlp_layernorm``) and ``up_proj`` /
    ``down_proj``."""
    kinds = hybrid_kinds(config.arch if hasattr(config, "arch") else config)
    of = {kind: [i for i, k in enumerate(kinds) if k == kind] for kind in ("mamba", "attention", "mlp", "moe")}
    return WeightMap(
        Vocab("backbone.embeddings.weight", "embedding.word_embeddings.weight"),
        *_on(of["mamba"], Copy(L + "norm.weight", M + "norm.weight"),
             *(Copy(L + "mixer." + name, M + "mixer." + name) for name in MIXER)),
        *_on(of["attention"], Copy(L + "norm.weight", M + "input_layernorm.weight"),
             QKV(L + "mixer.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
             Copy(L + "mixer.o_proj.weight", M + "self_attention.linear_proj.weight")),
        *_on(of["mlp"], Copy(L + "norm.weight", M + "pre_mlp_layernorm.weight"),
             Copy(L + "mixer.up_proj.weight", M + "mlp.linear_fc1.weight"),
             Copy(L + "mixer.down_proj.weight", M + "mlp.linear_fc2.weight")),
        *(_moe_rows(of["moe"], L, M) if of["moe"] else ()),
        Copy("backbone.norm_f.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    )


NEMOTRON_H = Family(
    name="nemotron_h",
    aliases=("nemotron-h",),
    hf_architectures=("NemotronHForCausalLM",),
    model_types=("nemotron_h",),
    presets=PRESETS,
    tiny="nemotron_h-tiny",
    odd="nemotron_h-odd",
    config_map=CONFIG,
    weight_map=weights,
    test_tokenizer=write_nemotron_tokenizer,
    hf_module_prefixes=(("backbone.", "model."),),  # transformers holds backbone.* (the checkpoint's) as model.*
    backends=("local",),  # the Mamba layers are megatron-core's local modules
    megatron_lm_rules=(MegatronLmHybrid(),),  # --hybrid-override-pattern, --mamba-* (pai_zoo.plugin.hybrid)
    megatron_args=({"activation_func": "squared_relu", "gated_linear_unit": False, "normalization": "RMSNorm",
                    "add_bias_linear": False, "position_embedding_type": "none", PER_LAYER_CHECKPOINT: True},),
    description="Nemotron-H (NemotronHForCausalLM): Mamba-2 / attention / MLP hybrid (hybrid_override_pattern), "
                "squared-ReLU MLP, attention without RoPE",
)

__all__ = ["HYBRID_PATTERN", "NEMOTRON_H"]


@hookimpl
def pai_zoo_families():
    return [NEMOTRON_H]
