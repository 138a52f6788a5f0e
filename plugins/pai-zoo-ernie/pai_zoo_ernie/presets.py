"""Hugging Face configs of ERNIE-4.5 checkpoints: the published sizes (from memory: written without network, not
checked against the published config.json files) and small ones for tests.

Every ERNIE-4.5 config has ``pad_token_id`` 0, ``bos_token_id`` 1, ``eos_token_id`` 2, ``rope_theta`` 500000,
131072 positions, RMSNorm eps 1e-5 and no biases (``use_bias`` false).
"""
from __future__ import annotations


def _rope(theta: float = 500000.0) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


def _dense(*, vocab, hidden, inter, layers, heads, kv, head_dim, tie, max_pos=131072, theta=500000.0) -> dict:
    return dict(model_type="ernie4_5", architectures=["Ernie4_5ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
                intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu", max_position_embeddings=max_pos,
                rms_norm_eps=1e-5, tie_word_embeddings=tie, rope_parameters=_rope(theta), use_bias=False,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _moe(*, vocab, hidden, inter, moe_inter, layers, heads, kv, experts, topk, shared, start, end, interval, tie,
         max_pos=131072, theta=500000.0, **extra) -> dict:
    return dict(model_type="ernie4_5_moe", architectures=["Ernie4_5_MoeForCausalLM"], vocab_size=vocab,
                hidden_size=hidden, intermediate_size=inter, moe_intermediate_size=moe_inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, hidden_act="silu",
                max_position_embeddings=max_pos, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                rope_parameters=_rope(theta), use_bias=False, moe_num_experts=experts, moe_k=topk,
                moe_num_shared_experts=shared, moe_layer_start_index=start, moe_layer_end_index=end,
                moe_layer_interval=interval, moe_norm_min=1e-12, router_aux_loss_coef=0.001, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, **extra)


ERNIE_PRESETS = {
    "ernie4_5-tiny": _dense(vocab=512, hidden=64, inter=96, layers=2, heads=4, kv=2, head_dim=16, tie=True,
                            max_pos=512),
    # 6 heads over 2 KV heads (GQA 3), head_dim 12 != 48 / 6, vocab 601, untied head, another RoPE base.
    "ernie4_5-odd": _dense(vocab=601, hidden=48, inter=80, layers=2, heads=6, kv=2, head_dim=12, tie=False,
                           max_pos=512, theta=10000.0),
    # baidu/ERNIE-4.5-0.3B-PT (from memory)
    "ernie-4.5-0.3b": _dense(vocab=103424, hidden=1024, inter=3072, layers=18, heads=16, kv=2, head_dim=128,
                             tie=True),
}

ERNIE_MOE_PRESETS = {
    # Layer 0 dense, layer 1 MoE (transformers' defaults: start 1, end -1, interval 1); 4 experts top-2, one
    # shared expert.
    "ernie4_5_moe-tiny": _moe(vocab=512, hidden=64, inter=96, moe_inter=32, layers=2, heads=4, kv=2, experts=4,
                              topk=2, shared=1, start=1, end=-1, interval=1, tie=True, max_pos=512),
    # 4 layers, MoE on layers 1 and 3 only (interval 2), 6 experts top-3 with 2 shared; 6 heads over 2 KV heads
    # (GQA 3), head_dim 12 != 48 / 6, vocab 601, untied head.
    "ernie4_5_moe-odd": _moe(vocab=601, hidden=48, inter=80, moe_inter=24, layers=4, heads=6, kv=2, experts=6,
                             topk=3, shared=2, start=1, end=3, interval=2, tie=False, max_pos=512, theta=10000.0,
                             head_dim=12),
    # baidu/ERNIE-4.5-21B-A3B-PT (from memory): 64 experts top-6, 2 shared, layer 0 dense.
    "ernie-4.5-21b-a3b": _moe(vocab=103424, hidden=2560, inter=12288, moe_inter=1536, layers=28, heads=20, kv=4,
                              experts=64, topk=6, shared=2, start=1, end=27, interval=1, tie=True),
    # baidu/ERNIE-4.5-300B-A47B-PT (from memory): 64 experts top-8, no shared expert, layers 0-2 dense.
    "ernie-4.5-300b-a47b": _moe(vocab=103424, hidden=8192, inter=28672, moe_inter=3584, layers=54, heads=64, kv=8,
                                experts=64, topk=8, shared=0, start=3, end=53, interval=1, tie=False),
}
