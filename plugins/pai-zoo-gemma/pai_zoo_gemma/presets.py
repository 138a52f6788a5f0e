"""Hugging Face configs of the published Gemma, Gemma-2 and Gemma 3 (text) sizes, plus tiny and odd ones for tests.

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



def _gemma3(hidden, inter, layers, heads, kv, *, head_dim=256, scalar=256, window=1024, vocab=262208,
            max_pos=131072, linear=8.0, **extra):
    """A Gemma 3 text config.json as published (transformers 4's layout: ``rope_theta`` for the full layers with
    ``rope_scaling``, ``rope_local_base_freq`` for the sliding ones, ``sliding_window_pattern`` 6)."""
    return dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=max_pos,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        rope_scaling=None if linear is None else {"rope_type": "linear", "factor": linear},
        attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=scalar, sliding_window=window,
        sliding_window_pattern=6, attn_logit_softcapping=None, final_logit_softcapping=None,
        tie_word_embeddings=True, **GEMMA_TOKENS, **extra,
    )


def _gemma3_test(hidden, inter, layers, heads, kv, *, head_dim, scalar, window, vocab, types, rope, **extra):
    """A small Gemma 3 text config in transformers 5's layout (``layer_types``, ``rope_parameters`` per kind)."""
    return dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters=rope, attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=scalar,
        sliding_window=window, layer_types=types, attn_logit_softcapping=None, final_logit_softcapping=None,
        tie_word_embeddings=True, **GEMMA_TOKENS, **extra,
    )


S, F = "sliding_attention", "full_attention"

GEMMA3_PRESETS = {
    # Gemma-3-shaped: GQA, head_dim 24 != 64 / 4, query_pre_attn_scalar 20, a sliding window of 6 tokens on layers
    # 0, 1 and 3 (shorter than the suite's 16-token sequences) with RoPE base 10,000, full attention on layer 2 with
    # base 1,000,000 (Gemma 3's two bases; a pipeline of 2 stages has both kinds on its second), no soft-caps (as
    # published), q/k norms.
    "gemma3-tiny": _gemma3_test(64, 96, 4, 4, 2, head_dim=24, scalar=20, window=6, vocab=509, types=[S, S, F, S],
                                rope={F: {"rope_type": "default", "rope_theta": 1_000_000.0},
                                      S: {"rope_type": "default", "rope_theta": 10_000.0}}),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, an untied head, query_pre_attn_scalar 12, rms_norm_eps 1e-5, a window of 5 tokens on layers
    # 1 and 2 (full attention on layer 0), full layers with a linearly scaled RoPE (factor 4, base 50,000) and
    # sliding ones with base 2,000, and the optional final soft-cap (2.5) on.
    "gemma3-odd": {
        **_gemma3_test(48, 80, 3, 6, 2, head_dim=20, scalar=12, window=5, vocab=997, types=[F, S, S],
                       rope={F: {"rope_type": "linear", "factor": 4.0, "rope_theta": 50_000.0},
                             S: {"rope_type": "default", "rope_theta": 2_000.0}}),
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "final_logit_softcapping": 2.5,
    },
    # From memory (not checked here, no network): the config.json of google/gemma-3-1b-pt (Gemma3ForCausalLM) and
    # the text_config of google/gemma-3-{4b,12b,27b}-pt (Gemma3ForConditionalGeneration; the text model alone).
    "gemma-3-1b": _gemma3(1152, 6912, 26, 4, 1, window=512, vocab=262144, max_pos=32768, linear=None),
    "gemma-3-4b": _gemma3(2560, 10240, 34, 8, 4),
    "gemma-3-12b": _gemma3(3840, 15360, 48, 16, 8),
    "gemma-3-27b": _gemma3(5376, 21504, 62, 32, 16, head_dim=128, scalar=168),  # 5376 / 32
}

PRESETS = {**GEMMA_PRESETS, **GEMMA2_PRESETS, **GEMMA3_PRESETS}
