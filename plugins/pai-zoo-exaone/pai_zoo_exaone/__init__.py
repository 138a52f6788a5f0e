"""pai-zoo plugin for LG AI Research's EXAONE 4.0 (``exaone4``, ``Exaone4ForCausalLM``), written against pai-zoo's
public API only (config rules, a weight table, the core's options and modules).

EXAONE 4.0 is the Llama layout (SwiGLU, GQA, an explicit ``head_dim``, no biases) with:

* its norms after attention and MLP instead of before (``post_attention_layernorm`` on the attention output,
  ``post_feedforward_layernorm`` on the MLP output, no input norms): the core's ``pai_zoo.norm_placement``
  ``"post"`` (:mod:`pai_zoo.mcore.post_norm`), as OLMo-2;
* per-head q/k RMSNorms before RoPE: megatron-core's ``qk_layernorm``;
* sliding-window and full-attention layers (``layer_types``, ``sliding_window_pattern`` such as ``"LLLG"``):
  :class:`pai_zoo.plugin.layer_pattern.LayerTypes`, megatron-core's ``window_size`` and ``window_attn_skip_freq``;
* no RoPE on the full-attention layers when a sliding window is set (transformers rotates q and k only
  ``if self.sliding_window is None or self.is_sliding``): :class:`pai_zoo.plugin.no_rope.NoRopeOnFullLayers`,
  megatron-core's ``no_rope_freq``. Without a window (EXAONE-4.0-1.2B) every layer is full and keeps RoPE.
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, Family, Field, Rope, WeightMap, hookimpl
from pai_zoo.config_map import NORM_PLACEMENT
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_config_rules, llama_layout
from pai_zoo.plugin.layer_pattern import FULL, SLIDING, LayerTypes
from pai_zoo.plugin.no_rope import NoRopeOnFullLayers

from .presets import PRESETS
from .tokenizer_files import write_exaone_tokenizer

L, M = HF_LAYER, MCORE_LAYER


class Exaone4LayerTypes(LayerTypes):
    """:class:`LayerTypes` as ``Exaone4Config`` reads them: without a window (``sliding_window`` null) every layer is
    full (transformers sets ``sliding_window_pattern`` 0 and needs ``layer_types`` then), and a sliding layer needs a
    window."""

    def _types(self, hf: dict) -> list[str] | None:
        if hf.get("sliding_window", self.default_window) is None:
            types = hf.get("layer_types")
            if types is None:
                return [FULL] * hf["num_hidden_layers"]
            if SLIDING in types:
                raise ConfigTranslationError(
                    f"config.json's layer_types has {SLIDING!r} with sliding_window=None; EXAONE 4 needs a "
                    "sliding_window for its sliding layers (or every layer 'full_attention')")
        return super()._types(hf)


def _config() -> ConfigMap:
    return ConfigMap(*llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        # Exaone4Config: sliding_window 4096 and every 4th layer full when the keys are absent
        Exaone4LayerTypes(default_pattern=4, default_window=4096, family="EXAONE 4"),
        NoRopeOnFullLayers(),  # after the layer pattern it reads
        # head_dim: Exaone4Config declares none; its attention reads config.json's (else hidden / heads)
        head_dim=None, tie_default=False,
        mcore_fixed={"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True, NORM_PLACEMENT: "post"},
    ))


CONFIG = _config()


def exaone4_weights(config) -> WeightMap:
    """The Llama layout's table without the input norms; ``post_attention_layernorm`` is the norm on the attention
    output (megatron: on ``linear_proj``'s output), ``post_feedforward_layernorm`` the one on the MLP output, and the
    q/k norms are ``head_dim`` wide."""
    rows = [r for r in llama_layout() if not any("layernorm" in name for name in r.hf)]
    return WeightMap(
        *rows,
        Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
        Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "self_attention.linear_proj.post_layernorm.weight"),
        Copy(L + "post_feedforward_layernorm.weight", M + "mlp.linear_fc2.post_layernorm.weight"),
    )


EXAONE4 = Family(
    name="exaone4",
    aliases=("exaone-4", "exaone-4.0"),
    hf_architectures=("Exaone4ForCausalLM",),
    model_types=("exaone4",),
    presets=PRESETS,
    tiny="exaone4-tiny",
    odd="exaone4-odd",
    config_map=CONFIG,
    weight_map=exaone4_weights,
    test_tokenizer=write_exaone_tokenizer,
    # no Megatron-LM args claim: its args keep one window_size but not which layers it is on, nor the post norms
    # or the RoPE-less layers (megatron_lm_caveats names them); such a checkpoint is read with --family exaone4
    backends=("local",),  # the post norms are pai-zoo modules of the local spec
    description="EXAONE 4.0 (Exaone4ForCausalLM: EXAONE-4.0 1.2B, 32B): norms after attention and MLP, per-head "
                "q/k norms, sliding/full layers without RoPE on the full ones",
)


@hookimpl
def pai_zoo_families():
    return [EXAONE4]
