"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5) on megatron-core's ``GatedDeltaNet``, for the local spec.

:class:`GatedDeltaNetLayer` keeps megatron-core's parameters and checkpoint layout (``in_proj`` ``[q, k, v, z, beta,
alpha]`` per tensor-parallel rank, ``conv1d`` over ``[q, k, v]`` channels, ``dt_bias``, ``A_log``, ``out_norm``,
``out_proj``) and replaces its forward, which neither megatron-core 0.16 nor 0.19 can run for pai-zoo:

* kernels: ``fla`` / ``causal_conv1d`` where installed, else the torch paths of :mod:`pai_zoo.mcore.kernels`
  (chunked gated delta rule for a prompt, the recurrent step for one decode token, as transformers does);
* records: the attention mask's records and left padding (:mod:`pai_zoo.mcore.segments`) restart both the conv window
  and the delta-rule state at every record start, and padding tokens' inputs are zero (transformers'
  ``apply_mask_to_padding_states``), so packed records never see each other;
* generation: with a :class:`~pai_zoo.mcore.inference.KVCache`, the prompt's forward stores each row's conv window
  (the last ``kernel - 1`` pre-conv ``[q, k, v]`` inputs) and delta-rule state in ``cache.recurrent[layer_number]``;
  a one-token step updates both.

Tensor parallelism splits as megatron-core does: each rank holds ``linear_num_key_heads / tp`` query/key heads and
``linear_num_value_heads / tp`` value heads (its ``in_proj`` rows are its slice of each of q, k, v, z, beta, alpha;
its ``conv1d`` channels its slice of q, k, v; ``dt_bias`` / ``A_log`` its value heads; ``out_proj`` is row-parallel),
so value head ``j`` stays with key head ``j // (hv / hk)``. Both head counts must divide by the TP size.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import import_megatron
from .kernels import causal_conv, gated_delta
from .segments import padding_of, segments

import_megatron()
gated_delta.install()

from megatron.core import parallel_state  # noqa: E402
from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules  # noqa: E402
from megatron.core.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    copy_to_tensor_model_parallel_region,
)
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402

__all__ = ["GatedDeltaNetLayer", "GatedOutputNorm", "gated_delta_net_spec", "kernels"]


