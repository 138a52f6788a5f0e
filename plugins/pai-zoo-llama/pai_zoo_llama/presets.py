"""Hugging Face configs of the published Llama and Mistral sizes, plus tiny ones for tests."""
from __future__ import annotations


def _llama(hidden, inter, layers, heads, kv, vocab, max_pos, eps, theta, **extra):
    return dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, **extra,
    )


def _llama3(hidden, inter, layers, heads, kv, *, scaling=None, **extra):
    cfg = _llama(hidden, inter, layers, heads, kv, 128256, 8192, 1e-5, 500000.0, **extra)
    cfg.update(bos_token_id=128000, eos_token_id=128001)
    if scaling:
        cfg["max_position_embeddings"] = 131072
        cfg["rope_parameters"] = {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": scaling, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        }
    return cfg


def _mistral(vocab, theta, window, **extra):
    cfg = _llama(4096, 14336, 32, 32, 8, vocab, 32768, 1e-5, theta, sliding_window=window, **extra)
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], head_dim=128)
    return cfg


PRESETS = {
    # A Llama-3.1-shaped model small enough for a CPU test: GQA, llama3 RoPE scaling, padded vocabulary.
    "llama3-tiny": {
        **_llama3(64, 192, 2, 4, 2, scaling=8.0),
        "vocab_size": 1000, "bos_token_id": 1, "eos_token_id": 2,
    },
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 16 != 72 / 6,
    # vocabulary 1001, attention and MLP biases, MLP width 100, and llama3 RoPE scaling with parameters
    # megatron-core's own llama3 scaling cannot take (original 1024, low/high frequency factors 2/8, factor 16):
    # with theta 10000 its 8 frequencies fall in all three bands (kept, blended, divided by 16).
    "llama-odd": {
        **_llama(72, 100, 2, 6, 2, 1001, 2048, 1e-5, 10000.0),
        "head_dim": 16, "attention_bias": True, "mlp_bias": True, "bos_token_id": 1, "eos_token_id": 2,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 16.0, "low_freq_factor": 2.0,
                            "high_freq_factor": 8.0, "original_max_position_embeddings": 1024},
    },
    # Mistral with the same unusual shapes (no biases: MistralConfig has none) and a sliding window of 5.
    "mistral-odd": {
        **_mistral(1001, 1000000.0, 5),
        "hidden_size": 72, "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 300, "bos_token_id": 1, "eos_token_id": 2,
    },
    # Mistral-shaped, with a sliding window shorter than test sequences.
    "mistral-tiny": {
        **_mistral(1000, 10000.0, 4),
        "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256,
    },
    "llama-7b": _llama(4096, 11008, 32, 32, 32, 32000, 2048, 1e-6, 10000.0),
    "llama-13b": _llama(5120, 13824, 40, 40, 40, 32000, 2048, 1e-6, 10000.0),
    "llama2-7b": _llama(4096, 11008, 32, 32, 32, 32000, 4096, 1e-5, 10000.0),
    "llama2-13b": _llama(5120, 13824, 40, 40, 40, 32000, 4096, 1e-5, 10000.0),
    "llama2-70b": _llama(8192, 28672, 80, 64, 8, 32000, 4096, 1e-5, 10000.0),
    "llama3-8b": _llama3(4096, 14336, 32, 32, 8),
    "llama3-70b": _llama3(8192, 28672, 80, 64, 8),
    "llama3.1-8b": _llama3(4096, 14336, 32, 32, 8, scaling=8.0),
    "llama3.1-70b": _llama3(8192, 28672, 80, 64, 8, scaling=8.0),
    "llama3.2-1b": {**_llama3(2048, 8192, 16, 32, 8, scaling=32.0), "head_dim": 64, "tie_word_embeddings": True},
    "llama3.2-3b": {**_llama3(3072, 8192, 28, 24, 8, scaling=32.0), "head_dim": 128, "tie_word_embeddings": True},
    "mistral-7b": _mistral(32000, 10000.0, 4096),
    "mistral-7b-v0.3": _mistral(32768, 1000000.0, None),
}


def _mixtral(hidden, inter, layers, heads, kv, experts, topk, *, vocab, max_pos, aux, theta=1000000.0, window=None,
             **extra):
    return dict(
        model_type="mixtral", architectures=["MixtralForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=max_pos, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        hidden_act="silu", tie_word_embeddings=False, sliding_window=window, num_local_experts=experts,
        num_experts_per_tok=topk, router_aux_loss_coef=aux, router_jitter_noise=0.0, output_router_logits=False,
        attention_dropout=0.0, bos_token_id=1, eos_token_id=2, **extra,
    )


MIXTRAL_PRESETS = {
    # 4 experts, top-2 (softmax, top-k, renormalised), GQA, a sliding window shorter than the suite's sequences,
    # a padded vocabulary.
    "mixtral-tiny": _mixtral(64, 96, 2, 4, 2, 4, 2, vocab=1000, max_pos=512, aux=0.02, window=6),
    # Unusual shapes (Family.odd): 3 experts with top-2 (an odd expert count), 6 query heads in 2 groups,
    # head_dim 16 != 72 / 6, expert width 100, vocabulary 1001, 3 layers.
    "mixtral-odd": _mixtral(72, 100, 3, 6, 2, 3, 2, vocab=1001, max_pos=300, aux=0.001, head_dim=16),
    # Published config.json values (mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1), from memory, not checked
    # against the files here: see the README's list of unverified values.
    "mixtral-8x7b": _mixtral(4096, 14336, 32, 32, 8, 8, 2, vocab=32000, max_pos=32768, aux=0.02),
    "mixtral-8x22b": _mixtral(6144, 16384, 56, 48, 8, 8, 2, vocab=32768, max_pos=65536, aux=0.001),
}
