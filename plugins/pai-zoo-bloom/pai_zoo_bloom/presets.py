"""Hugging Face configs of the published BLOOM sizes (bigscience/bloom-*), plus small ones for tests."""
from __future__ import annotations


def _bloom(hidden, layers, heads, pretraining_tp=1, **extra):
    return dict(
        model_type="bloom", architectures=["BloomForCausalLM"], vocab_size=250880, hidden_size=hidden,
        n_layer=layers, n_head=heads, layer_norm_epsilon=1e-5, apply_residual_connection_post_layernorm=False,
        hidden_dropout=0.0, attention_dropout=0.0, pretraining_tp=pretraining_tp, slow_but_exact=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, unk_token_id=0, tie_word_embeddings=True, **extra,
    )


_PUBLISHED = {
    "bloom-560m": _bloom(1024, 24, 16),
    "bloom-1b1": _bloom(1536, 24, 16),
    "bloom-1b7": _bloom(2048, 24, 16, pretraining_tp=2),
    "bloom-3b": _bloom(2560, 30, 32, pretraining_tp=4),
    "bloom-7b1": _bloom(4096, 30, 32),
    "bloom-176b": _bloom(14336, 70, 112, pretraining_tp=4),  # bigscience/bloom
}

PRESETS = {
    # 6 heads (not a power of two: ALiBi's interleaved extra slopes, 3 heads per rank at TP=2),
    # a vocabulary that is not a multiple of 128, tied embeddings, biases everywhere.
    "bloom-tiny": {**_bloom(96, 2, 6), "vocab_size": 1000},
    # The conformance suite's odd preset: 10 heads (at TP=2 each rank's 5 heads straddle the 8 power-of-two
    # slopes and the 2 extra ones), head_dim 8, a vocabulary of 997, an untied output head.
    "bloom-odd": {**_bloom(80, 2, 10), "vocab_size": 997, "tie_word_embeddings": False},
    **_PUBLISHED,
    # BLOOMZ (bigscience/bloomz-*) fine-tunes keep the architecture: the same configs.
    **{name.replace("bloom", "bloomz", 1): dict(cfg) for name, cfg in _PUBLISHED.items()},
}
