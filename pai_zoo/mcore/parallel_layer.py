"""A transformer layer whose attention and MLP both read the layer's input (GPT-J, Falcon, ...).

megatron-core's ``TransformerLayer`` is sequential: ``h = x + attn(ln1(x))``, then
``h + mlp(ln2(h))``. :class:`ParallelAttentionMLPLayer` computes

    x + attn(ln_attn(x)) + mlp(ln_mlp(x))

with the same submodules (so the same tensor names and tensor-parallel splits). With one
layer norm (``pre_mlp_layernorm`` left as ``IdentityOp``) the MLP reads the input layer
norm's output, as Falcon-7B does; with two (Falcon-40B/180B's ``ln_attn``/``ln_mlp``) the MLP
has its own, stored as ``pre_mlp_layernorm``. :func:`parallel_layer_spec` returns the spec.
"""
from __future__ import annotations

import warnings

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.utils import make_viewless_tensor


class ParallelAttentionMLPLayer(TransformerLayer):
    """``x + attn(input_layernorm(x)) + mlp(pre_mlp_layernorm(x))``; without a
    ``pre_mlp_layernorm`` the MLP reads ``input_layernorm(x)``. No cross-attention."""

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        context=None,
        context_mask=None,
        rotary_pos_emb=None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        inference_context=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        padding_mask=None,
        **kwargs,
    ):
        residual = hidden_states
        attention_input = self.input_layernorm(hidden_states)
        shared = isinstance(self.pre_mlp_layernorm, IdentityOp)
        mlp_input = attention_input if shared else self.pre_mlp_layernorm(hidden_states)
        attention = self.self_attention(
            attention_input,
            attention_mask=attention_mask,
            inference_context=inference_context or kwargs.get("inference_params"),
            rotary_pos_emb=rotary_pos_emb,
            rotary_pos_cos=rotary_pos_cos,
            rotary_pos_sin=rotary_pos_sin,
            rotary_pos_cos_sin=rotary_pos_cos_sin,
            attention_bias=attention_bias,
            packed_seq_params=packed_seq_params,
            sequence_len_offset=sequence_len_offset,
        )
        mlp = self.mlp(mlp_input)
        fusion = self.config.bias_dropout_fusion
        with getattr(self, "bias_dropout_add_exec_handler", torch.enable_grad)():
            hidden_states = self.self_attn_bda(self.training, fusion)(attention, residual, self.hidden_dropout)
            hidden_states = self.mlp_bda(self.training, fusion)(mlp, hidden_states, self.hidden_dropout)
        output = make_viewless_tensor(inp=hidden_states, requires_grad=hidden_states.requires_grad, keep_graph=True)
        return output, context


def parallel_layer_spec(layernorms: int = 1, normalization: str = "LayerNorm", qk_layernorm: bool = False):
    """The ModuleSpec of a :class:`ParallelAttentionMLPLayer` from megatron-core's local modules.

    ``layernorms=1``: one input layer norm feeds attention and MLP (``input_layernorm``);
    ``layernorms=2``: attention and MLP each have their own (``input_layernorm``,
    ``pre_mlp_layernorm``).
    """

    if layernorms not in (1, 2):
        raise ValueError(f"a parallel attention + MLP layer has 1 or 2 layer norms, not {layernorms!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Apex is not installed. Falling back to Torch Norm"
        spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization=normalization)
    spec.module = ParallelAttentionMLPLayer
    if layernorms == 1:
        spec.submodules.pre_mlp_layernorm = IdentityOp
    return spec