@functools.cache
def kernels():
    """``(chunk, recurrent)`` gated delta rules: ``fla``'s where installed, else the torch paths (looked up once)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return gated_delta.chunk_gated_delta_rule, gated_delta.fused_recurrent_gated_delta_rule
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class GatedOutputNorm(torch.nn.Module):
    """The RMSNorm before the output gate (transformers' ``Qwen3NextRMSNormGated`` without its gate): a plain gain
    ``weight`` (not zero-centred), float32 statistics."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **kwargs):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=getattr(config, "params_dtype", torch.float32)))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight
        if torch.is_grad_enabled() and weight.requires_grad and parallel_state.model_parallel_is_initialized() \
                and parallel_state.get_tensor_model_parallel_world_size() > 1:
            # each tensor-parallel rank normalises its own value heads with the one replicated gain, so the gain's
            # gradient is the sum of the ranks' (megatron-core reduces no such gradient): an identity whose
            # backward all-reduces over the tensor-parallel group
            weight = copy_to_tensor_model_parallel_region(weight)
        return weight * h.to(x.dtype)


class GatedDeltaNetLayer(GatedDeltaNet):
    """megatron-core's ``GatedDeltaNet`` with pai-zoo's forward (see the module docstring)."""

    def __init__(self, config, submodules, layer_number=None, **kwargs):
        kwargs.pop("cp_comm_type", None)  # megatron-core 0.16's GatedDeltaNet takes none
        super().__init__(config, submodules, layer_number=layer_number, **kwargs)
        if getattr(self.pg_collection, "cp", None) is not None and self.pg_collection.cp.size() > 1:
            raise NotImplementedError("Gated DeltaNet layers (pai-zoo): context parallelism is not supported")

    # -- pieces -----------------------------------------------------------------------------------------------
    def _conv_weight(self):
        return self.conv1d.weight.squeeze(1), self.conv1d.bias

    def _heads(self, qkv, batch: int, length: int):
        """Split the conv output ``[b, s, qkv]`` into l2-normalised q, k ``[b, s, hk, dk]`` and v ``[b, s, hv, dv]``."""
        tp = self.tp_size
        q, k, v = torch.split(qkv, [self.qk_dim // tp, self.qk_dim // tp, self.v_dim // tp], dim=-1)
        q = q.reshape(batch, length, -1, self.key_head_dim)
        k = k.reshape(batch, length, -1, self.key_head_dim)
        v = v.reshape(batch, length, -1, self.value_head_dim)
        if self.use_qk_l2norm:
            q, k = gated_delta.l2norm(q), gated_delta.l2norm(k)
        if v.shape[2] != q.shape[2]:  # each key head serves hv / hk consecutive value heads
            q, k = (t.repeat_interleave(v.shape[2] // q.shape[2], dim=2) for t in (q, k))
        return q.contiguous(), k.contiguous(), v.contiguous()

    def _decay(self, alpha, beta):
        g = -self.A_log.float().exp() * F.softplus(alpha.float() + self.dt_bias)
        return g, beta.sigmoid()

    def _window(self, qkv_t):
        """The conv window after ``qkv_t`` (``[d, s]``): its last ``kernel - 1`` columns, zeros before."""
        width = self.conv_kernel_dim - 1
        return F.pad(qkv_t, (width, 0))[:, -width:] if width else qkv_t[:, :0]

    # -- forward ----------------------------------------------------------------------------------------------
    def forward(self, hidden_states, attention_mask=None, key_value_states=None, inference_context=None,
                attention_bias=None, packed_seq_params=None, sequence_len_offset=None, *, inference_params=None,
                **kwargs):
        cache = inference_context if inference_context is not None else inference_params
        if packed_seq_params is not None:
            raise NotImplementedError("Gated DeltaNet layers (pai-zoo) read packed records from the attention mask "
                                      "(pai_zoo.mcore.segments), not from packed_seq_params (THD)")
        recurrent = getattr(cache, "recurrent", None) if not self.training else None
        length, batch = hidden_states.shape[0] * self.sp_size, hidden_states.shape[1]
        qkvzba, _ = self.in_proj(hidden_states)  # [s, b, in_proj / tp]
        qkvzba = qkvzba.transpose(0, 1)
        pad = padding_of(attention_mask, length)
        if pad is not None and pad.any():  # transformers zeroes padding inputs (no in_proj bias: the same)
            qkvzba = qkvzba.masked_fill(pad[..., None], 0)
        tp = self.tp_size
        qkv, gate, beta, alpha = torch.split(
            qkvzba, [(self.qk_dim * 2 + self.v_dim) // tp, self.v_dim // tp, self.num_value_heads // tp,
                     self.num_value_heads // tp], dim=-1)
        g, beta = self._decay(alpha, beta)
        if recurrent is not None and length == 1 and self.layer_number in recurrent:
            core = self._decode_step(qkv, g, beta, recurrent)
        else:
            core = self._prompt(qkv, g, beta, attention_mask, length, batch, recurrent)
        out = self._gated_norm(core, gate.reshape(batch, length, -1, self.value_head_dim))
        out = out.reshape(batch, length, -1).transpose(0, 1).contiguous()
        return self.out_proj(out)

    def _gated_norm(self, core, gate):
        """``out_norm(core) * act(gate)`` per value head, as transformers' ``Qwen3NextRMSNormGated``."""
        y = self.out_norm(core.reshape(-1, core.shape[-1]))
        y = y * self.act_fn(gate.reshape(-1, gate.shape[-1]).float())
        return y.to(core.dtype).reshape(core.shape)

    def _decode_step(self, qkv, g, beta, recurrent):
        """One token per row from the cached conv window and delta-rule state (both updated)."""
        conv_state, state = recurrent[self.layer_number]
        weight, bias = self._conv_weight()
        x = causal_conv.causal_conv1d_update(qkv[:, 0].to(conv_state.dtype), conv_state, weight, bias,
                                             self.activation).to(qkv.dtype)
        q, k, v = self._heads(x[:, None], qkv.shape[0], 1)
        _, step = kernels()
        core, state = step(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True)
        recurrent[self.layer_number] = (conv_state, state)
        return core

    def _prompt(self, qkv, g, beta, attention_mask, length: int, batch: int, recurrent):
        """A whole sequence per row, each record (left padding excluded) from a zero state."""
        chunk, _ = kernels()
        weight, bias = self._conv_weight()
        spans = segments(attention_mask, length)
        if spans is None:
            x = causal_conv.activate(causal_conv.causal_conv1d_fn(qkv.transpose(1, 2), weight, bias), self.activation)
            q, k, v = self._heads(x.transpose(1, 2), batch, length)
            core, state = chunk(q, k, v, g=g, beta=beta, output_final_state=recurrent is not None)
            if recurrent is not None:
                windows = torch.stack([self._window(qkv[row].transpose(0, 1)) for row in range(batch)])
                recurrent[self.layer_number] = (windows, state)
            return core
        # records and padding: every record one sequence of a flat batch-1 run (fla's cu_seqlens)
        pieces = [(row, lo, hi) for row, row_spans in enumerate(spans) for lo, hi in row_spans]
        cu = torch.tensor([0] + [hi - lo for _, lo, hi in pieces], device=qkv.device).cumsum(0)

        def flat(t):
            return torch.cat([t[row, lo:hi] for row, lo, hi in pieces])[None]

        x, _ = causal_conv.fla_causal_conv1d(flat(qkv), weight, bias, activation=self.activation, cu_seqlens=cu)
        q, k, v = self._heads(x, 1, int(cu[-1]))
        out, states = chunk(q, k, v, g=flat(g), beta=flat(beta), output_final_state=recurrent is not None,
                            cu_seqlens=cu)
        core = out.new_zeros(batch, length, *out.shape[2:])
        for n, (row, lo, hi) in enumerate(pieces):
            core[row, lo:hi] = out[0, int(cu[n]):int(cu[n + 1])]
        if recurrent is not None:  # each row continues from its last record
            width = self.conv_kernel_dim - 1
            windows = qkv.new_zeros(batch, qkv.shape[-1], width)
            last = states.new_zeros(batch, *states.shape[1:])
            for n, (row, lo, hi) in enumerate(pieces):
                windows[row] = self._window(qkv[row, lo:hi].transpose(0, 1))
                last[row] = states[n]
            recurrent[self.layer_number] = (windows, last)
        return core


def gated_delta_net_spec():
    """The ``ModuleSpec`` of a Gated DeltaNet ``self_attention`` for the local spec (a separate ``input_layernorm``
    in the ``TransformerLayer``; ``in_proj`` a plain column-parallel linear)."""
    return ModuleSpec(
        module=GatedDeltaNetLayer,
        submodules=GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear, out_norm=GatedOutputNorm,
                                           out_proj=RowParallelLinear),
    )
