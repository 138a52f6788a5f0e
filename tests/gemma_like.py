"""A Gemma-shaped test family written with the core options only (no layer spec, no model class): zero-centred
RMSNorm (``layernorm_zero_centered_gamma``) and the word-embedding scale (``pai_zoo.embedding_scale``), checked
against transformers' ``GemmaForCausalLM``. Not registered: tests build it directly (the core options' tests,
tests/test_mcore_core_options.py, and the guide's layer-spec example, tests/test_doc_example_plugin.py). The
installed Gemma family is the plugin in plugins/pai-zoo-gemma (the same rules, plus Gemma-2)."""
from __future__ import annotations

from pai_zoo import ConfigMap, Family, Field, Fixed, Rope, WeightMap
from pai_zoo.plugin.config_map import EMBEDDING_SCALE
from pai_zoo.tables.layouts import llama_layout, llama_shape_rules

TINY = dict(
    model_type="gemma", architectures=["GemmaForCausalLM"], vocab_size=301, hidden_size=64, intermediate_size=96,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=512,
    rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=2, eos_token_id=1, pad_token_id=0,
)

CORE = {"layernorm_zero_centered_gamma": True, EMBEDDING_SCALE: "sqrt_hidden_size"}


def config_map(core=CORE) -> ConfigMap:
    return ConfigMap(
        *llama_shape_rules(tie_default=True),
        Field("attention_dropout", "attention_dropout", default=0.0),
        Rope(),
        Fixed(hf={"hidden_act": "gelu_pytorch_tanh", "attention_bias": False},
              mcore={"gated_linear_unit": True, "activation_func": "gelu_tanh", "normalization": "RMSNorm",
                     "add_bias_linear": False, "add_qkv_bias": False, **core}),
        passthrough=("use_bidirectional_attention",),
    )


def family(core=CORE, **fields) -> Family:
    return Family(name="gemma-like", presets={"gemma-like-tiny": TINY}, tiny="gemma-like-tiny",
                  config_map=config_map(core), weight_map=WeightMap(*llama_layout()), model_types=("gemma",),
                  hf_architectures=("GemmaForCausalLM",), **fields)
