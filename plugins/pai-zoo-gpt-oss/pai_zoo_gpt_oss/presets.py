"""Hugging Face configs of the published gpt-oss sizes, plus tiny and odd ones for tests.

The published values (openai/gpt-oss-20b, openai/gpt-oss-120b) are written from memory: they were not checked
against the files here (no network). Both are published with MXFP4 experts (``quantization_config``
:data:`MXFP4_CONFIG`). The tiny and odd presets use the test tokenizer's ids
(:mod:`pai_zoo_gpt_oss.tokenizer_files`).
"""
from __future__ import annotations

SLIDING, FULL = "sliding_attention", "full_attention"

#: The ``quantization_config`` of the published checkpoints (from memory): MXFP4 experts, the rest bf16.
MXFP4_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
    "quant_method": "mxfp4",
}

#: gpt-oss's YaRN RoPE (``truncate: false``: the ramp's bounds are not rounded to whole dimensions).
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}


def _alternating(layers: int) -> list[str]:
    """gpt-oss's default: even layers sliding, odd layers full."""
    return [SLIDING if i % 2 == 0 else FULL for i in range(layers)]


def _gpt_oss(hidden, inter, layers, heads, kv, experts, topk, *, head_dim=64, window=128, vocab=201088,
             max_pos=131072, rope=None, layer_types=None, tokens=None, limit=7.0, **extra):
    return dict(
        model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=topk, sliding_window=window,
        layer_types=layer_types or _alternating(layers), hidden_act="silu", max_position_embeddings=max_pos,
        rms_norm_eps=1e-5, rope_parameters=dict(rope or YARN), attention_bias=True, attention_dropout=0.0,
        swiglu_alpha=1.702, swiglu_limit=limit, router_aux_loss_coef=0.9, output_router_logits=False,
        tie_word_embeddings=False, **(tokens or {"pad_token_id": 199999, "eos_token_id": 200002}), **extra,
    )


_TOY_TOKENS = {"bos_token_id": 400, "pad_token_id": 401, "eos_token_id": 402}

GPT_OSS_PRESETS = {
    # gpt-oss-shaped, small: 4 experts with top-2, head_dim 16 != 64 / 8, GQA 4, window 8 on the even layers,
    # YaRN with a small original length, untied head, vocabulary 509 (the test tokenizer has 403 pieces).
    "gpt-oss-tiny": _gpt_oss(64, 48, 2, 8, 2, 4, 2, head_dim=16, window=8, vocab=509, max_pos=1024,
                             rope={**YARN, "factor": 4.0, "original_max_position_embeddings": 256},
                             tokens=_TOY_TOKENS),
    # Unusual shapes (Family.odd): 6 query heads in 2 groups (GQA 3), head_dim 20 != 72 / 6, expert width 40,
    # 4 experts with top-2, window 5, full attention first (both kinds, not the default order), YaRN from 64
    # positions with truncate true, swiglu_limit 0.5 (the clamp acts on about half the test weights' gate and up
    # values), vocabulary 997.
    "gpt-oss-odd": _gpt_oss(72, 40, 3, 6, 2, 4, 2, head_dim=20, window=5, vocab=997, max_pos=512,
                            layer_types=[FULL, SLIDING, SLIDING],
                            rope={**YARN, "factor": 8.0, "truncate": True, "original_max_position_embeddings": 64},
                            tokens=_TOY_TOKENS, limit=0.5),
    # Published config.json values (openai/gpt-oss-20b, openai/gpt-oss-120b): from memory, unverified here.
    "gpt-oss-20b": _gpt_oss(2880, 2880, 24, 64, 8, 32, 4, quantization_config=dict(MXFP4_CONFIG)),
    "gpt-oss-120b": _gpt_oss(2880, 2880, 36, 64, 8, 128, 4, quantization_config=dict(MXFP4_CONFIG)),
}
