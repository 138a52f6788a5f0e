"""Hugging Face configs of the published Qwen sizes (config.json of the base checkpoints), plus tiny ones for tests.

Qwen's embedding tables have more rows than its tokenizer has tokens (151936 or 152064 rows for ~151650 tokens):
``vocab_size`` is the table's, and the converted models keep every row.
"""
from __future__ import annotations

from pai_zoo.quantization import FP8_BLOCK_128

QWEN_BOS = QWEN_EOS = 151643  # <|endoftext|>
QWEN_IM_END = 151645  # <|im_end|>
#: <|endoftext|> of the test tokenizer (write_qwen2_tokenizer: after its 400 learnt tokens), the BOS/EOS of the
#: tiny and odd presets as 151643 is the real ones'.
TOY_ENDOFTEXT = 400


def _qwen2(hidden, inter, layers, heads, kv, vocab, *, max_pos, window_layers, tie, theta=1000000.0, eps=1e-6):
    return dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_pos,
        rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        hidden_act="silu",
        tie_word_embeddings=tie,
        use_sliding_window=False,
        sliding_window=max_pos,
        max_window_layers=window_layers,
        attention_dropout=0.0,
        bos_token_id=QWEN_BOS,
        eos_token_id=QWEN_EOS,
    )


def _qwen3(hidden, inter, layers, heads, kv, *, tie, vocab=151936):
    return dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, hidden_act="silu", tie_word_embeddings=tie,
        attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=layers,
        attention_dropout=0.0, bos_token_id=QWEN_BOS, eos_token_id=QWEN_IM_END,
    )


