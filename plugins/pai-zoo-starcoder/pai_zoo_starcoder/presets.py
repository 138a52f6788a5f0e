"""Hugging Face configs of the published StarCoder (GPTBigCode) and StarCoder2 sizes, plus tiny ones for tests."""
from __future__ import annotations

# Keys of bigcode/starcoder*'s config.json that only the original inference runner read.
_RUNNER_KEYS = dict(
    inference_runner=0, max_batch_size=None, max_sequence_length=None, pad_key_length=True,
    pre_allocate_kv_cache=False, validate_runner_input=True,
)


def _starcoder(n_embd, n_head, n_inner, n_layer, **extra):
    """bigcode/starcoder(base)-*: multi-query attention, learned positions, 8192 tokens."""
    return dict(
        model_type="gpt_bigcode", architectures=["GPTBigCodeForCausalLM"], vocab_size=49152, n_positions=8192,
        n_embd=n_embd, n_head=n_head, n_inner=n_inner, n_layer=n_layer, activation_function="gelu_pytorch_tanh",
        layer_norm_epsilon=1e-5, multi_query=True, scale_attn_weights=True, attention_softmax_in_fp32=True,
        scale_attention_softmax_in_fp32=True, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
        initializer_range=0.02, bos_token_id=0, eos_token_id=0, **_RUNNER_KEYS, **extra,
    )


def _starcoder2(hidden, inter, layers, heads, kv, theta, init, **extra):
    """bigcode/starcoder2-*: GQA, RoPE, 4096-token sliding window, 16384 tokens, biases, LayerNorm."""
    return dict(
        model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], vocab_size=49152, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=16384, rope_theta=theta, sliding_window=4096, norm_epsilon=1e-5, use_bias=True,
        hidden_act="gelu_pytorch_tanh", mlp_type="default", norm_type="layer_norm", attention_dropout=0.1,
        residual_dropout=0.1, embedding_dropout=0.1, initializer_range=init, bos_token_id=0, eos_token_id=0, **extra,
    )


STARCODER_PRESETS = {
    # Multi-query attention (one key/value head) with 4 query heads, learned positions, biases, tied embeddings,
    # a vocabulary that is not a multiple of 128, 272 positions (the forward check reaches position 256+).
    "starcoder-tiny": {
        **_starcoder(64, 4, 160, 2), "vocab_size": 1000, "n_positions": 288,
    },
    # Unusual shapes (Family.odd): 6 query heads of 12 channels sharing one key/value head (multi-query; GPTBigCode
    # has no GQA and no free head_dim), vocabulary 1001, MLP width 100 (not 4 x 72), exact GELU, layer_norm_epsilon
    # 1e-4, 300 positions. Biases are always there.
    "starcoder-odd": {
        **_starcoder(72, 6, 100, 2), "vocab_size": 1001, "n_positions": 300, "activation_function": "gelu",
        "layer_norm_epsilon": 1e-4,
    },
    # bigcode/starcoder and bigcode/starcoderbase (15.5B) share this config ("starcoder" names the family).
    "starcoder-15b": _starcoder(6144, 48, 24576, 40),
    "starcoderbase-1b": _starcoder(2048, 16, 8192, 24),
    "starcoderbase-3b": _starcoder(2816, 22, 11264, 36),
    "starcoderbase-7b": _starcoder(4096, 32, 16384, 42),
}

STARCODER2_PRESETS = {
    # GQA (4 query heads, 2 key/value heads), RoPE, biases, a sliding window shorter than the test sequences,
    # a vocabulary that is not a multiple of 128.
    "starcoder2-tiny": {
        **_starcoder2(64, 160, 2, 4, 2, 999999.4420358813, 0.018042), "vocab_size": 1000,
        "max_position_embeddings": 512, "sliding_window": 6,
    },
    # Unusual shapes (Family.odd): 6 query heads of 12 channels in 2 key/value groups (GQA ratio 3; Starcoder2Config
    # has no head_dim), vocabulary 1001, biases (use_bias), MLP width 100, untied output head, sliding window 7,
    # rope theta 50000, norm_epsilon 1e-4, 300 positions; and no mlp_type/norm_type, like a config.json that
    # transformers wrote (Starcoder2Config declares neither).
    "starcoder2-odd": {
        **{k: v for k, v in _starcoder2(72, 100, 2, 6, 2, 50000.0, 0.02).items() if k not in ("mlp_type", "norm_type")},
        "vocab_size": 1001, "max_position_embeddings": 300, "sliding_window": 7, "norm_epsilon": 1e-4,
        "tie_word_embeddings": False,
    },
    "starcoder2-3b": _starcoder2(3072, 12288, 30, 24, 2, 999999.4420358813, 0.018042),
    "starcoder2-7b": _starcoder2(4608, 18432, 32, 36, 4, 1000000, 0.018042),
    "starcoder2-15b": _starcoder2(6144, 24576, 40, 48, 4, 100000, 0.01275),
}
