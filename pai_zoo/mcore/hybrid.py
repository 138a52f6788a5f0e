"""Mamba hybrids inside megatron-core's ``GPTModel``: a block spec with one layer per character of the config's
pattern (:data:`~pai_zoo.plugin.hybrid.HYBRID_PATTERN`).

* ``M``: :class:`HybridMambaLayer`, megatron-core's ``MambaLayer`` (``norm``, ``mixer``: :class:`HybridMambaMixer`, a
  ``MambaMixer`` with its parameters and names: ``mixer.in_proj``, ``conv1d``, ``A_log``, ``D``, ``dt_bias``,
  ``norm``, ``out_proj``) taking ``TransformerBlock``'s keyword arguments and returning ``(hidden, None)`` as a
  ``TransformerLayer`` does;
* ``*``: a ``TransformerLayer`` whose MLP is an ``IdentityOp``; ``-`` and ``E``: one whose attention is, with the dense
  or the MoE MLP of the config (as Megatron-LM's ``MambaStack`` builds them, same names).

So generation, training, TP/PP and conversion take a hybrid as any GPT model.

The mixer reads the records and the padding from the attention mask (:mod:`pai_zoo.mcore.segments`): padding tokens'
inputs are zeroed (``in_proj``'s outputs, the same without a bias, and after the conv, as transformers'
``apply_mask_to_padding_states``), and the conv and the scan restart at each record start (``seq_idx``:
``causal_conv1d`` and ``mamba_ssm`` kernels, or the torch paths of :mod:`pai_zoo.mcore.kernels`). In generation (a
:class:`~pai_zoo.mcore.inference.KVCache`) it keeps ``(conv_state, ssm_state)`` in ``KVCache.recurrent[layer_number]``:
the prompt's forward fills them, each decode step advances them by one token.

Tensor parallelism splits as megatron-core's ``MambaMixer`` does: ``in_proj`` is column-parallel with each rank's rows
``[z, x, B, C, dt]`` of its own heads and groups (its ``sharded_state_dict`` stores the five parts as separate global
tensors ``in_proj.weight.{z,x,B,C,dt}``), ``conv1d`` over the rank's x, B and C channels, ``A_log``/``D``/``dt_bias``
by head, the gated norm by group (whole groups per rank: ``n_groups`` must divide by TP), ``out_proj`` row-parallel.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules, get_transformer_layer_offset

from ..plugin.hybrid import CHUNK_SIZE, CONV_KERNEL, HYBRID_PATTERN, hybrid_kinds
from .kernels import mamba2
from .segments import padding_of, record_starts

mamba2.install()
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules  # noqa: E402
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules  # noqa: E402

__all__ = ["HybridMambaLayer", "HybridMambaMixer", "hybrid_layer_specs", "mamba_layer_spec"]


def _seq_idx(starts):
    """``[b, s]`` int32 record index per token from the record starts, or ``None`` with one record per row."""
    if starts is None or int(starts.sum()) == starts.shape[0]:
        return None
    return (starts.long().cumsum(-1) - 1).clamp(min=0).to(torch.int32)


_CONV_NAMES = {"conv1d_weight": "conv1d.weight", "conv1d_bias": "conv1d.bias"}


def _conv_names_out(module, state, prefix, _):
    for old, new in _CONV_NAMES.items():
        if prefix + old in state:
            state[prefix + new] = state.pop(prefix + old)


def _conv_names_in(state, prefix, *_):
    for old, new in _CONV_NAMES.items():
        if prefix + new in state:
            state[prefix + old] = state.pop(prefix + new)


class HybridMambaMixer(MambaMixer):
    """megatron-core's ``MambaMixer`` (parameters, names, TP split, ``sharded_state_dict``) whose forward takes the
    attention mask and pai-zoo's KV cache (see the module docstring). The gated norm's epsilon is the config's
    ``layernorm_epsilon`` (megatron-core builds it with 1e-5)."""

    def __init__(self, config, submodules, d_model, **kwargs):
        super().__init__(config, submodules, d_model, **kwargs)
        if self.rmsnorm:
            self.norm.eps = config.layernorm_epsilon
        if not hasattr(self, "conv1d"):  # megatron-core 0.19 holds the conv's parameters directly: same names as 0.16's
            self._register_state_dict_hook(_conv_names_out)
            self._register_load_state_dict_pre_hook(_conv_names_in)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """megatron-core's, its entries named as :meth:`state_dict` names them (``conv1d.weight`` in 0.19 too; the
        checkpoint keys are those already)."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        for old, new in _CONV_NAMES.items():
            if prefix + old in sharded:
                sharded[prefix + new] = sharded.pop(prefix + old)
        return sharded

    def _conv(self):
        """The conv's ``(weight [d, w], bias)`` (a ``Conv1d`` in megatron-core 0.16, two parameters in 0.19)."""
        conv = getattr(self, "conv1d", None)
        weight, bias = (conv.weight, conv.bias) if conv is not None else (self.conv1d_weight, self.conv1d_bias)
        return weight.squeeze(1), bias

    def forward(self, hidden_states, inference_context=None, attention_mask=None, **_):
        cache = inference_context if inference_context is not None and hasattr(inference_context, "recurrent") \
            else None
        if cache is not None and cache.sequence_len_offset > 0:
            return self._step(hidden_states, *cache.recurrent[self.layer_number])
        zxbcdt, _ = self.in_proj(hidden_states)  # the whole sequence (gathered under sequence parallelism)
        length, batch, _ = zxbcdt.shape
        pad = padding_of(attention_mask, length)
        if pad is not None:  # zero inputs of padding: in_proj has no bias, so its outputs there are zero
            zxbcdt = zxbcdt * (~pad).t()[..., None].to(zxbcdt.dtype)
        zxbcdt = zxbcdt.transpose(0, 1)  # [b, l, d]
        inner, groups, heads = self.d_inner_local_tp, self.ngroups_local_tp, self.nheads_local_tp
        z, xbc, dt = torch.split(zxbcdt, [inner, inner + 2 * groups * self.d_state, heads], dim=-1)
        seq_idx = _seq_idx(record_starts(attention_mask, length))
        if cache is not None:
            conv_state = F.pad(xbc.transpose(1, 2), (self.d_conv - length, 0)).contiguous()  # the last d_conv inputs
        weight, bias = self._conv()
        conv = mamba2.pick("causal_conv1d_fn", weight)
        channels_last = xbc.transpose(1, 2) if seq_idx is not None else xbc.transpose(1, 2).contiguous()
        xbc = conv(channels_last, weight, bias, seq_idx=seq_idx, activation="silu").transpose(1, 2)
        if pad is not None:
            xbc = xbc * (~pad)[..., None].to(xbc.dtype)
        x, B, C = torch.split(xbc, [inner, groups * self.d_state, groups * self.d_state], dim=-1)
        scan = mamba2.pick("mamba_chunk_scan_combined", x)
        y = scan(x.reshape(batch, length, heads, self.headdim), dt.contiguous(), -torch.exp(self.A_log.float()),
                 B.reshape(batch, length, groups, self.d_state), C.reshape(batch, length, groups, self.d_state),
                 self.chunk_size, D=self.D, z=None if self.rmsnorm else z.reshape(batch, length, heads, self.headdim),
                 dt_bias=self.dt_bias.float(), dt_softplus=True, seq_idx=seq_idx, return_final_states=cache is not None)
        if cache is not None:
            y, ssm_state = y
            cache.recurrent[self.layer_number] = (conv_state, ssm_state.float())
        y = y.reshape(batch, length, inner).transpose(0, 1)
        if self.rmsnorm:
            y = self.norm(y, z.transpose(0, 1))
        return self.out_proj(y)

    def _step(self, hidden_states, conv_state, ssm_state):
        """One decode token: ``[1, b, h]``; the states advance in place."""
        zxbcdt, _ = self.in_proj(hidden_states)
        zxbcdt = zxbcdt[0]
        inner, groups, heads = self.d_inner_local_tp, self.ngroups_local_tp, self.nheads_local_tp
        z, xbc, dt = torch.split(zxbcdt, [inner, inner + 2 * groups * self.d_state, heads], dim=-1)
        weight, bias = self._conv()
        xbc = mamba2.pick("causal_conv1d_update", weight)(xbc, conv_state, weight, bias, activation="silu")
        x, B, C = torch.split(xbc, [inner, groups * self.d_state, groups * self.d_state], dim=-1)
        p, n = self.headdim, self.d_state
        y = mamba2.pick("selective_state_update", x)(
            ssm_state, x.reshape(-1, heads, p), dt[..., None].expand(-1, heads, p),
            (-torch.exp(self.A_log.float()))[:, None, None].expand(heads, p, n),
            B.reshape(-1, groups, n), C.reshape(-1, groups, n), self.D[:, None].expand(heads, p),
            z=None if self.rmsnorm else z.reshape(-1, heads, p), dt_bias=self.dt_bias[:, None].expand(heads, p),
            dt_softplus=True)
        y = y.reshape(1, -1, inner)
        if self.rmsnorm:
            y = self.norm(y, z[None])
        return self.out_proj(y)


