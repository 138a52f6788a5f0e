"""Weight-table rows shared by families whose Hugging Face checkpoints use the Llama layout
(``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn, post_attention_layernorm,
mlp}``, ``model.norm``, ``lm_head``): Llama, Mistral, Qwen2/3, GLM-4, Baichuan."""
from __future__ import annotations

from .mapping import QKV, Copy, GateUp, Output, Row, Vocab

#: Per-layer name prefixes: Hugging Face's Llama layout and megatron-core's GPT model.
HF_LAYER, MCORE_LAYER = "model.layers.{layer}.", "decoder.layers.{layer}."


def llama_layout(qkv: Row | None = None, fc1: Row | None = None) -> list[Row]:
    """The Llama layout's rows. ``qkv`` and ``fc1`` replace the rows of the fused attention input
    (default: separate ``q/k/v_proj``) and the MLP input (default: separate ``gate/up_proj``)."""
    L, M = HF_LAYER, MCORE_LAYER
    return [
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy(L + "input_layernorm.weight", M + "input_layernorm.weight"),
        qkv or QKV(L + "self_attn.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
        Copy(L + "self_attn.o_proj.weight", M + "self_attention.linear_proj.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        fc1 or GateUp(L + "mlp.{gate,up}_proj.weight", M + "mlp.linear_fc1.weight"),
        Copy(L + "mlp.down_proj.weight", M + "mlp.linear_fc2.weight"),
        Copy("model.norm.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    ]


def qkv_bias(layer: str = HF_LAYER) -> Row:
    """The ``q/k/v_proj`` biases into ``linear_qkv.bias``."""
    return QKV(layer + "self_attn.{q,k,v}_proj.bias", MCORE_LAYER + "self_attention.linear_qkv.bias")
