"""Hugging Face configs of Nemotron-H: the published size (from memory: written without network, not checked against
the published config.json) and small ones for tests."""
from __future__ import annotations

#: The test tokenizer's ``<unk>``, ``<s>`` and ``</s>`` (:mod:`pai_zoo_nemotron.tokenizer_files`).
TOY_PAD, TOY_BOS, TOY_EOS = 0, 1, 2


def _nemotron_h(*, vocab, hidden, inter, pattern, heads, kv, head_dim, mamba_heads, mamba_head_dim, state, groups,
                conv=4, chunk=128, max_pos=4096, eps=1e-5, **extra) -> dict:
    return dict(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], vocab_size=vocab, hidden_size=hidden,
                intermediate_size=inter, hybrid_override_pattern=pattern, num_hidden_layers=len(pattern),
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, mamba_num_heads=mamba_heads,
                mamba_head_dim=mamba_head_dim, ssm_state_size=state, n_groups=groups, conv_kernel=conv,
                chunk_size=chunk, max_position_embeddings=max_pos, layer_norm_epsilon=eps, mlp_hidden_act="relu2",
                mamba_hidden_act="silu", use_conv_bias=True, use_bias=False, mlp_bias=False, attention_bias=False,
                tie_word_embeddings=False, pad_token_id=TOY_PAD, bos_token_id=TOY_BOS, eos_token_id=TOY_EOS, **extra)


def _moe(*, experts, topk, width, shared, scale=1.0) -> dict:
    return dict(n_routed_experts=experts, num_experts_per_tok=topk, moe_intermediate_size=width,
                moe_shared_expert_intermediate_size=shared, n_shared_experts=1, routed_scaling_factor=scale,
                n_group=1, topk_group=1, norm_topk_prob=True, moe_latent_size=None)


PRESETS = {
    # Mamba, attention, Mamba, MLP; 4 Mamba heads of 16 in 2 groups, state 16, chunks of 16.
    "nemotron_h-tiny": _nemotron_h(vocab=512, hidden=64, inter=96, pattern="M*M-", heads=4, kv=2, head_dim=16,
                                   mamba_heads=4, mamba_head_dim=16, state=16, groups=2, chunk=16),
    # Mamba, MLP, attention, MoE (the kinds tiny lacks); 6 Mamba heads of 10 (not a power of two) in 2 groups, state
    # 12, conv width 3, chunks of 8 (the forward checks' 16 tokens cross it); 6 attention heads over 2 KV heads (GQA 3)
    # of 12 != 48 / 6; 6 experts top-3 of 20 (sigmoid, scaled by 1.5) and a shared expert of 24; vocab 601; eps 1e-6.
    "nemotron_h-odd": _nemotron_h(vocab=601, hidden=48, inter=40, pattern="M-*E", heads=6, kv=2, head_dim=12,
                                  mamba_heads=6, mamba_head_dim=10, state=12, groups=2, conv=3, chunk=8, eps=1e-6,
                                  **_moe(experts=6, topk=3, width=20, shared=24, scale=1.5)),
    # nvidia/Nemotron-H-8B-Base-8K (from memory): 52 layers (24 Mamba-2, 4 attention, 24 MLP), hidden 4096, squared
    # ReLU MLP of 21504, 32 heads over 8 KV heads of 128, 128 Mamba heads of 64 in 8 groups, state 128, no RoPE.
    "nemotron-h-8b": _nemotron_h(vocab=131072, hidden=4096, inter=21504,
                                 pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", heads=32, kv=8,
                                 head_dim=128, mamba_heads=128, mamba_head_dim=64, state=128, groups=8, max_pos=8192),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B (from memory, the pattern and sizes as remembered, not checked): 52 layers
    # (23 Mamba-2, 23 MoE, 6 attention), hidden 2688, 128 experts top-6 of 1856 (sigmoid, scaled by 2.5) and a
    # shared expert of 3712, 32 heads over 2 KV heads of 128, 64 Mamba heads of 64 in 8 groups.
    "nemotron-3-nano-30b-a3b": _nemotron_h(
        vocab=131072, hidden=2688, inter=1856, pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", heads=32,
        kv=2, head_dim=128, mamba_heads=64, mamba_head_dim=64, state=128, groups=8, max_pos=262144,
        **_moe(experts=128, topk=6, width=1856, shared=3712, scale=2.5)),
}