class HybridMambaLayer(MambaLayer):
    """megatron-core's ``MambaLayer`` as a ``TransformerBlock`` layer: built with the block's arguments (its layer
    number made global, as ``TransformerLayer`` does), its norm with the config's epsilon, and a forward that takes the
    block's keyword arguments (the attention mask goes to the mixer) and returns ``(hidden, None)``."""

    def __init__(self, config, submodules, layer_number: int = 1, pg_collection=None, vp_stage=None, **_):
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
        super().__init__(config, submodules, layer_number=layer_number + offset, pg_collection=pg_collection,
                         pp_layer_offset=offset)
        self.norm = build_module(submodules.norm, config=config, hidden_size=config.hidden_size,
                                 eps=config.layernorm_epsilon)

    def forward(self, hidden_states, attention_mask=None, inference_context=None, **_):
        residual = hidden_states
        if getattr(self, "residual_in_fp32", False) or getattr(self.config, "fp32_residual_connection", False):
            residual = residual.float()
        hidden_states = self.norm(hidden_states.to(dtype=self.config.params_dtype))
        out = self.mixer(hidden_states, inference_context=inference_context, attention_mask=attention_mask)
        with self.bias_dropout_add_exec_handler():
            hidden_states = self.mamba_bda(training=self.training, fused=self.config.bias_dropout_fusion)(
                out, residual, self.hidden_dropout)
        return hidden_states, None


