"""pai-zoo plugin for Llama 1/2/3.x and Mistral: RMSNorm, RoPE (with llama3 scaling), SwiGLU, GQA; and Mixtral
(``MixtralForCausalLM``), the Mistral layout with a mixture of experts as every layer's MLP."""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    Family,
    Field,
    Require,
    Rope,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import sliding_window
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    llama_config_rules,
    llama_layout,
    llama_megatron_args,
    llama_table,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
)

from .presets import MIXTRAL_PRESETS, PRESETS

CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_bias", "add_qkv_bias", default=False),
        Field("mlp_bias", "add_bias_linear", default=False),
        Field("attention_dropout", "attention_dropout", default=0.0),
        sliding_window(),
        Rope(),
        Require(lambda hf: hf.get("attention_bias", False) == hf.get("mlp_bias", False),
                "megatron-core has one bias switch for o_proj and the MLP: attention_bias and mlp_bias must be equal"),
    ),
    passthrough=("pretraining_tp",),  # a slicing trick of the original training code; same maths
)

L, M = HF_LAYER, MCORE_LAYER


#: The Llama table with the bias rows the config switches on.
weights = llama_table


def _write_toy_tokenizer(folder) -> None:
    from .tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


def _write_mistral_tokenizer(folder) -> None:
    # Mistral-7B-v0.1's own tokenizer.model (from mistral-common): the tokenizer of the mistral-7b preset only.
    # Llama-2's 32000 pieces are other pieces, Llama-3's are 128256 tiktoken ranks: none bundled for those.
    from .tokenizer_files import write_test_tokenizer

    write_test_tokenizer(folder)


LLAMA = Family(
    name="llama",
    aliases=("llama1", "llama2", "llama3", "llama3.1", "llama3.2", "mistral"),
    hf_architectures=("LlamaForCausalLM", "MistralForCausalLM"),
    model_types=("llama", "mistral"),
    presets=PRESETS,
    tiny="llama3-tiny",
    odd="llama-odd",
    config_map=CONFIG,
    weight_map=weights,
    test_tokenizer=_write_toy_tokenizer,
    published_tokenizer=_write_mistral_tokenizer,
    published_tokenizer_presets=("mistral-7b",),
    megatron_args=llama_megatron_args(),
    description="Llama 1/2/3.x and Mistral",
)


# -- Mixtral -----------------------------------------------------------------------------------------------------
MIXTRAL_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        sliding_window(),
        Rope(),
        # The experts' width is intermediate_size (megatron's moe_ffn_hidden_size = ffn_hidden_size);
        # the router always renormalises its top-k softmax probabilities (megatron: moe_router_pre_softmax off).
        *moe_config_rules("num_local_experts", expert_ffn=None, norm_topk=None),
        head_dim=None,
        # router_jitter_noise multiplies the router input by noise in training only: megatron-core has none.
        hf_fixed={"router_jitter_noise": 0.0},
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False},
    ),
    # Whether transformers returns the router logits (and adds its aux loss to the loss): no effect on the
    # logits. megatron-core adds its aux loss (moe_aux_loss_coeff) in training.
    passthrough=("output_router_logits",),
)

MIXTRAL_WEIGHTS = WeightMap(
    *llama_layout(mlp=moe_layout("block_sparse_moe.", gate_up="{w1,w3}.weight", down="w2.weight",
                                    dense=None))
)

MIXTRAL = Family(
    name="mixtral",
    hf_architectures=("MixtralForCausalLM",),
    model_types=("mixtral",),
    presets=MIXTRAL_PRESETS,
    tiny="mixtral-tiny",
    odd="mixtral-odd",
    config_map=MIXTRAL_CONFIG,
    weight_map=MIXTRAL_WEIGHTS,
    megatron_args=moe_megatron_args(),
    test_tokenizer=_write_toy_tokenizer,
    description="Mixtral (mixture of experts, Mistral layout)",
)


from .llama4 import LLAMA4  # noqa: E402 (after the shared helpers above)
from .ministral3 import MINISTRAL3  # noqa: E402


@hookimpl
def pai_zoo_families():
    return [LLAMA, MIXTRAL, LLAMA4, MINISTRAL3]
