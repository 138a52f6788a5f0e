"""Hugging Face configs of the published OLMo-2, OLMo-3 and OLMoE sizes, plus tiny and odd ones for tests.

The published values are written from the ``config.json`` files of the Hugging Face repositories named beside each
preset, FROM MEMORY: they were not checked against the files here (no network). Values marked ``# unverified`` are
the least certain. Token ids: OLMo-2/3's dolma2 tokenizer has ``<|endoftext|>`` 100257 (BOS and EOS) and
``<|pad|>`` 100277; OLMoE's GPT-NeoX-style one EOS 50279 and pad 1. The test presets use the test tokenizer's
ids (:mod:`pai_zoo_olmo.tokenizer_files`: ``<|endoftext|>`` 500, ``<|pad|>`` 501).
"""
from __future__ import annotations

DOLMA2_TOKENS = {"bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100277}
OLMOE_TOKENS = {"bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1}
#: The test tokenizer's ids (<|endoftext|> after its 500 learnt tokens, then <|pad|>).
TOY_TOKENS = {"bos_token_id": 500, "eos_token_id": 500, "pad_token_id": 501}

SLIDING, FULL = "sliding_attention", "full_attention"


def _olmo2(hidden, inter, layers, heads, kv, *, vocab=100352, max_pos=4096, theta=500000.0, eps=1e-6,
           tokens=DOLMA2_TOKENS, **extra):
    return dict(
        model_type="olmo2", architectures=["Olmo2ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=False, attention_dropout=0.0,
        tie_word_embeddings=False, **tokens, **extra,
    )


def _olmo3(hidden, inter, layers, heads, kv, *, vocab=100278, max_pos=65536, window=4096, theta=500000.0,
           eps=1e-6, full_rope=None, tokens=DOLMA2_TOKENS, **extra):
    """OLMo-3: OLMo-2 plus three sliding-window layers to one full one; the full layers' RoPE may be scaled."""
    types = [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(layers)]
    full = {"rope_type": "default", "rope_theta": theta, **(full_rope or {})}
    return dict(
        _olmo2(hidden, inter, layers, heads, kv, vocab=vocab, max_pos=max_pos, theta=theta, eps=eps, tokens=tokens),
        model_type="olmo3", architectures=["Olmo3ForCausalLM"], sliding_window=window, layer_types=types,
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": theta}, FULL: full}, **extra,
    )


def _olmoe(hidden, inter, layers, heads, kv, experts, topk, *, vocab=50304, max_pos=4096, theta=10000.0,
           eps=1e-5, norm_topk=False, tokens=OLMOE_TOKENS, **extra):
    return dict(
        model_type="olmoe", architectures=["OlmoeForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=False, attention_dropout=0.0,
        clip_qkv=None, num_experts=experts, num_experts_per_tok=topk, norm_topk_prob=norm_topk,
        router_aux_loss_coef=0.01, output_router_logits=False, tie_word_embeddings=False, **tokens, **extra,
    )


OLMO2_PRESETS = {
    # OLMo-2-shaped, small enough for a CPU test: GQA (2 query heads per group), head_dim 24 != 64 / 4 (transformers
    # reads head_dim from config.json), vocabulary 509 (no multiple of 128; the test tokenizer has 502 tokens).
    "olmo2-tiny": _olmo2(64, 96, 2, 4, 2, vocab=509, max_pos=512, tokens=TOY_TOKENS, head_dim=24),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, 3 layers, rms_norm_eps 1e-5, rope theta 50000, 300 positions.
    "olmo2-odd": _olmo2(48, 80, 3, 6, 2, vocab=997, max_pos=300, theta=50000.0, eps=1e-5, tokens=TOY_TOKENS,
                        head_dim=20),
    "olmo-2-1b": _olmo2(2048, 8192, 16, 16, 16),  # allenai/OLMo-2-0425-1B
    "olmo-2-7b": _olmo2(4096, 11008, 32, 32, 32),  # allenai/OLMo-2-1124-7B
    "olmo-2-13b": _olmo2(5120, 13824, 40, 40, 40),  # allenai/OLMo-2-1124-13B
    "olmo-2-32b": _olmo2(5120, 27648, 64, 40, 8),  # allenai/OLMo-2-0325-32B
}

#: OLMo-3's long-context RoPE on its full-attention layers (YaRN, factor 8 over 8192 positions). # unverified
OLMO3_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "beta_fast": 32.0,
              "beta_slow": 1.0, "attention_factor": 1.2079441541679836}

OLMO3_PRESETS = {
    # OLMo-3-shaped: 4 layers, three sliding (window 6, shorter than the suite's 16-token sequences) then one full,
    # GQA, head_dim 24 != 64 / 4.
    "olmo3-tiny": _olmo3(64, 96, 4, 4, 2, vocab=509, max_pos=512, window=6, tokens=TOY_TOKENS, head_dim=24),
    # Unusual shapes: GQA ratio 3, head_dim 20 != 48 / 6, vocabulary 997, window 5 with the pattern reversed (full,
    # sliding, full), rope theta 50000 on the sliding layers and 20000 on the full ones, which have YaRN (factor 4
    # over 75 positions, an attention factor of 1.1 on the full layers only) as the published OLMo-3 has.
    "olmo3-odd": {
        **_olmo3(48, 80, 3, 6, 2, vocab=997, max_pos=300, window=5, theta=50000.0, eps=1e-5, tokens=TOY_TOKENS,
                 full_rope={"rope_theta": 20000.0, "rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 75, "beta_fast": 32.0, "beta_slow": 1.0,
                            "attention_factor": 1.1}, head_dim=20),
        "layer_types": [FULL, SLIDING, FULL],
    },
    "olmo-3-7b": _olmo3(4096, 11008, 32, 32, 32, full_rope=OLMO3_YARN),  # allenai/Olmo-3-1025-7B
    "olmo-3-32b": _olmo3(5120, 27648, 64, 40, 8, full_rope=OLMO3_YARN),  # allenai/Olmo-3-1125-32B  # unverified
}

OLMOE_PRESETS = {
    # OLMoE-shaped: 2 layers of 4 experts, top-2, not renormalised (norm_topk_prob false, as published), the q/k
    # norms over the whole projection (hidden_size wide: OLMoE's head_dim is hidden / heads), vocabulary 509.
    "olmoe-tiny": _olmoe(64, 48, 2, 4, 4, 4, 2, vocab=509, max_pos=512, tokens=TOY_TOKENS),
    # Unusual shapes: 6 query heads in 2 key/value groups (GQA ratio 3), 5 experts, top-3 renormalised
    # (norm_topk_prob true), vocabulary 997, rope theta 50000, 300 positions.
    "olmoe-odd": _olmoe(48, 40, 2, 6, 2, 5, 3, vocab=997, max_pos=300, theta=50000.0, norm_topk=True,
                        tokens=TOY_TOKENS),
    "olmoe-1b-7b": _olmoe(2048, 1024, 16, 16, 16, 64, 8),  # allenai/OLMoE-1B-7B-0924
}

PRESETS = {**OLMO2_PRESETS, **OLMO3_PRESETS, **OLMOE_PRESETS}
