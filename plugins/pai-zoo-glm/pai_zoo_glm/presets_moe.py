"""Hugging Face configs of GLM-4.5 (``Glm4MoeForCausalLM``, model_type ``glm4_moe``), plus tiny ones for tests.

The published values are from the checkpoints' config.json files as remembered here, not checked against them
(the README lists them as unverified)."""
from __future__ import annotations

from .presets import GLM_EOS, GLM_PAD

#: The test tokenizer's <|endoftext|>, <|user|>, <|observation|> (write_glm4_tokenizer: special tokens after its
#: 400 learnt ones, in GLM-4's order), the EOS/PAD of the tiny presets as GLM_EOS/GLM_PAD are the real ones'.
TOY_EOS, TOY_PAD = [400, 407, 409], 400


def _glm4_moe(hidden, inter, layers, heads, kv, *, experts, topk, expert_ffn, shared, dense, scaling, qk_norm,
              groups=(1, 1), vocab=151552, head_dim=128, max_pos=131072, theta=1000000.0, eps=1e-5, mtp=1):
    return dict(
        model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, hidden_act="silu", attention_bias=True, attention_dropout=0.0,
        max_position_embeddings=max_pos, rms_norm_eps=eps, tie_word_embeddings=False, use_qk_norm=qk_norm,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.5},
        n_routed_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=expert_ffn,
        n_shared_experts=shared, first_k_dense_replace=dense, routed_scaling_factor=scaling, norm_topk_prob=True,
        n_group=groups[0], topk_group=groups[1], num_nextn_predict_layers=mtp,
        pad_token_id=GLM_PAD, eos_token_id=GLM_EOS,
    )


GLM4_MOE_PRESETS = {
    # 2 layers (layer 0 dense, layer 1 MoE), 4 experts in 2 groups (one chosen per token), top-2 sigmoid routing
    # with the score-correction bias and a routed scaling of 2.5, one shared expert, per-head q/k norms, GQA 4,
    # head_dim 16 != 64 / 8, vocabulary 1000, no MTP layer.
    "glm4-moe-tiny": {
        **_glm4_moe(64, 160, 2, 8, 2, experts=4, topk=2, expert_ffn=48, shared=1, dense=1, scaling=2.5,
                    qk_norm=True, groups=(2, 1), vocab=1000, head_dim=16, max_pos=288, mtp=0),
        "pad_token_id": TOY_PAD, "eos_token_id": TOY_EOS,
    },
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 48 / 6,
    # vocabulary 997, 4 experts top-3 in one group, two shared experts (one MLP twice an expert's width), no q/k
    # norms, rms_norm_eps 1e-6, rope theta 50000 on half of each head.
    "glm4-moe-odd": {
        **_glm4_moe(48, 120, 2, 6, 2, experts=4, topk=3, expert_ffn=40, shared=2, dense=1, scaling=1.0,
                    qk_norm=False, vocab=997, head_dim=20, max_pos=300, theta=50000.0, eps=1e-6, mtp=0),
        "pad_token_id": TOY_PAD, "eos_token_id": TOY_EOS,
    },
    # zai-org/GLM-4.5 (355B total, 32B active) and zai-org/GLM-4.5-Air (106B, 12B active): unverified values.
    "glm-4.5": _glm4_moe(5120, 12288, 92, 96, 8, experts=160, topk=8, expert_ffn=1536, shared=1, dense=3,
                         scaling=2.5, qk_norm=True),
    "glm-4.5-air": _glm4_moe(4096, 10944, 46, 96, 8, experts=128, topk=8, expert_ffn=1408, shared=1, dense=1,
                             scaling=1.0, qk_norm=False),
}
