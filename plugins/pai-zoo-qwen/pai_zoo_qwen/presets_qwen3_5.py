"""Qwen3.5 presets: the text configs (``qwen3_5_text``, ``qwen3_5_moe_text``) of the published sizes, and tiny ones.

Qwen3.5 interleaves Gated DeltaNet (``linear_attention``) layers with gated full-attention layers, three to one in
the published models (``full_attention_interval`` 4, written out as ``layer_types``). Its published checkpoints are
vision-language ones (``Qwen3_5ForConditionalGeneration``); these presets are their language models as
``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` hold them.
"""
from __future__ import annotations

from .presets import TOY_ENDOFTEXT

#: <|endoftext|> and <|im_end|> of Qwen3.5's tokenizer (from memory).
QWEN3_5_EOS = 248044
QWEN3_5_IM_END = 248046
QWEN3_5_VOCAB = 248320


def interval_layers(layers: int, interval: int = 4) -> list[str]:
    """transformers' ``layer_types`` for ``full_attention_interval``: every ``interval``-th layer full attention."""
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def _rope(theta: float = 10000000.0, partial: float = 0.25, mrope=(11, 11, 10)) -> dict:
    """Qwen3.5's M-RoPE parameters; on text alone its three sections see the same position (plain RoPE)."""
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial,
            "mrope_section": list(mrope), "mrope_interleaved": True}


def _text(model_type, architecture, hidden, layers, heads, kv, *, head_dim=256, lin_k=16, lin_v=32, lin_dim=128,
          lin_vdim=None, conv=4, layer_types=None, vocab=QWEN3_5_VOCAB, max_pos=262144, tie=False, rope=None,
          eos=QWEN3_5_EOS, **extra):
    return dict(
        model_type=model_type, architectures=[architecture], vocab_size=vocab, hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        linear_num_key_heads=lin_k, linear_num_value_heads=lin_v, linear_key_head_dim=lin_dim,
        linear_value_head_dim=lin_vdim or lin_dim, linear_conv_kernel_dim=conv,
        layer_types=layer_types or interval_layers(layers), max_position_embeddings=max_pos, rms_norm_eps=1e-6,
        rope_parameters=rope or _rope(), hidden_act="silu", tie_word_embeddings=tie, attention_bias=False,
        attention_dropout=0.0, bos_token_id=None, eos_token_id=eos, **extra,
    )


def _dense(hidden, inter, layers, heads, kv, **kw):
    return _text("qwen3_5_text", "Qwen3_5ForCausalLM", hidden, layers, heads, kv, intermediate_size=inter, **kw)


def _moe(hidden, layers, heads, kv, *, experts, topk, expert_ffn, shared_ffn, **kw):
    return _text("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", hidden, layers, heads, kv, num_experts=experts,
                 num_experts_per_tok=topk, moe_intermediate_size=expert_ffn,
                 shared_expert_intermediate_size=shared_ffn, router_aux_loss_coef=0.001, output_router_logits=False,
                 **kw)


_TOY = {"bos_token_id": TOY_ENDOFTEXT, "eos_token_id": TOY_ENDOFTEXT}

QWEN3_5_PRESETS = {
    # Both layer kinds (Gated DeltaNet, then full attention), 2 key heads shared by 4 value heads, GQA 2,
    # head_dim 16 != 64 / 4 with a quarter of it rotated, zero-centred norms.
    "qwen3_5-tiny": {
        **_dense(64, 96, 2, 4, 2, head_dim=16, lin_k=2, lin_v=4, lin_dim=16, vocab=1000, max_pos=320,
                 layer_types=["linear_attention", "full_attention"], rope=_rope(10000.0, mrope=(1, 1, 0))),
        **_TOY,
    },
    # Unusual shapes (Family.odd): value heads = 3 x key heads in the linear attention, key and value head dims
    # apart (12, 8), a 3-tap convolution, GQA 3 (6 heads, 2 groups), head_dim 24 != 72 / 6, vocabulary 997, a tied
    # head, layer kinds in no interval (linear, full, linear).
    "qwen3_5-odd": {
        **_dense(72, 88, 3, 6, 2, head_dim=24, lin_k=2, lin_v=6, lin_dim=12, lin_vdim=8, conv=3, vocab=997,
                 max_pos=320, tie=True, layer_types=["linear_attention", "full_attention", "linear_attention"],
                 rope=_rope(10000.0, mrope=(1, 1, 1))),
        **_TOY,
    },
    # Published config.json values (the text_config of Qwen/Qwen3.5-9B and Qwen/Qwen3.5-27B), from memory:
    # unverified here. The 9B is transformers' Qwen3_5TextConfig defaults.
    "qwen3_5-9b": _dense(4096, 12288, 32, 16, 4),
    "qwen3_5-27b": _dense(5120, 17408, 64, 24, 4, lin_v=48),
}

QWEN3_5_MOE_PRESETS = {
    # 4 routed experts (top 2, renormalised) plus the gated shared expert; both layer kinds.
    "qwen3_5_moe-tiny": {
        **_moe(64, 2, 4, 2, experts=4, topk=2, expert_ffn=32, shared_ffn=48, head_dim=16, lin_k=2, lin_v=4,
               lin_dim=16, vocab=1000, max_pos=320, layer_types=["linear_attention", "full_attention"],
               rope=_rope(10000.0, mrope=(1, 1, 0))),
        **_TOY,
    },
    # Unusual shapes (Family.odd): 3 experts (top 2), expert width 40 and shared width 56, value heads = 3 x key
    # heads, key/value head dims 12/8, GQA 3, head_dim 24 != 72 / 6, vocabulary 997, tied head.
    "qwen3_5_moe-odd": {
        **_moe(72, 3, 6, 2, experts=3, topk=2, expert_ffn=40, shared_ffn=56, head_dim=24, lin_k=2, lin_v=6,
               lin_dim=12, lin_vdim=8, conv=3, vocab=997, max_pos=320, tie=True,
               layer_types=["linear_attention", "full_attention", "linear_attention"],
               rope=_rope(10000.0, mrope=(1, 1, 1))),
        **_TOY,
    },
    # Published config.json values (the text_config of Qwen/Qwen3.5-35B-A3B and Qwen/Qwen3.5-397B-A17B), from
    # memory: unverified here. The 35B-A3B is transformers' Qwen3_5MoeTextConfig defaults.
    "qwen3_5-35b-a3b": _moe(2048, 40, 16, 2, experts=256, topk=8, expert_ffn=512, shared_ffn=512),
    "qwen3_5-397b-a17b": _moe(4096, 60, 32, 2, experts=512, topk=10, expert_ffn=1024, shared_ffn=1024,
                                  lin_v=64),
}
