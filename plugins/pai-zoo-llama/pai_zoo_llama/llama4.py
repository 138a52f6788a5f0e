"""Llama 4, text only (``Llama4ForCausalLM``, model type ``llama4_text``: the language model of Llama-4 Scout and
Maverick), on megatron-core options and the core's mechanisms:

* a mixture of experts on the layers ``moe_layers`` names (derived from ``interleave_moe_layer_step``; the others a
  dense SwiGLU MLP ``intermediate_size_mlp`` wide), each with an ungated shared expert as wide as a routed one
  (``intermediate_size``) and a top-1 sigmoid router whose score multiplies the expert's INPUT (megatron-core's
  ``moe_apply_probs_on_input``, which needs top-1: other ``num_experts_per_tok`` are refused by name); the routed
  experts are stored stacked, ``feed_forward.experts.gate_up_proj`` ``[E, hidden, 2 * ffn]`` and ``down_proj``
  (:class:`pai_zoo.mapping.StackedExperts`);
* RoPE on pairs of channels (``rotary_interleaved``), llama3 scaling where the config has it, and no RoPE on every
  ``no_rope_layer_interval``-th layer (megatron-core's ``no_rope_freq``, :mod:`pai_zoo.plugin.no_rope`);
* a weightless L2 (RMS) norm of the queries and keys on the RoPE layers only (``use_qk_norm``: megatron-core's
  ``L2Norm``, per layer in this family's layer spec; megatron-core applies it before RoPE, transformers after it:
  RoPE rotates pairs, which keeps the RMS, so both give the same result);
* chunked local attention on the ``chunked_attention`` layers (:mod:`pai_zoo.mcore.chunked_attention`);
* attention temperature tuning on the no-RoPE layers (:mod:`pai_zoo.mcore.query_scale`).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, Family, Field, Fixed, GateUp, Rope, Rule, WeightMap
from pai_zoo.config_map import FAMILY_KEY_PREFIX
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, MOE_FIXED, SWIGLU_RMSNORM, llama_layout, moe_pattern
from pai_zoo.mapping import StackedExperts, on_layers
from pai_zoo.plugin.chunked_attention import CHUNKED, FULL, ChunkedLayerTypes
from pai_zoo.plugin.no_rope import NoRopeLayers, interval_layers, no_rope_flags
from pai_zoo.plugin.query_scale import TemperatureTuning

from .llama4_presets import LLAMA4_PRESETS

STEP = FAMILY_KEY_PREFIX + "interleave_moe_layer_step"


class Top1SigmoidRouter(Rule):
    """Llama 4's router: the top-1 expert by logit, weighted by the sigmoid of its logit, the weight multiplying
    the expert's input; a shared expert ``intermediate_size`` wide, ungated -> megatron-core's sigmoid scores
    (top-1: not renormalised, so ``moe_router_pre_softmax`` stays off and megatron-core's top-1 softmax check does
    not apply), ``moe_apply_probs_on_input``, ``moe_shared_expert_intermediate_size``."""

    hf_keys = ()

    def describe(self) -> str:
        return ("top-1 sigmoid router, probabilities on the expert input (moe_apply_probs_on_input); shared expert "
                "intermediate_size wide, ungated")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        topk = arch["moe_router_topk"]
        if topk != 1:
            raise ConfigTranslationError(
                f"config.json has num_experts_per_tok={topk}; Llama 4 multiplies each expert's input by its router "
                "score, which megatron-core does only for top-1 routing (moe_apply_probs_on_input): use 1")
        arch.update(moe_router_score_function="sigmoid", moe_router_pre_softmax=False, moe_apply_probs_on_input=True,
                    moe_shared_expert_intermediate_size=arch["moe_ffn_hidden_size"], moe_shared_expert_gate=False)

    def to_hf(self, arch: dict, hf: dict) -> None:
        expected = {"moe_router_score_function": "sigmoid", "moe_router_pre_softmax": False,
                    "moe_apply_probs_on_input": True, "moe_shared_expert_gate": False,
                    "moe_shared_expert_intermediate_size": arch.get("moe_ffn_hidden_size")}
        wrong = {k: arch.get(k) for k, v in expected.items() if arch.get(k, v) != v}
        if wrong:
            raise ConfigTranslationError(f"{wrong}: Llama 4's router is top-1 sigmoid on the expert input, with one "
                                         "ungated shared expert as wide as a routed one")


class MoeLayers(Rule):
    """``moe_layers`` (or, absent, every ``interleave_moe_layer_step``-th layer from ``step - 1``) -> megatron-core's
    ``moe_layer_freq`` (1, or one 1/0 per layer). The step is kept and written back beside the list."""

    hf_keys = ("moe_layers", "interleave_moe_layer_step")

    def describe(self) -> str:
        return "moe_layers / interleave_moe_layer_step -> moe_layer_freq (dense layers among MoE layers)"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        n = arch["num_layers"]
        step = hf.get("interleave_moe_layer_step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigTranslationError(f"config.json has interleave_moe_layer_step={step!r}; it must be a positive "
                                         "integer")
        layers = hf.get("moe_layers")
        if layers is None:
            layers = list(range(step - 1, n, step))
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
        if bad:
            raise ConfigTranslationError(f"config.json's moe_layers has {bad[:3]!r}; layer indices 0..{n - 1}")
        pattern = [int(i in layers) for i in range(n)]
        if not any(pattern):
            raise ConfigTranslationError(f"config.json has moe_layers={layers!r}: no layer is a mixture of experts")
        arch["moe_layer_freq"] = 1 if all(pattern) else pattern
        arch[STEP] = step

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["moe_layers"] = [i for i, v in enumerate(moe_pattern(arch)) if v]
        hf["interleave_moe_layer_step"] = arch.get(STEP, 1)


def _derived_layer_types(hf: dict) -> list[str]:
    """``Llama4TextConfig``'s ``layer_types`` without the key: chunked on the RoPE layers while a chunk size is set."""
    n = hf["num_hidden_layers"]
    uses_rope = hf.get("no_rope_layers") or interval_layers(hf.get("no_rope_layer_interval", 4), n)
    chunk = hf.get("attention_chunk_size", 8192)
    return [CHUNKED if use and chunk is not None else FULL for use in uses_rope]


CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("intermediate_size_mlp", "ffn_hidden_size"),  # the dense layers' MLP
    Field("num_hidden_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("num_key_value_heads", "num_query_groups"),
    Field("head_dim", "kv_channels"),
    Field("max_position_embeddings", "max_sequence_length"),
    Field("rms_norm_eps", "layernorm_epsilon"),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=False),
    Field("attention_dropout", "attention_dropout", default=0.0),
    Rope(),
    NoRopeLayers(default_interval=4),
    Field("use_qk_norm", "qk_l2_norm", default=True),  # per layer: the RoPE layers only (layer_spec)
    ChunkedLayerTypes(derive=_derived_layer_types, family="Llama 4"),
    TemperatureTuning(),  # after NoRopeLayers: the no-RoPE layers
    Field("num_local_experts", "num_moe_experts"),
    Field("num_experts_per_tok", "moe_router_topk"),
    Field("intermediate_size", "moe_ffn_hidden_size"),  # every routed expert and the shared one
    Top1SigmoidRouter(),
    MoeLayers(),
    Field("router_aux_loss_coef", "moe_aux_loss_coeff", default=0.0),
    Fixed(
        # attention_bias: transformers' biases on q/k/v and o_proj; megatron-core ties o_proj's to the MLP's
        # router_jitter_noise: noise on the router input in training only, which megatron-core has not
        hf={"hidden_act": "silu", "attention_bias": False, "router_jitter_noise": 0.0},
        mcore={**SWIGLU_RMSNORM, "add_bias_linear": False, "add_qkv_bias": False, "rotary_interleaved": True,
               "moe_router_load_balancing_type": "aux_loss", **MOE_FIXED},
    ),
    # whether transformers returns the router logits: no effect on the logits
    passthrough=("output_router_logits",),
)

L, M = HF_LAYER, MCORE_LAYER


def weights(config) -> WeightMap:
    """Llama's attention rows; the MoE layers' router, stacked experts and shared expert, the dense layers' MLP."""
    experts = int(config.get("num_moe_experts"))
    E, F = M + "mlp.experts.local_experts.{expert}.", L + "feed_forward."
    mlp = on_layers(
        "moe",
        Copy(F + "router.weight", M + "mlp.router.weight"),
        StackedExperts(F + "experts.gate_up_proj", E + "linear_fc1.weight", experts),
        StackedExperts(F + "experts.down_proj", E + "linear_fc2.weight", experts),
        GateUp(F + "shared_expert.{gate,up}_proj.weight", M + "mlp.shared_experts.linear_fc1.weight"),
        Copy(F + "shared_expert.down_proj.weight", M + "mlp.shared_experts.linear_fc2.weight"),
    ) + on_layers("dense", GateUp(F + "{gate,up}_proj.weight", M + "mlp.linear_fc1.weight"),
                  Copy(F + "down_proj.weight", M + "mlp.linear_fc2.weight"))
    return WeightMap(*llama_layout(mlp=mlp))


def layer_spec(config):
    """megatron-core's local spec (MoE and dense layers as ``moe_layer_freq`` says) with the weightless L2 q/k
    norm on the layers with RoPE when ``use_qk_norm``, none on the others."""
    import copy

    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.torch_norm import L2Norm

    from pai_zoo.mcore.specs import block_spec, default_layer_spec, layer_specs, submodules_of

    base = default_layer_spec(config)
    n = int(config.get("num_layers"))
    specs = layer_specs(base)
    specs = specs * n if len(specs) == 1 else specs
    qk_norm = bool(config.get("qk_l2_norm"))
    out = []
    for spec, skip_rope in zip(specs, no_rope_flags(config.arch)):
        spec = copy.deepcopy(spec)
        attention = submodules_of(spec.submodules.self_attention)
        norm = L2Norm if qk_norm and not skip_rope else IdentityOp
        attention.q_layernorm = attention.k_layernorm = norm
        out.append(spec)
    return block_spec(config, out, final_norm=getattr(base, "layer_norm", None))


def _write_toy_tokenizer(folder) -> None:
    from .tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


LLAMA4 = Family(
    name="llama4",
    aliases=("llama4_text", "llama-4"),
    hf_architectures=("Llama4ForCausalLM",),
    model_types=("llama4_text",),
    presets=LLAMA4_PRESETS,
    tiny="llama4-tiny",
    odd="llama4-odd",
    config_map=CONFIG,
    weight_map=weights,
    layer_spec=layer_spec,
    test_tokenizer=_write_toy_tokenizer,
    backends=("local",),  # chunked attention and the query scale are pai-zoo core attentions of the local spec
    description="Llama 4 text (Scout, Maverick: interleaved MoE with a shared expert, chunked attention, "
                "no-RoPE layers with temperature tuning, L2 q/k norm)",
)
