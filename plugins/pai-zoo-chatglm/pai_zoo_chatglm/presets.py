"""Hugging Face configs (THUDM's config.json) of ChatGLM2-6B and ChatGLM3-6B, plus a tiny one for tests."""
from __future__ import annotations


def _chatglm(seq_length, **extra):
    """THUDM/chatglm2-6b and THUDM/chatglm3-6b: 28 layers, 32 heads sharing 2 key/value groups, RMSNorm,
    q/k/v bias only, SwiGLU, rotary on half of each 128-channel head."""
    return dict(
        model_type="chatglm", architectures=["ChatGLMModel"], num_layers=28, padded_vocab_size=65024,
        hidden_size=4096, ffn_hidden_size=13696, kv_channels=128, num_attention_heads=32, seq_length=seq_length,
        hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-5, rmsnorm=True,
        apply_residual_connection_post_layernorm=False, post_layer_norm=True, add_bias_linear=False,
        add_qkv_bias=True, bias_dropout_fusion=True, multi_query_attention=True, multi_query_group_num=2,
        apply_query_key_layer_scaling=True, attention_softmax_in_fp32=True, fp32_residual_connection=False,
        quantization_bit=0, pre_seq_len=None, prefix_projection=False, original_rope=True, tie_word_embeddings=False,
        eos_token_id=2, pad_token_id=0, **extra,
    )


PRESETS = {
    # Multi-query groups (4 heads, 2 key/value groups), q/k/v bias, rotary on half of each 16-channel head with a
    # rope_ratio (base 10000 x 3), a vocabulary that is not a multiple of 128, 512 positions.
    "chatglm-tiny": {
        **_chatglm(512), "num_layers": 2, "padded_vocab_size": 1000, "hidden_size": 64, "ffn_hidden_size": 160,
        "kv_channels": 16, "num_attention_heads": 4, "rope_ratio": 3,
    },
    # Unusual shapes (Family.odd): 6 heads in 2 multi-query groups (ratio 3), kv_channels 20 != 72 / 6 with
    # interleaved rotary on 10 of them (5 pairs), vocabulary 1001, all linear biases (add_bias_linear) besides the
    # q/k/v bias, layernorm_epsilon 1e-6, rope_ratio 2.5 (base 25000), 300 positions.
    "chatglm-odd": {
        **_chatglm(300), "num_layers": 2, "padded_vocab_size": 1001, "hidden_size": 72, "ffn_hidden_size": 136,
        "kv_channels": 20, "num_attention_heads": 6, "multi_query_group_num": 2, "rope_ratio": 2.5,
        "layernorm_epsilon": 1e-6, "add_bias_linear": True,
    },
    "chatglm2-6b": _chatglm(32768),
    "chatglm3-6b": _chatglm(8192),
    "chatglm3-6b-32k": _chatglm(32768, rope_ratio=50),
}
