"""Qwen3.5 (``qwen3_5``: ``Qwen3_5ForCausalLM``, ``qwen3_5_text``) and Qwen3.5-MoE (``qwen3_5_moe``:
``Qwen3_5MoeForCausalLM``, ``qwen3_5_moe_text``), the language models of Qwen3.5.

Their layers are Qwen3-Next's (:mod:`.qwen3_next`): Gated DeltaNet linear attention and gated full attention in
the ``layer_types`` pattern, zero-centred RMSNorms (the Gated DeltaNet's output norm excepted), a quarter of each
head rotated, per-head q/k norms. Three things differ:

* the Gated DeltaNet's input projection is four tensors, ``in_proj_qkv`` (all query heads, all key heads, all value
  heads: the convolution's channel order), ``in_proj_z``, ``in_proj_b`` and ``in_proj_a``, not Qwen3-Next's
  per-key-head groups. Concatenated they are megatron-core's ``in_proj`` ``[q, k, v, z, beta, alpha]`` as one
  process holds it (the core's :class:`~pai_zoo.tables.mapping.GatedDeltaInProj` with ``separate=True``).
  megatron-core's ``sharded_state_dict`` stores the six parts apart, each split by heads over tensor-parallel ranks
  (rank r: key heads ``r*K/tp ..``, their value heads ``r*V/tp ..``), and the ``conv1d`` channels likewise (q, k, v);
* RoPE is M-RoPE (``mrope_section``, ``mrope_interleaved``): on text, every section sees the same position, so it is
  plain RoPE on the rotated quarter. The two keys are kept (``family.*``) and written back;
* Qwen3.5-MoE's every layer is a MoE layer (no ``intermediate_size``, ``mlp_only_layers`` or ``decoder_sparse_step``)
  and its router always renormalises the top-k weights (no ``norm_topk_prob``).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Family, Field, Rope, Rule, WeightMap
from pai_zoo.layouts import llama_config_rules, llama_megatron_args, llama_shape_rules, moe_config_rules, moe_layout
from pai_zoo.mapping import Ignored
from pai_zoo.plugin.linear_attention import LinearAttentionLayers, MegatronLmGatedDeltaNet
from pai_zoo.tables.linear_layouts import hybrid_layout

from .presets_qwen3_5 import QWEN3_5_MOE_PRESETS, QWEN3_5_PRESETS
from .tokenizer_files import write_qwen2_tokenizer

FAMILY_MROPE = ("family.mrope_section", "family.mrope_interleaved")


class MRopeText(Rule):
    """``rope_parameters.mrope_section`` / ``mrope_interleaved`` of a text-only model: no effect (the sections'
    positions are equal), kept in ``family.*`` keys and written back into ``rope_parameters`` (after
    :class:`~pai_zoo.Rope` wrote it)."""

    hf_keys = ()

    def to_mcore(self, hf: dict, arch: dict) -> None:
        params = hf.get("rope_parameters") or {}
        section = params.get("mrope_section")
        if section is not None:
            rotary = int((hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
                         * params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
            if (not isinstance(section, (list, tuple)) or len(section) != 3
                    or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section)):
                raise ConfigTranslationError(f"rope_parameters.mrope_section={section!r}: Qwen3.5's M-RoPE needs three "
                                             "non-negative integers (temporal, height, width)")
            if sum(section) > rotary // 2:
                raise ConfigTranslationError(f"rope_parameters.mrope_section={list(section)} covers {sum(section)} "
                                             f"frequencies; the rotated {rotary} channels have {rotary // 2}")
        for key, name in zip(FAMILY_MROPE, ("mrope_section", "mrope_interleaved")):
            if name in params:
                arch[key] = list(params[name]) if name == "mrope_section" else params[name]

    def to_hf(self, arch: dict, hf: dict) -> None:
        for key, name in zip(FAMILY_MROPE, ("mrope_section", "mrope_interleaved")):
            if key in arch:
                hf.setdefault("rope_parameters", {})[name] = arch[key]

    def describe(self) -> str:
        return "rope_parameters.mrope_section, mrope_interleaved (text: equal positions, plain RoPE) -> family.*"



class ExpertWidthOnly(Rule):
    """Qwen3.5-MoE has no ``intermediate_size`` (no dense MLP): megatron's ``ffn_hidden_size``, which no layer
    uses, is set to the experts' ``moe_intermediate_size``; nothing is written back."""

    hf_keys = ()

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch["ffn_hidden_size"] = hf["moe_intermediate_size"]

    def to_hf(self, arch: dict, hf: dict) -> None:
        pass

    def describe(self) -> str:
        return "(no intermediate_size) -> ffn_hidden_size = moe_intermediate_size (unused: every layer is MoE)"


