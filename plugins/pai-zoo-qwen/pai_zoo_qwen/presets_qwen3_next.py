"""Qwen3-Next presets: the published size and tiny ones.

Qwen3-Next interleaves Gated DeltaNet (``linear_attention``) layers with gated full-attention layers, three to one
in the published model (``full_attention_interval`` 4), and every layer's MLP is a mixture of experts with a
sigmoid-gated shared expert.
"""
from __future__ import annotations

from .presets import QWEN_BOS, QWEN_EOS, TOY_ENDOFTEXT

QWEN_IM_END = 151645  # <|im_end|>: the instruct model's eos


def _qwen3_next(hidden, inter, layers, heads, kv, *, head_dim=256, lin_k=16, lin_v=32, lin_dim=128, lin_vdim=None,
                conv=4, experts=512, topk=10, expert_ffn=512, shared_ffn=512, norm_topk=True, layer_types=None,
                interval=None, vocab=151936, max_pos=262144, tie=False, theta=10000000.0, partial=0.25, **extra):
    config = dict(
        model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, linear_num_key_heads=lin_k, linear_num_value_heads=lin_v, linear_key_head_dim=lin_dim,
        linear_value_head_dim=lin_vdim or lin_dim, linear_conv_kernel_dim=conv, num_experts=experts,
        num_experts_per_tok=topk, moe_intermediate_size=expert_ffn, shared_expert_intermediate_size=shared_ffn,
        norm_topk_prob=norm_topk, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
        output_router_logits=False, max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial},
        hidden_act="silu", tie_word_embeddings=tie, attention_bias=False, attention_dropout=0.0,
        bos_token_id=QWEN_BOS, eos_token_id=QWEN_EOS,
    )
    config.update(extra)
    if layer_types is not None:
        config["layer_types"] = layer_types
    if interval is not None:
        config["full_attention_interval"] = interval
    return config


_TOY = {"bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT}

QWEN3_NEXT_PRESETS = {
    # Both layer kinds (linear, full), 4 routed experts (top 2) and the gated shared expert, 2 key heads shared by 4
    # value heads, GQA 2, head_dim 16 != 64 / 4 with a quarter rotated, zero-centred norms.
    "qwen3_next-tiny": {
        **_qwen3_next(64, 96, 2, 4, 2, head_dim=16, lin_k=2, lin_v=4, lin_dim=16, experts=4, topk=2, expert_ffn=32,
                      shared_ffn=48, vocab=1000, max_pos=320, theta=10000.0,
                      layer_types=["linear_attention", "full_attention"]),
        **_TOY,
    },
    # Unusual shapes (Family.odd): value heads = 3 x key heads, key/value head dims 12/8, a 3-tap convolution, GQA 3
    # (6 heads, 2 groups), head_dim 20 != 72 / 6 (half rotated), 3 experts (top 2, not renormalised) of width 40
    # and a shared expert of 56, the middle layer a dense MLP (mlp_only_layers), vocabulary 997, tied head.
    "qwen3_next-odd": {
        **_qwen3_next(72, 88, 3, 6, 2, head_dim=20, lin_k=2, lin_v=6, lin_dim=12, lin_vdim=8, conv=3, experts=3,
                      topk=2, expert_ffn=40, shared_ffn=56, norm_topk=False, vocab=997, max_pos=320, tie=True,
                      theta=10000.0, partial=0.5,
                      layer_types=["linear_attention", "full_attention", "linear_attention"]),
        "mlp_only_layers": [1],
        **_TOY,
    },
    # Published config.json values (Qwen/Qwen3-Next-80B-A3B-Instruct), from memory: unverified here.
    "qwen3_next-80b-a3b": _qwen3_next(2048, 5120, 48, 16, 2, interval=4, eos_token_id=QWEN_IM_END),
}
