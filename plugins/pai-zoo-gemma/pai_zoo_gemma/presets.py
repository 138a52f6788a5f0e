"""Hugging Face configs of the published Gemma and Gemma-2 sizes, plus tiny and odd ones for tests.

The published values are written from the ``config.json`` files of the Hugging Face repositories named beside
each preset, as remembered: they were not checked against the files here (no network). Values marked
``# unverified`` are the least certain. Token ids are Gemma's: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, which the
test tokenizer (:mod:`pai_zoo_gemma.tokenizer_files`) keeps.
"""
from __future__ import annotations

GEMMA_TOKENS = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def _gemma(hidden, inter, layers, heads, kv, *, head_dim=256, vocab=256000, max_pos=8192, **extra):
    return dict(
        model_type="gemma", architectures=["GemmaForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_act="gelu_pytorch_tanh", max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=False, attention_dropout=0.0,
        tie_word_embeddings=True, **GEMMA_TOKENS, **extra,
    )


def _gemma2(hidden, inter, layers, heads, kv, *, head_dim=256, scalar=256, window=4096, vocab=256000,
            max_pos=8192, attn_cap=50.0, final_cap=30.0, **extra):
    return dict(
        model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=max_pos,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attention_bias=False,
        attention_dropout=0.0, query_pre_attn_scalar=scalar, sliding_window=window,
        attn_logit_softcapping=attn_cap, final_logit_softcapping=final_cap, tie_word_embeddings=True,
        **GEMMA_TOKENS, **extra,
    )


GEMMA_PRESETS = {
    # Gemma-shaped, small enough for a CPU test: GQA (2 query heads per group), head_dim 24 != 64 / 4, tied head,
    # vocabulary 509 (no multiple of 128; the test tokenizer has 500 pieces), 512 positions.
    "gemma-tiny": _gemma(64, 96, 2, 4, 2, head_dim=24, vocab=509, max_pos=512),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, an untied head, rms_norm_eps 1e-5, rope theta 50000, 300 positions.
    "gemma-odd": {
        **_gemma(48, 80, 2, 6, 2, head_dim=20, vocab=997, max_pos=300),
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
    },
    "gemma-2b": _gemma(2048, 16384, 18, 8, 1),  # google/gemma-2b (multi-query attention)
    "gemma-7b": _gemma(3072, 24576, 28, 16, 16),  # google/gemma-7b
}

GEMMA2_PRESETS = {
    # Gemma-2-shaped: GQA, head_dim 24 != 64 / 4, query_pre_attn_scalar 20 (!= head_dim: the attention scale is
    # 20 ** -0.5), a sliding window of 6 tokens on layer 0 (shorter than the suite's 16-token sequences), full
    # attention on layer 1, and caps low enough to bite on the suite's unit-scale random weights (attention
    # scores 4, logits 3; the published 50 and 30 leave random tiny models' values almost untouched).
    "gemma2-tiny": _gemma2(64, 96, 2, 4, 2, head_dim=24, scalar=20, window=6, vocab=509, max_pos=512,
                           attn_cap=4.0, final_cap=3.0),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, an untied head, query_pre_attn_scalar 12, the window (5 tokens) on layer 1 only (the reverse
    # of Gemma-2's pattern), caps 3 and 2.5, rope theta 50000, 300 positions.
    "gemma2-odd": {
        **_gemma2(48, 80, 2, 6, 2, head_dim=20, scalar=12, window=5, vocab=997, max_pos=300,
                  attn_cap=3.0, final_cap=2.5),
        "layer_types": ["full_attention", "sliding_attention"], "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
    },
    "gemma-2-2b": _gemma2(2304, 9216, 26, 8, 4),  # google/gemma-2-2b
    "gemma-2-9b": _gemma2(3584, 14336, 42, 16, 8),  # google/gemma-2-9b
    "gemma-2-27b": _gemma2(4608, 36864, 46, 32, 16, head_dim=128, scalar=144),  # google/gemma-2-27b: 4608 / 32
}

PRESETS = {**GEMMA_PRESETS, **GEMMA2_PRESETS}
