"""pai-zoo plugin for StarCoder (GPTBigCode: multi-query attention, learned positions) and StarCoder2 (GQA,
RoPE, sliding window). Both: LayerNorm with bias, biases on every linear layer, GELU (tanh) MLP."""
from __future__ import annotations

from pai_zoo import (
    QKV,
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    Output,
    Require,
    Rope,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import Rule, sliding_window

from .presets import STARCODER2_PRESETS, STARCODER_PRESETS
from .tokenizer_files import TEST_TOKENIZERS

#: HF activation name <-> pai-zoo's megatron-core activation name.
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _encode_act(name):
    if name not in _ACTIVATIONS:
        raise ConfigTranslationError(f"activation {name!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _activation(hf_key: str) -> Field:
    return Field(
        hf_key, "activation_func", encode=_encode_act, decode={v: k for k, v in _ACTIVATIONS.items()}.__getitem__
    )


def _dropout(hf_keys: tuple[str, str]) -> tuple:
    """Two HF dropout rates that megatron-core applies as one (``hidden_dropout``: embeddings and residuals)."""
    a, b = hf_keys
    return (
        Require(lambda hf: hf.get(a, 0.0) == hf.get(b, 0.0),
                f"megatron-core uses one rate (hidden_dropout) for {a} and {b}: they must be equal"),
        Field(a, "hidden_dropout", default=0.0),
        Field(b, "hidden_dropout", default=0.0),
    )


class MultiQuery(Rule):
    """GPTBigCode's ``multi_query`` (one key/value head, else one per query head) <-> ``num_query_groups``.
    transformers also stores the derived ``num_key_value_heads``."""

    hf_keys = ("multi_query", "num_key_value_heads")

    def to_mcore(self, hf, arch):
        heads = hf["n_head"]
        groups = 1 if hf.get("multi_query", True) else heads
        if hf.get("num_key_value_heads", groups) != groups:
            raise ConfigTranslationError(f"num_key_value_heads={hf['num_key_value_heads']} contradicts "
                                         f"multi_query={hf.get('multi_query', True)} with n_head={heads}")
        arch["num_query_groups"] = groups

    def to_hf(self, arch, hf):
        groups, heads = arch["num_query_groups"], arch["num_attention_heads"]
        if groups not in (1, heads):
            raise ConfigTranslationError(f"GPTBigCode has 1 or n_head key/value heads, not {groups}")
        hf["multi_query"] = groups == 1
        hf["num_key_value_heads"] = groups

    def describe(self):
        return "multi_query -> num_query_groups (1, else n_head)"


STARCODER_CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("n_embd", "hidden_size"),
    Field("n_inner", "ffn_hidden_size", default=None),  # None: megatron-core's and GPTBigCode's 4 x hidden
    Field("n_layer", "num_layers"),
    Field("n_head", "num_attention_heads"),
    MultiQuery(),
    Field("n_positions", "max_sequence_length"),
    Field("layer_norm_epsilon", "layernorm_epsilon"),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=True),
    Field("attn_pdrop", "attention_dropout", default=0.0),
    *_dropout(("resid_pdrop", "embd_pdrop")),
    _activation("activation_function"),
    Fixed(
        hf={"scale_attn_weights": True},
        mcore={"position_embedding_type": "learned_absolute", "normalization": "LayerNorm",
               "add_bias_linear": True, "gated_linear_unit": False},
    ),
    # Softmax precision switches (half-precision numerics only) and the original inference runner's settings.
    passthrough=("attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "inference_runner",
                 "max_batch_size", "max_sequence_length", "pad_key_length", "pre_allocate_kv_cache",
                 "validate_runner_input"),
)

STARCODER2_CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("intermediate_size", "ffn_hidden_size"),
    Field("num_hidden_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("num_key_value_heads", "num_query_groups"),
    Field("max_position_embeddings", "max_sequence_length"),
    Field("norm_epsilon", "layernorm_epsilon"),
    Field("use_bias", "add_bias_linear", default=True),  # megatron's linear_qkv follows add_bias_linear
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=True),
    Field("attention_dropout", "attention_dropout", default=0.0),
    *_dropout(("residual_dropout", "embedding_dropout")),
    _activation("hidden_act"),
    sliding_window(),
    Rope(),
    Fixed(hf={"mlp_type": "default", "norm_type": "layer_norm"},
          mcore={"normalization": "LayerNorm", "gated_linear_unit": False}),
)


