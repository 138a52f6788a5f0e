"""Hugging Face configs of published Phi-3 and Phi-4 sizes, plus tiny and odd ones for tests.

The published values are written from the ``config.json`` files of the ``microsoft`` repositories named beside each
preset, as remembered: they were not checked against the files here (no network). Values marked ``# unverified``
are the least certain. Phi-3-mini-128k's LongRoPE factor lists are NOT the published ones (48 numbers each were not
remembered reliably): the preset has the published shape and rope type with placeholder factors; a real checkpoint
brings its own. The test presets use the Llama toy tokenizer's ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2; 600 pieces);
Phi-3's own tokenizer is Llama-2's 32000 pieces plus chat tokens (``<|endoftext|>`` 32000).
"""
from __future__ import annotations


def _phi3(hidden, inter, layers, heads, kv, *, vocab=32064, max_pos=4096, original=4096, theta=10000.0, window=None,
          rope=None, **extra):
    return dict(
        model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, original_max_position_embeddings=original,
        rms_norm_eps=1e-5, rope_parameters=rope or {"rope_type": "default", "rope_theta": theta},
        attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0, sliding_window=window, tie_word_embeddings=False,
        **extra,
    )


TEST_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}
PHI3_TOKENS = {"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}

PRESETS = {
    # Phi-3-shaped, small enough for a CPU test: GQA, head_dim 24 != 64 / 4, partial rotary (half of each head's
    # channels rotated), vocabulary 1000, 512 positions.
    "phi3-tiny": _phi3(64, 96, 2, 4, 2, vocab=1000, max_pos=512, original=512, head_dim=24,
                       rope={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                       **TEST_TOKENS),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), vocabulary 701, a sliding
    # window of 11 tokens, and LongRoPE with original_max_position_embeddings 24 < 300 positions: the suite's
    # 16 tokens from position 0 use the short factors, from position 256 the long ones, both with the attention
    # factor sqrt(1 + ln(300 / 24) / ln(24)). (LongRoPE's factor lists are checked against hidden / heads, so
    # head_dim stays 48 / 6.)
    "phi3-odd": _phi3(
        48, 80, 2, 6, 2, vocab=701, max_pos=300, original=24, window=11, **TEST_TOKENS,
        rope={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.05, 1.3, 1.9],
              "long_factor": [1.5, 3.0, 7.0, 16.0]},
    ),
    # microsoft/Phi-3-mini-4k-instruct, from memory
    "phi-3-mini-4k": _phi3(3072, 8192, 32, 32, 32, window=2047, **PHI3_TOKENS),
    # microsoft/Phi-3-mini-128k-instruct, from memory: LongRoPE from 4096 to 131072 positions. The factor lists are
    # placeholders (see the module docstring), not the published values.
    "phi-3-mini-128k": _phi3(
        3072, 8192, 32, 32, 32, max_pos=131072, window=262144, **PHI3_TOKENS,
        rope={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 48,
              "long_factor": [1.0 + i for i in range(48)]},
    ),
    # microsoft/Phi-3-medium-4k-instruct, from memory
    "phi-3-medium-4k": _phi3(5120, 17920, 40, 40, 10, window=2047, **PHI3_TOKENS),
    # microsoft/phi-4, from memory: a 100k tiktoken vocabulary, 16k positions, theta 250000, no window
    "phi-4": _phi3(5120, 17920, 40, 40, 10, vocab=100352, max_pos=16384, original=16384, theta=250000.0,
                   bos_token_id=100257, eos_token_id=100265, pad_token_id=100349),  # unverified token ids
}
