"""pai-zoo plugin for ChatGLM2-6B and ChatGLM3-6B: RMSNorm, multi-query groups with a fused [q; k; v] projection
and q/k/v bias, rotary embeddings on half of each head applied to interleaved pairs, SwiGLU, untied output."""
from __future__ import annotations

from pathlib import Path

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Dropped,
    Family,
    Field,
    Fixed,
    FusedQKV,
    Output,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import Rule
from pai_zoo.family import LazyClass

from .presets import PRESETS
from .tokenizer import write_test_tokenizer

#: ChatGLM's rotary base before ``rope_ratio`` scales it (ChatGLM3: ``base = 10000 * rope_ratio``).
ROPE_BASE = 10000.0


class QueryGroups(Rule):
    """``multi_query_attention`` + ``multi_query_group_num`` <-> ``num_query_groups`` (one per head without
    multi-query attention)."""

    hf_keys = ("multi_query_attention", "multi_query_group_num")

    def to_mcore(self, hf, arch):
        heads = hf["num_attention_heads"]
        groups = hf.get("multi_query_group_num", 1) if hf.get("multi_query_attention", False) else heads
        if heads % groups:
            raise ConfigTranslationError(
                f"num_attention_heads={heads} is not a multiple of multi_query_group_num={groups}"
            )
        arch["num_query_groups"] = groups

    def to_hf(self, arch, hf):
        groups = arch["num_query_groups"]
        grouped = groups != arch["num_attention_heads"]
        hf["multi_query_attention"] = grouped
        hf["multi_query_group_num"] = groups if grouped else 1

    def describe(self):
        return "multi_query_attention, multi_query_group_num -> num_query_groups"


CONFIG = ConfigMap(
    Field("padded_vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("ffn_hidden_size", "ffn_hidden_size"),
    Field("num_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("kv_channels", "kv_channels"),
    QueryGroups(),
    Field("seq_length", "max_sequence_length"),
    Field("layernorm_epsilon", "layernorm_epsilon"),
    Field("add_bias_linear", "add_bias_linear", default=False),
    Field("add_qkv_bias", "add_qkv_bias", default=False),
    Field("hidden_dropout", "hidden_dropout", default=0.0),
    Field("attention_dropout", "attention_dropout", default=0.0),
    # ChatGLM3 (and the 32k model) scale the rotary base: theta_i = (10000 * rope_ratio) ** (-2i / d).
    Field("rope_ratio", "rotary_base", default=1, encode=lambda r: ROPE_BASE * r, decode=lambda b: b / ROPE_BASE),
    Fixed(
        hf={"rmsnorm": True, "post_layer_norm": True, "apply_residual_connection_post_layernorm": False,
            "original_rope": True, "tie_word_embeddings": False, "quantization_bit": 0, "pre_seq_len": None,
            "prefix_projection": False},
        mcore={"normalization": "RMSNorm", "gated_linear_unit": True, "activation_func": "silu",
               "position_embedding_type": "rope", "rotary_percent": 0.5, "rotary_interleaved": True,
               "share_embeddings_and_output_weights": False},
    ),
    # Half-precision numerics switches (same maths in float32), a fused kernel, and the unused classifier head.
    passthrough=("apply_query_key_layer_scaling", "attention_softmax_in_fp32", "fp32_residual_connection",
                 "bias_dropout_fusion", "classifier_dropout"),
)

T, M = "transformer.", "decoder.layers.{layer}."
L = T + "encoder.layers.{layer}."


def weights(config) -> WeightMap:
    """ChatGLM's table; biases where the config has them."""
    rows = [
        Vocab(T + "embedding.word_embeddings.weight", "embedding.word_embeddings.weight"),
        Copy(L + "input_layernorm.weight", M + "input_layernorm.weight"),
        FusedQKV(L + "self_attention.query_key_value.weight", M + "self_attention.linear_qkv.weight"),
        Copy(L + "self_attention.dense.weight", M + "self_attention.linear_proj.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        Copy(L + "mlp.dense_h_to_4h.weight", M + "mlp.linear_fc1.weight"),  # [gate; up], as megatron's
        Copy(L + "mlp.dense_4h_to_h.weight", M + "mlp.linear_fc2.weight"),
        Copy(T + "encoder.final_layernorm.weight", "decoder.final_layernorm.weight"),
        Output(T + "output_layer.weight", "output_layer.weight"),
        Dropped(T + "rotary_pos_emb.inv_freq"),  # a buffer of the published checkpoints, recomputed
    ]
    if config.get("add_bias_linear") or config.get("add_qkv_bias"):
        rows.append(FusedQKV(L + "self_attention.query_key_value.bias", M + "self_attention.linear_qkv.bias"))
    if config.get("add_bias_linear"):
        rows += [
            Copy(L + "self_attention.dense.bias", M + "self_attention.linear_proj.bias"),
            Copy(L + "mlp.dense_h_to_4h.bias", M + "mlp.linear_fc1.bias"),
            Copy(L + "mlp.dense_4h_to_h.bias", M + "mlp.linear_fc2.bias"),
        ]
    return WeightMap(*rows)


CHATGLM = Family(
    name="chatglm",
    aliases=("chatglm2", "chatglm3"),
    hf_architectures=("ChatGLMModel", "ChatGLMForConditionalGeneration"),
    model_types=("chatglm",),
    presets=PRESETS,
    tiny="chatglm-tiny",
    odd="chatglm-odd",
    config_map=CONFIG,
    weight_map=weights,
    hf_model_class=LazyClass("pai_zoo_chatglm.modeling:ChatGLMForConditionalGeneration"),
    hf_config_class=LazyClass("pai_zoo_chatglm.modeling:ChatGLMConfig"),
    test_tokenizer=write_test_tokenizer,
    description="ChatGLM2-6B, ChatGLM3-6B (reference HF model in the plugin)",
)


@hookimpl
def pai_zoo_families():
    return [CHATGLM]


@hookimpl
def pai_zoo_tokenizer(family, path):
    """ChatGLM's SentencePiece ``tokenizer.model`` with its special tokens and ``[gMASK] sop`` prefix."""
    if family.name != "chatglm":
        return None
    path = Path(path)
    model = path / "tokenizer.model" if path.is_dir() else path
    if model.suffix != ".model" or not model.is_file():
        raise FileNotFoundError(f"no ChatGLM tokenizer.model at {path}")
    from .tokenizer import ChatGLMTokenizer

    return ChatGLMTokenizer(model)
