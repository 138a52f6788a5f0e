"""Hugging Face configs of the published Galactica (facebook/galactica-*) and OPT (facebook/opt-*)
checkpoints, plus a tiny one for tests."""
from __future__ import annotations


def _galactica(hidden, layers, heads, ffn):
    return dict(
        model_type="opt", architectures=["OPTForCausalLM"], vocab_size=50000, hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn, word_embed_proj_dim=hidden,
        max_position_embeddings=2048, activation_function="gelu", do_layer_norm_before=True,
        _remove_final_layer_norm=False, enable_bias=True, layer_norm_elementwise_affine=True,
        learned_embeddings=True, scale_embeddings=False, dropout=0.1, attention_dropout=0.1,
        activation_dropout=0.0, layerdrop=0.0, init_std=0.02, bos_token_id=0, pad_token_id=1, eos_token_id=2,
        use_cache=True,
    )


def _opt(hidden, layers, heads, ffn):
    return dict(
        model_type="opt", architectures=["OPTForCausalLM"], vocab_size=50272, hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn, word_embed_proj_dim=hidden,
        max_position_embeddings=2048, activation_function="relu", do_layer_norm_before=True,
        _remove_final_layer_norm=False, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        layerdrop=0.0, init_std=0.02, bos_token_id=2, pad_token_id=1, eos_token_id=2, prefix="</s>", use_cache=True,
    )


PRESETS = {
    # Galactica-shaped and small: learned positions with OPT's offset of 2, GELU, biases, tied
    # embeddings, a vocabulary that is no multiple of 128, 288 positions. No dropout (a test model).
    "galactica-tiny": {
        **_galactica(64, 2, 4, 256), "vocab_size": 1000, "max_position_embeddings": 288,
        "dropout": 0.0, "attention_dropout": 0.0,
    },
    # Unusual shapes (Family.odd): 6 heads of 12 channels (OPT has no GQA and no separate head_dim), vocabulary
    # 1001, FFN width 200, OPT's ReLU, biases everywhere, untied head, 300 positions (302 rows with the offset).
    "galactica-odd": {
        **_galactica(72, 2, 6, 200), "vocab_size": 1001, "max_position_embeddings": 300,
        "activation_function": "relu", "tie_word_embeddings": False, "dropout": 0.0, "attention_dropout": 0.0,
    },
    "galactica-125m": _galactica(768, 12, 12, 3072),
    "galactica-1.3b": _galactica(2048, 24, 32, 8192),
    "galactica-6.7b": _galactica(4096, 32, 32, 16384),
    "galactica-30b": _galactica(7168, 48, 56, 28672),
    "galactica-120b": _galactica(10240, 96, 80, 40960),
    "opt-125m": _opt(768, 12, 12, 3072),
    "opt-1.3b": _opt(2048, 24, 32, 8192),
    "opt-6.7b": _opt(4096, 32, 32, 16384),
}