#: megatron-core settings of Qwen3-Next's layers, which Qwen3.5's are.
_MCORE = {"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True, "attention_output_gate": True,
          "layernorm_zero_centered_gamma": True}
_HYBRID = (Field("attention_dropout", "attention_dropout", default=0.0), Rope(), MRopeText(),
           LinearAttentionLayers(default_interval=4))

QWEN3_5_CONFIG = ConfigMap(*llama_config_rules(*_HYBRID, head_dim=256, hf_fixed={"attention_bias": False},
                                               mcore_fixed=_MCORE))


def _moe_shape_rules():
    rules = [r for r in llama_shape_rules(head_dim=256) if getattr(r, "hf", None) != "intermediate_size"]
    return [*rules, ExpertWidthOnly()]


QWEN3_5_MOE_CONFIG = ConfigMap(
    *_moe_shape_rules(),
    *_HYBRID,
    # every layer MoE, the top-k always renormalised (Qwen3-VL-MoE's router), a sigmoid-gated shared expert.
    *moe_config_rules(norm_topk=None, shared_ffn="shared_expert_intermediate_size"),
    *llama_config_rules(head_dim=256, hf_fixed={"attention_bias": False}, mcore_fixed=_MCORE)[-1:],
    # output_router_logits: whether transformers returns the router logits (and adds its aux loss).
    passthrough=("output_router_logits",),
)


#: What ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` do not load either (``_keys_to_ignore_on_load_unexpected``):
#: the published checkpoints' multi-token-prediction module and the vision tower.
NOT_LOADED = Ignored(lambda name: name.startswith(("mtp.", "model.visual.")),
                     "Qwen3.5's multi-token-prediction module (mtp.*) and vision tower (model.visual.*), which "
                     "transformers' causal-LM classes do not load either")


def qwen3_5_weights(config) -> WeightMap:
    """Gated attention and Gated DeltaNet (``in_proj_{qkv,z,b,a}``) rows on their layers, a dense SwiGLU MLP."""
    return WeightMap(*hybrid_layout(config, separate=True), NOT_LOADED)


def qwen3_5_moe_weights(config) -> WeightMap:
    """As :func:`qwen3_5_weights`, with Qwen-MoE experts (checkpoint names ``mlp.experts.{e}.*_proj``), the shared
    expert and its gate in every layer."""
    mlp = moe_layout(shared="shared_expert.", shared_gate="shared_expert_gate.weight", dense=None)
    return WeightMap(*hybrid_layout(config, mlp=mlp, separate=True), NOT_LOADED)


_ARGS = dict(qk_layernorm=True, layernorm_zero_centered_gamma=True, attention_output_gate=True,
             experimental_attention_variant="gated_delta_net")

QWEN3_5 = Family(
    name="qwen3_5",
    aliases=("qwen3.5", "qwen3-5"),
    hf_architectures=("Qwen3_5ForCausalLM",),
    model_types=("qwen3_5_text",),
    presets=QWEN3_5_PRESETS,
    tiny="qwen3_5-tiny",
    odd="qwen3_5-odd",
    config_map=QWEN3_5_CONFIG,
    weight_map=qwen3_5_weights,
    megatron_args=llama_megatron_args(**_ARGS),
    megatron_lm_rules=(MegatronLmGatedDeltaNet(),),
    test_tokenizer=write_qwen2_tokenizer,
    description="Qwen3.5 language model (Qwen3_5ForCausalLM): Gated DeltaNet and gated attention layers, dense MLP",
)

QWEN3_5_MOE = Family(
    name="qwen3_5_moe",
    aliases=("qwen3.5-moe", "qwen3_5-moe", "qwen3-5-moe"),
    hf_architectures=("Qwen3_5MoeForCausalLM",),
    model_types=("qwen3_5_moe_text",),
    presets=QWEN3_5_MOE_PRESETS,
    tiny="qwen3_5_moe-tiny",
    odd="qwen3_5_moe-odd",
    config_map=QWEN3_5_MOE_CONFIG,
    weight_map=qwen3_5_moe_weights,
    # Megatron-LM's args of a Qwen3.5-MoE are those of a Qwen3-Next (the differences are HF names and M-RoPE's
    # keys): qwen3_next claims them, --family qwen3_5_moe picks this family.
    megatron_lm_rules=(MegatronLmGatedDeltaNet(),),
    test_tokenizer=write_qwen2_tokenizer,
    description="Qwen3.5-MoE language model (Qwen3_5MoeForCausalLM): Gated DeltaNet and gated attention layers, "
                "routed experts and a gated shared expert in every layer",
)
