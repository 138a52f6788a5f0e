"""Hugging Face configs of the published Baichuan and Baichuan2 models (baichuan-inc/*), plus tiny ones."""
from __future__ import annotations


def _baichuan(vocab, hidden, inter, layers, heads, *, rope: bool, v2: bool, arch="BaichuanForCausalLM"):
    cfg = dict(
        model_type="baichuan", architectures=[arch], vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, hidden_act="silu", rms_norm_eps=1e-6,
        initializer_range=0.02, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        use_cache=True,
    )
    if rope:
        cfg["max_position_embeddings"] = 4096
    if v2 or not rope:
        cfg["model_max_length"] = 4096
    if v2:  # Baichuan2's configs carry z_loss_weight (and no norm_head key): the reference config infers NormHead
        cfg["z_loss_weight"] = 0
    return cfg


_PUBLISHED = {
    "baichuan-7b": _baichuan(64000, 4096, 11008, 32, 32, rope=True, v2=False, arch="BaiChuanForCausalLM"),
    "baichuan-13b-base": _baichuan(64000, 5120, 13696, 40, 40, rope=False, v2=False),
    "baichuan2-7b-base": _baichuan(125696, 4096, 11008, 32, 32, rope=True, v2=True),
    "baichuan2-13b-base": _baichuan(125696, 5120, 13696, 40, 40, rope=False, v2=True),
}

PRESETS = {
    # Baichuan2-7B-shaped: RoPE and NormHead; vocabulary not a multiple of 128.
    "baichuan-tiny": {
        **_baichuan(1000, 64, 160, 2, 4, rope=True, v2=True), "max_position_embeddings": 512, "model_max_length": 512,
    },
    # Baichuan-13B-shaped: ALiBi with 6 heads (not a power of two; 3 per rank at TP=2), plain output head.
    "baichuan-alibi-tiny": {
        **_baichuan(1000, 96, 160, 2, 6, rope=False, v2=False), "model_max_length": 512,
    },
    # Baichuan2-13B-shaped, the conformance suite's odd preset: ALiBi with 10 heads (at TP=2 each rank's 5 heads
    # straddle the 8 power-of-two slopes and the 2 extra ones), NormHead, head_dim 8, a vocabulary of 997.
    "baichuan-odd": {**_baichuan(997, 80, 136, 2, 10, rope=False, v2=True), "model_max_length": 512},
    **_PUBLISHED,
    # The chat models keep their base model's architecture and config.
    "baichuan-13b-chat": dict(_PUBLISHED["baichuan-13b-base"]),
    "baichuan2-7b-chat": dict(_PUBLISHED["baichuan2-7b-base"]),
    "baichuan2-13b-chat": dict(_PUBLISHED["baichuan2-13b-base"]),
}
