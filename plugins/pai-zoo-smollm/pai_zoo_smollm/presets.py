"""Hugging Face configs of SmolLM3, plus tiny and odd ones for tests.

The published values are written from ``HuggingFaceTB/SmolLM3-3B``'s ``config.json`` as remembered: they were not
checked against the file here (no network). Values marked ``# unverified`` are the least certain. The test presets
use the Llama toy tokenizer's ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2; 600 pieces).
"""
from __future__ import annotations


def _smollm3(hidden, inter, layers, heads, kv, *, vocab=128256, max_pos=65536, theta=5000000.0, interval=4,
             **extra):
    return dict(
        model_type="smollm3", architectures=["SmolLM3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        hidden_act="silu", max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, attention_bias=False, attention_dropout=0.0,
        mlp_bias=False, tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
        no_rope_layer_interval=interval,
        no_rope_layers=[int((i + 1) % interval != 0) for i in range(layers)], **extra,
    )


TEST_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None}

PRESETS = {
    # SmolLM3-shaped, small enough for a CPU test: GQA (2 query heads per group), a tied head, vocabulary 1000, and
    # a no-RoPE interval of 2: layer 0 rotates, layer 1 does not.
    "smollm3-tiny": _smollm3(64, 96, 2, 4, 2, vocab=1000, max_pos=512, theta=2000000.0, interval=2, **TEST_TOKENS),
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 12 != 48 / 6,
    # vocabulary 701, an untied head, attention and MLP biases, rope theta 50000, 300 positions, 4 layers with a
    # no-RoPE interval of 3 (layers 0, 1 and 3 rotate, layer 2 does not: on the second pipeline stage at pp=2) and a
    # sliding window of 5 tokens on the no-RoPE layer (transformers derives layer_types so from use_sliding_window):
    # every layer kind, and windows shorter than the checks' 16 tokens.
    "smollm3-odd": {
        **_smollm3(48, 80, 4, 6, 2, vocab=701, max_pos=300, theta=50000.0, interval=3, **TEST_TOKENS),
        "head_dim": 12, "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True, "rms_norm_eps": 1e-5,
        "use_sliding_window": True, "sliding_window": 5,
        "layer_types": ["full_attention", "full_attention", "sliding_attention", "full_attention"],
    },
    # HuggingFaceTB/SmolLM3-3B, from memory: 36 layers, every 4th without RoPE, theta 5e6, 64k positions.
    "smollm3-3b": _smollm3(2048, 11008, 36, 16, 4, bos_token_id=None, eos_token_id=128012,  # unverified token ids
                           pad_token_id=128004),
}
