"""Hugging Face configs of the published Falcon checkpoints (tiiuae/*), plus small ones for tests."""
from __future__ import annotations

_COMMON = dict(
    model_type="falcon", architectures=["FalconForCausalLM"], vocab_size=65024, alibi=False, bias=False,
    attention_dropout=0.0, hidden_dropout=0.0, layer_norm_epsilon=1e-05, initializer_range=0.02,
    bos_token_id=11, eos_token_id=11, use_cache=True,
)

PRESETS = {
    # The new decoder architecture (Falcon-40B/180B) in small: grouped KV heads (2 groups of 2 query heads)
    # with query_key_value laid out per group, ln_attn/ln_mlp, plus biases (as Falcon-RW has) and tied
    # embeddings, a vocabulary that is no multiple of 128 and 288 positions.
    "falcon-tiny": {
        **_COMMON, "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_kv_heads": 2, "new_decoder_architecture": True, "parallel_attn": True, "bias": True,
        "ffn_hidden_size": 192, "max_position_embeddings": 288, "rope_theta": 10000.0,
    },
    # Falcon-RW in small with unusual shapes (the conformance suite's odd preset): ALiBi with 6 heads (not a power
    # of two: the interleaved extra slopes, 3 heads per rank at TP=2), sequential layers, multi-head attention,
    # biases, head_dim 12, a vocabulary of 1001 and an FFN width that is no multiple of the hidden size.
    "falcon-odd": {
        **_COMMON, "vocab_size": 1001, "hidden_size": 72, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_kv_heads": 6, "alibi": True, "bias": True, "multi_query": False, "new_decoder_architecture": False,
        "parallel_attn": False, "ffn_hidden_size": 136, "max_position_embeddings": 512,
    },
    # tiiuae/falcon-7b: multi-query, parallel attention and MLP from one input LayerNorm.
    "falcon-7b": {
        **_COMMON, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71, "multi_query": True,
        "new_decoder_architecture": False, "parallel_attn": True, "apply_residual_connection_post_layernorm": False,
    },
    # tiiuae/falcon-40b: new decoder architecture, 8 KV groups, ln_attn/ln_mlp.
    "falcon-40b": {
        **_COMMON, "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128, "num_kv_heads": 8,
        "new_decoder_architecture": True, "parallel_attn": True, "apply_residual_connection_post_layernorm": False,
    },
    # tiiuae/falcon-180B
    "falcon-180b": {
        **_COMMON, "hidden_size": 14848, "num_hidden_layers": 80, "num_attention_heads": 232, "num_kv_heads": 8,
        "multi_query": True, "new_decoder_architecture": True, "parallel_attn": True,
    },
    # tiiuae/falcon-11B: new decoder architecture with one LayerNorm per layer, untied head, 8k positions.
    "falcon-11b": {
        **_COMMON, "hidden_size": 4096, "num_hidden_layers": 60, "num_attention_heads": 32, "num_kv_heads": 8,
        "ffn_hidden_size": 16384, "max_position_embeddings": 8192, "multi_query": True,
        "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1, "parallel_attn": True,
        "rope_theta": 500042.0, "rope_scaling": None, "tie_word_embeddings": False, "activation": "gelu",
    },
    # tiiuae/falcon-rw-1b: sequential layers, multi-head attention, biases, ALiBi (GPT-2 tokenizer vocabulary).
    "falcon-rw-1b": {
        **_COMMON, "vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
        "alibi": True, "bias": True, "multi_query": False, "new_decoder_architecture": False, "parallel_attn": False,
        "apply_residual_connection_post_layernorm": False, "bos_token_id": 1, "eos_token_id": 2,
    },
}