def mamba_layer_spec(config, norm):
    """The ``M`` layer's spec: ``norm`` (a norm class, the model's), the mixer with the config's conv width and chunk
    size."""
    mixer = ModuleSpec(module=HybridMambaMixer,
                       params={"d_conv": int(config.get(CONV_KERNEL) or 4), "chunk_size": int(config.get(CHUNK_SIZE)
                                                                                               or 128)},
                       submodules=MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear))
    return ModuleSpec(module=HybridMambaLayer,
                      submodules=MambaLayerSubmodules(norm=norm, mixer=mixer, mamba_bda=get_bias_dropout_add))


def _part(layer_spec, keep: str):
    """A copy of a ``TransformerLayer`` spec with only its attention (``keep="attention"``) or only its MLP."""
    spec = copy.deepcopy(layer_spec)
    sub = spec.submodules
    names = (("pre_mlp_layernorm", IdentityOp), ("mlp", IdentityOp), ("mlp_bda", IdentityFuncOp)) \
        if keep == "attention" else \
        (("input_layernorm", IdentityOp), ("self_attention", IdentityOp), ("self_attn_bda", IdentityFuncOp))
    spec.submodules = TransformerLayerSubmodules(**{
        **{f: getattr(sub, f) for f in sub.__dataclass_fields__}, **dict(names)})
    return spec


def hybrid_layer_specs(config, dense_spec, moe_spec=None) -> list:
    """The layer specs of a hybrid config, one per character of its pattern (for
    :func:`pai_zoo.mcore.specs.block_spec`), from ``dense_spec`` (a ``TransformerLayer`` spec with attention and the
    dense MLP) and ``moe_spec`` (the same with the MoE MLP; for ``E`` layers)."""
    kinds = hybrid_kinds(config.arch if hasattr(config, "arch") else config)
    if kinds is None:
        raise ValueError(f"hybrid_layer_specs: the config has no {HYBRID_PATTERN}")
    if "moe" in kinds and moe_spec is None:
        raise ValueError("hybrid_layer_specs: E (MoE) layers need the MoE layer spec (num_moe_experts)")
    norm = dense_spec.submodules.input_layernorm
    specs = {"mamba": mamba_layer_spec(config, norm), "attention": _part(dense_spec, "attention"),
             "mlp": _part(dense_spec, "mlp")}
    if moe_spec is not None:
        specs["moe"] = _part(moe_spec, "mlp")
    return [specs[k] for k in kinds]
