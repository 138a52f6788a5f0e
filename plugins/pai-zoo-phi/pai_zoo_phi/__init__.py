"""pai-zoo plugin for Phi-3 and Phi-4 (``Phi3ForCausalLM``), written against pai-zoo's public API only.

Phi-3 is the Llama layout (RMSNorm, SwiGLU, GQA, an untied head) with fused projections: ``qkv_proj`` holds all
query heads, then all key heads, then all value heads (the core's :class:`~pai_zoo.FusedQKV` row regroups them per
query group), and ``gate_up_proj`` is ``[gate; up]``, megatron's ``linear_fc1`` layout already (a :class:`Copy`).
RoPE may rotate part of each head (``partial_rotary_factor``), and ``rope_type: longrope`` (Phi-3-mini-128k,
Phi-3.5) is the core :class:`~pai_zoo.Rope` rule's LongRoPE: the short or long factors chosen by the running length
at every forward, with the attention factor (:mod:`pai_zoo.mcore.rope`). ``sliding_window`` is megatron-core's
``window_size``; ``resid_pdrop`` its ``hidden_dropout`` (megatron-core also drops the embeddings with it, which
transformers' Phi-3 does not: training only).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, Copy, Family, Field, FusedQKV, Rope, Rule, WeightMap, hookimpl
from pai_zoo.config_map import FAMILY_KEY_PREFIX, sliding_window
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_layout

from .presets import PRESETS

#: arch key: the source config had ``partial_rotary_factor`` at its top level too (written back there).
TOP_PARTIAL = FAMILY_KEY_PREFIX + "top_level_partial_rotary_factor"


class TopLevelPartialRotary(Rule):
    """Phi-3 configs may repeat ``partial_rotary_factor`` at the top level beside ``rope_parameters`` (the
    :class:`Rope` rule reads and consumes it); this writes it back there when the source had it."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if hf.get("partial_rotary_factor") is not None:
            arch[TOP_PARTIAL] = True

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get(TOP_PARTIAL):
            hf["partial_rotary_factor"] = arch.get("rotary_percent", 1.0)

    def describe(self) -> str:
        return "partial_rotary_factor at the top level: kept as the source had it"


CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Field("resid_pdrop", "hidden_dropout", default=0.0),
        # the pretraining length: LongRoPE's switch point (read by the Rope rule, which prefers it as transformers)
        Field("original_max_position_embeddings", FAMILY_KEY_PREFIX + "original_max_position_embeddings",
              default=4096),
        sliding_window(),
        Rope(),
        TopLevelPartialRotary(),
        head_dim=None,  # Phi3Config has no head_dim field; a given one is read (getattr)
        tie_default=False,
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False},
    ),
    passthrough=("embd_pdrop",),  # transformers 5's Phi-3 reads no embedding dropout
)

L, M = HF_LAYER, MCORE_LAYER

WEIGHTS = WeightMap(*llama_layout(
    qkv=FusedQKV(L + "self_attn.qkv_proj.weight", M + "self_attention.linear_qkv.weight"),
    fc1=Copy(L + "mlp.gate_up_proj.weight", M + "mlp.linear_fc1.weight"),  # [gate; up], as megatron's
))


def _write_toy_tokenizer(folder) -> None:
    from pai_zoo_llama.tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


PHI3 = Family(
    name="phi3",
    aliases=("phi-3", "phi4"),
    hf_architectures=("Phi3ForCausalLM",),
    model_types=("phi3",),
    presets=PRESETS,
    tiny="phi3-tiny",
    odd="phi3-odd",
    config_map=CONFIG,
    weight_map=WEIGHTS,
    test_tokenizer=_write_toy_tokenizer,
    description="Phi-3 and Phi-4 (Phi3ForCausalLM: Phi-3-mini/medium 4k and 128k, phi-4; fused qkv and gate/up, "
                "LongRoPE)",
)


@hookimpl
def pai_zoo_families():
    return [PHI3]
