"""pai-zoo plugin for BLOOM and BLOOMZ: ALiBi, a LayerNorm on the word embeddings, fused per-head QKV,
tanh GELU, biases everywhere, LayerNorm with bias, tied embeddings."""
from __future__ import annotations

from pai_zoo import ConfigMap, Copy, Family, Field, Fixed, Output, Require, Vocab, WeightMap, hookimpl
from pai_zoo.mcore.alibi import ALIBI

from .presets import PRESETS
from .tokenizer_files import write_test_tokenizer

CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("n_layer", "num_layers"),
    Field("n_head", "num_attention_heads"),
    Field("layer_norm_epsilon", "layernorm_epsilon"),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=True),
    Field("hidden_dropout", "hidden_dropout", default=0.0),
    Field("attention_dropout", "attention_dropout", default=0.0),
    Fixed(
        hf={"apply_residual_connection_post_layernorm": False},
        mcore={
            "position_embedding_type": ALIBI, "normalization": "LayerNorm", "activation_func": "gelu_tanh",
            "gated_linear_unit": False, "add_bias_linear": True, "add_qkv_bias": True,
            "max_sequence_length": 2048,  # BLOOM's training length; ALiBi itself has no position limit
        },
    ),
    Require(lambda hf: hf.get("n_inner") is None, "n_inner must be null: BLOOM's MLP is 4 x hidden_size"),
    # Settings of the original Megatron-DeepSpeed training code and the reference implementation
    # (TP slicing, kernel fusions, precision switches) that do not change the maths.
    passthrough=(
        "pretraining_tp", "slow_but_exact", "n_inner", "unk_token_id", "offset_alibi", "attention_softmax_in_fp32",
        "bias_dropout_fusion", "masked_softmax_fusion", "skip_bias_add", "skip_bias_add_qkv",
    ),
)

L, M = "transformer.h.{layer}.", "decoder.layers.{layer}."

# BLOOM's query_key_value rows are [heads, 3, head_dim]: for each head its query, key and value.
# Megatron's linear_qkv is laid out per query group: the group's queries, then its key, then its
# value; BLOOM is multi-head (a group per head), so the two layouts are the same (a Copy;
# tests/test_bloom.py checks this against the core QKV row).
WEIGHTS = WeightMap(
    Vocab("transformer.word_embeddings.weight", "embedding.word_embeddings.weight"),
    *(
        Copy(f"transformer.word_embeddings_layernorm.{p}", f"embedding.word_embeddings_layernorm.{p}")
        for p in ("weight", "bias")
    ),
    *(Copy(L + f"input_layernorm.{p}", M + f"input_layernorm.{p}") for p in ("weight", "bias")),
    *(
        Copy(L + f"self_attention.query_key_value.{p}", M + f"self_attention.linear_qkv.{p}")
        for p in ("weight", "bias")
    ),
    *(Copy(L + f"self_attention.dense.{p}", M + f"self_attention.linear_proj.{p}") for p in ("weight", "bias")),
    *(Copy(L + f"post_attention_layernorm.{p}", M + f"pre_mlp_layernorm.{p}") for p in ("weight", "bias")),
    *(Copy(L + f"mlp.dense_h_to_4h.{p}", M + f"mlp.linear_fc1.{p}") for p in ("weight", "bias")),
    *(Copy(L + f"mlp.dense_4h_to_h.{p}", M + f"mlp.linear_fc2.{p}") for p in ("weight", "bias")),
    *(Copy(f"transformer.ln_f.{p}", f"decoder.final_layernorm.{p}") for p in ("weight", "bias")),
    Output("lm_head.weight", "output_layer.weight"),
)


def _model_class(config):
    from pai_zoo.mcore.embedding import embedding_norm_gpt_model

    return embedding_norm_gpt_model()


BLOOM = Family(
    name="bloom",
    aliases=("bloomz",),
    hf_architectures=("BloomForCausalLM",),
    model_types=("bloom",),
    presets=PRESETS,
    tiny="bloom-tiny",
    odd="bloom-odd",
    config_map=CONFIG,
    weight_map=WEIGHTS,
    model_class=_model_class,
    test_tokenizer=write_test_tokenizer,
    description="BLOOM and BLOOMZ (ALiBi, embedding LayerNorm)",
)


@hookimpl
def pai_zoo_families():
    return [BLOOM]
