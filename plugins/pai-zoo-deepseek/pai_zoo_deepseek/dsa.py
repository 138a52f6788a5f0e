"""DeepSeek Sparse Attention families: DeepSeek-V3.2 (``DeepseekV32ForCausalLM``) here, and the parts GLM-5
(``GlmMoeDsaForCausalLM``, in pai-zoo-glm) shares with it.

DeepSeek-V3.2 is DeepSeek-V3 (MLA with q LoRA, sigmoid-routed experts with expert bias, first-k dense layers,
MTP) plus a lightning indexer in every attention that keeps each query's ``index_topk`` best keys
(:mod:`pai_zoo.mcore.sparse_attention`). Its config and weights are DeepSeek-V3's plus the indexer's
(:class:`~pai_zoo.plugin.sparse_attention.IndexerRule`; rows ``self_attn.indexer.{wq_b, wk, k_norm, weights_proj}``
-> megatron-core's ``self_attention.core_attention.indexer.{linear_wq_b, linear_wk, k_norm, linear_weights_proj}``,
all copied, whole on every tensor-parallel rank as megatron-core's ``DSAIndexer`` holds them).
"""
from __future__ import annotations

from pai_zoo import ConfigMap, ConfigTranslationError, Copy, Family, Fixed, Rule, WeightMap
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER
from pai_zoo.plugin.sparse_attention import ROPE_INTERLEAVED, IndexerRule, indexer_layers

from . import DEEPSEEK_V3_CONFIG, deepseek_weights, layer_spec, megatron_lm
from .presets_dsa import V32_PRESETS
from .tokenizer_files import write_deepseek_tokenizer

__all__ = ["DEEPSEEK_V32", "DEEPSEEK_V32_CONFIG", "MlpLayerTypes", "dsa_config_map", "dsa_layer_spec",
           "dsa_weights"]

#: transformers' indexer tensors (under ``self_attn.indexer.``) -> megatron-core's (under
#: ``self_attention.core_attention.indexer.``).
INDEXER_ROWS = {"wq_b.weight": "linear_wq_b.weight", "wk.weight": "linear_wk.weight",
                "k_norm.weight": "k_norm.weight", "k_norm.bias": "k_norm.bias",
                "weights_proj.weight": "linear_weights_proj.weight"}


class MlpLayerTypes(Rule):
    """``mlp_layer_types`` (``dense`` / ``sparse`` per layer), which transformers' V3.2 and GLM-5 configs derive
    from ``first_k_dense_replace``: it must be that pattern (megatron-core's ``moe_layer_freq``); written back
    so. A q LoRA is required (transformers' sparse-attention MLA has no plain ``q_proj``)."""

    hf_keys = ("mlp_layer_types",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if hf.get("q_lora_rank") is None:
            raise ConfigTranslationError("q_lora_rank is null: the sparse-attention MLA of transformers has a "
                                         "q LoRA (q_a_proj, q_b_proj) only")
        types = hf.get("mlp_layer_types")
        if types is not None and list(types) != self._derived(arch):
            raise ConfigTranslationError(f"mlp_layer_types={types!r}: the dense layers must be the first "
                                         "first_k_dense_replace layers (megatron-core's moe_layer_freq)")

    @staticmethod
    def _derived(arch: dict) -> list[str]:
        freq = arch.get("moe_layer_freq", 1)
        pattern = freq if isinstance(freq, list) else [1] * int(arch["num_layers"])
        return ["sparse" if kind else "dense" for kind in pattern]

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["mlp_layer_types"] = self._derived(arch)

    def describe(self) -> str:
        return "mlp_layer_types: dense for the first first_k_dense_replace layers, then sparse"


def dsa_config_map(base: ConfigMap, interleaved: bool, shared: bool, family: str) -> ConfigMap:
    """``base`` (DeepSeek-V3's rules) plus the indexer's, ``mlp_layer_types`` and ``mlp_bias`` (False)."""
    return ConfigMap(*base.rules, IndexerRule(interleaved, shared, family), MlpLayerTypes(),
                     Fixed(hf={"mlp_bias": False}), passthrough=tuple(base.passthrough))


def dsa_weights(config) -> WeightMap:
    """DeepSeek-V3's table (:func:`pai_zoo_deepseek.deepseek_weights`) plus the indexer's rows, on every layer or
    (GLM-5's shared layers) on the layers that run an indexer."""
    base = deepseek_weights(config)
    layers = indexer_layers(config.arch)
    hf, mcore = HF_LAYER + "self_attn.indexer.", MCORE_LAYER + "self_attention.core_attention.indexer."
    if all(layers):
        rows = [Copy(hf + a, mcore + b) for a, b in INDEXER_ROWS.items()]
    else:
        rows = [Copy((hf + a).format(layer=i), (mcore + b).format(layer=i))
                for i, full in enumerate(layers) if full for a, b in INDEXER_ROWS.items()]
    return WeightMap(*base.rows, *rows, mtp=base.mtp)


def dsa_layer_spec(config):
    """pai_zoo_deepseek's layer spec with :class:`~pai_zoo_deepseek.sparse.DeepseekSparseMLA`: per layer, its own
    indexer or (a shared layer) the top-k of the nearest full layer before it."""
    import copy

    from pai_zoo.mcore.specs import layer_specs

    from .sparse import DeepseekSparseMLA, sparse_core_attention

    block = layer_spec(config)
    interleaved = bool(config.get(ROPE_INTERLEAVED))
    source, specs = None, []
    for number, (spec, full) in enumerate(zip(layer_specs(block), indexer_layers(config.arch)), start=1):
        spec = copy.copy(spec)
        spec.submodules = copy.copy(spec.submodules)
        attention = copy.copy(spec.submodules.self_attention)
        attention.submodules = copy.copy(attention.submodules)
        attention.module = DeepseekSparseMLA
        source = number if full else source
        attention.submodules.core_attention = sparse_core_attention(interleaved, None if full else source)
        spec.submodules.self_attention = attention
        specs.append(spec)
    block.layer_specs = specs
    return block


#: DeepSeek-V3's rules with the indexer's (half-split RoPE, an indexer in every layer).
DEEPSEEK_V32_CONFIG = dsa_config_map(DEEPSEEK_V3_CONFIG, interleaved=False, shared=False, family="DeepSeek-V3.2")

DEEPSEEK_V32 = Family(
    name="deepseek-v32",
    aliases=("deepseek_v32", "deepseek-v3.2"),
    hf_architectures=("DeepseekV32ForCausalLM",),
    model_types=("deepseek_v32",),
    presets=V32_PRESETS,
    tiny="deepseek-v32-tiny",
    odd="deepseek-v32-odd",
    config_map=DEEPSEEK_V32_CONFIG,
    weight_map=dsa_weights,
    layer_spec=dsa_layer_spec,
    test_tokenizer=write_deepseek_tokenizer,
    description="DeepSeek-V3.2 (DeepseekV32ForCausalLM): DeepSeek-V3 with DeepSeek Sparse Attention (a lightning "
                "indexer keeps each query's index_topk keys)",
    megatron_args=megatron_lm.claims("sigmoid", "dsa"),
    megatron_lm_rules=(megatron_lm.MegatronLmMla("dsa"), megatron_lm.MegatronLmIndexer()),
)
