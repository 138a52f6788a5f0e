"""Ministral 3 (``Ministral3ForCausalLM``, model type ``ministral3``; the text model of Mistral's Ministral-3 3B / 8B /
14B): the Mistral layout (GQA, explicit ``head_dim``, optional sliding window, YaRN RoPE) whose queries are scaled by
position after RoPE, ``1 + beta * log(1 + floor(position / original_max_position_embeddings))`` with beta
``rope_parameters.llama_4_scaling_beta`` (the core's query scale, :mod:`pai_zoo.mcore.query_scale`)."""
from __future__ import annotations

from pai_zoo import ConfigMap, Family, Field, Rope
from pai_zoo.config_map import sliding_window
from pai_zoo.layouts import llama_config_rules, llama_layout
from pai_zoo.mapping import WeightMap
from pai_zoo.plugin.query_scale import Llama4ScalingBeta

CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        sliding_window(),
        Rope(),
        Llama4ScalingBeta(),  # after Rope: beta leaves the kept RoPE parameters for pai_zoo.query_scale
        mcore_fixed={"add_bias_linear": False, "add_qkv_bias": False},
    ),
)

WEIGHTS = WeightMap(*llama_layout())


def _rope(original: int, factor: float, beta: float, max_pos: int, theta: float = 1000000.0) -> dict:
    return {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": original,
            "max_position_embeddings": max_pos, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "llama_4_scaling_beta": beta}


def _ministral3(hidden, inter, layers, heads, kv, *, vocab=131072, head_dim=128, max_pos=262144, tied=False,
                rope=None, pad=11, window=None, **extra) -> dict:
    return dict(
        model_type="ministral3", architectures=["Ministral3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, max_position_embeddings=max_pos, rms_norm_eps=1e-5, hidden_act="silu",
        tie_word_embeddings=tied, sliding_window=window, attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
        pad_token_id=pad, rope_parameters=rope or _rope(16384, 16.0, 0.1, max_pos), **extra,
    )


PRESETS = {
    # GQA 2, head_dim 16, YaRN, and the query scale stepping every 8 positions: 0-7 unscaled, 8-15 and 256-271 not.
    "ministral3-tiny": _ministral3(64, 160, 2, 4, 2, vocab=1000, head_dim=16, max_pos=512, pad=0,
                                   rope=_rope(8, 64.0, 0.1, 512)),
    # Unusual shapes (Family.odd): 6 query heads in 2 groups (GQA 3), head_dim 16 != 72 / 6, vocabulary 1001, MLP
    # width 100, 3 layers, a sliding window of 5 and original_max_position_embeddings 6 with beta 0.5, so the 16-token
    # forward check sees the scale step at 6 and 12 (and the window) and the far window more steps.
    "ministral3-odd": _ministral3(72, 100, 3, 6, 2, vocab=1001, head_dim=16, max_pos=300, pad=0,
                                  window=5, rope=_rope(6, 50.0, 0.5, 300)),
    # Published text configs (mistralai/Ministral-3-{3B,8B,14B}-*-2512, text_config), from memory, not checked
    # against the files.
    "ministral3-3b": _ministral3(3072, 9216, 26, 32, 8, tied=True),
    "ministral3-8b": _ministral3(4096, 14336, 34, 32, 8),
    "ministral3-14b": _ministral3(5120, 16384, 40, 32, 8),
}


def _write_toy_tokenizer(folder) -> None:
    from .tokenizer_files import write_toy_tokenizer

    write_toy_tokenizer(folder)


MINISTRAL3 = Family(
    name="ministral3",
    aliases=("ministral-3",),
    hf_architectures=("Ministral3ForCausalLM",),
    model_types=("ministral3",),
    presets=PRESETS,
    tiny="ministral3-tiny",
    odd="ministral3-odd",
    config_map=CONFIG,
    weight_map=WEIGHTS,
    test_tokenizer=_write_toy_tokenizer,
    backends=("local",),  # the query scale is a pai-zoo core attention of the local spec
    description="Ministral 3 (text: Mistral layout, YaRN, position-scaled queries by llama_4_scaling_beta)",
)
