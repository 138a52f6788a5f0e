"""pai-zoo plugin for Galactica and OPT (``OPTForCausalLM``): pre-LayerNorm, learned absolute
positions with OPT's offset of 2, GELU (Galactica) or ReLU (OPT), biases everywhere, tied embeddings."""
from __future__ import annotations

from pai_zoo import QKV, ConfigMap, Copy, Family, Field, Fixed, Output, Require, Vocab, WeightMap, hookimpl
from pai_zoo.config_map import FixedIfPresent, Rule

from .presets import PRESETS
from .tokenizer_files import write_test_tokenizer

ACTIVATIONS = ("gelu", "relu")


class SameAsHidden(Rule):
    """``word_embed_proj_dim`` must equal ``hidden_size``: OPT-350m's ``project_in``/``project_out``
    (embeddings narrower than the layers) are not supported."""

    hf_keys = ("word_embed_proj_dim",)

    def describe(self) -> str:
        return "requires word_embed_proj_dim == hidden_size (no project_in/project_out)"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        from pai_zoo import ConfigTranslationError

        dim = hf.get("word_embed_proj_dim")
        if dim is not None and dim != hf["hidden_size"]:
            raise ConfigTranslationError(
                f"word_embed_proj_dim={dim} != hidden_size={hf['hidden_size']}: OPT-350m-style project_in/project_out "
                "(embeddings narrower than the layers) are not supported")

    def to_hf(self, arch: dict, hf: dict) -> None:
        hf["word_embed_proj_dim"] = arch["hidden_size"]


CONFIG = ConfigMap(
    Require(
        lambda hf: hf.get("do_layer_norm_before", True),
        "do_layer_norm_before=false (OPT-350m's post-LayerNorm layers) is not supported: "
        "only pre-LayerNorm OPT/Galactica",
    ),
    SameAsHidden(),
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    Field("ffn_dim", "ffn_hidden_size"),
    Field("num_hidden_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("max_position_embeddings", "max_sequence_length"),  # the model class adds OPT's 2 offset rows
    Field("tie_word_embeddings", "share_embeddings_and_output_weights"),
    Field("dropout", "hidden_dropout"),
    Field("attention_dropout", "attention_dropout"),
    Field("activation_function", "activation_func"),
    Require(
        lambda hf: hf.get("activation_function", "relu") in ACTIVATIONS,
        f"activation_function must be one of {ACTIVATIONS} (Galactica: gelu, OPT: relu)",
    ),
    Fixed(
        hf={
            "do_layer_norm_before": True,
            "_remove_final_layer_norm": False,
            "enable_bias": True,
            "layer_norm_elementwise_affine": True,
            "layerdrop": 0.0,
        },
        mcore={
            "normalization": "LayerNorm",
            "layernorm_epsilon": 1e-5,
            "gated_linear_unit": False,
            "add_bias_linear": True,
            "add_qkv_bias": True,
            "position_embedding_type": "learned_absolute",
        },
    ),
    # Keys of Galactica's config.json that transformers' OPT ignores; other values would change the model.
    FixedIfPresent("learned_embeddings", True, "Galactica/OPT learn their position embeddings"),
    FixedIfPresent("scale_embeddings", False, "transformers' OPT does not scale the embeddings"),
    FixedIfPresent("activation_dropout", 0.0, "megatron-core has no dropout after the MLP activation"),
    passthrough=("init_std",),
)

D, L, M = "model.decoder.", "model.decoder.layers.{layer}.", "decoder.layers.{layer}."


def _pair(hf: str, mcore: str) -> list[Copy]:
    return [Copy(f"{hf}.weight", f"{mcore}.weight"), Copy(f"{hf}.bias", f"{mcore}.bias")]


WEIGHTS = WeightMap(
    Vocab(D + "embed_tokens.weight", "embedding.word_embeddings.weight"),
    Copy(D + "embed_positions.weight", "embedding.position_embeddings.weight"),  # all max_positions + 2 rows
    *_pair(L + "self_attn_layer_norm", M + "input_layernorm"),
    QKV(L + "self_attn.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
    QKV(L + "self_attn.{q,k,v}_proj.bias", M + "self_attention.linear_qkv.bias"),
    *_pair(L + "self_attn.out_proj", M + "self_attention.linear_proj"),
    *_pair(L + "final_layer_norm", M + "pre_mlp_layernorm"),
    *_pair(L + "fc1", M + "mlp.linear_fc1"),
    *_pair(L + "fc2", M + "mlp.linear_fc2"),
    *_pair(D + "final_layer_norm", "decoder.final_layernorm"),
    Output("lm_head.weight", "output_layer.weight"),
)


def _model_class(config):
    from .model import offset_position_gpt_model

    return offset_position_gpt_model()


GALACTICA = Family(
    name="galactica",
    aliases=("opt",),
    hf_architectures=("OPTForCausalLM",),
    model_types=("opt",),
    presets=PRESETS,
    tiny="galactica-tiny",
    odd="galactica-odd",
    config_map=CONFIG,
    weight_map=WEIGHTS,
    model_class=_model_class,
    test_tokenizer=write_test_tokenizer,
    description="Galactica (125m-120b) and pre-LayerNorm OPT",
)


@hookimpl
def pai_zoo_families():
    return [GALACTICA]
