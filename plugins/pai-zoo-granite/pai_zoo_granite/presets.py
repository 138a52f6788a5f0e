"""Hugging Face configs of published Granite 3.x sizes, plus tiny and odd ones for tests.

The published values are written from the ``config.json`` files of the ``ibm-granite`` repositories named beside
each preset, as remembered: they were not checked against the files here (no network). Values marked
``# unverified`` are the least certain. The test presets use the Llama toy tokenizer's ids (``<unk>`` 0, ``<s>`` 1,
``</s>`` 2; 600 pieces); Granite's own tokenizer is a 49k-token byte-level BPE with ``<|end_of_text|>`` 0.
"""
from __future__ import annotations


def _granite(hidden, inter, layers, heads, kv, *, embedding, residual, attention, logits, vocab=49155,
             max_pos=4096, theta=10000.0, tie=True, **extra):
    return dict(
        model_type="granite", architectures=["GraniteForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=False, attention_dropout=0.0,
        mlp_bias=False, tie_word_embeddings=tie, embedding_multiplier=embedding, residual_multiplier=residual,
        attention_multiplier=attention, logits_scaling=logits, **extra,
    )


TEST_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}
GRANITE_TOKENS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}

PRESETS = {
    # Granite-shaped, small enough for a CPU test: GQA, a tied head, vocabulary 1000, and multipliers that bite on
    # random weights: embeddings x 3, residual branches x 0.5, attention scale 0.2 (not 1/sqrt(16)), logits / 4.
    "granite-tiny": _granite(64, 96, 2, 4, 2, embedding=3.0, residual=0.5, attention=0.2, logits=4.0, vocab=1000,
                             max_pos=512, **TEST_TOKENS),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 12 != 48 / 6,
    # vocabulary 701, an untied head, attention and MLP biases (scaled with their projections), rope theta 50000,
    # 300 positions, and Granite-3.3-like multipliers (12, 0.22, 1/48, 8).
    "granite-odd": {
        **_granite(48, 80, 2, 6, 2, embedding=12.0, residual=0.22, attention=1 / 48, logits=8.0, vocab=701,
                   max_pos=300, theta=50000.0, tie=False, **TEST_TOKENS),
        "head_dim": 12, "attention_bias": True, "mlp_bias": True,
    },
    # ibm-granite/granite-3.0-8b-base, from memory
    "granite-3.0-8b": _granite(4096, 12800, 40, 32, 8, embedding=12.0, residual=0.22, attention=0.0078125,
                               logits=16.0, **GRANITE_TOKENS),
    # ibm-granite/granite-3.3-2b-base, from memory: 128k positions, theta 1e7
    "granite-3.3-2b": _granite(2048, 8192, 40, 32, 8, embedding=12.0, residual=0.22, attention=0.015625, logits=8.0,
                               vocab=49159, max_pos=131072, theta=10000000.0, **GRANITE_TOKENS),  # unverified vocab
    # ibm-granite/granite-3.3-8b-base, from memory
    "granite-3.3-8b": _granite(4096, 12800, 40, 32, 8, embedding=12.0, residual=0.22, attention=0.0078125,
                               logits=16.0, vocab=49159, max_pos=131072, theta=10000000.0, **GRANITE_TOKENS),
}


def _granitemoe(hidden, inter, layers, heads, kv, experts, topk, *, embedding, residual, attention, logits,
                vocab=49155, max_pos=4096, theta=10000.0, tie=True, **extra):
    config = _granite(hidden, inter, layers, heads, kv, embedding=embedding, residual=residual, attention=attention,
                      logits=logits, vocab=vocab, max_pos=max_pos, theta=theta, tie=tie, **extra)
    for key in ("mlp_bias",):  # GraniteMoeConfig has no MLP bias
        config.pop(key)
    return {**config, "model_type": "granitemoe", "architectures": ["GraniteMoeForCausalLM"],
            "num_local_experts": experts, "num_experts_per_tok": topk, "router_aux_loss_coef": 0.001,
            "output_router_logits": False}


MOE_PRESETS = {
    # GraniteMoE-shaped: 4 experts of width 32, top 2, GQA, a tied head, vocabulary 1000, the tiny multipliers.
    "granitemoe-tiny": _granitemoe(64, 32, 2, 4, 2, 4, 2, embedding=3.0, residual=0.5, attention=0.2, logits=4.0,
                                   vocab=1000, max_pos=512, **TEST_TOKENS),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 12 != 48 / 6,
    # 5 experts of width 24 with top 3, vocabulary 701, an untied head, Granite-3-like multipliers.
    "granitemoe-odd": {
        **_granitemoe(48, 24, 2, 6, 2, 5, 3, embedding=12.0, residual=0.22, attention=1 / 48, logits=6.0,
                      vocab=701, max_pos=300, theta=50000.0, tie=False, **TEST_TOKENS),
        "head_dim": 12,
    },
    # ibm-granite/granite-3.0-1b-a400m-base, from memory (unverified: expert width and counts)
    "granite-3.0-1b-a400m": _granitemoe(1024, 512, 24, 16, 8, 32, 8, embedding=12.0, residual=0.22,
                                        attention=0.015625, logits=6.0, **GRANITE_TOKENS),
    # ibm-granite/granite-3.0-3b-a800m-base, from memory (unverified: expert width and counts)
    "granite-3.0-3b-a800m": _granitemoe(1536, 512, 32, 24, 8, 40, 8, embedding=12.0, residual=0.22,
                                        attention=0.015625, logits=6.0, **GRANITE_TOKENS),
}