def starcoder_weights(config) -> WeightMap:
    """GPTBigCode's table. ``c_attn`` is ``[q (all heads); k; v]`` with one key/value head (multi-query), or
    ``[q_h; k_h; v_h]`` per head (multi-head): in both cases megatron's own per-group layout, so a plain copy."""
    L, M = "transformer.h.{layer}.", "decoder.layers.{layer}."
    rows = [
        Vocab("transformer.wte.weight", "embedding.word_embeddings.weight"),
        Copy("transformer.wpe.weight", "embedding.position_embeddings.weight"),
        Copy("transformer.ln_f.weight", "decoder.final_layernorm.weight"),
        Copy("transformer.ln_f.bias", "decoder.final_layernorm.bias"),
        Output("lm_head.weight", "output_layer.weight"),
    ]
    for hf, mcore in (("ln_1", "input_layernorm"), ("attn.c_attn", "self_attention.linear_qkv"),
                      ("attn.c_proj", "self_attention.linear_proj"), ("ln_2", "pre_mlp_layernorm"),
                      ("mlp.c_fc", "mlp.linear_fc1"), ("mlp.c_proj", "mlp.linear_fc2")):
        rows += [Copy(f"{L}{hf}.{p}", f"{M}{mcore}.{p}") for p in ("weight", "bias")]
    return WeightMap(*rows)


def starcoder2_weights(config) -> WeightMap:
    """StarCoder2's table; biases only where ``use_bias`` is set."""
    L, M = "model.layers.{layer}.", "decoder.layers.{layer}."
    params = ("weight", "bias") if config.get("add_bias_linear") else ("weight",)
    rows = [
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy("model.norm.weight", "decoder.final_layernorm.weight"),
        Copy("model.norm.bias", "decoder.final_layernorm.bias"),
        Output("lm_head.weight", "output_layer.weight"),
    ]
    for norm_hf, norm_mcore in (
        ("input_layernorm", "input_layernorm"),
        ("post_attention_layernorm", "pre_mlp_layernorm"),
    ):
        rows += [Copy(f"{L}{norm_hf}.{p}", f"{M}{norm_mcore}.{p}") for p in ("weight", "bias")]
    for p in params:
        rows += [
            QKV(L + "self_attn.{q,k,v}_proj." + p, f"{M}self_attention.linear_qkv.{p}"),
            Copy(f"{L}self_attn.o_proj.{p}", f"{M}self_attention.linear_proj.{p}"),
            Copy(f"{L}mlp.c_fc.{p}", f"{M}mlp.linear_fc1.{p}"),
            Copy(f"{L}mlp.c_proj.{p}", f"{M}mlp.linear_fc2.{p}"),
        ]
    return WeightMap(*rows)


STARCODER = Family(
    name="starcoder",
    aliases=("gpt_bigcode", "gpt-bigcode", "starcoderbase", "santacoder"),
    hf_architectures=("GPTBigCodeForCausalLM",),
    model_types=("gpt_bigcode",),
    presets=STARCODER_PRESETS,
    tiny="starcoder-tiny",
    odd="starcoder-odd",
    config_map=STARCODER_CONFIG,
    weight_map=starcoder_weights,
    test_tokenizer=TEST_TOKENIZERS["starcoder"],
    description="StarCoder / StarCoderBase (GPTBigCode: multi-query attention, learned positions)",
)

STARCODER2 = Family(
    name="starcoder2",
    aliases=("starcoder-2",),
    hf_architectures=("Starcoder2ForCausalLM",),
    model_types=("starcoder2",),
    presets=STARCODER2_PRESETS,
    tiny="starcoder2-tiny",
    odd="starcoder2-odd",
    config_map=STARCODER2_CONFIG,
    weight_map=starcoder2_weights,
    test_tokenizer=TEST_TOKENIZERS["starcoder2"],
    description="StarCoder2 (GQA, RoPE, sliding window)",
)


@hookimpl
def pai_zoo_families():
    return [STARCODER, STARCODER2]
