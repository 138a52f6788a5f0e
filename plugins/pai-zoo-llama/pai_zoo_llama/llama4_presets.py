"""Hugging Face configs of Llama 4's text models (``Llama4TextConfig``), published sizes and tiny ones for tests."""
from __future__ import annotations


def _llama4(hidden, inter, inter_mlp, layers, heads, kv, experts, *, vocab=202048, head_dim=128, max_pos=10485760,
            step=1, qk_norm=True, chunk=8192, interval=4, floor_scale=8192, attn_scale=0.1, rope=None,
            ids=(1, 2, 0), **extra):
    return dict(
        model_type="llama4_text", architectures=["Llama4ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, intermediate_size_mlp=inter_mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=max_pos,
        rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0, attention_bias=False,
        num_local_experts=experts, num_experts_per_tok=1, interleave_moe_layer_step=step, use_qk_norm=qk_norm,
        router_aux_loss_coef=0.001, router_jitter_noise=0.0, output_router_logits=False,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 500000.0},
        no_rope_layer_interval=interval, attention_chunk_size=chunk, attn_temperature_tuning=True,
        floor_scale=floor_scale, attn_scale=attn_scale, bos_token_id=ids[0], eos_token_id=ids[1], pad_token_id=ids[2],
        **extra,
    )


LLAMA4_PRESETS = {
    # 2 layers: 0 with RoPE, L2 q/k norm, chunks of 8 tokens and a dense MLP; 1 without RoPE, full attention,
    # temperature tuning stepping every 4 positions and a MoE (4 experts, top-1, a shared expert); llama3 RoPE scaling.
    "llama4-tiny": _llama4(
        64, 48, 96, 2, 4, 2, 4, vocab=1000, head_dim=16, max_pos=512, step=2, chunk=8, interval=2, floor_scale=4,
        attn_scale=0.2, rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    # Unusual shapes (Family.odd): 6 query heads in 2 groups (GQA 3), head_dim 16 != 72 / 6, vocabulary 1001, expert
    # width 40 and dense width 100, 3 experts, MoE on layers 0 and 2 only (moe_layers), and every threshold small:
    # chunks of 6, every 2nd layer without RoPE, temperature stepping every 3 positions with attn_scale 0.5.
    "llama4-odd": _llama4(
        72, 40, 100, 3, 6, 2, 3, vocab=1001, head_dim=16, max_pos=300, chunk=6, interval=2, floor_scale=3,
        attn_scale=0.5, moe_layers=[0, 2],
    ),
    # Published text configs (meta-llama/Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E, text_config), from
    # memory, not checked against the files.
    "llama4-scout-17b-16e": _llama4(
        5120, 8192, 16384, 48, 40, 8, 16, ids=(200000, [200001, 200007, 200008], 200018),
        rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
              "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    ),
    "llama4-maverick-17b-128e": _llama4(
        5120, 8192, 16384, 48, 40, 8, 128, max_pos=1048576, step=2, qk_norm=False,
        ids=(200000, [200001, 200007, 200008], 200018),
    ),
}