def _qwen_v1(hidden, inter, layers, heads, *, vocab=151936, seq_length=8192, max_pos=32768):
    return dict(
        model_type="qwen", architectures=["QWenLMHeadModel"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, kv_channels=hidden // heads,
        layer_norm_epsilon=1e-6, max_position_embeddings=max_pos, seq_length=seq_length, rotary_emb_base=10000,
        rotary_pct=1.0, no_bias=True, tie_word_embeddings=False, scale_attn_weights=True, emb_dropout_prob=0.0,
        attn_dropout_prob=0.0, use_dynamic_ntk=True, use_logn_attn=True, use_flash_attn="auto",
        bf16=False, fp16=False, fp32=False,
    )


QWEN2_PRESETS = {
    # Qwen2-shaped, small enough for a CPU test: GQA (4 query heads per group), QKV bias, tied embeddings,
    # rope theta 1e6, vocabulary not a multiple of 128, 288 positions.
    "qwen2-tiny": {
        **_qwen2(64, 160, 2, 8, 2, 1000, max_pos=288, window_layers=2, tie=True),
        "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 72 / 6 (a
    # config.json key transformers' Qwen2 reads though Qwen2Config does not declare it), vocabulary 1001, QKV bias,
    # untied head, rms_norm_eps 1e-5, rope theta 123456, 300 positions.
    "qwen2-odd": {
        **_qwen2(72, 136, 2, 6, 2, 1001, max_pos=300, window_layers=2, tie=False, theta=123456.0, eps=1e-5),
        "head_dim": 20, "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    "qwen1.5-0.5b": _qwen2(1024, 2816, 24, 16, 16, 151936, max_pos=32768, window_layers=21, tie=True),
    "qwen1.5-1.8b": _qwen2(2048, 5504, 24, 16, 16, 151936, max_pos=32768, window_layers=21, tie=False),
    "qwen1.5-4b": _qwen2(2560, 6912, 40, 20, 20, 151936, max_pos=32768, window_layers=21, tie=False, theta=5000000.0),
    "qwen1.5-7b": _qwen2(4096, 11008, 32, 32, 32, 151936, max_pos=32768, window_layers=28, tie=False),
    "qwen1.5-14b": _qwen2(5120, 13696, 40, 40, 40, 152064, max_pos=32768, window_layers=35, tie=False),
    "qwen1.5-32b": _qwen2(5120, 27392, 64, 40, 8, 152064, max_pos=32768, window_layers=28, tie=False),
    "qwen1.5-72b": _qwen2(8192, 24576, 80, 64, 64, 152064, max_pos=32768, window_layers=28, tie=False),
    "qwen2-0.5b": _qwen2(896, 4864, 24, 14, 2, 151936, max_pos=131072, window_layers=24, tie=True),
    "qwen2-1.5b": _qwen2(1536, 8960, 28, 12, 2, 151936, max_pos=131072, window_layers=28, tie=True),
    "qwen2-7b": _qwen2(3584, 18944, 28, 28, 4, 152064, max_pos=131072, window_layers=28, tie=False),
    "qwen2-72b": _qwen2(8192, 29568, 80, 64, 8, 152064, max_pos=131072, window_layers=80, tie=False, eps=1e-5),
    "qwen2.5-0.5b": _qwen2(896, 4864, 24, 14, 2, 151936, max_pos=32768, window_layers=24, tie=True),
    "qwen2.5-1.5b": _qwen2(1536, 8960, 28, 12, 2, 151936, max_pos=131072, window_layers=28, tie=True),
    "qwen2.5-3b": _qwen2(2048, 11008, 36, 16, 2, 151936, max_pos=32768, window_layers=36, tie=True),
    "qwen2.5-7b": _qwen2(3584, 18944, 28, 28, 4, 152064, max_pos=131072, window_layers=28, tie=False),
    "qwen2.5-14b": _qwen2(5120, 13824, 48, 40, 8, 152064, max_pos=131072, window_layers=48, tie=False, eps=1e-5),
    "qwen2.5-32b": _qwen2(5120, 27648, 64, 40, 8, 152064, max_pos=131072, window_layers=64, tie=False, eps=1e-5),
    "qwen2.5-72b": _qwen2(8192, 29568, 80, 64, 8, 152064, max_pos=131072, window_layers=80, tie=False, eps=1e-5),
}



def _fp8(config: dict) -> dict:
    """A published Qwen3 config as its ``-FP8`` release has it: the same model with ``quantization_config``."""
    return {**config, "quantization_config": dict(FP8_BLOCK_128)}


QWEN3_PRESETS = {
    # Qwen3-shaped: per-head q/k RMSNorm, explicit head_dim (16 != 64 / 8), GQA, no QKV bias, untied head.
    "qwen3-tiny": {
        **_qwen3(64, 160, 2, 8, 2, tie=False, vocab=1000),
        "head_dim": 16, "max_position_embeddings": 288, "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Unusual shapes (Family.odd): 6 query heads in 2 key/value groups (GQA ratio 3), head_dim 20 != 72 / 6,
    # vocabulary 997, tied head, rms_norm_eps 1e-5, rope theta 250000, 300 positions.
    "qwen3-odd": {
        **_qwen3(72, 136, 2, 6, 2, tie=True, vocab=997),
        "head_dim": 20, "max_position_embeddings": 300, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0},
        "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, tie=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 8, tie=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 8, tie=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, tie=False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, 8, tie=False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, 8, tie=False),
}
QWEN3_PRESETS.update({f"{name}-fp8": _fp8(QWEN3_PRESETS[name]) for name in (
    "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b")})

QWEN_V1_PRESETS = {
    # Qwen-v1-shaped: fused c_attn with bias, w1/w2 SwiGLU (intermediate_size is twice the MLP width), RMSNorm,
    # partial rotary (rotary_pct 0.5), vocabulary not a multiple of 128, seq_length 288.
    "qwen-v1-tiny": {
        **_qwen_v1(64, 320, 2, 4, vocab=1000, seq_length=288, max_pos=288),
        "rotary_pct": 0.5,
    },
    # Unusual shapes (Family.odd): 6 heads of 12 channels (Qwen v1 has neither GQA nor a free head_dim: c_attn
    # splits into hidden_size-wide q, k, v), rotary on 6 of them, vocabulary 1001, biases everywhere
    # (no_bias=false), MLP width 100, layer_norm_epsilon 1e-5, rotary base 50000, 300 positions.
    "qwen-v1-odd": {
        **_qwen_v1(72, 200, 2, 6, vocab=1001, seq_length=300, max_pos=300),
        "rotary_pct": 0.5, "no_bias": False, "layer_norm_epsilon": 1e-5, "rotary_emb_base": 50000,
    },
    "qwen-7b": _qwen_v1(4096, 22016, 32, 32, seq_length=8192),
}


def _qwen2_moe(hidden, inter, layers, heads, kv, *, experts, topk, expert_ffn, shared_ffn, norm_topk, vocab=151936,
               max_pos=32768, window_layers=None, eps=1e-6, theta=1000000.0, tie=False):
    return dict(
        model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=max_pos, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        hidden_act="silu", tie_word_embeddings=tie, use_sliding_window=False, sliding_window=max_pos,
        max_window_layers=layers if window_layers is None else window_layers, attention_dropout=0.0,
        decoder_sparse_step=1, mlp_only_layers=[], num_experts=experts, num_experts_per_tok=topk,
        moe_intermediate_size=expert_ffn, shared_expert_intermediate_size=shared_ffn, norm_topk_prob=norm_topk,
        router_aux_loss_coef=0.001, output_router_logits=False, bos_token_id=QWEN_BOS, eos_token_id=QWEN_EOS,
    )


def _qwen3_moe(hidden, inter, layers, heads, kv, *, experts, topk, expert_ffn, norm_topk=True, vocab=151936,
               head_dim=128, max_pos=40960, window=None, tie=False):
    return dict(
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, hidden_act="silu", tie_word_embeddings=tie,
        attention_bias=False, use_sliding_window=window is not None, sliding_window=window, max_window_layers=layers,
        attention_dropout=0.0, decoder_sparse_step=1, mlp_only_layers=[], num_experts=experts,
        num_experts_per_tok=topk, moe_intermediate_size=expert_ffn, norm_topk_prob=norm_topk,
        router_aux_loss_coef=0.001, output_router_logits=False, bos_token_id=QWEN_BOS, eos_token_id=QWEN_IM_END,
    )


QWEN2_MOE_PRESETS = {
    # 4 experts, top-2 without renormalisation (norm_topk_prob false, as Qwen1.5-MoE), a gated shared expert
    # wider than the routed ones, QKV bias, GQA, vocabulary not a multiple of 128, 288 positions.
    "qwen2-moe-tiny": {
        **_qwen2_moe(64, 160, 2, 8, 2, experts=4, topk=2, expert_ffn=48, shared_ffn=96, norm_topk=False, vocab=1000,
                     max_pos=288),
        "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Unusual shapes (Family.odd): 5 experts with top-3 renormalised (norm_topk_prob true), expert width 40,
    # shared expert 56, 6 query heads in 2 groups, head_dim 20 != 72 / 6, vocabulary 1001, 3 layers.
    "qwen2-moe-odd": {
        **_qwen2_moe(72, 136, 3, 6, 2, experts=5, topk=3, expert_ffn=40, shared_ffn=56, norm_topk=True, vocab=1001,
                     max_pos=300, eps=1e-5, theta=123456.0),
        "head_dim": 20, "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Published config.json values (Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen2-57B-A14B), from memory: unverified here.
    "qwen1.5-moe-a2.7b": _qwen2_moe(2048, 5632, 24, 16, 16, experts=60, topk=4, expert_ffn=1408, shared_ffn=5632,
                                    norm_topk=False, max_pos=8192, window_layers=21),
    "qwen2-57b-a14b": _qwen2_moe(3584, 18944, 28, 28, 4, experts=64, topk=8, expert_ffn=2560, shared_ffn=20480,
                                 norm_topk=False, max_pos=131072, window_layers=28),
}

QWEN3_MOE_PRESETS = {
    # 4 experts, top-2 renormalised, per-head q/k norms, head_dim 16 != 64 / 8, a sliding window shorter than the
    # suite's sequences, GQA, vocabulary not a multiple of 128.
    "qwen3-moe-tiny": {
        **_qwen3_moe(64, 160, 2, 8, 2, experts=4, topk=2, expert_ffn=48, vocab=1000, head_dim=16, max_pos=288,
                     window=6),
        "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Unusual shapes (Family.odd): 3 experts with top-2 not renormalised, expert width 40, 6 query heads in 2
    # groups, head_dim 20, vocabulary 997, tied head, 3 layers.
    "qwen3-moe-odd": {
        **_qwen3_moe(72, 136, 3, 6, 2, experts=3, topk=2, expert_ffn=40, norm_topk=False, vocab=997, head_dim=20,
                     max_pos=300, tie=True),
        "bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT,
    },
    # Published config.json values (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B), from memory: unverified here.
    "qwen3-30b-a3b": _qwen3_moe(2048, 6144, 48, 32, 4, experts=128, topk=8, expert_ffn=768),
    "qwen3-235b-a22b": _qwen3_moe(4096, 12288, 94, 64, 4, experts=128, topk=8, expert_ffn=1536),
}
QWEN3_MOE_PRESETS.update(
    {f"{name}-fp8": _fp8(QWEN3_MOE_PRESETS[name]) for name in ("qwen3-30b-a3b", "qwen3-235b-a22b")})
