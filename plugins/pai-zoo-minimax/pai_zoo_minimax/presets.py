"""Hugging Face configs of MiniMax-M2: the published size (from memory: written without network, not checked
against the published config.json) and small ones for tests."""
from __future__ import annotations

from pai_zoo.quantization import FP8_BLOCK_128

#: The test tokenizer's ``]~!b[`` and ``[e~[`` (:mod:`pai_zoo_minimax.tokenizer_files`).
TOY_BOS, TOY_EOS = 0, 1


def _minimax(*, vocab, hidden, inter, layers, heads, kv, head_dim, rotary_dim, experts, topk, max_pos,
             theta=5000000.0, bos=TOY_BOS, eos=TOY_EOS, **extra) -> dict:
    return dict(model_type="minimax_m2", architectures=["MiniMaxM2ForCausalLM"], vocab_size=vocab,
                hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=head_dim, rotary_dim=rotary_dim, hidden_act="silu",
                max_position_embeddings=max_pos, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_dropout=0.0, num_local_experts=experts, num_experts_per_tok=topk,
                router_aux_loss_coef=0.001, router_jitter_noise=0.0, use_qk_norm=True, qk_norm_type="per_layer",
                rope_parameters={"rope_type": "default", "rope_theta": theta,
                                 "partial_rotary_factor": rotary_dim / head_dim},
                bos_token_id=bos, eos_token_id=eos, **extra)


PRESETS = {
    # Half of each head rotated (rotary_dim 8 of 16), q/k norms over the whole projections, 4 experts top-2.
    "minimax_m2-tiny": _minimax(vocab=512, hidden=64, inter=32, layers=2, heads=4, kv=2, head_dim=16, rotary_dim=8,
                                experts=4, topk=2, max_pos=512),
    # 6 heads over 2 KV heads (GQA 3), head_dim 16 != 48 / 6, a quarter of each head rotated, 6 experts top-3,
    # vocab 601, another RoPE base.
    "minimax_m2-odd": _minimax(vocab=601, hidden=48, inter=24, layers=2, heads=6, kv=2, head_dim=16, rotary_dim=4,
                               experts=6, topk=3, max_pos=512, theta=10000.0),
    # MiniMaxAI/MiniMax-M2 (230B total, 10B active; from memory): 62 layers, 256 experts top-8 of width 1536,
    # 48 heads over 8 KV heads of 128 (64 rotated), RoPE base 5e6, 196608 positions, published as FP8 blocks.
    "minimax-m2-230b": _minimax(vocab=200064, hidden=3072, inter=1536, layers=62, heads=48, kv=8, head_dim=128,
                                rotary_dim=64, experts=256, topk=8, max_pos=196608, bos=200034, eos=200020,
                                scoring_func="sigmoid", use_routing_bias=True,
                                quantization_config=dict(FP8_BLOCK_128)),
}
